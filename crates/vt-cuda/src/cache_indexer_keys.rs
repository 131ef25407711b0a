//! CacheIndexerKeys: one block per token copies its indexer key row into its cache slot
//! (`kernels-cuda/cache_indexer_keys.cu`); padding and out-of-range slots are skipped on the
//! device, so the kernel writes only rows of slots inside 0..NB*BS.

use vt_core::{CacheIndexerKeysArgs, OpId, Queue, Result};

use crate::rope_from_cache::int;
use crate::{grid_1d, kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("cache_indexer_keys");

const OP: OpId = OpId::CacheIndexerKeys;
/// Threads per token: Di = 128 in DeepSeek-V3.2, one value each.
const THREADS: u32 = 128;

pub(crate) fn run(q: &Queue, a: &CacheIndexerKeysArgs<'_>) -> Result<()> {
    CudaQueue::of(q, OP)?.run(OP, &plan(a)?)
}

pub(crate) fn plan(a: &CacheIndexerKeysArgs<'_>) -> Result<Vec<Launch>> {
    let (t, di) = (a.k.dim(0), a.k.dim(1));
    let (nb, bs) = (a.cache.dim(0), a.cache.dim(1));
    if t == 0 || di == 0 || nb == 0 || bs == 0 {
        return Ok(vec![]);
    }
    let args: [Arg; 11] = [
        a.k.data_addr().into(),
        a.k.stride(0).into(),
        a.cache.data_addr().into(),
        a.cache.stride(0).into(),
        a.cache.stride(1).into(),
        a.slot_mapping.data_addr().into(),
        a.slot_mapping.stride(0).into(),
        t.into(),
        int(OP, "k", di)?.into(),
        nb.into(),
        bs.into(),
    ];
    Ok(vec![Launch::new(&SRC, "cache_indexer_keys", a.k.dtype(), (grid_1d(t), 1, 1), THREADS, args)])
}
