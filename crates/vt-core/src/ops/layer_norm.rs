use crate::registry::dispatch;
use crate::validate::Check;
use crate::{OpId, Queue, Result, Tensor};

/// Arguments of [`layer_norm`].
#[derive(Clone, Copy, Debug)]
pub struct LayerNormArgs<'a> {
    pub out: Tensor<'a>,
    pub x: Tensor<'a>,
    pub weight: Tensor<'a>,
    pub bias: Tensor<'a>,
    pub eps: f32,
}

/// `out[t,:] = (x[t,:] - mean) / sqrt(var + eps) * weight + bias`, with `mean` and the
/// biased (population) `var` of row t, f32 accumulation: PyTorch's `nn.LayerNorm` with an
/// affine weight and bias (DeepSeek-V3.2's indexer `k_norm`, eps 1e-6).
///
/// - `x`, `out` `[T,D]` with stride 1 on D (rows may be strided); `weight`, `bias` `[D]`
///   contiguous; one float dtype for all four.
/// - `out` may be exactly `x` (same address, shape and strides: in place); any other
///   overlap is an error, as is `out` overlapping `weight` or `bias`. `eps` must be finite
///   and > 0.
/// - Two passes in f32: `mean = sum(x) / D`, `var = sum((x - mean)^2) / D` (the CPU sums
///   in index order, GPU kernels in their reduction order), `rstd = 1 / sqrt(var + eps)`,
///   then `((x - mean) * rstd) * weight + bias` in f32, rounded once to the storage dtype
///   (as PyTorch's kernel, which computes a bf16/f16 LayerNorm in f32 and rounds its result).
pub fn layer_norm(q: &Queue, args: &LayerNormArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, LayerNorm, args)
}

fn validate(q: &Queue, a: &LayerNormArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::LayerNorm, q.device());
    c.float("out", &a.out, 2)?;
    c.float("x", &a.x, 2)?;
    c.float("weight", &a.weight, 1)?;
    c.float("bias", &a.bias, 1)?;
    let dt = a.x.dtype();
    c.same_dtype("out", &a.out, dt)?;
    c.same_dtype("weight", &a.weight, dt)?;
    c.same_dtype("bias", &a.bias, dt)?;
    c.dim("out", &a.out, 0, a.x.dim(0), "x's T")?;
    c.dim("out", &a.out, 1, a.x.dim(1), "x's D")?;
    c.dim("weight", &a.weight, 0, a.x.dim(1), "x's D")?;
    c.dim("bias", &a.bias, 0, a.x.dim(1), "x's D")?;
    c.unit_inner("x", &a.x)?;
    c.unit_inner("out", &a.out)?;
    c.unit_inner("weight", &a.weight)?;
    c.unit_inner("bias", &a.bias)?;
    c.output("out", &a.out)?;
    if !a.out.same_view(&a.x) {
        c.disjoint("out", &a.out, "x", &a.x)?;
    }
    c.disjoint("out", &a.out, "weight", &a.weight)?;
    c.disjoint("out", &a.out, "bias", &a.bias)?;
    c.positive_finite("eps", a.eps)
}
