//! `vt-mla`: the MLA block from the command line (see docs/mla.md and `vt-mla --help`).
//!
//! ```text
//! vt-mla run --config C.json --weights W.safetensors|INDEX.json|DIR --input IN.safetensors --output OUT.safetensors
//!            [--layer N | --layer-prefix P] [--backend auto|cpu|cuda|hip] [--schedule prefill:N,decode:N,...]
//!            [--block-size 64] [--kv-cache-dtype auto|bf16|fp8_ds_mla] [--weights-dtype auto|fp8|dequantize]
//!            [--tp N] [--dcp M] [--transport auto|host|nccl]
//! vt-mla bench [--backend ...] [--tp 1,2] [--layer v3|v32|small|small-v32] ... (decode-step time per TP)
//! vt-mla bench-prefill [--tokens 1024,4096,8192] [--context C] [--peer FILE] ... (prefill forward, per op)
//! vt-mla info
//! ```

mod bench_prefill;
mod gemm_bench;
mod graph_bench;
mod op_timer;
mod output;
mod progress;
mod tp;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use mla_block::runner::{positions_or_default, run_schedule_with_cache, RunOptions, Schedule};
use mla_block::{
    layer_prefix, missing_ops, missing_sparse_ops, Checkpoint, HostTensor, MlaBlock, MlaConfig,
    MlaWeightStore, DEFAULT_LAYER_PREFIX,
};
use mla_block::{KvCacheDtype, WeightsDtype};
use safetensors::Dtype as StDtype;
use vt_core::{flags, registry, Device, DeviceType, Error, Probe, Queue, Result};

/// The MLA block (DeepSeek-V2/V3 attention) on Hugging Face checkpoints, on any backend
/// this machine has.
#[derive(Parser, Debug)]
#[command(name = "vt-mla", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one layer's attention block on S sequences under a schedule of prefill and
    /// decode steps, writing the output to a safetensors file.
    Run(RunArgs),
    /// Time a decode step of a random layer at each tensor-parallel size.
    Bench(tp::BenchArgs),
    /// Time the prefill forward of a random layer (T tokens of one sequence, optionally
    /// after cached context) with a per-op breakdown, against a torch peer's figures.
    BenchPrefill(bench_prefill::PrefillBenchArgs),
    /// Time the decode step's GEMMs (A-projections, q_b, the absorbed BMMs, o_proj) at
    /// decode batch sizes against the weight-streaming floor (measured copy bandwidth).
    BenchGemm(gemm_bench::GemmBenchArgs),
    /// List the backends, devices and registered ops, and the flags.
    Info,
}

/// Which backend runs the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The best registered backend that has every op the block needs (CUDA, HIP, CPU).
    Auto,
    Cpu,
    Cuda,
    Hip,
}

impl BackendArg {
    fn kind(self) -> Option<DeviceType> {
        match self {
            BackendArg::Auto => None,
            BackendArg::Cpu => Some(DeviceType::Cpu),
            BackendArg::Cuda => Some(DeviceType::Cuda),
            BackendArg::Hip => Some(DeviceType::Hip),
        }
    }
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("tp_or_dcp").args(["tp", "dcp"]).multiple(true)))]
struct RunArgs {
    /// The model's Hugging Face `config.json`.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// The checkpoint: a `.safetensors` file, a `model.safetensors.index.json`, or a
    /// directory holding one (shards are memory-mapped; fp8 block-scaled weights follow
    /// --weights-dtype).
    #[arg(long, value_name = "PATH")]
    weights: PathBuf,
    /// fp8 block-scaled checkpoints: `fp8` keeps the weights in fp8 (e4m3 codes and their
    /// 128x128 scales, multiplied by the fp8 matmuls; the absorbed weights and kv_a too when
    /// their widths are multiples of 128), `dequantize` converts them to the input's dtype
    /// at load, `auto` keeps fp8 on CUDA for bf16/f16 inputs and dequantizes elsewhere. Other
    /// checkpoints: no effect.
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = parse_weights_dtype)]
    weights_dtype: WeightsDtype,
    /// The layer to run: its weights are `model.layers.N.self_attn.*` (default 0).
    #[arg(long, value_name = "N", conflicts_with = "layer_prefix", allow_negative_numbers = true)]
    layer: Option<usize>,
    /// The name prefix of the layer's weights, for other layouts
    /// (default `model.layers.0.self_attn.`).
    #[arg(long, value_name = "PREFIX")]
    layer_prefix: Option<String>,
    /// Input safetensors file: `hidden_states` [S, T, H] (f32/bf16/f16) and optionally
    /// `positions` [S, T] (default 0..T).
    #[arg(long, value_name = "FILE")]
    input: PathBuf,
    /// Output safetensors file: `out` [S, T, H] in the input's dtype.
    #[arg(long, value_name = "FILE")]
    output: PathBuf,
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// Steps every sequence takes together, e.g. `prefill:10,decode:4,prefill:18`
    /// (default: all T tokens in one prefill).
    #[arg(long, value_name = "STEPS", value_parser = parse_schedule)]
    schedule: Option<Schedule>,
    /// Tokens per KV cache block.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = positive_i64, allow_negative_numbers = true)]
    block_size: i64,
    /// The KV cache's dtype: `auto` (the input's dtype), `bf16` (bf16 inputs), or
    /// `fp8_ds_mla` (656-byte rows: e4m3 latents with per-128 scales, bf16 rope; needs
    /// kv_lora_rank 512 and qk_rope_head_dim 64; every rank's cache, or share of it under
    /// --dcp, is one).
    #[arg(long, value_name = "DTYPE", default_value = "auto", value_parser = parse_kv_cache_dtype)]
    kv_cache_dtype: KvCacheDtype,
    /// Split the heads over N ranks (N devices, or N CPU ranks).
    #[arg(long, value_name = "N", value_parser = positive_usize, allow_negative_numbers = true)]
    tp: Option<usize>,
    /// Decode context parallelism: DCP groups of N ranks split the KV cache by token (token
    /// j on rank j % N); --tp defaults to N and must be a multiple of it. Prefill runs
    /// unsplit and may not follow cached tokens (no chunked-context prefill under DCP).
    #[arg(long, value_name = "N", value_parser = positive_usize, allow_negative_numbers = true)]
    dcp: Option<usize>,
    /// How the ranks all-reduce (with --tp or --dcp).
    #[arg(long, value_enum, requires = "tp_or_dcp")]
    transport: Option<tp::TransportArg>,
}

/// `--weights-dtype`: auto, fp8 or dequantize.
fn parse_weights_dtype(s: &str) -> std::result::Result<WeightsDtype, String> {
    WeightsDtype::parse(s).ok_or_else(|| format!("{s:?} is not auto, fp8 or dequantize"))
}

/// `--kv-cache-dtype`: auto, bf16 or fp8_ds_mla.
fn parse_kv_cache_dtype(s: &str) -> std::result::Result<KvCacheDtype, String> {
    s.parse()
}

/// A `> 0` integer argument.
pub fn positive_i64(s: &str) -> std::result::Result<i64, String> {
    match s.parse::<i64>() {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(format!("`{s}` is not a positive integer")),
    }
}

/// A `> 0` count argument.
pub fn positive_usize(s: &str) -> std::result::Result<usize, String> {
    positive_i64(s).map(|v| v as usize)
}

fn parse_schedule(s: &str) -> std::result::Result<Schedule, String> {
    s.parse::<Schedule>().map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let result = match cli.command {
        Command::Run(a) => run(&a),
        Command::Bench(a) => tp::bench(&a, pick_device),
        Command::BenchPrefill(a) => bench_prefill::run(&a, pick_device),
        Command::BenchGemm(a) => gemm_bench::command(&a, pick_device),
        Command::Info => info(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vt-mla: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--help` and `--version` print to stdout and exit 0; a usage error prints the message
/// and the usage of the (sub)command to stderr and exits 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let _ = e.print();
    // clap shows the usage only with some errors (missing arguments); always show it.
    if !e.to_string().contains("Usage:") {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        cmd.build();
        let sub = std::env::args().nth(1).and_then(|name| cmd.find_subcommand(&name).cloned());
        let usage = match sub {
            Some(mut sub) => sub.render_usage(),
            None => cmd.render_usage(),
        };
        eprintln!("\n{usage}");
    }
    ExitCode::from(2)
}

fn names(ops: &[vt_core::OpId]) -> String {
    ops.iter().map(|o| o.name()).collect::<Vec<_>>().join(", ")
}

/// `auto`: the best registered device type whose backend has every op the block needs
/// (CUDA, then HIP, then the CPU); a named backend must be registered and complete.
fn pick_device(backend: BackendArg) -> Result<DeviceType> {
    let probes = vt_backends::init();
    let registered =
        |k: DeviceType| probes.iter().any(|(d, p)| *d == k && matches!(p, Probe::Registered { .. }));
    let Some(kind) = backend.kind() else {
        let best = vt_backends::best_device();
        let order = [best, DeviceType::Cuda, DeviceType::Hip, DeviceType::Cpu];
        for kind in order.into_iter().filter(|&k| registered(k)) {
            let missing = missing_ops(kind);
            if missing.is_empty() {
                return Ok(kind);
            }
            eprintln!("vt-mla: skipping {kind}: its backend lacks {}", names(&missing));
        }
        return Err(Error::NoDevice {
            device: "auto".into(),
            msg: "no registered backend has every op the block needs".into(),
        });
    };
    match probes.iter().find(|(k, _)| *k == kind) {
        Some((_, Probe::Registered { .. })) => {
            let missing = missing_ops(kind);
            if missing.is_empty() {
                Ok(kind)
            } else {
                Err(Error::NoDevice {
                    device: kind.to_string(),
                    msg: format!(
                        "its backend does not register {} (needed by the MLA block)",
                        names(&missing)
                    ),
                })
            }
        }
        Some((_, p)) => Err(Error::NoDevice { device: kind.to_string(), msg: p.to_string() }),
        None => {
            Err(Error::NoDevice { device: kind.to_string(), msg: "this build has no such backend".into() })
        }
    }
}

fn run(a: &RunArgs) -> Result<()> {
    // Before any work: the output must not be one of the inputs (by device and inode).
    output::refuse_overwriting_inputs(
        &a.output,
        &[("--config", &a.config), ("--weights", &a.weights), ("--input", &a.input)],
    )?;
    // The checkpoint, opened once (the weights are loaded from it below): a directory or an
    // index names other files, and its index and every shard are inputs too.
    let checkpoint = Checkpoint::open(&a.weights)?;
    let files: Vec<(&str, &Path)> = checkpoint.files().map(|f| ("--weights", f)).collect();
    output::refuse_overwriting_inputs(&a.output, &files)?;
    // `--dcp N` alone runs N ranks (TP = DCP = N).
    let ranks = a.tp.or(a.dcp);
    let kind = match (ranks, pick_device(a.backend)) {
        (Some(tp), Err(e)) => return Err(tp::no_devices(tp, a.backend, e)),
        (_, k) => k?,
    };
    let cfg = MlaConfig::from_file(&a.config)?;
    if cfg.dims.is_sparse() {
        let missing = missing_sparse_ops(kind);
        if !missing.is_empty() {
            return Err(Error::NoDevice {
                device: kind.to_string(),
                msg: format!(
                    "its backend does not register {} (needed by DeepSeek-V3.2's sparse attention)",
                    names(&missing)
                ),
            });
        }
    }
    let ctx = a.input.display().to_string();
    let bytes =
        std::fs::read(&a.input).map_err(|e| Error::other(ctx.clone(), format!("cannot read: {e}")))?;
    let st = mla_block::deserialize_safetensors(&bytes, &ctx)?;
    let hidden = HostTensor::from_safetensors(&st, "hidden_states", &ctx)?;
    if !hidden.dtype.is_compute_float() || hidden.shape.len() != 3 {
        return Err(Error::other(
            ctx,
            format!(
                "`hidden_states` is {} {:?}, expected f32/bf16/f16 [S, T, H]",
                hidden.dtype, hidden.shape
            ),
        ));
    }
    let (s, t, h) = (hidden.shape[0], hidden.shape[1], hidden.shape[2]);
    // An empty input is the input's fault, not the (default) schedule's.
    for (what, v) in [("S", s), ("T", t)] {
        if v <= 0 {
            return Err(Error::other(
                ctx,
                format!(
                    "`hidden_states` has shape {:?} [S, T, H], {what} = {v}: nothing to run",
                    hidden.shape
                ),
            ));
        }
    }
    // H before anything sized by S * T: an `[S, T, 0]` tensor holds no bytes however large
    // S * T is, so only a row width the block takes bounds them by the file's size.
    if h != cfg.dims.hidden_size {
        return Err(Error::other(
            ctx,
            format!(
                "`hidden_states` has shape {:?} [S, T, H], H = {h}, but the config's hidden_size is {}",
                hidden.shape, cfg.dims.hidden_size
            ),
        ));
    }
    if let Some(n) = ranks {
        let heads = cfg.dims.num_heads;
        if i64::try_from(n).map_or(true, |n| n > heads || heads % n != 0) {
            return Err(Error::other(
                format!("--tp {n}"),
                format!("num_attention_heads = {heads} is not divisible by tp = {n} (each rank takes whole heads)"),
            ));
        }
    }
    let positions = match st.tensor("positions") {
        Ok(_) => Some(HostTensor::from_safetensors(&st, "positions", &ctx)?),
        Err(_) => None,
    };
    let positions = positions_or_default(positions.as_ref(), s, t)?;
    let schedule = a.schedule.clone().unwrap_or_else(|| Schedule::all_at_once(t));
    schedule.check(t)?;

    let opts = RunOptions { block_size: a.block_size, chunk_workspace_tokens: None };
    // A cache that cannot be had is the block size's fault: say which option to change.
    let block_size_hint = |e: Error| match e {
        Error::InvalidArgument { arg: "block_size", .. } => {
            Error::other(format!("--block-size {}", a.block_size), e.to_string())
        }
        e => e,
    };
    let prefix = match (a.layer, &a.layer_prefix) {
        (Some(n), _) => layer_prefix(n),
        (None, Some(p)) => p.clone(),
        (None, None) => DEFAULT_LAYER_PREFIX.to_string(),
    };
    let fp8_weights;
    let (out, stats, fused, ranks) = match ranks {
        None => {
            let queue = Queue::new(Device::new(kind, 0))?;
            let store = progress::stage(format!("loading the weights `{prefix}*` into {kind}"), || {
                MlaWeightStore::from_checkpoint_with(
                    &queue,
                    &cfg,
                    &checkpoint,
                    &prefix,
                    Some(hidden.dtype),
                    a.weights_dtype,
                )
            })?;
            fp8_weights = store.fp8_weights();
            let block = MlaBlock::new(cfg.dims, store.views(), cfg.rope.is_neox)?;
            let forwards = schedule.forwards().count();
            let bar = progress::forwards(forwards);
            let (out, stats) = run_schedule_with_cache(
                &queue,
                &block,
                &hidden,
                &positions,
                &schedule,
                &opts,
                a.kv_cache_dtype,
                &|done, _| bar.set_position(done as u64),
            )
            .map_err(block_size_hint)?;
            bar.finish_and_clear();
            (out, stats, block.uses_fused_norm_rope(), String::new())
        }
        Some(n) => {
            let transport = a.transport.unwrap_or(tp::TransportArg::Auto);
            let dcp = a.dcp.unwrap_or(1);
            let r = tp::run(
                kind,
                (n, dcp),
                transport,
                &cfg,
                (&checkpoint, &prefix),
                &hidden,
                &positions,
                &schedule,
                (&opts, a.kv_cache_dtype),
                a.weights_dtype,
            )
            .map_err(block_size_hint)?;
            fp8_weights = r.fp8_weights;
            (r.out, r.stats, r.fused, format!(", tp {n}: {}", r.group))
        }
    };

    let dtype = match out.dtype {
        vt_core::DType::BF16 => StDtype::BF16,
        vt_core::DType::F16 => StDtype::F16,
        _ => StDtype::F32,
    };
    let shape: Vec<usize> = out.shape.iter().map(|&d| d as usize).collect();
    let view = safetensors::tensor::TensorView::new(dtype, shape, &out.bytes)
        .map_err(|e| Error::other("vt-mla run", format!("output tensor: {e}")))?;
    let bytes = safetensors::serialize(vec![("out", view)], &None)
        .map_err(|e| Error::other("vt-mla run", format!("output tensor: {e}")))?;
    output::write_atomically(&a.output, |f| std::io::Write::write_all(f, &bytes))?;
    eprintln!(
        "vt-mla: {} on {kind}{ranks}: S={s} T={t} {} schedule {schedule}, block size {}, {} cache, {} weights, {} path: {} forwards, {} context chunks -> {}",
        match cfg.dims.indexer {
            Some(ix) => format!("DeepSeek-V3.2 sparse (index_topk {})", ix.topk),
            None if cfg.dims.has_q_lora() => "q_lora".to_string(),
            None => "q_proj".to_string(),
        },
        out.dtype,
        a.block_size,
        a.kv_cache_dtype.name(),
        if fp8_weights > 0 { format!("{fp8_weights} fp8") } else { out.dtype.to_string() },
        if fused { "fused norm+rope" } else { "split norm+rope" },
        stats.forwards,
        stats.context_chunks,
        a.output.display()
    );
    Ok(())
}

fn info() -> Result<()> {
    let probes = vt_backends::init();
    println!("backends:");
    for (kind, probe) in probes {
        println!("  {kind}: {probe}");
        if !matches!(probe, Probe::Registered { .. }) {
            continue;
        }
        if let Some(b) = registry::backend(*kind) {
            println!("    {}", b.description());
            for i in 0..b.device_count() {
                println!("    device {kind}:{i}: {}", b.device_name(i));
            }
        }
        let ops = registry::registered_ops(*kind);
        println!("    ops ({}/{}): {}", ops.len(), vt_core::OpId::ALL.len(), names(&ops));
        let missing: Vec<_> = vt_core::OpId::ALL.iter().copied().filter(|o| !ops.contains(o)).collect();
        if !missing.is_empty() {
            println!("    not registered: {}", names(&missing));
        }
        let comms = vt_core::comm::transports(*kind);
        if !comms.is_empty() {
            println!("    tensor-parallel communicators: {}", comms.join(", "));
        }
        let block_missing = missing_ops(*kind);
        if block_missing.is_empty() {
            let path = if ops.contains(&vt_core::OpId::FusedNormRope) { "fused and split" } else { "split" };
            println!("    MLA block: runs here ({path} norm+rope paths)");
        } else {
            println!("    MLA block: cannot run here (lacks {})", names(&block_missing));
        }
        let sparse_missing = missing_sparse_ops(*kind);
        if block_missing.is_empty() && sparse_missing.is_empty() {
            println!("    DeepSeek-V3.2 sparse block (indexer + SparseMlaAttention): runs here");
        } else if block_missing.is_empty() {
            println!("    DeepSeek-V3.2 sparse block: cannot run here (lacks {})", names(&sparse_missing));
        }
    }
    println!("best device: {}", vt_backends::best_device());
    match pick_device(BackendArg::Auto) {
        Ok(k) => println!("--backend auto runs the MLA block on: {k}"),
        Err(e) => println!("--backend auto: {e}"),
    }
    // Per layer, with DeepSeek-V2/V3's cache row (kv_lora_rank 512 + rope 64 = 576 values).
    println!("KV cache tokens per GB (10^9 bytes) per layer, 576-value MLA rows:");
    for (name, dt) in [
        ("f32", vt_core::DType::F32),
        ("bf16", vt_core::DType::BF16),
        ("f16", vt_core::DType::F16),
        ("fp8_ds_mla", vt_core::DType::Fp8DsMla),
    ] {
        let row = mla_block::row_bytes(dt, 576)?;
        println!("  {name:10} {row:4} bytes/token  {:>9} tokens/GB", 1_000_000_000 / row);
    }
    println!("flags:");
    for f in flags::Flag::ALL {
        println!("  {}={} (default {})", f.env_name(), flags::get(f) as u8, f.default_value() as u8);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
