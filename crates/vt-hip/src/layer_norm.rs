//! LayerNorm: kernels-hip/layer_norm.hip, one block per row.

use vt_core::{LayerNormArgs, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};

pub(crate) fn plan(a: &LayerNormArgs<'_>) -> Result<Vec<Step>> {
    let (t, d) = (a.x.dim(0), a.x.dim(1));
    let args = KernelArgs::new()
        .tensor(&a.out)
        .i64(a.out.stride(0))
        .tensor(&a.x)
        .i64(a.x.stride(0))
        .tensor(&a.weight)
        .tensor(&a.bias)
        .i64s(&[t, d])
        .f32(a.eps);
    let rows = if d == 0 { 0 } else { t };
    Ok(kernels([Launch::new("layer_norm", "layer_norm.hip", a.x.dtype(), rows, args)?]))
}

pub(crate) fn run(q: &Queue, a: &LayerNormArgs<'_>) -> Result<()> {
    HipQueue::of(OpId::LayerNorm, q)?.run(&plan(a)?)
}
