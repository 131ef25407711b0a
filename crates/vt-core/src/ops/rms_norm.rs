use crate::registry::dispatch;
use crate::validate::Check;
use crate::{OpId, Queue, Result, Tensor};

/// Arguments of [`rms_norm`].
#[derive(Clone, Copy, Debug)]
pub struct RmsNormArgs<'a> {
    pub out: Tensor<'a>,
    pub x: Tensor<'a>,
    pub weight: Tensor<'a>,
    pub eps: f32,
}

/// `out[t,:] = x[t,:] / sqrt(mean(x[t,:]^2) + eps) * weight`, f32 accumulation.
///
/// - `x`, `out` `[T,D]` with stride 1 on D (rows may be strided); `weight` `[D]`
///   contiguous; one float dtype.
/// - `out` may be exactly `x` (same address, shape and strides: in place); any other
///   overlap is an error. `eps` must be finite and > 0.
/// - The sum of squares is accumulated in f32 in index order, the scale is
///   `1/sqrt(mean + eps)` in f32, the product is `(x * scale)` rounded to the
///   storage dtype, then times `weight` (matching Hugging Face's `DeepseekV3RMSNorm`,
///   which normalizes in f32 and multiplies by the weight after casting back).
pub fn rms_norm(q: &Queue, args: &RmsNormArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, RmsNorm, args)
}

fn validate(q: &Queue, a: &RmsNormArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::RmsNorm, q.device());
    c.float("out", &a.out, 2)?;
    c.float("x", &a.x, 2)?;
    c.float("weight", &a.weight, 1)?;
    let dt = a.x.dtype();
    c.same_dtype("out", &a.out, dt)?;
    c.same_dtype("weight", &a.weight, dt)?;
    c.dim("out", &a.out, 0, a.x.dim(0), "x's T")?;
    c.dim("out", &a.out, 1, a.x.dim(1), "x's D")?;
    c.dim("weight", &a.weight, 0, a.x.dim(1), "x's D")?;
    c.unit_inner("x", &a.x)?;
    c.unit_inner("out", &a.out)?;
    c.unit_inner("weight", &a.weight)?;
    c.output("out", &a.out)?;
    if !a.out.same_view(&a.x) {
        c.disjoint("out", &a.out, "x", &a.x)?;
    }
    c.disjoint("out", &a.out, "weight", &a.weight)?;
    c.positive_finite("eps", a.eps)
}
