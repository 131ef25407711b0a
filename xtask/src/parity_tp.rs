//! `cargo xtask parity --tp N [--dcp M] [--backend cpu|cuda] [--transport auto|host|nccl]
//! [--golden DIR] [--random v3|small|small-fp8|none] [--seqs S] [--tokens T] [--seed N]
//! [--kv-cache-dtype auto|bf16|fp8_ds_mla]`
//!
//! Tensor parallelism of the MLA block: TP = N against TP = 1 (the ordinary block on rank
//! 0's device) on every golden case in `tests/golden` and on a random layer (DeepSeek-V3's
//! sizes in bf16 by default on a GPU, the scaled-down one on the CPU), printing the relative
//! Frobenius errors and, for goldens, both runs against transformers' expected output.
//!
//! Tolerances: TP = N vs TP = 1 1e-5 (f32), 2e-2 (bf16); goldens 1e-4 / 2e-2. A golden whose
//! heads do not split over N ranks is listed as such, not failed. On CUDA the ranks reduce
//! through NCCL, one GPU per rank: fewer GPUs than N is an error naming how many were
//! found (`--transport host` runs the N ranks on the GPUs there are, sharing them).
//! `--backend cpu` runs N CPU ranks with the host communicator. Exits non-zero on any FAIL.
//!
//! `--dcp N` (alone, or with `--tp M` a multiple of N; `--tp` defaults to N) adds decode
//! context parallelism: each DCP group of N ranks splits the cache by token (token j on
//! rank j % N), still compared against the plain block. Chunked-context prefill is not
//! implemented under DCP, so the goldens' mixed schedule becomes `prefill:T/2,decode:T-T/2`.
//!
//! `--kv-cache-dtype fp8_ds_mla` runs both sides (TP = N and TP = 1) on the 656-byte fp8
//! cache: same TP tolerances (both read the same fp8 bytes), goldens held to 6e-2; cases
//! whose rows are not 512 + 64 are listed as `n/a`, and the CPU's default random layer is
//! `small-fp8` (the small layer with V3's latent and rope widths).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use mla_block::runner::{RunOptions, Schedule};
use mla_block::tp::{check_tp, compare_tp, RandomLayerSpec, TpCase, TpGroup, Transport};
use mla_block::KvCacheDtype;
use vt_core::{DType, DeviceType, Probe};

/// The options of `cargo xtask parity --tp N` / `--dcp N` (each needs one of them).
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("tp_or_dcp").args(["tp", "dcp"]).multiple(true)))]
pub struct TpArgs {
    /// Compare the MLA block on N tensor-parallel ranks against TP = 1.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub tp: Option<u64>,
    /// Decode context parallelism: DCP groups of N ranks, the cache split by token over
    /// them (--tp defaults to N and must be a multiple of it).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub dcp: Option<u64>,
    /// With --tp: how ranks reduce: auto, host or nccl [default: auto].
    #[arg(long, requires = "tp_or_dcp", value_name = "KIND", value_parser = parse_transport)]
    pub transport: Option<Transport>,
    /// With --tp: folder of golden cases [default: tests/golden].
    #[arg(long, requires = "tp_or_dcp", value_name = "DIR")]
    pub golden: Option<PathBuf>,
    /// With --tp: the random layer: v3, small, small-fp8 or none [default: v3 on a GPU,
    /// small on the CPU (small-fp8 with an fp8_ds_mla cache)].
    #[arg(long, requires = "tp_or_dcp", value_name = "SPEC")]
    pub random: Option<String>,
    /// With --tp: the KV cache of both sides: auto (the activation dtype), bf16 or
    /// fp8_ds_mla (656-byte rows; layers with kv_lora_rank 512, rope 64) [default: auto].
    #[arg(long, requires = "tp_or_dcp", value_name = "DTYPE", value_parser = parse_kv_cache_dtype)]
    pub kv_cache_dtype: Option<KvCacheDtype>,
    /// With --tp: sequences of the random layer's batch [default: 4].
    #[arg(long, requires = "tp_or_dcp", value_name = "S", value_parser = clap::value_parser!(i64).range(1..))]
    pub seqs: Option<i64>,
    /// With --tp: tokens of the random layer's batch [default: 64].
    #[arg(long, requires = "tp_or_dcp", value_name = "T", value_parser = clap::value_parser!(i64).range(1..))]
    pub tokens: Option<i64>,
}

fn parse_kv_cache_dtype(s: &str) -> Result<KvCacheDtype, String> {
    s.parse()
}

fn parse_transport(s: &str) -> Result<Transport, String> {
    s.parse().map_err(|e: vt_core::Error| e.to_string())
}

pub struct Options {
    tp: usize,
    dcp: usize,
    backend: Option<DeviceType>,
    transport: Transport,
    golden: PathBuf,
    random: Option<String>,
    seqs: i64,
    tokens: i64,
    seed: u64,
    kv_cache: KvCacheDtype,
}

/// The comparison's options from the command line (`backend` and `seed` are parity's own:
/// with `--tp` the backend list must name at most one, checked in `run`).
pub fn options(backend: &[DeviceType], seed: Option<u64>, a: TpArgs) -> Result<Options, String> {
    if backend.len() > 1 {
        return Err(format!("--backend with --tp takes one backend (cpu or cuda), got {}", backend.len()));
    }
    Ok(Options {
        tp: a.tp.or(a.dcp).unwrap_or(1) as usize,
        dcp: a.dcp.unwrap_or(1) as usize,
        backend: backend.first().copied(),
        transport: a.transport.unwrap_or(Transport::Auto),
        golden: a.golden.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden")),
        random: a.random,
        seqs: a.seqs.unwrap_or(4),
        tokens: a.tokens.unwrap_or(64),
        seed: seed.unwrap_or(0),
        kv_cache: a.kv_cache_dtype.unwrap_or_default(),
    })
}

pub fn run(o: Result<Options, String>) -> Result<ExitCode, String> {
    let o = o?;
    let fp8 = o.kv_cache == KvCacheDtype::Fp8DsMla;
    let probes = vt_backends::init();
    let registered =
        |k: DeviceType| probes.iter().any(|(d, p)| *d == k && matches!(p, Probe::Registered { .. }));
    let kind =
        o.backend.unwrap_or(if registered(DeviceType::Cuda) { DeviceType::Cuda } else { DeviceType::Cpu });
    if let Some((_, p)) = probes.iter().find(|(k, _)| *k == kind) {
        if !matches!(p, Probe::Registered { .. }) {
            return Err(format!("--tp {0} needs {0} {kind} device(s), found 0 ({kind}: {p})", o.tp));
        }
    }
    let open = || TpGroup::open_with_dcp(kind, o.tp, o.dcp, o.transport).map_err(|e| e.to_string());
    let mut group = open()?;
    let started = Instant::now();
    println!(
        "vt parity --tp {} --dcp {}: TP={} DCP={} vs TP=1 DCP=1 (the plain block on {})",
        o.tp,
        o.dcp,
        o.tp,
        o.dcp,
        group.queues()[0].device()
    );
    println!("ranks: {}", group.describe());
    println!("KV cache: {} (both sides)", o.kv_cache.name());
    println!(
        "errors: relative Frobenius; TP=N vs TP=1 tolerance 1e-5 (f32) / 2e-2 (bf16, f16); vs golden {}",
        if fp8 { "6e-2 (fp8_ds_mla cache)" } else { "1e-4 / 2e-2" }
    );
    println!();
    println!(
        "{:<28} {:<5} {:>5}  {:<40} {:>10} {:>7}  {:>10} {:>10}  result",
        "case", "dtype", "heads", "schedule", "vs TP=1", "tol", "TP=1 gold", "TP=N gold"
    );
    let mut t = Tally::default();

    let mut dirs: Vec<PathBuf> = match std::fs::read_dir(&o.golden) {
        Ok(rd) => {
            rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.join("config.json").is_file()).collect()
        }
        Err(e) => {
            println!("(goldens: {} not readable: {e})", o.golden.display());
            Vec::new()
        }
    };
    dirs.sort();
    for dir in &dirs {
        match TpCase::from_golden_dir(dir) {
            Ok(case) => {
                let case = case.with_kv_cache(o.kv_cache);
                let n = case.t();
                let all = RunOptions { block_size: 64, chunk_workspace_tokens: None };
                report(&mut t, &mut group, &open, o.tp, &case, &format!("prefill:{n}"), &all);
                if o.dcp > 1 {
                    // prefill, then decode over the split cache (no chunked context under DCP;
                    // every rank holds a token before the first decode)
                    let half = n / 2;
                    if half >= o.dcp as i64 {
                        let sch = format!("prefill:{half},decode:{}", n - half);
                        report(&mut t, &mut group, &open, o.tp, &case, &sch, &all);
                    }
                } else if n > 17 {
                    // prefill, chunked context through a 4-row workspace, decode
                    let mixed = format!("prefill:5,decode:3,prefill:9,decode:{}", n - 17);
                    let opts = RunOptions { block_size: 16, chunk_workspace_tokens: Some(4) };
                    report(&mut t, &mut group, &open, o.tp, &case, &mixed, &opts);
                }
            }
            Err(e) => {
                println!("{:<28} ERROR {e}", dir.display());
                t.fail += 1;
            }
        }
    }

    let random = o.random.clone().unwrap_or_else(|| {
        match (kind == DeviceType::Cpu, fp8) {
            (true, false) => "small",
            (true, true) => "small-fp8",
            (false, _) => "v3",
        }
        .into()
    });
    if random != "none" {
        let spec = RandomLayerSpec::by_name(&random)
            .ok_or_else(|| format!("--random: `{random}` is not v3, small, small-fp8 or none"))?;
        let name = format!("random_{random}_bf16");
        let case = TpCase::random(&spec, &name, DType::BF16, o.seqs, o.tokens, o.seed)
            .map_err(|e| e.to_string())?
            .with_kv_cache(o.kv_cache);
        let half = o.tokens / 2;
        let schedule = if half > 0 {
            format!("prefill:{half},decode:{}", o.tokens - half)
        } else {
            format!("decode:{}", o.tokens)
        };
        report(
            &mut t,
            &mut group,
            &open,
            o.tp,
            &case,
            &schedule,
            &RunOptions { block_size: 64, chunk_workspace_tokens: None },
        );
    }
    println!(
        "\n{} passed, {} failed, {} n/a (heads not splittable over {} ranks{}{}); {:.1} s",
        t.pass,
        t.fail,
        t.skipped,
        o.tp,
        if fp8 { ", or rows an fp8_ds_mla cache cannot hold" } else { "" },
        if o.dcp > 1 { ", or DeepSeek-V3.2 under DCP" } else { "" },
        started.elapsed().as_secs_f64()
    );
    Ok(if t.fail > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

#[derive(Default)]
struct Tally {
    pass: usize,
    fail: usize,
    skipped: usize,
}

/// Compares one case under one schedule and prints its row.
/// One case under one schedule: its line of the table. A failed run aborts the group's
/// communicators (no rank waits for a failed one), so the group is opened anew for the next case.
fn report(
    t: &mut Tally,
    group: &mut TpGroup,
    open: &dyn Fn() -> Result<TpGroup, String>,
    tp: usize,
    case: &TpCase,
    schedule: &str,
    opts: &RunOptions,
) {
    let heads = case.cfg.dims.num_heads;
    let head = format!("{:<28} {:<5} {heads:>5}  {schedule:<40}", case.name, case.dtype().name());
    if group.dcp() > 1 && case.cfg.dims.is_sparse() {
        println!("{head} n/a: decode context parallelism does not run DeepSeek-V3.2's sparse attention yet");
        t.skipped += 1;
        return;
    }
    if check_tp(&case.cfg.dims, tp).is_err() {
        println!("{head} n/a: {heads} heads do not split evenly over {tp} ranks");
        t.skipped += 1;
        return;
    }
    if case.kv_cache == KvCacheDtype::Fp8DsMla && !case.fits_fp8_cache() {
        let d = &case.cfg.dims;
        println!(
            "{head} n/a: kv_lora_rank {} + rope {} (an fp8_ds_mla row holds 512 + 64)",
            d.kv_lora_rank, d.qk_rope_head_dim
        );
        t.skipped += 1;
        return;
    }
    let result = schedule.parse::<Schedule>().and_then(|sch| compare_tp(case, group, &sch, opts));
    if group.is_aborted() {
        match open() {
            Ok(g) => *group = g,
            Err(e) => println!("(reopening the tensor-parallel group after a failure: {e})"),
        }
    }
    match result {
        Ok(c) => {
            let g = |e: Option<f64>| e.map_or("-".to_string(), |e| format!("{e:.3e}"));
            let ok = c.passed(case);
            println!(
                "{head} {:>10.3e} {:>7.0e}  {:>10} {:>10}  {}{}",
                c.err_vs_tp1,
                case.tp_tolerance(),
                g(c.tp1_vs_expected),
                g(c.tpn_vs_expected),
                if ok { "PASS" } else { "FAIL" },
                if c.stats.ranks_identical { "" } else { " (ranks differ)" }
            );
            if ok {
                t.pass += 1
            } else {
                t.fail += 1
            }
        }
        Err(e) => {
            println!("{head} ERROR {e}");
            t.fail += 1;
        }
    }
}
