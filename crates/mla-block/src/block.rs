//! The MLA attention block: one step of mixed decode + prefill tokens through registered
//! vt ops only.
//!
//! Per step (T tokens, the first D of them decode tokens):
//! 1. A-projections and the q branch: q_lora (`q_a_proj` -> `q_a_layernorm` -> `q_b_proj`)
//!    or q_proj; the kv A-projection either as one merged `[L+R, H]` GEMM (fused path) or as
//!    two GEMMs for the latent and the rope part (split path). The fused path with 16-bit
//!    q_lora weights runs q_a and kv_a as one `[Q+L+R, H]` GEMM (the stacked
//!    `fused_qkv_a_proj`), q_c and the kv row being column slices of its output.
//! 2. `kv_a_layernorm` on the latent only, RoPE on q's rope slice and the shared k_pe:
//!    `FusedNormRope` + `RopeFromCache(q)` (fused) or `RmsNorm` + `RopeFromCache(q, k)`.
//! 3. `ConcatAndCacheMla`: the step's `[kv_c_normed | k_pe]` rows into the paged cache,
//!    before any attention reads it.
//! 4. Prefill tokens, materialized MHA: `kv_b_proj` up-projection, `ConcatMlaNopeRope`,
//!    causal `PrefillAttention` over the new tokens; with cached context, per chunk
//!    `GatherMlaCache` -> up-projection -> non-causal `PrefillAttention` with lse, then
//!    `MergeAttnStates`.
//! 5. Decode tokens, absorbed MQA: `BatchedMatmul(q_nope, W_UK_T)`, `ConcatMlaNopeRope`,
//!    `MlaDecodeAttention` over the latent cache, `BatchedMatmul(., W_UV)`.
//! 6. `o_proj`.
//!
//! A DeepSeek-V3.2 block (dims with an indexer) replaces 4-5 for every token: its lightning
//! indexer (`MatmulBT` x3, `LayerNorm`, `RopeFromCache` neox, `CacheIndexerKeys`,
//! `IndexerTopK`) picks each token's cache slots and `SparseMlaAttention` attends to them in
//! the absorbed form (see `MlaBlock::sparse_attention` and docs/mla.md).

use vt_core::{
    cache_indexer_keys, concat_and_cache_mla, concat_mla_nope_rope, flags, fp8_ds_mla, fused_norm_rope,
    gather_mla_cache, indexer_top_k, layer_norm, merge_attn_states, mla_decode_attention, op_registered,
    prefill_attention, rms_norm, rope_from_cache, sparse_mla_attention, CacheIndexerKeysArgs,
    ConcatAndCacheMlaArgs, ConcatMlaNopeRopeArgs, DType, Device, Error, FusedNormRopeArgs,
    GatherMlaCacheArgs, IndexerTopKArgs, LayerNormArgs, MergeAttnStatesArgs, MlaDecodeAttentionArgs,
    NormRopeCacheWrite, NormRopeQuery, OpId, PrefillAttentionArgs, Queue, Result, RmsNormArgs,
    RopeFromCacheArgs, SparseMlaAttentionArgs, Tensor,
};

use crate::dims::MlaBlockDims;
use crate::fp8::{self, Weight};
use crate::metadata::MlaBatchMetadata;
use crate::weights::MlaBlockWeights;
use crate::workspace::{MlaWorkspace, Slot, StepKey};

const OP: &str = "MlaBlock";

/// One MLA attention layer bound to its weights.
#[derive(Clone, Copy, Debug)]
pub struct MlaBlock<'w> {
    dims: MlaBlockDims,
    w: MlaBlockWeights<'w>,
    dtype: DType,
    device: Device,
    is_neox: bool,
    fused_override: Option<bool>,
    /// Per-block overrides of `VT_FUSE_DECODE_QUERY` and `VT_FUSE_CACHE_WRITE`.
    fuse_query_override: Option<bool>,
    fuse_cache_override: Option<bool>,
    /// Tokens of a V3.2 step's sparse attention at a time ([`SPARSE_ROWS`] by default).
    sparse_rows: i64,
}

/// The ops every forward issues (`FusedNormRope` is optional: without it the split path
/// runs).
pub const REQUIRED_OPS: [OpId; 10] = [
    OpId::MatmulBT,
    OpId::BatchedMatmul,
    OpId::RmsNorm,
    OpId::RopeFromCache,
    OpId::ConcatAndCacheMla,
    OpId::GatherMlaCache,
    OpId::ConcatMlaNopeRope,
    OpId::MlaDecodeAttention,
    OpId::PrefillAttention,
    OpId::MergeAttnStates,
];

/// The ops a DeepSeek-V3.2 (sparse) block issues besides [`REQUIRED_OPS`]' projections,
/// norms, rope, cache write and concat (it never runs PrefillAttention, GatherMlaCache,
/// MergeAttnStates or MlaDecodeAttention: every token takes the sparse absorbed form).
pub const SPARSE_OPS: [OpId; 4] =
    [OpId::LayerNorm, OpId::CacheIndexerKeys, OpId::IndexerTopK, OpId::SparseMlaAttention];

/// The [`REQUIRED_OPS`] not registered on `device` (empty: the block can run there).
pub fn missing_ops(device: vt_core::DeviceType) -> Vec<OpId> {
    REQUIRED_OPS.iter().copied().filter(|&op| !op_registered(op, device)).collect()
}

/// The [`SPARSE_OPS`] not registered on `device` (empty: a DeepSeek-V3.2 block can run there,
/// given [`missing_ops`] is empty too).
pub fn missing_sparse_ops(device: vt_core::DeviceType) -> Vec<OpId> {
    SPARSE_OPS.iter().copied().filter(|&op| !op_registered(op, device)).collect()
}

fn req<'a>(t: Option<Tensor<'a>>, name: &'static str) -> Result<Tensor<'a>> {
    t.ok_or_else(|| Error::invalid(OP, name, format!("required weight `{name}` is not set")))
}

impl<'w> MlaBlock<'w> {
    /// Binds weights to dims after checking every weight the branch needs (see
    /// [`MlaBlockWeights::check`]). The block computes in the dtype of `o_proj`, on its
    /// device. `is_neox`: rotation pairing (DeepSeek's default is GPT-J, false).
    pub fn new(dims: MlaBlockDims, weights: MlaBlockWeights<'w>, is_neox: bool) -> Result<MlaBlock<'w>> {
        dims.validate()?;
        // fp8 o_proj (issue 17): the float norm weight carries the compute dtype instead.
        let dtype_of = match (weights.o_proj, weights.fp8.o_proj) {
            (None, Some(_)) => weights.kv_a_layernorm,
            (o, _) => o,
        };
        let o = dtype_of.ok_or_else(|| {
            Error::invalid(
                "MlaBlockWeights",
                "o_proj",
                format!(
                    "required weight `o_proj` is not set for the {} branch",
                    if dims.has_q_lora() { "q_lora" } else { "q_proj" }
                ),
            )
        })?;
        let (dtype, device) = (o.dtype(), o.device());
        if !dtype.is_compute_float() {
            return Err(Error::invalid(OP, "o_proj", format!("dtype {dtype} is not bf16/f16/f32")));
        }
        weights.check(&dims, dtype, device)?;
        Ok(MlaBlock {
            dims,
            w: weights,
            dtype,
            device,
            is_neox,
            fused_override: None,
            fuse_query_override: None,
            fuse_cache_override: None,
            sparse_rows: SPARSE_ROWS,
        })
    }

    pub fn dims(&self) -> &MlaBlockDims {
        &self.dims
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn device(&self) -> Device {
        self.device
    }
    /// Rows of the cos/sin cache: positions must be below this.
    pub fn max_position(&self) -> i64 {
        self.w.rope_cos_sin_cache.map(|c| c.dim(0)).unwrap_or(0)
    }

    /// Forces the fused (`Some(true)`) or split (`Some(false)`) kv path for this block only,
    /// or follows `VT_MLA_FUSED_NORM_ROPE` (`None`, the default). Either way the fused path
    /// is taken only where `FusedNormRope` is registered.
    pub fn set_fused_norm_rope(&mut self, value: Option<bool>) {
        self.fused_override = value;
    }

    /// Forces the fused decode query on (`Some(true)`) or off (`Some(false)`) for this block
    /// only, or follows `VT_FUSE_DECODE_QUERY` (`None`, the default): the decode tokens' q
    /// rope rides in the `FusedNormRope` launch, written straight into the decode
    /// attention's query `[B, N, L+R]`, and the absorbed q_nope BMM writes that query's
    /// latent columns directly, so a decode-only step runs neither `RopeFromCache` nor the
    /// query's `ConcatMlaNopeRope`. Taken only on the fused kv path of a dense (not V3.2)
    /// block. Bit-identical to the split launches on the CPU.
    pub fn set_fuse_decode_query(&mut self, value: Option<bool>) {
        self.fuse_query_override = value;
    }

    /// Forces the fused cache write on or off for this block only, or follows
    /// `VT_FUSE_CACHE_WRITE` (`None`, the default): the step's `[kv_c_normed | k_pe]` rows go
    /// into the cache from the `FusedNormRope` launch instead of a `ConcatAndCacheMla`
    /// launch. Taken only on the fused kv path and over a float cache (an fp8_ds_mla cache is
    /// still written by `ConcatAndCacheMla`). Bit-identical (the same values stored twice).
    pub fn set_fuse_cache_write(&mut self, value: Option<bool>) {
        self.fuse_cache_override = value;
    }

    /// Whether the next forward takes the fused decode query (see
    /// [`MlaBlock::set_fuse_decode_query`]); read at every launch, so a flag override
    /// changes the path of later steps (a captured CUDA graph keeps the path it recorded).
    pub fn uses_fused_decode_query(&self) -> bool {
        self.uses_fused_norm_rope()
            && !self.dims.is_sparse()
            && self.fuse_query_override.unwrap_or_else(flags::fuse_decode_query)
    }

    /// Whether the next forward writes the cache from `FusedNormRope` over a float cache
    /// (see [`MlaBlock::set_fuse_cache_write`]).
    pub fn uses_fused_cache_write(&self) -> bool {
        self.uses_fused_norm_rope() && self.fuse_cache_override.unwrap_or_else(flags::fuse_cache_write)
    }

    /// Runs a DeepSeek-V3.2 step's absorbed sparse attention `rows` tokens at a time
    /// (default [`SPARSE_ROWS`]; tests take small values to run many chunks). Errors unless
    /// `rows > 0`.
    pub fn set_sparse_rows(&mut self, rows: i64) -> Result<()> {
        if rows <= 0 {
            return Err(Error::invalid(OP, "sparse_rows", format!("must be > 0, got {rows}")));
        }
        self.sparse_rows = rows;
        Ok(())
    }

    /// Whether the next forward takes the fused path.
    pub fn uses_fused_norm_rope(&self) -> bool {
        self.fused_override.unwrap_or_else(flags::mla_fused_norm_rope)
            && op_registered(OpId::FusedNormRope, self.device.kind)
    }

    /// Whether this block's steps run q_a_proj and kv_a_proj_with_mqa as one GEMM (see
    /// `merges_a_projections`).
    pub fn uses_merged_a_projection(&self) -> bool {
        self.merges_a_projections(self.uses_fused_norm_rope())
    }

    /// Whether a step runs q_a_proj and kv_a_proj_with_mqa as one GEMM on the stacked
    /// `[Q+L+R, H]` weight: one weight stream and one launch instead of two.
    fn merges_a_projections(&self, fused: bool) -> bool {
        self.merged_a_weight(fused).is_some()
    }

    /// The stacked A-projection weight of the fused path: the float `fused_qkv_a_proj` when
    /// neither part is fp8, or the fp8 stack (`Fp8BlockWeights::fused_qkv_a_proj`).
    fn merged_a_weight(&self, fused: bool) -> Option<Weight<'w>> {
        let w = &self.w;
        if !fused || !self.dims.has_q_lora() {
            return None;
        }
        if let Some(m) = w.fp8.fused_qkv_a_proj {
            return Some(Weight::Fp8(m));
        }
        let float_only = w.fp8.q_a_proj.is_none() && w.fp8.kv_a_proj_with_mqa.is_none();
        w.fused_qkv_a_proj.filter(|_| float_only).map(Weight::Float)
    }

    /// The merged A-projection's output `[T, Q+L+R]` (in the KvMerged slot).
    fn qkv_a_view<'s>(&self, ws: &'s MlaWorkspace, t: i64) -> Result<Tensor<'s>> {
        let d = self.dims;
        ws.view(Slot::KvMerged, 0, &[t, d.q_lora_rank + d.latent_row_dim()])
    }

    /// The normed q_c `[T, Q]` of a q_lora step: a column slice of the merged A-projection's
    /// output, or its own slot.
    fn q_c_view<'s>(&self, ws: &'s MlaWorkspace, t: i64, fused: bool) -> Result<Tensor<'s>> {
        let ql = self.dims.q_lora_rank;
        if self.merges_a_projections(fused) {
            self.qkv_a_view(ws, t)?.slice(1, 0, ql)
        } else {
            ws.view(Slot::QC, 0, &[t, ql])
        }
    }

    /// Checks a step's arguments against the block (host-side only); returns T.
    fn check_step(
        &self,
        q: &Queue,
        hidden: &Tensor<'_>,
        meta: &MlaBatchMetadata,
        kv_cache: &Tensor<'_>,
        out: &Tensor<'_>,
    ) -> Result<i64> {
        let d = self.dims;
        let (h, l, r) = (d.hidden_size, d.kv_lora_rank, d.qk_rope_head_dim);
        let dt = self.dtype;
        if q.device() != self.device {
            return Err(Error::invalid(
                OP,
                "queue",
                format!("is on {}, the weights on {}", q.device(), self.device),
            ));
        }
        for (name, x) in [("hidden", hidden), ("out", out)] {
            if x.rank() != 2 || x.dim(1) != h || x.dtype() != dt {
                return Err(Error::invalid(
                    OP,
                    name,
                    format!("is {} {:?}, expected {dt} [T, hidden_size = {h}]", x.dtype(), x.shape()),
                ));
            }
        }
        let t = hidden.dim(0);
        if out.dim(0) != t {
            return Err(Error::invalid(OP, "out", format!("has {} rows for {t} tokens", out.dim(0))));
        }
        // The cache is the activation dtype with rows of L+R, or fp8_ds_mla rows of 656
        // bytes (L = 512, R = 64 only: the format's split). A V3.2 block's rows hold the
        // indexer key beside the latent: L+R+Di in the activation dtype.
        let fp8 = kv_cache.dtype() == DType::Fp8DsMla;
        if let Some(ix) = d.indexer {
            if kv_cache.rank() != 3 || kv_cache.dtype() != dt || kv_cache.dim(2) != d.cache_row_dim() {
                return Err(Error::invalid(
                    OP,
                    "kv_cache",
                    format!(
                        "is {} {:?}; a DeepSeek-V3.2 block's cache is {dt} [num_blocks, block_size, L+R+Di = \
                         {l}+{r}+{}] (the latent row, then the indexer key; fp8_ds_mla rows cannot hold the \
                         indexer key yet)",
                        kv_cache.dtype(),
                        kv_cache.shape(),
                        ix.head_dim
                    ),
                ));
            }
            meta.check(t, kv_cache.dim(0), kv_cache.dim(1), self.max_position())?;
            return Ok(t);
        }
        let cache_ok = kv_cache.rank() == 3
            && if fp8 {
                l == fp8_ds_mla::LATENT as i64
                    && r == fp8_ds_mla::ROPE as i64
                    && kv_cache.dim(2) == fp8_ds_mla::ROW_BYTES as i64
            } else {
                kv_cache.dim(2) == l + r && kv_cache.dtype() == dt
            };
        if !cache_ok {
            return Err(Error::invalid(
                OP,
                "kv_cache",
                format!(
                    "is {} {:?}, expected {dt} [num_blocks, block_size, L+R = {}] or, when L = 512 and \
                     R = 64, fp8_ds_mla [num_blocks, block_size, 656]",
                    kv_cache.dtype(),
                    kv_cache.shape(),
                    l + r
                ),
            ));
        }
        meta.check(t, kv_cache.dim(0), kv_cache.dim(1), self.max_position())?;
        Ok(t)
    }

    /// Runs one step: `out[T, H]` for `hidden[T, H]`, writing the step's latents into
    /// `kv_cache` `[num_blocks, block_size, L+R]` at `meta.slot_mapping` first (a
    /// DeepSeek-V3.2 block's rows are `[latent L+R | indexer key Di]`,
    /// [`MlaBlockDims::cache_row_dim`], and it writes both).
    ///
    /// Issues work on `q` without waiting for it (no synchronization). Scratch memory and the
    /// metadata's device copy come from `ws`, which allocates only when the step is larger
    /// than anything before it (or its limits). Equivalent to [`MlaBlock::prepare`] then
    /// [`MlaBlock::launch`].
    pub fn forward(
        &self,
        q: &Queue,
        ws: &mut MlaWorkspace,
        hidden: &Tensor<'_>,
        meta: &MlaBatchMetadata,
        kv_cache: &Tensor<'_>,
        out: &Tensor<'_>,
    ) -> Result<()> {
        self.forward_with(&PlainDecode, q, ws, hidden, meta, kv_cache, out)
    }

    /// The host-side half of a step: sizes `ws` for `meta` (allocating only past its
    /// high-water mark) and uploads the step's metadata (positions, slots, block tables,
    /// lengths) into its device buffers. Not capturable: it copies from host memory.
    pub fn prepare(&self, q: &Queue, ws: &mut MlaWorkspace, meta: &MlaBatchMetadata) -> Result<()> {
        let d = self.dims;
        let (n, ql) = (d.num_heads, d.q_lora_rank);
        let (l, p, r, v) = (d.kv_lora_rank, d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim);
        let dqk = d.qk_head_dim();
        let dt = self.dtype;
        let t = meta.num_tokens();
        let dn = meta.num_decode_tokens;
        let tp = t - dn;
        let fused = self.uses_fused_norm_rope();
        ws.prepared = None;
        if t == 0 {
            return Ok(());
        }
        // ---- sizes, then the metadata upload: the only mutable uses of the workspace ----
        let lim = *ws.limits();
        let tmax = lim.max_tokens.max(t);
        let wmax = lim.chunk_workspace_tokens.max(meta.max_chunk_tokens());
        let f32_ = DType::F32;
        let mut need: Vec<(Slot, DType, i64, i64)> = vec![
            (Slot::QRaw, dt, t * n * dqk, tmax * n * dqk),
            (Slot::KPe, dt, t * r, tmax * r),
            (Slot::KvCNormed, dt, t * l, tmax * l),
            (Slot::Attn, dt, t * n * v, tmax * n * v),
            (Slot::MetaI64, DType::I64, 2 * t, 2 * tmax),
        ];
        if self.merges_a_projections(fused) {
            // One [T, Q+L+R] output: q_c and the kv row are its column slices.
            let w = ql + l + r;
            need.push((Slot::KvMerged, dt, t * w, tmax * w));
        } else {
            if d.has_q_lora() {
                need.push((Slot::QC, dt, t * ql, tmax * ql));
            }
            if fused {
                need.push((Slot::KvMerged, dt, t * (l + r), tmax * (l + r)));
            } else {
                need.push((Slot::KvC, dt, t * l, tmax * l));
            }
        }
        let i32_floor = lim.max_seqs * (lim.max_blocks_per_seq + 1) + lim.max_seqs + 1;
        need.push((Slot::MetaI32, DType::I32, meta.i32_len() as i64, i32_floor));
        if let Some(ix) = d.indexer {
            // Every token in the absorbed form (no materialized prefill), plus the indexer.
            let (hi, di, k) = (ix.n_heads, ix.head_dim, ix.topk);
            // The absorbed query and output for at most SPARSE_ROWS tokens at a time.
            let (c, cmax) = (t.min(self.sparse_rows), tmax.min(self.sparse_rows));
            need.push((Slot::QlNope, dt, n * c * l, n * cmax * l));
            need.push((Slot::MqaQ, dt, c * n * (l + r), cmax * n * (l + r)));
            need.push((Slot::MqaOut, dt, c * n * l, cmax * n * l));
            need.push((Slot::IdxQ, dt, t * hi * di, tmax * hi * di));
            need.push((Slot::IdxK, dt, t * di, tmax * di));
            need.push((Slot::IdxW, dt, t * hi, tmax * hi));
            need.push((Slot::IdxTopk, DType::I32, t * k, tmax * k));
            need.push((Slot::MetaIdx, DType::I32, 2 * t, 2 * tmax));
        }
        if tp > 0 && d.indexer.is_none() {
            need.push((Slot::KvNope, dt, tp * n * (p + v), tmax * n * (p + v)));
            need.push((Slot::Key, dt, tp * n * dqk, tmax * n * dqk));
            if !meta.chunks.is_empty() {
                for (o, ls) in [
                    (Slot::SuffixOut, Slot::SuffixLse),
                    (Slot::ChunkOut, Slot::ChunkLse),
                    (Slot::AccOutA, Slot::AccLseA),
                    (Slot::AccOutB, Slot::AccLseB),
                ] {
                    need.push((o, dt, tp * n * v, tmax * n * v));
                    need.push((ls, f32_, n * tp, n * tmax));
                }
                let wc = meta.max_chunk_tokens();
                need.push((Slot::CtxKv, dt, wc * (l + r), wmax * (l + r)));
                need.push((Slot::CtxKvNope, dt, wc * n * (p + v), wmax * n * (p + v)));
                need.push((Slot::CtxKey, dt, wc * n * dqk, wmax * n * dqk));
            }
        }
        if dn > 0 && d.indexer.is_none() {
            need.push((Slot::QlNope, dt, n * dn * l, n * tmax * l));
            need.push((Slot::MqaQ, dt, dn * n * (l + r), tmax * n * (l + r)));
            need.push((Slot::MqaOut, dt, dn * n * l, tmax * n * l));
        }
        for (slot, dtype, elems, floor) in need {
            ws.ensure(q, slot, dtype, elems, floor)?;
        }
        // Quantized activations of fp8 weights at prefill sizes (issue 17).
        crate::fp8::ensure_workspace(q, ws, &self.w.fp8, t.max(meta.max_chunk_tokens()))?;
        let st = ws.staging();
        for x in meta.positions.iter().chain(&meta.slot_mapping) {
            st.extend_from_slice(&x.to_le_bytes());
        }
        ws.commit_staging(q, Slot::MetaI64)?;
        let st = ws.staging();
        let mut parts: Vec<&[i32]> = vec![
            &meta.decode_block_table,
            &meta.decode_seq_lens,
            &meta.prefill_block_table,
            &meta.prefill_cu_seqlens_q,
        ];
        for c in &meta.chunks {
            parts.push(&c.cu_seq_lens);
            parts.push(&c.seq_starts);
        }
        for x in parts.iter().flat_map(|s| s.iter()) {
            st.extend_from_slice(&x.to_le_bytes());
        }
        ws.commit_staging(q, Slot::MetaI32)?;
        if d.indexer.is_some() {
            let st = ws.staging();
            for x in indexer_rows(meta).iter().chain(&indexer_positions(meta)) {
                st.extend_from_slice(&x.to_le_bytes());
            }
            ws.commit_staging(q, Slot::MetaIdx)?;
        }
        ws.prepared = Some(step_key(meta, fused));
        Ok(())
    }

    /// The device-side half of a step, from a workspace [`MlaBlock::prepare`]d for this
    /// `meta`: only op launches on `q` (no allocation, no host copy, no synchronization), so
    /// a decode step's `launch` can be captured into a CUDA graph once warmed up and replayed
    /// after each `prepare` (which rewrites the metadata in place). Errors if `ws` was last
    /// prepared for a step of another shape.
    pub fn launch(
        &self,
        q: &Queue,
        ws: &MlaWorkspace,
        hidden: &Tensor<'_>,
        meta: &MlaBatchMetadata,
        kv_cache: &Tensor<'_>,
        out: &Tensor<'_>,
    ) -> Result<()> {
        self.launch_with(&PlainDecode, q, ws, hidden, meta, kv_cache, out)
    }

    /// [`MlaBlock::forward`] with the decode attention run by `decode` instead of the plain
    /// op (decode context parallelism exchanges partial results there, see `tp::dcp`).
    // `forward`'s arguments plus the hook: one over clippy's default limit of 7.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_with(
        &self,
        decode: &dyn DecodeAttention,
        q: &Queue,
        ws: &mut MlaWorkspace,
        hidden: &Tensor<'_>,
        meta: &MlaBatchMetadata,
        kv_cache: &Tensor<'_>,
        out: &Tensor<'_>,
    ) -> Result<()> {
        self.check_step(q, hidden, meta, kv_cache, out)?;
        self.prepare(q, ws, meta)?;
        self.launch_with(decode, q, ws, hidden, meta, kv_cache, out)
    }

    /// [`MlaBlock::launch`] with the decode attention run by `decode`.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_with(
        &self,
        decode: &dyn DecodeAttention,
        q: &Queue,
        ws: &MlaWorkspace,
        hidden: &Tensor<'_>,
        meta: &MlaBatchMetadata,
        kv_cache: &Tensor<'_>,
        out: &Tensor<'_>,
    ) -> Result<()> {
        let t = self.check_step(q, hidden, meta, kv_cache, out)?;
        if t == 0 {
            return Ok(());
        }
        let d = self.dims;
        let (n, ql) = (d.num_heads, d.q_lora_rank);
        let (l, p, r, v) = (d.kv_lora_rank, d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim);
        let dqk = d.qk_head_dim();
        let dn = meta.num_decode_tokens;
        let tp = t - dn;
        let bp = meta.num_prefill_seqs();
        let fused = self.uses_fused_norm_rope();
        let w = &self.w;
        let cache_rs = req(w.rope_cos_sin_cache, "rope_cos_sin_cache")?;

        if ws.prepared != Some(step_key(meta, fused)) {
            return Err(Error::invalid(
                OP,
                "ws",
                "was not prepared for this step (call MlaBlock::prepare with the same metadata first)",
            ));
        }

        // Metadata views, in the order they were packed.
        let positions = ws.view(Slot::MetaI64, 0, &[t])?;
        let slot_mapping = ws.view(Slot::MetaI64, t, &[t])?;
        let mut off = 0i64;
        let mut take = |shape: &[i64]| -> Result<Tensor<'_>> {
            let view = ws.view(Slot::MetaI32, off, shape)?;
            off += shape.iter().product::<i64>();
            Ok(view)
        };
        let dec_bt = take(&[dn, meta.decode_max_blocks])?;
        let dec_lens = take(&[dn])?;
        let pre_bt = take(&[bp, meta.prefill_max_blocks])?;
        let pre_cu = take(&[if tp > 0 { bp + 1 } else { 0 }])?;
        let mut chunk_meta = Vec::with_capacity(meta.chunks.len());
        for c in &meta.chunks {
            let cu = take(&[bp + 1])?;
            let starts = take(&[bp])?;
            chunk_meta.push((cu, starts, c.tokens()));
        }

        // ---- 1. A-projections and the q branch ----
        let q_raw = ws.view(Slot::QRaw, 0, &[t, n * dqk])?;
        // Each projection is a float view or an fp8 weight (issue 17, `fp8::linear`).
        let f8 = &w.fp8;
        let merged_w = self.merged_a_weight(fused);
        let (kva, q_norm_w) = if let Some(qkv_w) = merged_w {
            // The merged A-projection (issue 18): one GEMM against the stacked
            // [q_a_proj; kv_a_proj_with_mqa] weight; q_c and the kv row are column slices of
            // its output (the ops below take strided rows).
            let qkv = self.qkv_a_view(ws, t)?;
            fp8::linear(q, ws, qkv, *hidden, qkv_w)?;
            let q_c = self.q_c_view(ws, t, fused)?;
            (qkv_w.rows(ql, ql + l + r)?, Some((q_c, req(w.q_a_layernorm, "q_a_layernorm")?)))
        } else if d.has_q_lora() {
            let fused_w = w.fused_qkv_a_proj;
            let q_a = Weight::pick(f8.q_a_proj, fused_w.map(|f| f.slice(0, 0, ql)).transpose()?, "q_a_proj")?;
            let kv_a_f = w.kv_a_proj_with_mqa.or(fused_w.map(|f| f.slice(0, ql, ql + l + r)).transpose()?);
            let q_c = ws.view(Slot::QC, 0, &[t, ql])?;
            fp8::linear(q, ws, q_c, *hidden, q_a)?;
            (
                Weight::pick(f8.kv_a_proj_with_mqa, kv_a_f, "kv_a_proj_with_mqa")?,
                Some((q_c, req(w.q_a_layernorm, "q_a_layernorm")?)),
            )
        } else {
            (Weight::pick(f8.kv_a_proj_with_mqa, w.kv_a_proj_with_mqa, "kv_a_proj_with_mqa")?, None)
        };
        let kv_merged = if merged_w.is_some() {
            Some(self.qkv_a_view(ws, t)?.slice(1, ql, ql + l + r)?)
        } else if fused {
            let m = ws.view(Slot::KvMerged, 0, &[t, l + r])?;
            fp8::linear(q, ws, m, *hidden, kva)?;
            Some(m)
        } else {
            None
        };
        let kv_c = if fused {
            None
        } else {
            let kv_c = ws.view(Slot::KvC, 0, &[t, l])?;
            let k_pe = ws.view(Slot::KPe, 0, &[t, r])?;
            fp8::linear(q, ws, kv_c, *hidden, kva.rows(0, l)?)?;
            fp8::linear(q, ws, k_pe, *hidden, kva.rows(l, l + r)?)?;
            Some(kv_c)
        };
        match q_norm_w {
            Some((q_c, q_ln)) => {
                rms_norm(q, &RmsNormArgs { out: q_c, x: q_c, weight: q_ln, eps: d.rms_norm_eps })?;
                fp8::linear(q, ws, q_raw, q_c, Weight::pick(f8.q_b_proj, w.q_b_proj, "q_b_proj")?)?;
            }
            None => fp8::linear(q, ws, q_raw, *hidden, Weight::pick(f8.q_proj, w.q_proj, "q_proj")?)?,
        }

        // ---- 2. kv_a_layernorm (latent only) and RoPE ----
        let kv_ln = req(w.kv_a_layernorm, "kv_a_layernorm")?;
        let kv_c_normed = ws.view(Slot::KvCNormed, 0, &[t, l])?;
        let k_pe = ws.view(Slot::KPe, 0, &[t, r])?;
        let q_pe = q_raw.as_strided(p, &[t, n, r], &[n * dqk, dqk, 1])?;
        // A V3.2 cache row is [latent L+R | indexer key Di]: the latent part as its own view.
        let latent_cache = if d.is_sparse() {
            kv_cache.as_strided(
                0,
                &[kv_cache.dim(0), kv_cache.dim(1), l + r],
                &[kv_cache.stride(0), kv_cache.stride(1), 1],
            )?
        } else {
            *kv_cache
        };
        // The fusions ride in the FusedNormRope launch (fused kv path only).
        let fuse_query = kv_merged.is_some() && dn > 0 && self.uses_fused_decode_query();
        let fuse_cache =
            kv_merged.is_some() && kv_cache.dtype() != DType::Fp8DsMla && self.uses_fused_cache_write();
        // The decode attention's query [B, N, L+R] (dense decode tokens only).
        let mqa_q =
            if dn > 0 && !d.is_sparse() { Some(ws.view(Slot::MqaQ, 0, &[dn, n, l + r])?) } else { None };
        match (kv_merged, kv_c) {
            (Some(m), _) => {
                let query = match (fuse_query, mqa_q) {
                    (true, Some(mq)) => Some(NormRopeQuery {
                        input: q_pe.slice(0, 0, dn)?,
                        out: mq.as_strided(l, &[dn, n, r], &[n * (l + r), l + r, 1])?,
                    }),
                    _ => None,
                };
                fused_norm_rope(
                    q,
                    &FusedNormRopeArgs {
                        latent_out: kv_c_normed,
                        rope_out: k_pe,
                        kv: m,
                        weight: kv_ln,
                        positions,
                        cos_sin_cache: cache_rs,
                        eps: d.rms_norm_eps,
                        is_neox: self.is_neox,
                        query,
                        cache_write: fuse_cache
                            .then_some(NormRopeCacheWrite { cache: latent_cache, slot_mapping }),
                    },
                )?;
                // The prefill tokens' q_pe (all tokens' without the fused query), in place.
                let first = if query.is_some() { dn } else { 0 };
                if first < t {
                    rope_from_cache(
                        q,
                        &RopeFromCacheArgs {
                            query: q_pe.slice(0, first, t)?,
                            key: None,
                            positions: positions.slice(0, first, t)?,
                            cos_sin_cache: cache_rs,
                            is_neox: self.is_neox,
                        },
                    )?;
                }
            }
            (None, Some(kv_c)) => {
                rms_norm(q, &RmsNormArgs { out: kv_c_normed, x: kv_c, weight: kv_ln, eps: d.rms_norm_eps })?;
                let k_pe3 = k_pe.as_strided(0, &[t, 1, r], &[r, r, 1])?;
                rope_from_cache(
                    q,
                    &RopeFromCacheArgs {
                        query: q_pe,
                        key: Some(k_pe3),
                        positions,
                        cos_sin_cache: cache_rs,
                        is_neox: self.is_neox,
                    },
                )?;
            }
            (None, None) => return Err(Error::backend(OP, "neither kv path was set up")),
        }

        // ---- 3. the cache write, before attention reads the cache ----
        if !fuse_cache {
            concat_and_cache_mla(
                q,
                &ConcatAndCacheMlaArgs { kv_c: kv_c_normed, k_pe, cache: latent_cache, slot_mapping },
            )?;
        }

        let attn = ws.view(Slot::Attn, 0, &[t, n, v])?;

        // ---- DeepSeek-V3.2: the indexer picks each token's keys, every token attends sparsely ----
        if d.is_sparse() {
            if !decode.is_plain() {
                return Err(Error::invalid(
                    OP,
                    "decode",
                    "decode context parallelism does not run DeepSeek-V3.2's sparse attention yet",
                ));
            }
            let idx =
                SparseStep { kv_cache, latent_cache, positions, slot_mapping, dec_bt, pre_bt, q_raw, attn };
            self.sparse_attention(q, ws, hidden, meta, &idx)?;
            let attn_flat = attn.as_strided(0, &[t, n * v], &[n * v, 1])?;
            return fp8::linear(q, ws, *out, attn_flat, Weight::pick(f8.o_proj, w.o_proj, "o_proj")?);
        }

        // ---- 4. prefill: materialized MHA over the tail `[D, T)` ----
        if tp > 0 {
            let kv_b = Weight::pick(f8.kv_b_proj, w.kv_b_proj, "kv_b_proj")?;
            let q_pre = q_raw.as_strided(dn * n * dqk, &[tp, n, dqk], &[n * dqk, dqk, 1])?;
            let kv_nope = ws.view(Slot::KvNope, 0, &[tp, n * (p + v)])?;
            fp8::linear(q, ws, kv_nope, kv_c_normed.slice(0, dn, t)?, kv_b)?;
            let (key, value) = self.up_projected_kv(
                q,
                ws,
                Slot::Key,
                &kv_nope,
                &k_pe.as_strided(dn * r, &[tp, 1, r], &[r, r, 1])?,
                tp,
            )?;
            let pre_out = attn.slice(0, dn, t)?;
            let attend = |out: &Tensor<'_>,
                          lse: Option<Tensor<'_>>,
                          k: &Tensor<'_>,
                          vv: &Tensor<'_>,
                          cu_k: &Tensor<'_>,
                          causal: bool| {
                prefill_attention(
                    q,
                    &PrefillAttentionArgs {
                        out: *out,
                        lse,
                        query: q_pre,
                        k: *k,
                        v: *vv,
                        cu_seqlens_q: pre_cu,
                        cu_seqlens_k: *cu_k,
                        max_seqlen_q: meta.max_query_len,
                        causal,
                        scale: d.scale,
                    },
                )
            };
            if chunk_meta.is_empty() {
                attend(&pre_out, None, &key, &value, &pre_cu, true)?;
            } else {
                // The new tokens over themselves (causal), kept with their lse ...
                let suffix = ws.view(Slot::SuffixOut, 0, &[tp, n, v])?;
                let suffix_lse = ws.view(Slot::SuffixLse, 0, &[n, tp])?;
                attend(&suffix, Some(suffix_lse), &key, &value, &pre_cu, true)?;
                // ... the cached context chunk by chunk (non-causal), merged as it goes ...
                let acc = [
                    (ws.view(Slot::AccOutA, 0, &[tp, n, v])?, ws.view(Slot::AccLseA, 0, &[n, tp])?),
                    (ws.view(Slot::AccOutB, 0, &[tp, n, v])?, ws.view(Slot::AccLseB, 0, &[n, tp])?),
                ];
                let chunk_out = ws.view(Slot::ChunkOut, 0, &[tp, n, v])?;
                let chunk_lse = ws.view(Slot::ChunkLse, 0, &[n, tp])?;
                let mut cur = 0;
                for (c, (cu, starts, toks)) in chunk_meta.iter().enumerate() {
                    let ctx = ws.view(Slot::CtxKv, 0, &[*toks, l + r])?;
                    gather_mla_cache(
                        q,
                        &GatherMlaCacheArgs {
                            out: ctx,
                            cache: *kv_cache,
                            block_table: pre_bt,
                            cu_seq_lens: *cu,
                            seq_starts: (Some(starts)).copied(),
                        },
                    )?;
                    let ctx_nope = ws.view(Slot::CtxKvNope, 0, &[*toks, n * (p + v)])?;
                    fp8::linear(q, ws, ctx_nope, ctx.slice(1, 0, l)?, kv_b)?;
                    let ctx_pe = ctx.as_strided(l, &[*toks, 1, r], &[l + r, r, 1])?;
                    let (ck, cv) = self.up_projected_kv(q, ws, Slot::CtxKey, &ctx_nope, &ctx_pe, *toks)?;
                    if c == 0 {
                        attend(&acc[0].0, Some(acc[0].1), &ck, &cv, cu, false)?;
                    } else {
                        attend(&chunk_out, Some(chunk_lse), &ck, &cv, cu, false)?;
                        merge_attn_states(
                            q,
                            &MergeAttnStatesArgs {
                                out: acc[1 - cur].0,
                                out_lse: Some(acc[1 - cur].1),
                                prefix: acc[cur].0,
                                prefix_lse: acc[cur].1,
                                suffix: chunk_out,
                                suffix_lse: chunk_lse,
                            },
                        )?;
                        cur = 1 - cur;
                    }
                }
                // ... and finally context with the new tokens.
                merge_attn_states(
                    q,
                    &MergeAttnStatesArgs {
                        out: pre_out,
                        out_lse: None,
                        prefix: acc[cur].0,
                        prefix_lse: acc[cur].1,
                        suffix,
                        suffix_lse,
                    },
                )?;
            }
        }

        // ---- 5. decode: absorbed MQA over the head `[0, D)` ----
        if dn > 0 {
            let b = dn;
            // q_nope as [N, B, P] (a transposed view, no copy) times W_UK_T [N, P, L].
            let q_nope = q_raw.as_strided(0, &[n, b, p], &[dqk, n * dqk, 1])?;
            let mqa_q = mqa_q.ok_or_else(|| Error::backend(OP, "no decode query view"))?;
            let w_uk_t = Weight::pick_by_rows(f8.w_uk_t, w.w_uk_t, "w_uk_t", b)?;
            if fuse_query {
                // Straight into the query's latent columns, as [N, B, L] (its rope columns
                // were written by FusedNormRope).
                let ql_out = mqa_q.as_strided(0, &[n, b, l], &[l + r, n * (l + r), 1])?;
                fp8::bmm(q, ql_out, q_nope, w_uk_t)?;
            } else {
                let ql_nope = ws.view(Slot::QlNope, 0, &[n, b, l])?;
                fp8::bmm(q, ql_nope, q_nope, w_uk_t)?;
                let ql_bn = ql_nope.as_strided(0, &[b, n, l], &[l, b * l, 1])?;
                let q_pe_bn = q_raw.as_strided(p, &[b, n, r], &[n * dqk, dqk, 1])?;
                concat_mla_nope_rope(q, &ConcatMlaNopeRopeArgs { out: mqa_q, nope: ql_bn, rope: q_pe_bn })?;
            }
            let mqa_q4 = mqa_q.as_strided(0, &[b, 1, n, l + r], &[n * (l + r), n * (l + r), l + r, 1])?;
            let mqa_out = ws.view(Slot::MqaOut, 0, &[b, 1, n, l])?;
            decode.attend(
                q,
                &MlaDecodeAttentionArgs {
                    out: mqa_out,
                    lse: None,
                    query: mqa_q4,
                    cache: *kv_cache,
                    block_table: dec_bt,
                    seq_lens: dec_lens,
                    scale: d.scale,
                },
            )?;
            // Back from latent to value space: [N, B, L] x W_UV [N, L, V] into attn[:D] as [N, B, V].
            let x = mqa_out.as_strided(0, &[n, b, l], &[l, n * l, 1])?;
            let v_out = attn.as_strided(0, &[n, b, v], &[v, n * v, 1])?;
            fp8::bmm(q, v_out, x, Weight::pick_by_rows(f8.w_uv, w.w_uv, "w_uv", b)?)?;
        }

        // ---- 6. o_proj ----
        let attn_flat = attn.as_strided(0, &[t, n * v], &[n * v, 1])?;
        fp8::linear(q, ws, *out, attn_flat, Weight::pick(f8.o_proj, w.o_proj, "o_proj")?)
    }

    /// DeepSeek-V3.2's indexer and sparse attention for every token of the step (after the
    /// latent cache write), into `attn` `[T, N, V]`:
    /// 1. `q_idx = wq_b(q_c normed)` `[T, Hi, Di]`, `k_idx = LayerNorm(wk(x))` `[T, Di]`,
    ///    `w = weights_proj(x)` `[T, Hi]`; the half-split (neox) rope on the first R dims of
    ///    `q_idx` and `k_idx` with the main attention's cos/sin (rotation mscale included),
    ///    as transformers' `DeepseekV32Indexer`.
    /// 2. `CacheIndexerKeys`: the keys into the indexer part of the cache rows, by the same
    ///    slots as the latents (so IndexerTopK's slots address the latent cache).
    /// 3. `IndexerTopK` with `scale = Di^-0.5 * Hi^-0.5` (transformers multiplies `w` by
    ///    `Hi^-0.5` and the dot products by `Di^-0.5`; both are positive scalars of the whole
    ///    score, so folding them into one changes no ordering), once over the decode tokens
    ///    (decode block table) and once over the prefill tokens (prefill block table), each
    ///    token seeing positions `0..=` its own in its sequence.
    /// 4. The absorbed query `[q_nope . W_UK | q_pe]` `[T, N, L+R]`, `SparseMlaAttention`
    ///    over the selected latent slots, `. W_UV` into `attn`, [`SPARSE_ROWS`] tokens at a
    ///    time.
    fn sparse_attention(
        &self,
        q: &Queue,
        ws: &MlaWorkspace,
        hidden: &Tensor<'_>,
        meta: &MlaBatchMetadata,
        st: &SparseStep<'_, '_>,
    ) -> Result<()> {
        let d = self.dims;
        let Some(ix) = d.indexer else { return Err(Error::backend(OP, "sparse_attention on a dense block")) };
        let w = &self.w;
        let f8 = &w.fp8;
        let n = d.num_heads;
        let (l, p, r) = (d.kv_lora_rank, d.qk_nope_head_dim, d.qk_rope_head_dim);
        let dqk = d.qk_head_dim();
        let (hi, di, k) = (ix.n_heads, ix.head_dim, ix.topk);
        let t = meta.num_tokens();
        let dn = meta.num_decode_tokens;
        let cache_rs = req(w.rope_cos_sin_cache, "rope_cos_sin_cache")?;
        let iw = &w.indexer;

        // ---- 1. indexer query, key, head weights and their rope ----
        let q_c = self.q_c_view(ws, t, self.uses_fused_norm_rope())?;
        let idx_q = ws.view(Slot::IdxQ, 0, &[t, hi * di])?;
        let idx_k = ws.view(Slot::IdxK, 0, &[t, di])?;
        let idx_w = ws.view(Slot::IdxW, 0, &[t, hi])?;
        fp8::linear(q, ws, idx_q, q_c, Weight::pick(None, iw.wq_b, "indexer.wq_b")?)?;
        fp8::linear(q, ws, idx_k, *hidden, Weight::pick(None, iw.wk, "indexer.wk")?)?;
        fp8::linear(q, ws, idx_w, *hidden, Weight::pick(None, iw.weights_proj, "indexer.weights_proj")?)?;
        layer_norm(
            q,
            &LayerNormArgs {
                out: idx_k,
                x: idx_k,
                weight: req(iw.k_norm, "indexer.k_norm")?,
                bias: req(iw.k_norm_bias, "indexer.k_norm.bias")?,
                eps: INDEXER_K_NORM_EPS,
            },
        )?;
        rope_from_cache(
            q,
            &RopeFromCacheArgs {
                query: idx_q.as_strided(0, &[t, hi, r], &[hi * di, di, 1])?,
                key: Some(idx_k.as_strided(0, &[t, 1, r], &[di, di, 1])?),
                positions: st.positions,
                cos_sin_cache: cache_rs,
                is_neox: true,
            },
        )?;

        // ---- 2. the keys beside the latents ----
        let kv = st.kv_cache;
        let index_cache =
            kv.as_strided(l + r, &[kv.dim(0), kv.dim(1), di], &[kv.stride(0), kv.stride(1), 1])?;
        cache_indexer_keys(
            q,
            &CacheIndexerKeysArgs { k: idx_k, cache: index_cache, slot_mapping: st.slot_mapping },
        )?;

        // ---- 3. top-k slots per token, decode and prefill tokens against their own tables ----
        let topk = ws.view(Slot::IdxTopk, 0, &[t, k])?;
        let rows = ws.view(Slot::MetaIdx, 0, &[t])?;
        let cpos = ws.view(Slot::MetaIdx, t, &[t])?;
        let scale = ((di as f64).powf(-0.5) * (hi as f64).powf(-0.5)) as f32;
        let idx_q3 = idx_q.as_strided(0, &[t, hi, di], &[hi * di, di, 1])?;
        for (range, table) in [(0..dn, st.dec_bt), (dn..t, st.pre_bt)] {
            if range.is_empty() {
                continue;
            }
            let (a, b) = (range.start, range.end);
            indexer_top_k(
                q,
                &IndexerTopKArgs {
                    out: topk.slice(0, a, b)?,
                    query: idx_q3.slice(0, a, b)?,
                    weights: idx_w.slice(0, a, b)?,
                    cache: index_cache,
                    block_table: table,
                    seq_ids: rows.slice(0, a, b)?,
                    positions: cpos.slice(0, a, b)?,
                    scale,
                },
            )?;
        }

        // ---- 4. absorbed sparse attention for every token, `sparse_rows` tokens at a time ----
        let v = d.v_head_dim;
        let mut c0 = 0;
        while c0 < t {
            let rows = (t - c0).min(self.sparse_rows);
            let (w_uk_t, w_uv) = (
                Weight::pick_by_rows(f8.w_uk_t, w.w_uk_t, "w_uk_t", rows)?,
                Weight::pick_by_rows(f8.w_uv, w.w_uv, "w_uv", rows)?,
            );
            let q_nope = st.q_raw.as_strided(c0 * n * dqk, &[n, rows, p], &[dqk, n * dqk, 1])?;
            let ql_nope = ws.view(Slot::QlNope, 0, &[n, rows, l])?;
            fp8::bmm(q, ql_nope, q_nope, w_uk_t)?;
            let mqa_q = ws.view(Slot::MqaQ, 0, &[rows, n, l + r])?;
            let ql_tn = ql_nope.as_strided(0, &[rows, n, l], &[l, rows * l, 1])?;
            let q_pe = st.q_raw.as_strided(c0 * n * dqk + p, &[rows, n, r], &[n * dqk, dqk, 1])?;
            concat_mla_nope_rope(q, &ConcatMlaNopeRopeArgs { out: mqa_q, nope: ql_tn, rope: q_pe })?;
            let mqa_out = ws.view(Slot::MqaOut, 0, &[rows, n, l])?;
            sparse_mla_attention(
                q,
                &SparseMlaAttentionArgs {
                    out: mqa_out,
                    lse: None,
                    query: mqa_q,
                    cache: st.latent_cache,
                    indices: topk.slice(0, c0, c0 + rows)?,
                    scale: d.scale,
                },
            )?;
            let x = mqa_out.as_strided(0, &[n, rows, l], &[l, n * l, 1])?;
            let v_out = st.attn.as_strided(c0 * n * v, &[n, rows, v], &[v, n * v, 1])?;
            fp8::bmm(q, v_out, x, w_uv)?;
            c0 += rows;
        }
        Ok(())
    }

    /// Splits an up-projection `kv_nope` [rows, N*(P+V)] into the key
    /// `[k_nope | k_pe broadcast over heads]` (written to `key_slot`) and a value view.
    fn up_projected_kv<'a>(
        &self,
        q: &Queue,
        ws: &'a MlaWorkspace,
        key_slot: Slot,
        kv_nope: &Tensor<'a>,
        k_pe: &Tensor<'_>,
        rows: i64,
    ) -> Result<(Tensor<'a>, Tensor<'a>)> {
        let d = &self.dims;
        let (n, p, v) = (d.num_heads, d.qk_nope_head_dim, d.v_head_dim);
        let k_nope = kv_nope.as_strided(0, &[rows, n, p], &[n * (p + v), p + v, 1])?;
        let value = kv_nope.as_strided(p, &[rows, n, v], &[n * (p + v), p + v, 1])?;
        let key = ws.view(key_slot, 0, &[rows, n, d.qk_head_dim()])?;
        concat_mla_nope_rope(q, &ConcatMlaNopeRopeArgs { out: key, nope: k_nope, rope: *k_pe })?;
        Ok((key, value))
    }
}

/// How a step's decode attention runs: `out = MlaDecodeAttention(query, cache)` for the
/// args the block passes (no lse). The plain op by default; decode context parallelism
/// (`tp::dcp`) attends over the rank's share of the cache and merges the ranks' partials.
pub trait DecodeAttention: Sync {
    fn attend(&self, q: &Queue, args: &MlaDecodeAttentionArgs<'_>) -> Result<()>;

    /// Whether this is the plain op over the whole cache (a DeepSeek-V3.2 block's sparse
    /// attention runs only then).
    fn is_plain(&self) -> bool {
        false
    }
}

/// The plain op on the block's queue.
struct PlainDecode;

impl DecodeAttention for PlainDecode {
    fn attend(&self, q: &Queue, args: &MlaDecodeAttentionArgs<'_>) -> Result<()> {
        mla_decode_attention(q, args)
    }

    fn is_plain(&self) -> bool {
        true
    }
}

/// Tokens whose absorbed query `[rows, N, L+R]` and output a V3.2 step computes at once: a
/// long prefill runs its sparse attention in chunks of this many tokens, so the scratch
/// stays bounded (DeepSeek's N = 128: 0.6 GB per bf16 tensor) and no tensor reaches 2^31
/// elements. Decode steps and short prefills are one chunk.
pub const SPARSE_ROWS: i64 = 4096;

/// transformers' `DeepseekV32Indexer.k_norm = nn.LayerNorm(head_dim, eps=1e-6)`: not the
/// config's `rms_norm_eps`.
const INDEXER_K_NORM_EPS: f32 = 1e-6;

/// What [`MlaBlock::launch_with`] hands the sparse path: the step's cache views and
/// metadata views, and the raw query and attention output scratch.
struct SparseStep<'c, 'w> {
    kv_cache: &'c Tensor<'c>,
    latent_cache: Tensor<'c>,
    positions: Tensor<'w>,
    slot_mapping: Tensor<'w>,
    dec_bt: Tensor<'w>,
    pre_bt: Tensor<'w>,
    q_raw: Tensor<'w>,
    attn: Tensor<'w>,
}

/// Each token's row in the block table IndexerTopK reads for it: decode token b is row b
/// of the decode table, a prefill token its sequence's row of the prefill table.
fn indexer_rows(meta: &MlaBatchMetadata) -> Vec<i32> {
    let mut rows: Vec<i32> = (0..meta.num_decode_tokens as i32).collect();
    for (b, w) in meta.prefill_cu_seqlens_q.windows(2).enumerate() {
        rows.extend(std::iter::repeat_n(b as i32, (w[1] - w[0]).max(0) as usize));
    }
    rows
}

/// Each token's position in its own sequence (its cache row, not its rope position): what
/// IndexerTopK's causal limit is. A decode padding row (length 0) gets -1: it sees nothing.
fn indexer_positions(meta: &MlaBatchMetadata) -> Vec<i32> {
    let mut pos: Vec<i32> = meta.decode_seq_lens.iter().map(|&l| l - 1).collect();
    for (w, &ctx) in meta.prefill_cu_seqlens_q.windows(2).zip(&meta.prefill_context_lens) {
        pos.extend((0..(w[1] - w[0]).max(0)).map(|i| ctx + i));
    }
    pos
}

fn step_key(meta: &MlaBatchMetadata, fused: bool) -> StepKey {
    StepKey {
        tokens: meta.num_tokens(),
        decode_tokens: meta.num_decode_tokens,
        i32_len: meta.i32_len(),
        chunks: meta.chunks.len(),
        fused,
    }
}
