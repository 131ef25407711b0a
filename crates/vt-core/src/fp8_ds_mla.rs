//! The `fp8_ds_mla` latent-cache row ([`DType::Fp8DsMla`]): the
//! format of FlashMLA and vLLM, 656 bytes per token.
//!
//! | bytes | what |
//! |---|---|
//! | `0 .. 512` | the 512 latent values (`kv_c`), OCP float8 e4m3fn codes |
//! | `512 .. 528` | 4 f32 scales, little-endian; scale g covers latent values `128 g .. 128 g + 128` |
//! | `528 .. 656` | the 64 rope values (`k_pe`), bf16 little-endian, not quantized |
//!
//! A latent value decodes as `e4m3(code) * scale` (in f32). The writer picks
//! `scale = amax / 448` per 128-value group (amax the group's largest |value|, 448 the
//! largest e4m3 value, as the peers do) and stores `code = e4m3(value / scale)`, rounded to
//! nearest even. A group whose amax is 0 gets scale 0 and zero codes, which decode to 0
//! (so an all-zero row stays finite, never 0/0). Non-finite inputs give a non-finite
//! scale; nothing downstream hides that.
//!
//! These host functions are the definition the CPU reference uses and the GPU kernels
//! reproduce bit for bit (IEEE f32 division, then round to nearest even to e4m3).

use crate::{f32_to_f8e4m3, f8e4m3_to_f32, DType, Error, OpId, Result, Tensor};

/// Latent values per row (kv_lora_rank).
pub const LATENT: usize = 512;
/// Rope values per row (qk_rope_head_dim).
pub const ROPE: usize = 64;
/// Latent values per scale.
pub const GROUP: usize = 128;
/// Scales per row.
pub const GROUPS: usize = LATENT / GROUP;
/// The byte offset of the scales.
pub const SCALE_OFFSET: usize = LATENT;
/// The byte offset of the rope values.
pub const ROPE_OFFSET: usize = SCALE_OFFSET + 4 * GROUPS;
/// Bytes per row: 512 + 16 + 128 = 656.
pub const ROW_BYTES: usize = ROPE_OFFSET + 2 * ROPE;
/// The values a row holds once decoded (the 16-bit row width D = 576).
pub const DECODED: usize = LATENT + ROPE;
/// The largest finite e4m3fn value: a group's amax maps to it.
pub const E4M3_MAX: f32 = 448.0;

/// Encodes one token's `latent` and `rope` values as a row.
pub fn encode_row(latent: &[f32; LATENT], rope: &[f32; ROPE], row: &mut [u8; ROW_BYTES]) {
    for g in 0..GROUPS {
        let vals = &latent[g * GROUP..(g + 1) * GROUP];
        let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
        // A NaN in the group makes amax ignore it (f32::max); the division below then
        // carries it into its code, which decodes to NaN.
        let scale = amax / E4M3_MAX;
        for (i, &v) in vals.iter().enumerate() {
            // scale 0: every value is 0 (or too small for f32 to scale): zero codes.
            row[g * GROUP + i] = if scale == 0.0 { 0 } else { f32_to_f8e4m3(v / scale) };
        }
        row[SCALE_OFFSET + 4 * g..SCALE_OFFSET + 4 * g + 4].copy_from_slice(&scale.to_le_bytes());
    }
    for (i, &v) in rope.iter().enumerate() {
        let at = ROPE_OFFSET + 2 * i;
        row[at..at + 2].copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
    }
}

/// The scale of group `g` (< [`GROUPS`]) of a row.
pub fn scale(row: &[u8; ROW_BYTES], g: usize) -> f32 {
    let at = SCALE_OFFSET + 4 * (g % GROUPS);
    f32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]])
}

/// Decodes a row into its [`DECODED`] values: `[latent (dequantized) | rope]`.
pub fn decode_row(row: &[u8; ROW_BYTES], out: &mut [f32; DECODED]) {
    for g in 0..GROUPS {
        let s = scale(row, g);
        for i in g * GROUP..(g + 1) * GROUP {
            out[i] = f8e4m3_to_f32(row[i]) * s;
        }
    }
    for i in 0..ROPE {
        let at = ROPE_OFFSET + 2 * i;
        out[LATENT + i] = half::bf16::from_le_bytes([row[at], row[at + 1]]).to_f32();
    }
}

/// For a backend that has no fp8_ds_mla kernel for `op`: an error naming the op and the
/// backend when `cache` is an fp8_ds_mla cache, so a float kernel never reads its bytes as
/// floats (the declared gap of that backend).
pub fn unsupported_on(op: OpId, backend: &'static str, cache: &Tensor<'_>) -> Result<()> {
    if cache.dtype() == DType::Fp8DsMla {
        return Err(Error::op_failed(
            op,
            backend,
            format!("no {backend} kernel reads an fp8_ds_mla cache yet"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// e4m3fn decoded independently in f64 from the bit fields.
    fn e4m3_f64(b: u8) -> f64 {
        let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let (e, m) = (((b >> 3) & 0xf) as i32, (b & 7) as f64);
        if b & 0x7f == 0x7f {
            f64::NAN
        } else if e == 0 {
            s * m * 2f64.powi(-9)
        } else {
            s * (8.0 + m) * 2f64.powi(e - 10)
        }
    }

    #[test]
    fn every_e4m3_code_decodes_exactly_and_round_trips() {
        for b in 0..=255u8 {
            let (v, want) = (f8e4m3_to_f32(b), e4m3_f64(b));
            if want.is_nan() {
                assert!(v.is_nan(), "0x{b:02x}");
                assert_eq!(f32_to_f8e4m3(v), 0x7f, "NaN encodes as 0x7f");
                continue;
            }
            assert_eq!(v as f64, want, "0x{b:02x} decodes");
            assert_eq!(v.is_sign_negative(), b & 0x80 != 0, "0x{b:02x} sign (-0 included)");
            assert_eq!(f32_to_f8e4m3(v), b, "0x{b:02x} round trip");
        }
    }

    #[test]
    fn e4m3_encoding_rounds_to_nearest_even_and_saturates() {
        // Between consecutive non-negative codes (the last pair ends at 448): the exact
        // midpoint goes to the even code, a hair either side to the nearer one.
        for b in 0..0x7eu8 {
            let (lo, hi) = (e4m3_f64(b), e4m3_f64(b + 1));
            let mid = (lo + hi) / 2.0;
            let even = if b % 2 == 0 { b } else { b + 1 };
            for sign in [0u8, 0x80] {
                let sg = if sign == 0 { 1.0 } else { -1.0 };
                assert_eq!(f32_to_f8e4m3((sg * mid) as f32), sign | even, "midpoint of 0x{b:02x}");
                let eps = (hi - lo) / 64.0;
                assert_eq!(f32_to_f8e4m3((sg * (mid - eps)) as f32), sign | b);
                assert_eq!(f32_to_f8e4m3((sg * (mid + eps)) as f32), sign | (b + 1));
            }
        }
        assert_eq!(f32_to_f8e4m3(1e6), 0x7e, "saturates to 448");
        assert_eq!(f32_to_f8e4m3(f32::NEG_INFINITY), 0xfe, "saturates to -448");
        assert_eq!(f32_to_f8e4m3(2f32.powi(-11)), 0, "below half the smallest subnormal");
    }

    #[test]
    fn row_layout_and_round_trip() {
        assert_eq!(ROW_BYTES, 656);
        let mut latent = [0f32; LATENT];
        let mut rope = [0f32; ROPE];
        for (i, v) in latent.iter_mut().enumerate() {
            // Group 1 all zero; the others span a few binades, signs mixed.
            *v = if i / GROUP == 1 {
                0.0
            } else {
                ((i * 37 % 101) as f32 - 50.0) * 0.013 * (1 + i / GROUP) as f32
            };
        }
        for (i, v) in rope.iter_mut().enumerate() {
            *v = i as f32 * 0.25 - 3.0;
        }
        let mut row = [0u8; ROW_BYTES];
        encode_row(&latent, &rope, &mut row);
        let mut out = [0f32; DECODED];
        decode_row(&row, &mut out);
        for g in 0..GROUPS {
            let vals = &latent[g * GROUP..(g + 1) * GROUP];
            let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(scale(&row, g), amax / 448.0, "group {g} scale");
            for (i, &v) in vals.iter().enumerate() {
                let got = out[g * GROUP + i];
                // e4m3 keeps 3 mantissa bits: half an ulp is 1/16 relative, and values
                // scaled below the normal range lose more (absolute 2^-10 * scale).
                let tol = (v.abs() / 16.0).max(scale(&row, g) * 2f32.powi(-10)) * 1.0001;
                assert!((got - v).abs() <= tol, "group {g} value {i}: {got} vs {v}");
            }
        }
        assert!(out[GROUP..2 * GROUP].iter().all(|&v| v == 0.0), "a zero group decodes to 0");
        assert_eq!(&out[LATENT..], &rope[..], "rope values are bf16-exact here");
        assert_eq!(&row[GROUP..2 * GROUP], &[0u8; GROUP][..], "zero group: zero codes");
        // Byte positions: the rope value 1 (index 16) at byte 528 + 32.
        assert_eq!(&row[ROPE_OFFSET + 32..ROPE_OFFSET + 34], &half::bf16::from_f32(1.0).to_le_bytes());
        // The group's amax encodes as 448 (0x7e) or -448 (0xfe).
        assert!(row[..GROUP].iter().any(|&c| c & 0x7f == 0x7e));
    }
}
