//! MatmulBT and BatchedMatmul: decode-shaped bf16/f16 calls on the skinny kernel where its
//! measured rule takes them (`skinny_gemm.rs`, `VT_SKINNY_GEMM`), the rest through
//! `cublasGemmStridedBatchedEx` on the views as they
//! come: f32 compute (`CUBLAS_COMPUTE_32F`, no TF32), transpose flags and leading
//! dimensions read off the strides, no copies. A view cuBLAS cannot express (neither of a
//! matrix's last two strides is 1, or a leading dimension that is too small, such as a
//! broadcast row) and K = 0 go to `kernels-cuda/batched_matmul.cu`.

use cudarc::cublas::sys::{cublasOperation_t, cudaDataType};
use vt_core::{BatchedMatmulArgs, DType, Error, MatmulBTArgs, OpId, Queue, Result, Tensor};

use crate::launch::{BlasGemm, BlasOperand};
use crate::skinny_gemm::{GemmKernel, GemmOptions};
use crate::{grid_1d, kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("batched_matmul");

/// A logical row-major matrix `[rows, cols]`: element (i, j) at `i * rs + j * cs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mat {
    rows: i64,
    cols: i64,
    rs: i64,
    cs: i64,
}

impl Mat {
    /// Dims `d0`, `d1` of a view.
    fn of(t: &Tensor<'_>, d0: usize, d1: usize) -> Mat {
        Mat { rows: t.dim(d0), cols: t.dim(d1), rs: t.stride(d0), cs: t.stride(d1) }
    }

    fn t(self) -> Mat {
        Mat { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs }
    }

    /// The leading dimension under which this matrix is stored row-major (column-major
    /// storage of its transpose: cuBLAS op T). A size-1 dim's stride is irrelevant.
    fn row_major_ld(self) -> Option<i64> {
        if self.cs != 1 && self.cols != 1 {
            return None;
        }
        let ld = if self.rows == 1 { self.cols.max(1) } else { self.rs };
        (ld >= self.cols.max(1)).then_some(ld)
    }

    /// The leading dimension under which this matrix is stored column-major (cuBLAS op N).
    fn col_major_ld(self) -> Option<i64> {
        self.t().row_major_ld()
    }

    /// How cuBLAS (column-major) reads this matrix: `(op, ld)` such that `op` applied to
    /// the column-major matrix stored with leading dimension `ld` is this matrix.
    fn blas_layout(self) -> Option<(cublasOperation_t, i64)> {
        self.row_major_ld()
            .map(|ld| (cublasOperation_t::CUBLAS_OP_T, ld))
            .or_else(|| self.col_major_ld().map(|ld| (cublasOperation_t::CUBLAS_OP_N, ld)))
    }
}

/// One strided-batched GEMM `C[g] = A[g] . B[g]` in cuBLAS terms (column-major).
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    op_a: cublasOperation_t,
    op_b: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    lda: i64,
    ldb: i64,
    ldc: i64,
    /// Whether cuBLAS's A is our `a` (else our `b`: the row-major output is computed as
    /// `C^T = B^T . A^T`).
    a_first: bool,
}

/// Plans `c[m,n] = a[m,k] . b[k,n]`, or `None` when cuBLAS cannot read the views.
fn plan(a: Mat, b: Mat, c: Mat) -> Option<Plan> {
    let (m, n, k) = (c.rows, c.cols, a.cols);
    let fits = |v: i64| v <= i32::MAX as i64;
    let p = if let Some(ldc) = c.row_major_ld() {
        // C is row-major: C^T (column-major [n, m]) = B^T . A^T.
        let (op_a, lda) = b.t().blas_layout()?;
        let (op_b, ldb) = a.t().blas_layout()?;
        Plan { op_a, op_b, m: n, n: m, k, lda, ldb, ldc, a_first: false }
    } else if let Some(ldc) = c.col_major_ld() {
        // C is column-major: C = op(A) . op(B).
        let (op_a, lda) = a.blas_layout()?;
        let (op_b, ldb) = b.blas_layout()?;
        Plan { op_a, op_b, m, n, k, lda, ldb, ldc, a_first: true }
    } else {
        return None;
    };
    [p.m, p.n, p.k, p.lda, p.ldb, p.ldc].iter().all(|&v| fits(v)).then_some(p)
}

fn data_type(op: OpId, dt: DType) -> Result<cudaDataType> {
    Ok(match dt {
        DType::BF16 => cudaDataType::CUDA_R_16BF,
        DType::F16 => cudaDataType::CUDA_R_16F,
        DType::F32 => cudaDataType::CUDA_R_32F,
        other => return Err(Error::invalid(op, "out", format!("dtype {other} has no cuBLAS type"))),
    })
}

/// One operand of a batched GEMM: its view (for the address), the stride between its batch
/// entries and the matrix each entry is.
#[derive(Clone, Copy)]
struct Operand<'a> {
    view: &'a Tensor<'a>,
    batch_stride: i64,
    mat: Mat,
}

/// `out[g] = a[g] . b[g]` with `a` `[G,M,K]`, `b` `[G,K,N]` (logical), `out` `[G,M,N]`.
fn gemm(q: &Queue, op: OpId, out: Operand<'_>, a: Operand<'_>, b: Operand<'_>, batch: i64) -> Result<()> {
    let cq = CudaQueue::of(q, op)?;
    let (m, n, k) = (out.mat.rows, out.mat.cols, a.mat.cols);
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    let dt = out.view.dtype();
    // Batch strides of a single matrix are never used; 0 keeps cuBLAS's checks quiet.
    let [out, a, b] = [out, a, b].map(|x| if batch == 1 { Operand { batch_stride: 0, ..x } } else { x });
    let blas_plan = if k > 0 && batch <= i32::MAX as i64 { plan(a.mat, b.mat, out.mat) } else { None };
    let (Some(p), true) = (blas_plan, cq.blas.is_some()) else {
        return cq.run(op, &[fallback(op, out, a, b, batch, k)]);
    };
    let (first, second) = if p.a_first { (a, b) } else { (b, a) };
    // The plan's shapes, leading dimensions and batch strides describe exactly the
    // validated views (each inside its allocation); the sizes fit i32 (checked by `plan`).
    let operand = |x: Operand<'_>, ld: i64| BlasOperand {
        addr: x.view.data_addr(),
        ld: ld as i32,
        batch_stride: x.batch_stride,
    };
    let g = BlasGemm {
        op_a: p.op_a,
        op_b: p.op_b,
        m: p.m as i32,
        n: p.n as i32,
        k: p.k as i32,
        dtype: data_type(op, dt)?,
        a: operand(first, p.lda),
        b: operand(second, p.ldb),
        c: operand(out, p.ldc),
        batch: batch as i32,
    };
    cq.gemm(op, &g)
}

/// The kernel for views cuBLAS cannot express; it reads and writes only the validated views.
fn fallback(op: OpId, out: Operand<'_>, a: Operand<'_>, b: Operand<'_>, batch: i64, k: i64) -> Launch {
    let (am, bm, c) = (a.mat, b.mat, out.mat);
    tracing::debug!(%op, ?am, ?bm, ?c, "matmul views not expressible in cuBLAS: fallback kernel");
    let args: [Arg; 16] = [
        out.view.data_addr().into(),
        out.batch_stride.into(),
        c.rs.into(),
        c.cs.into(),
        a.view.data_addr().into(),
        a.batch_stride.into(),
        am.rs.into(),
        am.cs.into(),
        b.view.data_addr().into(),
        b.batch_stride.into(),
        bm.rs.into(),
        bm.cs.into(),
        batch.into(),
        c.rows.into(),
        c.cols.into(),
        k.into(),
    ];
    let total = batch * c.rows * c.cols;
    let grid = grid_1d((total + 255) / 256);
    Launch::new(&SRC, "batched_matmul", out.view.dtype(), (grid, 1, 1), 256, args)
}

/// The fallback kernel's launch for `x` (the GPU-free parameter check plans it).
#[cfg(test)]
pub(crate) fn kernel_sample(x: &BatchedMatmulArgs<'_>) -> Launch {
    let batched = |t| Operand { view: t, batch_stride: t.stride(0), mat: Mat::of(t, 1, 2) };
    fallback(OpId::BatchedMatmul, batched(&x.out), batched(&x.a), batched(&x.b), x.a.dim(0), x.a.dim(2))
}

/// The registered MatmulBT: the skinny kernel where its measured rule takes the call
/// (`skinny_gemm.rs`), else cuBLAS.
pub(crate) fn matmul_bt(q: &Queue, x: &MatmulBTArgs<'_>) -> Result<()> {
    let auto = GemmOptions { kernel: GemmKernel::Auto, splits: None };
    crate::skinny_gemm::matmul_bt_with(q, x, &auto).map(|_| ())
}

/// The registered BatchedMatmul (see [`matmul_bt`]).
pub(crate) fn batched_matmul(q: &Queue, x: &BatchedMatmulArgs<'_>) -> Result<()> {
    let auto = GemmOptions { kernel: GemmKernel::Auto, splits: None };
    crate::skinny_gemm::batched_matmul_with(q, x, &auto).map(|_| ())
}

/// MatmulBT through cuBLAS (or the strided fallback kernel).
pub(crate) fn cublas_matmul_bt(q: &Queue, x: &MatmulBTArgs<'_>) -> Result<()> {
    let a = Operand { view: &x.a, batch_stride: 0, mat: Mat::of(&x.a, 0, 1) };
    // b is [N, K]; the product reads it as [K, N].
    let b = Operand { view: &x.b, batch_stride: 0, mat: Mat::of(&x.b, 0, 1).t() };
    let out = Operand { view: &x.out, batch_stride: 0, mat: Mat::of(&x.out, 0, 1) };
    gemm(q, OpId::MatmulBT, out, a, b, 1)
}

/// BatchedMatmul through cuBLAS (or the strided fallback kernel).
pub(crate) fn cublas_batched_matmul(q: &Queue, x: &BatchedMatmulArgs<'_>) -> Result<()> {
    let batched = |t| Operand { view: t, batch_stride: t.stride(0), mat: Mat::of(t, 1, 2) };
    gemm(q, OpId::BatchedMatmul, batched(&x.out), batched(&x.a), batched(&x.b), x.a.dim(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cublasOperation_t::{CUBLAS_OP_N as N, CUBLAS_OP_T as T};

    fn rm(rows: i64, cols: i64, ld: i64) -> Mat {
        Mat { rows, cols, rs: ld, cs: 1 }
    }

    #[test]
    fn row_major_linear_layer_is_c_transposed_with_b_first() {
        // out[M,N] = a[M,K] . w[N,K]^T with a row-strided activation (ld 100 > K).
        let (m, n, k) = (5, 7, 3);
        let p = plan(rm(m, k, 100), rm(n, k, k).t(), rm(m, n, n)).unwrap();
        assert_eq!(p, Plan { op_a: T, op_b: N, m: n, n: m, k, lda: k, ldb: 100, ldc: n, a_first: false });
    }

    #[test]
    fn transposed_views_flip_the_flags_instead_of_copying() {
        // a given as a transposed view of a [K, M] buffer: column-major, op N for A^T.
        let (m, n, k) = (4, 6, 8);
        let a = Mat { rows: m, cols: k, rs: 1, cs: m };
        let p = plan(a, rm(k, n, n), rm(m, n, n)).unwrap();
        assert_eq!((p.op_a, p.op_b, p.lda, p.ldb), (N, T, n, m));
    }

    #[test]
    fn column_major_output_is_written_directly() {
        let (m, n, k) = (4, 6, 8);
        let c = Mat { rows: m, cols: n, rs: 1, cs: m + 3 };
        let p = plan(rm(m, k, k), rm(k, n, n), c).unwrap();
        assert_eq!(p, Plan { op_a: T, op_b: T, m, n, k, lda: k, ldb: n, ldc: m + 3, a_first: true });
    }

    #[test]
    fn views_without_a_unit_stride_or_with_broadcast_rows_need_the_kernel() {
        let (m, n, k) = (4, 6, 8);
        let strided = Mat { rows: m, cols: k, rs: 2 * k, cs: 2 };
        assert!(plan(strided, rm(k, n, n), rm(m, n, n)).is_none());
        let broadcast = Mat { rows: m, cols: k, rs: 0, cs: 1 };
        assert!(plan(broadcast, rm(k, n, n), rm(m, n, n)).is_none());
    }

    #[test]
    fn single_rows_and_columns_ignore_their_meaningless_stride() {
        // A decode step: M = 1, the row stride of a is arbitrary.
        let p = plan(Mat { rows: 1, cols: 8, rs: 12345, cs: 1 }, rm(8, 6, 6), rm(1, 6, 6)).unwrap();
        assert_eq!(p, Plan { op_a: N, op_b: T, m: 6, n: 1, k: 8, lda: 6, ldb: 1, ldc: 6, a_first: false });
    }
}
