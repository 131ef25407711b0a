//! GatherMlaCache: one block per workspace row finds its sequence by binary search in
//! `cu_seq_lens` on the device and copies the cached row (`kernels-cuda/gather_mla_cache.cu`).
//! The grid covers every workspace row, so no length is read back on the host.

use vt_core::{GatherMlaCacheArgs, Queue, Result};

use crate::rope_from_cache::int;
use crate::{cfg, grid_1d, kernel_source, Arg, CudaQueue, KernelSource};

static SRC: KernelSource = kernel_source!("gather_mla_cache");

pub(crate) fn run(q: &Queue, a: &GatherMlaCacheArgs<'_>) -> Result<()> {
    const OP: &str = "GatherMlaCache";
    let cq = CudaQueue::of(q, OP)?;
    let rows = a.out.dim(0);
    let (nb, bs, d) = (a.cache.dim(0), a.cache.dim(1), a.cache.dim(2));
    let nseq = a.block_table.dim(0);
    if rows == 0 || nseq == 0 || d == 0 || bs == 0 {
        return Ok(());
    }
    let (starts, st_s) = match &a.seq_starts {
        Some(s) => (s.data_addr(), s.stride(0)),
        None => (0, 0),
    };
    let f = cq.function(&SRC, "gather_mla_cache", a.out.dtype())?;
    let args: [Arg; 18] = [
        a.out.data_addr().into(),
        a.out.stride(0).into(),
        rows.into(),
        a.cache.data_addr().into(),
        a.cache.stride(0).into(),
        a.cache.stride(1).into(),
        nb.into(),
        bs.into(),
        int(OP, "cache", d)?.into(),
        a.block_table.data_addr().into(),
        a.block_table.stride(0).into(),
        a.block_table.stride(1).into(),
        a.block_table.dim(1).into(),
        a.cu_seq_lens.data_addr().into(),
        a.cu_seq_lens.stride(0).into(),
        int(OP, "block_table", nseq)?.into(),
        starts.into(),
        st_s.into(),
    ];
    // SAFETY: the arguments follow `gather_mla_cache_*`'s parameters; vt-core validated the
    // views, and the kernel skips rows whose sequence, block index or block id is out of
    // range, so it reads only cache rows and writes only rows below `rows`.
    unsafe { cq.launch(OP, &f, cfg((grid_1d(rows), 1, 1), 128, 0), &args) }
}
