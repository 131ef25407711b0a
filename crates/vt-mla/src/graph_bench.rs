//! `vt-mla bench --graph`: a decode step of random layers (TP = 1, one device) run eagerly
//! and replayed as a graph (`mla_block::DecodeGraphs`, one bucket = the batch), side by
//! side, with a per-op breakdown.
//!
//! - **Engine loop** (host-timed): `--rounds` rounds of `--steps` steps, each step a new
//!   token for every sequence (`plan`, `DecodeGraphs::prepare`, then `run_eager` or `run`),
//!   the queue synchronized at the end of a round; the median round per step.
//! - **One step** (device-timed): the same prepared step run `--iters` times, each between
//!   two events; on CUDA with the L2 flushed before each (as `triton.testing.do_bench`, which
//!   `tools/peers/block_step.py` uses for torch + FlashMLA); the median.
//! - **Per op**: the step run op by op with an event before and after each launch
//!   (`op_timer::profile_events`), issued while the device still runs earlier graph replays
//!   so the launches run back to back; median per launch over `--profile` steps, summed by
//!   name, and the device's gap before each launch (previous launch's closing event to this
//!   one's opening event). The launch gaps are a step's time minus the sum of its ops: eager,
//!   what launching op by op costs; graph, what remains between the replayed kernels.
//! - **Floor** (CUDA): the weights and the KV cache streamed once at the measured
//!   device-to-device copy bandwidth, or the FLOPs at a measured cuBLAS bf16 GEMM rate,
//!   whichever is longer (`block_step.py`'s formula with measured ceilings); printed for
//!   the weights in the compute dtype and in fp8 (1 byte an element plus the 128 x 128 block
//!   scales, for the weights `mla_block::fp8` keeps fp8), whichever the layer holds.
//! - **Weights**: the random layer in `--dtype`, or with `--weights-dtype fp8` its
//!   projections block-quantized as DeepSeek's fp8 checkpoints hold them
//!   (`mla_block::fp8::quantize_host_weights`) and multiplied in fp8.

use std::time::Instant;

use mla_block::layers::forward_layers;
use mla_block::{
    DecodeGraphConfig, DecodeGraphs, LayeredKvCache, MlaBatchMetadata, MlaBlock, MlaBlockDims, MlaLimits,
    MlaWorkspace, StepMode, StepSeq,
};
use vt_core::{Buffer, DeviceType, Error, Queue, Result};

use crate::bench_prefill::{aggregate, median, OpTime};
use crate::op_timer;

const CTX: &str = "vt-mla bench --graph";

/// What to time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphBenchOptions {
    pub batch: i64,
    pub context: i64,
    pub block_size: i64,
    pub warmup: usize,
    pub steps: usize,
    pub rounds: usize,
    /// Device-timed runs of one step.
    pub iters: usize,
    /// Profiled steps of the per-op breakdown.
    pub profile: usize,
    /// Prefill tokens per forward while filling the cache.
    pub prefill_tokens: i64,
}

impl Default for GraphBenchOptions {
    fn default() -> Self {
        GraphBenchOptions {
            batch: 64,
            context: 1024,
            block_size: 64,
            warmup: 5,
            steps: 20,
            rounds: 5,
            iters: 50,
            profile: 10,
            prefill_tokens: 8192,
        }
    }
}

/// What [`run`] measured (milliseconds).
#[derive(Clone, Debug, PartialEq)]
pub struct GraphBench {
    pub mode: StepMode,
    /// The blocks' compute dtype.
    pub dtype: vt_core::DType,
    /// Engine loop, median round per step.
    pub loop_eager_ms: f64,
    pub loop_graph_ms: f64,
    /// One step, device-timed (L2 flushed on CUDA).
    pub step_eager_ms: f64,
    pub step_graph_ms: f64,
    /// Whether `step_*` flushed the L2 before each run.
    pub l2_flushed: bool,
    /// Per op, summed over launches of one name (all layers).
    pub ops: Vec<OpTime>,
    /// The device's gap before each op's launches (same order and names as `ops`), from the
    /// same profiled steps: launches queued back to back.
    pub gaps: Vec<OpTime>,
    /// (weight bytes, KV bytes, FLOPs) of the step, the weights in the compute dtype.
    pub model: (f64, f64, f64),
    /// The step's weight bytes with the weights in fp8 ([`fp8_weight_bytes`]).
    pub weight_bytes_fp8: f64,
    /// The floor and what it came from, where it could be measured (CUDA).
    pub floor: Option<Floor>,
}

/// The step's floor from measured ceilings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Floor {
    pub ms: f64,
    /// The floor with the weights streamed in fp8 ([`fp8_weight_bytes`]).
    pub ms_fp8: f64,
    pub weight_bytes: f64,
    pub kv_bytes: f64,
    pub flops: f64,
    /// Bytes per second (read + written) of a device-to-device copy.
    pub copy_bandwidth: f64,
    /// bf16 GEMM FLOP per second.
    pub gemm_flops: f64,
}

impl GraphBench {
    /// The sum of the ops' median times.
    pub fn ops_ms(&self) -> f64 {
        self.ops.iter().map(|o| o.ms).sum()
    }

    /// The sum of the gaps between queued launches.
    pub fn gaps_ms(&self) -> f64 {
        self.gaps.iter().map(|o| o.ms).sum()
    }
}

/// Model sizes of one decode step of `layers` layers: (weight bytes, KV bytes, FLOPs) at
/// batch `b` and `ctx` cached tokens (the new one included), `elt` bytes per element.
pub fn step_model(d: &MlaBlockDims, layers: usize, b: i64, ctx: i64, elt: f64) -> (f64, f64, f64) {
    let (h, n, ql) = (d.hidden_size as f64, d.num_heads as f64, d.q_lora_rank as f64);
    let (l, p, r, v) =
        (d.kv_lora_rank as f64, d.qk_nope_head_dim as f64, d.qk_rope_head_dim as f64, d.v_head_dim as f64);
    let q_in = if d.has_q_lora() { ql } else { h };
    // A-projections, q_b (or q_proj), W_UK_T and W_UV, o_proj: elements.
    let w = (ql + l + r) * h + n * (p + r) * q_in + n * p * l + n * l * v + h * n * v;
    let (b, ctx, layers) = (b as f64, ctx as f64, layers as f64);
    let kv = b * ctx * (l + r) * elt;
    let flops = 2.0 * b * w + 2.0 * b * n * ctx * (l + r + l);
    (layers * w * elt, layers * kv, layers * flops)
}

/// Weight bytes of one decode step of `layers` layers with fp8 weights: 1 byte an element
/// plus an f32 scale per 128 x 128 block for each weight the block keeps in fp8
/// (`mla_block::fp8::keeps_fp8`, `absorbed_keep_fp8` under `VT_FP8_ABSORBED`), `elt` bytes an
/// element for the rest.
pub fn fp8_weight_bytes(d: &MlaBlockDims, layers: usize, elt: f64) -> f64 {
    use mla_block::fp8::{absorbed_keep_fp8, keeps_fp8};
    use vt_core::fp8_block::blocks;
    let (h, n, ql) = (d.hidden_size, d.num_heads, d.q_lora_rank);
    let (l, p, r, v) = (d.kv_lora_rank, d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim);
    let absorbed = absorbed_keep_fp8(d) && vt_core::flags::fp8_absorbed();
    // (heads, rows, cols, kept in fp8): q_a (or none), kv_a, q_b (or q_proj), W_UK_T, W_UV, o_proj.
    let mut w = vec![(1, l + r, h, keeps_fp8("kv_a_proj_with_mqa", d))];
    if d.has_q_lora() {
        w.extend([(1, ql, h, true), (1, n * (p + r), ql, true)]);
    } else {
        w.push((1, n * (p + r), h, true));
    }
    w.extend([(n, p, l, absorbed), (n, l, v, absorbed), (1, h, n * v, true)]);
    let bytes: f64 = w
        .into_iter()
        .map(|(g, rows, cols, fp8)| {
            let elems = (g * rows * cols) as f64;
            if fp8 {
                elems + 4.0 * (g * blocks(rows) * blocks(cols)) as f64
            } else {
                elems * elt
            }
        })
        .sum();
    layers as f64 * bytes
}

/// `n` values uniform in [-scale, scale) (unit variance at sqrt(3)), as bytes of `dt`.
pub(crate) fn random_bytes(dt: vt_core::DType, n: usize, seed: u64, scale: f32) -> Vec<u8> {
    let mut z = seed ^ 0x9E37_79B9_7F4A_7C15;
    let vals: Vec<f64> = (0..n)
        .map(|_| {
            z = z.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((z >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) * f64::from(scale)
        })
        .collect();
    vt_core::encode_f64(dt, &vals)
}

/// Times decode steps of `blocks` on `q` (see the module docs). `op_timer::install` for the
/// queue's device must have run before the blocks' first op.
pub fn run(q: &Queue, blocks: &[MlaBlock<'_>], o: &GraphBenchOptions, seed: u64) -> Result<GraphBench> {
    let Some(first) = blocks.first() else {
        return Err(Error::invalid(CTX, "blocks", "no layers"));
    };
    for (name, v) in [("batch", o.batch), ("context", o.context), ("block_size", o.block_size)] {
        if v <= 0 {
            return Err(Error::invalid(CTX, name, format!("must be > 0, got {v}")));
        }
    }
    if o.steps == 0 || o.rounds == 0 || o.iters == 0 || o.profile == 0 {
        return Err(Error::invalid(CTX, "steps", "steps, rounds, iters and profile must be > 0"));
    }
    let d = *first.dims();
    let dt = first.dtype();
    let h = d.hidden_size;
    let decode_steps = 2 * (o.warmup + o.steps * o.rounds) as i64;
    let total = o.context + decode_steps;
    if total > first.max_position() {
        return Err(Error::invalid(
            CTX,
            "context",
            format!("context + decode steps = {total} exceed the {} rope positions", first.max_position()),
        ));
    }
    let bs = o.block_size;
    let blocks_per_seq = (total + bs - 1) / bs;
    let num_blocks = o
        .batch
        .checked_mul(blocks_per_seq)
        .ok_or_else(|| Error::invalid(CTX, "batch", "batch x blocks per sequence overflows"))?;
    let mut cache = LayeredKvCache::new(q, dt, blocks.len() as i64, num_blocks, bs, d.cache_row_dim())?;
    let ids: Vec<_> = (0..o.batch).map(|_| cache.add_sequence()).collect();
    let mut meta = MlaBatchMetadata::default();

    // Fill every sequence's context with prefill steps (their own workspace, dropped after).
    {
        let per = (o.prefill_tokens / o.context).clamp(1, o.batch);
        let rows = per * o.context;
        let mut ws = MlaWorkspace::new(MlaLimits {
            max_tokens: rows,
            max_seqs: per,
            max_blocks_per_seq: blocks_per_seq,
            chunk_workspace_tokens: rows,
        })?;
        let x =
            Buffer::from_bytes(q, dt, &[rows, h], &random_bytes(dt, (rows * h) as usize, seed, 3f32.sqrt()))?;
        let [a, b, y] = [0; 3].map(|_| Buffer::uninit(q, dt, &[rows, h]));
        let (a, b, y) = (a?, b?, y?);
        let pos: Vec<i64> = (0..o.context).collect();
        for group in ids.chunks(per as usize) {
            let seqs: Vec<StepSeq<'_>> =
                group.iter().map(|&seq| StepSeq { seq, positions: &pos, decode: false }).collect();
            meta.plan(&mut cache, &seqs, rows)?;
            let t = meta.num_tokens();
            let (xv, av, bv, yv) = (
                x.view().slice(0, 0, t)?,
                a.view().slice(0, 0, t)?,
                b.view().slice(0, 0, t)?,
                y.view().slice(0, 0, t)?,
            );
            forward_layers(q, blocks, &mut ws, &meta, &cache, &xv, [&av, &bv], &yv)?;
        }
        q.synchronize()?;
    }

    let cfg = DecodeGraphConfig::new(blocks_per_seq).with_buckets(&[o.batch]);
    let mut graphs = DecodeGraphs::new(q, blocks, &cache, cfg)?;
    let mode = graphs.mode().clone();
    let has_graphs = mode == StepMode::Graph;
    let mut pos = o.context;
    let mut step = |graphs: &mut DecodeGraphs<'_>, cache: &mut LayeredKvCache, graph: bool| -> Result<()> {
        let p = [pos];
        let seqs: Vec<StepSeq<'_>> =
            ids.iter().map(|&seq| StepSeq { seq, positions: &p, decode: true }).collect();
        meta.plan(cache, &seqs, 1)?;
        graphs.prepare(&meta)?;
        pos += 1;
        if graph {
            graphs.run(cache)
        } else {
            graphs.run_eager(cache)
        }
    };
    step(&mut graphs, &mut cache, false)?;
    q.write_bytes(
        &graphs.input()?,
        &random_bytes(dt, (o.batch * h) as usize, seed.wrapping_add(1), 3f32.sqrt()),
    )?;

    // Engine loop: eager, then graph.
    let mut loop_ms = [0.0; 2];
    for (k, graph) in [false, true].into_iter().enumerate() {
        for _ in 0..o.warmup {
            step(&mut graphs, &mut cache, graph)?;
        }
        q.synchronize()?;
        let mut rounds = Vec::with_capacity(o.rounds);
        for _ in 0..o.rounds {
            let t0 = Instant::now();
            for _ in 0..o.steps {
                step(&mut graphs, &mut cache, graph)?;
            }
            q.synchronize()?;
            rounds.push(t0.elapsed().as_secs_f64() * 1e3 / o.steps as f64);
        }
        loop_ms[k] = median(&rounds);
    }
    let out = q.read_f64(&graphs.output()?)?;
    if out.iter().any(|v| !v.is_finite()) {
        return Err(Error::other(CTX, "a decode step produced a non-finite output"));
    }

    // One step, device-timed: the last prepared step again.
    let timer = StepTimer::new(q);
    let step_eager = timer.time(o.iters, || graphs.run_eager(&cache))?;
    let step_graph = timer.time(o.iters, || graphs.run(&cache))?;

    // Per op: each profiled step queued behind graph replays (device busy, launches back to
    // back); without graphs (the CPU, which runs inline) straight away.
    let mut profiled = Vec::with_capacity(o.profile);
    for _ in 0..o.profile {
        if has_graphs {
            // Device work queued ahead: longer than issuing the profiled step takes on the
            // host (~0.3 ms a layer with its events, at least 2 ms).
            let busy_ms = (0.3 * blocks.len() as f64).max(2.0);
            let ahead = ((busy_ms / step_graph.max(1e-3)).ceil() as usize).clamp(4, 256);
            for _ in 0..ahead {
                graphs.run(&cache)?;
            }
        }
        profiled.push(op_timer::profile_events(&d, || graphs.run_eager(&cache))?);
    }
    let split = |f: fn(&op_timer::EventTiming) -> f64| -> Vec<Vec<(String, f64)>> {
        profiled.iter().map(|p| p.iter().map(|t| (t.name.clone(), f(t))).collect()).collect()
    };
    let ops = aggregate(&split(|t| t.ms))?;
    let gaps = aggregate(&split(|t| t.gap_ms))?;
    // `pos` tokens cached per sequence at the last prepared step (its new one included).
    let elt = dt.size_of() as f64;
    let model = step_model(&d, blocks.len(), o.batch, pos, elt);
    let weight_bytes_fp8 = fp8_weight_bytes(&d, blocks.len(), elt);
    let floor = timer.floor(model, weight_bytes_fp8)?;
    q.synchronize()?;
    Ok(GraphBench {
        mode,
        dtype: dt,
        loop_eager_ms: loop_ms[0],
        loop_graph_ms: loop_ms[1],
        step_eager_ms: step_eager,
        step_graph_ms: step_graph,
        l2_flushed: timer.flushes(),
        ops,
        gaps,
        model,
        weight_bytes_fp8,
        floor,
    })
}

/// Device timing of one step: CUDA events with an L2 flush before each run on a CUDA queue,
/// `vt_core` events elsewhere (also `bench-gemm`'s).
pub(crate) struct StepTimer<'q> {
    q: &'q Queue,
    #[cfg(feature = "cuda")]
    cuda: Option<vt_cuda::bench::Bench<'q>>,
}

impl<'q> StepTimer<'q> {
    pub(crate) fn new(q: &'q Queue) -> StepTimer<'q> {
        StepTimer {
            q,
            #[cfg(feature = "cuda")]
            cuda: if q.device().kind == DeviceType::Cuda {
                // 256 MB: five times the H200's L2.
                vt_cuda::bench::Bench::new(q, 256 << 20).ok()
            } else {
                None
            },
        }
    }

    pub(crate) fn flushes(&self) -> bool {
        #[cfg(feature = "cuda")]
        if self.cuda.is_some() {
            return true;
        }
        false
    }

    /// The median milliseconds of `iters` runs of `f` (after 3 untimed ones).
    pub(crate) fn time(&self, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        #[cfg(feature = "cuda")]
        if let Some(b) = &self.cuda {
            let us = b.time_us(3, iters, true, &mut f)?;
            return Ok(median(&us) * 1e-3);
        }
        for _ in 0..3 {
            f()?;
        }
        let mut ms = Vec::with_capacity(iters);
        for _ in 0..iters {
            let a = self.q.record_event()?;
            f()?;
            let b = self.q.record_event()?;
            ms.push(a.elapsed_ms(&b)?);
        }
        Ok(median(&ms))
    }

    /// Device-to-device copy bandwidth (bytes read + written per second), where it can be
    /// measured (CUDA).
    pub(crate) fn copy_bandwidth(&self) -> Result<Option<f64>> {
        #[cfg(feature = "cuda")]
        if let Some(bench) = &self.cuda {
            return bench.copy_bandwidth(1 << 30, 20).map(Some);
        }
        Ok(None)
    }

    /// Fills the contiguous view `t` with values uniform in [-scale, scale) from `seed`
    /// (a device kernel on CUDA, host bytes elsewhere).
    pub(crate) fn fill(&self, t: &vt_core::Tensor<'_>, seed: u64, scale: f32) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(bench) = &self.cuda {
            return bench.fill(t, seed, scale);
        }
        let bytes = random_bytes(t.dtype(), t.numel() as usize, seed, scale);
        self.q.write_bytes(t, &bytes)
    }

    /// The floor of a step of `(weight bytes, KV bytes, FLOPs)`, and with `fp8_weight_bytes`
    /// instead, where the ceilings can be measured.
    fn floor(
        &self,
        (weight_bytes, kv_bytes, flops): (f64, f64, f64),
        fp8_weight_bytes: f64,
    ) -> Result<Option<Floor>> {
        #[cfg(feature = "cuda")]
        if let Some(bench) = &self.cuda {
            let copy_bandwidth = bench.copy_bandwidth(1 << 30, 20)?;
            let gemm_flops = bench.gemm_bf16_flops(8192, 10)?;
            let at = |w: f64| ((w + kv_bytes) / copy_bandwidth).max(flops / gemm_flops) * 1e3;
            let (ms, ms_fp8) = (at(weight_bytes), at(fp8_weight_bytes));
            return Ok(Some(Floor { ms, ms_fp8, weight_bytes, kv_bytes, flops, copy_bandwidth, gemm_flops }));
        }
        let _ = (weight_bytes, kv_bytes, flops, fp8_weight_bytes);
        Ok(None)
    }
}

/// `vt-mla bench --graph`: `layers` random layers of `spec` on device 0 of `kind`, timed by
/// [`run`] and printed.
#[allow(clippy::too_many_arguments)]
pub fn command(
    kind: DeviceType,
    layer_name: &str,
    spec: mla_block::tp::RandomLayerSpec,
    dtype: vt_core::DType,
    layers: usize,
    (seed, weights_dtype): (u64, mla_block::WeightsDtype),
    tp_note: bool,
    o: &GraphBenchOptions,
    peer: Option<&std::path::Path>,
) -> Result<()> {
    // The peer's file is read first: a bad file fails before minutes of set-up.
    let peer = match peer {
        Some(path) => {
            let ctx = format!("{CTX} --peer {}", path.display());
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::other(ctx.clone(), format!("cannot read: {e}")))?;
            let rows = parse_peer(&text, &ctx)?;
            let row = rows.into_iter().find(|r| r.b == o.batch && r.ctx == o.context).ok_or_else(|| {
                Error::other(ctx, format!("has no row for batch {} and context {}", o.batch, o.context))
            })?;
            Some(row)
        }
        None => None,
    };
    let q = Queue::new(vt_core::Device::new(kind, 0))?;
    op_timer::install(kind)?;
    let bar = crate::progress::spinner(format!("making and uploading {layers} random {layer_name} layer(s)"));
    let mut stores = Vec::with_capacity(layers);
    let mut cfg = None;
    for i in 0..layers {
        let (c, w) = crate::tp::random_layer(&spec, dtype, seed.wrapping_add(i as u64), weights_dtype)?;
        stores.push(mla_block::MlaWeightStore::from_host(&q, &c, &w)?);
        cfg = Some(c);
    }
    bar.finish_and_clear();
    let Some(cfg) = cfg else {
        return Err(Error::invalid(CTX, "layers", "must be > 0"));
    };
    let blocks = stores
        .iter()
        .map(|s| MlaBlock::new(cfg.dims, s.views(), cfg.rope.is_neox))
        .collect::<Result<Vec<_>>>()?;
    let d = cfg.dims;
    let fp8_weights = stores[0].fp8_weights();
    println!(
        "vt-mla bench --graph: decode step of {layers} random {layer_name} MLA layer(s) ({dtype}, {}; hidden {}, {} \
         heads, q_lora {}, kv_lora {}, rope {}, nope {}, v {}) on {kind}:0, TP = 1, {} norm+rope",
        crate::tp::weights_label(dtype, fp8_weights),
        d.hidden_size,
        d.num_heads,
        d.q_lora_rank,
        d.kv_lora_rank,
        d.qk_rope_head_dim,
        d.qk_nope_head_dim,
        d.v_head_dim,
        if blocks[0].uses_fused_norm_rope() { "fused" } else { "split" }
    );
    // The decode-step fusions follow their flags (read from the environment once per
    // process, so A/B them with one process per setting).
    let on_off = |b: bool| if b { "on" } else { "off" };
    println!(
        "decode-step fusions: VT_FUSE_DECODE_QUERY {} (q rope + absorbed query in FusedNormRope / the BMM), \
         VT_FUSE_CACHE_WRITE {} (cache write in FusedNormRope)",
        on_off(blocks[0].uses_fused_decode_query()),
        on_off(blocks[0].uses_fused_cache_write())
    );
    if fp8_weights > 0 {
        let min = mla_block::fp8::FP8_QUANT_MIN_TOKENS;
        let step = if o.batch >= min {
            format!(
                "decode steps of {} tokens quantize their activations (both operands fp8, from {min} tokens)",
                o.batch
            )
        } else {
            format!(
                "decode steps of {} tokens multiply 16-bit activations by them (weight-only, below {min})",
                o.batch
            )
        };
        println!(
            "fp8 weights: {step}; the prefills that fill the cache quantize their activations (both operands fp8; \
             cuBLASLt unless VT_FP8_LT=0 (default on): {}); the absorbed W_UK_T / W_UV {} (VT_FP8_ABSORBED {}, \
             VT_FP8_ABSORBED_BY_STEP {})",
            on_off(vt_core::flags::fp8_lt()),
            match (vt_core::flags::fp8_absorbed(), vt_core::flags::fp8_absorbed_by_step()) {
                (false, _) => "dequantized",
                (true, false) => "fp8",
                (true, true) => "in both forms, the float one from 32 tokens a step",
            },
            on_off(vt_core::flags::fp8_absorbed()),
            on_off(vt_core::flags::fp8_absorbed_by_step())
        );
    }
    if tp_note {
        println!("(--graph times TP = 1 on one device; the --tp list is not used)");
    }
    println!(
        "batch {} sequences x context {} tokens, block size {}; {} warm-up steps per mode; graphs: DecodeGraphs with one \
         bucket of {} (no padding)",
        o.batch, o.context, o.block_size, o.warmup, o.batch
    );
    let r =
        crate::progress::stage(format!("filling the cache, capturing, timing (B = {})", o.batch), || {
            run(&q, &blocks, o, seed)
        })?;
    print(&r, o, fp8_weights > 0);
    if let Some(p) = &peer {
        println!(
            "peer (torch + FlashMLA, tools/peers/block_step.py, same call): eager {:.1} us, graph {:.1} us, its floor {:.1} \
             us; vt graph / peer graph = {:.2}",
            p.eager_us,
            p.graph_us,
            p.floor_us,
            r.step_graph_ms * 1e3 / p.graph_us
        );
    }
    Ok(())
}

/// One row of `tools/peers/block_step.py --json`: the torch + FlashMLA decode step (us).
#[derive(Clone, Debug, PartialEq)]
pub struct PeerStep {
    pub b: i64,
    pub ctx: i64,
    pub eager_us: f64,
    pub graph_us: f64,
    pub floor_us: f64,
}

/// Parses `block_step.py`'s JSON: `{"peer": NAME, "rows": [{"b", "ctx", "eager_us", "graph_us",
/// "floor_us"}, ...]}`; other keys are ignored. `ctx` names the file in errors.
pub fn parse_peer(text: &str, ctx: &str) -> Result<Vec<PeerStep>> {
    let bad = |msg: String| Error::other(ctx.to_string(), msg);
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let rows = v.get("rows").and_then(|r| r.as_array()).ok_or_else(|| bad("has no \"rows\" list".into()))?;
    let mut out = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let int = |key: &str| {
            row.get(key).and_then(|x| x.as_i64()).ok_or_else(|| bad(format!("row {i}: no integer \"{key}\"")))
        };
        let time = |key: &str| {
            row.get(key)
                .and_then(|x| x.as_f64())
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| bad(format!("row {i}: no positive number \"{key}\"")))
        };
        out.push(PeerStep {
            b: int("b")?,
            ctx: int("ctx")?,
            eager_us: time("eager_us")?,
            graph_us: time("graph_us")?,
            floor_us: time("floor_us")?,
        });
    }
    Ok(out)
}

/// The report of [`run`]; `fp8_weights`: whether the layers hold fp8 weights (the floor the
/// step is measured against).
pub fn print(r: &GraphBench, o: &GraphBenchOptions, fp8_weights: bool) {
    match &r.mode {
        StepMode::Graph => {}
        StepMode::Eager { why } => println!("no graphs on this device, the graph column runs eagerly: {why}"),
    }
    let us = |ms: f64| ms * 1e3;
    println!("{:<44} {:>10} {:>10} {:>12}", "decode step (us)", "eager", "graph", "graph/eager");
    println!(
        "{:<44} {:>10.1} {:>10.1} {:>11.2}x",
        format!("engine loop ({} rounds x {} steps, host-timed)", o.rounds, o.steps),
        us(r.loop_eager_ms),
        us(r.loop_graph_ms),
        r.loop_graph_ms / r.loop_eager_ms
    );
    println!(
        "{:<44} {:>10.1} {:>10.1} {:>11.2}x",
        format!("one step (events{}, median of {})", if r.l2_flushed { ", L2 flushed" } else { "" }, o.iters),
        us(r.step_eager_ms),
        us(r.step_graph_ms),
        r.step_graph_ms / r.step_eager_ms
    );
    let (wb, kvb, fl) = r.model;
    let held = if fp8_weights { "fp8".to_string() } else { r.dtype.to_string() };
    if r.floor.is_none() {
        let (this, other) = if fp8_weights {
            (r.weight_bytes_fp8, format!("{:.1} MB in {}", wb / 1e6, r.dtype))
        } else {
            (wb, format!("{:.1} MB in fp8", r.weight_bytes_fp8 / 1e6))
        };
        println!(
            "one step moves weights {:.1} MB ({held} weights; {other}) + KV {:.1} MB and does {:.2} GFLOP (no floor: \
             ceilings are measured on CUDA)",
            this / 1e6,
            kvb / 1e6,
            fl / 1e9
        );
    }
    if let Some(f) = &r.floor {
        println!(
            "floor {:.1} us with {} weights: weights {:.0} MB + KV {:.0} MB at {:.2} TB/s (measured copy), or {:.0} GFLOP \
             at {:.0} TFLOP/s (measured bf16 GEMM)",
            us(f.ms),
            r.dtype,
            f.weight_bytes / 1e6,
            f.kv_bytes / 1e6,
            f.copy_bandwidth / 1e12,
            f.flops / 1e9,
            f.gemm_flops / 1e12
        );
        println!(
            "floor {:.1} us with fp8 weights: weights {:.0} MB (1 byte an element + the 128x128 block scales), the same \
             KV and FLOPs",
            us(f.ms_fp8),
            r.weight_bytes_fp8 / 1e6
        );
        let floor = if fp8_weights { f.ms_fp8 } else { f.ms };
        println!(
            "graph step at {:.0}% of the {held}-weight floor (this layer holds {held} weights)",
            100.0 * floor / r.step_graph_ms
        );
    }
    let sum = r.ops_ms();
    println!(
        "per op: device time of one step run op by op, an event before and after each launch (median of {} steps):",
        o.profile
    );
    println!("  {:<20} {:>9} {:>7} {:>9} {:>12}", "op", "us", "share", "launches", "gap before");
    for (op, gap) in r.ops.iter().zip(&r.gaps) {
        println!(
            "  {:<20} {:>9.1} {:>6.1}% {:>9} {:>12.1}",
            op.label,
            us(op.ms),
            100.0 * op.ms / sum,
            op.calls,
            us(gap.ms)
        );
    }
    println!("  {:<20} {:>9.1} {:>7} {:>9} {:>12.1}", "sum", us(sum), "", "", us(r.gaps_ms()));
    println!(
        "launch gaps (step - sum of ops): eager {:.1} us, graph {:.1} us; between launches queued back to back \
         (the gap column): {:.1} us",
        us(r.step_eager_ms - sum),
        us(r.step_graph_ms - sum),
        us(r.gaps_ms())
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use mla_block::tp::RandomLayerSpec;

    #[test]
    fn the_peer_file_is_parsed_and_bad_rows_are_named() {
        let ok = r#"{"peer": "torch + FlashMLA decode step", "rows": [
            {"b": 1, "ctx": 8192, "eager_us": 600.0, "graph_us": 210.5, "floor_us": 90.1}]}"#;
        let rows = parse_peer(ok, "peer.json").expect("parses");
        assert_eq!(
            rows,
            vec![PeerStep { b: 1, ctx: 8192, eager_us: 600.0, graph_us: 210.5, floor_us: 90.1 }]
        );
        for (text, says) in [
            ("nope", "not JSON"),
            ("{}", "no \"rows\""),
            (
                r#"{"rows": [{"b": 1, "eager_us": 1, "graph_us": 1, "floor_us": 1}]}"#,
                "row 0: no integer \"ctx\"",
            ),
            (r#"{"rows": [{"b": 1, "ctx": 2, "eager_us": 1, "graph_us": -1, "floor_us": 1}]}"#, "graph_us"),
        ] {
            let e = parse_peer(text, "peer.json").expect_err(text).to_string();
            assert!(e.contains("peer.json") && e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn the_step_model_counts_v3_weights_and_cache() {
        let d = RandomLayerSpec::DEEPSEEK_V3.config().unwrap().dims;
        let (w, kv, flops) = step_model(&d, 1, 1, 8193, 2.0);
        // 2112 x 7168 + 24576 x 1536 + 2 x 128 x 128 x 512 + 7168 x 16384 elements.
        let elems = 2112.0 * 7168.0 + 24576.0 * 1536.0 + 2.0 * 128.0 * 128.0 * 512.0 + 7168.0 * 16384.0;
        assert_eq!(w, 2.0 * elems);
        assert_eq!(kv, 8193.0 * 576.0 * 2.0);
        assert_eq!(flops, 2.0 * elems + 2.0 * 128.0 * 8193.0 * 1088.0);
        let (w2, kv2, _) = step_model(&d, 3, 2, 8193, 2.0);
        assert_eq!((w2, kv2), (3.0 * w, 6.0 * kv));
        // fp8: every weight of V3 stays fp8, 1 byte an element plus its 128 x 128 scales
        // (kv_a 5 x 56, q_a 12 x 56, q_b 192 x 12, W_UK_T / W_UV 128 x 4 each, o_proj 56 x 128).
        let scales = 5.0 * 56.0 + 12.0 * 56.0 + 192.0 * 12.0 + 2.0 * 128.0 * 4.0 + 56.0 * 128.0;
        assert_eq!(fp8_weight_bytes(&d, 1, 2.0), elems + 4.0 * scales);
        assert_eq!(fp8_weight_bytes(&d, 3, 2.0), 3.0 * (elems + 4.0 * scales));
        // The small layer: kv_lora 64, nope 32 are not multiples of 128, so kv_a and the
        // absorbed weights stay 16-bit.
        let s = RandomLayerSpec::SMALL.config().unwrap().dims;
        let (kva, absorbed) = (80.0 * 128.0, 2.0 * 16.0 * 32.0 * 64.0);
        let fp8 = 48.0 * 128.0 + 16.0 * 48.0 * 48.0 + 128.0 * 16.0 * 32.0;
        let fp8_scales = 1.0 + 6.0 + 4.0;
        assert_eq!(fp8_weight_bytes(&s, 1, 2.0), 2.0 * (kva + absorbed) + fp8 + 4.0 * fp8_scales);
    }
}
