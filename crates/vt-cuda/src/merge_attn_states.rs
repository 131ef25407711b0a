//! MergeAttnStates: one block per (token, head) row merges the two partial results by
//! their lse (`kernels-cuda/merge_attn_states.cu`).

use vt_core::{MergeAttnStatesArgs, OpId, Queue, Result};

use crate::rope_from_cache::int;
use crate::{grid_1d, kernel_source, optional_lse, view_args, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("merge_attn_states");

const OP: OpId = OpId::MergeAttnStates;

pub(crate) fn run(q: &Queue, a: &MergeAttnStatesArgs<'_>) -> Result<()> {
    CudaQueue::of(q, OP)?.run(OP, &plan(a)?)
}

/// lse tensors are [N, T]: head stride first.
pub(crate) fn plan(a: &MergeAttnStatesArgs<'_>) -> Result<Vec<Launch>> {
    let (t, n, v) = (a.out.dim(0), a.out.dim(1), a.out.dim(2));
    if t == 0 || n == 0 {
        return Ok(vec![]);
    }
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
    Ok(vec![Launch::new(&SRC, "merge_attn_states", a.out.dtype(), (grid_1d(t * n), 1, 1), 128, args)])
}
