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

/// Combine CTAs an SM holds at once (`mla::COMBINE_MIN_CTAS`, the kernel's launch bounds;
/// checked by facts.rs).
pub(super) const CTAS_PER_SM: i64 = 3;

/// grid.y of the strided form (`VT_MLA_COMBINE_STRIDE`): the row groups (`groups`) of each of
/// the `b` sequences and `z` column blocks, cut to as many as one wave of combine CTAs holds
/// (`sms` x [`CTAS_PER_SM`]), at least 1; each CTA takes every grid.y-th row group.
pub(super) fn strided_groups(b: i64, groups: i64, z: i64, sms: u32) -> i64 {
    let wave = sms as i64 * CTAS_PER_SM;
    (wave / (b * z).max(1)).clamp(1, groups.max(1))
}

/// The combine's kernel and grid.y: the strided form where `strided` and it strides
/// ([`strided_groups`] fewer than `groups`), else the plain form over every row group.
pub(super) fn form(strided: bool, b: i64, groups: i64, z: i64, sms: u32) -> (&'static str, i64) {
    match strided_groups(b, groups, z, sms) {
        y if strided && y < groups => ("mla_decode_combine_strided", y),
        _ => ("mla_decode_combine", groups),
    }
}

/// The launch for `b` sequences of `m_total` query rows of `dv` columns, `wpr` warps per
/// row; `strided` (`VT_MLA_COMBINE_STRIDE`): the strided form where it strides, i.e. where
/// [`strided_groups`] is fewer than the row groups (an H100 measured it 3-7% faster at h128
/// b128 and no different where it launched the same grid as the plain form but for its loop,
/// h64 b32 up to 2% slower: docs/perf.md, "Forty-fourth session"). On sm_90 it launches while
/// the main kernel runs (programmatic dependent launch) and waits for it on the device,
/// hiding its launch latency.
pub(super) fn launch(
    p: &Params,
    dt: DType,
    (b, m_total, dv): (i64, i64, i64),
    wpr: i64,
    strided: bool,
    info: &DeviceInfo,
) -> Launch {
    let rows_per_cta = WARPS / wpr;
    let (groups, z) = ((m_total + rows_per_cta - 1) / rows_per_cta, (dv + COLS - 1) / COLS);
    let (base, y) = form(strided, b, groups, z, info.sms);
    Launch::new(&SRC, base, dt, (b as u32, y as u32, z as u32), THREADS, [Arg::of_struct(*p)])
        .dependent_on(info.sm)
}

#[cfg(test)]
mod tests {
    use super::{form, strided_groups};

    /// The strided form only where it strides: h128 b128 (16 row groups -> 3) and h64 b128
    /// (8 -> 3); h64 b32 would launch all 8 groups, so the plain kernel runs, as with the flag off.
    #[test]
    fn the_strided_combine_runs_only_where_it_launches_fewer_row_groups() {
        assert_eq!(form(true, 128, 16, 1, 132), ("mla_decode_combine_strided", 3));
        assert_eq!(form(true, 128, 8, 1, 132), ("mla_decode_combine_strided", 3));
        assert_eq!(form(true, 32, 8, 1, 132), ("mla_decode_combine", 8));
        assert_eq!(form(true, 1, 16, 1, 132), ("mla_decode_combine", 16));
        assert_eq!(form(false, 128, 16, 1, 132), ("mla_decode_combine", 16));
    }

    /// One wave of combine CTAs (132 SMs x 3): b128 at 128 heads (16 row groups) takes 3 a
    /// sequence, b32 12, b1 and b2 every group; never 0, never more than the groups.
    #[test]
    fn strided_groups_fill_one_wave_and_stay_within_the_row_groups() {
        assert_eq!(strided_groups(128, 16, 1, 132), 3);
        assert_eq!(strided_groups(32, 16, 1, 132), 12);
        assert_eq!(strided_groups(32, 8, 1, 132), 8);
        assert_eq!(strided_groups(1, 16, 1, 132), 16);
        assert_eq!(strided_groups(2, 128, 1, 132), 128);
        assert_eq!(strided_groups(1000, 16, 1, 132), 1);
        assert_eq!(strided_groups(64, 16, 2, 132), 3);
        assert_eq!(strided_groups(5, 0, 1, 132), 1);
    }
}
