//! MatmulBT: `out[M,N] = a[M,K] . b[N,K]^T`, f32 accumulation in [`gemm::dot`]'s order.

use vt_core::{MatmulBTArgs, OpId, Queue, Result};

use crate::gemm;
use crate::host::HostView;

const OP: OpId = OpId::MatmulBT;

pub(crate) fn run(_q: &Queue, x: &MatmulBTArgs<'_>) -> Result<()> {
    let (out, a, b) = (HostView::new(OP, &x.out)?, HostView::new(OP, &x.a)?, HostView::new(OP, &x.b)?);
    let (m, k, n) = (a.dim(0), a.dim(1), b.dim(0));
    let am = read_rows(&a, m, k);
    // b's rows are converted a block at a time inside the product (no f32 copy of b).
    let out_t = gemm::rows_times_rows(&am, m, k, n, |j, row| b.read_row(&[j], row));
    write_transposed(&out, &out_t, m, n);
    Ok(())
}

/// The `m` rows of a 2-D view (each `k` long) as packed f32.
pub(crate) fn read_rows(a: &HostView<'_>, m: usize, k: usize) -> Vec<f32> {
    let mut am = vec![0f32; m * k];
    for (i, row) in am.chunks_exact_mut(k.max(1)).enumerate().take(m) {
        a.read_row(&[i], row);
    }
    am
}

/// Stores `out[i, j] = out_t[j * m + i]` (the layout [`gemm::rows_times_rows`] returns).
pub(crate) fn write_transposed(out: &HostView<'_>, out_t: &[f32], m: usize, n: usize) {
    let mut orow = vec![0f32; n];
    for i in 0..m {
        for (j, o) in orow.iter_mut().enumerate() {
            *o = out_t[j * m + i];
        }
        out.write_row(&[i], &orow);
    }
}
