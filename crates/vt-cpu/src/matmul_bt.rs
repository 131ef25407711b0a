//! MatmulBT: `out[M,N] = a[M,K] . b[N,K]^T`, f32 accumulation in K order.

use vt_core::{MatmulBTArgs, OpId, Queue, Result};

use crate::host::HostView;

const OP: OpId = OpId::MatmulBT;

pub(crate) fn run(_q: &Queue, x: &MatmulBTArgs<'_>) -> Result<()> {
    let (out, a, b) = (HostView::new(OP, &x.out)?, HostView::new(OP, &x.a)?, HostView::new(OP, &x.b)?);
    let (m, k, n) = (a.dim(0), a.dim(1), b.dim(0));
    // b is read once into f32 scratch (N rows of K), a row by row.
    let mut bs = vec![0f32; n * k];
    for j in 0..n {
        b.read_row(&[j], &mut bs[j * k..(j + 1) * k]);
    }
    let mut arow = vec![0f32; k];
    let mut orow = vec![0f32; n];
    for i in 0..m {
        a.read_row(&[i], &mut arow);
        for (j, o) in orow.iter_mut().enumerate() {
            *o = dot(&arow, &bs[j * k..(j + 1) * k]);
        }
        out.write_row(&[i], &orow);
    }
    Ok(())
}

/// f32 dot product, accumulated in index order.
pub(crate) fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (a, b) in x.iter().zip(y) {
        acc += a * b;
    }
    acc
}
