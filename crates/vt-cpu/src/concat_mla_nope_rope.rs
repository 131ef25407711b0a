//! ConcatMlaNopeRope: `out[t, n, :] = [nope[t, n, :] | rope[t, n or 0, :]]`.

use vt_core::{ConcatMlaNopeRopeArgs, OpId, Queue, Result};

use crate::host::HostView;

const OP: OpId = OpId::ConcatMlaNopeRope;

pub(crate) fn run(_q: &Queue, a: &ConcatMlaNopeRopeArgs<'_>) -> Result<()> {
    let out = HostView::new(OP, &a.out)?;
    let nope = HostView::new(OP, &a.nope)?;
    let rope = HostView::new(OP, &a.rope)?;
    let (t, n, p, r) = (nope.dim(0), nope.dim(1), nope.dim(2), rope.dim(2));
    let broadcast = rope.dim(1) == 1;
    let mut row = vec![0f32; p + r];
    for ti in 0..t {
        for h in 0..n {
            let (left, right) = row.split_at_mut(p);
            nope.read_row(&[ti, h], left);
            rope.read_row(&[ti, if broadcast { 0 } else { h }], right);
            out.write_row(&[ti, h], &row);
        }
    }
    Ok(())
}
