//! BatchedMatmul: `out[g] = a[g] . b[g]` for any strides on every dim.

use vt_core::{BatchedMatmulArgs, OpId, Queue, Result};

use crate::host::HostView;
use crate::matmul_bt::dot;

const OP: OpId = OpId::BatchedMatmul;

pub(crate) fn run(_q: &Queue, x: &BatchedMatmulArgs<'_>) -> Result<()> {
    let (out, a, b) = (HostView::new(OP, &x.out)?, HostView::new(OP, &x.a)?, HostView::new(OP, &x.b)?);
    let (g, m, k, n) = (a.dim(0), a.dim(1), a.dim(2), b.dim(2));
    // Per group: a[g] as M rows of K and b[g] transposed to N rows of K, both in f32
    // scratch (element by element, since any stride may be the unit one or none).
    let mut am = vec![0f32; m * k];
    let mut bt = vec![0f32; n * k];
    for gi in 0..g {
        for i in 0..m {
            for kk in 0..k {
                am[i * k + kk] = a.get(&[gi, i, kk]);
            }
        }
        for kk in 0..k {
            for j in 0..n {
                bt[j * k + kk] = b.get(&[gi, kk, j]);
            }
        }
        for i in 0..m {
            for j in 0..n {
                out.set(&[gi, i, j], dot(&am[i * k..(i + 1) * k], &bt[j * k..(j + 1) * k]));
            }
        }
    }
    Ok(())
}
