//! MergeAttnStates: kernels-hip/merge_attn_states.hip, one block per (token, head).

use vt_core::{MergeAttnStatesArgs, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};

pub(crate) fn plan(a: &MergeAttnStatesArgs<'_>) -> Result<Vec<Step>> {
    let (t, n, v) = (a.out.dim(0), a.out.dim(1), a.out.dim(2));
    let lse_strides = a.out_lse.map_or([0, 0], |l| [l.stride(0), l.stride(1)]);
    let args = KernelArgs::new()
        .tensor(&a.out)
        .i64s(&[a.out.stride(0), a.out.stride(1)])
        .opt_tensor(a.out_lse.as_ref())
        .i64s(&lse_strides)
        .tensor(&a.prefix)
        .i64s(&[a.prefix.stride(0), a.prefix.stride(1)])
        .tensor(&a.prefix_lse)
        .i64s(&[a.prefix_lse.stride(0), a.prefix_lse.stride(1)])
        .tensor(&a.suffix)
        .i64s(&[a.suffix.stride(0), a.suffix.stride(1)])
        .tensor(&a.suffix_lse)
        .i64s(&[a.suffix_lse.stride(0), a.suffix_lse.stride(1), t, n, v]);
    Ok(kernels([Launch::new("merge_attn_states", "merge_attn_states.hip", a.out.dtype(), t * n, args)?]))
}

pub(crate) fn run(q: &Queue, a: &MergeAttnStatesArgs<'_>) -> Result<()> {
    HipQueue::of(OpId::MergeAttnStates, q)?.run(&plan(a)?)
}
