//! Reusable scratch memory of the block: every intermediate of a step and the device copy
//! of the step's metadata.
//!
//! Each scratch tensor lives in a flat buffer that only grows: a step takes a view of the
//! size it needs from the front. Sizes come from [`MlaLimits`] (or the first step that
//! needs more), so after warm-up a step allocates nothing on the device, which is what a
//! later CUDA-graph capture needs. [`MlaWorkspace::allocations`] counts device allocations
//! so tests can hold the block to that.

use vt_core::{contiguous_strides, Buffer, DType, Error, Queue, Result, Tensor};

/// Sizes the workspace is allocated for up front. A step that needs more grows the
/// buffers (a device allocation, logged at debug level).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaLimits {
    /// Tokens in one step (decode and prefill together).
    pub max_tokens: i64,
    /// Sequences in one step.
    pub max_seqs: i64,
    /// Block-table width (blocks of the longest sequence).
    pub max_blocks_per_seq: i64,
    /// Rows of the chunked-context gather workspace (the token budget of one chunk).
    pub chunk_workspace_tokens: i64,
}

impl Default for MlaLimits {
    fn default() -> Self {
        MlaLimits { max_tokens: 256, max_seqs: 16, max_blocks_per_seq: 64, chunk_workspace_tokens: 4096 }
    }
}

/// The scratch tensors of one step, by role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    QC,
    KvC,
    KvMerged,
    KPe,
    KvCNormed,
    QRaw,
    Attn,
    KvNope,
    Key,
    SuffixOut,
    SuffixLse,
    ChunkOut,
    ChunkLse,
    AccOutA,
    AccLseA,
    AccOutB,
    AccLseB,
    CtxKv,
    CtxKvNope,
    CtxKey,
    QlNope,
    MqaQ,
    MqaOut,
    /// DeepSeek-V3.2's indexer: its query `[T, Hi*Di]`, key `[T, Di]`, head weights
    /// `[T, Hi]`, the selected slots `[T, topk]` (i32) and its metadata `[2T]` (i32: each
    /// token's sequence row in its block table, then its position in its sequence).
    IdxQ,
    IdxK,
    IdxW,
    IdxTopk,
    MetaIdx,
    /// Quantized activations (fp8 codes) and their per-token scales, for fp8 weights at
    /// prefill sizes (`crate::fp8::linear`).
    Fp8Act,
    Fp8ActScale,
    MetaI64,
    MetaI32,
}

const NUM_SLOTS: usize = Slot::MetaI32 as usize + 1;

/// Scratch memory and metadata staging for [`crate::MlaBlock::forward`].
pub struct MlaWorkspace {
    limits: MlaLimits,
    bufs: Vec<Option<Buffer>>,
    allocations: usize,
    staging: Vec<u8>,
    /// What the last [`crate::MlaBlock::prepare`] uploaded metadata for, so that
    /// [`crate::MlaBlock::launch`] can refuse a step it was not prepared for.
    pub(crate) prepared: Option<StepKey>,
}

/// The shape of a step as far as the workspace's metadata layout is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StepKey {
    pub tokens: i64,
    pub decode_tokens: i64,
    pub i32_len: usize,
    pub chunks: usize,
    pub fused: bool,
}

impl MlaWorkspace {
    /// An empty workspace; buffers are allocated on first use, sized for `limits` at least.
    pub fn new(limits: MlaLimits) -> Result<MlaWorkspace> {
        let l = limits;
        crate::dims::check_positive(
            "MlaLimits",
            &[
                ("max_tokens", l.max_tokens),
                ("max_seqs", l.max_seqs),
                ("max_blocks_per_seq", l.max_blocks_per_seq),
                ("chunk_workspace_tokens", l.chunk_workspace_tokens),
            ],
        )?;
        Ok(MlaWorkspace {
            limits,
            bufs: (0..NUM_SLOTS).map(|_| None).collect(),
            allocations: 0,
            staging: Vec::new(),
            prepared: None,
        })
    }

    pub fn limits(&self) -> &MlaLimits {
        &self.limits
    }

    /// Device allocations made so far (constant across steps once warmed up).
    pub fn allocations(&self) -> usize {
        self.allocations
    }

    /// Makes `slot` hold at least `elems` elements of `dtype` (at least `floor` elements
    /// when it has to allocate, so the limits' sizes are reached in one go). New memory is
    /// NaN so a read of an element no op wrote is visible in the output.
    pub(crate) fn ensure(
        &mut self,
        q: &Queue,
        slot: Slot,
        dtype: DType,
        elems: i64,
        floor: i64,
    ) -> Result<()> {
        let cur = &self.bufs[slot as usize];
        if let Some(b) = cur {
            if b.dtype() == dtype && b.numel() >= elems && b.device() == q.device() {
                return Ok(());
            }
        }
        let n = elems.max(floor).max(1);
        if cur.is_some() {
            tracing::debug!(?slot, elems = n, "MLA workspace grows");
        }
        self.bufs[slot as usize] = None;
        self.bufs[slot as usize] = Some(Buffer::nan(q, dtype, &[n])?);
        self.allocations += 1;
        Ok(())
    }

    /// A contiguous view of `shape` at the front of `slot`'s buffer, starting `offset`
    /// elements in.
    pub(crate) fn view(&self, slot: Slot, offset: i64, shape: &[i64]) -> Result<Tensor<'_>> {
        let Some(b) = &self.bufs[slot as usize] else {
            return Err(Error::backend("MlaWorkspace", format!("scratch {slot:?} used before it was sized")));
        };
        let strides = contiguous_strides(shape);
        b.view().as_strided(offset, shape, &strides[..shape.len()])
    }

    /// Host staging bytes for the next [`MlaWorkspace::commit_staging`], emptied; the
    /// allocation is reused across steps.
    pub(crate) fn staging(&mut self) -> &mut Vec<u8> {
        self.staging.clear();
        &mut self.staging
    }

    /// Writes the staged bytes to the front of `slot`'s buffer and zero-fills the rest (a
    /// buffer write covers the whole buffer).
    pub(crate) fn commit_staging(&mut self, q: &Queue, slot: Slot) -> Result<()> {
        let Some(b) = &self.bufs[slot as usize] else {
            return Err(Error::backend(
                "MlaWorkspace",
                format!("metadata {slot:?} used before it was sized"),
            ));
        };
        let total = b.numel() as usize * b.dtype().size_of();
        if self.staging.len() > total {
            return Err(Error::backend("MlaWorkspace", format!("metadata {slot:?} overflows its buffer")));
        }
        self.staging.resize(total, 0);
        b.write_bytes(q, &self.staging)
    }
}
