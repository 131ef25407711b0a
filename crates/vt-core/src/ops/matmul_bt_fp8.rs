use crate::fp8_block::blocks;
use crate::registry::dispatch;
use crate::validate::{Check, Fp8MatmulOperands};
use crate::{OpId, Queue, Result, Tensor};

/// Arguments of [`matmul_bt_fp8`].
#[derive(Clone, Copy, Debug)]
pub struct MatmulBTFp8Args<'a> {
    pub out: Tensor<'a>,
    pub a: Tensor<'a>,
    /// `None`: `a` is 16/32-bit (weight-only fp8). `Some`: `a` is fp8 e4m3 with these
    /// per-token 1 x 128 scales (both operands fp8).
    pub a_scale: Option<Tensor<'a>>,
    pub b: Tensor<'a>,
    pub b_scale: Tensor<'a>,
}

/// `out[M,N] = A[M,K] . W[N,K]^T` with an fp8 weight in DeepSeek's 128 x 128 block scaling
/// (a linear layer with torch's `[out, in]` weight kept in fp8; see [`crate::fp8_block`]):
///
/// `W[n, k] = e4m3(b[n, k]) * b_scale[n / 128, k / 128]`, and either
/// - `a_scale` `None`: `A = a`, the activations as they are (bf16, f16 or f32: the
///   weight-only form, for decode, where the weight bytes dominate and the activations
///   need no quantization pass), or
/// - `a_scale` given: `A[m, k] = e4m3(a[m, k]) * a_scale[m, k / 128]`, activations quantized
///   per token in 1 x 128 groups by [`crate::quantize_fp8`] (both operands fp8, for the fp8
///   tensor cores at large M).
///
/// Accumulation in f32; `out` rounded once. Backends may sum each 128-wide K group before
/// scaling it (as the tensor-core kernels do); the CPU reference dequantizes every element
/// in f32 and sums in its fixed order (eight interleaved partial sums), so the two differ
/// only by f32 summation order.
///
/// - `out` `[M,N]`: bf16, f16 or f32, the op's dtype. `a` `[M,K]`: the op's dtype, or
///   [`DType::F8E4M3`] when `a_scale` is given. `b` `[N,K]`: [`DType::F8E4M3`]. Each with
///   stride 1 on the last dim; rows may be strided (a row slice of a weight, e.g. a tensor-
///   parallel rank's rows, is a valid `b` when it starts at a multiple of 128 rows with
///   `b_scale` the matching scale rows).
/// - `b_scale` `[ceil(N/128), ceil(K/128)]` f32; `a_scale` `[M, ceil(K/128)]` f32; any strides.
/// - K may be 0 (out = 0). `out` must not overlap any input.
///
/// [`DType::F8E4M3`]: crate::DType::F8E4M3
pub fn matmul_bt_fp8(q: &Queue, args: &MatmulBTFp8Args<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, MatmulBTFp8, args)
}

fn validate(q: &Queue, x: &MatmulBTFp8Args<'_>) -> Result<()> {
    let c = Check::new(OpId::MatmulBTFp8, q.device());
    let ops =
        Fp8MatmulOperands { out: &x.out, a: &x.a, a_scale: x.a_scale.as_ref(), b: &x.b, b_scale: &x.b_scale };
    c.fp8_matmul_dtypes(2, &ops)?;
    let (m, k, n) = (x.a.dim(0), x.a.dim(1), x.b.dim(0));
    if let Some(s) = &x.a_scale {
        c.dim("a_scale", s, 0, m, "a's M")?;
        c.dim("a_scale", s, 1, blocks(k), "ceil(K / 128)")?;
    }
    c.dim("b", &x.b, 1, k, "a's K")?;
    c.dim("b_scale", &x.b_scale, 0, blocks(n), "ceil(N / 128)")?;
    c.dim("b_scale", &x.b_scale, 1, blocks(k), "ceil(K / 128)")?;
    c.dim("out", &x.out, 0, m, "a's M")?;
    c.dim("out", &x.out, 1, n, "b's N")?;
    for (name, t) in [("out", &x.out), ("a", &x.a), ("b", &x.b)] {
        c.unit_inner(name, t)?;
    }
    c.fp8_matmul_output(&ops)
}
