use crate::registry::dispatch;
use crate::validate::{host_ints, Check};
use crate::{DType, OpId, Queue, Result, Tensor};

use super::gather_mla_cache::check_block_table_rows;

/// Arguments of [`indexer_top_k`].
#[derive(Clone, Copy, Debug)]
pub struct IndexerTopKArgs<'a> {
    /// The selected cache slots `[T, topk]` i32.
    pub out: Tensor<'a>,
    /// The indexer query `[T, H, Di]`.
    pub query: Tensor<'a>,
    pub weights: Tensor<'a>,
    pub cache: Tensor<'a>,
    pub block_table: Tensor<'a>,
    pub seq_ids: Tensor<'a>,
    pub positions: Tensor<'a>,
    pub scale: f32,
}

/// DeepSeek-V3.2's lightning indexer: scores every token a query may see in the paged
/// indexer key cache and returns the `topk` best as cache slots, the indices
/// SparseMlaAttention takes.
///
/// Query t belongs to sequence `b = seq_ids[t]` and sees that sequence's tokens
/// `j = 0 ..= positions[t]` (causal: its own key is already in the cache), token j's key
/// being `k[j] = cache[block_table[b, j / BS], j % BS, :]`. Its score is
/// `score(t, j) = scale * sum_h weights[t, h] * relu(query[t, h] . k[j])`
/// (f32 products and sums), and `out[t]` lists the slots `block_table[b, j / BS] * BS + j % BS`
/// of the `topk` highest-scoring visible tokens, highest first, equal scores in increasing
/// token position j. A query that sees fewer than `topk` tokens gets all of them, then -1;
/// a query with a negative position sees no token (a padding row: all -1).
///
/// - `query` `[T, H, Di]` (DeepSeek: H = 64, Di = 128), `cache` `[NB, BS, Di]`; one float
///   dtype (bf16, f16, f32); stride 1 on the last dim of each, other strides free.
/// - `weights` `[T, H]` in the query's dtype or f32, any strides: the per-head weights with
///   everything but `scale` folded in (DeepSeek: `weights_proj(x) * H^-0.5`).
/// - `scale` finite and > 0 (DeepSeek: `Di^-0.5`, the indexer's `softmax_scale`; since
///   `relu(s x) = s relu(x)` for `s > 0`, scaling inside or outside the relu is the same).
/// - `block_table` `[B, MB]` i32; `seq_ids` `[T]` i32 in `0..B`; `positions` `[T]` i32 or
///   i64 (the block's rotary positions), `< MB * BS`. On the CPU a position's blocks must
///   be mapped into the cache (as MlaDecodeAttention's sequences); GPU kernels will skip an
///   out-of-range block id or sequence and write -1 where nothing valid remains.
/// - `out` `[T, topk]` i32, `topk >= 1`, any strides; it must not overlap any input.
///
/// Across backends: the selection is a function of the f32 scores, so it is identical
/// wherever the scores are. CUDA's tensor-core score kernel (bf16/f16, Di a multiple of 16,
/// 16-byte aligned rows) sums the products in another order than the CPU (per mma tile, f32
/// accumulation), so its scores may differ from the CPU's in the last bits and two tokens
/// whose scores are that close may trade places (in the order, or at the k-th place); where
/// every partial sum is exact in f32 (e.g. values on a coarse grid such as multiples of 1/8,
/// what the parity cases use) it selects exactly as the CPU does. CUDA's generic kernel (other
/// dtypes and dims) sums in the CPU's order and selects identically. With non-finite inputs
/// the order of NaN scores is unspecified on GPUs (their NaN bits differ from the CPU's).
///
/// What the block does around it (transformers' `DeepseekV32Indexer`): `query` is
/// `wq_b(q_resid)` viewed `[T, 64, 128]` with the half-split (non-interleaved) rope applied
/// to its first 64 dims; each key is `LayerNorm(wk(x))` (LayerNorm with weight and bias,
/// eps 1e-6) with the same rope on its first 64 dims, written into `cache` by slot; the
/// weights are `weights_proj(x) * 64^-0.5`. DeepSeek's reference also applies a Hadamard
/// rotation to q and k and quantizes both to fp8: the rotation preserves dot products and
/// is left out, as transformers does; this op reads an unquantized cache. Decode is
/// `seq_ids[b] = b`, `positions[b] = seq_lens[b] - 1`; the indices address the MLA latent
/// cache when it is paged with the same block table and block size.
pub fn indexer_top_k(q: &Queue, args: &IndexerTopKArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, IndexerTopK, args)
}

fn validate(queue: &Queue, a: &IndexerTopKArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::IndexerTopK, queue.device());
    c.float("query", &a.query, 3)?;
    c.float("cache", &a.cache, 3)?;
    let dt = a.query.dtype();
    c.same_dtype("cache", &a.cache, dt)?;
    c.float("weights", &a.weights, 2)?;
    if a.weights.dtype() != dt && a.weights.dtype() != DType::F32 {
        return Err(
            c.err("weights", format!("dtype is {}, expected {dt} (query's) or f32", a.weights.dtype()))
        );
    }
    let (t, h, di) = (a.query.dim(0), a.query.dim(1), a.query.dim(2));
    c.dim("cache", &a.cache, 2, di, "query's head dim Di")?;
    c.block_size("cache", &a.cache)?;
    c.dim("weights", &a.weights, 0, t, "query's T")?;
    c.dim("weights", &a.weights, 1, h, "query's H")?;
    c.unit_inner("query", &a.query)?;
    c.unit_inner("cache", &a.cache)?;
    c.typed("out", &a.out, 2, DType::I32)?;
    c.dim("out", &a.out, 0, t, "query's T")?;
    if a.out.dim(1) < 1 {
        return Err(c.err("out", format!("topk (dim 1) must be >= 1, shape {:?}", a.out.shape())));
    }
    c.typed("block_table", &a.block_table, 2, DType::I32)?;
    c.typed("seq_ids", &a.seq_ids, 1, DType::I32)?;
    c.dim("seq_ids", &a.seq_ids, 0, t, "query's T")?;
    c.rank("positions", &a.positions, 1)?;
    c.on_device("positions", &a.positions)?;
    if !matches!(a.positions.dtype(), DType::I32 | DType::I64) {
        return Err(c.err("positions", format!("dtype is {}, expected i32 or i64", a.positions.dtype())));
    }
    c.dim("positions", &a.positions, 0, t, "query's T")?;
    c.positive_finite("scale", a.scale)?;
    c.output("out", &a.out)?;
    for (name, x) in [
        ("query", &a.query),
        ("weights", &a.weights),
        ("cache", &a.cache),
        ("block_table", &a.block_table),
        ("seq_ids", &a.seq_ids),
        ("positions", &a.positions),
    ] {
        c.disjoint("out", &a.out, name, x)?;
    }
    let (Some(seqs), Some(pos), Some(bt)) = (
        host_ints(&c, "seq_ids", &a.seq_ids)?,
        host_ints(&c, "positions", &a.positions)?,
        host_ints(&c, "block_table", &a.block_table)?,
    ) else {
        return Ok(());
    };
    let nseq = a.block_table.dim(0);
    let capacity = a.block_table.dim(1).saturating_mul(a.cache.dim(1));
    for (i, (&s, &p)) in seqs.iter().zip(&pos).enumerate() {
        if p < 0 {
            continue;
        }
        if s < 0 || s >= nseq {
            return Err(
                c.err("seq_ids", format!("seq_ids[{i}] = {s} is outside the block table's 0..{nseq}"))
            );
        }
        if p >= capacity {
            return Err(c.err(
                "positions",
                format!("positions[{i}] = {p} is past what the block table holds (MB * BS = {capacity})"),
            ));
        }
        check_block_table_rows(&c, &bt, &a.block_table, &a.cache, s as usize, 0, p + 1)?;
    }
    Ok(())
}
