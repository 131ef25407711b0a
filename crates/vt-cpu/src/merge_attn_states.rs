//! MergeAttnStates: merge two partial attention results by their lse.

use vt_core::{MergeAttnStatesArgs, OpId, Queue, Result};

use crate::host::HostView;

const OP: OpId = OpId::MergeAttnStates;

pub(crate) fn run(_q: &Queue, a: &MergeAttnStatesArgs<'_>) -> Result<()> {
    let out = HostView::new(OP, &a.out)?;
    let out_lse = HostView::opt(OP, &a.out_lse)?;
    let prefix = HostView::new(OP, &a.prefix)?;
    let suffix = HostView::new(OP, &a.suffix)?;
    let prefix_lse = HostView::new(OP, &a.prefix_lse)?;
    let suffix_lse = HostView::new(OP, &a.suffix_lse)?;
    let (t, n, v) = (out.dim(0), out.dim(1), out.dim(2));
    let (mut p, mut s, mut o) = (vec![0f32; v], vec![0f32; v], vec![0f32; v]);
    for ti in 0..t {
        for h in 0..n {
            // An infinite lse (either sign) marks a side that saw no keys.
            let lp = finite_or_empty(prefix_lse.get(&[h, ti]));
            let ls = finite_or_empty(suffix_lse.get(&[h, ti]));
            let m = lp.max(ls);
            let lse = if m == f32::NEG_INFINITY {
                o.fill(0.0);
                f32::NEG_INFINITY
            } else {
                let (wp, ws) = ((lp - m).exp(), (ls - m).exp());
                let sum = wp + ws;
                // An empty side's values are never read: they may be anything (NaN).
                o.fill(0.0);
                if lp != f32::NEG_INFINITY {
                    prefix.read_row(&[ti, h], &mut p);
                    o.iter_mut().zip(&p).for_each(|(o, &x)| *o += wp * x);
                }
                if ls != f32::NEG_INFINITY {
                    suffix.read_row(&[ti, h], &mut s);
                    o.iter_mut().zip(&s).for_each(|(o, &x)| *o += ws * x);
                }
                o.iter_mut().for_each(|o| *o /= sum);
                m + sum.ln()
            };
            out.write_row(&[ti, h], &o);
            if let Some(l) = &out_lse {
                l.set(&[h, ti], lse);
            }
        }
    }
    Ok(())
}

fn finite_or_empty(lse: f32) -> f32 {
    if lse.is_infinite() {
        f32::NEG_INFINITY
    } else {
        lse
    }
}
