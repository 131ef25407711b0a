//! PrefillAttention: variable-length MHA, causal (bottom-right) or not, optional lse.

use vt_core::{OpId, PrefillAttentionArgs, Queue, Result};

use crate::attention::{attend, attend_rows, Rows};
use crate::host::HostView;

const OP: OpId = OpId::PrefillAttention;

pub(crate) fn run(_q: &Queue, a: &PrefillAttentionArgs<'_>) -> Result<()> {
    let out = HostView::new(OP, &a.out)?;
    let lse = HostView::opt(OP, &a.lse)?;
    let (q, k, v) = (HostView::new(OP, &a.query)?, HostView::new(OP, &a.k)?, HostView::new(OP, &a.v)?);
    let cu_q = HostView::new(OP, &a.cu_seqlens_q)?;
    let cu_k = HostView::new(OP, &a.cu_seqlens_k)?;
    let (n, d, dv) = (q.dim(1), q.dim(2), v.dim(2));
    let b = cu_q.dim(0).saturating_sub(1);
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for bi in 0..b {
        let (q0, q1) = (cu_q.get_int(&[bi]).max(0) as usize, cu_q.get_int(&[bi + 1]).max(0) as usize);
        let (k0, k1) = (cu_k.get_int(&[bi]).max(0) as usize, cu_k.get_int(&[bi + 1]).max(0) as usize);
        let (lq, lk) = (q1.saturating_sub(q0), k1.saturating_sub(k0));
        for h in 0..n {
            // This sequence's keys and values of head h in f32 scratch.
            keys.resize(lk * d, 0.0);
            values.resize(lk * dv, 0.0);
            for j in 0..lk {
                k.read_row(&[k0 + j, h], &mut keys[j * d..(j + 1) * d]);
                v.read_row(&[k0 + j, h], &mut values[j * dv..(j + 1) * dv]);
            }
            // Every query row of this head.
            let (kr, vr) = (Rows { data: &keys, width: d }, Rows { data: &values, width: dv });
            attend_rows(
                lq,
                (d, dv, lk),
                |i, qrow, logits, o| {
                    // Causal, bottom-right: query i sees keys 0 ..= lk - lq + i.
                    let visible = if a.causal { (lk + i + 1).saturating_sub(lq).min(lk) } else { lk };
                    q.read_row(&[q0 + i, h], qrow);
                    attend(qrow, &kr, &vr, visible, a.scale, logits, o)
                },
                |i, o, l| {
                    out.write_row(&[q0 + i, h], o);
                    if let Some(lse) = &lse {
                        lse.set(&[h, q0 + i], l);
                    }
                },
            );
        }
    }
    Ok(())
}
