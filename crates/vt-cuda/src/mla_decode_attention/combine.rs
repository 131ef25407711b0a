//! The combine kernel (`kernels-cuda/mla_decode_attention/combine.cuh`): merges the
//! partials of sequences cut over several parts by their log-sum-exp and writes empty
//! sequences; launched after every main kernel, with programmatic dependent launch on sm_90.

use vt_core::DType;

use super::{DeviceInfo, Params, SRC, THREADS};
use crate::{Arg, Launch};

/// Warps per CTA (`mla::COMBINE_WARPS`): query rows per CTA at one warp per row.
pub(super) const WARPS: i64 = THREADS as i64 / 32;
/// Output columns per CTA (`mla::COMBINE_COLS`): a warp merges a whole 512-column row (Dv =
/// 512 in DeepSeek's MLA) with 16-byte loads, so a CTA covers 8 / `wpr` rows.
pub(super) const COLS: i64 = 512;

/// Warps per query row (`combine_wpr`): when sequences are cut into many pieces (16 or more
/// each: few sequences, many parts) all of a CTA's warps share each row's partials;
/// otherwise a warp per row (8 warps per row at b = 32 launched 8192 mostly idle CTAs:
/// measured slower).
pub(super) fn warps_per_row(parts: i64, b: i64) -> i64 {
    if parts >= 16 * b {
        WARPS
    } else {
        1
    }
}

/// The launch for `b` sequences of `m_total` query rows of `dv` columns, `wpr` warps per
/// row. On sm_90 it launches while the main kernel runs (programmatic dependent launch)
/// and waits for it on the device, hiding its launch latency.
pub(super) fn launch(
    p: &Params,
    dt: DType,
    (b, m_total, dv): (i64, i64, i64),
    wpr: i64,
    info: &DeviceInfo,
) -> Launch {
    let rows_per_cta = WARPS / wpr;
    let grid =
        (b as u32, ((m_total + rows_per_cta - 1) / rows_per_cta) as u32, ((dv + COLS - 1) / COLS) as u32);
    Launch::new(&SRC, "mla_decode_combine", dt, grid, THREADS, [Arg::of_struct(*p)]).dependent_on(info.sm)
}
