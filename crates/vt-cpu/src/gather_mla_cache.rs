//! GatherMlaCache: copy a batch's cached context rows into a contiguous workspace.

use vt_core::{GatherMlaCacheArgs, OpId, Queue, Result};

use crate::host::HostView;

const OP: OpId = OpId::GatherMlaCache;

pub(crate) fn run(_q: &Queue, a: &GatherMlaCacheArgs<'_>) -> Result<()> {
    let out = HostView::new(OP, &a.out)?;
    let cache = HostView::new(OP, &a.cache)?;
    let block_table = HostView::new(OP, &a.block_table)?;
    let cu = HostView::new(OP, &a.cu_seq_lens)?;
    let starts = HostView::opt(OP, &a.seq_starts)?;
    let (b, d) = (block_table.dim(0), cache.dim(2));
    let mut row = vec![0f32; d];
    for bi in 0..b {
        let (from, to) = (cu.get_int(&[bi]), cu.get_int(&[bi + 1]));
        let start = starts.as_ref().map_or(0, |s| s.get_int(&[bi]));
        for j in 0..(to - from).max(0) {
            let Some((blk, r)) = cache_row(&block_table, &cache, bi, start + j) else { continue };
            cache.read_row(&[blk, r], &mut row);
            out.write_row(&[(from + j) as usize], &row);
        }
    }
    Ok(())
}

/// The cache block and row holding logical position `p` of sequence `b`, or `None` if
/// the block table does not map it into the cache (validation rejects that on the CPU;
/// GPU kernels skip such rows). Shared with MlaDecodeAttention.
pub(crate) fn cache_row(
    block_table: &HostView<'_>,
    cache: &HostView<'_>,
    b: usize,
    p: i64,
) -> Option<(usize, usize)> {
    let bs = cache.dim(1) as i64;
    if p < 0 || bs == 0 || p / bs >= block_table.dim(1) as i64 {
        return None;
    }
    let blk = block_table.get_int(&[b, (p / bs) as usize]);
    (blk >= 0 && blk < cache.dim(0) as i64).then_some((blk as usize, (p % bs) as usize))
}
