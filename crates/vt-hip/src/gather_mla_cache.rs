//! GatherMlaCache: kernels-hip/gather_mla_cache.hip, one block per workspace row.

use vt_core::{GatherMlaCacheArgs, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};

pub(crate) fn plan(a: &GatherMlaCacheArgs<'_>) -> Result<Vec<Step>> {
    // Declared gap: the HIP kernels read float caches only.
    vt_core::fp8_ds_mla::unsupported_on(OpId::GatherMlaCache, "hip", &a.cache)?;
    let (c, bt) = (&a.cache, &a.block_table);
    let rows = a.out.dim(0);
    let args = KernelArgs::new()
        .tensor(&a.out)
        .i64s(&[a.out.stride(0), rows])
        .tensor(c)
        .i64s(&[c.stride(0), c.stride(1), c.dim(0), c.dim(1), c.dim(2)])
        .tensor(bt)
        .i64s(&[bt.stride(0), bt.stride(1), bt.dim(1)])
        .tensor(&a.cu_seq_lens)
        .i64s(&[a.cu_seq_lens.stride(0), bt.dim(0)])
        .opt_tensor(a.seq_starts.as_ref())
        .i64(a.seq_starts.map_or(0, |s| s.stride(0)));
    Ok(kernels([Launch::new("gather_mla_cache", "gather_mla_cache.hip", c.dtype(), rows, args)?]))
}

pub(crate) fn run(q: &Queue, a: &GatherMlaCacheArgs<'_>) -> Result<()> {
    HipQueue::of(OpId::GatherMlaCache, q)?.run(&plan(a)?)
}
