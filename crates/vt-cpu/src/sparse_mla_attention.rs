//! SparseMlaAttention: absorbed MQA of each query token over the cache slots its
//! `indices` row lists (negative entries skipped, duplicates counted).

use vt_core::{OpId, Queue, Result, SparseMlaAttentionArgs};

use crate::attention::{attend, attend_rows, Rows};
use crate::gather_mla_cache::read_cache_row;
use crate::host::HostView;

const OP: OpId = OpId::SparseMlaAttention;

pub(crate) fn run(_q: &Queue, a: &SparseMlaAttentionArgs<'_>) -> Result<()> {
    let out = HostView::new(OP, &a.out)?;
    let lse = HostView::opt(OP, &a.lse)?;
    let q = HostView::new(OP, &a.query)?;
    let cache = HostView::new(OP, &a.cache)?;
    let indices = HostView::new(OP, &a.indices)?;
    let (t, n, d) = (q.dim(0), q.dim(1), q.dim(2));
    let (dv, topk, bs) = (out.dim(2), indices.dim(1), cache.dim(1) as i64);
    let slots = cache.dim(0) as i64 * bs;
    let mut keys: Vec<f32> = Vec::with_capacity(topk * d);
    for ti in 0..t {
        // The query's keys, in the order listed, into f32 scratch. Validation rejects a
        // slot past the cache on the CPU; should one arrive, it is skipped as GPUs do.
        keys.clear();
        let mut count = 0;
        for k in 0..topk {
            let s = indices.get_int(&[ti, k]);
            if s < 0 || s >= slots {
                continue;
            }
            keys.resize((count + 1) * d, 0.0);
            read_cache_row(&cache, (s / bs) as usize, (s % bs) as usize, &mut keys[count * d..]);
            count += 1;
        }
        // Every head.
        let k = Rows { data: &keys, width: d };
        attend_rows(
            n,
            (d, dv, count),
            |h, qrow, logits, o| {
                q.read_row(&[ti, h], qrow);
                attend(qrow, &k, &k, count, a.scale, logits, o)
            },
            |h, o, l| {
                out.write_row(&[ti, h], o);
                if let Some(lse) = &lse {
                    lse.set(&[h, ti], l);
                }
            },
        );
    }
    Ok(())
}
