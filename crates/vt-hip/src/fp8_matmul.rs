//! The block-scaled fp8 ops (`kernels-hip/fp8_matmul.hip`): QuantizeFp8 a thread per
//! (row, 128-group); MatmulBTFp8 and BatchedMatmulFp8 one batched problem
//! `out[g] = A[g] . W[g]` over logical views (MatmulBTFp8 as a batch of one with `b` and its
//! scales read transposed), a thread per output. Simple kernels, no tensor cores (compiled,
//! never run on AMD hardware).

use vt_core::fp8_block::blocks;
use vt_core::{BatchedMatmulFp8Args, MatmulBTFp8Args, OpId, QuantizeFp8Args, Queue, Result, Tensor};

use crate::backend::HipQueue;
use crate::launch::{blocks_for_threads, kernels, KernelArgs, Launch, Step};

const FILE: &str = "fp8_matmul.hip";

/// A view's address and strides in the logical `[g, rows, cols]` order.
type V3 = (u64, [i64; 3]);

fn batched(t: &Tensor<'_>) -> V3 {
    (t.data_addr(), [t.stride(0), t.stride(1), t.stride(2)])
}

fn matrix(t: &Tensor<'_>, transposed: bool) -> V3 {
    let s = if transposed { [0, t.stride(1), t.stride(0)] } else { [0, t.stride(0), t.stride(1)] };
    (t.data_addr(), s)
}

#[allow(clippy::too_many_arguments)]
fn plan_generic(
    out: &Tensor<'_>,
    o: V3,
    a: V3,
    a_scale: Option<V3>,
    b: V3,
    b_scale: V3,
    (g, m, n, k): (i64, i64, i64, i64),
) -> Result<Vec<Step>> {
    let mut args = KernelArgs::new();
    for (addr, s) in [o, a, a_scale.unwrap_or((0, [0; 3])), b, b_scale] {
        args = args.ptr(addr).i64s(&s);
    }
    let args = args.i64s(&[g, m, n, k]);
    let items = blocks_for_threads(g * m * n);
    Ok(kernels([Launch::new("fp8_matmul_generic", FILE, out.dtype(), items, args)?]))
}

pub(crate) fn plan_matmul_bt(x: &MatmulBTFp8Args<'_>) -> Result<Vec<Step>> {
    let dims = (1, x.a.dim(0), x.b.dim(0), x.a.dim(1));
    plan_generic(
        &x.out,
        matrix(&x.out, false),
        matrix(&x.a, false),
        x.a_scale.as_ref().map(|s| matrix(s, false)),
        matrix(&x.b, true),
        matrix(&x.b_scale, true),
        dims,
    )
}

pub(crate) fn plan_batched(x: &BatchedMatmulFp8Args<'_>) -> Result<Vec<Step>> {
    let dims = (x.a.dim(0), x.a.dim(1), x.b.dim(2), x.a.dim(2));
    plan_generic(
        &x.out,
        batched(&x.out),
        batched(&x.a),
        x.a_scale.as_ref().map(batched),
        batched(&x.b),
        batched(&x.b_scale),
        dims,
    )
}

pub(crate) fn plan_quantize(x: &QuantizeFp8Args<'_>) -> Result<Vec<Step>> {
    let (m, k) = (x.x.dim(0), x.x.dim(1));
    let args = KernelArgs::new()
        .tensor(&x.out)
        .i64(x.out.stride(0))
        .tensor(&x.scale)
        .i64s(&[x.scale.stride(0), x.scale.stride(1)])
        .tensor(&x.x)
        .i64s(&[x.x.stride(0), m, k]);
    let items = if k == 0 { 0 } else { blocks_for_threads(m * blocks(k)) };
    Ok(kernels([Launch::new("quantize_fp8", FILE, x.x.dtype(), items, args)?]))
}

pub(crate) fn run_matmul_bt(q: &Queue, x: &MatmulBTFp8Args<'_>) -> Result<()> {
    HipQueue::of(OpId::MatmulBTFp8, q)?.run(&plan_matmul_bt(x)?)
}

pub(crate) fn run_batched(q: &Queue, x: &BatchedMatmulFp8Args<'_>) -> Result<()> {
    HipQueue::of(OpId::BatchedMatmulFp8, q)?.run(&plan_batched(x)?)
}

pub(crate) fn run_quantize(q: &Queue, x: &QuantizeFp8Args<'_>) -> Result<()> {
    HipQueue::of(OpId::QuantizeFp8, q)?.run(&plan_quantize(x)?)
}
