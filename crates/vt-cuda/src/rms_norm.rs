//! RmsNorm: one block of `NORM_THREADS` per row (`kernels-cuda/rms_norm.cu`).

use vt_core::{OpId, Queue, Result, RmsNormArgs};

use crate::rope_from_cache::int;
use crate::{grid_1d, kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("rms_norm");

/// Must equal `vt::NORM_THREADS` in `kernels-cuda/norm_rope.cuh`: the reduction order, and
/// so FusedNormRope's bit-identity with RmsNorm, depends on it.
pub(crate) const NORM_THREADS: u32 = 256;

const OP: OpId = OpId::RmsNorm;

pub(crate) fn run(q: &Queue, a: &RmsNormArgs<'_>) -> Result<()> {
    CudaQueue::of(q, OP)?.run(OP, &plan(a)?)
}

/// Rows of `d` unit-stride elements, `t` rows: the kernel stays inside the validated views.
pub(crate) fn plan(a: &RmsNormArgs<'_>) -> Result<Vec<Launch>> {
    let (t, d) = (a.x.dim(0), a.x.dim(1));
    if t == 0 || d == 0 {
        return Ok(vec![]);
    }
    let d = int(OP, "x", d)?;
    let args: [Arg; 8] = [
        a.out.data_addr().into(),
        a.out.stride(0).into(),
        a.x.data_addr().into(),
        a.x.stride(0).into(),
        a.weight.data_addr().into(),
        t.into(),
        d.into(),
        a.eps.into(),
    ];
    Ok(vec![Launch::new(&SRC, "rms_norm", a.x.dtype(), (grid_1d(t), 1, 1), NORM_THREADS, args)])
}
