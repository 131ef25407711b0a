//! `cargo xtask bench prefill [--json FILE] [--peer FILE] [--plot FILE] [--iters N]
//! [--only SPEC]... [--no-parity]`: the public op `vt_core::prefill_attention` (whatever
//! kernel vt-cuda registers) on the first CUDA device, on DeepSeek's MLA prefill shape.
//!
//! - Shapes (issue 11): single causal sequences, T = 1024, 4096, 8192, 16384 at 128 and 16
//!   heads; a varlen batch (16 causal sequences, lengths spread over 256..8192, mixed order)
//!   at 128 heads, with a single causal sequence of the same work beside it (`varlen ref`);
//!   chunked context (4096 queries, non-causal, with lse, over 16384 and 65536 keys) at 128
//!   and 16 heads.
//! - Head dims qk 192, v 128, bf16, laid out as `mla-block` passes them: q `[T, N, 192]`
//!   and k `[T, N, 192]` contiguous (k is ConcatMlaNopeRope's output), v a column slice of
//!   the kv_b_proj output `[T, N, 128 + 128]` (offset 128, strides `N·256, 256, 1`).
//! - FLOPs = 2 x visible (query, key) pairs x heads x (192 + 128); the bf16 GEMM ceiling
//!   (cuBLAS 8192^3 on random data) is measured in the same run.
//! - Parity before timing: the output (NaN-poisoned) of every shape against the CPU reference
//!   (vt-cpu, f32 on the same bf16 values) on 3 heads and blocks of 4 query rows (first,
//!   middle, last) of up to 3 sequences, each block a small CPU problem over exactly the keys
//!   its rows see; relative Frobenius error <= 2e-2, lse within 1e-3 (1 + |lse|).
//! - Timing: CUDA events, the L2 flushed (256 MB written) before each call, median of
//!   `--iters` (default 20) after warm-up; shapes whose call takes long run fewer times
//!   (at least 3, about 3 s of calls per shape).
//! - `--peer FILE`: the JSON of `tools/peers/sdpa_prefill.py` (torch SDPA, cuDNN and flash);
//!   prints their TFLOP/s (recomputed from their ms with the FLOP count above) and vt/cuDNN
//!   per shape, and the targets of issue 11 item 6 as ok/MISS columns: single and chunked
//!   shapes at or above cuDNN; the varlen batch within 10% of the single sequence of the same
//!   work; 16 heads within 10% of 128 heads per unit of work (TFLOP/s).
//! - `--json FILE` writes our rows (peer format plus our columns), `--plot FILE` (.svg/.png)
//!   TFLOP/s per shape with cuDNN and flash beside ours.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use vt_core::{Buffer, DType, Device, OpId, PrefillAttentionArgs, Queue};
use vt_cuda::bench::{filled_value, median, Bench};

use crate::peer_json;
use crate::plot::{Chart, Series};
use crate::progress::Progress;

/// `cargo xtask bench prefill` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write our rows (and this run's GEMM ceiling) as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// The peer's JSON (tools/peers/sdpa_prefill.py --json FILE, same device call).
    #[arg(long, value_name = "FILE")]
    pub peer: Option<PathBuf>,
    /// Draw TFLOP/s per shape (ours, cuDNN, flash) as .svg or .png.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Timed runs per shape at most (median reported; long calls run fewer, at least 3).
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = crate::bench::positive)]
    pub iters: usize,
    /// Keep shapes matching every key given: h128, t4096 (queries), k65536 (keys), single,
    /// varlen, chunk; comma-separated, repeatable.
    #[arg(long, value_name = "SPEC", value_parser = only_spec)]
    pub only: Vec<String>,
    /// Skip the CPU check before timing (for profiler runs).
    #[arg(long)]
    pub no_parity: bool,
}

pub const DQK: i64 = 192;
pub const DV: i64 = 128;
/// Per-head width of the kv_b_proj output v is sliced from (k_nope 128, then v 128).
pub const KV_NOPE: i64 = 128 + DV;
/// Relative Frobenius tolerance of bf16 outputs against the f32 CPU reference.
pub const TOL: f64 = 2e-2;
const Q_SEED: u64 = 21;
const K_SEED: u64 = 22;
const V_SEED: u64 = 23;
/// Seconds of timed calls per shape before `--iters` is cut (at least 3 runs stay).
const BUDGET_S: f64 = 3.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Single,
    Varlen,
    /// The single causal sequence with the varlen batch's work.
    VarlenRef,
    Chunk,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Single => "single",
            Kind::Varlen => "varlen",
            Kind::VarlenRef => "varlen ref",
            Kind::Chunk => "chunk",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub kind: Kind,
    pub heads: i64,
    pub q_lens: Vec<i64>,
    pub k_lens: Vec<i64>,
    pub causal: bool,
    pub lse: bool,
}

/// Visible (query, key) pairs of one sequence: non-causal lq lk; causal bottom-right,
/// query i sees keys `0 ..= lk - lq + i` (none if negative).
pub fn visible_pairs(lq: i64, lk: i64, causal: bool) -> i64 {
    if !causal {
        return lq * lk;
    }
    // Row i sees clamp(lk - lq + 1 + i, 0, lk) keys; i < lq keeps it <= lk.
    let first = lk - lq + 1;
    if first >= 1 {
        lq * first + lq * (lq - 1) / 2
    } else {
        let m = (lq + first - 1).max(0); // rows that see at least one key: 1..=m keys
        m * (m + 1) / 2
    }
}

/// The varlen batch: 16 lengths spread evenly over 256..=8192, in a mixed order (7 is
/// coprime to 16) so long and short sequences alternate as in a real batch.
pub fn varlen_lens() -> Vec<i64> {
    let sorted: Vec<i64> = (0..16).map(|i| 256 + i * (8192 - 256) / 15).collect();
    (0..16).map(|j| sorted[(j * 7) % 16]).collect()
}

/// The single causal sequence length (a multiple of 64) whose work matches `pairs`.
pub fn same_work_len(pairs: i64) -> i64 {
    // T (T + 1) / 2 = pairs; rounded half up to 64 (tools/peers/sdpa_prefill.py does the same).
    let t = (2.0 * pairs as f64).sqrt();
    ((t / 64.0 + 0.5).floor() as i64) * 64
}

impl Shape {
    fn single(heads: i64, t: i64, kind: Kind) -> Shape {
        Shape { kind, heads, q_lens: vec![t], k_lens: vec![t], causal: true, lse: false }
    }
    /// The table's causal varlen batch ([`varlen_lens`], queries and keys alike) at 128 heads.
    fn varlen() -> Shape {
        let lens = varlen_lens();
        Shape { kind: Kind::Varlen, heads: 128, q_lens: lens.clone(), k_lens: lens, causal: true, lse: false }
    }
    pub fn tq(&self) -> i64 {
        self.q_lens.iter().sum()
    }
    pub fn tk(&self) -> i64 {
        self.k_lens.iter().sum()
    }
    pub fn pairs(&self) -> i64 {
        self.q_lens.iter().zip(&self.k_lens).map(|(&q, &k)| visible_pairs(q, k, self.causal)).sum()
    }
    pub fn flops(&self) -> f64 {
        2.0 * self.pairs() as f64 * self.heads as f64 * (DQK + DV) as f64
    }
    pub fn label(&self) -> String {
        match self.kind {
            Kind::Single | Kind::VarlenRef => {
                format!("h{} {} causal T={}", self.heads, self.kind.name(), self.tq())
            }
            Kind::Varlen => format!(
                "h{} varlen {}x{}..{} causal T={}",
                self.heads,
                self.q_lens.len(),
                self.q_lens.iter().min().unwrap_or(&0),
                self.q_lens.iter().max().unwrap_or(&0),
                self.tq()
            ),
            Kind::Chunk => format!("h{} chunk {} over {} keys, lse", self.heads, self.tq(), self.tk()),
        }
    }
    /// `--only h128,t4096,k65536,chunk`: every given key matches.
    fn matches(&self, spec: &str) -> bool {
        spec.split(',').all(|key| match key {
            "single" => self.kind == Kind::Single || self.kind == Kind::VarlenRef,
            "varlen" => self.kind == Kind::Varlen || self.kind == Kind::VarlenRef,
            "chunk" => self.kind == Kind::Chunk,
            _ => {
                let (k, v) = key.split_at(1);
                let v: i64 = v.parse().unwrap_or(-1);
                match k {
                    "h" => self.heads == v,
                    "t" => self.tq() == v,
                    "k" => self.tk() == v,
                    _ => false,
                }
            }
        })
    }
    /// The peer row key: (heads, tq, tk, causal, the varlen lengths).
    fn peer_key(&self) -> (i64, i64, i64, bool, Option<Vec<i64>>) {
        let lens = (self.kind == Kind::Varlen).then(|| self.q_lens.clone());
        (self.heads, self.tq(), self.tk(), self.causal, lens)
    }
}

fn only_spec(s: &str) -> Result<String, String> {
    for key in s.split(',') {
        let ok = matches!(key, "single" | "varlen" | "chunk")
            || (key.len() > 1
                && matches!(&key[..1], "h" | "t" | "k")
                && key[1..].parse::<i64>().is_ok_and(|v| v > 0));
        if !ok {
            return Err(format!("`{key}` is not one of hN, tN, kN, single, varlen, chunk"));
        }
    }
    Ok(s.to_string())
}

/// Every shape, in table order.
pub fn shapes() -> Vec<Shape> {
    let mut v = Vec::new();
    for heads in [128, 16] {
        for t in [1024, 4096, 8192, 16384] {
            v.push(Shape::single(heads, t, Kind::Single));
        }
    }
    let varlen = Shape::varlen();
    v.push(Shape::single(128, same_work_len(varlen.pairs()), Kind::VarlenRef));
    v.push(varlen);
    for heads in [128, 16] {
        for tk in [16384, 65536] {
            v.push(Shape {
                kind: Kind::Chunk,
                heads,
                q_lens: vec![4096],
                k_lens: vec![tk],
                causal: false,
                lse: true,
            });
        }
    }
    v
}

/// One row of the peer's JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerRow {
    pub backend: String,
    pub heads: i64,
    pub tq: i64,
    pub tk: i64,
    pub causal: bool,
    pub seqlens: Option<Vec<i64>>,
    pub ms: f64,
}

/// Parses `{"peer": NAME, "rows": [{"backend","heads","tq","tk","causal","ms","tflops"
/// [,"seqlens"]}]}`; returns the peer's name ("" if absent) and the rows.
pub fn parse_peer(text: &str) -> Result<(String, Vec<PeerRow>), String> {
    peer_json::parse(text, |r| {
        // torch's script may write whole numbers as floats.
        let int = |k: &str| -> Result<i64, String> {
            r.get(k)
                .and_then(|x| x.as_i64().or_else(|| x.as_f64().map(|f| f as i64)))
                .ok_or_else(|| r.err(&format!("no integer \"{k}\"")))
        };
        let seqlens = match r.get("seqlens") {
            None | Some(serde_json::Value::Null) => None,
            Some(s) => Some(
                s.as_array()
                    .and_then(|a| a.iter().map(|x| x.as_i64()).collect::<Option<Vec<i64>>>())
                    .ok_or_else(|| r.err("\"seqlens\" is not a list of integers"))?,
            ),
        };
        Ok(PeerRow {
            backend: r.need_str("backend")?,
            heads: int("heads")?,
            tq: int("tq")?,
            tk: int("tk")?,
            causal: r
                .get("causal")
                .and_then(|c| c.as_bool().or_else(|| c.as_i64().map(|n| n != 0)))
                .ok_or_else(|| r.err("no \"causal\""))?,
            seqlens,
            ms: r.num("ms").ok_or_else(|| r.err("no number \"ms\""))?,
        })
    })
}

/// The peer `backend`'s TFLOP/s on `s`, from its time and our FLOP count.
pub fn peer_tflops(peer: &[PeerRow], s: &Shape, backend: &str) -> Option<f64> {
    let key = s.peer_key();
    peer.iter()
        .find(|r| r.backend == backend && (r.heads, r.tq, r.tk, r.causal, r.seqlens.clone()) == key)
        .filter(|r| r.ms > 0.0)
        .map(|r| s.flops() / (r.ms * 1e-3) / 1e12)
}

/// One measured shape.
#[derive(Clone, Debug)]
pub struct Measured {
    pub shape: Shape,
    pub ms: f64,
    /// Worst relative Frobenius error (NaN when not checked, infinite on a non-finite value
    /// or a wrong lse).
    pub err: f64,
    pub runs: usize,
}

impl Measured {
    pub fn tflops(&self) -> f64 {
        self.shape.flops() / (self.ms * 1e-3) / 1e12
    }
    pub fn parity(&self) -> Option<bool> {
        (!self.err.is_nan()).then_some(self.err <= TOL)
    }
}

/// The per-shape verdicts of issue 11 item 6.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub cudnn: Option<f64>,
    pub flash: Option<f64>,
    /// vt / cuDNN in TFLOP/s.
    pub ratio: Option<f64>,
    /// At or above cuDNN (single and chunked shapes with a cuDNN figure).
    pub beats_cudnn: Option<bool>,
    /// (rate ratio, what it is against, within 10%): varlen vs its same-work single
    /// sequence, 16 heads vs 128 heads on the same shape.
    pub scaling: Option<(f64, &'static str, bool)>,
}

pub fn verdict(rows: &[Measured], i: usize, peer: &[PeerRow]) -> Verdict {
    let r = &rows[i];
    let s = &r.shape;
    let cudnn = peer_tflops(peer, s, "cudnn");
    let flash = peer_tflops(peer, s, "flash");
    let ratio = cudnn.map(|c| r.tflops() / c);
    let beats_cudnn = match s.kind {
        Kind::Single | Kind::VarlenRef | Kind::Chunk => cudnn.map(|c| r.tflops() >= c),
        Kind::Varlen => None,
    };
    let base = match s.kind {
        Kind::Varlen => rows
            .iter()
            .find(|o| o.shape.kind == Kind::VarlenRef && o.shape.heads == s.heads)
            .map(|o| (o, "single")),
        _ if s.heads != 128 => rows
            .iter()
            .find(|o| {
                o.shape.heads == 128
                    && o.shape.kind == s.kind
                    && o.shape.q_lens == s.q_lens
                    && o.shape.k_lens == s.k_lens
                    && o.shape.causal == s.causal
            })
            .map(|o| (o, "h128")),
        _ => None,
    };
    let scaling = base.map(|(b, what)| {
        let x = r.tflops() / b.tflops();
        (x, what, x >= 0.9)
    });
    Verdict { cudnn, flash, ratio, beats_cudnn, scaling }
}

fn ok(b: bool) -> &'static str {
    if b {
        "ok"
    } else {
        "MISS"
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// The result table (markdown) and the targets' tally.
pub fn table(rows: &[Measured], peer: &[PeerRow], gemm_tflops: f64) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "| shape | heads | Tq | Tk | causal | lse | ms | TFLOP/s | % GEMM | cuDNN TFLOP/s | flash TFLOP/s | vt/cuDNN | >= cuDNN | scaling | parity |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let (mut met, mut missed) = (0, 0);
    for (i, r) in rows.iter().enumerate() {
        let s = &r.shape;
        let v = verdict(rows, i, peer);
        for b in v.beats_cudnn.iter().chain(v.scaling.as_ref().map(|x| &x.2)) {
            if *b {
                met += 1;
            } else {
                missed += 1;
            }
        }
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {:.3} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} |",
            s.kind.name(),
            s.heads,
            s.tq(),
            s.tk(),
            if s.causal { "yes" } else { "no" },
            if s.lse { "yes" } else { "no" },
            r.ms,
            r.tflops(),
            100.0 * r.tflops() / gemm_tflops,
            opt(v.cudnn, 0),
            opt(v.flash, 0),
            opt(v.ratio, 2),
            v.beats_cudnn.map_or("-", ok),
            v.scaling.map_or("-".into(), |(x, what, b)| format!("{x:.2} of {what} {}", ok(b))),
            match r.parity() {
                None => "-".to_string(),
                Some(p) => format!("{} {:.1e}", if p { "PASS" } else { "FAIL" }, r.err),
            },
        );
    }
    let pass = rows.iter().filter(|r| r.parity() == Some(true)).count();
    let checked = rows.iter().filter(|r| r.parity().is_some()).count();
    let _ = writeln!(
        o,
        "\ntargets (issue 11 item 6): {met} met, {missed} missed{}; parity {pass} of {checked} checked shapes PASS \
         (relative Frobenius error <= {TOL:e})",
        if peer.is_empty() { " (no --peer: the cuDNN targets are not judged)" } else { "" }
    );
    let _ = writeln!(o, "(GEMM ceiling from this run: cuBLAS bf16 8192^3 {gemm_tflops:.0} TFLOP/s)");
    o
}

pub fn to_json(rows: &[Measured], peer: &[PeerRow], gemm_tflops: f64, device: &str) -> String {
    let mut o = format!("{{\"device\": {device:?}, \"gemm_tflops\": {gemm_tflops:.1}, \"rows\": [\n");
    for (i, r) in rows.iter().enumerate() {
        let s = &r.shape;
        let v = verdict(rows, i, peer);
        let num = |x: Option<f64>| x.map_or("null".to_string(), |x| format!("{x:.3}"));
        let _ = writeln!(
            o,
            "  {{\"backend\": \"vt\", \"kind\": {:?}, \"heads\": {}, \"tq\": {}, \"tk\": {}, \"causal\": {}, \"lse\": {}, \
             \"seqlens\": {}, \"ms\": {:.4}, \"tflops\": {:.2}, \"pct_gemm\": {:.1}, \"runs\": {}, \"cudnn_tflops\": {}, \
             \"flash_tflops\": {}, \"ratio_cudnn\": {}, \"parity_err\": {}, \"parity\": {}}}{}",
            s.kind.name(),
            s.heads,
            s.tq(),
            s.tk(),
            s.causal,
            s.lse,
            if s.kind == Kind::Varlen { format!("{:?}", s.q_lens) } else { "null".into() },
            r.ms,
            r.tflops(),
            100.0 * r.tflops() / gemm_tflops,
            r.runs,
            num(v.cudnn),
            num(v.flash),
            num(v.ratio),
            if r.err.is_nan() {
                "null".to_string()
            } else if r.err.is_finite() {
                format!("{:.3e}", r.err)
            } else {
                "1e9".to_string()
            },
            r.parity().map_or("null".to_string(), |p| p.to_string()),
            if i + 1 < rows.len() { "," } else { "" }
        );
    }
    o.push_str("]}\n");
    o
}

fn chart(rows: &[Measured], peer: &[PeerRow], gemm_tflops: f64, device: &str) -> Chart {
    let pv = |b: &str| rows.iter().map(|r| peer_tflops(peer, &r.shape, b)).collect();
    Chart {
        title: format!(
            "PrefillAttention (qk 192, v 128, bf16), {device}: TFLOP/s, GEMM ceiling {gemm_tflops:.0}"
        ),
        unit: "TFLOP/s (higher is better)".into(),
        labels: rows.iter().map(|r| r.shape.label()).collect(),
        series: vec![
            Series { name: "vt".into(), values: rows.iter().map(|r| Some(r.tflops())).collect() },
            Series { name: "torch SDPA cuDNN".into(), values: pv("cudnn") },
            Series { name: "torch SDPA flash (v padded)".into(), values: pv("flash") },
        ],
    }
}

/// Query row blocks checked per sequence: (first row, rows), first / middle / last.
pub fn check_blocks(lq: i64) -> Vec<(i64, i64)> {
    let m = lq.min(4);
    if m == 0 {
        return Vec::new();
    }
    let mut v = vec![0, (lq / 2 - m / 2).clamp(0, lq - m), lq - m];
    v.dedup();
    v.into_iter().map(|a| (a, m)).collect()
}

/// Keys the rows `a .. a + m` of a sequence (lq, lk) see together: a prefix of its keys.
pub fn keys_seen(lq: i64, lk: i64, causal: bool, a: i64, m: i64) -> i64 {
    if causal {
        (lk - lq + a + m).clamp(0, lk)
    } else {
        lk
    }
}

/// Device buffers of one shape.
struct Inputs {
    q: Buffer,
    k: Buffer,
    kv_nope: Buffer,
    out: Buffer,
    lse: Option<Buffer>,
    cu_q: Buffer,
    cu_k: Buffer,
}

fn cu(lens: &[i64]) -> Vec<i32> {
    std::iter::once(0)
        .chain(lens.iter().scan(0i64, |acc, &l| Some((*acc + l) as i32).inspect(|_| *acc += l)))
        .collect()
}

fn make_inputs(q: &Queue, bench: &Bench<'_>, s: &Shape) -> vt_core::Result<Inputs> {
    let (tq, tk, h) = (s.tq(), s.tk(), s.heads);
    let qb = Buffer::uninit(q, DType::BF16, &[tq, h, DQK])?;
    let k = Buffer::uninit(q, DType::BF16, &[tk, h, DQK])?;
    let kv_nope = Buffer::uninit(q, DType::BF16, &[tk, h, KV_NOPE])?;
    bench.fill(&qb.view(), Q_SEED, 1.0)?;
    bench.fill(&k.view(), K_SEED, 1.0)?;
    bench.fill(&kv_nope.view(), V_SEED, 1.0)?;
    let cq = cu(&s.q_lens);
    let ck = cu(&s.k_lens);
    Ok(Inputs {
        q: qb,
        k,
        kv_nope,
        out: Buffer::nan(q, DType::BF16, &[tq, h, DV])?,
        lse: if s.lse { Some(Buffer::nan(q, DType::F32, &[h, tq])?) } else { None },
        cu_q: Buffer::from_slice(q, &[cq.len() as i64], &cq)?,
        cu_k: Buffer::from_slice(q, &[ck.len() as i64], &ck)?,
    })
}

fn op_args<'a>(s: &Shape, x: &'a Inputs, scale: f32) -> vt_core::Result<PrefillAttentionArgs<'a>> {
    let (tk, h) = (s.tk(), s.heads);
    Ok(PrefillAttentionArgs {
        out: x.out.view(),
        lse: x.lse.as_ref().map(|l| l.view()),
        query: x.q.view(),
        k: x.k.view(),
        // v: columns 128..256 of each head of the kv_b_proj output, as the block slices it.
        v: x.kv_nope.view().as_strided(KV_NOPE - DV, &[tk, h, DV], &[h * KV_NOPE, KV_NOPE, 1])?,
        cu_seqlens_q: x.cu_q.view(),
        cu_seqlens_k: x.cu_k.view(),
        max_seqlen_q: s.q_lens.iter().copied().max().unwrap_or(0),
        causal: s.causal,
        scale,
    })
}

/// Checks sampled heads and row blocks against the CPU reference (see the module doc);
/// returns the worst relative Frobenius error.
fn parity(gpu: &Queue, s: &Shape, x: &Inputs, scale: f32) -> vt_core::Result<f64> {
    let h = s.heads;
    let mut heads = vec![0, h / 2, h - 1];
    heads.dedup();
    let nh = heads.len() as i64;
    let b = s.q_lens.len();
    let mut seqs = vec![0, b / 2, b - 1];
    seqs.dedup();
    let (cq, ck) = (cu(&s.q_lens), cu(&s.k_lens));
    // (sequence, first row, rows, keys seen) and the GPU's values for each block.
    let mut jobs = Vec::new();
    for &bi in &seqs {
        let (lq, lk) = (s.q_lens[bi], s.k_lens[bi]);
        for (a, m) in check_blocks(lq) {
            let row0 = cq[bi] as i64 + a;
            let out = gpu.read_f64(&x.out.view().slice(0, row0, row0 + m)?)?;
            let lse = match &x.lse {
                Some(l) => Some(gpu.read_f64(&l.view().slice(1, row0, row0 + m)?)?),
                None => None,
            };
            jobs.push((row0, ck[bi] as i64, m, keys_seen(lq, lk, s.causal, a, m), out, lse));
        }
    }
    let heads = &heads;
    let results: Vec<vt_core::Result<f64>> = std::thread::scope(|sc| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(row0, key0, m, nk, got, got_lse)| {
                let (row0, key0, m, nk) = (*row0, *key0, *m, *nk);
                sc.spawn(move || -> vt_core::Result<f64> {
                    let cpu = Queue::new(Device::CPU)?;
                    let val = |seed: u64, i: i64| filled_value(DType::BF16, seed, 1.0, i as u64);
                    let mut qv = Vec::with_capacity((m * nh * DQK) as usize);
                    for t in row0..row0 + m {
                        for &hd in heads {
                            qv.extend((0..DQK).map(|e| val(Q_SEED, (t * h + hd) * DQK + e)));
                        }
                    }
                    let (mut kv, mut vv) = (Vec::new(), Vec::new());
                    for t in key0..key0 + nk {
                        for &hd in heads {
                            kv.extend((0..DQK).map(|e| val(K_SEED, (t * h + hd) * DQK + e)));
                            vv.extend(
                                (0..DV).map(|e| val(V_SEED, (t * h + hd) * KV_NOPE + (KV_NOPE - DV) + e)),
                            );
                        }
                    }
                    let qf = Buffer::from_slice(&cpu, &[m, nh, DQK], &qv)?;
                    let kf = Buffer::from_slice(&cpu, &[nk, nh, DQK], &kv)?;
                    let vf = Buffer::from_slice(&cpu, &[nk, nh, DV], &vv)?;
                    let out = Buffer::nan(&cpu, DType::F32, &[m, nh, DV])?;
                    let lse = Buffer::nan(&cpu, DType::F32, &[nh, m])?;
                    let cu_q = Buffer::from_slice(&cpu, &[2], &[0i32, m as i32])?;
                    let cu_k = Buffer::from_slice(&cpu, &[2], &[0i32, nk as i32])?;
                    vt_core::prefill_attention(
                        &cpu,
                        &PrefillAttentionArgs {
                            out: out.view(),
                            lse: Some(lse.view()),
                            query: qf.view(),
                            k: kf.view(),
                            v: vf.view(),
                            cu_seqlens_q: cu_q.view(),
                            cu_seqlens_k: cu_k.view(),
                            max_seqlen_q: m,
                            causal: s.causal,
                            scale,
                        },
                    )?;
                    let want = out.to_f64(&cpu)?;
                    let want_lse = lse.to_f64(&cpu)?;
                    let (mut num, mut den, mut ok) = (0.0f64, 0.0f64, true);
                    for t in 0..m {
                        for (hi, &hd) in heads.iter().enumerate() {
                            let g0 = ((t * h + hd) * DV) as usize;
                            let w0 = ((t * nh + hi as i64) * DV) as usize;
                            for e in 0..DV as usize {
                                let (g, w) = (got[g0 + e], want[w0 + e]);
                                ok &= g.is_finite();
                                num += (g - w) * (g - w);
                                den += w * w;
                            }
                            if let Some(gl) = got_lse {
                                // lse slice [N, m]: head hd, row t.
                                let (g, w) =
                                    (gl[(hd * m + t) as usize], want_lse[(hi as i64 * m + t) as usize]);
                                ok &= (g - w).abs() <= 1e-3 * (1.0 + w.abs());
                            }
                        }
                    }
                    Ok(if ok { (num / den.max(1e-30)).sqrt() } else { f64::INFINITY })
                })
            })
            .collect();
        handles.into_iter().map(|hd| hd.join().unwrap_or(Ok(f64::INFINITY))).collect()
    });
    let mut worst = 0.0f64;
    for r in results {
        worst = worst.max(r?);
    }
    Ok(worst)
}

pub fn run(a: Args) -> Result<ExitCode, String> {
    // The peer first: a bad file is reported before any GPU work.
    let (peer_name, peer) =
        a.peer.as_deref().map(|f| peer_json::read(f, parse_peer)).transpose()?.unwrap_or_default();
    let todo = crate::bench::select(shapes(), &a.only, |s, o| s.matches(o))?;
    let e = |e: vt_core::Error| e.to_string();
    let q = crate::bench::cuda_queue(&[OpId::PrefillAttention])?;
    let bench = Bench::new(&q, 256 << 20).map_err(e)?;
    let name = crate::bench::device_name();
    println!("device: {name}");
    let gemm = bench.gemm_bf16_flops(8192, 20).map_err(e)? / 1e12;
    println!("ceiling (this run): cuBLAS bf16 GEMM 8192^3 {gemm:.0} TFLOP/s");
    if !peer.is_empty() {
        println!("peer: {} ({} rows)", if peer_name.is_empty() { "unnamed" } else { &peer_name }, peer.len());
    }
    println!("varlen lengths: {:?}", varlen_lens());
    let scale = 1.0 / (DQK as f32).sqrt();
    let mut rows: Vec<Measured> = Vec::new();
    let bar = Progress::new(todo.len() as u64, "bench prefill");
    for s in todo {
        let label = s.label();
        bar.step(format!("{label}: inputs"));
        let x = make_inputs(&q, &bench, &s).map_err(e)?;
        let args = op_args(&s, &x, scale).map_err(e)?;
        bar.step(format!("{label}: first call"));
        vt_core::prefill_attention(&q, &args).map_err(e)?;
        q.synchronize().map_err(e)?;
        bar.step(format!("{label}: CPU reference"));
        let err = if a.no_parity { f64::NAN } else { parity(&q, &s, &x, scale).map_err(e)? };
        // One more call on the host clock sizes the timed loop (the first one compiled).
        bar.step(format!("{label}: timing"));
        let t0 = Instant::now();
        vt_core::prefill_attention(&q, &args).map_err(e)?;
        q.synchronize().map_err(e)?;
        let once = t0.elapsed().as_secs_f64();
        let runs = ((BUDGET_S / once.max(1e-6)) as usize).clamp(3, a.iters.max(3)).min(a.iters.max(1));
        let warmup = if once > 0.5 { 1 } else { 3 };
        let mut t = bench.time_us(warmup, runs, true, || vt_core::prefill_attention(&q, &args)).map_err(e)?;
        let m = Measured { shape: s, ms: median(&mut t) / 1e3, err, runs };
        let v = verdict(std::slice::from_ref(&m), 0, &peer);
        bar.println(format!(
            "{label:<44} {:>9.3} ms {:>5.0} TFLOP/s ({} runs)  cuDNN {}  flash {}  vt/cuDNN {}  parity {}",
            m.ms,
            m.tflops(),
            m.runs,
            opt(v.cudnn, 0),
            opt(v.flash, 0),
            opt(v.ratio, 2),
            match m.parity() {
                None => "not checked".to_string(),
                Some(p) => format!("{} ({:.1e})", if p { "PASS" } else { "FAIL" }, m.err),
            }
        ));
        bar.inc();
        rows.push(m);
    }
    drop(bar);
    print!("\n{}", table(&rows, &peer, gemm));
    if let Some(f) = &a.json {
        std::fs::write(f, to_json(&rows, &peer, gemm, &name))
            .map_err(|er| format!("writing {}: {er}", f.display()))?;
    }
    if let Some(f) = &a.plot {
        crate::plot::write(f, &chart(&rows, &peer, gemm, &name))?;
        println!("plot: {}", f.display());
    }
    Ok(if rows.iter().all(|r| r.parity() != Some(false)) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs_naive(lq: i64, lk: i64, causal: bool) -> i64 {
        (0..lq).map(|i| if causal { (lk - lq + i + 1).clamp(0, lk) } else { lk }).sum()
    }

    #[test]
    fn visible_pairs_match_counting() {
        for (lq, lk) in [(1, 1), (5, 5), (4, 9), (9, 4), (0, 3), (3, 0), (7, 1), (1024, 1024)] {
            for causal in [false, true] {
                assert_eq!(visible_pairs(lq, lk, causal), pairs_naive(lq, lk, causal), "{lq} {lk} {causal}");
            }
        }
        assert_eq!(visible_pairs(4096, 4096, true), 4096 * 4097 / 2);
    }

    #[test]
    fn flops_follow_the_issue_counting() {
        let s = Shape::single(128, 8192, Kind::Single);
        assert_eq!(s.flops(), 2.0 * (8192.0 * 8193.0 / 2.0) * 128.0 * 320.0);
        let c = shapes().into_iter().find(|s| s.kind == Kind::Chunk && s.tk() == 65536 && s.heads == 16);
        let c = c.expect("the 16-head chunk over 65536 keys");
        assert_eq!(c.flops(), 2.0 * 4096.0 * 65536.0 * 16.0 * 320.0);
        assert!(c.lse && !c.causal);
    }

    #[test]
    fn shape_table_is_the_issues() {
        let v = shapes();
        assert_eq!(v.iter().filter(|s| s.kind == Kind::Single).count(), 8);
        assert_eq!(v.iter().filter(|s| s.kind == Kind::Chunk).count(), 4);
        let lens = varlen_lens();
        assert_eq!(lens.len(), 16);
        assert_eq!(*lens.iter().min().unwrap_or(&0), 256);
        assert_eq!(*lens.iter().max().unwrap_or(&0), 8192);
        let mut sorted = lens.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 16, "16 distinct lengths");
        assert_ne!(sorted, lens, "mixed order");
        let varlen = v.iter().find(|s| s.kind == Kind::Varlen).expect("varlen");
        let reference = v.iter().find(|s| s.kind == Kind::VarlenRef).expect("varlen ref");
        assert_eq!(reference.tq() % 64, 0);
        let x = reference.flops() / varlen.flops();
        assert!((x - 1.0).abs() < 0.01, "same work within 1%: {x}");
    }

    #[test]
    fn same_work_len_rounds_to_64() {
        assert_eq!(same_work_len(4096 * 4097 / 2), 4096);
        assert_eq!(same_work_len(100), 0);
        assert_eq!(same_work_len(visible_pairs(8200, 8200, true)), 8192);
    }

    #[test]
    fn only_filters_and_rejects_bad_keys() {
        let v = shapes();
        let n = |spec: &str| v.iter().filter(|s| s.matches(spec)).count();
        assert_eq!(n("h16"), 6);
        assert_eq!(n("chunk,k65536"), 2);
        assert_eq!(n("h128,t4096"), 3); // single 4096, both chunks
        assert_eq!(n("varlen"), 2);
        assert!(only_spec("h128,chunk").is_ok());
        assert!(only_spec("x3").is_err());
        assert!(only_spec("h").is_err());
    }

    #[test]
    fn check_blocks_and_keys_seen() {
        assert_eq!(check_blocks(1024), vec![(0, 4), (510, 4), (1020, 4)]);
        assert_eq!(check_blocks(3), vec![(0, 3)]);
        assert!(check_blocks(0).is_empty());
        // Causal square: rows 0..4 see keys 0..4; the last block sees all.
        assert_eq!(keys_seen(1024, 1024, true, 0, 4), 4);
        assert_eq!(keys_seen(1024, 1024, true, 1020, 4), 1024);
        assert_eq!(keys_seen(4096, 65536, false, 0, 4), 65536);
        // Bottom-right with more keys than queries.
        assert_eq!(keys_seen(4, 10, true, 0, 2), 8);
    }

    #[test]
    fn cu_seqlens_are_prefix_sums() {
        assert_eq!(cu(&[3, 0, 5]), vec![0, 3, 3, 8]);
        assert_eq!(cu(&[]), vec![0]);
    }

    const PEER: &str = r#"{"peer": "torch 2.11 SDPA", "rows": [
        {"backend": "cudnn", "heads": 128, "tq": 4096, "tk": 4096, "causal": true, "ms": 2.0, "tflops": 1},
        {"backend": "flash", "heads": 128, "tq": 4096, "tk": 4096, "causal": true, "ms": 4.0, "tflops": 1},
        {"backend": "cudnn", "heads": 16, "tq": 4096, "tk": 4096, "causal": true, "ms": 0.25, "tflops": 1},
        {"backend": "cudnn", "heads": 128, "tq": 4096, "tk": 65536, "causal": false, "ms": 30.0, "tflops": 1},
        {"backend": "cudnn", "heads": 128, "tq": 67584, "tk": 67584, "causal": true, "ms": 9.0, "tflops": 1,
         "seqlens": [1, 2]}
    ]}"#;

    #[test]
    fn parses_the_peer_json() {
        let (name, rows) = parse_peer(PEER).expect("parses");
        assert_eq!(name, "torch 2.11 SDPA");
        assert_eq!(rows.len(), 5);
        assert_eq!(
            rows[3],
            PeerRow {
                backend: "cudnn".into(),
                heads: 128,
                tq: 4096,
                tk: 65536,
                causal: false,
                seqlens: None,
                ms: 30.0
            }
        );
        assert_eq!(rows[4].seqlens, Some(vec![1, 2]));
        assert!(parse_peer("{}").is_err());
        assert!(parse_peer(r#"{"rows": [{"backend": "cudnn"}]}"#).is_err());
        assert!(parse_peer("not json").is_err());
    }

    fn measured(s: Shape, tflops: f64) -> Measured {
        let ms = s.flops() / (tflops * 1e12) * 1e3;
        Measured { shape: s, ms, err: 3e-3, runs: 5 }
    }

    #[test]
    fn verdicts_and_table() {
        let (_, peer) = parse_peer(PEER).expect("parses");
        let h128 = Shape::single(128, 4096, Kind::Single);
        let cudnn = h128.flops() / 2e-3 / 1e12;
        let varlen = Shape::varlen();
        let rows = vec![
            measured(h128.clone(), cudnn * 1.05),
            measured(Shape::single(16, 4096, Kind::Single), cudnn * 0.9),
            measured(Shape::single(128, same_work_len(varlen.pairs()), Kind::VarlenRef), 500.0),
            measured(varlen, 440.0),
        ];
        let v0 = verdict(&rows, 0, &peer);
        assert_eq!(v0.beats_cudnn, Some(true));
        assert!((v0.ratio.unwrap_or(0.0) - 1.05).abs() < 1e-9);
        assert!((v0.flash.unwrap_or(0.0) - cudnn / 2.0).abs() < 1e-6);
        assert_eq!(v0.scaling, None);
        // 16 heads: 0.9 x cuDNN(h128) = 0.857 of h128, and 16-head cuDNN took 1/8 of the time.
        let v1 = verdict(&rows, 1, &peer);
        assert_eq!(v1.beats_cudnn, Some(false));
        let (x, what, ok) = v1.scaling.expect("vs h128");
        assert!((x - 0.9 / 1.05).abs() < 1e-9 && what == "h128" && !ok);
        // Varlen: no cuDNN row with these lengths; 440 / 500 = 0.88 of the single sequence.
        let v3 = verdict(&rows, 3, &peer);
        assert_eq!((v3.cudnn, v3.beats_cudnn), (None, None));
        let (x, what, ok) = v3.scaling.expect("vs single");
        assert!((x - 0.88).abs() < 1e-9 && what == "single" && !ok);
        let t = table(&rows, &peer, 800.0);
        assert!(t.contains("| single | 128 | 4096 | 4096 | yes | no |"), "{t}");
        assert!(t.contains("| 1.05 | ok | - | PASS"), "{t}");
        assert!(t.contains("0.88 of single MISS"), "{t}");
        assert!(t.contains("targets (issue 11 item 6): 1 met, 3 missed"), "{t}");
        let j = to_json(&rows, &peer, 800.0, "test GPU");
        let parsed: serde_json::Value = serde_json::from_str(&j).expect("our JSON parses");
        assert_eq!(parsed["rows"].as_array().map(|r| r.len()), Some(4));
        assert_eq!(parsed["rows"][0]["backend"], "vt");
        // Our rows read back as peer rows (the same keys).
        assert_eq!(parse_peer(&j).expect("peer format").1.len(), 4);
    }
}
