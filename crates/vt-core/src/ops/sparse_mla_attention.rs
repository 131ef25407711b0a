use crate::registry::dispatch;
use crate::validate::{host_ints, Check};
use crate::{fp8_ds_mla, DType, OpId, Queue, Result, Tensor};

/// Arguments of [`sparse_mla_attention`].
#[derive(Clone, Copy, Debug)]
pub struct SparseMlaAttentionArgs<'a> {
    pub out: Tensor<'a>,
    pub lse: Option<Tensor<'a>>,
    /// The query `[T, N, D]`.
    pub query: Tensor<'a>,
    pub cache: Tensor<'a>,
    pub indices: Tensor<'a>,
    pub scale: f32,
}

/// Absorbed MQA attention of each query token over its own list of cache slots
/// (DeepSeek-V3.2's sparse MLA, FlashMLA's sparse form): one KV head shared by all query
/// heads, the keys of query t being the paged latent cache rows that `indices[t]` lists.
///
/// For query token t, with `S_t` the list `indices[t, 0 .. topk]` without its negative
/// entries: `K[s] = cache[s / BS, s % BS, :D]`, `V[s] = K[s][:Dv]`,
/// `p = softmax over s in S_t of scale * query[t, h] . K[s]`, `out[t, h] = sum p . V`,
/// `lse[h, t] = ln(sum over s in S_t of exp(scale * query[t, h] . K[s]))`.
///
/// - `query` `[T, N, D]`, `cache` `[NB, BS, D]`, `out` `[T, N, Dv]` with `1 <= Dv <= D`
///   (DeepSeek: D = kv_lora_rank + rope dim = 576, Dv = 512); one float dtype; stride 1 on
///   the last dim of each, other strides free (the cache may be a layer of a larger pool).
/// - Or an fp8 cache: `cache` `[NB, BS, 656]` of [`DType::Fp8DsMla`] with D = 576: the keys
///   are the rows dequantized by [`fp8_ds_mla::decode_row`](crate::fp8_ds_mla::decode_row)
///   (f32 values, not rounded to the query's dtype), as MlaDecodeAttention reads them.
/// - `indices` `[T, topk]` i32 (any strides, `topk >= 1`): cache slots
///   `block * BS + row`, the form IndexerTopK writes. A negative entry (-1 by convention)
///   is no key and is skipped. Entries need not be sorted, and a slot listed twice counts
///   twice (its key enters the softmax twice, as in FlashMLA, whose reference `ref.py`
///   gathers every listed index). A slot `>= NB * BS` is an error on the CPU; GPU kernels
///   will skip it like a negative one (FlashMLA masks both too).
/// - `lse` (optional) `[N, T]` f32, natural log, as PrefillAttention's (any strides, so
///   FlashMLA's `[T, N]` storage passes as its transposed view). A query with no valid
///   index gets `out = 0` and `lse = -inf`, as in vt's other attention ops and what
///   MergeAttnStates expects (FlashMLA reports `+inf` there).
/// - `scale` finite and > 0 (DeepSeek: `softmax_scale` of the 192-wide q/k head, mscale
///   included). `out` and `lse` must not overlap each other or any input.
///
/// The op is only the attention: the block computes the absorbed query (q_nope . W_UK
/// beside the roped q_pe), writes the cache (ConcatAndCacheMla), picks the slots
/// (IndexerTopK over the indexer's own key cache, whose slots are this cache's slots
/// when both are paged with one block table and block size) and up-projects `out`
/// (W_UV). Causality is the indices' business: the op attends to exactly the listed slots.
pub fn sparse_mla_attention(q: &Queue, args: &SparseMlaAttentionArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, SparseMlaAttention, args)
}

fn validate(queue: &Queue, a: &SparseMlaAttentionArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::SparseMlaAttention, queue.device());
    c.float("query", &a.query, 3)?;
    let fp8 = c.fp8_mla_cache("cache", &a.cache)?;
    if !fp8 {
        c.float("cache", &a.cache, 3)?;
    }
    c.float("out", &a.out, 3)?;
    let dt = a.query.dtype();
    if !fp8 {
        c.same_dtype("cache", &a.cache, dt)?;
    }
    c.same_dtype("out", &a.out, dt)?;
    let (t, n, d) = (a.query.dim(0), a.query.dim(1), a.query.dim(2));
    if fp8 {
        c.dim("query", &a.query, 2, fp8_ds_mla::DECODED as i64, "the fp8_ds_mla decoded row width")?;
    } else {
        c.dim("cache", &a.cache, 2, d, "query's head dim D")?;
    }
    c.block_size("cache", &a.cache)?;
    c.dim("out", &a.out, 0, t, "query's T")?;
    c.dim("out", &a.out, 1, n, "query's N")?;
    let dv = a.out.dim(2);
    if dv > d || dv <= 0 {
        return Err(c.err("out", format!("value dim {dv} must be in 1..={d} (query's head dim)")));
    }
    for (name, x) in [("query", &a.query), ("cache", &a.cache), ("out", &a.out)] {
        c.unit_inner(name, x)?;
    }
    c.typed("indices", &a.indices, 2, DType::I32)?;
    c.dim("indices", &a.indices, 0, t, "query's T")?;
    if a.indices.dim(1) < 1 {
        return Err(c.err("indices", format!("topk (dim 1) must be >= 1, shape {:?}", a.indices.shape())));
    }
    c.output("out", &a.out)?;
    for (name, x) in [("query", &a.query), ("cache", &a.cache), ("indices", &a.indices)] {
        c.disjoint("out", &a.out, name, x)?;
    }
    if let Some(l) = &a.lse {
        c.typed("lse", l, 2, DType::F32)?;
        c.dim("lse", l, 0, n, "query's N")?;
        c.dim("lse", l, 1, t, "query's T")?;
        c.output("lse", l)?;
        for (name, x) in [("out", &a.out), ("query", &a.query), ("cache", &a.cache), ("indices", &a.indices)]
        {
            c.disjoint("lse", l, name, x)?;
        }
    }
    c.positive_finite("scale", a.scale)?;
    if let Some(v) = host_ints(&c, "indices", &a.indices)? {
        let slots = a.cache.dim(0).saturating_mul(a.cache.dim(1));
        let topk = a.indices.dim(1).max(1) as usize;
        if let Some((i, s)) = v.iter().enumerate().find(|(_, &s)| s >= slots) {
            return Err(c.err(
                "indices",
                format!(
                    "indices[{}, {}] = {s} is past the cache's {slots} slots (NB * BS)",
                    i / topk,
                    i % topk
                ),
            ));
        }
    }
    Ok(())
}
