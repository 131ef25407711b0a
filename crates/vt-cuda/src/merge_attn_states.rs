//! MergeAttnStates: one block per (token, head) row merges the two partial results by
//! their lse (`kernels-cuda/merge_attn_states.cu`).

use vt_core::{MergeAttnStatesArgs, Queue, Result};

use crate::rope_from_cache::int;
use crate::{cfg, grid_1d, kernel_source, optional_lse, Arg, CudaQueue, KernelSource};

static SRC: KernelSource = kernel_source!("merge_attn_states");

pub(crate) fn run(q: &Queue, a: &MergeAttnStatesArgs<'_>) -> Result<()> {
    const OP: &str = "MergeAttnStates";
    let cq = CudaQueue::of(q, OP)?;
    let (t, n, v) = (a.out.dim(0), a.out.dim(1), a.out.dim(2));
    if t == 0 || n == 0 {
        return Ok(());
    }
    let (lse, l_sh, l_st) = optional_lse(a.out_lse.as_ref());
    let f = cq.function(&SRC, "merge_attn_states", a.out.dtype())?;
    let args: [Arg; 21] = [
        a.out.data_addr().into(),
        a.out.stride(0).into(),
        a.out.stride(1).into(),
        lse.into(),
        l_sh.into(),
        l_st.into(),
        a.prefix.data_addr().into(),
        a.prefix.stride(0).into(),
        a.prefix.stride(1).into(),
        a.prefix_lse.data_addr().into(),
        a.prefix_lse.stride(0).into(),
        a.prefix_lse.stride(1).into(),
        a.suffix.data_addr().into(),
        a.suffix.stride(0).into(),
        a.suffix.stride(1).into(),
        a.suffix_lse.data_addr().into(),
        a.suffix_lse.stride(0).into(),
        a.suffix_lse.stride(1).into(),
        t.into(),
        int(OP, "out", n)?.into(),
        int(OP, "out", v)?.into(),
    ];
    // SAFETY: the arguments follow `merge_attn_states_*`'s parameters and describe the
    // validated views (lse tensors are [N, T]: head stride first).
    unsafe { cq.launch(OP, &f, cfg((grid_1d(t * n), 1, 1), 128, 0), &args) }
}
