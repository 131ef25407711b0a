//! The sm_80+ mma.sync PrefillAttention kernel (`kernels-cuda/prefill_attention/sm80.cuh`,
//! whose header comment describes it): FlashAttention-2 class, 128 query rows per CTA in 8
//! warps of 16 rows, K/V tiles of 64 keys through a cp.async ring (2 stages at qk 192, 4 at
//! 128, 3 at 64), at most 160 KB of shared memory so an A100 runs it.

use vt_core::{Error, PrefillAttentionArgs, Result};

use super::{kernel, Params, OP};
use crate::{Arg, Launch};

/// Query rows per CTA (`pf::sm80::ROWS`).
pub(super) const TILE_ROWS: i64 = 128;
/// Keys per K/V tile (`pf::sm80::BN`).
const BN: u32 = 64;
/// 8 warps (`pf::sm80::THREADS`).
const THREADS: u32 = 256;

/// Ring depth for qk head dim `d` (`pf::sm80::Stages`).
fn stages(d: u32) -> u32 {
    match d {
        192 => 2,
        128 => 4,
        _ => 3,
    }
}

/// Dynamic shared memory of one CTA, as `Layout::SMEM` in the kernel file: the Q tile, the
/// K and V rings (16-bit elements), 128 bytes of alignment slack. `None` for head dims the
/// kernel is not built for.
pub(super) fn smem_bytes(d: i64, dv: i64) -> Option<u32> {
    if !super::FAST_DIMS.contains(&(d, dv)) {
        return None;
    }
    let (d, dv) = (u32::try_from(d).ok()?, u32::try_from(dv).ok()?);
    Some(TILE_ROWS as u32 * d * 2 + stages(d) * BN * (d + dv) * 2 + 128)
}

pub(super) fn plan(a: &PrefillAttentionArgs<'_>, p: &Params) -> Result<Vec<Launch>> {
    let (d, dv) = (a.query.dim(2), a.v.dim(2));
    let smem = smem_bytes(d, dv)
        .ok_or_else(|| Error::invalid(OP, "query", format!("no mma kernel for head dims ({d}, {dv})")))?;
    // The dispatcher checked the grid against CUDA's limits (Params::new).
    let grid = (p.q_tiles as u32, a.query.dim(1) as u32, (a.cu_seqlens_q.dim(0) - 1) as u32);
    Ok(vec![kernel("prefill_attention_mma", a.query.dtype(), grid, THREADS, smem, vec![Arg::of_struct(*p)])])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes `Layout<D, DV>::SMEM` of sm80.cuh computes (its static_assert keeps them
    /// under an A100's 163 KB).
    #[test]
    fn shared_memory_matches_the_kernel_layout() {
        assert_eq!(smem_bytes(192, 128), Some(128 * 384 + 2 * 64 * 640 + 128));
        assert_eq!(smem_bytes(128, 128), Some(128 * 256 + 4 * 64 * 512 + 128));
        assert_eq!(smem_bytes(64, 64), Some(128 * 128 + 3 * 64 * 256 + 128));
        assert_eq!(smem_bytes(576, 512), None);
        for (d, dv) in super::super::FAST_DIMS {
            assert!(smem_bytes(d, dv).is_some_and(|s| s <= 166_912));
        }
    }
}
