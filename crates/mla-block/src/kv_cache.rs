//! A paged latent KV cache: a [`BlockAllocator`] (free list of blocks, per-sequence block
//! tables and lengths: host state) and device memory for it, either one layer's
//! `[num_blocks, block_size, L+R]` ([`PagedKvCache`]) or every layer's
//! `[layers, num_blocks, block_size, L+R]` under one allocator ([`LayeredKvCache`], what an
//! engine running a whole model uses: one plan per step serves every layer).
//!
//! Token `j` of a sequence lives in block `table[j / block_size]`, row `j % block_size`,
//! i.e. at slot `table[j / bs] * bs + j % bs`, which is what `ConcatAndCacheMla` writes
//! and `GatherMlaCache` / `MlaDecodeAttention` read. Running out of blocks is an error
//! that leaves the cache unchanged.
//!
//! A DeepSeek-V3.2 block's rows hold its indexer key beside the latent:
//! `[kv_c_normed (L) | k_pe (R) | indexer key (Di)]`, `row_dim` = L+R+Di
//! ([`crate::MlaBlockDims::cache_row_dim`]), one block table and slot mapping for both
//! (CacheIndexerKeys writes the keys at the latents' slots, so IndexerTopK's slots address
//! the latents).
//!
//! A cache is in the activation dtype (rows of L+R elements) or, for L = 512 and R = 64,
//! [`DType::Fp8DsMla`] (rows of 656 bytes: e4m3 latents, per-128 f32 scales, bf16 rope;
//! [`KvCacheDtype`]); `row_dim` stays the logical L+R either way.

use vt_core::{fp8_ds_mla, Buffer, DType, Error, Queue, Result, Tensor};

const OP: &str = "PagedKvCache";

/// The cache dtype a run asks for (`--kv-cache-dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvCacheDtype {
    /// The activation dtype.
    #[default]
    Auto,
    Bf16,
    /// The 656-byte fp8_ds_mla row (L = 512, R = 64 only).
    Fp8DsMla,
}

impl KvCacheDtype {
    pub const ALL: [KvCacheDtype; 3] = [KvCacheDtype::Auto, KvCacheDtype::Bf16, KvCacheDtype::Fp8DsMla];

    pub const fn name(self) -> &'static str {
        match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Bf16 => "bf16",
            KvCacheDtype::Fp8DsMla => "fp8_ds_mla",
        }
    }

    /// The cache's dtype for activations in `activation`. A bf16 cache needs bf16
    /// activations (the ops take one float dtype for a float cache).
    pub fn resolve(self, activation: DType) -> Result<DType> {
        match self {
            KvCacheDtype::Auto => Ok(activation),
            KvCacheDtype::Fp8DsMla => Ok(DType::Fp8DsMla),
            KvCacheDtype::Bf16 if activation == DType::BF16 => Ok(DType::BF16),
            KvCacheDtype::Bf16 => Err(Error::invalid(
                OP,
                "kv_cache_dtype",
                format!("a bf16 cache needs bf16 activations, the block runs in {activation}"),
            )),
        }
    }
}

impl std::str::FromStr for KvCacheDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        KvCacheDtype::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown kv cache dtype {s:?} (one of auto, bf16, fp8_ds_mla)"))
    }
}

/// Bytes of one cached token's row of `row_dim` (= L+R) values in `dtype`: 656 for
/// fp8_ds_mla (which holds exactly 576), `row_dim * size` otherwise; errors name the
/// dtype (an integer dtype, a wrong width for fp8, or an overflow).
pub fn row_bytes(dtype: DType, row_dim: i64) -> Result<i64> {
    if dtype == DType::Fp8DsMla {
        if row_dim != fp8_ds_mla::DECODED as i64 {
            return Err(Error::invalid(
                OP,
                "row_dim",
                format!("an fp8_ds_mla cache holds rows of 576 = 512 + 64 values, not {row_dim}"),
            ));
        }
        return Ok(fp8_ds_mla::ROW_BYTES as i64);
    }
    if !dtype.is_compute_float() {
        return Err(Error::invalid(OP, "dtype", format!("{dtype} is not bf16/f16/f32/fp8_ds_mla")));
    }
    row_dim
        .checked_mul(dtype.size_of() as i64)
        .ok_or_else(|| Error::invalid(OP, "row_dim", format!("{row_dim} x {dtype} overflows i64 bytes")))
}

/// The last dim of a cache buffer: `row_dim` elements, or the fp8 row's bytes.
fn row_elems(dtype: DType, row_dim: i64) -> i64 {
    if dtype == DType::Fp8DsMla {
        fp8_ds_mla::ROW_BYTES as i64
    } else {
        row_dim
    }
}

/// A sequence's handle in a [`PagedKvCache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqId(pub usize);

#[derive(Clone, Debug, Default)]
struct SeqState {
    blocks: Vec<i32>,
    len: i64,
}

/// Blocks, sequences, block tables and slots: the host side of a paged cache, owned once
/// and shared by every layer (each layer's cache memory has the same block layout).
#[derive(Clone, Debug)]
pub struct BlockAllocator {
    num_blocks: i64,
    block_size: i64,
    /// Free block ids; popped from the end, so blocks are handed out in ascending order.
    free: Vec<i32>,
    seqs: Vec<Option<SeqState>>,
}

/// One layer's paged MLA cache and its block allocator.
pub struct PagedKvCache {
    buffer: Buffer,
    row_dim: i64,
    alloc: BlockAllocator,
}

impl std::ops::Deref for PagedKvCache {
    type Target = BlockAllocator;
    fn deref(&self) -> &BlockAllocator {
        &self.alloc
    }
}

impl std::ops::DerefMut for PagedKvCache {
    fn deref_mut(&mut self) -> &mut BlockAllocator {
        &mut self.alloc
    }
}

impl AsMut<BlockAllocator> for PagedKvCache {
    fn as_mut(&mut self) -> &mut BlockAllocator {
        &mut self.alloc
    }
}

impl AsMut<BlockAllocator> for BlockAllocator {
    fn as_mut(&mut self) -> &mut BlockAllocator {
        self
    }
}

impl PagedKvCache {
    /// A cache of `num_blocks` blocks of `block_size` rows of `row_dim` (= L+R) elements.
    /// The memory starts as NaN so a read of a row that was never written shows up.
    pub fn new(queue: &Queue, dtype: DType, num_blocks: i64, block_size: i64, row_dim: i64) -> Result<Self> {
        let alloc = BlockAllocator::new(num_blocks, block_size)?;
        if row_dim <= 0 {
            return Err(Error::invalid(OP, "row_dim", format!("must be > 0, got {row_dim}")));
        }
        row_bytes(dtype, row_dim)?;
        let buffer = Buffer::nan(queue, dtype, &[num_blocks, block_size, row_elems(dtype, row_dim)])?;
        Ok(PagedKvCache { buffer, row_dim, alloc })
    }

    /// The cache memory as `[num_blocks, block_size, row_dim]`.
    pub fn view(&self) -> Tensor<'_> {
        self.buffer.view()
    }

    pub fn row_dim(&self) -> i64 {
        self.row_dim
    }

    /// The block allocator (also reachable through `Deref`).
    pub fn allocator(&self) -> &BlockAllocator {
        &self.alloc
    }
}

/// Every layer's paged MLA cache, `[layers, num_blocks, block_size, row_dim]` in one
/// buffer, under one [`BlockAllocator`]: a sequence's blocks hold its tokens in every layer,
/// so one [`crate::MlaBatchMetadata`] plan per step (slots, block tables) serves all layers.
pub struct LayeredKvCache {
    buffer: Buffer,
    layers: i64,
    row_dim: i64,
    alloc: BlockAllocator,
}

impl LayeredKvCache {
    /// `layers` caches of `num_blocks` blocks of `block_size` rows of `row_dim` (= L+R)
    /// elements, NaN-filled.
    pub fn new(
        queue: &Queue,
        dtype: DType,
        layers: i64,
        num_blocks: i64,
        block_size: i64,
        row_dim: i64,
    ) -> Result<Self> {
        let alloc = BlockAllocator::new(num_blocks, block_size)?;
        for (name, v) in [("layers", layers), ("row_dim", row_dim)] {
            if v <= 0 {
                return Err(Error::invalid("LayeredKvCache", name, format!("must be > 0, got {v}")));
            }
        }
        let row = row_bytes(dtype, row_dim).map_err(|e| match e {
            Error::InvalidArgument { arg, msg, .. } => Error::invalid("LayeredKvCache", arg, msg),
            e => e,
        })?;
        let bytes = [layers, num_blocks, block_size, row].iter().try_fold(1i64, |a, &x| a.checked_mul(x));
        if bytes.is_none() {
            return Err(Error::invalid(
                "LayeredKvCache",
                "num_blocks",
                format!("{layers} layers x {num_blocks} blocks x {block_size} x {row_dim} {dtype} overflow i64 bytes"),
            ));
        }
        let buffer = Buffer::nan(queue, dtype, &[layers, num_blocks, block_size, row_elems(dtype, row_dim)])?;
        Ok(LayeredKvCache { buffer, layers, row_dim, alloc })
    }

    pub fn num_layers(&self) -> i64 {
        self.layers
    }
    pub fn row_dim(&self) -> i64 {
        self.row_dim
    }

    /// Layer `i`'s cache `[num_blocks, block_size, row_dim]` (a view, no copy).
    pub fn layer(&self, i: i64) -> Result<Tensor<'_>> {
        if i < 0 || i >= self.layers {
            return Err(Error::invalid(
                "LayeredKvCache",
                "layer",
                format!("{i} is outside 0..{}", self.layers),
            ));
        }
        self.buffer.view().select(0, i)
    }

    /// The whole cache `[layers, num_blocks, block_size, row_dim]`.
    pub fn view(&self) -> Tensor<'_> {
        self.buffer.view()
    }

    pub fn allocator(&self) -> &BlockAllocator {
        &self.alloc
    }
}

impl std::ops::Deref for LayeredKvCache {
    type Target = BlockAllocator;
    fn deref(&self) -> &BlockAllocator {
        &self.alloc
    }
}

impl std::ops::DerefMut for LayeredKvCache {
    fn deref_mut(&mut self) -> &mut BlockAllocator {
        &mut self.alloc
    }
}

impl AsMut<BlockAllocator> for LayeredKvCache {
    fn as_mut(&mut self) -> &mut BlockAllocator {
        &mut self.alloc
    }
}

impl BlockAllocator {
    /// `num_blocks` free blocks of `block_size` tokens.
    pub fn new(num_blocks: i64, block_size: i64) -> Result<Self> {
        for (name, v) in [("num_blocks", num_blocks), ("block_size", block_size)] {
            if v <= 0 {
                return Err(Error::invalid(OP, name, format!("must be > 0, got {v}")));
            }
        }
        if num_blocks > i32::MAX as i64 {
            return Err(Error::invalid(
                OP,
                "num_blocks",
                format!("{num_blocks} does not fit block ids (i32)"),
            ));
        }
        Ok(BlockAllocator {
            num_blocks,
            block_size,
            free: (0..num_blocks as i32).rev().collect(),
            seqs: Vec::new(),
        })
    }

    pub fn block_size(&self) -> i64 {
        self.block_size
    }
    pub fn num_blocks(&self) -> i64 {
        self.num_blocks
    }
    pub fn free_blocks(&self) -> i64 {
        self.free.len() as i64
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: i64) -> i64 {
        (tokens + self.block_size - 1) / self.block_size
    }

    /// Starts an empty sequence.
    pub fn add_sequence(&mut self) -> SeqId {
        if let Some(i) = self.seqs.iter().position(Option::is_none) {
            self.seqs[i] = Some(SeqState::default());
            return SeqId(i);
        }
        self.seqs.push(Some(SeqState::default()));
        SeqId(self.seqs.len() - 1)
    }

    /// Ends a sequence and returns its blocks to the free list.
    pub fn free_sequence(&mut self, id: SeqId) -> Result<()> {
        let st = self.seqs.get_mut(id.0).and_then(Option::take).ok_or_else(|| unknown(id))?;
        self.free.extend(st.blocks.into_iter().rev());
        Ok(())
    }

    fn seq(&self, id: SeqId) -> Result<&SeqState> {
        self.seqs.get(id.0).and_then(Option::as_ref).ok_or_else(|| unknown(id))
    }

    /// Tokens cached for the sequence so far.
    pub fn seq_len(&self, id: SeqId) -> Result<i64> {
        Ok(self.seq(id)?.len)
    }

    /// The sequence's block table (block ids in logical order).
    pub fn block_table(&self, id: SeqId) -> Result<&[i32]> {
        Ok(&self.seq(id)?.blocks)
    }

    /// Blocks that appending `n` tokens to the sequence would take from the free list.
    pub fn blocks_needed(&self, id: SeqId, n: i64) -> Result<i64> {
        let st = self.seq(id)?;
        Ok((self.blocks_for(st.len + n) - st.blocks.len() as i64).max(0))
    }

    /// Appends `n` tokens to the sequence: takes the blocks they need and pushes their
    /// slots onto `slots`. Errors (changing nothing) if the free list is too short.
    pub fn append(&mut self, id: SeqId, n: i64, slots: &mut Vec<i64>) -> Result<()> {
        if n < 0 {
            return Err(Error::invalid(OP, "n", format!("cannot append {n} tokens")));
        }
        let need = self.blocks_needed(id, n)?;
        if need > self.free.len() as i64 {
            return Err(Error::invalid(
                OP,
                "num_blocks",
                format!(
                    "out of KV cache blocks: sequence {} needs {need} more block(s) of {} tokens, {} of {} are free",
                    id.0,
                    self.block_size,
                    self.free.len(),
                    self.num_blocks
                ),
            ));
        }
        let bs = self.block_size;
        let Some(Some(st)) = self.seqs.get_mut(id.0) else { return Err(unknown(id)) };
        for _ in 0..need {
            match self.free.pop() {
                Some(b) => st.blocks.push(b),
                None => return Err(Error::invalid(OP, "num_blocks", "free list shrank while appending")),
            }
        }
        for j in st.len..st.len + n {
            slots.push(st.blocks[(j / bs) as usize] as i64 * bs + j % bs);
        }
        st.len += n;
        Ok(())
    }
}

fn unknown(id: SeqId) -> Error {
    Error::invalid(OP, "seq", format!("sequence {} does not exist (never added, or freed)", id.0))
}
