//! DeepSeek's YaRN rotary embedding: the cos/sin cache the rope ops read and the softmax
//! scale correction.
//!
//! Two different mscales are involved and must not be confused:
//! - the *rotation* mscale `yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor,
//!   mscale_all_dim) * attn_factor` multiplies every cos/sin entry of the cache;
//! - the *softmax* correction `yarn_get_mscale(factor, mscale_all_dim)^2` multiplies the
//!   attention scale ([`mla_attention_scale`]).

use vt_core::{Buffer, Error, Queue, Result};

use crate::dims::MlaBlockDims;

/// YaRN scaling of the rotary frequencies (DeepSeek's `rope_scaling` with type `yarn`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnScaling {
    /// `factor`: context extension factor. `<= 1` disables YaRN (plain rope, scale unchanged).
    pub factor: f64,
    /// `original_max_position_embeddings`: the pre-extension context length.
    pub original_max_position_embeddings: i64,
    /// `beta_fast` (default 32): rotations at which the ramp starts (high frequencies).
    pub beta_fast: f64,
    /// `beta_slow` (default 1): rotations at which the ramp ends (low frequencies).
    pub beta_slow: f64,
    /// `mscale` (default 1).
    pub mscale: f64,
    /// `mscale_all_dim` (default 0).
    pub mscale_all_dim: f64,
    /// Extra multiplier of the rotation mscale (vLLM's `attn_factor`, default 1).
    pub attn_factor: f64,
    /// vLLM's `extrapolation_factor` (default 1): weight of the extrapolated frequencies.
    pub extrapolation_factor: f64,
    /// Round the correction range to whole dims (`truncate`, default true).
    pub truncate: bool,
}

impl YarnScaling {
    /// The given factor and original context length with every other field at its default.
    pub fn with_defaults(factor: f64, original_max_position_embeddings: i64) -> YarnScaling {
        YarnScaling {
            factor,
            original_max_position_embeddings,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.0,
            mscale_all_dim: 0.0,
            attn_factor: 1.0,
            extrapolation_factor: 1.0,
            truncate: true,
        }
    }

    /// Whether YaRN actually changes anything (`factor > 1`).
    pub fn active(&self) -> bool {
        self.factor > 1.0
    }
}

/// The rotary embedding of an MLA block: base frequency, optional YaRN and the pairing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnRopeParams {
    /// `rope_theta`.
    pub base: f64,
    /// `None`: plain rope.
    pub yarn: Option<YarnScaling>,
    /// Neox half-split pairs `(i, i + R/2)`; false: GPT-J adjacent pairs `(2i, 2i+1)`, the
    /// DeepSeek default (`rope_interleave` absent or true).
    pub is_neox: bool,
}

impl YarnRopeParams {
    /// Plain rope with GPT-J pairing.
    pub fn plain(base: f64) -> YarnRopeParams {
        YarnRopeParams { base, yarn: None, is_neox: false }
    }

    fn active_yarn(&self) -> Option<&YarnScaling> {
        self.yarn.as_ref().filter(|y| y.active())
    }

    /// The rotation mscale multiplying cos and sin (1 without YaRN).
    pub fn rotation_mscale(&self) -> f64 {
        match self.active_yarn() {
            Some(y) => {
                yarn_get_mscale(y.factor, y.mscale) / yarn_get_mscale(y.factor, y.mscale_all_dim)
                    * y.attn_factor
            }
            None => 1.0,
        }
    }

    /// `inv_freq[i]` for the `rotary_dim / 2` pairs, in f64.
    pub fn inv_freq(&self, rotary_dim: i64) -> Result<Vec<f64>> {
        check_rotary_dim("YarnRopeParams::inv_freq", rotary_dim)?;
        if !(self.base.is_finite() && self.base > 1.0) {
            return Err(Error::invalid(
                "YarnRopeParams",
                "base",
                format!("rope_theta must be finite and > 1, got {}", self.base),
            ));
        }
        let rot = rotary_dim as f64;
        let half = rotary_dim / 2;
        let yarn = self.active_yarn();
        let (low, high) = match yarn {
            Some(y) => yarn_correction_range(y, rotary_dim, self.base),
            None => (0.0, 0.0),
        };
        let mut out = Vec::new();
        out.try_reserve_exact(half as usize).map_err(|e| {
            Error::invalid(
                "YarnRopeParams",
                "rotary_dim",
                format!("{half} frequencies cannot be allocated: {e}"),
            )
        })?;
        out.extend((0..half).map(|i| {
            let pos_freq = self.base.powf(2.0 * i as f64 / rot);
            let extrapolation = 1.0 / pos_freq;
            let Some(y) = yarn else { return extrapolation };
            let interpolation = 1.0 / (y.factor * pos_freq);
            // The ramp runs over rotary_dim / 2 entries although the correction range
            // was computed against rotary_dim: upstream's asymmetry, kept on purpose.
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let mask = (1.0 - ramp) * y.extrapolation_factor;
            interpolation * (1.0 - mask) + extrapolation * mask
        }));
        Ok(out)
    }

    /// Whether every value derived from these parameters is finite: the rotation mscale
    /// (and its f32 rounding), the YaRN correction range, the frequencies times the largest
    /// position `rows - 1`, and the softmax scale of a `qk_head_dim` head. On failure, the
    /// config field at fault (as named under `rope_scaling`, or `rope_theta`) and why.
    pub fn check_finite(
        &self,
        rotary_dim: i64,
        qk_head_dim: i64,
        rows: i64,
    ) -> std::result::Result<(), (&'static str, String)> {
        let finite = |field: &'static str, what: &str, v: f64| {
            if v.is_finite() {
                Ok(())
            } else {
                Err((field, format!("makes {what} non-finite ({v}); every derived value must be finite")))
            }
        };
        if !(self.base.is_finite() && self.base > 1.0) {
            return Err(("rope_theta", format!("must be finite and > 1, got {}", self.base)));
        }
        if let Some(y) = self.active_yarn() {
            finite("factor", "the YaRN factor", y.factor)?;
            for (field, v) in [
                ("beta_fast", y.beta_fast),
                ("beta_slow", y.beta_slow),
                ("extrapolation_factor", y.extrapolation_factor),
                ("mscale", y.mscale),
                ("mscale_all_dim", y.mscale_all_dim),
                ("attn_factor", y.attn_factor),
            ] {
                finite(field, "itself", v)?;
            }
            for (field, beta) in [("beta_fast", y.beta_fast), ("beta_slow", y.beta_slow)] {
                let d =
                    yarn_find_correction_dim(beta, rotary_dim, self.base, y.original_max_position_embeddings);
                finite(field, "the YaRN correction dim", d)?;
            }
            let m = yarn_get_mscale(y.factor, y.mscale);
            finite("mscale", "the rotation mscale (as f32)", m as f32 as f64)?;
            let m_all = yarn_get_mscale(y.factor, y.mscale_all_dim);
            if m_all == 0.0 {
                return Err(("mscale_all_dim", "makes the rotation mscale divide by zero".into()));
            }
            finite("attn_factor", "the rotation mscale (as f32)", self.rotation_mscale() as f32 as f64)?;
            let scale = (qk_head_dim.max(1) as f64).powf(-0.5) * m_all * m_all;
            if !(scale as f32).is_finite() || scale as f32 == 0.0 {
                return Err((
                    "mscale_all_dim",
                    format!("makes the attention scale qk_head_dim^-0.5 * mscale^2 = {scale} non-finite or 0 in f32"),
                ));
            }
        }
        // The frequencies one by one, for any rope dim a cache could be built for (a larger
        // one fails on the cache's size, before its entries are computed).
        if rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= MAX_CHECKED_ROTARY_DIM {
            let inv = self.inv_freq(rotary_dim).map_err(|e| ("rope_theta", e.to_string()))?;
            let last = (rows.max(1) - 1) as f64;
            if let Some(f) = inv.iter().find(|&&f| !(f.is_finite() && (f * last).is_finite())) {
                let field = match self.active_yarn() {
                    Some(y) if y.extrapolation_factor != 1.0 => "extrapolation_factor",
                    Some(_) => "factor",
                    None => "rope_theta",
                };
                return Err((
                    field,
                    format!("makes a rotary frequency ({f}) times the last position {last} non-finite"),
                ));
            }
        }
        Ok(())
    }

    /// The cos/sin cache [rows, R] in f32: row t is `[cos(t*inv_freq) | sin(t*inv_freq)] *
    /// rotation_mscale`, computed in f64 and rounded once (the layout the rope ops read).
    ///
    /// Errors, before allocating, when the cache would be larger than
    /// [`MAX_COS_SIN_CACHE_BYTES`] (naming `rows`, i.e. `max_position_embeddings`, and the
    /// bytes needed), when a value would not be finite ([`YarnRopeParams::check_finite`],
    /// naming the parameter) and when the cache cannot be allocated.
    pub fn cos_sin_cache(&self, rotary_dim: i64, rows: i64) -> Result<Vec<f32>> {
        const CTX: &str = "YarnRopeParams::cos_sin_cache";
        if rows <= 0 {
            return Err(Error::invalid(CTX, "rows", format!("must be > 0, got {rows}")));
        }
        check_rotary_dim(CTX, rotary_dim)?;
        // Bounded before anything is computed or allocated (the cache is built whole).
        cos_sin_cache_bytes(rotary_dim, rows)
            .map_err(|msg| Error::invalid(CTX, "rows", format!("(max_position_embeddings) {msg}")))?;
        // The attention scale is checked with the dims; any head width works here.
        self.check_finite(rotary_dim, 1, rows).map_err(|(field, msg)| Error::invalid(CTX, field, msg))?;
        let inv = self.inv_freq(rotary_dim)?;
        let ms = self.rotation_mscale();
        let (rot, half) = (rotary_dim as usize, rotary_dim as usize / 2);
        let too_big = |bytes: String, why: String| {
            Error::invalid(
                CTX,
                "rows",
                format!(
                    "the cos/sin cache of {rows} rows (max_position_embeddings) x {rotary_dim} f32 needs \
                     {bytes} bytes: {why}"
                ),
            )
        };
        let n = rows
            .checked_mul(rotary_dim)
            .filter(|n| n.checked_mul(4).is_some_and(|b| isize::try_from(b).is_ok()))
            .ok_or_else(|| {
                too_big(
                    format!("{}", rows as i128 * rotary_dim as i128 * 4),
                    "more than any allocation".into(),
                )
            })? as usize;
        let mut cache: Vec<f32> = Vec::new();
        cache
            .try_reserve_exact(n)
            .map_err(|e| too_big(format!("{}", n * 4), format!("cannot allocate ({e})")))?;
        cache.resize(n, 0.0);
        for (t, row) in cache.chunks_exact_mut(rot).enumerate() {
            for (i, f) in inv.iter().enumerate() {
                let angle = t as f64 * f;
                row[i] = (angle.cos() * ms) as f32;
                row[half + i] = (angle.sin() * ms) as f32;
            }
        }
        if let Some(i) = cache.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(
                CTX,
                "rope_scaling",
                format!("cos/sin cache entry [{}, {}] is {}", i / rot, i % rot, cache[i]),
            ));
        }
        Ok(cache)
    }

    /// [`YarnRopeParams::cos_sin_cache`] uploaded to the queue's device as an f32 buffer of
    /// its own; the weight stores share one per device and parameters instead
    /// ([`crate::RopeCosSinCache::shared`]).
    pub fn cos_sin_cache_buffer(&self, queue: &Queue, rotary_dim: i64, rows: i64) -> Result<Buffer> {
        let cache = self.cos_sin_cache(rotary_dim, rows)?;
        Buffer::from_slice(queue, &[rows, rotary_dim], &cache)
    }
}

/// The most bytes of one cos/sin cache (`max_position_embeddings` rows of `qk_rope_head_dim`
/// f32): 1 GiB, 4194304 positions at DeepSeek's rope dim 64 (25.6x DeepSeek-V3's 163840,
/// whose cache is 40 MiB). The cache is built whole when the first layer of its rope
/// parameters is loaded on a device (the layers after it share that one,
/// [`crate::RopeCosSinCache`]), and is not grown later: the block's views and every captured
/// decode graph hold its device address (docs/mla.md, "Size bounds and the cos/sin cache").
/// A larger one is refused naming `max_position_embeddings` and the bytes it would take.
pub const MAX_COS_SIN_CACHE_BYTES: i64 = 1 << 30;

/// The bytes of a cos/sin cache of `rows` x `rotary_dim` f32, when within
/// [`MAX_COS_SIN_CACHE_BYTES`]; otherwise the error text (the rows as
/// `max_position_embeddings`, and the bytes). Exact for any i64 inputs.
pub fn cos_sin_cache_bytes(rotary_dim: i64, rows: i64) -> std::result::Result<i64, String> {
    let bytes = rows as i128 * rotary_dim as i128 * 4;
    if bytes > MAX_COS_SIN_CACHE_BYTES as i128 {
        return Err(format!(
            "{rows} positions x qk_rope_head_dim {rotary_dim} f32 make a cos/sin cache of {bytes} bytes, \
             past the bound of {MAX_COS_SIN_CACHE_BYTES} bytes (1 GiB: {} positions at rope \
             dim {rotary_dim}; DeepSeek-V3 has 163840)",
            MAX_COS_SIN_CACHE_BYTES / (rotary_dim.max(1) * 4)
        ));
    }
    Ok(bytes as i64)
}

/// The largest rope dim whose frequencies [`YarnRopeParams::check_finite`] computes.
const MAX_CHECKED_ROTARY_DIM: i64 = 1 << 20;

fn check_rotary_dim(op: &'static str, rotary_dim: i64) -> Result<()> {
    if rotary_dim <= 0 || rotary_dim % 2 != 0 {
        return Err(Error::invalid(op, "rotary_dim", format!("must be even and > 0, got {rotary_dim}")));
    }
    Ok(())
}

/// `0.1 * mscale * ln(scale) + 1` for `scale > 1`, else 1.
pub fn yarn_get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// The (fractional) dim whose wavelength completes `num_rotations` turns over the original
/// context.
pub fn yarn_find_correction_dim(
    num_rotations: f64,
    dim: i64,
    base: f64,
    max_position_embeddings: i64,
) -> f64 {
    (dim as f64 * (max_position_embeddings as f64 / (num_rotations * 2.0 * std::f64::consts::PI)).ln())
        / (2.0 * base.ln())
}

/// The ramp's `[low, high]` range: floor/ceil of the correction dims for `beta_fast` and
/// `beta_slow` (unless `truncate` is off), clamped to `[0, dim - 1]`, widened by 0.001 when
/// empty so the ramp never divides by zero.
pub fn yarn_correction_range(y: &YarnScaling, dim: i64, base: f64) -> (f64, f64) {
    let lo = yarn_find_correction_dim(y.beta_fast, dim, base, y.original_max_position_embeddings);
    let hi = yarn_find_correction_dim(y.beta_slow, dim, base, y.original_max_position_embeddings);
    let (lo, hi) = if y.truncate { (lo.floor(), hi.ceil()) } else { (lo, hi) };
    let low = lo.max(0.0);
    let mut high = hi.min((dim - 1) as f64);
    if low == high {
        high += 0.001;
    }
    (low, high)
}

/// The softmax scale: `qk_head_dim^-0.5`, times `yarn_get_mscale(factor, mscale_all_dim)^2`
/// when YaRN is active.
pub fn mla_attention_scale(dims: &MlaBlockDims, rope: &YarnRopeParams) -> f32 {
    let base = (dims.qk_head_dim() as f64).powf(-0.5);
    match rope.active_yarn() {
        Some(y) => {
            let m = yarn_get_mscale(y.factor, y.mscale_all_dim);
            (base * m * m) as f32
        }
        None => base as f32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mscale_is_one_without_extension_and_log_shaped_with_it() {
        assert_eq!(yarn_get_mscale(1.0, 0.707), 1.0);
        assert_eq!(yarn_get_mscale(0.5, 1.0), 1.0);
        let m = yarn_get_mscale(40.0, 1.0);
        assert!((m - (0.1 * 40f64.ln() + 1.0)).abs() < 1e-15);
    }

    #[test]
    fn plain_rope_cache_rows_are_cos_then_sin_of_position_times_inv_freq() {
        let p = YarnRopeParams::plain(10000.0);
        let c = p.cos_sin_cache(4, 3).unwrap();
        let inv = [1.0, 1.0 / 100.0];
        for t in 0..3 {
            for i in 0..2 {
                let a = t as f64 * inv[i];
                assert!((c[t * 4 + i] as f64 - a.cos()).abs() < 1e-7);
                assert!((c[t * 4 + 2 + i] as f64 - a.sin()).abs() < 1e-7);
            }
        }
    }

    #[test]
    fn yarn_interpolates_low_frequencies_and_keeps_high_ones() {
        let mut y = YarnScaling::with_defaults(40.0, 4096);
        y.mscale = 1.0;
        y.mscale_all_dim = 1.0;
        let p = YarnRopeParams { base: 10000.0, yarn: Some(y), is_neox: false };
        let plain = YarnRopeParams::plain(10000.0).inv_freq(64).unwrap();
        let inv = p.inv_freq(64).unwrap();
        assert_eq!(inv[0], plain[0], "the fastest pair is extrapolated unchanged");
        assert!((inv[31] - plain[31] / 40.0).abs() < 1e-18, "the slowest pair is interpolated by 1/factor");
        assert_eq!(p.rotation_mscale(), 1.0, "mscale == mscale_all_dim cancels in the rotation");
    }
}
