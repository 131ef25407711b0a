//! `vt-mla run --tp N` and `vt-mla bench`: the tensor-parallel parts of the command line.

use std::path::Path;

use mla_block::runner::{RunOptions, RunStats, Schedule};
use mla_block::tp::{
    bench_decode, device_count, run_schedule_tp, DecodeBenchOptions, RandomLayerSpec, TpGroup, TpModel,
    Transport,
};
use mla_block::{HostTensor, HostWeights, MlaConfig};
use vt_core::{DType, DeviceType, Error, Result};

pub const BENCH_USAGE: &str =
    "  vt-mla bench [--backend auto|cpu|cuda] [--tp 1,2] [--transport auto|host|nccl]
               [--layer v3|small] [--dtype bf16|f16|f32] [--batch 64] [--context 1024]
               [--steps 20] [--rounds 5] [--warmup 5] [--block-size 64] [--seed 0]";

/// `--tp N` asked for devices of a backend that is not there: say how many were found.
pub fn no_devices(tp: usize, backend: &str, e: Error) -> Error {
    match DeviceType::parse(backend) {
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
}

/// `vt-mla run --tp N`: the layer split over N ranks of `kind`.
pub fn run(
    kind: DeviceType,
    tp: usize,
    transport: &str,
    cfg: &MlaConfig,
    weights: &Path,
    prefix: &str,
    hidden: &HostTensor,
    positions: &[i64],
    schedule: &Schedule,
    opts: &RunOptions,
) -> Result<TpRun> {
    mla_block::tp::check_tp(&cfg.dims, tp)?;
    let group = TpGroup::open(kind, tp, transport.parse::<Transport>()?)?;
    let host = HostWeights::from_file(weights, &cfg.dims, prefix, Some(hidden.dtype))?;
    let model = TpModel::load(&group, cfg, &host)?;
    let blocks = model.blocks(None)?;
    let (out, stats) = run_schedule_tp(&group, &blocks, hidden, positions, schedule, opts)?;
    if !stats.ranks_identical {
        return Err(Error::other("vt-mla run", "the ranks' all-reduced outputs differ"));
    }
    Ok(TpRun { out, stats: stats.run, fused: blocks[0].uses_fused_norm_rope(), group: group.describe() })
}

fn usage_err(msg: impl Into<String>) -> Error {
    Error::other("vt-mla bench", format!("{}\nusage:\n{BENCH_USAGE}", msg.into()))
}

/// `vt-mla bench`: decode-step time of a random layer at each TP, with the speedup and the
/// scaling efficiency `t(1) / (tp * t(tp))` against TP = 1. `pick` maps `--backend` to a
/// device type. Exits with an error if any TP could not run (after printing every row).
pub fn bench(args: &[String], pick: impl Fn(&str) -> Result<DeviceType>) -> Result<()> {
    let mut backend = "auto".to_string();
    let mut tps = vec![1usize, 2];
    let mut transport = Transport::Auto;
    let mut layer = ("v3".to_string(), RandomLayerSpec::DEEPSEEK_V3);
    let mut dtype = DType::BF16;
    let mut o = DecodeBenchOptions::default();
    let mut seed = 0u64;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (key, inline) = match a.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        if key == "-h" || key == "--help" {
            println!("usage:\n{BENCH_USAGE}");
            return Ok(());
        }
        let val = match inline {
            Some(v) => v,
            None => it.next().cloned().ok_or_else(|| usage_err(format!("`{key}` needs a value")))?,
        };
        let int = |v: &str| -> Result<i64> {
            v.parse::<i64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| usage_err(format!("{key} `{v}` is not a positive integer")))
        };
        match key.as_str() {
            "--backend" => backend = val,
            "--tp" => {
                tps = val.split(',').map(|s| int(s.trim()).map(|n| n as usize)).collect::<Result<_>>()?;
            }
            "--transport" => transport = val.parse()?,
            "--layer" => {
                let spec = RandomLayerSpec::by_name(&val)
                    .ok_or_else(|| usage_err(format!("--layer `{val}` is not v3 or small")))?;
                layer = (val, spec);
            }
            "--dtype" => {
                dtype = match val.as_str() {
                    "bf16" => DType::BF16,
                    "f16" => DType::F16,
                    "f32" => DType::F32,
                    _ => return Err(usage_err(format!("--dtype `{val}` is not bf16, f16 or f32"))),
                }
            }
            "--batch" => o.batch = int(&val)?,
            "--context" => o.context = int(&val)?,
            "--steps" => o.steps = int(&val)? as usize,
            "--rounds" => o.rounds = int(&val)? as usize,
            "--warmup" => o.warmup = val.parse().map_err(|_| usage_err(format!("--warmup `{val}`")))?,
            "--block-size" => o.block_size = int(&val)?,
            "--seed" => seed = val.parse().map_err(|_| usage_err(format!("--seed `{val}`")))?,
            _ => return Err(usage_err(format!("unknown argument `{a}`"))),
        }
    }
    let most = tps.iter().copied().max().unwrap_or(1);
    let kind = pick(&backend).map_err(|e| no_devices(most, &backend, e))?;
    let (cfg, weights) = layer.1.layer(dtype, seed)?;
    println!(
        "vt-mla bench: decode step of a random {} MLA layer ({dtype}; hidden {}, {} heads, q_lora {}, kv_lora {}, \
         rope {}, nope {}, v {}) on {kind}",
        layer.0,
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
    for &tp in &tps {
        let res = (|| {
            let group = TpGroup::open(kind, tp, transport)?;
            let model = TpModel::load(&group, &cfg, &weights)?;
            let blocks = model.blocks(None)?;
            let r = bench_decode(&group, &blocks, &o, seed)?;
            Ok::<_, Error>((group.describe(), r))
        })();
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
            format!("{failed} of {} tensor-parallel sizes could not run", tps.len()),
        ));
    }
    Ok(())
}
