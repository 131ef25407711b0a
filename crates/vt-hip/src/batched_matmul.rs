//! BatchedMatmul: one rocBLAS strided batched GEMM when every matrix has a unit stride in
//! one of its last two dims, else kernels-hip/batched_matmul.hip (any strides).

use vt_core::{BatchedMatmulArgs, OpId, Queue, Result, Tensor};

use crate::backend::HipQueue;
use crate::gemm::{self, Operand};
use crate::launch::Step;

fn operand(t: &Tensor<'_>) -> Operand {
    Operand { addr: t.data_addr(), s: [t.stride(0), t.stride(1), t.stride(2)] }
}

pub(crate) fn plan(a: &BatchedMatmulArgs<'_>, blas: bool) -> Result<Vec<Step>> {
    let (g, m, k, n) = (a.a.dim(0), a.a.dim(1), a.a.dim(2), a.b.dim(2));
    gemm::plan(a.out.dtype(), operand(&a.out), operand(&a.a), operand(&a.b), [g, m, n, k], blas)
}

pub(crate) fn run(q: &Queue, a: &BatchedMatmulArgs<'_>) -> Result<()> {
    let hq = HipQueue::of(OpId::BatchedMatmul, q)?;
    hq.run(&plan(a, hq.has_blas())?)
}
