//! A model's whole attention stack on one cache allocator, as engines run it: one
//! [`BlockAllocator`](crate::BlockAllocator) (sequences, block tables, slots) for every
//! layer, one cache tensor `[layers, blocks, block_size, L+R]` ([`LayeredKvCache`]), one
//! [`MlaBatchMetadata`] plan and one metadata upload per step, then every layer's
//! [`MlaBlock::launch`] on the same workspace, the output of layer `i` feeding layer `i + 1`.
//!
//! Only the attention blocks run: a real model has its norms, MLP/MoE and residual adds
//! between them (not part of vt), so [`forward_layers`] chains the blocks directly.

use std::time::Instant;

use vt_core::{Buffer, Error, Queue, Result, Tensor};

use crate::block::MlaBlock;
use crate::kv_cache::LayeredKvCache;
use crate::metadata::{MlaBatchMetadata, StepSeq};
use crate::tp::DecodeBenchOptions;
use crate::workspace::{MlaLimits, MlaWorkspace};

const OP: &str = "forward_layers";

/// Checks that `blocks` can share one workspace and one plan: the same dims, dtype, device
/// and norm+rope path, and one cache layer each.
pub fn check_layers(blocks: &[MlaBlock<'_>], cache: &LayeredKvCache) -> Result<()> {
    let Some(first) = blocks.first() else {
        return Err(Error::invalid(OP, "blocks", "no layers"));
    };
    if blocks.len() as i64 != cache.num_layers() {
        return Err(Error::invalid(
            OP,
            "blocks",
            format!("{} blocks for a cache of {} layers", blocks.len(), cache.num_layers()),
        ));
    }
    for (i, b) in blocks.iter().enumerate() {
        if b.dims() != first.dims()
            || b.dtype() != first.dtype()
            || b.device() != first.device()
            || b.uses_fused_norm_rope() != first.uses_fused_norm_rope()
        {
            return Err(Error::invalid(
                OP,
                "blocks",
                format!(
                    "layer {i} differs from layer 0 in dims, dtype, device or norm+rope path; one plan and \
                     workspace serve identical layers"
                ),
            ));
        }
    }
    Ok(())
}

/// One step of every layer: `meta` (planned once on `cache`) is uploaded once into `ws`
/// ([`MlaBlock::prepare`] of layer 0), then layer `i` runs [`MlaBlock::launch`] on cache
/// layer `i`, reading `x` (layer 0) or the previous layer's output and writing `out` (the
/// last layer) or one of the two `[T, H]` scratch tensors in `scratch`, alternately.
///
/// Issues work on `q` without waiting; after `prepare`, only op launches (so the layers'
/// launches of a decode step can be captured into one CUDA graph and replayed after each
/// step's `prepare`).
#[allow(clippy::too_many_arguments)]
pub fn forward_layers(
    q: &Queue,
    blocks: &[MlaBlock<'_>],
    ws: &mut MlaWorkspace,
    meta: &MlaBatchMetadata,
    cache: &LayeredKvCache,
    x: &Tensor<'_>,
    scratch: [&Tensor<'_>; 2],
    out: &Tensor<'_>,
) -> Result<()> {
    check_layers(blocks, cache)?;
    blocks[0].prepare(q, ws, meta)?;
    launch_layers(q, blocks, ws, meta, cache, x, scratch, out)
}

/// The device-side half of [`forward_layers`]: every layer's launch on a workspace already
/// prepared for `meta`.
#[allow(clippy::too_many_arguments)]
pub fn launch_layers(
    q: &Queue,
    blocks: &[MlaBlock<'_>],
    ws: &MlaWorkspace,
    meta: &MlaBatchMetadata,
    cache: &LayeredKvCache,
    x: &Tensor<'_>,
    scratch: [&Tensor<'_>; 2],
    out: &Tensor<'_>,
) -> Result<()> {
    let n = blocks.len();
    for (i, block) in blocks.iter().enumerate() {
        let input = if i == 0 { x } else { scratch[(i - 1) % 2] };
        let output = if i + 1 == n { out } else { scratch[i % 2] };
        block.launch(q, ws, input, meta, &cache.layer(i as i64)?, output)?;
    }
    Ok(())
}

/// What [`bench_decode_layers`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct LayersBenchResult {
    pub layers: usize,
    /// The median round's time per step (all layers), milliseconds.
    pub ms_per_step: f64,
    /// The fastest round's.
    pub min_ms_per_step: f64,
    /// `ms_per_step / layers`.
    pub ms_per_layer: f64,
    pub rounds_ms: Vec<f64>,
}

/// Times decode steps of `blocks` (every layer of a model's attention stack) on one queue:
/// a [`LayeredKvCache`] with one allocator, each step planned once and prepared once, then
/// every layer launched, layer `i`'s output feeding layer `i + 1`. The cache is first filled
/// with `context` tokens per sequence by prefill steps through all layers; then `warmup`
/// untimed steps and `rounds` rounds of `steps` timed steps of `batch` sequences
/// (host-timed until the queue has finished; the median round is reported). `opts.rounds`
/// etc. as [`crate::tp::bench_decode`].
pub fn bench_decode_layers(
    q: &Queue,
    blocks: &[MlaBlock<'_>],
    opts: &DecodeBenchOptions,
    seed: u64,
) -> Result<LayersBenchResult> {
    const CTX: &str = "bench_decode_layers";
    let o = *opts;
    let Some(first) = blocks.first() else {
        return Err(Error::invalid(CTX, "blocks", "no layers"));
    };
    let total = o.checked_positions(CTX, first.max_position())?;
    let d = *first.dims();
    let dt = first.dtype();
    let bs = o.block_size;
    let blocks_per_seq = total / bs + i64::from(total % bs != 0);
    let num_blocks = o
        .batch
        .checked_mul(blocks_per_seq)
        .ok_or_else(|| Error::invalid(CTX, "batch", "batch x blocks per sequence overflows"))?;
    let mut cache = LayeredKvCache::new(q, dt, blocks.len() as i64, num_blocks, bs, d.cache_row_dim())?;
    check_layers(blocks, &cache)?;
    let (seqs_per_prefill, prefill_rows) = o.prefill_seqs_and_rows();
    let rows = prefill_rows.max(o.batch);
    let mut ws = MlaWorkspace::new(MlaLimits {
        max_tokens: rows,
        max_seqs: o.batch,
        max_blocks_per_seq: blocks_per_seq,
        chunk_workspace_tokens: prefill_rows,
    })?;
    let mut rng = crate::tp::random::SplitMix64::new(seed);
    let h = d.hidden_size;
    let x = Buffer::from_bytes(
        q,
        dt,
        &[rows, h],
        &crate::tp::random::uniform_bytes(&mut rng, dt, (rows * h) as usize, 1.0),
    )?;
    let (sa, sb, y) =
        (Buffer::nan(q, dt, &[rows, h])?, Buffer::nan(q, dt, &[rows, h])?, Buffer::nan(q, dt, &[rows, h])?);
    let ids: Vec<_> = (0..o.batch).map(|_| cache.add_sequence()).collect();
    let mut meta = MlaBatchMetadata::default();
    let ctx_pos: Vec<i64> = (0..o.context).collect();
    let step = |meta: &MlaBatchMetadata, ws: &mut MlaWorkspace, cache: &LayeredKvCache| -> Result<()> {
        let t = meta.num_tokens();
        let (xi, a, b, yo) = (
            x.view().slice(0, 0, t)?,
            sa.view().slice(0, 0, t)?,
            sb.view().slice(0, 0, t)?,
            y.view().slice(0, 0, t)?,
        );
        forward_layers(q, blocks, ws, meta, cache, &xi, [&a, &b], &yo)
    };
    for group in ids.chunks(seqs_per_prefill as usize) {
        let seqs: Vec<StepSeq<'_>> =
            group.iter().map(|&seq| StepSeq { seq, positions: &ctx_pos, decode: false }).collect();
        meta.plan(&mut cache, &seqs, prefill_rows)?;
        step(&meta, &mut ws, &cache)?;
    }
    let mut pos = o.context;
    let mut decode =
        |meta: &mut MlaBatchMetadata, ws: &mut MlaWorkspace, cache: &mut LayeredKvCache| -> Result<()> {
            let p = [pos];
            let seqs: Vec<StepSeq<'_>> =
                ids.iter().map(|&seq| StepSeq { seq, positions: &p, decode: true }).collect();
            meta.plan(cache, &seqs, prefill_rows)?;
            step(meta, ws, cache)?;
            pos += 1;
            Ok(())
        };
    for _ in 0..o.warmup {
        decode(&mut meta, &mut ws, &mut cache)?;
    }
    q.synchronize()?;
    let mut rounds_ms = Vec::with_capacity(o.rounds);
    for _ in 0..o.rounds {
        let t0 = Instant::now();
        for _ in 0..o.steps {
            decode(&mut meta, &mut ws, &mut cache)?;
        }
        q.synchronize()?;
        rounds_ms.push(t0.elapsed().as_secs_f64() * 1e3 / o.steps as f64);
    }
    let out = q.read_f64(&y.view().slice(0, 0, o.batch)?)?;
    if out.iter().any(|v| !v.is_finite()) {
        return Err(Error::other(CTX, "a decode step produced a non-finite output"));
    }
    let (ms, min_ms_per_step) = crate::tp::median_and_fastest(&rounds_ms);
    Ok(LayersBenchResult {
        layers: blocks.len(),
        ms_per_step: ms,
        min_ms_per_step,
        ms_per_layer: ms / blocks.len() as f64,
        rounds_ms,
    })
}
