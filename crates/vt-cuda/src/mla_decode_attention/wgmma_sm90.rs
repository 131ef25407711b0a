//! The wgmma MlaDecodeAttention kernel (`kernels-cuda/mla_decode_attention/wgmma_sm90.cuh`,
//! sm_90a): D = 576, Dv = 512, 64 query rows per CTA, a consumer and a producer warpgroup,
//! two 72 KB KV stages loaded by cp.async or, when the block size is a multiple of 64 and
//! `VT_MLA_DECODE_TMA` is on, by the tensor memory accelerator (`mla_decode_wgmma_tma`).

use vt_core::{MlaDecodeAttentionArgs, Tensor};

use super::{MainKernel, THREADS, TILE_TOKENS};
use crate::launch::TensorMapSpec;

/// Query rows per CTA (`mla::WGMMA_ROWS`).
pub(super) const ROWS: u32 = 64;
/// Whole KV tiles in shared memory (`mla::Layout<MT>::STAGES`).
pub(super) const STAGES: u32 = 2;

/// Dynamic shared memory with `mt` query rows per CTA (`mla::Layout<MT>::SMEM`: Q, the KV
/// stages, P, reductions, token and bad-block flags, schedule, mbarriers, alignment).
pub(super) const fn smem(mt: u32) -> u32 {
    let tile = 9 * 64 * 128;
    9 * mt * 128
        + STAGES * tile
        + mt * 128
        + 2 * 128 * 4
        + STAGES * 64
        + STAGES * 8
        + 40 * 4
        + STAGES * 8
        + 1024
}

/// The kernel's dynamic shared memory.
pub(super) const SMEM: u32 = smem(ROWS);
const _: () = assert!(SMEM <= super::MAX_SMEM, "the layout fits a Hopper block");

/// Whether the kernel loads the cache through the TMA: a tile of 64 tokens is one box of 64
/// rows of one block (64 divides BS) and the block count fits the map's 32-bit coordinates
/// (one past the last block reads zeros). Smaller blocks take the cp.async loads: with one
/// box per block per 64 features, BS = 1 and 16 measured 5.1x and 1.07x slower through the
/// TMA on the H200 (docs/perf.md). The kernel handles any BS dividing 64.
fn tma_ok(cache: &Tensor<'_>) -> bool {
    let bs = cache.dim(1);
    bs > 0 && (bs as u64).is_multiple_of(TILE_TOKENS as u64) && cache.dim(0) < i32::MAX as i64
}

/// The cache's tensor map: (feature, row in block, block), boxes of 64 features x
/// min(BS, 64) rows x 1 block, 128-byte swizzle (`vt::tc::swz`). The caller checked the rows
/// (16-byte aligned start, strides multiples of 8 elements) and `tma_ok`.
pub(super) fn cache_map(cache: &Tensor<'_>) -> TensorMapSpec {
    let (nb, bs, d) = (cache.dim(0) as u64, cache.dim(1) as u64, cache.dim(2) as u64);
    // A dim of size 1 may carry any stride; the map wants a positive multiple of 16 bytes.
    let row_bytes = if bs == 1 { d * 2 } else { cache.stride(1) as u64 * 2 };
    let blk_bytes = if nb == 1 { bs * row_bytes } else { cache.stride(0) as u64 * 2 };
    TensorMapSpec {
        what: "cache",
        dtype: cache.dtype(),
        addr: cache.data_addr(),
        dims: [d, bs, nb],
        strides: [row_bytes, blk_bytes],
        boxes: [64, bs.min(TILE_TOKENS as u64) as u32, 1],
    }
}

/// The main launch; `tma_flag`: the `VT_MLA_DECODE_TMA` flag (the TMA loads also need
/// [`tma_ok`]).
pub(super) fn main(a: &MlaDecodeAttentionArgs<'_>, tma_flag: bool) -> MainKernel {
    let tma = tma_ok(&a.cache) && tma_flag;
    let (base, name) =
        if tma { ("mla_decode_wgmma_tma", "wgmma_tma") } else { ("mla_decode_wgmma", "wgmma") };
    MainKernel { base, name, rows: ROWS as i64, smem: SMEM, threads: THREADS, tma, ctas_per_sm: 1 }
}
