//! MatmulBT: `out[M,N] = a[M,K] . b[N,K]^T`, f32 accumulation in [`gemm::dot`]'s order.

use vt_core::{MatmulBTArgs, OpId, Queue, Result};

use crate::gemm;
use crate::host::HostView;

const OP: OpId = OpId::MatmulBT;

pub(crate) fn run(_q: &Queue, x: &MatmulBTArgs<'_>) -> Result<()> {
    let (out, a, b) = (HostView::new(OP, &x.out)?, HostView::new(OP, &x.a)?, HostView::new(OP, &x.b)?);
    let (m, k, n) = (a.dim(0), a.dim(1), b.dim(0));
    let am = gemm::packed_rows(m, k, |i, row| a.read_row(&[i], row));
    // b's rows are converted a block at a time inside the product (no f32 copy of b).
    let out_t = gemm::rows_times_rows(&am, m, k, n, |j, row| b.read_row(&[j], row));
    write_transposed(&out, &out_t, m, n);
    Ok(())
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
