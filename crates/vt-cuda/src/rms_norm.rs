//! RmsNorm: one block of `NORM_THREADS` per row (`kernels-cuda/rms_norm.cu`).

use vt_core::{Error, Queue, Result, RmsNormArgs};

use crate::{cfg, grid_1d, kernel_source, Arg, CudaQueue, KernelSource};

static SRC: KernelSource = kernel_source!("rms_norm");

/// Must equal `vt::NORM_THREADS` in `kernels-cuda/norm_rope.cuh`: the reduction order, and
/// so FusedNormRope's bit-identity with RmsNorm, depends on it.
pub(crate) const NORM_THREADS: u32 = 256;

pub(crate) fn run(q: &Queue, a: &RmsNormArgs<'_>) -> Result<()> {
    let cq = CudaQueue::of(q, "RmsNorm")?;
    let (t, d) = (a.x.dim(0), a.x.dim(1));
    if t == 0 || d == 0 {
        return Ok(());
    }
    let d =
        i32::try_from(d).map_err(|_| Error::invalid("RmsNorm", "x", format!("row width {d} exceeds i32")))?;
    let f = cq.function(&SRC, "rms_norm", a.x.dtype())?;
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
    // SAFETY: the arguments follow `rms_norm_*`'s parameters; vt-core validated that the
    // views (rows of `d` unit-stride elements, `t` rows) lie inside their allocations.
    unsafe { cq.launch("RmsNorm", &f, cfg((grid_1d(t), 1, 1), NORM_THREADS, 0), &args) }
}
