//! The seesaw MlaDecodeAttention kernel (`kernels-cuda/mla_decode_attention/seesaw_sm90.cuh`,
//! sm_90a): both warpgroups compute scores on alternating KV tiles, each owning half of the
//! output columns; the cache through the TMA (block sizes that are multiples of 64), two KV
//! stages. Not chosen by [`Kernel::Auto`](super::Kernel::Auto): on the H200 it measured
//! slower than the wgmma kernel (docs/perf.md, decode v12); it is forced with
//! [`Kernel::Seesaw`](super::Kernel::Seesaw) for tests and benches.

use vt_core::MlaDecodeAttentionArgs;

use super::{wgmma_sm90, MainKernel, THREADS};

/// Query rows per CTA (`mla::seesaw::MT`).
pub(super) const ROWS: u32 = 64;
/// Whole KV tiles in shared memory.
pub(super) const STAGES: u32 = 2;

/// Dynamic shared memory (`mla::seesaw::Layout::SMEM`: Q, the KV stages, the per-row floats
/// the warpgroups exchange, token and bad-block flags, schedule, mbarriers, alignment).
pub(super) const SMEM: u32 = {
    let tile = 9 * 64 * 128;
    9 * ROWS * 128 + STAGES * tile + 10 * ROWS * 4 + STAGES * 64 + STAGES * 8 + 40 * 4 + STAGES * 8 + 1024
};
const _: () = assert!(SMEM <= super::MAX_SMEM, "the layout fits a Hopper block");

/// The main launch, when the cache can be read through the TMA (`None` otherwise).
pub(super) fn main(a: &MlaDecodeAttentionArgs<'_>) -> Option<MainKernel> {
    wgmma_sm90::tma_ok(&a.cache).then_some(MainKernel {
        base: "mla_decode_seesaw",
        name: "seesaw",
        rows: ROWS as i64,
        smem: SMEM,
        threads: THREADS,
        tma: true,
        ctas_per_sm: 1,
    })
}
