//! `cargo xtask bench indexer [--json FILE] [--iters N] [--only SPEC]... [--no-parity]`:
//! IndexerTopK (DeepSeek-V3.2's lightning indexer) on the first CUDA device at DeepSeek's
//! dims (H = 64 heads x Di = 128, bf16 query and key cache, f32 weights, block size 64,
//! topk 2048).
//!
//! - Decode rows: `b` sequences of `s` cached tokens each (pages scattered by a random
//!   permutation), one query per sequence at position s - 1: b in {1, 32, 128}, s in {32768,
//!   65536}.
//! - Prefill rows: 4096 causal queries of one sequence, the whole prompt (s = 4096) and a
//!   4096-token chunk after 28672 cached tokens (s = 32768).
//! - Floor (docs/perf.md, Lightning indexer): bytes = every sequence's keys once (256 B a
//!   token) + queries, weights and the output; FLOPs = 2 H Di per (query, visible token)
//!   pair; floor = max(bytes / copy bandwidth, FLOPs / cuBLAS bf16 GEMM rate), both measured
//!   in this run. The op's own score workspace traffic (4 B per pair, written once and read
//!   by the select) is not in the floor.
//! - Timing: CUDA events, the L2 flushed before each call, median of `--iters` after
//!   warm-up; the score launches alone are timed too (`scores`), the rest is the select.
//! - Parity: before timing, the first and the last query of each shape are recomputed by the
//!   CPU reference (vt-cpu) on a host copy of their sequence's keys; the GPU's rows must
//!   share at least 99% of their slots with the CPU's (tensor-core sums round differently
//!   from the CPU's, which may swap near-equal scores at the k-th place).
//! - `--only decode`, `--only b32,s65536`, `--only prefill` (keys decode, prefill, bN, sN;
//!   every key of one SPEC must match; repeatable).

use std::path::PathBuf;
use std::process::ExitCode;

use vt_core::{Buffer, DType, Device, IndexerTopKArgs, Queue};
use vt_cuda::bench::{filled_value, median, Bench};
use vt_cuda::indexer_top_k::{indexer_scores_only, indexer_top_k_with, Kernel};

use crate::bench::{ceilings, cuda_queue, device_name, positive, shuffle};
use crate::progress::Progress;

/// `cargo xtask bench indexer` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write the rows (and this run's ceilings) as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Timed runs per shape (median reported).
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = positive)]
    pub iters: usize,
    /// Skip the CPU check before timing (for profiler runs).
    #[arg(long)]
    pub no_parity: bool,
    /// Keep shapes matching every key given (decode, prefill, bN, sN), e.g. `decode,b32`;
    /// repeatable.
    #[arg(long, value_name = "SPEC", value_parser = only_spec)]
    pub only: Vec<String>,
}

fn only_spec(s: &str) -> Result<String, String> {
    for kv in s.split(',') {
        if kv == "decode" || kv == "prefill" {
            continue;
        }
        let i = kv.find(|c: char| c.is_ascii_digit()).unwrap_or(kv.len());
        let (k, v) = kv.split_at(i);
        if !matches!(k, "b" | "s") || v.parse::<i64>().is_err() {
            return Err(format!("`{kv}` is not one of decode, prefill, bN, sN"));
        }
    }
    Ok(s.to_string())
}

const H: i64 = 64;
const DI: i64 = 128;
const BS: i64 = 64;
const TOPK: i64 = 2048;
const PREFILL_Q: i64 = 4096;
const Q_SEED: u64 = 31;
const W_SEED: u64 = 32;
const K_SEED: u64 = 33;
/// Shared rows a GPU row must have in common with the CPU's.
const MIN_OVERLAP: f64 = 0.99;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    prefill: bool,
    /// Sequences (1 for prefill).
    b: i64,
    /// Cached tokens per sequence (the last query sees all of them).
    s: i64,
}

impl Shape {
    /// Query tokens.
    fn t(&self) -> i64 {
        if self.prefill {
            PREFILL_Q
        } else {
            self.b
        }
    }
    /// Position of query i (of sequence i for decode).
    fn position(&self, i: i64) -> i64 {
        if self.prefill {
            self.s - PREFILL_Q + i
        } else {
            self.s - 1
        }
    }
    /// (query, visible token) pairs.
    fn pairs(&self) -> i64 {
        (0..self.t()).map(|i| self.position(i) + 1).sum()
    }
    fn flops(&self) -> f64 {
        2.0 * (H * DI) as f64 * self.pairs() as f64
    }
    /// Keys once per sequence, queries, weights (f32), output.
    fn bytes(&self) -> f64 {
        let t = self.t();
        (self.b * self.s * DI * 2 + t * H * DI * 2 + t * H * 4 + t * TOPK * 4) as f64
    }
    fn label(&self) -> String {
        if self.prefill {
            format!("prefill t{} s{} h{H} d{DI} k{TOPK}", PREFILL_Q, self.s)
        } else {
            format!("decode b{} s{} h{H} d{DI} k{TOPK}", self.b, self.s)
        }
    }
    fn matches(&self, spec: &str) -> bool {
        spec.split(',').all(|kv| match kv {
            "decode" => !self.prefill,
            "prefill" => self.prefill,
            _ => {
                let (k, v) = kv.split_at(kv.find(|c: char| c.is_ascii_digit()).unwrap_or(kv.len()));
                let v: i64 = v.parse().unwrap_or(-1);
                match k {
                    "b" => self.b == v,
                    "s" => self.s == v,
                    _ => false,
                }
            }
        })
    }
}

fn shapes() -> Vec<Shape> {
    let mut v = Vec::new();
    for s in [32768, 65536] {
        for b in [1, 32, 128] {
            v.push(Shape { prefill: false, b, s });
        }
    }
    for s in [PREFILL_Q, 32768] {
        v.push(Shape { prefill: true, b: 1, s });
    }
    v
}

struct Inputs {
    q: Buffer,
    w: Buffer,
    cache: Buffer,
    table: Buffer,
    seq_ids: Buffer,
    positions: Buffer,
    out: Buffer,
    /// The block table on the host, `[b, s / BS]`.
    host_table: Vec<i32>,
}

fn make_inputs(q: &Queue, bench: &Bench<'_>, s: &Shape) -> vt_core::Result<Inputs> {
    let (t, mb) = (s.t(), s.s / BS);
    let nb = s.b * mb;
    let mut perm: Vec<i32> = (0..nb as i32).collect();
    shuffle(&mut perm, 0x5EED_u64);
    let qb = Buffer::uninit(q, DType::BF16, &[t, H, DI])?;
    bench.fill(&qb.view(), Q_SEED, 1.0)?;
    let w = Buffer::uninit(q, DType::F32, &[t, H])?;
    bench.fill(&w.view(), W_SEED, 0.125)?;
    let cache = Buffer::uninit(q, DType::BF16, &[nb, BS, DI])?;
    bench.fill(&cache.view(), K_SEED, 1.0)?;
    let ints = |dt: DType, shape: &[i64], v: Vec<f64>| Buffer::from_f64(q, dt, shape, &v);
    let seq_ids: Vec<f64> = (0..t).map(|i| if s.prefill { 0.0 } else { i as f64 }).collect();
    let positions: Vec<f64> = (0..t).map(|i| s.position(i) as f64).collect();
    Ok(Inputs {
        q: qb,
        w,
        cache,
        table: ints(DType::I32, &[s.b, mb], perm.iter().map(|&x| x as f64).collect())?,
        seq_ids: ints(DType::I32, &[t], seq_ids)?,
        positions: ints(DType::I32, &[t], positions)?,
        out: Buffer::uninit(q, DType::I32, &[t, TOPK])?,
        host_table: perm,
    })
}

fn args<'a>(x: &'a Inputs) -> IndexerTopKArgs<'a> {
    IndexerTopKArgs {
        out: x.out.view(),
        query: x.q.view(),
        weights: x.w.view(),
        cache: x.cache.view(),
        block_table: x.table.view(),
        seq_ids: x.seq_ids.view(),
        positions: x.positions.view(),
        scale: 1.0 / (DI as f32).sqrt(),
    }
}

/// The CPU reference of query `i` on a host copy of its sequence's keys (the fills' host
/// twin, blocks in order), its slots mapped back through the block table; and the GPU's row.
fn check_query(gpu: &Queue, s: &Shape, x: &Inputs, i: i64) -> vt_core::Result<f64> {
    let cpu = Queue::new(Device::CPU)?;
    let (mb, b) = (s.s / BS, if s.prefill { 0 } else { i });
    let n = s.position(i) + 1;
    let blocks = (n + BS - 1) / BS;
    let mut keys = Vec::with_capacity((blocks * BS * DI) as usize);
    for blk in 0..blocks {
        let id = x.host_table[(b * mb + blk) as usize] as u64;
        let base = id * (BS * DI) as u64;
        keys.extend((0..(BS * DI) as u64).map(|e| filled_value(DType::BF16, K_SEED, 1.0, base + e) as f64));
    }
    let qv: Vec<f64> = (0..(H * DI) as u64)
        .map(|e| filled_value(DType::BF16, Q_SEED, 1.0, (i * H * DI) as u64 + e) as f64)
        .collect();
    let wv: Vec<f64> =
        (0..H as u64).map(|e| filled_value(DType::F32, W_SEED, 0.125, (i * H) as u64 + e) as f64).collect();
    let ident: Vec<f64> = (0..blocks).map(|v| v as f64).collect();
    let cb = |dt: DType, shape: &[i64], v: &[f64]| Buffer::from_f64(&cpu, dt, shape, v);
    let (cq, cw, ck) = (
        cb(DType::BF16, &[1, H, DI], &qv)?,
        cb(DType::F32, &[1, H], &wv)?,
        cb(DType::BF16, &[blocks, BS, DI], &keys)?,
    );
    let (ct, cs, cp) = (
        cb(DType::I32, &[1, blocks], &ident)?,
        cb(DType::I32, &[1], &[0.0])?,
        cb(DType::I32, &[1], &[(n - 1) as f64])?,
    );
    let co = Buffer::uninit(&cpu, DType::I32, &[1, TOPK])?;
    vt_core::indexer_top_k(
        &cpu,
        &IndexerTopKArgs {
            out: co.view(),
            query: cq.view(),
            weights: cw.view(),
            cache: ck.view(),
            block_table: ct.view(),
            seq_ids: cs.view(),
            positions: cp.view(),
            scale: 1.0 / (DI as f32).sqrt(),
        },
    )?;
    let want: std::collections::HashSet<i64> = cpu
        .read_f64(&co.view())?
        .iter()
        .map(|&v| v as i64)
        .filter(|&v| v >= 0)
        .map(|v| x.host_table[(b * mb + v / BS) as usize] as i64 * BS + v % BS)
        .collect();
    let row = x.out.view().slice(0, i, i + 1)?;
    let got: Vec<i64> = gpu.read_f64(&row)?.iter().map(|&v| v as i64).collect();
    let shared = got.iter().filter(|v| want.contains(v)).count();
    Ok(shared as f64 / want.len().max(1) as f64)
}

struct Row {
    shape: Shape,
    kernel: &'static str,
    us: f64,
    scores_us: f64,
    /// Smallest share of slots in common with the CPU (NaN: not checked).
    overlap: f64,
}

fn floor_us(s: &Shape, bw: f64, gemm: f64) -> f64 {
    (s.bytes() / bw).max(s.flops() / gemm) * 1e6
}

fn format_row(r: &Row, bw: f64, gemm: f64) -> String {
    let s = &r.shape;
    format!(
        "{:<36} {:<8} {:>9.1} us (scores {:>8.1}, select {:>7.1}) {:>6.0} TFLOP/s {:>6.0} GB/s floor {:>8.1} us {:>5.1}% of floor  overlap {:.4}",
        s.label(),
        r.kernel,
        r.us,
        r.scores_us,
        r.us - r.scores_us,
        s.flops() / r.us / 1e6,
        s.bytes() / r.us / 1e3,
        floor_us(s, bw, gemm),
        100.0 * floor_us(s, bw, gemm) / r.us,
        r.overlap
    )
}

fn to_json(rows: &[Row], bw: f64, gemm: f64, device: &str) -> String {
    let list: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let s = &r.shape;
            serde_json::json!({
                "kind": if s.prefill { "prefill" } else { "decode" }, "b": s.b, "s": s.s, "t": s.t(),
                "h": H, "di": DI, "topk": TOPK, "kernel": r.kernel, "us": r.us, "scores_us": r.scores_us,
                "floor_us": floor_us(s, bw, gemm), "pct_of_floor": 100.0 * floor_us(s, bw, gemm) / r.us,
                "overlap": r.overlap.is_finite().then_some(r.overlap),
            })
        })
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({
        "device": device, "copy_gbps": bw / 1e9, "gemm_tflops": gemm / 1e12, "rows": list,
    }))
    .unwrap_or_default()
}

pub fn run(a: Args) -> Result<ExitCode, String> {
    let Args { json, iters, no_parity, only } = a;
    let todo = crate::bench::select(shapes(), &only, |s, o| s.matches(o))?;
    let q = cuda_queue(&[vt_core::OpId::IndexerTopK])?;
    let e = |e: vt_core::Error| e.to_string();
    let bench = Bench::new(&q, 256 << 20).map_err(e)?;
    let device = device_name();
    println!("device: {device}");
    let (bw, gemm) = ceilings(&bench)?;
    let bar = Progress::new(todo.len() as u64, "bench indexer");
    let mut rows = Vec::new();
    let mut failed = false;
    for s in todo {
        bar.step(format!("{}: inputs", s.label()));
        let x = make_inputs(&q, &bench, &s).map_err(e)?;
        let a = args(&x);
        let kernel = indexer_top_k_with(&q, &a, Kernel::Auto).map_err(e)?;
        bar.step(format!("{}: CPU reference", s.label()));
        let overlap = if no_parity {
            f64::NAN
        } else {
            let first = check_query(&q, &s, &x, 0).map_err(e)?;
            first.min(check_query(&q, &s, &x, s.t() - 1).map_err(e)?)
        };
        failed |= !no_parity && (overlap.is_nan() || overlap < MIN_OVERLAP);
        bar.step(format!("{}: timing", s.label()));
        let mut t = bench
            .time_us(3, iters, true, || indexer_top_k_with(&q, &a, Kernel::Auto).map(|_| ()))
            .map_err(e)?;
        let mut ts =
            bench.time_us(3, iters, true, || indexer_scores_only(&q, &a, Kernel::Auto)).map_err(e)?;
        let row = Row { shape: s, kernel, us: median(&mut t), scores_us: median(&mut ts), overlap };
        bar.println(format_row(&row, bw, gemm));
        bar.inc();
        rows.push(row);
    }
    drop(bar);
    if let Some(f) = json {
        std::fs::write(&f, to_json(&rows, bw, gemm, &device))
            .map_err(|er| format!("writing {}: {er}", f.display()))?;
    }
    if failed {
        println!(
            "FAILED: a row shares fewer than {:.0}% of its slots with the CPU reference",
            MIN_OVERLAP * 100.0
        );
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shapes_are_decode_and_prefill_at_deepseek_dims() {
        let v = shapes();
        assert_eq!(v.len(), 8);
        let d: Vec<_> = v.iter().filter(|s| !s.prefill).map(|s| (s.b, s.s)).collect();
        assert_eq!(d, [(1, 32768), (32, 32768), (128, 32768), (1, 65536), (32, 65536), (128, 65536)]);
        let p = v.iter().find(|s| s.prefill && s.s == 32768).expect("chunked prefill row");
        assert_eq!((p.t(), p.position(0), p.position(4095)), (4096, 28672, 32767));
    }

    #[test]
    fn counts_pairs_flops_and_bytes() {
        let d = Shape { prefill: false, b: 128, s: 65536 };
        assert_eq!(d.pairs(), 128 * 65536);
        assert_eq!(d.flops(), 2.0 * 64.0 * 128.0 * (128.0 * 65536.0));
        // Keys 2 GiB (256 B a token) + q 2 MiB + weights 32 KiB + out 1 MiB.
        assert_eq!(
            d.bytes(),
            (128i64 * 65536 * 256 + 128 * 64 * 128 * 2 + 128 * 64 * 4 + 128 * 2048 * 4) as f64
        );
        let p = Shape { prefill: true, b: 1, s: 4096 };
        assert_eq!(p.pairs(), 4096 * 4097 / 2);
    }

    #[test]
    fn only_specs_select_shapes() {
        let pick = |s: &str| shapes().iter().filter(|x| x.matches(s)).count();
        assert_eq!(pick("decode"), 6);
        assert_eq!(pick("prefill"), 2);
        assert_eq!(pick("b32,s65536"), 1);
        assert_eq!(pick("prefill,s4096"), 1);
        assert!(only_spec("h64").is_err());
        assert!(only_spec("decode,b1").is_ok());
    }
}
