//! PrefillAttention: kernels-hip/prefill_attention.hip, one block per (sequence, query row
//! up to max_seqlen_q, head), online softmax over key tiles.

use vt_core::{OpId, PrefillAttentionArgs, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};
use crate::mla_decode_attention::attention_shared_bytes;

const OP: OpId = OpId::PrefillAttention;

pub(crate) fn plan(a: &PrefillAttentionArgs<'_>) -> Result<Vec<Step>> {
    let (tq, n, d) = (a.query.dim(0), a.query.dim(1), a.query.dim(2));
    let (tk, dv) = (a.k.dim(0), a.v.dim(2));
    let batch = a.cu_seqlens_q.dim(0) - 1;
    let shared = attention_shared_bytes(OP, "query", d, dv)?;
    let (o, q, k, v) = (&a.out, &a.query, &a.k, &a.v);
    let lse_strides = a.lse.map_or([0, 0], |l| [l.stride(0), l.stride(1)]);
    let args = KernelArgs::new()
        .tensor(o)
        .i64s(&[o.stride(0), o.stride(1)])
        .opt_tensor(a.lse.as_ref())
        .i64s(&lse_strides)
        .tensor(q)
        .i64s(&[q.stride(0), q.stride(1)])
        .tensor(k)
        .i64s(&[k.stride(0), k.stride(1)])
        .tensor(v)
        .i64s(&[v.stride(0), v.stride(1)])
        .tensor(&a.cu_seqlens_q)
        .i64(a.cu_seqlens_q.stride(0))
        .tensor(&a.cu_seqlens_k)
        .i64s(&[a.cu_seqlens_k.stride(0), batch, a.max_seqlen_q, tq, tk, n, d, dv])
        .i32(a.causal as i32)
        .f32(a.scale);
    let items = batch * a.max_seqlen_q * n;
    let launch = Launch::new("prefill_attention", "prefill_attention.hip", q.dtype(), items, args)?;
    Ok(kernels([launch.map(|l| l.with_shared_bytes(shared))]))
}

pub(crate) fn run(q: &Queue, a: &PrefillAttentionArgs<'_>) -> Result<()> {
    HipQueue::of(OP, q)?.run(&plan(a)?)
}
