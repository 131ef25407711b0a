//! The mma.sync MlaDecodeAttention kernels (`kernels-cuda/mla_decode_attention/mma_sm80.cuh`,
//! sm_80+): D = 576, Dv = 512, 16, 32 or 64 query rows per CTA, KV tiles loaded as 32-token
//! halves into a ring of half-tile slots: 5 (4 at 64 rows), or 3 (2 at 64 rows) in the small
//! ring (`mla_decode_mma{16,32,64}s`) for devices with less shared memory per block (an
//! A100's 163 KB).
//!
//! Over an fp8_ds_mla cache (`mla_decode_mma{16,32,64}[s]_fp8`) the ring holds the raw
//! 656-byte rows of 6 / 5 / 3 half tiles (3 / 2 in the small ring; no small 64-row kernel),
//! and each tile is dequantized into two 16-bit half-tile slots before its products.

use super::{CacheMaps, MainKernel, THREADS};

/// Query rows per CTA for `m_total` = s_q * N query rows per sequence: the fewest of 16, 32,
/// 64 that hold them (more take several row blocks of 64).
pub(super) fn rows(m_total: i64) -> u32 {
    if m_total <= 16 {
        16
    } else if m_total <= 32 {
        32
    } else {
        64
    }
}

/// Half-tile slots of the KV ring (`HS` of `mla_decode_mma{16,32,64}[s]`).
pub(super) const fn slots(mt: u32, small: bool) -> u32 {
    match (mt <= 32, small) {
        (true, false) => 5,
        (false, false) => 4,
        (true, true) => 3,
        (false, true) => 2,
    }
}

/// Dynamic shared memory with `mt` query rows per CTA and a ring of `slots` half tiles
/// (`mla::MmaLayout<MT, HS>::SMEM`: Q, the ring, P, reductions, per-tile token and
/// bad-block flags, schedule, alignment).
pub(super) const fn smem(mt: u32, slots: u32) -> u32 {
    let half = 9 * 32 * 128;
    let ring = slots.div_ceil(2);
    9 * mt * 128 + slots * half + mt * 128 + 2 * 128 * 4 + ring * 64 + ring * 16 + 40 * 4 + 1024
}

/// Ring slots (raw half tiles) of the kernels over an fp8_ds_mla cache
/// (`mla_decode_mma{16,32,64}[s]_fp8`); `None`: no such kernel (64 rows, small ring).
pub(super) const fn fp8_slots(mt: u32, small: bool) -> Option<u32> {
    match (mt, small) {
        (16, false) => Some(6),
        (32, false) => Some(5),
        (_, false) => Some(3),
        (16, true) => Some(3),
        (32, true) => Some(2),
        _ => None,
    }
}

/// Dynamic shared memory of the fp8 kernels (`mla::MmaLayout<MT, HS, true>::SMEM`: Q, the
/// two 16-bit half-tile slots of the current tile, the ring of raw rows, P, reductions,
/// flags, schedule, alignment).
pub(super) const fn fp8_smem(mt: u32, slots: u32) -> u32 {
    let half = 9 * 32 * 128;
    // Flags of one more tile than the 16-bit kernels: the ring is refilled before the
    // current tile's products.
    let ring = slots.div_ceil(2) + 1;
    9 * mt * 128
        + 2 * half
        + slots * 32 * 656
        + mt * 128
        + 2 * 128 * 4
        + ring * 64
        + ring * 16
        + 40 * 4
        + 1024
}

/// Dynamic shared memory of the kernel [`main`] picks for `m_total` rows (`None`: no such
/// kernel).
pub(super) fn smem_for(m_total: i64, small: bool, fp8: bool) -> Option<u32> {
    let mt = rows(m_total);
    if fp8 {
        fp8_slots(mt, small).map(|hs| fp8_smem(mt, hs))
    } else {
        Some(smem(mt, slots(mt, small)))
    }
}

/// The main launch for `m_total` query rows per sequence, with the full or the small ring,
/// over a 16-bit or (`fp8`) an fp8_ds_mla cache; `None`: no such kernel.
pub(super) fn main(m_total: i64, small: bool, fp8: bool) -> Option<MainKernel> {
    let mt = rows(m_total);
    let (base, name) = match (mt, small, fp8) {
        (16, false, false) => ("mla_decode_mma16", "mma16"),
        (32, false, false) => ("mla_decode_mma32", "mma32"),
        (_, false, false) => ("mla_decode_mma64", "mma64"),
        (16, true, false) => ("mla_decode_mma16s", "mma16s"),
        (32, true, false) => ("mla_decode_mma32s", "mma32s"),
        (_, true, false) => ("mla_decode_mma64s", "mma64s"),
        (16, false, true) => ("mla_decode_mma16_fp8", "mma16_fp8"),
        (32, false, true) => ("mla_decode_mma32_fp8", "mma32_fp8"),
        (_, false, true) => ("mla_decode_mma64_fp8", "mma64_fp8"),
        (16, true, true) => ("mla_decode_mma16s_fp8", "mma16s_fp8"),
        (32, true, true) => ("mla_decode_mma32s_fp8", "mma32s_fp8"),
        (_, true, true) => return None,
    };
    Some(MainKernel {
        base,
        name,
        rows: mt as i64,
        smem: smem_for(m_total, small, fp8)?,
        threads: THREADS,
        maps: CacheMaps::None,
        ctas_per_sm: 1,
        cluster_y: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An A100's opt-in shared memory per block (163 KB); an H100/H200 allows 227 KB.
    const A100_SMEM: u32 = 166_912;
    const H200_SMEM: u32 = 232_448;

    #[test]
    fn the_small_ring_fits_an_a100_and_the_full_ring_fits_a_hopper() {
        for mt in [16, 32, 64] {
            assert!(smem(mt, slots(mt, true)) <= A100_SMEM, "small ring, {mt} rows");
            assert!(smem(mt, slots(mt, false)) <= H200_SMEM, "full ring, {mt} rows");
        }
        // The full rings are what an A100 cannot hold (so Auto picks the small one there).
        for mt in [16, 32, 64] {
            assert!(smem(mt, slots(mt, false)) > A100_SMEM, "full ring, {mt} rows");
        }
        // fp8_ds_mla: every full ring fits a Hopper, the small rings (16, 32 rows) an A100.
        for mt in [16, 32, 64] {
            let full = fp8_slots(mt, false).map(|hs| fp8_smem(mt, hs));
            assert!(full.is_some_and(|b| b <= H200_SMEM), "fp8 full ring, {mt} rows");
            let small = fp8_slots(mt, true).map(|hs| fp8_smem(mt, hs));
            assert_eq!(small.is_some_and(|b| b <= A100_SMEM), mt <= 32, "fp8 small ring, {mt} rows");
        }
    }
}
