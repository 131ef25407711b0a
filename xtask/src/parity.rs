//! `cargo xtask parity [--backend LIST] [--op LIST] [--dtype LIST] [--seed N] [--per-dtype] [-v]`
//!
//! Registers every backend found (`vt_backends::init`), runs every parity case of every
//! op (see the vt-check crate) on every backend in bf16, f16 and f32 against the CPU
//! reference, and prints one table: a row per op, a column per backend. A cell is the
//! worst dtype (largest error relative to its tolerance) as `PASS err <= tol dtype`, or
//! `FAIL ...` (details below the table), `not registered` (the backend is up but lacks
//! the op), `no device` / `unavailable` (what the backend's probe said). `--per-dtype`
//! gives a column per backend and dtype instead. Exits non-zero on any FAIL, and with
//! `--require-all` also on any `not registered` cell (CI runs it so on the CPU, which
//! registers every op).
//!
//! LISTs are comma-separated: backends `cpu,cuda,hip`; ops as `OpId::parse` reads them
//! (`rms_norm`, `MlaDecodeAttention`); dtypes `bf16,f16,f32`. The seed (random unless
//! given) is printed first; `--seed N` replays a run: a case's inputs depend only on the
//! seed, the op and the case, never on the filters, the backend or the dtype.

use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use vt_check::{run_cell, CellReport, DTYPES};
use vt_core::{op_registered, DType, Device, DeviceType, Error, OpId, Probe};

/// `cargo xtask parity` (with `--tp N`: the tensor-parallel comparison, whose own options
/// need it; see `parity_tp.rs`).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Backends, comma-separated: cpu,cuda,hip [default: all]. With --tp, one of cpu, cuda
    /// [default: cuda when it is up, else cpu].
    #[arg(long, visible_alias = "backends", value_name = "LIST", value_delimiter = ',', value_parser = parse_backend)]
    pub backend: Vec<DeviceType>,
    /// Ops, comma-separated, as `OpId::parse` reads them (rms_norm, MlaDecodeAttention) [default: all].
    #[arg(long, visible_alias = "ops", value_name = "LIST", value_delimiter = ',', value_parser = parse_op, conflicts_with = "tp")]
    pub op: Vec<OpId>,
    /// Dtypes, comma-separated: bf16,f16,f32 [default: all].
    #[arg(long, visible_alias = "dtypes", value_name = "LIST", value_delimiter = ',', value_parser = parse_dtype, conflicts_with = "tp")]
    pub dtype: Vec<DType>,
    /// Seed of the random inputs; replays a run [default: from the clock, printed; 0 with --tp].
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// A column per backend and dtype instead of the worst dtype per backend.
    #[arg(long, conflicts_with = "tp")]
    pub per_dtype: bool,
    /// Fail on any `not registered` cell too (every op must exist on every backend that is up).
    #[arg(long, conflicts_with = "tp")]
    pub require_all: bool,
    /// Print every case's report.
    #[arg(short, long, conflicts_with = "tp")]
    pub verbose: bool,
    #[command(flatten)]
    pub tp_args: crate::parity_tp::TpArgs,
}

struct Options {
    backends: Vec<DeviceType>,
    ops: Vec<OpId>,
    dtypes: Vec<DType>,
    seed: u64,
    per_dtype: bool,
    /// `--require-all`: a `not registered` cell fails the run too.
    require_all: bool,
    verbose: bool,
}

pub fn run(args: Args) -> Result<ExitCode, String> {
    if args.tp_args.tp.is_some() || args.tp_args.dcp.is_some() {
        return crate::parity_tp::run(crate::parity_tp::options(&args.backend, args.seed, args.tp_args));
    }
    let opts = options(args);
    let started = Instant::now();
    let probes = vt_backends::init();
    println!("vt parity: every op on every backend against the CPU reference");
    println!("seed {} (replay: cargo xtask parity --seed {})", opts.seed, opts.seed);
    let found: Vec<String> = DeviceType::ALL
        .iter()
        .map(|&k| {
            format!("{k}: {}", probe_of(probes, k).map_or("not built in".to_string(), |p| p.to_string()))
        })
        .collect();
    println!("backends: {}", found.join("; "));
    let dtypes: Vec<&str> = opts.dtypes.iter().map(|d| d.name()).collect();
    println!(
        "cells: max relative Frobenius error ||out - ref|| / ||ref|| over the op's cases vs the tolerance, {}",
        if opts.per_dtype {
            "per dtype".to_string()
        } else {
            format!("worst of {} (by error / tolerance)", dtypes.join(", "))
        }
    );
    println!();

    let mut grid: Vec<(OpId, Vec<(DeviceType, Cell)>)> = Vec::new();
    let bar = crate::progress::Progress::new(opts.ops.len() as u64, "parity");
    for &op in &opts.ops {
        bar.step(format!("{op:?}"));
        let row = opts.backends.iter().map(|&k| (k, cell(op, k, probe_of(probes, k), &opts))).collect();
        grid.push((op, row));
        bar.inc();
    }
    drop(bar);
    print_table(&grid, &opts);
    let tally = print_failures(&grid, &opts);
    if opts.verbose {
        for (_, row) in &grid {
            for (_, c) in row {
                if let Cell::Ran(reports) = c {
                    reports.iter().for_each(|r| println!("{r}"));
                }
            }
        }
    }
    println!(
        "\n(op, backend, dtype) cells: {} passed, {} failed, {} not registered, {} without a device; {:.1} s",
        tally.pass,
        tally.fail,
        tally.not_registered,
        tally.skipped,
        started.elapsed().as_secs_f64()
    );
    if opts.require_all && tally.not_registered > 0 {
        println!(
            "--require-all: {} cells are not registered (every op must exist on every backend that is up)",
            tally.not_registered
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(if tally.fail > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn options(a: Args) -> Options {
    // An empty list means "all" (clap leaves it empty when the option is not given).
    fn or_all<T: Copy + PartialEq>(mut v: Vec<T>, all: &[T]) -> Vec<T> {
        if v.is_empty() {
            return all.to_vec();
        }
        let mut seen = Vec::with_capacity(v.len());
        v.retain(|x| {
            let new = !seen.contains(x);
            seen.push(*x);
            new
        });
        v
    }
    Options {
        backends: or_all(a.backend, &DeviceType::ALL),
        ops: or_all(a.op, OpId::ALL),
        dtypes: or_all(a.dtype, &DTYPES),
        seed: a.seed.unwrap_or_else(fresh_seed),
        per_dtype: a.per_dtype,
        require_all: a.require_all,
        verbose: a.verbose,
    }
}

/// clap value parsers: a bad name is a usage error (exit 2) naming the choices.
pub fn parse_backend(s: &str) -> Result<DeviceType, String> {
    let all: Vec<String> = DeviceType::ALL.iter().map(|d| d.to_string()).collect();
    DeviceType::parse(s.trim()).ok_or_else(|| format!("unknown backend `{s}` (one of {})", all.join(", ")))
}

fn parse_op(s: &str) -> Result<OpId, String> {
    OpId::parse(s.trim()).ok_or_else(|| format!("unknown op `{s}`"))
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    DTYPES
        .into_iter()
        .find(|d| d.name().eq_ignore_ascii_case(s.trim()))
        .ok_or_else(|| format!("unknown dtype `{s}` (one of bf16, f16, f32)"))
}

/// A seed from the clock: each plain run draws new inputs; the printed seed replays it.
fn fresh_seed() -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    (nanos as u64) % 1_000_000_000
}

fn probe_of(probes: &[(DeviceType, Probe)], kind: DeviceType) -> Option<&Probe> {
    probes.iter().find(|(k, _)| *k == kind).map(|(_, p)| p)
}

enum Cell {
    /// One report per dtype.
    Ran(Vec<CellReport>),
    /// A run could not start for one dtype (no queue, no reference op, ...).
    Error(String),
    NotRegistered,
    NoDevice,
    Unavailable,
}

fn cell(op: OpId, kind: DeviceType, probe: Option<&Probe>, opts: &Options) -> Cell {
    match probe {
        Some(Probe::Registered { .. }) => {}
        Some(Probe::NoDevice { .. }) => return Cell::NoDevice,
        Some(Probe::Unavailable { .. }) | None => return Cell::Unavailable,
    }
    if !op_registered(op, kind) {
        return Cell::NotRegistered;
    }
    let mut reports = Vec::new();
    for &dtype in &opts.dtypes {
        match run_cell(op, Device::new(kind, 0), dtype, opts.seed) {
            Ok(r) => reports.push(r),
            Err(Error::NotRegistered { device: DeviceType::Cpu, .. }) => {
                return Cell::Error("the CPU reference lacks this op".into())
            }
            Err(e) => return Cell::Error(format!("{dtype}: {e}")),
        }
    }
    Cell::Ran(reports)
}

/// Error relative to tolerance, for picking a cell's worst dtype (a tolerance of 0 makes
/// any error infinitely bad).
fn badness(r: &CellReport) -> f64 {
    if !r.passed() {
        return f64::INFINITY;
    }
    if r.tolerance == 0.0 {
        return if r.max_err() == 0.0 { 0.0 } else { f64::INFINITY };
    }
    r.max_err() / r.tolerance
}

fn num(x: f64, digits: usize) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.is_infinite() {
        "inf".into()
    } else {
        format!("{x:.digits$e}")
    }
}

fn verdict(r: &CellReport, with_dtype: bool) -> String {
    let dt = if with_dtype { format!(" {}", r.dtype) } else { String::new() };
    if r.passed() {
        format!("PASS {} <= {}{dt}", num(r.max_err(), 1), num(r.tolerance, 0))
    } else {
        format!("FAIL {} vs {}{dt} *", num(r.max_err(), 1), num(r.tolerance, 0))
    }
}

fn text(c: &Cell, dtype: Option<DType>) -> String {
    match c {
        Cell::Ran(reports) => match dtype {
            Some(d) => reports.iter().find(|r| r.dtype == d).map_or("-".into(), |r| verdict(r, false)),
            // Ties go to the later dtype: f32, the strictest tolerance.
            None => reports
                .iter()
                .max_by(|a, b| badness(a).total_cmp(&badness(b)))
                .map_or("-".into(), |r| verdict(r, true)),
        },
        Cell::Error(_) => "FAIL (error) *".into(),
        Cell::NotRegistered => "not registered".into(),
        Cell::NoDevice => "no device".into(),
        Cell::Unavailable => "unavailable".into(),
    }
}

fn print_table(grid: &[(OpId, Vec<(DeviceType, Cell)>)], opts: &Options) {
    let dts: Vec<Option<DType>> =
        if opts.per_dtype { opts.dtypes.iter().map(|&d| Some(d)).collect() } else { vec![None] };
    let mut header = vec!["op".to_string()];
    for k in &opts.backends {
        for d in &dts {
            header.push(d.map_or(k.to_string(), |d| format!("{k} {d}")));
        }
    }
    let mut rows = vec![header];
    for (op, row) in grid {
        let mut r = vec![op.name().to_string()];
        for (_, c) in row {
            for &d in &dts {
                r.push(text(c, d));
            }
        }
        rows.push(r);
    }
    let ncol = rows[0].len();
    let widths: Vec<usize> =
        (0..ncol).map(|i| rows.iter().map(|r| r.get(i).map_or(0, String::len)).max().unwrap_or(0)).collect();
    for (i, r) in rows.iter().enumerate() {
        let cells: Vec<String> = r.iter().zip(&widths).map(|(c, &w)| format!("{c:<w$}")).collect();
        println!("{}", cells.join(" | ").trim_end());
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
            println!("{}", rule.join("-+-"));
        }
    }
}

#[derive(Default)]
struct Tally {
    pass: usize,
    fail: usize,
    not_registered: usize,
    skipped: usize,
}

/// Prints what failed (each failing case with its problems and a replay command) and
/// counts the cells.
fn print_failures(grid: &[(OpId, Vec<(DeviceType, Cell)>)], opts: &Options) -> Tally {
    let mut t = Tally::default();
    let mut first = true;
    let mut header = || {
        if std::mem::take(&mut first) {
            println!("\n* failures:");
        }
    };
    for (op, row) in grid {
        for (kind, c) in row {
            match c {
                Cell::Ran(reports) => {
                    for r in reports {
                        if r.passed() {
                            t.pass += 1;
                            continue;
                        }
                        t.fail += 1;
                        header();
                        println!(
                            "{op} on {kind} in {} (tolerance {}); replay: cargo xtask parity --backend {kind} \
                             --op {op} --dtype {} --seed {}",
                            r.dtype,
                            num(r.tolerance, 0),
                            r.dtype,
                            opts.seed
                        );
                        for case in r.failures() {
                            println!(
                                "  {:>7}  {} (case seed {:#x})",
                                num(case.rel_err, 2),
                                case.name,
                                case.seed
                            );
                            for p in case.problems.iter().take(4) {
                                println!("           {p}");
                            }
                        }
                    }
                }
                Cell::Error(e) => {
                    t.fail += 1;
                    header();
                    println!("{op} on {kind}: {e}");
                }
                Cell::NotRegistered => t.not_registered += opts.dtypes.len(),
                Cell::NoDevice | Cell::Unavailable => t.skipped += opts.dtypes.len(),
            }
        }
    }
    t
}
