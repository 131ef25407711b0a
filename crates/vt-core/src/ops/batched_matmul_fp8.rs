use crate::fp8_block::blocks;
use crate::registry::dispatch;
use crate::validate::{Check, Fp8MatmulOperands};
use crate::{OpId, Queue, Result, Tensor};

/// Arguments of [`batched_matmul_fp8`].
#[derive(Clone, Copy, Debug)]
pub struct BatchedMatmulFp8Args<'a> {
    pub out: Tensor<'a>,
    pub a: Tensor<'a>,
    /// `None`: `a` is 16/32-bit (weight-only fp8). `Some`: `a` is fp8 e4m3 with these
    /// per-token 1 x 128 scales.
    pub a_scale: Option<Tensor<'a>>,
    pub b: Tensor<'a>,
    pub b_scale: Tensor<'a>,
}

/// `out[g] = A[g] . W[g]` for `A` `[G,M,K]`, `W` `[G,K,N]` with an fp8 weight in 128 x 128
/// block scaling per group: the absorbed per-head MLA weights (`W_UK_T`, `W_UV`) kept in
/// fp8 (see [`crate::fp8_block`] and [`crate::matmul_bt_fp8`], whose rules this follows):
///
/// `W[g, k, n] = e4m3(b[g, k, n]) * b_scale[g, k / 128, n / 128]`; `A = a` when `a_scale` is
/// `None` (weight-only), else `A[g, m, k] = e4m3(a[g, m, k]) * a_scale[g, m, k / 128]`.
///
/// - `out` `[G,M,N]` bf16, f16 or f32 (the op's dtype); `a` `[G,M,K]` in the op's dtype, or
///   [`DType::F8E4M3`] with `a_scale` `[G, M, ceil(K/128)]` f32; `b` `[G,K,N]`
///   [`DType::F8E4M3`]; `b_scale` `[G, ceil(K/128), ceil(N/128)]` f32.
/// - Any strides on every dim of every operand (a head's slice of `kv_b_proj` read
///   transposed is a valid `b`; its 128-blocks are counted from the view's first element).
///   Kernels are fastest with stride 1 along K of `a` and `b`.
/// - f32 accumulation; `out` must not overlap itself or any input.
///
/// [`DType::F8E4M3`]: crate::DType::F8E4M3
pub fn batched_matmul_fp8(q: &Queue, args: &BatchedMatmulFp8Args<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, BatchedMatmulFp8, args)
}

fn validate(q: &Queue, x: &BatchedMatmulFp8Args<'_>) -> Result<()> {
    let c = Check::new(OpId::BatchedMatmulFp8, q.device());
    let ops =
        Fp8MatmulOperands { out: &x.out, a: &x.a, a_scale: x.a_scale.as_ref(), b: &x.b, b_scale: &x.b_scale };
    c.fp8_matmul_dtypes(3, &ops)?;
    let (g, m, k, n) = (x.a.dim(0), x.a.dim(1), x.a.dim(2), x.b.dim(2));
    if let Some(s) = &x.a_scale {
        c.dim("a_scale", s, 0, g, "a's G")?;
        c.dim("a_scale", s, 1, m, "a's M")?;
        c.dim("a_scale", s, 2, blocks(k), "ceil(K / 128)")?;
    }
    c.dim("b", &x.b, 0, g, "a's G")?;
    c.dim("b", &x.b, 1, k, "a's K")?;
    c.dim("b_scale", &x.b_scale, 0, g, "a's G")?;
    c.dim("b_scale", &x.b_scale, 1, blocks(k), "ceil(K / 128)")?;
    c.dim("b_scale", &x.b_scale, 2, blocks(n), "ceil(N / 128)")?;
    c.dim("out", &x.out, 0, g, "a's G")?;
    c.dim("out", &x.out, 1, m, "a's M")?;
    c.dim("out", &x.out, 2, n, "b's N")?;
    c.fp8_matmul_output(&ops)
}
