use crate::registry::dispatch;
use crate::validate::{check_cu_seqlens, host_ints, Check};
use crate::{fp8_ds_mla, DType, OpId, Queue, Result, Tensor};

/// Arguments of [`gather_mla_cache`].
#[derive(Clone, Copy, Debug)]
pub struct GatherMlaCacheArgs<'a> {
    pub out: Tensor<'a>,
    pub cache: Tensor<'a>,
    pub block_table: Tensor<'a>,
    pub cu_seq_lens: Tensor<'a>,
    pub seq_starts: Option<Tensor<'a>>,
}

/// Copies cached context rows of B sequences into a contiguous workspace.
///
/// Sequence b owns output rows `cu_seq_lens[b] .. cu_seq_lens[b+1]`; its row j is the
/// cached token at logical position `p = seq_starts[b] + j` (`seq_starts` defaults to
/// 0; chunked-context prefill passes each chunk's start), i.e.
/// `out[cu[b] + j] = cache[block_table[b, p / BS], p % BS, :]`.
///
/// - `out` `[T_ws, D]` with stride 1 on D (rows past `cu_seq_lens[B]` are untouched),
///   `cache` `[NB,BS,D]` (stride 1 on D); one float dtype.
/// - Or an fp8 cache: `cache` `[NB,BS,656]` of [`DType::Fp8DsMla`] and `out` `[T_ws, 576]`
///   in any float dtype (the 16-bit prefill workspace): each row is dequantized,
///   [`fp8_ds_mla::decode_row`](crate::fp8_ds_mla::decode_row) (`e4m3(code) * scale` in
///   f32, rope bf16), then rounded once to `out`'s dtype.
/// - `block_table` `[B, MB]` i32, `cu_seq_lens` `[B+1]` i32 (0, nondecreasing, last <=
///   T_ws), `seq_starts` `[B]` i32 >= 0.
/// - Errors (CPU): a position past the block table (`p / BS >= MB`) or a block id outside
///   `0..NB`. GPU kernels skip such rows.
pub fn gather_mla_cache(q: &Queue, args: &GatherMlaCacheArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, GatherMlaCache, args)
}

fn validate(q: &Queue, a: &GatherMlaCacheArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::GatherMlaCache, q.device());
    c.float("out", &a.out, 2)?;
    if c.fp8_mla_cache("cache", &a.cache)? {
        c.dim("out", &a.out, 1, fp8_ds_mla::DECODED as i64, "the fp8_ds_mla decoded row width")?;
    } else {
        c.float("cache", &a.cache, 3)?;
        c.same_dtype("out", &a.out, a.cache.dtype())?;
        c.dim("out", &a.out, 1, a.cache.dim(2), "the cache row width")?;
    }
    c.block_size("cache", &a.cache)?;
    c.unit_inner("out", &a.out)?;
    c.unit_inner("cache", &a.cache)?;
    c.output("out", &a.out)?;
    c.disjoint("out", &a.out, "cache", &a.cache)?;
    c.typed("block_table", &a.block_table, 2, DType::I32)?;
    let b = a.block_table.dim(0);
    c.typed("cu_seq_lens", &a.cu_seq_lens, 1, DType::I32)?;
    c.dim("cu_seq_lens", &a.cu_seq_lens, 0, b + 1, "block_table's B + 1")?;
    check_cu_seqlens(&c, "cu_seq_lens", &a.cu_seq_lens, a.out.dim(0))?;
    if let Some(s) = &a.seq_starts {
        c.typed("seq_starts", s, 1, DType::I32)?;
        c.dim("seq_starts", s, 0, b, "block_table's B")?;
        c.disjoint("out", &a.out, "seq_starts", s)?;
    }
    c.disjoint("out", &a.out, "block_table", &a.block_table)?;
    c.disjoint("out", &a.out, "cu_seq_lens", &a.cu_seq_lens)?;
    let (Some(cu), Some(bt)) =
        (host_ints(&c, "cu_seq_lens", &a.cu_seq_lens)?, host_ints(&c, "block_table", &a.block_table)?)
    else {
        return Ok(());
    };
    let starts = match &a.seq_starts {
        Some(s) => host_ints(&c, "seq_starts", s)?.unwrap_or_default(),
        None => vec![0; b as usize],
    };
    for i in 0..b as usize {
        if starts[i] < 0 {
            return Err(c.err("seq_starts", format!("seq_starts[{i}] = {} is negative", starts[i])));
        }
        let len = cu[i + 1] - cu[i];
        check_block_table_rows(&c, &bt, &a.block_table, &a.cache, i, starts[i], starts[i] + len)?;
    }
    Ok(())
}

/// Every position `p` in `from..to` of sequence `b` maps through the block table to a
/// block inside the cache. Shared with MlaDecodeAttention.
pub(crate) fn check_block_table_rows(
    c: &Check,
    bt: &[i64],
    block_table: &Tensor<'_>,
    cache: &Tensor<'_>,
    b: usize,
    from: i64,
    to: i64,
) -> Result<()> {
    if to <= from {
        return Ok(());
    }
    let (mb, bs, nb) = (block_table.dim(1), cache.dim(1), cache.dim(0));
    let last_block = (to - 1) / bs;
    if last_block >= mb {
        return Err(c.err(
            "block_table",
            format!("sequence {b} needs position {} (block {last_block}) but the table has {mb} blocks per sequence", to - 1),
        ));
    }
    for blk in from / bs..=last_block {
        let id = bt[b * mb as usize + blk as usize];
        if id < 0 || id >= nb {
            return Err(c.err(
                "block_table",
                format!("block_table[{b}, {blk}] = {id} is outside the cache's 0..{nb}"),
            ));
        }
    }
    Ok(())
}
