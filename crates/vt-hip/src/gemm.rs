//! GEMM planning shared by MatmulBT and BatchedMatmul: one rocBLAS strided batched call
//! when the layouts allow it, else the strided kernel of kernels-hip/batched_matmul.hip.
//!
//! rocBLAS is column-major. A row-major logical matrix X (R x C, strides (sr, sc)) is a
//! column-major R x C matrix with `ld = sc` when `sr == 1` (op N), or the column-major
//! transpose with `ld = sr` when `sc == 1` (op T). `out = a . b` is computed either as
//! `out = a . b` (out column-major) or as `out^T = b^T . a^T` (out row-major, the usual
//! case). Anything else (no unit stride, a broadcast stride 0, sizes past i32) uses the
//! kernel.

use std::ffi::c_int;

use vt_core::{DType, Result};

use crate::launch::{kernels, KernelArgs, Launch, Step};
use crate::sys;

/// A strided operand of a batched matmul: element `[g, r, c]` is at
/// `addr + (g*s[0] + r*s[1] + c*s[2]) * element size`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operand {
    pub addr: u64,
    pub s: [i64; 3],
}

impl Operand {
    /// The same memory with each batch entry transposed.
    fn t(self) -> Operand {
        Operand { addr: self.addr, s: [self.s[0], self.s[2], self.s[1]] }
    }
}

/// One `rocblas_gemm_strided_batched_ex` call (C = D, alpha = 1, beta = 0, f32 compute).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RocblasGemm {
    pub trans_a: c_int,
    pub trans_b: c_int,
    pub m: c_int,
    pub n: c_int,
    pub k: c_int,
    pub a: u64,
    pub lda: c_int,
    pub stride_a: i64,
    pub b: u64,
    pub ldb: c_int,
    pub stride_b: i64,
    pub c: u64,
    pub ldc: c_int,
    pub stride_c: i64,
    pub batch: c_int,
    pub dtype: c_int,
}

/// How a logical `rows x cols` matrix with strides `(sr, sc)` is passed to BLAS: op N with
/// `ld` (column-major as is) or op T with `ld` (row-major, i.e. the column-major transpose).
/// `None` when neither stride is 1 or the leading dimension would overlap columns.
fn blas_layout(rows: i64, cols: i64, sr: i64, sc: i64) -> Option<(c_int, i64)> {
    if sr == 1 || rows == 1 {
        let ld = if cols == 1 { rows.max(1) } else { sc };
        if ld >= rows.max(1) {
            return Some((sys::ROCBLAS_OPERATION_NONE, ld));
        }
    }
    if sc == 1 || cols == 1 {
        let ld = if rows == 1 { cols.max(1) } else { sr };
        if ld >= cols.max(1) {
            return Some((sys::ROCBLAS_OPERATION_TRANSPOSE, ld));
        }
    }
    None
}

fn blas_dtype(dtype: DType) -> Option<c_int> {
    match dtype {
        DType::F32 => Some(sys::ROCBLAS_DATATYPE_F32_R),
        DType::F16 => Some(sys::ROCBLAS_DATATYPE_F16_R),
        DType::BF16 => Some(sys::ROCBLAS_DATATYPE_BF16_R),
        _ => None,
    }
}

fn int(v: i64) -> Option<c_int> {
    c_int::try_from(v).ok()
}

/// The rocBLAS call computing `out[g] = a[g] . b[g]` (`a` `[G,M,K]`, `b` `[G,K,N]`), if the
/// layouts allow one.
pub(crate) fn rocblas_call(
    dtype: DType,
    out: Operand,
    a: Operand,
    b: Operand,
    dims: [i64; 4],
) -> Option<RocblasGemm> {
    let [g, m, n, k] = dims;
    let dt = blas_dtype(dtype)?;
    let batch_stride = |s: i64| if g == 1 { 0 } else { s };
    // `c (p x q) = x (p x k) . y (k x q)` with `c` column-major.
    let column_major = |p: i64, q: i64, c: Operand, x: Operand, y: Operand| -> Option<RocblasGemm> {
        let (tc, ldc) = blas_layout(p, q, c.s[1], c.s[2])?;
        if tc != sys::ROCBLAS_OPERATION_NONE {
            return None;
        }
        let (ta, lda) = blas_layout(p, k, x.s[1], x.s[2])?;
        let (tb, ldb) = blas_layout(k, q, y.s[1], y.s[2])?;
        Some(RocblasGemm {
            trans_a: ta,
            trans_b: tb,
            m: int(p)?,
            n: int(q)?,
            k: int(k)?,
            a: x.addr,
            lda: int(lda)?,
            stride_a: batch_stride(x.s[0]),
            b: y.addr,
            ldb: int(ldb)?,
            stride_b: batch_stride(y.s[0]),
            c: c.addr,
            ldc: int(ldc)?,
            stride_c: batch_stride(c.s[0]),
            batch: int(g)?,
            dtype: dt,
        })
    };
    // out row-major: out^T (N x M) = b^T (N x K) . a^T (K x M), all column-major; else out
    // column-major: out (M x N) = a (M x K) . b (K x N).
    column_major(n, m, out.t(), b.t(), a.t()).or_else(|| column_major(m, n, out, a, b))
}

/// The steps computing `out[g] = a[g] . b[g]`: rocBLAS when `blas` is available and the
/// layouts fit (and K > 0, where BLAS would only scale C), else the kernel.
pub(crate) fn plan(
    dtype: DType,
    out: Operand,
    a: Operand,
    b: Operand,
    dims: [i64; 4],
    blas: bool,
) -> Result<Vec<Step>> {
    let [g, m, n, k] = dims;
    if g == 0 || m == 0 || n == 0 {
        return Ok(Vec::new());
    }
    if blas && k > 0 {
        if let Some(call) = rocblas_call(dtype, out, a, b, dims) {
            return Ok(vec![Step::Gemm(call)]);
        }
    }
    let tiles = |x: i64| (x + 15) / 16;
    let args = KernelArgs::new()
        .ptr(out.addr)
        .i64s(&out.s)
        .ptr(a.addr)
        .i64s(&a.s)
        .ptr(b.addr)
        .i64s(&b.s)
        .i64s(&[g, m, n, k]);
    Ok(kernels([Launch::new("batched_matmul", "batched_matmul.hip", dtype, g * tiles(m) * tiles(n), args)?]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What rocBLAS computes for `g`, on host memory where an address is 4 * element
    /// index: `C = op(A) . op(B)`, column-major, per batch.
    fn emulate(g: &RocblasGemm, mem: &mut [f64]) {
        let idx = |addr: u64| (addr / 4) as i64;
        for batch in 0..g.batch as i64 {
            for i in 0..g.m as i64 {
                for j in 0..g.n as i64 {
                    let mut acc = 0.0;
                    for l in 0..g.k as i64 {
                        let a = idx(g.a)
                            + batch * g.stride_a
                            + if g.trans_a == sys::ROCBLAS_OPERATION_NONE {
                                i + l * g.lda as i64
                            } else {
                                l + i * g.lda as i64
                            };
                        let b = idx(g.b)
                            + batch * g.stride_b
                            + if g.trans_b == sys::ROCBLAS_OPERATION_NONE {
                                l + j * g.ldb as i64
                            } else {
                                j + l * g.ldb as i64
                            };
                        acc += mem[a as usize] * mem[b as usize];
                    }
                    mem[(idx(g.c) + batch * g.stride_c + i + j * g.ldc as i64) as usize] = acc;
                }
            }
        }
    }

    /// Strides of a `[d0, d1, d2]` tensor stored with its dims in `order` (outermost first),
    /// each dim padded by `pad` elements.
    fn strides(dims: [i64; 3], order: [usize; 3], pad: i64) -> [i64; 3] {
        let mut s = [0i64; 3];
        let mut acc = 1;
        for &d in order.iter().rev() {
            s[d] = acc;
            acc *= dims[d] + pad;
        }
        s
    }

    fn value(i: i64) -> f64 {
        ((i * 7919) % 23) as f64 - 11.0
    }

    #[test]
    fn rocblas_layouts_compute_the_row_major_product() {
        let (g, m, n, k) = (2i64, 3i64, 4i64, 5i64);
        // Every order keeps a unit stride on one of the last two dims (the batch dim may be
        // innermost or in the middle), so every combination must go through rocBLAS.
        let orders = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [2, 0, 1]];
        let mut checked = 0;
        for ao in orders {
            for bo in orders {
                for oo in orders {
                    for pad in [0, 2] {
                        let sa = strides([g, m, k], ao, pad);
                        let sb = strides([g, k, n], bo, pad);
                        let so = strides([g, m, n], oo, pad);
                        let (a0, b0, o0) = (0i64, 1000i64, 2000i64);
                        let a = Operand { addr: a0 as u64 * 4, s: sa };
                        let b = Operand { addr: b0 as u64 * 4, s: sb };
                        let out = Operand { addr: o0 as u64 * 4, s: so };
                        let call = rocblas_call(DType::F32, out, a, b, [g, m, n, k])
                            .unwrap_or_else(|| panic!("no BLAS call for {sa:?} {sb:?} {so:?}"));
                        let mut mem: Vec<f64> = (0..3000).map(value).collect();
                        emulate(&call, &mut mem);
                        for gi in 0..g {
                            for i in 0..m {
                                for j in 0..n {
                                    let want: f64 = (0..k)
                                        .map(|l| {
                                            mem[(a0 + gi * sa[0] + i * sa[1] + l * sa[2]) as usize]
                                                * mem[(b0 + gi * sb[0] + l * sb[1] + j * sb[2]) as usize]
                                        })
                                        .sum();
                                    let got = mem[(o0 + gi * so[0] + i * so[1] + j * so[2]) as usize];
                                    assert_eq!(got, want, "{call:?} at [{gi},{i},{j}]");
                                }
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 4 * 4 * 4 * 2);
    }

    #[test]
    fn broadcast_or_unit_free_operands_fall_back_to_the_kernel() {
        let out = Operand { addr: 0, s: [12, 4, 1] };
        let ok = Operand { addr: 4096, s: [20, 5, 1] };
        // b broadcast over its rows (stride 0) cannot be a BLAS matrix.
        let bcast = Operand { addr: 8192, s: [0, 0, 1] };
        assert!(rocblas_call(DType::BF16, out, ok, bcast, [2, 3, 4, 5]).is_none());
        let steps = plan(DType::BF16, out, ok, bcast, [2, 3, 4, 5], true).unwrap();
        assert!(matches!(&steps[..], [Step::Kernel(l)] if l.kernel == "batched_matmul_bf16"));
        // No unit stride on a's last two dims.
        let strided = Operand { addr: 8192, s: [40, 10, 2] };
        assert!(rocblas_call(DType::F16, out, strided, ok, [2, 3, 4, 5]).is_none());
        // K = 0 goes to the kernel, which writes zeros (BLAS would only scale C by beta).
        let steps = plan(DType::F32, out, ok, ok, [1, 3, 4, 0], true).unwrap();
        assert!(matches!(&steps[..], [Step::Kernel(_)]));
        // Empty output: nothing to do.
        assert!(plan(DType::F32, out, ok, ok, [1, 0, 4, 5], true).unwrap().is_empty());
    }
}
