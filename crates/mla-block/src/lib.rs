//! DeepSeek's Multi-head Latent Attention (MLA) block, composed only of vt-core's
//! registered ops, so it runs on whichever backend the caller's queue belongs to.
//!
//! - [`MlaConfig`]: a Hugging Face `config.json` (both rope forms) -> [`MlaBlockDims`] and
//!   [`YarnRopeParams`].
//! - [`MlaWeightStore`]: safetensors weights under HF names -> device buffers, including
//!   the fused q_a/kv_a projection, the absorbed `W_UK_T`/`W_UV` and the f32 cos/sin cache
//!   (one [`RopeCosSinCache`] per device and rope parameters, shared by the layers);
//!   [`MlaBlockWeights`] are the views the forward reads.
//! - [`PagedKvCache`] + [`MlaBatchMetadata::plan`]: blocks, block tables, slot mapping and
//!   context chunks for a mixed decode/prefill step.
//! - [`MlaBlock::forward`]: one step; [`MlaWorkspace`] holds its reusable scratch memory.
//! - [`DecodeGraphs`]: decode steps of every layer captured once per batch-size bucket and
//!   replayed (CUDA graphs; eager where the queue cannot capture), as engines run them.
//! - [`runner::run_schedule`]: whole sequences under a `prefill:N,decode:N` schedule
//!   (what `vt-mla run` does).
//!
//! See `docs/mla.md` for the op map and the upstream port map.

mod block;
pub mod checkpoint;
mod config;
pub mod decode_graphs;
mod dims;
pub mod fp8;
mod kv_cache;
pub mod layers;
pub mod loaders;
mod metadata;
mod rope;
mod rope_cache;
pub mod runner;
mod safetensors_header;
pub mod tp;
mod weights;
mod workspace;

pub use block::{
    missing_ops, missing_sparse_ops, DecodeAttention, MlaBlock, REQUIRED_OPS, SPARSE_OPS, SPARSE_ROWS,
};
pub use checkpoint::{layer_prefix, Checkpoint};
pub use config::MlaConfig;
pub use decode_graphs::{DecodeGraphConfig, DecodeGraphs, StepMode};
pub use dims::{IndexerDims, MlaBlockDims, MAX_DIM, MAX_HEADS, MAX_TOKEN_ROW_ELEMENTS, MAX_WEIGHT_ELEMENTS};
pub use fp8::{Fp8BlockWeights, Fp8Matrix, WeightsDtype};
pub use kv_cache::{row_bytes, BlockAllocator, KvCacheDtype, LayeredKvCache, PagedKvCache, SeqId};
pub use metadata::{ContextChunk, MlaBatchMetadata, StepSeq};
pub use rope::{
    cos_sin_cache_bytes, mla_attention_scale, yarn_correction_range, yarn_find_correction_dim,
    yarn_get_mscale, YarnRopeParams, YarnScaling, MAX_COS_SIN_CACHE_BYTES,
};
pub use rope_cache::RopeCosSinCache;
pub use safetensors_header::{
    check_safetensors_header, deserialize_safetensors, dtype_size as safetensors_dtype_size, SafetensorsEntry,
};
pub use weights::{
    absorb_bytes, absorb_kv_b_proj, decode_f64, dequantize_fp8, hf_weight_shapes, AbsorbedKvBProj,
    HostTensor, HostWeights, IndexerWeights, MlaBlockWeights, MlaWeightStore,
};
pub use workspace::{MlaLimits, MlaWorkspace};

/// The layer prefix of the first layer's attention weights in Hugging Face checkpoints.
pub const DEFAULT_LAYER_PREFIX: &str = "model.layers.0.self_attn.";

/// The page `docs/engine.md`, "Using vt in an engine", whose snippets run as doc tests.
#[doc = include_str!("../../../docs/engine.md")]
pub mod engine_guide {}
