//! LayerNorm: one block of `LN_THREADS` per row (`kernels-cuda/layer_norm.cu`).

use vt_core::{LayerNormArgs, OpId, Queue, Result};

use crate::rope_from_cache::int;
use crate::{grid_1d, kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("layer_norm");

/// The kernel's `__launch_bounds__`: DeepSeek-V3.2's k_norm rows are 128 wide, one
/// element a thread.
const LN_THREADS: u32 = 128;

const OP: OpId = OpId::LayerNorm;

pub(crate) fn run(q: &Queue, a: &LayerNormArgs<'_>) -> Result<()> {
    CudaQueue::of(q, OP)?.run(OP, &plan(a)?)
}

/// Rows of `d` unit-stride elements, `t` rows: the kernel stays inside the validated views.
pub(crate) fn plan(a: &LayerNormArgs<'_>) -> Result<Vec<Launch>> {
    let (t, d) = (a.x.dim(0), a.x.dim(1));
    if t == 0 || d == 0 {
        return Ok(vec![]);
    }
    let d = int(OP, "x", d)?;
    let args: [Arg; 9] = [
        a.out.data_addr().into(),
        a.out.stride(0).into(),
        a.x.data_addr().into(),
        a.x.stride(0).into(),
        a.weight.data_addr().into(),
        a.bias.data_addr().into(),
        t.into(),
        d.into(),
        a.eps.into(),
    ];
    Ok(vec![Launch::new(&SRC, "layer_norm", a.x.dtype(), (grid_1d(t), 1, 1), LN_THREADS, args)])
}
