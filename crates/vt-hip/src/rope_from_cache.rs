//! RopeFromCache: kernels-hip/rope_from_cache.hip, one thread per rotary pair; one launch
//! for q and one for k.

use vt_core::{OpId, Queue, Result, RopeFromCacheArgs, Tensor};

use crate::backend::HipQueue;
use crate::launch::{blocks_for_threads, kernels, KernelArgs, Launch, Step};

fn launch(x: &Tensor<'_>, a: &RopeFromCacheArgs<'_>) -> Result<Option<Launch>> {
    let (t, h, r) = (x.dim(0), x.dim(1), x.dim(2));
    let args = KernelArgs::new()
        .tensor(x)
        .i64s(&[x.stride(0), x.stride(1), t, h, r])
        .tensor(&a.positions)
        .i64(a.positions.stride(0))
        .tensor(&a.cos_sin_cache)
        .i64(a.cos_sin_cache.dim(0))
        .i32(a.is_neox as i32);
    Launch::new(
        "rope_from_cache",
        "rope_from_cache.hip",
        x.dtype(),
        blocks_for_threads(t * h * (r / 2)),
        args,
    )
}

pub(crate) fn plan(a: &RopeFromCacheArgs<'_>) -> Result<Vec<Step>> {
    let k = match &a.key {
        Some(k) => launch(k, a)?,
        None => None,
    };
    Ok(kernels([launch(&a.query, a)?, k]))
}

pub(crate) fn run(q: &Queue, a: &RopeFromCacheArgs<'_>) -> Result<()> {
    HipQueue::of(OpId::RopeFromCache, q)?.run(&plan(a)?)
}
