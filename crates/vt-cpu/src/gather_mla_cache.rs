//! GatherMlaCache: copy a batch's cached context rows into a contiguous workspace
//! (dequantizing an fp8_ds_mla cache).

use vt_core::fp8_ds_mla::{self, DECODED, ROW_BYTES};
use vt_core::{DType, GatherMlaCacheArgs, OpId, Queue, Result};

use crate::host::HostView;

const OP: OpId = OpId::GatherMlaCache;

pub(crate) fn run(_q: &Queue, a: &GatherMlaCacheArgs<'_>) -> Result<()> {
    let out = HostView::new(OP, &a.out)?;
    let cache = HostView::new(OP, &a.cache)?;
    let block_table = HostView::new(OP, &a.block_table)?;
    let cu = HostView::new(OP, &a.cu_seq_lens)?;
    let starts = HostView::opt(OP, &a.seq_starts)?;
    let (b, d) = (block_table.dim(0), out.dim(1));
    let mut row = vec![0f32; d];
    for bi in 0..b {
        let (from, to) = (cu.get_int(&[bi]), cu.get_int(&[bi + 1]));
        let start = starts.as_ref().map_or(0, |s| s.get_int(&[bi]));
        for j in 0..(to - from).max(0) {
            let Some((blk, r)) = cache_row(&block_table, &cache, bi, start + j) else { continue };
            read_cache_row(&cache, blk, r, &mut row);
            out.write_row(&[(from + j) as usize], &row);
        }
    }
    Ok(())
}

/// Reads the values of cache row `(blk, r)` into `dst` (its first `dst.len()` values):
/// a float cache's elements, or an fp8_ds_mla row decoded (`e4m3 * scale` in f32, rope
/// bf16). Shared with MlaDecodeAttention, so both ops see the same f32 values.
pub(crate) fn read_cache_row(cache: &HostView<'_>, blk: usize, r: usize, dst: &mut [f32]) {
    if cache.dtype() != DType::Fp8DsMla {
        cache.read_row(&[blk, r], dst);
        return;
    }
    // The row's bytes come back as f32 (0..=255; see DType::Fp8DsMla), exactly.
    let mut raw = [0f32; ROW_BYTES];
    cache.read_row(&[blk, r], &mut raw);
    let mut bytes = [0u8; ROW_BYTES];
    for (b, &v) in bytes.iter_mut().zip(&raw) {
        *b = v as u8;
    }
    let mut vals = [0f32; DECODED];
    fp8_ds_mla::decode_row(&bytes, &mut vals);
    let n = dst.len().min(DECODED);
    dst[..n].copy_from_slice(&vals[..n]);
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
