//! Batch metadata of one mixed step: which of the step's tokens decode and which prefill,
//! where each token's latent goes in the paged cache, and how the cached context of the
//! prefill sequences is split into chunks that fit the gather workspace.
//!
//! Token order follows upstream: the decode tokens (one per decoding sequence) come first,
//! then the prefill tokens sequence by sequence. Everything here is host data; the block
//! uploads it into preallocated device buffers each step.

use vt_core::{Error, Result};

#[cfg(doc)]
use crate::kv_cache::PagedKvCache;
use crate::kv_cache::{BlockAllocator, SeqId};

const OP: &str = "MlaBatchMetadata";

/// One slice of the prefill sequences' cached context, gathered into the workspace at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContextChunk {
    /// `[B_p + 1]`: sequence b's rows of this chunk are `cu_seq_lens[b] .. cu_seq_lens[b+1]`.
    pub cu_seq_lens: Vec<i32>,
    /// `[B_p]`: the cache position of each sequence's first row in this chunk.
    pub seq_starts: Vec<i32>,
}

impl ContextChunk {
    /// Rows this chunk gathers (all sequences).
    pub fn tokens(&self) -> i64 {
        self.cu_seq_lens.last().copied().unwrap_or(0) as i64
    }
}

/// The metadata of one step (upstream's attention metadata for MLA, flattened).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MlaBatchMetadata {
    /// D: the first D tokens are decode tokens, one per decoding sequence.
    pub num_decode_tokens: i64,
    /// `[T]` rope position of every token (i64).
    pub positions: Vec<i64>,
    /// `[T]` cache slot of every token (`block * block_size + row`; < 0 skips the write).
    pub slot_mapping: Vec<i64>,
    /// Width of `decode_block_table`.
    pub decode_max_blocks: i64,
    /// `[D, decode_max_blocks]` block ids of the decoding sequences (unused entries 0).
    pub decode_block_table: Vec<i32>,
    /// `[D]` cached tokens of each decoding sequence, its new token included (0 for a
    /// padding row, whose slot is < 0: it writes nothing and reads nothing).
    pub decode_seq_lens: Vec<i32>,
    /// `[B_p + 1]` cumulative new-token counts of the prefill sequences.
    pub prefill_cu_seqlens_q: Vec<i32>,
    /// `[B_p]` tokens each prefill sequence had cached before this step.
    pub prefill_context_lens: Vec<i32>,
    /// Width of `prefill_block_table`.
    pub prefill_max_blocks: i64,
    /// `[B_p, prefill_max_blocks]` block ids of the prefill sequences (unused entries 0).
    pub prefill_block_table: Vec<i32>,
    /// The largest new-token count of a prefill sequence.
    pub max_query_len: i64,
    /// The cached context split into chunks of at most the workspace's token budget; empty
    /// when no prefill sequence has context.
    pub chunks: Vec<ContextChunk>,
}

/// One sequence's part of a step: its new tokens' rope positions, and whether it decodes.
#[derive(Clone, Copy, Debug)]
pub struct StepSeq<'a> {
    pub seq: SeqId,
    pub positions: &'a [i64],
    /// A decode entry has exactly one token and must come before every prefill entry.
    pub decode: bool,
}

impl MlaBatchMetadata {
    /// Tokens in the step.
    pub fn num_tokens(&self) -> i64 {
        self.positions.len() as i64
    }

    /// Prefill sequences in the step.
    pub fn num_prefill_seqs(&self) -> i64 {
        (self.prefill_cu_seqlens_q.len() as i64 - 1).max(0)
    }

    /// Rows of the largest context chunk.
    pub fn max_chunk_tokens(&self) -> i64 {
        self.chunks.iter().map(ContextChunk::tokens).max().unwrap_or(0)
    }

    /// Plans a step: appends each sequence's new tokens to `cache` (taking blocks) and fills
    /// `self` (reusing its allocations). Context chunks hold at most
    /// `chunk_workspace_tokens` rows: each chunk gives every prefill sequence with context
    /// an equal share, `chunk_workspace_tokens / (sequences with context)` positions.
    ///
    /// Errors, leaving the cache unchanged: a decode entry after a prefill entry or with
    /// other than one token, an empty prefill entry, a sequence listed twice, too few free
    /// blocks, or a workspace smaller than one row per sequence with context.
    ///
    /// `cache` is a [`PagedKvCache`], a [`crate::LayeredKvCache`] (one plan for every layer)
    /// or a bare [`BlockAllocator`].
    pub fn plan<A: AsMut<BlockAllocator>>(
        &mut self,
        cache: &mut A,
        seqs: &[StepSeq<'_>],
        chunk_workspace_tokens: i64,
    ) -> Result<()> {
        let cache = cache.as_mut();
        // Check everything before touching the cache so a failed plan changes nothing.
        let mut seen_prefill = false;
        let mut need_blocks = 0;
        for (i, s) in seqs.iter().enumerate() {
            if s.decode {
                if seen_prefill {
                    return Err(Error::invalid(
                        OP,
                        "seqs",
                        format!("decode entry {i} follows a prefill entry; decode tokens go first"),
                    ));
                }
                if s.positions.len() != 1 {
                    return Err(Error::invalid(
                        OP,
                        "seqs",
                        format!("decode entry {i} has {} tokens, expected exactly 1", s.positions.len()),
                    ));
                }
            } else {
                seen_prefill = true;
                if s.positions.is_empty() {
                    return Err(Error::invalid(OP, "seqs", format!("prefill entry {i} has no tokens")));
                }
            }
            if seqs[..i].iter().any(|o| o.seq == s.seq) {
                return Err(Error::invalid(
                    OP,
                    "seqs",
                    format!("sequence {} appears twice in one step", s.seq.0),
                ));
            }
            need_blocks += cache.blocks_needed(s.seq, s.positions.len() as i64)?;
        }
        if need_blocks > cache.free_blocks() {
            return Err(Error::invalid(
                "PagedKvCache",
                "num_blocks",
                format!(
                    "out of KV cache blocks: the step needs {need_blocks} more block(s) of {} tokens, {} of {} are free",
                    cache.block_size(),
                    cache.free_blocks(),
                    cache.num_blocks()
                ),
            ));
        }
        let with_ctx =
            seqs.iter().filter(|s| !s.decode).map(|s| cache.seq_len(s.seq)).collect::<Result<Vec<_>>>()?;
        let n_ctx = with_ctx.iter().filter(|&&c| c > 0).count() as i64;
        if n_ctx > 0 && chunk_workspace_tokens < n_ctx {
            return Err(Error::invalid(
                OP,
                "chunk_workspace_tokens",
                format!("{chunk_workspace_tokens} rows cannot hold one row for each of {n_ctx} prefill sequences with context"),
            ));
        }

        self.positions.clear();
        self.slot_mapping.clear();
        self.decode_block_table.clear();
        self.decode_seq_lens.clear();
        self.prefill_cu_seqlens_q.clear();
        self.prefill_context_lens.clear();
        self.prefill_block_table.clear();
        self.chunks.clear();
        self.max_query_len = 0;

        let decodes = seqs.iter().take_while(|s| s.decode);
        let prefills = &seqs[seqs.iter().take_while(|s| s.decode).count()..];
        self.num_decode_tokens = decodes.clone().count() as i64;
        let (mut dec_mb, mut pre_mb) = (0, 0);
        for s in seqs {
            let n = s.positions.len() as i64;
            let ctx = cache.seq_len(s.seq)?;
            let mb = cache.blocks_for(ctx + n);
            if s.decode {
                dec_mb = dec_mb.max(mb);
            } else {
                pre_mb = pre_mb.max(mb);
            }
        }
        self.decode_max_blocks = dec_mb;
        self.prefill_max_blocks = pre_mb;
        for s in decodes {
            let ctx = cache.seq_len(s.seq)?;
            self.positions.extend_from_slice(s.positions);
            cache.append(s.seq, 1, &mut self.slot_mapping)?;
            self.decode_seq_lens.push(to_i32(ctx + 1, "decode_seq_lens")?);
            push_row(&mut self.decode_block_table, cache.block_table(s.seq)?, dec_mb);
        }
        if !prefills.is_empty() {
            self.prefill_cu_seqlens_q.push(0);
        }
        for s in prefills {
            let n = s.positions.len() as i64;
            let ctx = cache.seq_len(s.seq)?;
            self.positions.extend_from_slice(s.positions);
            cache.append(s.seq, n, &mut self.slot_mapping)?;
            let last = *self.prefill_cu_seqlens_q.last().unwrap_or(&0) as i64;
            self.prefill_cu_seqlens_q.push(to_i32(last + n, "prefill_cu_seqlens_q")?);
            self.prefill_context_lens.push(to_i32(ctx, "prefill_context_lens")?);
            self.max_query_len = self.max_query_len.max(n);
            push_row(&mut self.prefill_block_table, cache.block_table(s.seq)?, pre_mb);
        }
        if n_ctx > 0 {
            let per_seq = chunk_workspace_tokens / n_ctx;
            let max_ctx = self.prefill_context_lens.iter().copied().max().unwrap_or(0) as i64;
            let num_chunks = (max_ctx + per_seq - 1) / per_seq;
            for c in 0..num_chunks {
                let start = c * per_seq;
                let mut chunk = ContextChunk::default();
                chunk.cu_seq_lens.push(0);
                let mut total = 0i64;
                for &ctx in &self.prefill_context_lens {
                    let len = ((ctx as i64).min(start + per_seq) - start).max(0);
                    total += len;
                    chunk.cu_seq_lens.push(to_i32(total, "chunk cu_seq_lens")?);
                    chunk.seq_starts.push(to_i32(start, "chunk seq_starts")?);
                }
                self.chunks.push(chunk);
            }
        }
        Ok(())
    }

    /// Checks the metadata against a step of `t` tokens, a cache of `num_blocks` blocks of
    /// `block_size` rows, and a cos/sin cache of `rope_rows` rows, so that no op can be
    /// handed an index that points outside its memory (GPU kernels do not check).
    pub fn check(&self, t: i64, num_blocks: i64, block_size: i64, rope_rows: i64) -> Result<()> {
        let err = |arg: &'static str, msg: String| Err(Error::invalid(OP, arg, msg));
        if self.positions.len() as i64 != t {
            return err("positions", format!("holds {} entries for {t} tokens", self.positions.len()));
        }
        if let Some((i, p)) = self.positions.iter().enumerate().find(|(_, &p)| p < 0 || p >= rope_rows) {
            return err(
                "positions",
                format!("positions[{i}] = {p} is outside the cos/sin cache's 0..{rope_rows} (max_position_embeddings)"),
            );
        }
        if self.slot_mapping.len() as i64 != t {
            return err("slot_mapping", format!("holds {} entries for {t} tokens", self.slot_mapping.len()));
        }
        let slots = num_blocks * block_size;
        if let Some((i, s)) = self.slot_mapping.iter().enumerate().find(|(_, &s)| s >= slots) {
            return err("slot_mapping", format!("slot_mapping[{i}] = {s} is past the cache's {slots} slots"));
        }
        let d = self.num_decode_tokens;
        if !(0..=t).contains(&d) {
            return err("num_decode_tokens", format!("{d} is outside 0..={t}"));
        }
        // Decode part.
        if self.decode_seq_lens.len() as i64 != d {
            return err(
                "decode_seq_lens",
                format!("holds {} entries for {d} decode tokens", self.decode_seq_lens.len()),
            );
        }
        // Length 0 is a padding row (as `DecodeGraphs` adds to fill a batch-size bucket):
        // allowed only with slot < 0, so it writes nothing and attends over nothing.
        if let Some((i, l)) = self
            .decode_seq_lens
            .iter()
            .enumerate()
            .find(|(i, &l)| l < 0 || (l == 0 && self.slot_mapping[*i] >= 0))
        {
            return err(
                "decode_seq_lens",
                format!(
                    "decode_seq_lens[{i}] = {l}: a decoding sequence holds its new token (0 only for a padding row, \
                     whose slot is < 0)"
                ),
            );
        }
        if d > 0 {
            check_table(
                "decode_block_table",
                &self.decode_block_table,
                d,
                self.decode_max_blocks,
                num_blocks,
                block_size,
                |b| self.decode_seq_lens[b] as i64,
            )?;
        }
        // Prefill part.
        let tp = t - d;
        let cu = &self.prefill_cu_seqlens_q;
        if tp == 0 {
            if cu.len() > 1 && cu.last() != Some(&0) {
                return err(
                    "prefill_cu_seqlens_q",
                    format!("{cu:?} lists tokens but the step has no prefill tokens"),
                );
            }
            return Ok(());
        }
        if cu.len() < 2
            || cu[0] != 0
            || cu.windows(2).any(|w| w[1] <= w[0])
            || *cu.last().unwrap_or(&0) as i64 != tp
        {
            return err(
                "prefill_cu_seqlens_q",
                format!("{cu:?} must start at 0, increase strictly and end at the {tp} prefill tokens"),
            );
        }
        let bp = cu.len() as i64 - 1;
        if let Some(i) = cu.windows(2).position(|w| (w[1] - w[0]) as i64 > self.max_query_len) {
            return err(
                "max_query_len",
                format!(
                    "{} is less than sequence {i}'s {} new tokens",
                    self.max_query_len,
                    cu[i + 1] - cu[i]
                ),
            );
        }
        if self.prefill_context_lens.len() as i64 != bp || self.prefill_context_lens.iter().any(|&c| c < 0) {
            return err(
                "prefill_context_lens",
                format!("{:?} must hold {bp} lengths >= 0", self.prefill_context_lens),
            );
        }
        let ctx = |b: usize| self.prefill_context_lens[b] as i64;
        check_table(
            "prefill_block_table",
            &self.prefill_block_table,
            bp,
            self.prefill_max_blocks,
            num_blocks,
            block_size,
            |b| ctx(b) + (cu[b + 1] - cu[b]) as i64,
        )?;
        // The chunks must tile each sequence's context [0, ctx) in order, exactly once.
        let mut covered = vec![0i64; bp as usize];
        for (c, ch) in self.chunks.iter().enumerate() {
            let ok = ch.cu_seq_lens.len() as i64 == bp + 1
                && ch.seq_starts.len() as i64 == bp
                && ch.cu_seq_lens[0] == 0
                && ch.cu_seq_lens.windows(2).all(|w| w[1] >= w[0]);
            if !ok {
                return err(
                    "chunks",
                    format!("chunk {c}: cu_seq_lens must be [B_p+1] from 0, nondecreasing; seq_starts [B_p]"),
                );
            }
            for (b, cov) in covered.iter_mut().enumerate() {
                let len = (ch.cu_seq_lens[b + 1] - ch.cu_seq_lens[b]) as i64;
                if len == 0 {
                    continue;
                }
                if ch.seq_starts[b] as i64 != *cov || *cov + len > ctx(b) {
                    return err(
                        "chunks",
                        format!(
                            "chunk {c} gives sequence {b} positions {}..{}, but the next uncovered of its {} context tokens is {cov}",
                            ch.seq_starts[b],
                            ch.seq_starts[b] as i64 + len,
                            ctx(b)
                        ),
                    );
                }
                *cov += len;
            }
        }
        if let Some(b) = (0..bp as usize).find(|&b| covered[b] != ctx(b)) {
            return err(
                "chunks",
                format!("the chunks cover {} of sequence {b}'s {} context tokens", covered[b], ctx(b)),
            );
        }
        Ok(())
    }

    /// i32 entries the block uploads for this step.
    pub(crate) fn i32_len(&self) -> usize {
        self.decode_block_table.len()
            + self.decode_seq_lens.len()
            + self.prefill_block_table.len()
            + self.prefill_cu_seqlens_q.len()
            + self.chunks.iter().map(|c| c.cu_seq_lens.len() + c.seq_starts.len()).sum::<usize>()
    }
}

fn push_row(table: &mut Vec<i32>, blocks: &[i32], width: i64) {
    table.extend_from_slice(blocks);
    table.extend(std::iter::repeat_n(0, (width as usize).saturating_sub(blocks.len())));
}

fn to_i32(v: i64, what: &'static str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(OP, what, format!("{v} does not fit in i32")))
}

/// A block table `[rows, width]` whose first `len(b)` positions map to blocks in the cache.
fn check_table(
    arg: &'static str,
    table: &[i32],
    rows: i64,
    width: i64,
    num_blocks: i64,
    block_size: i64,
    len: impl Fn(usize) -> i64,
) -> Result<()> {
    if width < 0 || table.len() as i64 != rows * width {
        return Err(Error::invalid(
            OP,
            arg,
            format!("holds {} entries, expected {rows} x {width}", table.len()),
        ));
    }
    for b in 0..rows as usize {
        let need = (len(b) + block_size - 1) / block_size;
        if need > width {
            return Err(Error::invalid(
                OP,
                arg,
                format!("row {b} needs {need} blocks for {} tokens but the table is {width} wide", len(b)),
            ));
        }
        let row = &table[b * width as usize..b * width as usize + need as usize];
        if let Some((j, id)) = row.iter().enumerate().find(|(_, &id)| id < 0 || id as i64 >= num_blocks) {
            return Err(Error::invalid(
                OP,
                arg,
                format!("[{b}, {j}] = {id} is outside the cache's 0..{num_blocks}"),
            ));
        }
    }
    Ok(())
}
