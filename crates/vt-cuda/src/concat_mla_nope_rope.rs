//! ConcatMlaNopeRope: one block per (token, head) row writes `[nope | rope]`
//! (`kernels-cuda/concat_mla_nope_rope.cu`); a rope with one head is broadcast by passing
//! head stride 0.

use vt_core::{ConcatMlaNopeRopeArgs, Queue, Result};

use crate::rope_from_cache::int;
use crate::{cfg, grid_1d, kernel_source, Arg, CudaQueue, KernelSource};

static SRC: KernelSource = kernel_source!("concat_mla_nope_rope");

pub(crate) fn run(q: &Queue, a: &ConcatMlaNopeRopeArgs<'_>) -> Result<()> {
    const OP: &str = "ConcatMlaNopeRope";
    let cq = CudaQueue::of(q, OP)?;
    let (t, n, p, r) = (a.nope.dim(0), a.nope.dim(1), a.nope.dim(2), a.rope.dim(2));
    if t == 0 || n == 0 {
        return Ok(());
    }
    let rope_head_stride = if a.rope.dim(1) == 1 { 0 } else { a.rope.stride(1) };
    let f = cq.function(&SRC, "concat_mla_nope_rope", a.out.dtype())?;
    let args: [Arg; 13] = [
        a.out.data_addr().into(),
        a.out.stride(0).into(),
        a.out.stride(1).into(),
        a.nope.data_addr().into(),
        a.nope.stride(0).into(),
        a.nope.stride(1).into(),
        a.rope.data_addr().into(),
        a.rope.stride(0).into(),
        rope_head_stride.into(),
        t.into(),
        int(OP, "nope", n)?.into(),
        int(OP, "nope", p)?.into(),
        int(OP, "rope", r)?.into(),
    ];
    // SAFETY: the arguments follow `concat_mla_nope_rope_*`'s parameters and describe the
    // validated views.
    unsafe { cq.launch(OP, &f, cfg((grid_1d(t * n), 1, 1), 128, 0), &args) }
}
