use crate::registry::dispatch;
use crate::validate::{check_cu_seqlens, host_ints, Check};
use crate::{DType, OpId, Queue, Result, Tensor};

/// Arguments of [`prefill_attention`].
#[derive(Clone, Copy, Debug)]
pub struct PrefillAttentionArgs<'a> {
    pub out: Tensor<'a>,
    pub lse: Option<Tensor<'a>>,
    pub query: Tensor<'a>,
    pub k: Tensor<'a>,
    pub v: Tensor<'a>,
    pub cu_seqlens_q: Tensor<'a>,
    pub cu_seqlens_k: Tensor<'a>,
    pub max_seqlen_q: i64,
    pub causal: bool,
    pub scale: f32,
}

/// Variable-length multi-head attention (flash-attn's varlen form).
///
/// Sequence b owns query rows `cu_seqlens_q[b] .. cu_seqlens_q[b+1]` (length `lq`) and
/// key rows `cu_seqlens_k[b] .. cu_seqlens_k[b+1]` (length `lk`). Non-causal: every
/// query sees all `lk` keys. Causal (bottom-right): query i sees keys `0 ..= lk - lq + i`
/// (none if that is negative).
///
/// - `query` `[Tq,N,D]`, `k` `[Tk,N,D]`, `v` `[Tk,N,Dv]`, `out` `[Tq,N,Dv]`; one float dtype; stride
///   1 on the last dim of each, any other strides (`k`/`v` may be column slices of one
///   up-projection output).
/// - `lse` (optional) `[N, Tq]` f32, natural log of the softmax denominator (scaled
///   logits). A query that sees no key gets `out = 0`, `lse = -inf`.
/// - `cu_seqlens_q`, `cu_seqlens_k` `[B+1]` i32: start at 0, nondecreasing, end at most at
///   Tq / Tk. Rows past `cu_seqlens_q[B]` are untouched. `max_seqlen_q` >= every `lq`
///   (GPU grids are sized from it without reading lengths back).
/// - `scale` finite and > 0. Outputs must not overlap each other or any input.
pub fn prefill_attention(q: &Queue, args: &PrefillAttentionArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, PrefillAttention, args)
}

fn validate(queue: &Queue, a: &PrefillAttentionArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::PrefillAttention, queue.device());
    c.float("query", &a.query, 3)?;
    c.float("k", &a.k, 3)?;
    c.float("v", &a.v, 3)?;
    c.float("out", &a.out, 3)?;
    let dt = a.query.dtype();
    for (name, x) in [("k", &a.k), ("v", &a.v), ("out", &a.out)] {
        c.same_dtype(name, x, dt)?;
    }
    let (tq, n, d) = (a.query.dim(0), a.query.dim(1), a.query.dim(2));
    let tk = a.k.dim(0);
    c.dim("k", &a.k, 1, n, "query's N")?;
    c.dim("k", &a.k, 2, d, "query's D")?;
    c.dim("v", &a.v, 0, tk, "k's Tk")?;
    c.dim("v", &a.v, 1, n, "query's N")?;
    let dv = a.v.dim(2);
    c.dim("out", &a.out, 0, tq, "query's Tq")?;
    c.dim("out", &a.out, 1, n, "query's N")?;
    c.dim("out", &a.out, 2, dv, "v's Dv")?;
    for (name, x) in [("query", &a.query), ("k", &a.k), ("v", &a.v), ("out", &a.out)] {
        c.unit_inner(name, x)?;
    }
    c.output("out", &a.out)?;
    for (name, x) in [("query", &a.query), ("k", &a.k), ("v", &a.v)] {
        c.disjoint("out", &a.out, name, x)?;
    }
    if let Some(l) = &a.lse {
        c.typed("lse", l, 2, DType::F32)?;
        c.dim("lse", l, 0, n, "query's N")?;
        c.dim("lse", l, 1, tq, "query's Tq")?;
        c.output("lse", l)?;
        for (name, x) in [("out", &a.out), ("query", &a.query), ("k", &a.k), ("v", &a.v)] {
            c.disjoint("lse", l, name, x)?;
        }
    }
    c.positive_finite("scale", a.scale)?;
    c.typed("cu_seqlens_q", &a.cu_seqlens_q, 1, DType::I32)?;
    c.typed("cu_seqlens_k", &a.cu_seqlens_k, 1, DType::I32)?;
    let b = a.cu_seqlens_q.dim(0) - 1;
    if b < 0 {
        return Err(c.err("cu_seqlens_q", "must hold at least one entry (B+1 with B >= 0)"));
    }
    c.dim("cu_seqlens_k", &a.cu_seqlens_k, 0, b + 1, "cu_seqlens_q's B+1")?;
    for (name, x) in [("cu_seqlens_q", &a.cu_seqlens_q), ("cu_seqlens_k", &a.cu_seqlens_k)] {
        c.disjoint("out", &a.out, name, x)?;
        if let Some(l) = &a.lse {
            c.disjoint("lse", l, name, x)?;
        }
    }
    check_cu_seqlens(&c, "cu_seqlens_q", &a.cu_seqlens_q, tq)?;
    check_cu_seqlens(&c, "cu_seqlens_k", &a.cu_seqlens_k, tk)?;
    if a.max_seqlen_q < 0 {
        return Err(c.err("max_seqlen_q", format!("is negative ({})", a.max_seqlen_q)));
    }
    if let Some(cu) = host_ints(&c, "cu_seqlens_q", &a.cu_seqlens_q)? {
        if let Some(i) = cu.windows(2).position(|w| w[1] - w[0] > a.max_seqlen_q) {
            return Err(c.err(
                "max_seqlen_q",
                format!("{} is less than sequence {i}'s {} query rows", a.max_seqlen_q, cu[i + 1] - cu[i]),
            ));
        }
    }
    Ok(())
}
