//! MergeAttnStates: one block per (token, head) row merges the two partial results by
//! their lse (`kernels-cuda/merge_attn_states.cu`).

use vt_core::{MergeAttnStatesArgs, Queue, Result};

use crate::rope_from_cache::int;
use crate::{cfg, grid_1d, kernel_source, optional_lse, view_args, Arg, CudaQueue, KernelSource};

static SRC: KernelSource = kernel_source!("merge_attn_states");

pub(crate) fn run(q: &Queue, a: &MergeAttnStatesArgs<'_>) -> Result<()> {
    const OP: &str = "MergeAttnStates";
    let cq = CudaQueue::of(q, OP)?;
    let (t, n, v) = (a.out.dim(0), a.out.dim(1), a.out.dim(2));
    if t == 0 || n == 0 {
        return Ok(());
    }
    let f = cq.function(&SRC, "merge_attn_states", a.out.dtype())?;
    let views = [
        view_args(&a.out),
        optional_lse(a.out_lse.as_ref()),
        view_args(&a.prefix),
        view_args(&a.prefix_lse),
        view_args(&a.suffix),
        view_args(&a.suffix_lse),
    ];
    let mut args: Vec<Arg> = views.concat();
    args.extend::<[Arg; 3]>([t.into(), int(OP, "out", n)?.into(), int(OP, "out", v)?.into()]);
    // SAFETY: the arguments follow `merge_attn_states_*`'s parameters and describe the
    // validated views (lse tensors are [N, T]: head stride first).
    unsafe { cq.launch(OP, &f, cfg((grid_1d(t * n), 1, 1), 128, 0), &args) }
}
