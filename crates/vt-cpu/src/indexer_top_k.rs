//! IndexerTopK: the lightning indexer's scores over a query's visible tokens in the paged
//! indexer key cache, and the `topk` best as cache slots.

use vt_core::{IndexerTopKArgs, OpId, Queue, Result};

use crate::gather_mla_cache::cache_row;
use crate::host::HostView;

const OP: OpId = OpId::IndexerTopK;

pub(crate) fn run(_q: &Queue, a: &IndexerTopKArgs<'_>) -> Result<()> {
    let out = HostView::new(OP, &a.out)?;
    let q = HostView::new(OP, &a.query)?;
    let w = HostView::new(OP, &a.weights)?;
    let cache = HostView::new(OP, &a.cache)?;
    let block_table = HostView::new(OP, &a.block_table)?;
    let seq_ids = HostView::new(OP, &a.seq_ids)?;
    let positions = HostView::new(OP, &a.positions)?;
    let (t, h, di) = (q.dim(0), q.dim(1), q.dim(2));
    let (topk, bs, nseq) = (out.dim(1), cache.dim(1), block_table.dim(0) as i64);
    let mut qs = vec![0f32; h * di];
    let mut ws = vec![0f32; h];
    let mut key = vec![0f32; di];
    // (score, token position, slot) of every visible token.
    let mut scored: Vec<(f32, i64, i64)> = Vec::new();
    for ti in 0..t {
        scored.clear();
        let (b, p) = (seq_ids.get_int(&[ti]), positions.get_int(&[ti]));
        if p >= 0 && (0..nseq).contains(&b) {
            for (hi, row) in qs.chunks_exact_mut(di.max(1)).enumerate().take(h) {
                q.read_row(&[ti, hi], row);
            }
            w.read_row(&[ti], &mut ws);
            for j in 0..=p {
                // Validation maps every visible position into the cache on the CPU; one
                // that is not is skipped (as GPU kernels will).
                let Some((blk, r)) = cache_row(&block_table, &cache, b as usize, j) else { continue };
                cache.read_row(&[blk, r], &mut key);
                let mut sum = 0f32;
                for (hi, &wh) in ws.iter().enumerate() {
                    sum += wh * dot_in_order(&qs[hi * di..(hi + 1) * di], &key).max(0.0);
                }
                // `+ 0.0` makes a -0.0 score +0.0, which total_cmp would order below it.
                scored.push((a.scale * sum + 0.0, j, (blk * bs + r) as i64));
            }
        }
        // Highest score first, equal scores in increasing position (total_cmp: a NaN
        // score, from non-finite inputs, sorts above every number).
        scored.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
        for k in 0..topk {
            let slot = scored.get(k).map_or(-1, |s| s.2);
            out.set_int(&[ti, k], slot);
        }
    }
    Ok(())
}

/// f32 dot product summed in index order: CUDA's generic score kernel sums in this same
/// order, so its scores, and so its selection, are bit-equal to these (the contract says
/// so). Not `gemm::dot`, whose eight partial sums no one-thread-per-token kernel mirrors.
fn dot_in_order(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (a, b) in x.iter().zip(y) {
        acc += a * b;
    }
    acc
}
