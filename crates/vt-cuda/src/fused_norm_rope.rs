//! FusedNormRope: RmsNorm of the latent part and RoPE of the rope part of each kv row in one
//! launch (`kernels-cuda/fused_norm_rope.cu`), bit-identical to the split ops because both
//! use `kernels-cuda/norm_rope.cuh` with the same block size. The optional query rope and
//! cache write ride in the same launch: the first blocks take the kv rows (one token a block,
//! its cache row too), the blocks after them rotate the query, `256 / (R/2)` heads of one
//! token a block (one pair per thread), so a one-token decode step still spreads its 128
//! heads over 16 blocks.
//!
//! # Floor
//!
//! Bytes per token (16-bit, DeepSeek-V3: L 512, R 64, N 128 query heads): kv row read 1152 B,
//! latent_out + rope_out written 1152 B; the query adds N·R·2 = 16 KiB read + 16 KiB written;
//! the cache write 1152 B. A decode step of B = 128 tokens with both: ~4.8 MB, ~1.1 us at the
//! H200's ~4.2 TB/s copy rate: these launches are latency-bound (a few us each), which is what
//! folding RopeFromCache(q) and ConcatAndCacheMla into this one saves.

use vt_core::{FusedNormRopeArgs, OpId, Queue, Result};

use crate::rms_norm::NORM_THREADS;
use crate::rope_from_cache::int;
use crate::{grid_1d, kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("fused_norm_rope");

const OP: OpId = OpId::FusedNormRope;

pub(crate) fn run(q: &Queue, a: &FusedNormRopeArgs<'_>) -> Result<()> {
    CudaQueue::of(q, OP)?.run(OP, &plan(a)?)
}

/// The kernel skips positions outside the cache (the query copied unrotated) and cache
/// slots outside 0..NB*BS; it writes only rows t < T of the outputs, query rows t < Tq.
pub(crate) fn plan(a: &FusedNormRopeArgs<'_>) -> Result<Vec<Launch>> {
    let (t, l) = (a.kv.dim(0), a.weight.dim(0));
    let r = a.kv.dim(1) - l;
    if t == 0 {
        return Ok(vec![]);
    }
    // No query: null pointers and 0 tokens; no cache write: a null cache.
    let (qi, qi_st, qi_sh, qo, qo_st, qo_sh, q_heads, q_tokens) = match &a.query {
        Some(x) => (
            x.input.data_addr(),
            x.input.stride(0),
            x.input.stride(1),
            x.out.data_addr(),
            x.out.stride(0),
            x.out.stride(1),
            int(OP, "query.input", x.input.dim(1))?,
            x.input.dim(0),
        ),
        None => (0, 0, 0, 0, 0, 0, 0, 0),
    };
    // The kernel indexes query elements j < heads * R with an int.
    int(OP, "query.input", i64::from(q_heads) * r)?;
    // Query heads per query block: one rotated pair per thread.
    let q_chunk = (NORM_THREADS as i64 / (r / 2).max(1)).max(1);
    let q_blocks = if q_tokens > 0 { (i64::from(q_heads) + q_chunk - 1) / q_chunk } else { 0 };
    let (kvc, c_sb, c_sr, slots, slot_s, nb, bs) = match &a.cache_write {
        Some(x) => (
            x.cache.data_addr(),
            x.cache.stride(0),
            x.cache.stride(1),
            x.slot_mapping.data_addr(),
            x.slot_mapping.stride(0),
            x.cache.dim(0),
            x.cache.dim(1),
        ),
        None => (0, 0, 0, 0, 0, 0, 1),
    };
    // Blocks 0..kv_blocks take the kv rows; the rest (at most 2^20) the query's (token,
    // chunk) items, grid-stride.
    let kv_blocks = grid_1d(t);
    let q_items = q_tokens.checked_mul(q_blocks).ok_or_else(|| {
        vt_core::Error::invalid(OP, "query.input", format!("{q_tokens} tokens x {q_blocks} chunks overflow"))
    })?;
    let q_grid = if q_items > 0 { grid_1d(q_items) } else { 0 };
    let grid = (kv_blocks + q_grid, 1, 1);
    let args: [Arg; 34] = [
        a.latent_out.data_addr().into(),
        a.latent_out.stride(0).into(),
        a.rope_out.data_addr().into(),
        a.rope_out.stride(0).into(),
        a.kv.data_addr().into(),
        a.kv.stride(0).into(),
        a.weight.data_addr().into(),
        int(OP, "weight", l)?.into(),
        int(OP, "kv", r)?.into(),
        a.positions.data_addr().into(),
        a.positions.stride(0).into(),
        a.cos_sin_cache.data_addr().into(),
        a.cos_sin_cache.dim(0).into(),
        t.into(),
        a.eps.into(),
        (a.is_neox as i32).into(),
        qi.into(),
        qi_st.into(),
        qi_sh.into(),
        qo.into(),
        qo_st.into(),
        qo_sh.into(),
        q_heads.into(),
        q_tokens.into(),
        int(OP, "query.input", q_chunk)?.into(),
        q_blocks.into(),
        i64::from(kv_blocks).into(),
        kvc.into(),
        c_sb.into(),
        c_sr.into(),
        slots.into(),
        slot_s.into(),
        nb.into(),
        bs.into(),
    ];
    Ok(vec![Launch::new(&SRC, "fused_norm_rope", a.kv.dtype(), grid, NORM_THREADS, args)])
}
