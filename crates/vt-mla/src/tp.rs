//! `vt-mla run --tp N` and `vt-mla bench`: the tensor-parallel parts of the command line.

use clap::{Args, ValueEnum};
use mla_block::layers::bench_decode_layers;
use mla_block::runner::{RunOptions, RunStats, Schedule};
use mla_block::tp::{
    bench_decode, device_count, run_schedule_tp_with_cache, DecodeBenchOptions, RandomLayerSpec, TpGroup,
    TpModel, Transport,
};
use mla_block::{
    Checkpoint, HostTensor, HostWeights, KvCacheDtype, MlaBlock, MlaConfig, MlaWeightStore, WeightsDtype,
};
use vt_core::{DType, Device, DeviceType, Error, Queue, Result};

use crate::{positive_i64, positive_usize, progress, BackendArg};

/// How the ranks of a tensor-parallel run all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    /// NCCL on CUDA, the host communicator on the CPU.
    Auto,
    /// Through host memory: any number of ranks, several may share a GPU.
    Host,
    /// NCCL: one CUDA device per rank.
    Nccl,
}

impl From<TransportArg> for Transport {
    fn from(t: TransportArg) -> Transport {
        match t {
            TransportArg::Auto => Transport::Auto,
            TransportArg::Host => Transport::Host,
            TransportArg::Nccl => Transport::Nccl,
        }
    }
}

/// The random layer `vt-mla bench` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LayerArg {
    /// DeepSeek-V3's attention layer sizes.
    V3,
    /// DeepSeek-V3.2's: V3's plus the lightning indexer (64 x 128 heads, top 2048); every
    /// token takes the sparse path.
    V32,
    /// A small layer (for quick checks).
    Small,
    /// The small layer with an indexer (4 x 32 heads, top 16).
    SmallV32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DTypeArg {
    Bf16,
    F16,
    F32,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// Tensor-parallel sizes to time, comma-separated.
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_value = "1,2", value_parser = positive_usize)]
    tp: Vec<usize>,
    /// How the ranks all-reduce.
    #[arg(long, value_enum, default_value_t = TransportArg::Auto)]
    transport: TransportArg,
    #[arg(long, value_enum, default_value_t = LayerArg::V3)]
    layer: LayerArg,
    #[arg(long, value_enum, default_value_t = DTypeArg::Bf16)]
    dtype: DTypeArg,
    /// The random layer's weights: `fp8` block-quantizes its projections as DeepSeek's fp8
    /// checkpoints hold them (e4m3 codes, one f32 scale per 128x128 block) and multiplies
    /// them in fp8 (`vt-mla run --weights-dtype fp8`; any backend); `auto` and `dequantize`
    /// keep them in --dtype (a random layer is not an fp8 checkpoint).
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = crate::parse_weights_dtype)]
    weights_dtype: WeightsDtype,
    /// Sequences decoding together.
    #[arg(long, value_name = "N", default_value_t = DecodeBenchOptions::default().batch, value_parser = positive_i64)]
    batch: i64,
    /// Tokens cached per sequence before the timed steps.
    #[arg(long, value_name = "N", default_value_t = DecodeBenchOptions::default().context, value_parser = positive_i64)]
    context: i64,
    /// Timed decode steps per round.
    #[arg(long, value_name = "N", default_value_t = DecodeBenchOptions::default().steps, value_parser = positive_usize)]
    steps: usize,
    /// Rounds (the median round is reported).
    #[arg(long, value_name = "N", default_value_t = DecodeBenchOptions::default().rounds, value_parser = positive_usize)]
    rounds: usize,
    /// Untimed decode steps first.
    #[arg(long, value_name = "N", default_value_t = DecodeBenchOptions::default().warmup)]
    warmup: usize,
    /// Tokens per KV cache block.
    #[arg(long, value_name = "N", default_value_t = DecodeBenchOptions::default().block_size, value_parser = positive_i64)]
    block_size: i64,
    /// Seed of the random layer and inputs.
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,
    /// Time an N-layer decode step instead: N random layers on one device sharing one cache
    /// allocator and one metadata plan per step, layer i's output feeding layer i+1
    /// (attention only: no MoE/MLP; `--tp` does not apply).
    #[arg(long, value_name = "N", value_parser = positive_usize)]
    layers: Option<usize>,
    /// Time the decode step eagerly and replayed as a CUDA graph side by side (TP = 1, one
    /// device, `mla_block::DecodeGraphs`), with a per-op breakdown of one step (device time
    /// per op, launch gaps) and, on CUDA, the floor; with --layers N, N layers per step.
    #[arg(long)]
    graph: bool,
    /// With --graph: device-timed runs of one step (events; L2 flushed before each on CUDA).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = positive_usize, requires = "graph")]
    iters: usize,
    /// With --graph: steps profiled op by op for the breakdown.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = positive_usize, requires = "graph")]
    profile: usize,
    /// With --graph: the torch + FlashMLA step timed in the same device call
    /// (`tools/peers/block_step.py --json FILE`); its row for this batch and context is printed
    /// beside ours with the ratio.
    #[arg(long, value_name = "FILE", requires = "graph")]
    peer: Option<std::path::PathBuf>,
}

/// Random layer `seed` of `spec` in `dtype`; with `weights` [`WeightsDtype::Fp8`] its
/// projections block-quantized (`mla_block::fp8::quantize_host_weights`), which the weight
/// store keeps in fp8.
pub(crate) fn random_layer(
    spec: &RandomLayerSpec,
    dtype: DType,
    seed: u64,
    weights: WeightsDtype,
) -> Result<(MlaConfig, HostWeights)> {
    let (cfg, w) = spec.layer(dtype, seed)?;
    if weights == WeightsDtype::Fp8 {
        return Ok((cfg, mla_block::fp8::quantize_host_weights(&w)?));
    }
    Ok((cfg, w))
}

/// How the weights of a store of [`random_layer`] are held, for the headers.
pub(crate) fn weights_label(dtype: DType, fp8_weights: usize) -> String {
    if fp8_weights > 0 {
        format!("{fp8_weights} fp8 weights")
    } else {
        format!("{dtype} weights")
    }
}

/// `--tp N` asked for devices of a backend that is not there: say how many were found.
pub fn no_devices(tp: usize, backend: BackendArg, e: Error) -> Error {
    match backend.kind() {
        Some(kind) if kind != DeviceType::Cpu => {
            let why = match e {
                Error::NoDevice { msg, .. } => msg,
                other => other.to_string(),
            };
            Error::NoDevice {
                device: kind.to_string(),
                msg: format!("--tp {tp} needs {tp} {kind} device(s), found {} ({why})", device_count(kind)),
            }
        }
        _ => e,
    }
}

/// What a tensor-parallel run reports besides its output.
pub struct TpRun {
    pub out: HostTensor,
    pub stats: RunStats,
    pub fused: bool,
    pub group: String,
    /// Weights rank 0 holds in fp8 (`--weights-dtype`).
    pub fp8_weights: usize,
}

/// `vt-mla run --tp N [--dcp M]`: the layer split over N ranks of `kind` (the cache over
/// each DCP group of M of them); `weights` is the
/// checkpoint and the layer's name prefix in it; every rank's cache (or DCP share) is in
/// `cache` (`--kv-cache-dtype`).
// The command's options one by one (its clap struct lives in main.rs): over clippy's default
// argument limit, which clippy.toml no longer raises.
#[allow(clippy::too_many_arguments)]
pub fn run(
    kind: DeviceType,
    (tp, dcp): (usize, usize),
    transport: TransportArg,
    cfg: &MlaConfig,
    weights: (&Checkpoint, &str),
    hidden: &HostTensor,
    positions: &[i64],
    schedule: &Schedule,
    (opts, cache): (&RunOptions, KvCacheDtype),
    weights_dtype: mla_block::WeightsDtype,
) -> Result<TpRun> {
    mla_block::tp::check_tp(&cfg.dims, tp)?;
    let group = TpGroup::open_with_dcp(kind, tp, dcp, transport.into())?;
    let keep = weights_dtype.keeps_fp8_on(kind, Some(hidden.dtype));
    let host = progress::load_weights(weights.0, &cfg.dims, weights.1, hidden.dtype, keep)?;
    let model = progress::stage(format!("splitting and uploading the weights to {tp} ranks"), || {
        TpModel::load(&group, cfg, &host)
    })?;
    let blocks = model.blocks(None)?;
    let bar = progress::forwards(schedule.forwards().count());
    let (out, stats) = if dcp > 1 {
        // The DCP runner reports no progress per forward: the bar ends when it returns.
        mla_block::tp::dcp::run_schedule_dcp_with_cache(
            &group, &blocks, hidden, positions, schedule, opts, cache,
        )?
    } else {
        run_schedule_tp_with_cache(&group, &blocks, hidden, positions, schedule, opts, cache, &|d, _| {
            bar.set_position(d as u64)
        })?
    };
    bar.finish_and_clear();
    if !stats.ranks_identical {
        return Err(Error::other("vt-mla run", "the ranks' all-reduced outputs differ"));
    }
    let fp8_weights = model.store(0).map_or(0, |s| s.fp8_weights());
    Ok(TpRun {
        out,
        stats: stats.run,
        fused: blocks[0].uses_fused_norm_rope(),
        group: group.describe(),
        fp8_weights,
    })
}

/// `vt-mla bench`: decode-step time of a random layer at each TP, with the speedup and the
/// scaling efficiency `t(1) / (tp * t(tp))` against TP = 1. `pick` maps `--backend` to a
/// device type. Exits with an error if any TP could not run (after printing every row).
pub fn bench(a: &BenchArgs, pick: impl Fn(BackendArg) -> Result<DeviceType>) -> Result<()> {
    let o = DecodeBenchOptions {
        batch: a.batch,
        context: a.context,
        warmup: a.warmup,
        steps: a.steps,
        rounds: a.rounds,
        block_size: a.block_size,
        ..DecodeBenchOptions::default()
    };
    let (layer_name, spec) = match a.layer {
        LayerArg::V3 => ("v3", RandomLayerSpec::DEEPSEEK_V3),
        LayerArg::V32 => ("v32", RandomLayerSpec::DEEPSEEK_V32),
        LayerArg::Small => ("small", RandomLayerSpec::SMALL),
        LayerArg::SmallV32 => ("small-v32", RandomLayerSpec::SMALL_V32),
    };
    let dtype = match a.dtype {
        DTypeArg::Bf16 => DType::BF16,
        DTypeArg::F16 => DType::F16,
        DTypeArg::F32 => DType::F32,
    };
    let seed = a.seed;
    let most = a.tp.iter().copied().max().unwrap_or(1);
    if a.graph {
        let kind = pick(a.backend)?;
        let go = crate::graph_bench::GraphBenchOptions {
            batch: a.batch,
            context: a.context,
            block_size: a.block_size,
            warmup: a.warmup,
            steps: a.steps,
            rounds: a.rounds,
            iters: a.iters,
            profile: a.profile,
            ..Default::default()
        };
        let tp_note = a.tp.iter().any(|&t| t != 1);
        return crate::graph_bench::command(
            kind,
            layer_name,
            spec,
            dtype,
            a.layers.unwrap_or(1),
            (seed, a.weights_dtype),
            tp_note,
            &go,
            a.peer.as_deref(),
        );
    }
    let kind = pick(a.backend).map_err(|e| no_devices(most, a.backend, e))?;
    if let Some(n) = a.layers {
        return bench_layers(a, kind, layer_name, spec, dtype, n, &o);
    }
    let (cfg, weights) =
        progress::stage("making the random layer", || random_layer(&spec, dtype, seed, a.weights_dtype))?;
    let held = if weights.tensors.iter().any(|(_, t)| t.dtype == DType::F8E4M3) { "fp8 weights" } else { "" };
    println!(
        "vt-mla bench: decode step of a random {layer_name} MLA layer ({dtype}{}{held}; hidden {}, {} heads, q_lora {}, \
         kv_lora {}, rope {}, nope {}, v {}) on {kind}",
        if held.is_empty() { "" } else { ", " },
        cfg.dims.hidden_size,
        cfg.dims.num_heads,
        cfg.dims.q_lora_rank,
        cfg.dims.kv_lora_rank,
        cfg.dims.qk_rope_head_dim,
        cfg.dims.qk_nope_head_dim,
        cfg.dims.v_head_dim
    );
    println!(
        "batch {} sequences x context {} tokens, block size {}; {} warm-up steps, {} rounds of {} timed steps \
         (median round; a step is every rank's forward + the all-reduce, host-timed until all queues finish)",
        o.batch, o.context, o.block_size, o.warmup, o.rounds, o.steps
    );
    println!(
        "{:>3}  {:<40} {:>12} {:>10} {:>9} {:>11}",
        "tp", "ranks", "ms/step", "min ms", "speedup", "efficiency"
    );
    let mut t1 = None;
    let mut failed = 0;
    for &tp in &a.tp {
        // Filling a V3-sized cache on the CPU takes minutes: say what is running.
        let res = progress::stage(format!("tp {tp}: loading, filling the cache, timing"), || {
            let group = TpGroup::open(kind, tp, a.transport.into())?;
            let model = TpModel::load(&group, &cfg, &weights)?;
            let blocks = model.blocks(None)?;
            let r = bench_decode(&group, &blocks, &o, seed)?;
            Ok::<_, Error>((group.describe(), r))
        });
        match res {
            Ok((desc, r)) => {
                if tp == 1 {
                    t1 = Some(r.ms_per_step);
                }
                let (speedup, eff) = match t1 {
                    Some(t) => (
                        format!("{:.2}x", t / r.ms_per_step),
                        format!("{:.0}%", 100.0 * t / (tp as f64 * r.ms_per_step)),
                    ),
                    None => ("-".into(), "-".into()),
                };
                println!(
                    "{tp:>3}  {desc:<40} {:>12.4} {:>10.4} {speedup:>9} {eff:>11}",
                    r.ms_per_step, r.min_ms_per_step
                );
            }
            Err(e) => {
                failed += 1;
                println!("{tp:>3}  error: {e}");
            }
        }
    }
    if failed > 0 {
        return Err(Error::other(
            "vt-mla bench",
            format!("{failed} of {} tensor-parallel sizes could not run", a.tp.len()),
        ));
    }
    Ok(())
}

/// `vt-mla bench --layers N`: an N-layer decode step on one device of `kind`.
fn bench_layers(
    a: &BenchArgs,
    kind: DeviceType,
    layer_name: &str,
    spec: RandomLayerSpec,
    dtype: DType,
    n: usize,
    o: &DecodeBenchOptions,
) -> Result<()> {
    let q = Queue::new(Device::new(kind, 0))?;
    let mut stores = Vec::with_capacity(n);
    let mut cfg = None;
    let bar = progress::spinner(format!("making and uploading {n} random {layer_name} layers"));
    for i in 0..n {
        let (c, w) = random_layer(&spec, dtype, a.seed.wrapping_add(i as u64), a.weights_dtype)?;
        stores.push(MlaWeightStore::from_host(&q, &c, &w)?);
        cfg = Some(c);
    }
    bar.finish_and_clear();
    let Some(cfg) = cfg else {
        return Err(Error::invalid("vt-mla bench", "layers", "must be > 0"));
    };
    let blocks = stores
        .iter()
        .map(|s| MlaBlock::new(cfg.dims, s.views(), cfg.rope.is_neox))
        .collect::<Result<Vec<_>>>()?;
    let d = cfg.dims;
    println!(
        "vt-mla bench: decode step of {n} random {layer_name} MLA layers ({dtype}, {}; hidden {}, {} heads, q_lora {}, \
         kv_lora {}, rope {}, nope {}, v {}) on {kind}:0, {} norm+rope",
        weights_label(dtype, stores[0].fp8_weights()),
        d.hidden_size,
        d.num_heads,
        d.q_lora_rank,
        d.kv_lora_rank,
        d.qk_rope_head_dim,
        d.qk_nope_head_dim,
        d.v_head_dim,
        if blocks[0].uses_fused_norm_rope() { "fused" } else { "split" }
    );
    println!(
        "attention only: layer i's output is layer i+1's input (no MoE, MLP, norms or residuals between them); one \
         cache allocator [{n} layers, blocks, {}, {}], one metadata plan and upload per step for all layers; --tp does not apply",
        o.block_size,
        d.cache_row_dim()
    );
    println!(
        "batch {} sequences x context {} tokens; {} warm-up steps, {} rounds of {} timed steps (median round, host-timed \
         until the queue finishes)",
        o.batch, o.context, o.warmup, o.rounds, o.steps
    );
    let r = progress::stage(format!("{n} layers: filling the cache, timing"), || {
        bench_decode_layers(&q, &blocks, o, a.seed)
    })?;
    println!("{:>7} {:>12} {:>10} {:>12}", "layers", "ms/step", "min ms", "ms/layer");
    println!("{:>7} {:>12.4} {:>10.4} {:>12.4}", r.layers, r.ms_per_step, r.min_ms_per_step, r.ms_per_layer);
    Ok(())
}
