use crate::registry::dispatch;
use crate::validate::{host_ints, Check};
use crate::{fp8_ds_mla, DType, OpId, Queue, Result, Tensor};

use super::gather_mla_cache::check_block_table_rows;

/// Arguments of [`mla_decode_attention`].
#[derive(Clone, Copy, Debug)]
pub struct MlaDecodeAttentionArgs<'a> {
    pub out: Tensor<'a>,
    pub lse: Option<Tensor<'a>>,
    /// The query `[B, s_q, N, D]`.
    pub query: Tensor<'a>,
    pub cache: Tensor<'a>,
    pub block_table: Tensor<'a>,
    pub seq_lens: Tensor<'a>,
    pub scale: f32,
}

/// Absorbed MQA decode attention over the paged latent cache (one KV head shared by all
/// query heads), with `s_q` query tokens per sequence (1 for plain decode, more for
/// speculative decoding).
///
/// For sequence b with `len = seq_lens[b]` cached tokens (the `s_q` new ones included),
/// query token s sees keys `0 .. len - s_q + s + 1` (causal, bottom-right aligned):
/// `K[j] = cache[block_table[b, j / BS], j % BS, :D]`, `V[j] = K[j][:Dv]`,
/// `p = softmax(scale * query . K)`, `out = p . V`, `lse = ln(sum(exp(scale * query . K)))`.
///
/// - `query` `[B, s_q, N, D]`, `cache` `[NB, BS, D]`, `out` `[B, s_q, N, Dv]` with `Dv <= D`
///   (MLA: D = kv_lora_rank + rope dim = 576, Dv = kv_lora_rank = 512); one float dtype;
///   stride 1 on the last dim of each.
/// - Or an fp8 cache: `cache` `[NB, BS, 656]` of [`DType::Fp8DsMla`] with D = 576: the
///   keys are the rows dequantized by
///   [`fp8_ds_mla::decode_row`](crate::fp8_ds_mla::decode_row) (f32 values, not rounded to
///   the query's dtype), so a backend attends over exactly the values the CPU does.
/// - `lse` (optional) `[B, N, s_q]` f32, natural log.
/// - `block_table` `[B, MB]` i32, `seq_lens` `[B]` i32 with `0 <= seq_lens[b] <= MB * BS`.
/// - A query that sees no key (empty sequence) gets `out = 0` and `lse = -inf`.
/// - `scale` finite and > 0. `out` and `lse` must not overlap each other or any input.
pub fn mla_decode_attention(q: &Queue, args: &MlaDecodeAttentionArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, MlaDecodeAttention, args)
}

fn validate(queue: &Queue, a: &MlaDecodeAttentionArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::MlaDecodeAttention, queue.device());
    c.float("query", &a.query, 4)?;
    let fp8 = c.fp8_mla_cache("cache", &a.cache)?;
    if !fp8 {
        c.float("cache", &a.cache, 3)?;
    }
    c.float("out", &a.out, 4)?;
    let dt = a.query.dtype();
    if !fp8 {
        c.same_dtype("cache", &a.cache, dt)?;
    }
    c.same_dtype("out", &a.out, dt)?;
    let (b, sq, n, d) = (a.query.dim(0), a.query.dim(1), a.query.dim(2), a.query.dim(3));
    if fp8 {
        c.dim("query", &a.query, 3, fp8_ds_mla::DECODED as i64, "the fp8_ds_mla decoded row width")?;
    } else {
        c.dim("cache", &a.cache, 2, d, "query's head dim D")?;
    }
    c.block_size("cache", &a.cache)?;
    c.dim("out", &a.out, 0, b, "query's B")?;
    c.dim("out", &a.out, 1, sq, "query's s_q")?;
    c.dim("out", &a.out, 2, n, "query's N")?;
    let dv = a.out.dim(3);
    if dv > d || dv <= 0 {
        return Err(c.err("out", format!("value dim {dv} must be in 1..={d} (query's head dim)")));
    }
    for (name, x) in [("query", &a.query), ("cache", &a.cache), ("out", &a.out)] {
        c.unit_inner(name, x)?;
    }
    c.output("out", &a.out)?;
    c.disjoint("out", &a.out, "query", &a.query)?;
    c.disjoint("out", &a.out, "cache", &a.cache)?;
    if let Some(l) = &a.lse {
        c.typed("lse", l, 3, DType::F32)?;
        c.dim("lse", l, 0, b, "query's B")?;
        c.dim("lse", l, 1, n, "query's N")?;
        c.dim("lse", l, 2, sq, "query's s_q")?;
        c.output("lse", l)?;
        for (name, x) in [("out", &a.out), ("query", &a.query), ("cache", &a.cache)] {
            c.disjoint("lse", l, name, x)?;
        }
    }
    c.positive_finite("scale", a.scale)?;
    c.typed("block_table", &a.block_table, 2, DType::I32)?;
    c.dim("block_table", &a.block_table, 0, b, "query's B")?;
    c.typed("seq_lens", &a.seq_lens, 1, DType::I32)?;
    c.dim("seq_lens", &a.seq_lens, 0, b, "query's B")?;
    for (name, x) in [("block_table", &a.block_table), ("seq_lens", &a.seq_lens)] {
        c.disjoint("out", &a.out, name, x)?;
        if let Some(l) = &a.lse {
            c.disjoint("lse", l, name, x)?;
        }
    }
    let (Some(lens), Some(bt)) =
        (host_ints(&c, "seq_lens", &a.seq_lens)?, host_ints(&c, "block_table", &a.block_table)?)
    else {
        return Ok(());
    };
    for (i, &len) in lens.iter().enumerate() {
        if len < 0 {
            return Err(c.err("seq_lens", format!("seq_lens[{i}] = {len} is negative")));
        }
        // Two tensors' dims: their product may exceed i64 (a stride-0 block table).
        let capacity = a.block_table.dim(1).saturating_mul(a.cache.dim(1));
        if len > capacity {
            return Err(c.err(
                "seq_lens",
                format!("seq_lens[{i}] = {len} is more than the block table holds (MB * BS = {capacity})"),
            ));
        }
        check_block_table_rows(&c, &bt, &a.block_table, &a.cache, i, 0, len)?;
    }
    Ok(())
}
