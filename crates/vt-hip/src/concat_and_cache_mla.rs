//! ConcatAndCacheMla: kernels-hip/concat_and_cache_mla.hip, one block per token.

use vt_core::{ConcatAndCacheMlaArgs, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};

pub(crate) fn plan(a: &ConcatAndCacheMlaArgs<'_>) -> Result<Vec<Step>> {
    // Declared gap: the HIP kernels read float caches only.
    vt_core::fp8_ds_mla::unsupported_on(OpId::ConcatAndCacheMla, "hip", &a.cache)?;
    let (t, l, r) = (a.kv_c.dim(0), a.kv_c.dim(1), a.k_pe.dim(1));
    let c = &a.cache;
    let args = KernelArgs::new()
        .tensor(c)
        .i64s(&[c.stride(0), c.stride(1), c.dim(0), c.dim(1)])
        .tensor(&a.kv_c)
        .i64(a.kv_c.stride(0))
        .tensor(&a.k_pe)
        .i64(a.k_pe.stride(0))
        .tensor(&a.slot_mapping)
        .i64s(&[a.slot_mapping.stride(0), t, l, r]);
    Ok(kernels([Launch::new("concat_and_cache_mla", "concat_and_cache_mla.hip", c.dtype(), t, args)?]))
}

pub(crate) fn run(q: &Queue, a: &ConcatAndCacheMlaArgs<'_>) -> Result<()> {
    HipQueue::of(OpId::ConcatAndCacheMla, q)?.run(&plan(a)?)
}
