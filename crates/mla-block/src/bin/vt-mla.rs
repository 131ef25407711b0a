//! `vt-mla`: the MLA block from the command line (see docs/mla.md).
//!
//! ```text
//! vt-mla run --config C.json --weights W.safetensors [--layer-prefix model.layers.0.self_attn.]
//!            --input IN.safetensors --output OUT.safetensors [--backend auto|cpu|cuda|hip]
//!            [--schedule prefill:N,decode:N,...] [--block-size 64] [--tp N] [--transport auto|host|nccl]
//! vt-mla bench [--backend ...] [--tp 1,2] [--layer v3|small] ... (decode-step time per TP)
//! vt-mla info
//! ```

#[path = "vt-mla/tp.rs"]
mod tp_cli;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use mla_block::runner::{positions_or_default, run_schedule, RunOptions, Schedule};
use mla_block::{missing_ops, HostTensor, MlaBlock, MlaConfig, MlaWeightStore, DEFAULT_LAYER_PREFIX};
use safetensors::{Dtype as StDtype, SafeTensors};
use vt_core::{flags, registry, Device, DeviceType, Error, Probe, Queue, Result};

const USAGE: &str = "usage:
  vt-mla run --config C.json --weights W.safetensors [--layer-prefix model.layers.0.self_attn.]
             --input IN.safetensors --output OUT.safetensors [--backend auto|cpu|cuda|hip]
             [--schedule prefill:N,decode:N,...] [--block-size 64] [--tp N] [--transport auto|host|nccl]
  vt-mla bench [--backend auto|cpu|cuda] [--tp 1,2] [--layer v3|small] ... (--help for all)
  vt-mla info";

fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => parse_run(&args[1..]).and_then(|a| run(&a)),
        Some("info") if args.len() == 1 => info(),
        Some("bench") => tp_cli::bench(&args[1..], pick_device),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vt-mla: error: {e}");
            ExitCode::FAILURE
        }
    }
}

struct RunArgs {
    config: PathBuf,
    weights: PathBuf,
    layer_prefix: String,
    input: PathBuf,
    output: PathBuf,
    backend: String,
    schedule: Option<String>,
    block_size: i64,
    /// `--tp N`: the heads split over N ranks (N devices, or N CPU ranks).
    tp: Option<usize>,
    transport: String,
}

fn usage_err(msg: impl Into<String>) -> Error {
    Error::other("vt-mla run", format!("{}\n{USAGE}", msg.into()))
}

fn parse_run(args: &[String]) -> Result<RunArgs> {
    let mut m: HashMap<&str, String> = HashMap::new();
    let known = [
        "--config",
        "--weights",
        "--layer-prefix",
        "--input",
        "--output",
        "--backend",
        "--schedule",
        "--block-size",
        "--tp",
        "--transport",
    ];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (key, val) = match a.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (a.as_str(), None),
        };
        let Some(&key) = known.iter().find(|k| **k == key) else {
            return Err(usage_err(format!("unknown argument `{a}`")));
        };
        let val = match val {
            Some(v) => v,
            None => it.next().cloned().ok_or_else(|| usage_err(format!("`{key}` needs a value")))?,
        };
        if m.insert(key, val).is_some() {
            return Err(usage_err(format!("`{key}` given twice")));
        }
    }
    let mut req = |k: &str| m.remove(k).ok_or_else(|| usage_err(format!("`{k}` is required")));
    let config = req("--config")?.into();
    let weights = req("--weights")?.into();
    let input = req("--input")?.into();
    let output = req("--output")?.into();
    let block_size = match m.remove("--block-size") {
        None => 64,
        Some(s) => match s.parse::<i64>() {
            Ok(v) if v > 0 => v,
            _ => return Err(usage_err(format!("--block-size `{s}` is not a positive integer"))),
        },
    };
    let tp = match m.remove("--tp") {
        None => None,
        Some(s) => match s.parse::<usize>() {
            Ok(v) if v > 0 => Some(v),
            _ => return Err(usage_err(format!("--tp `{s}` is not a positive integer"))),
        },
    };
    let transport = m.remove("--transport");
    if transport.is_some() && tp.is_none() {
        return Err(usage_err("`--transport` is for tensor-parallel runs: give `--tp N` too"));
    }
    Ok(RunArgs {
        tp,
        transport: transport.unwrap_or_else(|| "auto".into()),
        config,
        weights,
        layer_prefix: m.remove("--layer-prefix").unwrap_or_else(|| DEFAULT_LAYER_PREFIX.to_string()),
        input,
        output,
        backend: m.remove("--backend").unwrap_or_else(|| "auto".into()),
        schedule: m.remove("--schedule"),
        block_size,
    })
}

fn names(ops: &[vt_core::OpId]) -> String {
    ops.iter().map(|o| o.name()).collect::<Vec<_>>().join(", ")
}

/// `auto`: the best registered device type whose backend has every op the block needs
/// (CUDA, then HIP, then the CPU); a named backend must be registered and complete.
fn pick_device(backend: &str) -> Result<DeviceType> {
    let probes = vt_backends::init();
    let registered =
        |k: DeviceType| probes.iter().any(|(d, p)| *d == k && matches!(p, Probe::Registered { .. }));
    if backend == "auto" {
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
    }
    let kind = DeviceType::parse(backend)
        .ok_or_else(|| usage_err(format!("--backend `{backend}` is not one of auto, cpu, cuda, hip")))?;
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
    let kind = match (a.tp, pick_device(&a.backend)) {
        (Some(tp), Err(e)) => return Err(tp_cli::no_devices(tp, &a.backend, e)),
        (_, k) => k?,
    };
    let cfg = MlaConfig::from_file(&a.config)?;
    let ctx = a.input.display().to_string();
    let bytes =
        std::fs::read(&a.input).map_err(|e| Error::other(ctx.clone(), format!("cannot read: {e}")))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::other(ctx.clone(), format!("not a safetensors file: {e}")))?;
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
    let (s, t) = (hidden.shape[0], hidden.shape[1]);
    let positions = match st.tensor("positions") {
        Ok(_) => Some(HostTensor::from_safetensors(&st, "positions", &ctx)?),
        Err(_) => None,
    };
    let positions = positions_or_default(positions.as_ref(), s, t)?;
    let schedule = match &a.schedule {
        Some(sch) => sch.parse::<Schedule>()?,
        None => Schedule::all_at_once(t),
    };
    schedule.check(t)?;

    let opts = RunOptions { block_size: a.block_size, chunk_workspace_tokens: None };
    let (out, stats, fused, ranks) = match a.tp {
        None => {
            let queue = Queue::new(Device::new(kind, 0))?;
            let store = MlaWeightStore::load(&queue, &cfg, &a.weights, &a.layer_prefix, Some(hidden.dtype))?;
            let block = MlaBlock::new(cfg.dims, store.views(), cfg.rope.is_neox)?;
            let (out, stats) = run_schedule(&queue, &block, &hidden, &positions, &schedule, &opts)?;
            (out, stats, block.uses_fused_norm_rope(), String::new())
        }
        Some(tp) => {
            let r = tp_cli::run(
                kind,
                tp,
                &a.transport,
                &cfg,
                &a.weights,
                &a.layer_prefix,
                &hidden,
                &positions,
                &schedule,
                &opts,
            )?;
            (r.out, r.stats, r.fused, format!(", tp {tp}: {}", r.group))
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
    safetensors::serialize_to_file(vec![("out", view)], &None, &a.output)
        .map_err(|e| Error::other(a.output.display().to_string(), format!("cannot write: {e}")))?;
    eprintln!(
        "vt-mla: {} on {kind}{ranks}: S={s} T={t} {} schedule {schedule}, block size {}, {} path: {} forwards, {} context chunks -> {}",
        if cfg.dims.has_q_lora() { "q_lora" } else { "q_proj" },
        out.dtype,
        a.block_size,
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
        let block_missing = missing_ops(*kind);
        if block_missing.is_empty() {
            let path = if ops.contains(&vt_core::OpId::FusedNormRope) { "fused and split" } else { "split" };
            println!("    MLA block: runs here ({path} norm+rope paths)");
        } else {
            println!("    MLA block: cannot run here (lacks {})", names(&block_missing));
        }
    }
    println!("best device: {}", vt_backends::best_device());
    match pick_device("auto") {
        Ok(k) => println!("--backend auto runs the MLA block on: {k}"),
        Err(e) => println!("--backend auto: {e}"),
    }
    println!("flags:");
    for f in flags::Flag::ALL {
        println!("  {}={} (default {})", f.env_name(), flags::get(f) as u8, f.default_value() as u8);
    }
    Ok(())
}
