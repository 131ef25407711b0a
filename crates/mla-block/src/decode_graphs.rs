//! Decode steps as replayed graphs, the way engines run them: one graph of a decode step of
//! every layer per batch-size bucket, captured once at start-up; each step pads its batch to
//! the smallest bucket that holds it, uploads the step's metadata into buffers at fixed
//! device addresses, and replays that bucket's graph.
//!
//! ```text
//! let mut graphs = DecodeGraphs::new(&queue, &blocks, &cache, DecodeGraphConfig::new(max_blocks))?;
//! loop {
//!     meta.plan(&mut cache, &decode_seqs, 1)?;     // the engine's step: B sequences, one token each
//!     let rows = graphs.prepare(&meta)?;           // pads to the bucket, uploads the metadata
//!     queue.write_bytes(&graphs.input()?, x)?;     // [B, H] hidden rows (or the engine's own op)
//!     graphs.run(&cache)?;                         // replays the bucket's graph
//!     // graphs.output()? holds the B output rows
//! }
//! ```
//!
//! Padding rows (rows `B..bucket`) have position 0, slot -1 and length 0: by the ops'
//! contracts `ConcatAndCacheMla` skips a slot < 0 and `MlaDecodeAttention` gives a sequence
//! of length 0 the output 0, and every other op of the step is row by row, so a padding row
//! writes no cache row, reads no cache row and changes no other row's output. The block
//! tables are laid out `max_blocks_per_seq` wide in every step, so a graph serves any context
//! length up to that.
//!
//! Where the queue cannot capture (the CPU, HIP; `Queue::supports_capture`) or graphs are
//! switched off ([`DecodeGraphConfig::use_graphs`]), [`DecodeGraphs::run`] runs the same
//! padded step eagerly, so engine code is the same on every backend.
//!
//! What a graph needs, and how it is kept: the weights (borrowed for `'w`), the cache (the
//! same [`LayeredKvCache`] at every [`DecodeGraphs::run`], checked by address and shape),
//! and this object's own workspace, metadata buffers and input/output rows (allocated once,
//! sized for the largest bucket; the largest bucket is warmed up and captured first, so
//! nothing grows later). Prefill and mixed steps run eagerly (`MlaBlock::forward`,
//! `layers::forward_layers`) with their own workspace, on the same cache.

use vt_core::{Buffer, Device, Error, Graph, Queue, Result, Tensor};

use crate::block::MlaBlock;
use crate::kv_cache::LayeredKvCache;
use crate::layers::{check_layers, launch_layers};
use crate::metadata::MlaBatchMetadata;
use crate::workspace::{MlaLimits, MlaWorkspace};

const OP: &str = "DecodeGraphs";

/// The batch-size buckets engines commonly capture (vLLM's default list starts the same way).
pub const DEFAULT_BUCKETS: [i64; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// What a [`DecodeGraphs`] captures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeGraphConfig {
    /// Batch sizes with a graph of their own, strictly ascending, each > 0. A step of B
    /// sequences runs the smallest bucket >= B (padded); more than the last is an error.
    pub buckets: Vec<i64>,
    /// The block-table width of every step: the most blocks a decoding sequence may hold
    /// (its context, new token included, over the block size, rounded up).
    pub max_blocks_per_seq: i64,
    /// Capture graphs where the queue can (default true); false runs every step eagerly
    /// (the same padded step), e.g. to compare.
    pub use_graphs: bool,
}

impl DecodeGraphConfig {
    /// [`DEFAULT_BUCKETS`], graphs on.
    pub fn new(max_blocks_per_seq: i64) -> DecodeGraphConfig {
        DecodeGraphConfig { buckets: DEFAULT_BUCKETS.to_vec(), max_blocks_per_seq, use_graphs: true }
    }

    /// The same with `buckets`.
    pub fn with_buckets(mut self, buckets: &[i64]) -> DecodeGraphConfig {
        self.buckets = buckets.to_vec();
        self
    }

    fn validate(&self) -> Result<()> {
        if self.buckets.is_empty() {
            return Err(Error::invalid(OP, "buckets", "no batch-size buckets"));
        }
        if self.buckets[0] <= 0 || self.buckets.windows(2).any(|w| w[1] <= w[0]) {
            return Err(Error::invalid(
                OP,
                "buckets",
                format!("{:?} must be > 0 and strictly ascending", self.buckets),
            ));
        }
        if self.max_blocks_per_seq <= 0 {
            return Err(Error::invalid(
                OP,
                "max_blocks_per_seq",
                format!("must be > 0, got {}", self.max_blocks_per_seq),
            ));
        }
        Ok(())
    }
}

/// How [`DecodeGraphs::run`] runs a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepMode {
    /// Replays the bucket's captured graph.
    Graph,
    /// Launches the padded step's ops one by one; `why` says why there are no graphs.
    Eager { why: String },
}

/// The cache a graph was captured on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CacheKey {
    addr: u64,
    shape: Vec<i64>,
    device: Device,
}

impl CacheKey {
    fn of(cache: &LayeredKvCache) -> CacheKey {
        let v = cache.view();
        CacheKey { addr: v.data_addr(), shape: v.shape().to_vec(), device: v.device() }
    }
}

/// The step [`DecodeGraphs::prepare`] uploaded last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Prepared {
    /// Index into the buckets.
    bucket: usize,
    /// The step's sequences (rows `0..rows` are real, the rest up to the bucket padding).
    rows: i64,
}

/// One captured decode step of every layer per batch-size bucket (see the module docs).
pub struct DecodeGraphs<'w> {
    queue: Queue,
    blocks: Vec<MlaBlock<'w>>,
    cfg: DecodeGraphConfig,
    cache_key: CacheKey,
    /// `(num_blocks, block_size)` of the cache, for validating the metadata.
    cache_dims: (i64, i64),
    ws: MlaWorkspace,
    /// Device allocations of `ws` after the warm-up of the largest bucket.
    ws_allocations: usize,
    /// The padded metadata of the last `prepare` (host copy of what `ws` holds).
    padded: MlaBatchMetadata,
    input: Buffer,
    scratch: [Buffer; 2],
    output: Buffer,
    /// One per bucket (all `None` when running eagerly).
    graphs: Vec<Option<Graph>>,
    mode: StepMode,
    prepared: Option<Prepared>,
}

impl<'w> DecodeGraphs<'w> {
    /// Allocates the workspace, the metadata buffers and the `[largest bucket, hidden]` input,
    /// output and scratch rows, then for every bucket, largest first: runs an all-padding
    /// step once (warm-up: kernels compiled, per-queue buffers sized) and, where the queue
    /// supports it and `cfg.use_graphs`, captures the step of every layer of `blocks` on
    /// `cache` into a graph and replays it once. Synchronizes `queue` at the end.
    ///
    /// `blocks` are the model's attention layers in order (layer `i` on `cache.layer(i)`),
    /// identical in dims, dtype, device and norm+rope path (`layers::check_layers`).
    pub fn new(
        queue: &Queue,
        blocks: &[MlaBlock<'w>],
        cache: &LayeredKvCache,
        cfg: DecodeGraphConfig,
    ) -> Result<DecodeGraphs<'w>> {
        cfg.validate()?;
        check_layers(blocks, cache)?;
        let first = &blocks[0];
        if queue.device() != first.device() {
            return Err(Error::invalid(
                OP,
                "queue",
                format!("is on {}, the blocks on {}", queue.device(), first.device()),
            ));
        }
        let max = *cfg.buckets.last().unwrap_or(&1);
        let h = first.dims().hidden_size;
        let dt = first.dtype();
        let ws = MlaWorkspace::new(MlaLimits {
            max_tokens: max,
            max_seqs: max,
            max_blocks_per_seq: cfg.max_blocks_per_seq,
            chunk_workspace_tokens: 1,
        })?;
        let layer0 = cache.layer(0)?;
        let mode = if !cfg.use_graphs {
            StepMode::Eager { why: "graphs switched off (DecodeGraphConfig::use_graphs = false)".into() }
        } else if !queue.supports_capture() {
            let why = match queue.capture(|| Ok(())) {
                Err(e) => e.to_string(),
                Ok(_) => format!("{} queues cannot capture", queue.device()),
            };
            StepMode::Eager { why }
        } else {
            StepMode::Graph
        };
        let mut g = DecodeGraphs {
            queue: queue.clone(),
            blocks: blocks.to_vec(),
            cache_key: CacheKey::of(cache),
            cache_dims: (layer0.dim(0), layer0.dim(1)),
            ws,
            ws_allocations: 0,
            padded: MlaBatchMetadata::default(),
            input: Buffer::zeros(queue, dt, &[max, h])?,
            scratch: [Buffer::zeros(queue, dt, &[max, h])?, Buffer::zeros(queue, dt, &[max, h])?],
            output: Buffer::zeros(queue, dt, &[max, h])?,
            graphs: cfg.buckets.iter().map(|_| None).collect(),
            mode,
            prepared: None,
            cfg,
        };
        for idx in (0..g.cfg.buckets.len()).rev() {
            let bucket = g.cfg.buckets[idx];
            g.pad(&MlaBatchMetadata::default(), bucket);
            g.upload(idx, 0)?;
            if idx + 1 == g.cfg.buckets.len() {
                g.ws_allocations = g.ws.allocations();
            }
            g.launch_eager(cache)?;
            if g.mode == StepMode::Graph {
                let graph = {
                    let (q, blocks, ws, meta) = (&g.queue, &g.blocks, &g.ws, &g.padded);
                    let (x, s, y) = g.views(bucket)?;
                    q.capture(|| launch_layers(q, blocks, ws, meta, cache, &x, [&s[0], &s[1]], &y)).map_err(
                        |e| Error::other(OP, format!("capturing the decode step of bucket {bucket}: {e}")),
                    )?
                };
                graph.launch()?;
                g.graphs[idx] = Some(graph);
            }
        }
        g.check_no_growth()?;
        g.prepared = None;
        g.queue.synchronize()?;
        Ok(g)
    }

    /// Graph replay or eager launches, and why.
    pub fn mode(&self) -> &StepMode {
        &self.mode
    }

    /// The batch-size buckets.
    pub fn buckets(&self) -> &[i64] {
        &self.cfg.buckets
    }

    /// The bucket a step of `b` sequences runs in: the smallest bucket >= `b`.
    pub fn bucket_for(&self, b: i64) -> Option<i64> {
        self.cfg.buckets.iter().copied().find(|&x| x >= b)
    }

    /// The layers' device (the queue's).
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Sizes of the last prepared step: `(sequences, bucket)`.
    pub fn prepared_rows(&self) -> Option<(i64, i64)> {
        self.prepared.map(|p| (p.rows, self.cfg.buckets[p.bucket]))
    }

    /// The host side of a step: `meta` (planned by the engine on the cache, a decode-only
    /// step of B sequences) is padded to the smallest bucket >= B and uploaded, ordered on
    /// the queue, into this object's metadata buffers, which the bucket's graph reads.
    /// Returns B. Errors, uploading nothing: a step with prefill tokens or none at all, more
    /// sequences than the largest bucket, a sequence holding more than `max_blocks_per_seq`
    /// blocks, or metadata that does not fit the cache.
    pub fn prepare(&mut self, meta: &MlaBatchMetadata) -> Result<i64> {
        self.prepared = None;
        let b = meta.num_decode_tokens;
        if meta.num_tokens() != b || meta.num_prefill_seqs() > 0 || !meta.chunks.is_empty() {
            return Err(Error::invalid(
                OP,
                "meta",
                format!(
                    "has {} prefill token(s): graphs hold decode-only steps; run prefill and mixed steps \
                     eagerly (MlaBlock::forward, layers::forward_layers) with their own workspace",
                    meta.num_tokens() - b
                ),
            ));
        }
        if b == 0 {
            return Err(Error::invalid(OP, "meta", "is an empty step (no decoding sequence)"));
        }
        let Some(idx) = self.cfg.buckets.iter().position(|&x| x >= b) else {
            return Err(Error::invalid(
                OP,
                "meta",
                format!(
                    "has {b} decoding sequences, more than the largest bucket ({}); run it eagerly or add a bucket",
                    self.cfg.buckets.last().copied().unwrap_or(0)
                ),
            ));
        };
        let w = self.cfg.max_blocks_per_seq;
        if meta.decode_max_blocks > w {
            return Err(Error::invalid(
                OP,
                "meta",
                format!(
                    "a sequence holds {} blocks, more than max_blocks_per_seq = {w} (the width the graphs were \
                     captured with)",
                    meta.decode_max_blocks
                ),
            ));
        }
        let (nb, bs) = self.cache_dims;
        meta.check(b, nb, bs, self.blocks[0].max_position())?;
        let bucket = self.cfg.buckets[idx];
        self.pad(meta, bucket);
        self.upload(idx, b)?;
        self.check_no_growth()?;
        Ok(b)
    }

    /// Runs the prepared step on `cache` (the cache the graphs were captured on): replays the
    /// bucket's graph, or launches its ops eagerly where there are no graphs. Reads rows
    /// `0..bucket` of [`DecodeGraphs::input`]'s buffer, writes the output rows and the
    /// sequences' new cache rows. Asynchronous.
    pub fn run(&self, cache: &LayeredKvCache) -> Result<()> {
        let p = self.check_run(cache)?;
        match &self.graphs[p.bucket] {
            Some(g) => g.launch(),
            None => self.launch_eager(cache),
        }
    }

    /// The prepared step's ops launched one by one (what the graph holds), even where a graph
    /// exists: for comparisons and per-op timing.
    pub fn run_eager(&self, cache: &LayeredKvCache) -> Result<()> {
        self.check_run(cache)?;
        self.launch_eager(cache)
    }

    /// Rows `0..B` of the input, `[B, hidden]`, of the prepared step: write the step's hidden
    /// states here before [`DecodeGraphs::run`] (the graph reads this buffer).
    pub fn input(&self) -> Result<Tensor<'_>> {
        let p = self.need_prepared()?;
        self.input.view().slice(0, 0, p.rows)
    }

    /// Rows `0..B` of the output, `[B, hidden]`, of the prepared step, valid once
    /// [`DecodeGraphs::run`] has finished on the queue.
    pub fn output(&self) -> Result<Tensor<'_>> {
        let p = self.need_prepared()?;
        self.output.view().slice(0, 0, p.rows)
    }

    fn need_prepared(&self) -> Result<Prepared> {
        self.prepared.ok_or_else(|| {
            Error::invalid(
                OP,
                "prepare",
                "no step was prepared (call DecodeGraphs::prepare with the step first)",
            )
        })
    }

    fn check_run(&self, cache: &LayeredKvCache) -> Result<Prepared> {
        let p = self.need_prepared()?;
        let key = CacheKey::of(cache);
        if key != self.cache_key {
            return Err(Error::invalid(
                OP,
                "cache",
                format!(
                    "is not the cache the graphs were captured on ({:?} at {:#x} on {}, captured on {:?} at {:#x} on {})",
                    key.shape, key.addr, key.device, self.cache_key.shape, self.cache_key.addr, self.cache_key.device
                ),
            ));
        }
        Ok(p)
    }

    /// `[bucket, H]` views of the input, the two scratch tensors and the output.
    fn views(&self, bucket: i64) -> Result<(Tensor<'_>, [Tensor<'_>; 2], Tensor<'_>)> {
        Ok((
            self.input.view().slice(0, 0, bucket)?,
            [self.scratch[0].view().slice(0, 0, bucket)?, self.scratch[1].view().slice(0, 0, bucket)?],
            self.output.view().slice(0, 0, bucket)?,
        ))
    }

    fn launch_eager(&self, cache: &LayeredKvCache) -> Result<()> {
        let bucket = self.padded.num_tokens();
        let (x, s, y) = self.views(bucket)?;
        launch_layers(&self.queue, &self.blocks, &self.ws, &self.padded, cache, &x, [&s[0], &s[1]], &y)
    }

    /// Fills `self.padded` with `meta`'s decode rows followed by padding rows up to `bucket`,
    /// with block tables `max_blocks_per_seq` wide.
    fn pad(&mut self, meta: &MlaBatchMetadata, bucket: i64) {
        let b = meta.num_decode_tokens as usize;
        let w = self.cfg.max_blocks_per_seq as usize;
        let pad = bucket as usize - b;
        let p = &mut self.padded;
        p.num_decode_tokens = bucket;
        p.positions.clear();
        p.positions.extend_from_slice(&meta.positions[..b]);
        p.positions.extend(std::iter::repeat_n(0, pad));
        p.slot_mapping.clear();
        p.slot_mapping.extend_from_slice(&meta.slot_mapping[..b]);
        p.slot_mapping.extend(std::iter::repeat_n(-1, pad));
        p.decode_max_blocks = w as i64;
        p.decode_block_table.clear();
        let mb = meta.decode_max_blocks as usize;
        for row in 0..b {
            p.decode_block_table.extend_from_slice(&meta.decode_block_table[row * mb..(row + 1) * mb]);
            p.decode_block_table.extend(std::iter::repeat_n(0, w - mb));
        }
        p.decode_block_table.extend(std::iter::repeat_n(0, pad * w));
        p.decode_seq_lens.clear();
        p.decode_seq_lens.extend_from_slice(&meta.decode_seq_lens[..b]);
        p.decode_seq_lens.extend(std::iter::repeat_n(0, pad));
        p.prefill_cu_seqlens_q.clear();
        p.prefill_context_lens.clear();
        p.prefill_max_blocks = 0;
        p.prefill_block_table.clear();
        p.max_query_len = 0;
        p.chunks.clear();
    }

    /// Validates `self.padded` against the cache and uploads it into the workspace.
    fn upload(&mut self, bucket_idx: usize, rows: i64) -> Result<()> {
        let bucket = self.cfg.buckets[bucket_idx];
        let (nb, bs) = self.cache_dims;
        self.padded.check(bucket, nb, bs, self.blocks[0].max_position())?;
        self.blocks[0].prepare(&self.queue, &mut self.ws, &self.padded)?;
        self.prepared = Some(Prepared { bucket: bucket_idx, rows });
        Ok(())
    }

    /// The graphs hold the workspace's addresses: it must not have reallocated.
    fn check_no_growth(&self) -> Result<()> {
        if self.ws.allocations() != self.ws_allocations {
            return Err(Error::other(
                OP,
                format!(
                    "the workspace reallocated after the graphs were captured ({} allocations, {} at capture)",
                    self.ws.allocations(),
                    self.ws_allocations
                ),
            ));
        }
        Ok(())
    }
}

impl Drop for DecodeGraphs<'_> {
    /// Waits for replays still running before the buffers they use are freed.
    fn drop(&mut self) {
        let _ = self.queue.synchronize();
    }
}
