//! MatmulBTFp8: `out[M,N] = A[M,K] . W[N,K]^T` with W (and optionally A) dequantized from
//! fp8 e4m3 and its f32 block scales element by element (`vt_core::fp8_block::decode`:
//! the f32 product code * scale), then f32 dot products in [`gemm::dot`]'s order, as MatmulBT.

use vt_core::fp8_block::BLOCK;
use vt_core::{MatmulBTFp8Args, OpId, Queue, Result};

use crate::gemm;
use crate::host::HostView;
use crate::matmul_bt::write_transposed;

const OP: OpId = OpId::MatmulBTFp8;

/// Row `lead` of `x` (last dim K) into `dst`, each value times its scale from `scale` at
/// `scale_lead` + `[k / 128]` when given (an fp8 operand), else as read.
pub(crate) fn read_dequantized(
    x: &HostView<'_>,
    lead: &[usize],
    scale: Option<(&HostView<'_>, &[usize])>,
    dst: &mut [f32],
) {
    x.read_row(lead, dst);
    if let Some((s, s_lead)) = scale {
        let mut idx = s_lead.to_vec();
        let last = idx.len();
        idx.push(0);
        for (kb, chunk) in dst.chunks_mut(BLOCK).enumerate() {
            idx[last] = kb;
            let sv = s.get(&idx);
            chunk.iter_mut().for_each(|v| *v *= sv);
        }
    }
}

pub(crate) fn run(_q: &Queue, x: &MatmulBTFp8Args<'_>) -> Result<()> {
    let (out, a, b) = (HostView::new(OP, &x.out)?, HostView::new(OP, &x.a)?, HostView::new(OP, &x.b)?);
    let b_scale = HostView::new(OP, &x.b_scale)?;
    let a_scale = HostView::opt(OP, &x.a_scale)?;
    let (m, k, n) = (a.dim(0), a.dim(1), b.dim(0));
    let am = gemm::packed_rows(m, k, |i, row| {
        let lead = [i];
        read_dequantized(&a, &lead, a_scale.as_ref().map(|s| (s, &lead[..])), row)
    });
    // W's rows are dequantized a block at a time inside the product.
    let out_t = gemm::rows_times_rows(&am, m, k, n, |j, row| {
        read_dequantized(&b, &[j], Some((&b_scale, &[j / BLOCK])), row)
    });
    write_transposed(&out, &out_t, m, n);
    Ok(())
}
