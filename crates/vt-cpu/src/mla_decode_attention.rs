//! MlaDecodeAttention: absorbed MQA over the paged latent cache, s_q >= 1 query tokens
//! per sequence with bottom-right causal masking.

use vt_core::{MlaDecodeAttentionArgs, OpId, Queue, Result};

use crate::attention::{attend, attend_rows, Rows};
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
    let mut keys: Vec<f32> = Vec::new();
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
        // Every (query token, head) row: rows s * n + h.
        let k = Rows { data: &keys, width: d };
        attend_rows(
            sq * n,
            (d, dv, len),
            |r, qrow, logits, o| {
                let (s, h) = (r / n, r % n);
                // Query s sees keys 0 .. len - s_q + s + 1 (bottom-right aligned).
                let visible = (len + s + 1).saturating_sub(sq).min(mapped);
                q.read_row(&[bi, s, h], qrow);
                attend(qrow, &k, &k, visible, a.scale, logits, o)
            },
            |r, o, l| {
                let (s, h) = (r / n, r % n);
                out.write_row(&[bi, s, h], o);
                if let Some(lse) = &lse {
                    lse.set(&[bi, h, s], l);
                }
            },
        );
    }
    Ok(())
}
