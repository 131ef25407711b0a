//! RopeFromCache: one block per token rotates every head of q (and k) in place
//! (`kernels-cuda/rope_from_cache.cu`).

use vt_core::{Error, OpId, Queue, Result, RopeFromCacheArgs, Subject};

use crate::{grid_1d, kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("rope_from_cache");

/// A size the kernels take as `int`, or an error naming `op` and `arg`.
pub(crate) fn int(op: impl Into<Subject>, arg: &'static str, v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(op, arg, format!("size {v} exceeds the kernels' i32 range")))
}

const OP: OpId = OpId::RopeFromCache;

pub(crate) fn run(q: &Queue, a: &RopeFromCacheArgs<'_>) -> Result<()> {
    CudaQueue::of(q, OP)?.run(OP, &plan(a)?)
}

/// The kernel reads each position and skips those outside the cache.
pub(crate) fn plan(a: &RopeFromCacheArgs<'_>) -> Result<Vec<Launch>> {
    let (t, r) = (a.query.dim(0), a.query.dim(2));
    if t == 0 {
        return Ok(vec![]);
    }
    let hq = int(OP, "query", a.query.dim(1))?;
    let (k_ptr, k_st, k_sh, hk) = match &a.key {
        Some(k) => (k.data_addr(), k.stride(0), k.stride(1), int(OP, "key", k.dim(1))?),
        None => (0, 0, 0, 0),
    };
    let args: [Arg; 15] = [
        a.query.data_addr().into(),
        a.query.stride(0).into(),
        a.query.stride(1).into(),
        hq.into(),
        k_ptr.into(),
        k_st.into(),
        k_sh.into(),
        hk.into(),
        a.positions.data_addr().into(),
        a.positions.stride(0).into(),
        a.cos_sin_cache.data_addr().into(),
        a.cos_sin_cache.dim(0).into(),
        t.into(),
        int(OP, "query", r)?.into(),
        (a.is_neox as i32).into(),
    ];
    Ok(vec![Launch::new(&SRC, "rope_from_cache", a.query.dtype(), (grid_1d(t), 1, 1), 128, args)])
}
