//! MatmulBT: one rocBLAS GEMM (`out^T = b . a^T` in column-major terms), or the
//! batched_matmul kernel as a batch of one with `b` seen transposed when rocBLAS is absent.

use vt_core::{MatmulBTArgs, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::gemm::{self, Operand};
use crate::launch::Step;

pub(crate) fn plan(a: &MatmulBTArgs<'_>, blas: bool) -> Result<Vec<Step>> {
    let (m, k, n) = (a.a.dim(0), a.a.dim(1), a.b.dim(0));
    let out = Operand { addr: a.out.data_addr(), s: [0, a.out.stride(0), a.out.stride(1)] };
    let x = Operand { addr: a.a.data_addr(), s: [0, a.a.stride(0), a.a.stride(1)] };
    // b [N, K] read as b^T [K, N].
    let bt = Operand { addr: a.b.data_addr(), s: [0, a.b.stride(1), a.b.stride(0)] };
    gemm::plan(a.out.dtype(), out, x, bt, [1, m, n, k], blas)
}

pub(crate) fn run(q: &Queue, a: &MatmulBTArgs<'_>) -> Result<()> {
    let hq = HipQueue::of(OpId::MatmulBT, q)?;
    hq.run(&plan(a, hq.has_blas())?)
}
