//! vt-cpu: the reference backend. Every op of [`vt_core::OpId::ALL`], written to be
//! obviously right first: f32 accumulation, bf16/f16/f32 storage, strided element access
//! through `host::HostView`, one rounding to the storage dtype per stored value. GPU
//! backends are checked against these implementations. The one concession to speed is
//! the matmuls' core (`gemm`): dot products in a fixed order of eight partial sums, over
//! the weight's rows on several threads (the order never depends on the thread count), so
//! that a DeepSeek-V3-sized layer runs in seconds, not minutes.
//!
//! Call [`register`] once at start-up (applications usually go through
//! `vt_backends::init`); it is idempotent.

mod attention;
mod backend;
mod comm;
mod gemm;
mod host;
mod par;

mod batched_matmul;
mod batched_matmul_fp8;
mod cache_indexer_keys;
mod concat_and_cache_mla;
mod concat_mla_nope_rope;
mod fused_norm_rope;
mod gather_mla_cache;
mod indexer_top_k;
mod layer_norm;
mod matmul_bt;
mod matmul_bt_fp8;
mod merge_attn_states;
mod mla_decode_attention;
mod prefill_attention;
mod quantize_fp8;
mod rms_norm;
mod rope_from_cache;
mod sparse_mla_attention;

use std::sync::Arc;

use vt_core::registry::{register_backend, register_op};
use vt_core::{DeviceType, OpId, OpImpl, Probe};

pub use comm::{HostCommunicator, HostTransport};

/// Ops the CPU backend does not implement: none, since it is the reference every other
/// backend is checked against (the coverage test holds it to that).
pub const OP_GAPS: &[OpId] = &[];

/// Every op implementation [`register`] registers.
pub fn op_table() -> Vec<OpImpl> {
    vec![
        OpImpl::MatmulBT(Arc::new(matmul_bt::run)),
        OpImpl::BatchedMatmul(Arc::new(batched_matmul::run)),
        OpImpl::RmsNorm(Arc::new(rms_norm::run)),
        OpImpl::RopeFromCache(Arc::new(rope_from_cache::run)),
        OpImpl::FusedNormRope(Arc::new(fused_norm_rope::run)),
        OpImpl::ConcatAndCacheMla(Arc::new(concat_and_cache_mla::run)),
        OpImpl::GatherMlaCache(Arc::new(gather_mla_cache::run)),
        OpImpl::ConcatMlaNopeRope(Arc::new(concat_mla_nope_rope::run)),
        OpImpl::MlaDecodeAttention(Arc::new(mla_decode_attention::run)),
        OpImpl::PrefillAttention(Arc::new(prefill_attention::run)),
        OpImpl::MergeAttnStates(Arc::new(merge_attn_states::run)),
        OpImpl::MatmulBTFp8(Arc::new(matmul_bt_fp8::run)),
        OpImpl::BatchedMatmulFp8(Arc::new(batched_matmul_fp8::run)),
        OpImpl::QuantizeFp8(Arc::new(quantize_fp8::run)),
        OpImpl::SparseMlaAttention(Arc::new(sparse_mla_attention::run)),
        OpImpl::IndexerTopK(Arc::new(indexer_top_k::run)),
        OpImpl::CacheIndexerKeys(Arc::new(cache_indexer_keys::run)),
        OpImpl::LayerNorm(Arc::new(layer_norm::run)),
    ]
}

/// Registers the CPU backend, every op and the host communicator for
/// [`DeviceType::Cpu`]. Idempotent: calling it again re-registers the same
/// implementations (also after `vt_core::registry::unregister_device`).
pub fn register() -> Probe {
    register_backend(Arc::new(backend::CpuBackend));
    let cpu = DeviceType::Cpu;
    for imp in op_table() {
        register_op(cpu, imp);
    }
    vt_core::comm::register(cpu, Arc::new(HostTransport));
    tracing::debug!(ops = vt_core::registered_ops(cpu).len(), "cpu backend registered");
    Probe::Registered { devices: 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_is_registered_and_no_gap_is_declared() -> vt_core::Result<()> {
        let ids: Vec<OpId> = op_table().iter().map(OpImpl::id).collect();
        vt_core::check_coverage("cpu", &ids, OP_GAPS)?;
        assert!(OP_GAPS.is_empty(), "the reference backend must implement every op");
        Ok(())
    }
}
