//! BatchedMatmulFp8: `out[g] = A[g] . W[g]` with W (and optionally A) dequantized from fp8
//! e4m3 and their f32 block scales element by element, any strides, f32 dot products in
//! [`crate::gemm::dot`]'s order, as BatchedMatmul.

use vt_core::fp8_block::BLOCK;
use vt_core::{BatchedMatmulFp8Args, OpId, Queue, Result};

use crate::gemm::dot;
use crate::host::HostView;

const OP: OpId = OpId::BatchedMatmulFp8;

pub(crate) fn run(_q: &Queue, x: &BatchedMatmulFp8Args<'_>) -> Result<()> {
    let (out, a, b) = (HostView::new(OP, &x.out)?, HostView::new(OP, &x.a)?, HostView::new(OP, &x.b)?);
    let b_scale = HostView::new(OP, &x.b_scale)?;
    let a_scale = HostView::opt(OP, &x.a_scale)?;
    let (g, m, k, n) = (a.dim(0), a.dim(1), a.dim(2), b.dim(2));
    // Per group: A[g] as M rows of K and W[g] transposed to N rows of K, in f32 scratch.
    let mut am = vec![0f32; m * k];
    let mut wt = vec![0f32; n * k];
    for gi in 0..g {
        for i in 0..m {
            for kk in 0..k {
                let v = a.get(&[gi, i, kk]);
                am[i * k + kk] = match &a_scale {
                    Some(s) => v * s.get(&[gi, i, kk / BLOCK]),
                    None => v,
                };
            }
        }
        for kk in 0..k {
            for j in 0..n {
                wt[j * k + kk] = b.get(&[gi, kk, j]) * b_scale.get(&[gi, kk / BLOCK, j / BLOCK]);
            }
        }
        for i in 0..m {
            for j in 0..n {
                out.set(&[gi, i, j], dot(&am[i * k..(i + 1) * k], &wt[j * k..(j + 1) * k]));
            }
        }
    }
    Ok(())
}
