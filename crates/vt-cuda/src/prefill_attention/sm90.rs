//! The sm_90a wgmma PrefillAttention kernel (`kernels-cuda/prefill_attention/sm90.cuh`,
//! whose header comment describes it): 128 query rows per CTA, a producer warpgroup and two
//! consumer warpgroups (384 threads), K/V tiles of 128 keys in a two-stage ring.

use vt_core::{Error, PrefillAttentionArgs, Result};

use super::{function, launch, Params, OP};
use crate::{cfg, CudaQueue};

/// Query rows per CTA (two consumer warpgroups of 64).
pub(super) const TILE_ROWS: i64 = 128;
const BN: u32 = 128;
const STAGES: u32 = 2;
const THREADS: u32 = 384;

/// Dynamic shared memory of one CTA, as `Layout::SMEM` in the kernel file: Q of two
/// warpgroups, two K and two V stages, eight mbarriers, 1 KB of alignment slack.
pub(super) fn smem_bytes(d: u32, dv: u32) -> u32 {
    2 * d * 128 + STAGES * BN * (d + dv) * 2 + 8 * STAGES * 4 + 1024
}

fn base_name(d: i64, dv: i64) -> Option<&'static str> {
    match (d, dv) {
        (192, 128) => Some("prefill_attention_wgmma_192x128"),
        (128, 128) => Some("prefill_attention_wgmma_128x128"),
        (64, 64) => Some("prefill_attention_wgmma_64x64"),
        _ => None,
    }
}

pub(super) fn run(cq: &CudaQueue, a: &PrefillAttentionArgs<'_>, p: &Params) -> Result<()> {
    let (d, dv) = (a.q.dim(2), a.v.dim(2));
    let base = base_name(d, dv)
        .ok_or_else(|| Error::invalid(OP, "q", format!("no wgmma kernel for head dims ({d}, {dv})")))?;
    // d and dv are one of the pairs above, so the narrowing is exact.
    let smem = smem_bytes(d as u32, dv as u32);
    let f = function(cq, base, a.q.dtype(), smem)?;
    let grid = (p.q_tiles as u32, a.q.dim(1) as u32, (a.cu_seqlens_q.dim(0) - 1) as u32);
    launch(cq, &f, cfg(grid, THREADS, smem), p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wgmma_layout_fits_a_hopper_block() {
        for (d, dv) in super::super::FAST_DIMS {
            assert!(smem_bytes(d as u32, dv as u32) <= 232_448, "({d}, {dv})");
            assert!(base_name(d, dv).is_some());
        }
    }
}
