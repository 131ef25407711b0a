//! The mma.sync MlaDecodeAttention kernels (`kernels-cuda/mla_decode_attention/mma_sm80.cuh`,
//! sm_80+): D = 576, Dv = 512, 16, 32 or 64 query rows per CTA, KV tiles loaded as 32-token
//! halves into a ring of half-tile slots: 5 (4 at 64 rows), or 3 (2 at 64 rows) in the small
//! ring (`mla_decode_mma{16,32,64}s`) for devices with less shared memory per block (an
//! A100's 163 KB).

use super::{MainKernel, THREADS};

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

/// Dynamic shared memory of the kernel [`main`] picks for `m_total` rows.
pub(super) fn smem_for(m_total: i64, small: bool) -> u32 {
    let mt = rows(m_total);
    smem(mt, slots(mt, small))
}

/// The main launch for `m_total` query rows per sequence, with the full or the small ring.
pub(super) fn main(m_total: i64, small: bool) -> MainKernel {
    let mt = rows(m_total);
    let (base, name) = match (mt, small) {
        (16, false) => ("mla_decode_mma16", "mma16"),
        (32, false) => ("mla_decode_mma32", "mma32"),
        (_, false) => ("mla_decode_mma64", "mma64"),
        (16, true) => ("mla_decode_mma16s", "mma16s"),
        (32, true) => ("mla_decode_mma32s", "mma32s"),
        (_, true) => ("mla_decode_mma64s", "mma64s"),
    };
    MainKernel {
        base,
        name,
        rows: mt as i64,
        smem: smem(mt, slots(mt, small)),
        threads: THREADS,
        tma: false,
        ctas_per_sm: 1,
    }
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
    }
}
