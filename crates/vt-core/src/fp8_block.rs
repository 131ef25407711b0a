//! DeepSeek's block-scaled fp8 (`weight_block_size: [128, 128]`): what the fp8 matmuls
//! ([`crate::matmul_bt_fp8`], [`crate::batched_matmul_fp8`]) and [`crate::quantize_fp8`]
//! compute with.
//!
//! - A weight is OCP float8 e4m3fn codes ([`DType::F8E4M3`](crate::DType::F8E4M3)) plus one
//!   f32 scale per 128 x 128 block: `w[r, c] = e4m3(q[r, c]) * scale[r / 128, c / 128]`, the
//!   scale tensor `[ceil(rows / 128), ceil(cols / 128)]` (DeepSeek's `weight_scale_inv`;
//!   partial edge blocks use their block's scale).
//! - An activation row is quantized per token in 1 x 128 groups: `scale = amax / 448` over
//!   the group (448 the largest e4m3 value), `code = e4m3(x / scale)` rounded to nearest
//!   even with saturation; a group of zeros gets scale 0 and zero codes. This is DeepSeek's
//!   `act_quant` and the same rule as the fp8_ds_mla cache ([`crate::fp8_ds_mla`]).
//! - A value decodes as the f32 product `e4m3(code) * scale`.
//!
//! These host functions are the definition: the CPU reference uses them and the GPU
//! quantize kernels reproduce them bit for bit (IEEE f32 division, round to nearest even).

use crate::f8e4m3_to_f32;

/// The side of a scale block (weights 128 x 128, activations 1 x 128).
pub const BLOCK: usize = 128;
/// The largest finite e4m3fn value.
pub const E4M3_MAX: f32 = 448.0;

/// `ceil(n / 128)`: scale blocks along a dim of `n >= 0` elements.
pub const fn blocks(n: i64) -> i64 {
    if n <= 0 {
        0
    } else {
        (n - 1) / BLOCK as i64 + 1
    }
}

/// f32 to OCP e4m3fn, round to nearest even, saturating to +-448; NaN gives `0x7f` (what
/// [`crate::f32_to_f8e4m3`] calls).
pub fn encode_e4m3(v: f32) -> u8 {
    if v.is_nan() {
        return 0x7f;
    }
    let sign = ((v.to_bits() >> 24) & 0x80) as u8;
    let a = v.abs().min(E4M3_MAX);
    if a < 0.015625 {
        // Below 2^-6: subnormal codes, multiples of 2^-9 (code 8 is 2^-6, the first normal).
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let mut e = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
    // a * 2^(3 - e) lies in [8, 16) exactly (a power-of-two scaling of a normal f32).
    let mut q = (a * f32::from_bits(((127 + 3 - e) as u32) << 23)).round_ties_even();
    if q == 16.0 {
        q = 8.0;
        e += 1;
    }
    sign | ((((e + 7) << 3) as u8) | (q as u8 - 8))
}

/// Quantizes one group (at most 128 values) into `codes`; returns its scale.
pub fn quantize_group(values: &[f32], codes: &mut [u8]) -> f32 {
    // A NaN is skipped by the max (f32::max) and carried into its own code by the division.
    let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / E4M3_MAX;
    for (c, &v) in codes.iter_mut().zip(values) {
        *c = if scale == 0.0 { 0 } else { encode_e4m3(v / scale) };
    }
    scale
}

/// Quantizes a row of any length in groups of 128: `codes[i]` and `scales[i / 128]`.
pub fn quantize_row(values: &[f32], codes: &mut [u8], scales: &mut [f32]) {
    for ((vals, cs), s) in values.chunks(BLOCK).zip(codes.chunks_mut(BLOCK)).zip(scales.iter_mut()) {
        *s = quantize_group(vals, cs);
    }
}

/// The value of `code` under `scale` (the f32 product).
pub fn decode(code: u8, scale: f32) -> f32 {
    f8e4m3_to_f32(code) * scale
}

/// Quantizes a row-major `[rows, cols]` f32 weight with one scale per 128 x 128 block (amax
/// over the block / 448, as DeepSeek's checkpoints hold): `(codes, scales)` with the
/// scales row-major `[ceil(rows / 128), ceil(cols / 128)]`. For tests and benches that need
/// fp8 weights; checkpoints come quantized.
pub fn quantize_weight(values: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let (br, bc) = (blocks(rows as i64) as usize, blocks(cols as i64) as usize);
    let mut scales = vec![0f32; br * bc];
    let mut codes = vec![0u8; rows * cols];
    for bi in 0..br {
        for bj in 0..bc {
            let (r0, r1) = (bi * BLOCK, ((bi + 1) * BLOCK).min(rows));
            let (c0, c1) = (bj * BLOCK, ((bj + 1) * BLOCK).min(cols));
            let mut amax = 0f32;
            for r in r0..r1 {
                amax = values[r * cols + c0..r * cols + c1].iter().fold(amax, |m, v| m.max(v.abs()));
            }
            let scale = amax / E4M3_MAX;
            scales[bi * bc + bj] = scale;
            for r in r0..r1 {
                for c in c0..c1 {
                    let v = values[r * cols + c];
                    codes[r * cols + c] = if scale == 0.0 { 0 } else { encode_e4m3(v / scale) };
                }
            }
        }
    }
    (codes, scales)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The obviously right encoder: the nearest of the 127 non-negative finite codes to
    /// min(|v|, 448), ties to the even code.
    fn search_encoder(v: f32) -> u8 {
        if v.is_nan() {
            return 0x7f;
        }
        let sign = if v.is_sign_negative() { 0x80u8 } else { 0 };
        let a = v.abs().min(448.0);
        let mut best = 0u8;
        let mut best_err = f32::INFINITY;
        for code in 0u8..0x7f {
            let err = (f8e4m3_to_f32(code) - a).abs();
            if err < best_err || (err == best_err && code & 1 == 0) {
                best = code;
                best_err = err;
            }
        }
        sign | best
    }

    #[test]
    fn the_fast_encoder_is_the_reference_encoder() {
        // Every 4099th f32 bit pattern (both signs, subnormals, huge values, NaNs), plus
        // every code's value and the midpoints between neighbouring codes.
        let mut vals: Vec<f32> = (0..=u32::MAX / 4099).map(|i| f32::from_bits(i * 4099)).collect();
        for c in 0u8..=0x7e {
            let v = f8e4m3_to_f32(c);
            let next = if c < 0x7e { f8e4m3_to_f32(c + 1) } else { 464.0 };
            for x in [v, (v + next) / 2.0, v + (next - v) * 0.499, v + (next - v) * 0.501] {
                vals.extend([x, -x]);
            }
        }
        for v in vals {
            assert_eq!(encode_e4m3(v), search_encoder(v), "{v:e} (0x{:08x})", v.to_bits());
        }
    }

    #[test]
    fn groups_scale_by_amax_over_448_and_zero_groups_stay_zero() {
        let vals: Vec<f32> = (0..200).map(|i| (i as f32 - 50.0) / 7.0).collect();
        let mut codes = vec![0u8; 200];
        let mut scales = vec![0f32; 2];
        quantize_row(&vals, &mut codes, &mut scales);
        assert_eq!(scales[0], (50.0f32 / 7.0).max(77.0 / 7.0) / 448.0);
        assert_eq!(scales[1], (149.0f32 / 7.0) / 448.0);
        // The group's largest value maps to 448 exactly.
        assert_eq!(decode(codes[199], scales[1]), 448.0 * scales[1]);
        for (i, (&v, &c)) in vals.iter().zip(&codes).enumerate() {
            let d = decode(c, scales[i / 128]);
            assert!((d - v).abs() <= v.abs() / 16.0 + scales[i / 128] * 2f32.powi(-9), "{i}: {v} vs {d}");
        }
        let mut zc = [7u8; 128];
        assert_eq!(quantize_group(&[0.0; 128], &mut zc), 0.0);
        assert!(zc.iter().all(|&c| c == 0));
    }

    #[test]
    fn weights_get_one_scale_per_block_and_partial_blocks_their_own() {
        let (rows, cols) = (130, 129);
        let vals: Vec<f32> = (0..rows * cols).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let (codes, scales) = quantize_weight(&vals, rows, cols);
        assert_eq!((codes.len(), scales.len()), (rows * cols, 4));
        assert_eq!(blocks(0), 0);
        assert_eq!(blocks(128), 1);
        assert_eq!(blocks(129), 2);
        for r in 0..rows {
            for c in 0..cols {
                let s = scales[(r / 128) * 2 + c / 128];
                let (v, d) = (vals[r * cols + c], decode(codes[r * cols + c], s));
                assert!((d - v).abs() <= v.abs() / 16.0 + s, "[{r}, {c}]: {v} vs {d}");
            }
        }
    }
}
