//! `cargo xtask bench decode [--json FILE] [--plot FILE] [--sweep] [--iters N] [--only SPEC]...
//! [--no-parity]`: MlaDecodeAttention on the first CUDA device, on FlashMLA's benchmark shapes
//! (../shared/ANCHORS.md).
//!
//! - Shapes: s_q = 1, one KV head, D = 576, Dv = 512, bf16, paged cache of block size 64
//!   unless a row says otherwise, sequence i of a batch has `seqlen + 2 i` tokens, pages
//!   scattered by a random permutation. Extra rows: block sizes 1/16/64 and s_q = 2.
//! - Counting (FlashMLA's): FLOPs = 2 s_q total_kv h_q (d + dv);
//!   bytes = 2 (total_kv d + b s_q h_q d + b s_q h_q dv).
//! - Ceilings measured in the same run: device-to-device copy (bytes read + written) and a
//!   cuBLAS bf16 GEMM 8192^3 on random data. floor = max(bytes / copy, FLOPs / GEMM).
//! - Timing: CUDA events around each call, the L2 flushed (256 MB written) before each,
//!   median of `--iters` (default 40) after warm-up.
//! - Parity: before timing, each shape's output (NaN-poisoned) is checked against the CPU
//!   reference (vt-cpu) on three sequences (first, middle, last) and up to four heads.
//! - `--sweep` also times every kernel / minimum-tiles-per-part variant per shape;
//!   `--only h128,b1,s8192` (repeatable) keeps matching shapes; `--no-parity` skips the
//!   CPU check (for profiler runs); `--plot FILE` (.svg or .png) draws time per shape, ours
//!   beside FlashMLA's and the floor.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use vt_core::{Buffer, DType, Device, DeviceType, MlaDecodeAttentionArgs, Queue};

use crate::plot::{Chart, Series};
use crate::progress::Progress;
use vt_cuda::bench::{filled_value, median, Bench};
use vt_cuda::mla_decode_attention::{mla_decode_attention_with, DecodeOptions, Kernel, Plan};

/// `cargo xtask bench decode` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write the rows (and this run's ceilings) as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw time per shape (ours, FlashMLA, the floor) as .svg or .png.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Also time every kernel / minimum-tiles-per-part variant per shape.
    #[arg(long)]
    pub sweep: bool,
    /// Timed runs per shape (median reported).
    #[arg(long, value_name = "N", default_value_t = 40, value_parser = positive)]
    pub iters: usize,
    /// Skip the CPU check before timing (for profiler runs).
    #[arg(long)]
    pub no_parity: bool,
    /// Keep shapes matching every key given (hN, bN, sN, bsN, sqN), e.g. `h128,b1,s8192`; repeatable.
    #[arg(long, value_name = "SPEC", value_parser = only_spec)]
    pub only: Vec<String>,
}

/// A count of at least 1 (clap value parser).
pub fn positive(s: &str) -> Result<usize, String> {
    s.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| format!("`{s}` is not a positive count"))
}

/// `--only` keys: h, b, s, bs, sq, each followed by a number.
fn only_spec(s: &str) -> Result<String, String> {
    for kv in s.split(',') {
        let i = kv.find(|c: char| c.is_ascii_digit()).unwrap_or(kv.len());
        let (k, v) = kv.split_at(i);
        if !matches!(k, "h" | "b" | "s" | "bs" | "sq") || v.parse::<i64>().is_err() {
            return Err(format!("`{kv}` is not one of hN, bN, sN, bsN, sqN"));
        }
    }
    Ok(s.to_string())
}
const D: i64 = 576;
const DV: i64 = 512;
const Q_SEED: u64 = 11;
const KV_SEED: u64 = 12;

/// (h_q, b, seqlen, FlashMLA microseconds) from ANCHORS.md.
const ANCHORS: [(i64, i64, i64, f64); 14] = [
    (16, 128, 4096, 174.6),
    (16, 128, 8192, 319.6),
    (16, 64, 16384, 317.7),
    (16, 32, 4096, 56.2),
    (16, 1, 8192, 29.2),
    (32, 128, 8192, 322.9),
    (64, 128, 4096, 181.8),
    (64, 128, 8192, 329.1),
    (64, 32, 4096, 60.9),
    (128, 128, 4096, 266.6),
    (128, 128, 8192, 478.1),
    (128, 64, 16384, 513.8),
    (128, 32, 4096, 80.5),
    (128, 1, 8192, 30.4),
];

#[derive(Clone, Copy, Debug)]
struct Shape {
    h: i64,
    b: i64,
    seqlen: i64,
    bs: i64,
    s_q: i64,
    flash_us: Option<f64>,
    tag: &'static str,
}

impl Shape {
    fn total_kv(&self) -> i64 {
        (0..self.b).map(|i| self.seqlen + 2 * i).sum()
    }
    fn flops(&self) -> f64 {
        2.0 * self.s_q as f64 * self.total_kv() as f64 * self.h as f64 * (D + DV) as f64
    }
    fn bytes(&self) -> f64 {
        let rows = (self.b * self.s_q * self.h) as f64;
        2.0 * (self.total_kv() as f64 * D as f64 + rows * D as f64 + rows * DV as f64)
    }
    /// `--only h128,b1,s8192[,bs64][,sq1]`: every given key matches.
    fn matches(&self, spec: &str) -> bool {
        spec.split(',').all(|kv| {
            let (k, v) = kv.split_at(kv.find(|c: char| c.is_ascii_digit()).unwrap_or(kv.len()));
            let v: i64 = v.parse().unwrap_or(-1);
            match k {
                "h" => self.h == v,
                "b" => self.b == v,
                "s" => self.seqlen == v,
                "bs" => self.bs == v,
                "sq" => self.s_q == v,
                _ => false,
            }
        })
    }

    fn label(&self) -> String {
        format!("h{} b{} s{} bs{} sq{}", self.h, self.b, self.seqlen, self.bs, self.s_q)
    }
}

fn shapes() -> Vec<Shape> {
    let mut v: Vec<Shape> = ANCHORS
        .iter()
        .map(|&(h, b, seqlen, f)| Shape { h, b, seqlen, bs: 64, s_q: 1, flash_us: Some(f), tag: "anchor" })
        .collect();
    for (h, b, seqlen) in [(16, 128, 4096), (128, 32, 4096)] {
        for bs in [1, 16] {
            v.push(Shape { h, b, seqlen, bs, s_q: 1, flash_us: None, tag: "block size" });
        }
        v.push(Shape { h, b, seqlen, bs: 64, s_q: 2, flash_us: None, tag: "s_q 2" });
    }
    v
}

struct Row {
    shape: Shape,
    plan: Plan,
    us: f64,
    spread: (f64, f64),
    err: f64,
    parity: bool,
    sweep: Vec<(String, f64)>,
}

/// Splitmix64 step: the host side's only randomness (page permutation).
fn mix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Device buffers of one shape.
struct Inputs {
    q: Buffer,
    cache: Buffer,
    block_table: Buffer,
    seq_lens: Buffer,
    out: Buffer,
    lse: Buffer,
    /// Host copies of the index data.
    table: Vec<i32>,
    lens: Vec<i32>,
    mb: i64,
}

fn make_inputs(q: &Queue, bench: &Bench<'_>, s: &Shape) -> vt_core::Result<Inputs> {
    let lens: Vec<i32> = (0..s.b).map(|i| (s.seqlen + 2 * i) as i32).collect();
    let blocks: Vec<i64> = lens.iter().map(|&l| (l as i64 + s.bs - 1) / s.bs).collect();
    let mb = blocks.iter().copied().max().unwrap_or(1).max(1);
    let nb: i64 = blocks.iter().sum();
    let mut ids: Vec<i32> = (0..nb as i32).collect();
    let mut rng = 0x5eed_u64 ^ (s.h as u64) << 32 ^ s.bs as u64;
    for i in (1..ids.len()).rev() {
        let j = (mix(&mut rng) % (i as u64 + 1)) as usize;
        ids.swap(i, j);
    }
    let mut table = vec![0i32; (s.b * mb) as usize];
    let mut next = 0;
    for (i, &n) in blocks.iter().enumerate() {
        for j in 0..n {
            table[i * mb as usize + j as usize] = ids[next];
            next += 1;
        }
    }
    let qb = Buffer::uninit(q, DType::BF16, &[s.b, s.s_q, s.h, D])?;
    let cache = Buffer::uninit(q, DType::BF16, &[nb, s.bs, D])?;
    bench.fill(&qb.view(), Q_SEED, 1.0)?;
    bench.fill(&cache.view(), KV_SEED, 1.0)?;
    Ok(Inputs {
        q: qb,
        cache,
        block_table: Buffer::from_slice(q, &[s.b, mb], &table)?,
        seq_lens: Buffer::from_slice(q, &[s.b], &lens)?,
        out: Buffer::nan(q, DType::BF16, &[s.b, s.s_q, s.h, DV])?,
        lse: Buffer::nan(q, DType::F32, &[s.b, s.h, s.s_q])?,
        table,
        lens,
        mb,
    })
}

fn args<'a>(x: &'a Inputs, scale: f32) -> MlaDecodeAttentionArgs<'a> {
    MlaDecodeAttentionArgs {
        out: x.out.view(),
        lse: Some(x.lse.view()),
        q: x.q.view(),
        cache: x.cache.view(),
        block_table: x.block_table.view(),
        seq_lens: x.seq_lens.view(),
        scale,
    }
}

/// Checks sequences {0, b/2, b-1} x up to four heads against the CPU reference, rebuilding
/// their inputs on the host from the fill's host twin. Returns the worst relative Frobenius
/// error of out (infinite if any checked value is not finite or an lse disagrees).
fn parity(gpu: &Queue, s: &Shape, x: &Inputs, scale: f32) -> vt_core::Result<f64> {
    let mut seqs = vec![0, s.b / 2, s.b - 1];
    seqs.dedup();
    let mut heads = vec![0, 1, s.h / 2, s.h - 1];
    heads.sort_unstable();
    heads.dedup();
    let got = gpu.read_f64(&x.out.view())?;
    let got_lse = gpu.read_f64(&x.lse.view())?;
    let nh = heads.len() as i64;
    let results: Vec<vt_core::Result<f64>> = std::thread::scope(|sc| {
        let handles: Vec<_> = seqs
            .iter()
            .map(|&bi| {
                let heads = &heads;
                let (got, got_lse) = (&got, &got_lse);
                sc.spawn(move || -> vt_core::Result<f64> {
                    let cpu = Queue::new(Device::CPU)?;
                    let len = x.lens[bi as usize] as i64;
                    let nblk = (len + s.bs - 1) / s.bs;
                    let mut qv = Vec::with_capacity((s.s_q * nh * D) as usize);
                    for t in 0..s.s_q {
                        for &h in heads {
                            let base = (((bi * s.s_q + t) * s.h + h) * D) as u64;
                            qv.extend(
                                (0..D as u64)
                                    .map(|e| filled_value(DType::BF16, Q_SEED, 1.0, base + e) as f64),
                            );
                        }
                    }
                    let mut kv = Vec::with_capacity((nblk * s.bs * D) as usize);
                    for j in 0..nblk {
                        let blk = x.table[(bi * x.mb + j) as usize] as u64;
                        let base = blk * (s.bs * D) as u64;
                        kv.extend(
                            (0..(s.bs * D) as u64)
                                .map(|e| filled_value(DType::BF16, KV_SEED, 1.0, base + e) as f64),
                        );
                    }
                    let table: Vec<i32> = (0..nblk.max(1) as i32).collect();
                    let bt = Buffer::from_slice(&cpu, &[1, nblk.max(1)], &table)?;
                    let sl = Buffer::from_slice(&cpu, &[1], &[len as i32])?;
                    let out = Buffer::nan(&cpu, DType::F32, &[1, s.s_q, nh, DV])?;
                    let lse = Buffer::nan(&cpu, DType::F32, &[1, nh, s.s_q])?;
                    // f32 reference on the bf16 values the GPU read.
                    let qf = Buffer::from_f64(&cpu, DType::F32, &[1, s.s_q, nh, D], &qv)?;
                    let kf = Buffer::from_f64(&cpu, DType::F32, &[nblk.max(1), s.bs, D], &kv)?;
                    vt_core::mla_decode_attention(
                        &cpu,
                        &out.view(),
                        Some(&lse.view()),
                        &qf.view(),
                        &kf.view(),
                        &bt.view(),
                        &sl.view(),
                        scale,
                    )?;
                    let want = out.to_f64(&cpu)?;
                    let want_lse = lse.to_f64(&cpu)?;
                    let (mut num, mut den) = (0.0f64, 0.0f64);
                    let mut ok = true;
                    for t in 0..s.s_q {
                        for (hi, &h) in heads.iter().enumerate() {
                            let g0 = (((bi * s.s_q + t) * s.h + h) * DV) as usize;
                            let w0 = ((t * nh + hi as i64) * DV) as usize;
                            for e in 0..DV as usize {
                                let (g, w) = (got[g0 + e], want[w0 + e]);
                                ok &= g.is_finite();
                                num += (g - w) * (g - w);
                                den += w * w;
                            }
                            let gl = got_lse[((bi * s.h + h) * s.s_q + t) as usize];
                            let wl = want_lse[(hi as i64 * s.s_q + t) as usize];
                            ok &= (gl - wl).abs() <= 1e-3 * (1.0 + wl.abs());
                        }
                    }
                    Ok(if ok { (num / den.max(1e-30)).sqrt() } else { f64::INFINITY })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(Ok(f64::INFINITY))).collect()
    });
    let mut worst = 0.0f64;
    for r in results {
        worst = worst.max(r?);
    }
    Ok(worst)
}

fn time_call(
    bench: &Bench<'_>,
    q: &Queue,
    a: &MlaDecodeAttentionArgs<'_>,
    o: &DecodeOptions,
    iters: usize,
) -> vt_core::Result<(f64, f64, f64)> {
    let mut t = bench.time_us(3, iters, true, || mla_decode_attention_with(q, a, o).map(|_| ()))?;
    let m = median(&mut t);
    Ok((m, t[t.len() / 10], t[t.len() - 1 - t.len() / 10]))
}

pub fn run(args_in: Args) -> Result<ExitCode, String> {
    let Args { json, plot, sweep, iters, no_parity, only } = args_in;
    let check = !no_parity;
    let probes = vt_backends::init();
    if !vt_core::op_registered(vt_core::OpId::MlaDecodeAttention, DeviceType::Cuda) {
        let p: Vec<String> = probes.iter().map(|(d, p)| format!("{d}: {p}")).collect();
        return Err(format!("no CUDA device with MlaDecodeAttention ({})", p.join("; ")));
    }
    let q = Queue::new(Device::new(DeviceType::Cuda, 0)).map_err(|e| e.to_string())?;
    let e = |e: vt_core::Error| e.to_string();
    let bench = Bench::new(&q, 256 << 20).map_err(e)?;
    let name = vt_core::registry::backend(DeviceType::Cuda).map(|b| b.device_name(0)).unwrap_or_default();
    println!("device: {name}");
    let copy_bw = bench.copy_bandwidth(1 << 30, 20).map_err(e)?;
    let gemm = bench.gemm_bf16_flops(8192, 20).map_err(e)?;
    println!(
        "ceilings (this run): device copy {:.0} GB/s (read + write), cuBLAS bf16 GEMM 8192^3 {:.0} TFLOP/s",
        copy_bw / 1e9,
        gemm / 1e12
    );
    let scale = 1.0 / (D as f32).sqrt();
    let mut rows: Vec<Row> = Vec::new();
    let todo: Vec<Shape> =
        shapes().into_iter().filter(|s| only.is_empty() || only.iter().any(|o| s.matches(o))).collect();
    let bar = Progress::new(todo.len() as u64, "bench decode");
    for s in todo {
        bar.step(format!("{}: cache fill", s.label()));
        let x = make_inputs(&q, &bench, &s).map_err(e)?;
        let a = args(&x, scale);
        vt_core::mla_decode_attention(
            &q,
            &a.out,
            a.lse.as_ref(),
            &a.q,
            &a.cache,
            &a.block_table,
            &a.seq_lens,
            scale,
        )
        .map_err(e)?;
        bar.step(format!("{}: CPU reference", s.label()));
        let err = if check { parity(&q, &s, &x, scale).map_err(e)? } else { f64::NAN };
        bar.step(format!("{}: timing", s.label()));
        let auto = DecodeOptions::default();
        let plan = mla_decode_attention_with(&q, &a, &auto).map_err(e)?;
        let (us, lo, hi) = time_call(&bench, &q, &a, &auto, iters).map_err(e)?;
        let mut sw = Vec::new();
        if sweep {
            for kernel in [Kernel::Mma, Kernel::MmaSmall, Kernel::Wgmma] {
                for mt in [1u32, 2, 4, 8] {
                    let o = DecodeOptions { kernel, min_tiles: Some(mt), max_parts: None };
                    let label = format!("{kernel:?}/min{mt}").to_lowercase();
                    match time_call(&bench, &q, &a, &o, iters.min(20)) {
                        Ok((t, _, _)) => sw.push((label, t)),
                        Err(err) => sw.push((format!("{label} ({err})"), f64::NAN)),
                    }
                }
            }
        }
        let row = Row { shape: s, plan, us, spread: (lo, hi), err, parity: !check || err < 1e-2, sweep: sw };
        bar.println(format_row(&row, copy_bw, gemm));
        bar.inc();
        rows.push(row);
    }
    drop(bar);
    let summary = summarize(&rows, copy_bw, gemm);
    print!("{summary}");
    if let Some(f) = json {
        std::fs::write(&f, to_json(&rows, copy_bw, gemm, &name))
            .map_err(|er| format!("writing {}: {er}", f.display()))?;
    }
    if let Some(f) = plot {
        crate::plot::write(&f, &chart(&rows, copy_bw, gemm, &name))?;
        println!("plot: {}", f.display());
    }
    Ok(if rows.iter().all(|r| r.parity) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn floor_us(s: &Shape, bw: f64, gemm: f64) -> f64 {
    (s.bytes() / bw).max(s.flops() / gemm) * 1e6
}

/// The plot: time per shape, ours beside FlashMLA's and this run's floor.
fn chart(rows: &[Row], bw: f64, gemm: f64, device: &str) -> Chart {
    let labels = rows.iter().map(|r| format!("{} {}", r.shape.label(), r.plan.kernel)).collect();
    Chart {
        title: format!("MlaDecodeAttention, {device}: time per shape (lower is better)"),
        unit: "time per call, us".into(),
        labels,
        series: vec![
            Series { name: "vt".into(), values: rows.iter().map(|r| Some(r.us)).collect() },
            Series { name: "FlashMLA".into(), values: rows.iter().map(|r| r.shape.flash_us).collect() },
            Series {
                name: "floor (this run's ceilings)".into(),
                values: rows.iter().map(|r| Some(floor_us(&r.shape, bw, gemm))).collect(),
            },
        ],
    }
}

fn format_row(r: &Row, bw: f64, gemm: f64) -> String {
    let s = &r.shape;
    let mut line = format!(
        "{:<30} {:>7} x{}p{:<4} {:>8.1} us [{:.1}..{:.1}] {:>6.0} GB/s {:>5.0} TFLOP/s {:>4.0}% floor",
        s.label(),
        r.plan.kernel,
        r.plan.row_blocks,
        r.plan.parts,
        r.us,
        r.spread.0,
        r.spread.1,
        s.bytes() / r.us / 1e3,
        s.flops() / r.us / 1e6,
        100.0 * floor_us(s, bw, gemm) / r.us
    );
    if let Some(f) = s.flash_us {
        let _ = write!(line, "  FlashMLA {f:.1} us, ratio {:.2}", r.us / f);
    }
    let _ = write!(line, "  parity {} ({:.1e})", if r.parity { "PASS" } else { "FAIL" }, r.err);
    if !r.sweep.is_empty() {
        let v: Vec<String> = r.sweep.iter().map(|(l, t)| format!("{l} {t:.1}")).collect();
        let _ = write!(line, "\n    sweep: {}", v.join(", "));
    }
    line
}

fn summarize(rows: &[Row], bw: f64, gemm: f64) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "\n| h_q | b | seqlen | bs | s_q | kernel | time us | GB/s | TFLOP/s | % floor | FlashMLA us | ratio | parity |");
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let s = &r.shape;
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
            s.h,
            s.b,
            s.seqlen,
            s.bs,
            s.s_q,
            r.plan.kernel,
            r.us,
            s.bytes() / r.us / 1e3,
            s.flops() / r.us / 1e6,
            100.0 * floor_us(s, bw, gemm) / r.us,
            s.flash_us.map_or("-".into(), |f| format!("{f:.1}")),
            s.flash_us.map_or("-".into(), |f| format!("{:.2}", r.us / f)),
            if r.parity { "PASS" } else { "FAIL" }
        );
    }
    let find = |h, b, seqlen, bs, s_q| {
        rows.iter().find(|r| {
            let s = &r.shape;
            (s.h, s.b, s.seqlen, s.bs, s.s_q) == (h, b, seqlen, bs, s_q)
        })
    };
    let _ = writeln!(o, "\ntargets:");
    let anchors: Vec<&Row> = rows.iter().filter(|r| r.shape.flash_us.is_some()).collect();
    let beat = anchors.iter().filter(|r| r.shape.flash_us.is_some_and(|f| r.us <= f)).count();
    let _ = writeln!(o, "- at or under FlashMLA: {beat} of {} anchor shapes", anchors.len());
    for h in [16, 128] {
        if let Some(r) = find(h, 1, 8192, 64, 1) {
            let _ =
                writeln!(o, "- b=1 seqlen 8192 h_q {h}: {:.1} us (target <= 10): {}", r.us, ok(r.us <= 10.0));
        }
    }
    for (h, b) in [(16, 128), (128, 32)] {
        if let Some(base) = find(h, b, 4096, 64, 1) {
            for bs in [1, 16] {
                if let Some(r) = find(h, b, 4096, bs, 1) {
                    let x = r.us / base.us;
                    let _ = writeln!(
                        o,
                        "- h{h} b{b}: block size {bs} / 64 = {x:.3} (target <= 1.10): {}",
                        ok(x <= 1.10)
                    );
                }
            }
            if let Some(r) = find(h, b, 4096, 64, 2) {
                let x = r.us / base.us;
                let _ = writeln!(o, "- h{h} b{b}: s_q 2 / s_q 1 = {x:.3} (target <= 2.2): {}", ok(x <= 2.2));
            }
        }
    }
    let pass = rows.iter().filter(|r| r.parity).count();
    let _ = writeln!(o, "- parity: {pass} of {} shapes PASS", rows.len());
    let _ = writeln!(o, "(floors from this run: copy {:.0} GB/s, GEMM {:.0} TFLOP/s)", bw / 1e9, gemm / 1e12);
    o
}

fn ok(b: bool) -> &'static str {
    if b {
        "met"
    } else {
        "MISSED"
    }
}

fn to_json(rows: &[Row], bw: f64, gemm: f64, device: &str) -> String {
    let mut o = format!(
        "{{\"device\": {:?}, \"copy_gbps\": {:.1}, \"gemm_tflops\": {:.1}, \"rows\": [\n",
        device,
        bw / 1e9,
        gemm / 1e12
    );
    for (i, r) in rows.iter().enumerate() {
        let s = &r.shape;
        let sweep: Vec<String> =
            r.sweep.iter().map(|(l, t)| format!("{{\"variant\": {l:?}, \"us\": {t:.2}}}")).collect();
        let _ = writeln!(
            o,
            "  {{\"tag\": {:?}, \"h_q\": {}, \"b\": {}, \"seqlen\": {}, \"block_size\": {}, \"s_q\": {}, \
             \"kernel\": {:?}, \"row_blocks\": {}, \"parts\": {}, \"us\": {:.2}, \"gbps\": {:.1}, \"tflops\": {:.1}, \
             \"pct_floor\": {:.1}, \"flashmla_us\": {}, \"parity_err\": {:.3e}, \"parity\": {}, \"sweep\": [{}]}}{}",
            s.tag,
            s.h,
            s.b,
            s.seqlen,
            s.bs,
            s.s_q,
            r.plan.kernel,
            r.plan.row_blocks,
            r.plan.parts,
            r.us,
            s.bytes() / r.us / 1e3,
            s.flops() / r.us / 1e6,
            100.0 * floor_us(s, bw, gemm) / r.us,
            s.flash_us.map_or("null".into(), |f| format!("{f}")),
            if r.err.is_finite() { r.err } else { 1e9 },
            r.parity,
            sweep.join(", "),
            if i + 1 < rows.len() { "," } else { "" }
        );
    }
    o.push_str("]}\n");
    o
}
