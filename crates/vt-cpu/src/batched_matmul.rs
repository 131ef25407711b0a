//! BatchedMatmul: `out[g] = a[g] . b[g]` for any strides on every dim.

use vt_core::{BatchedMatmulArgs, OpId, Queue, Result};

use crate::gemm::{self, dot};
use crate::host::HostView;

const OP: OpId = OpId::BatchedMatmul;

pub(crate) fn run(_q: &Queue, x: &BatchedMatmulArgs<'_>) -> Result<()> {
    let (out, a, b) = (HostView::new(OP, &x.out)?, HostView::new(OP, &x.a)?, HostView::new(OP, &x.b)?);
    let (g, m, k, n) = (a.dim(0), a.dim(1), a.dim(2), b.dim(2));
    // Per group: a[g] as M rows of K and b[g] transposed to N rows of K, both in f32
    // scratch, read a row (last dim) at a time: any stride may be the unit one or none.
    let mut bt = vec![0f32; n * k];
    let mut brow = vec![0f32; n];
    let mut orow = vec![0f32; n];
    for gi in 0..g {
        let am = gemm::packed_rows(m, k, |i, row| a.read_row(&[gi, i], row));
        for kk in 0..k {
            b.read_row(&[gi, kk], &mut brow);
            for (j, &v) in brow.iter().enumerate() {
                bt[j * k + kk] = v;
            }
        }
        for i in 0..m {
            for (j, o) in orow.iter_mut().enumerate() {
                *o = dot(&am[i * k..(i + 1) * k], &bt[j * k..(j + 1) * k]);
            }
            out.write_row(&[gi, i], &orow);
        }
    }
    Ok(())
}
