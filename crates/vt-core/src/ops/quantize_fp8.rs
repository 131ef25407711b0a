use crate::fp8_block::blocks;
use crate::registry::dispatch;
use crate::validate::Check;
use crate::{DType, OpId, Queue, Result, Tensor};

/// Arguments of [`quantize_fp8`].
#[derive(Clone, Copy, Debug)]
pub struct QuantizeFp8Args<'a> {
    pub out: Tensor<'a>,
    pub scale: Tensor<'a>,
    pub x: Tensor<'a>,
}

/// Per-token fp8 quantization in 1 x 128 groups (DeepSeek's `act_quant`): for every row m
/// and group g (columns `128 g .. min(128 g + 128, K)`), `scale[m, g] = amax / 448` (amax the
/// group's largest |x|) and `out[m, k] = e4m3(x[m, k] / scale[m, g])`, rounded to nearest
/// even with saturation to +-448; a group of zeros gets scale 0 and zero codes. Bit for bit
/// [`crate::fp8_block::quantize_row`] on every backend (IEEE f32 division).
///
/// The activations of [`crate::matmul_bt_fp8`] / [`crate::batched_matmul_fp8`] when both
/// operands run in fp8 (`a_scale` given), e.g. prefill GEMMs on the fp8 tensor cores.
///
/// - `x` `[M,K]` bf16, f16 or f32; `out` `[M,K]` [`DType::F8E4M3`]; both with stride 1 on
///   the last dim (rows may be strided).
/// - `scale` `[M, ceil(K/128)]` f32, any strides.
/// - `out` and `scale` must not overlap each other or `x`.
pub fn quantize_fp8(q: &Queue, args: &QuantizeFp8Args<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, QuantizeFp8, args)
}

fn validate(q: &Queue, a: &QuantizeFp8Args<'_>) -> Result<()> {
    let c = Check::new(OpId::QuantizeFp8, q.device());
    c.float("x", &a.x, 2)?;
    c.typed("out", &a.out, 2, DType::F8E4M3)?;
    c.typed("scale", &a.scale, 2, DType::F32)?;
    let (m, k) = (a.x.dim(0), a.x.dim(1));
    c.dim("out", &a.out, 0, m, "x's M")?;
    c.dim("out", &a.out, 1, k, "x's K")?;
    c.dim("scale", &a.scale, 0, m, "x's M")?;
    c.dim("scale", &a.scale, 1, blocks(k), "ceil(K / 128)")?;
    c.unit_inner("x", &a.x)?;
    c.unit_inner("out", &a.out)?;
    c.output("out", &a.out)?;
    c.output("scale", &a.scale)?;
    c.disjoint("out", &a.out, "x", &a.x)?;
    c.disjoint("scale", &a.scale, "x", &a.x)?;
    c.disjoint("scale", &a.scale, "out", &a.out)
}
