//! MlaDecodeAttention: absorbed MQA over the paged latent cache, s_q >= 1 query tokens
//! per sequence with bottom-right causal masking.

use vt_core::{MlaDecodeAttentionArgs, OpId, Queue, Result};

use crate::attention::{attend, Rows};
use crate::gather_mla_cache::{cache_row, read_cache_row};
use crate::host::HostView;

const OP: OpId = OpId::MlaDecodeAttention;

pub(crate) fn run(_q: &Queue, a: &MlaDecodeAttentionArgs<'_>) -> Result<()> {
    let out = HostView::new(OP, &a.out)?;
    let lse = HostView::opt(OP, &a.lse)?;
    let q = HostView::new(OP, &a.query)?;
    let cache = HostView::new(OP, &a.cache)?;
    let block_table = HostView::new(OP, &a.block_table)?;
    let seq_lens = HostView::new(OP, &a.seq_lens)?;
    let (b, sq, n, d) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let dv = out.dim(3);
    let mut qrow = vec![0f32; d];
    let mut orow = vec![0f32; dv];
    let mut keys: Vec<f32> = Vec::new();
    let mut logits: Vec<f32> = Vec::new();
    for bi in 0..b {
        let len = seq_lens.get_int(&[bi]).max(0) as usize;
        // The sequence's keys, gathered once through the block table into f32 scratch.
        keys.clear();
        keys.resize(len * d, 0.0);
        let mut mapped = 0;
        for (j, row) in keys.chunks_exact_mut(d.max(1)).enumerate().take(len) {
            // Validation maps every position into the cache on the CPU; should one not
            // be, attention stops before it rather than reading a wrong row.
            let Some((blk, r)) = cache_row(&block_table, &cache, bi, j as i64) else { break };
            read_cache_row(&cache, blk, r, &mut row[..d]);
            mapped = j + 1;
        }
        logits.resize(len, 0.0);
        for s in 0..sq {
            // Query s sees keys 0 .. len - s_q + s + 1 (bottom-right aligned).
            let visible = (len + s + 1).saturating_sub(sq).min(mapped);
            for h in 0..n {
                q.read_row(&[bi, s, h], &mut qrow);
                let k = Rows { data: &keys, width: d };
                let v = Rows { data: &keys, width: d };
                let l = attend(&qrow, &k, &v, visible, a.scale, &mut logits, &mut orow);
                out.write_row(&[bi, s, h], &orow);
                if let Some(lse) = &lse {
                    lse.set(&[bi, h, s], l);
                }
            }
        }
    }
    Ok(())
}
