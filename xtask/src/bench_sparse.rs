//! `cargo xtask bench sparse [--peer FILE] [--json FILE] [--iters N] [--only SPEC]...
//! [--no-parity]`: SparseMlaAttention (DeepSeek-V3.2's sparse MLA) on the first CUDA device, on
//! FlashMLA's sparse benchmark shapes (`tests/test_flash_mla_sparse_{decoding,prefill}.py` of
//! FlashMLA 9241ae3).
//!
//! - Decode rows: the fp8_ds_mla cache (656 bytes a token), block size 64, `b` sequences of
//!   `s_kv` tokens (pages scattered by a random permutation), `s_q` = 2 query tokens each
//!   (T = b s_q), h_q heads, topk indices per query token: distinct random positions of its
//!   sequence, as cache slots. FlashMLA's V3.2 rows (h_q 128, s_kv 32768, topk 2048, b 2 / 64 /
//!   74 / 128), the same at h_q 64, and its peak rows (b 148, topk 16384). FlashMLA draws
//!   per-sequence lengths around s_kv (`is_varlen`); here every sequence has s_kv tokens, in
//!   this bench and in the peer script alike.
//! - Prefill rows: FlashMLA's sparse prefill takes a bf16 kv `[s_kv, 1, 576]` indexed
//!   directly, here a bf16 cache of block size 1; s_q = 4096 query tokens, h_q 128, topk 2048
//!   distinct random tokens of s_kv in {8192, 32768, 65536, 98304, 131072}.
//! - Counting (FlashMLA's `lib.py`): FLOPs = 2 T h_q topk (576 + 512); decode bytes =
//!   2 T h_q (576 + 512) + unique slots x 656; prefill bytes = valid indices x 576 x 2 +
//!   2 T h_q (576 + 512). Ceilings measured in the same run (device copy, cuBLAS bf16 GEMM
//!   8192^3); floor = max(bytes / copy, FLOPs / GEMM).
//! - Timing: CUDA events, the L2 flushed before each call, median of `--iters` after warm-up.
//! - Parity: before timing, three query tokens x up to four heads of each shape are checked
//!   against the CPU reference (vt-cpu) on the rows they list (NaN-poisoned outputs).
//! - `--peer FILE`: the JSON `tools/peers/flashmla_sparse.py --json FILE` writes in the same
//!   device call: `{"peer": NAME, "rows": [{"kind": "decode"|"prefill", "h_q", "b", "s_q",
//!   "s_kv", "topk", "us", "tflops", "gbps"}]}` (prefill rows have b = 1). Rows match by
//!   (kind, h_q, b, s_q, s_kv, topk); FlashMLA's time and vt / FlashMLA come only from that
//!   file, else print `-` (no peer in this call).
//! - `--kv16`: the decode shapes again over a bf16 cache of block size 64 (rows `decode16`,
//!   no peer: FlashMLA's sparse decode reads the fp8 cache only), for what the cache format
//!   costs on each kernel.
//! - `--only decode`, `--only prefill,s32768`, `--only h64,b74` (keys decode, decode16,
//!   prefill, hN, bN, sN = s_kv, kN = topk; every key of one SPEC must match; repeatable).
//! - Target (issue 19): vt / FlashMLA <= 1.00 on every row with a peer figure.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use vt_core::{Buffer, DType, Device, Queue, SparseMlaAttentionArgs};
use vt_cuda::bench::{filled_value, median, Bench};
use vt_cuda::mla_decode_attention::Kernel as DK;
use vt_cuda::sparse_mla_attention::{sparse_mla_attention_with, Kernel, SparseOptions};

use crate::bench::{ceilings, cuda_queue, device_name, fp8_ds_mla_rows, mix, positive, shuffle};
use crate::peer_json;
use crate::progress::Progress;

/// `cargo xtask bench sparse` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write the rows (and this run's ceilings) as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// FlashMLA's times: the JSON of tools/peers/flashmla_sparse.py --json FILE, same device call.
    #[arg(long, value_name = "FILE")]
    pub peer: Option<PathBuf>,
    /// Timed runs per shape (median reported).
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = positive)]
    pub iters: usize,
    /// Also time these kernels per shape, forced (decode kernels `mma`, `mma_small`, `wgmma`,
    /// `wgmma_narrow`, `wgmma_3wg` and `wgmma_fp8r` (the three-warpgroup kernels' gather forms, over
    /// the bf16 and the fp8 cache), `wgmma_fp8x2` (the fp8 kernel as CTA pairs, 128 heads), `generic`;
    /// `sparse_prefill` = this op's prefill kernel (16-bit cache, 64+ heads), `sparse_generic` =
    /// this op's own generic kernel), each beside
    /// a fresh time of the default so drift does not bias the A/B.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = alt_name)]
    pub alt: Vec<String>,
    /// Skip the CPU check before timing (for profiler runs).
    #[arg(long)]
    pub no_parity: bool,
    /// Also run the decode shapes over a bf16 cache (rows `decode16`; no peer).
    #[arg(long)]
    pub kv16: bool,
    /// Keep shapes matching every key given (decode, decode16, prefill, hN, bN, sN = s_kv, kN = topk),
    /// e.g. `decode,h128,b74`; repeatable.
    #[arg(long, value_name = "SPEC", value_parser = only_spec)]
    pub only: Vec<String>,
}

fn alt_of(s: &str) -> Option<Kernel> {
    Some(match s {
        "mma" => Kernel::Decode(DK::Mma),
        "mma_small" => Kernel::Decode(DK::MmaSmall),
        "wgmma" => Kernel::Decode(DK::Wgmma),
        "wgmma_narrow" => Kernel::Decode(DK::WgmmaNarrow),
        "wgmma_3wg" => Kernel::Decode(DK::Wgmma3),
        "wgmma_fp8r" => Kernel::Decode(DK::WgmmaFp8Raw),
        "wgmma_fp8x2" => Kernel::Decode(DK::WgmmaFp8Pair),
        "generic" => Kernel::Decode(DK::Generic),
        "sparse_generic" => Kernel::Generic,
        "sparse_prefill" => Kernel::Prefill,
        _ => return None,
    })
}

fn alt_name(s: &str) -> Result<String, String> {
    alt_of(s).map(|_| s.to_string()).ok_or_else(|| {
        format!(
            "`{s}` is not one of mma, mma_small, wgmma, wgmma_narrow, wgmma_3wg, wgmma_fp8r, wgmma_fp8x2, generic, sparse_generic, sparse_prefill"
        )
    })
}

fn only_spec(s: &str) -> Result<String, String> {
    for kv in s.split(',') {
        if kv == "decode" || kv == "decode16" || kv == "prefill" {
            continue;
        }
        let i = kv.find(|c: char| c.is_ascii_digit()).unwrap_or(kv.len());
        let (k, v) = kv.split_at(i);
        if !matches!(k, "h" | "b" | "s" | "k") || v.parse::<i64>().is_err() {
            return Err(format!(
                "`{kv}` is not one of decode, decode16, prefill, hN, bN, sN (s_kv), kN (topk)"
            ));
        }
    }
    Ok(s.to_string())
}

const D: i64 = 576;
const DV: i64 = 512;
const ROW8: i64 = vt_core::fp8_ds_mla::ROW_BYTES as i64;
const Q_SEED: u64 = 21;
const KV_SEED: u64 = 22;
/// Block size of the decode rows' fp8 cache (FlashMLA's test default).
const DECODE_BS: i64 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Decode,
    /// The decode shapes over a bf16 cache (block size 64; `--kv16`): no peer (FlashMLA's
    /// sparse decode reads the fp8 cache only), for what the cache format costs.
    Decode16,
    Prefill,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Decode => "decode",
            Kind::Decode16 => "decode16",
            Kind::Prefill => "prefill",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    kind: Kind,
    h: i64,
    /// Sequences (decode); 1 for prefill.
    b: i64,
    /// Query tokens per sequence.
    s_q: i64,
    s_kv: i64,
    topk: i64,
}

impl Shape {
    fn tokens(&self) -> i64 {
        self.b * self.s_q
    }
    fn flops(&self) -> f64 {
        2.0 * (self.tokens() * self.h * self.topk) as f64 * (D + DV) as f64
    }
    /// FlashMLA's bytes with `kv_rows` = unique slots (decode) or valid indices (prefill).
    fn bytes(&self, kv_rows: i64) -> f64 {
        let kv = match self.kind {
            Kind::Decode => kv_rows as f64 * ROW8 as f64,
            Kind::Decode16 | Kind::Prefill => kv_rows as f64 * (2 * D) as f64,
        };
        kv + 2.0 * (self.tokens() * self.h) as f64 * (D + DV) as f64
    }
    fn matches(&self, spec: &str) -> bool {
        spec.split(',').all(|kv| {
            if kv == "decode" || kv == "decode16" || kv == "prefill" {
                return kv == self.kind.name();
            }
            let (k, v) = kv.split_at(kv.find(|c: char| c.is_ascii_digit()).unwrap_or(kv.len()));
            let v: i64 = v.parse().unwrap_or(-1);
            match k {
                "h" => self.h == v,
                "b" => self.b == v,
                "s" => self.s_kv == v,
                "k" => self.topk == v,
                _ => false,
            }
        })
    }
    fn label(&self) -> String {
        match self.kind {
            Kind::Decode => {
                format!("decode h{} b{} sq{} s{} k{} fp8", self.h, self.b, self.s_q, self.s_kv, self.topk)
            }
            Kind::Decode16 => {
                format!("decode h{} b{} sq{} s{} k{} bf16", self.h, self.b, self.s_q, self.s_kv, self.topk)
            }
            Kind::Prefill => format!("prefill h{} sq{} s{} k{} bf16", self.h, self.s_q, self.s_kv, self.topk),
        }
    }
    fn key(&self) -> (Kind, i64, i64, i64, i64, i64) {
        (self.kind, self.h, self.b, self.s_q, self.s_kv, self.topk)
    }
}

fn shapes() -> Vec<Shape> {
    let mut v = Vec::new();
    for h in [128, 64] {
        for b in [2, 64, 74, 128] {
            v.push(Shape { kind: Kind::Decode, h, b, s_q: 2, s_kv: 32768, topk: 2048 });
        }
    }
    for h in [64, 128] {
        v.push(Shape { kind: Kind::Decode, h, b: 148, s_q: 2, s_kv: 32768, topk: 16384 });
    }
    for s_kv in [8192, 32768, 65536, 98304, 131072] {
        v.push(Shape { kind: Kind::Prefill, h: 128, b: 1, s_q: 4096, s_kv, topk: 2048 });
    }
    v
}

#[derive(Clone, Debug, PartialEq)]
struct PeerRow {
    shape: Shape,
    us: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Peer {
    name: String,
    rows: Vec<PeerRow>,
}

/// Parses the peer JSON (module docs); every row needs its six keys and a positive finite
/// `us`; two rows of one shape are an error.
fn parse_peer(text: &str) -> Result<Peer, String> {
    let (name, rows) = peer_json::parse(text, |r| {
        let kind = match r.str("kind") {
            Some("decode") => Kind::Decode,
            Some("prefill") => Kind::Prefill,
            _ => return Err(r.err("\"kind\" must be \"decode\" or \"prefill\"")),
        };
        let shape = Shape {
            kind,
            h: r.pos_int("h_q")?,
            b: r.pos_int("b")?,
            s_q: r.pos_int("s_q")?,
            s_kv: r.pos_int("s_kv")?,
            topk: r.pos_int("topk")?,
        };
        Ok(PeerRow { shape, us: r.need_pos_num("us")? })
    })?;
    peer_json::no_repeats(&rows, |r| r.shape, |s| s.label())?;
    Ok(Peer { name, rows })
}

impl Peer {
    fn us(&self, s: &Shape) -> Option<f64> {
        self.rows.iter().find(|r| r.shape.key() == s.key()).map(|r| r.us)
    }
}

struct Row {
    shape: Shape,
    kernel: String,
    us: f64,
    /// Unique slots (decode) or valid indices (prefill), for the byte count.
    kv_rows: i64,
    err: f64,
    flash_us: Option<f64>,
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        self.flash_us.map(|f| self.us / f)
    }
}

/// `k` distinct positions of `0..n` per row (k <= n), `rows` rows, on all cores.
fn distinct_rows(rows: i64, n: i64, k: i64, seed: u64) -> Vec<i32> {
    let mut out = vec![0i32; (rows * k) as usize];
    let threads = std::thread::available_parallelism().map_or(4, |t| t.get());
    let per = (rows as usize).div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        for (ci, chunk) in out.chunks_mut(per * k as usize).enumerate() {
            sc.spawn(move || {
                let mut seen = vec![false; n as usize];
                for (ri, row) in chunk.chunks_mut(k as usize).enumerate() {
                    let mut st = seed ^ ((ci * per + ri) as u64) << 20;
                    for v in row.iter_mut() {
                        loop {
                            let p = (mix(&mut st) % n as u64) as usize;
                            if !seen[p] {
                                seen[p] = true;
                                *v = p as i32;
                                break;
                            }
                        }
                    }
                    row.iter().for_each(|&p| seen[p as usize] = false);
                }
            });
        }
    });
    out
}

/// Host inputs of one shape: the indices, the cache slots' host twin.
struct Inputs {
    q: Buffer,
    cache: Buffer,
    indices: Buffer,
    out: Buffer,
    lse: Buffer,
    idx: Vec<i32>,
    kv_rows: i64,
    /// The fp8 cache's bytes (decode rows).
    fp8: Option<std::sync::Arc<Vec<u8>>>,
}

fn make_inputs(
    q: &Queue,
    bench: &Bench<'_>,
    s: &Shape,
    fp8: &mut Option<(std::sync::Arc<Vec<u8>>, Buffer)>,
) -> vt_core::Result<Inputs> {
    let t = s.tokens();
    let qb = Buffer::uninit(q, DType::BF16, &[t, s.h, D])?;
    bench.fill(&qb.view(), Q_SEED, 1.0)?;
    let pos = distinct_rows(t, s.s_kv, s.topk, 0x5eed ^ (s.s_kv as u64) << 8 ^ s.b as u64);
    let (idx, cache, bytes) = match s.kind {
        Kind::Decode | Kind::Decode16 => {
            // Sequence i's blocks: a random permutation of all b * s_kv / 64 blocks.
            let per_seq = s.s_kv / DECODE_BS;
            let nb = s.b * per_seq;
            let mut ids: Vec<i64> = (0..nb).collect();
            shuffle(&mut ids, 0xb10c_u64 ^ s.b as u64);
            let idx: Vec<i32> = pos
                .iter()
                .enumerate()
                .map(|(i, &p)| {
                    let seq = i as i64 / (s.s_q * s.topk);
                    let blk = ids[(seq * per_seq + p as i64 / DECODE_BS) as usize];
                    (blk * DECODE_BS + p as i64 % DECODE_BS) as i32
                })
                .collect();
            let need = nb * DECODE_BS;
            if s.kind == Kind::Decode16 {
                let cache = Buffer::uninit(q, DType::BF16, &[nb, DECODE_BS, D])?;
                bench.fill(&cache.view(), KV_SEED, 0.1)?;
                return finish(q, s, qb, idx, Some(cache), None);
            }
            if fp8.as_ref().is_none_or(|(b, _)| (b.len() as i64) < need * ROW8) {
                // One cache for all the decode shapes (the largest b x s_kv).
                let rows = shapes().iter().filter(|x| x.kind == Kind::Decode).map(|x| x.b * x.s_kv).max();
                let bytes =
                    std::sync::Arc::new(fp8_ds_mla_rows(rows.unwrap_or(need).max(need), KV_SEED, 0.1));
                let n = bytes.len() as i64 / ROW8;
                let buf = Buffer::from_bytes(q, DType::Fp8DsMla, &[n / DECODE_BS, DECODE_BS, ROW8], &bytes)?;
                *fp8 = Some((bytes, buf));
            }
            let bytes = fp8.as_ref().map(|(b, _)| b.clone());
            (idx, None, bytes)
        }
        Kind::Prefill => {
            let cache = Buffer::uninit(q, DType::BF16, &[s.s_kv, 1, D])?;
            bench.fill(&cache.view(), KV_SEED, 0.1)?;
            (pos, Some(cache), None)
        }
    };
    finish(q, s, qb, idx, cache, bytes)
}

fn finish(
    q: &Queue,
    s: &Shape,
    qb: Buffer,
    idx: Vec<i32>,
    cache: Option<Buffer>,
    bytes: Option<std::sync::Arc<Vec<u8>>>,
) -> vt_core::Result<Inputs> {
    let t = s.tokens();
    let kv_rows = match s.kind {
        Kind::Decode | Kind::Decode16 => {
            let mut u = idx.clone();
            u.sort_unstable();
            u.dedup();
            u.len() as i64
        }
        Kind::Prefill => idx.len() as i64,
    };
    let cache = match cache {
        Some(c) => c,
        // The decode rows read the shared fp8 cache; a 1-element placeholder keeps Inputs
        // uniform (args() takes the shared buffer's view instead).
        None => Buffer::uninit(q, DType::BF16, &[1])?,
    };
    Ok(Inputs {
        q: qb,
        cache,
        indices: Buffer::from_slice(q, &[t, s.topk], &idx)?,
        out: Buffer::nan(q, DType::BF16, &[t, s.h, DV])?,
        lse: Buffer::nan(q, DType::F32, &[s.h, t])?,
        idx,
        kv_rows,
        fp8: bytes,
    })
}

fn args<'a>(
    s: &Shape,
    x: &'a Inputs,
    fp8: &'a Option<(std::sync::Arc<Vec<u8>>, Buffer)>,
    scale: f32,
) -> vt_core::Result<SparseMlaAttentionArgs<'a>> {
    let cache = match (s.kind, fp8) {
        (Kind::Decode, Some((_, buf))) => buf.view().slice(0, 0, s.b * s.s_kv / DECODE_BS)?,
        (Kind::Decode, None) => return Err(vt_core::Error::backend("bench", "no fp8 cache")),
        (Kind::Decode16 | Kind::Prefill, _) => x.cache.view(),
    };
    Ok(SparseMlaAttentionArgs {
        out: x.out.view(),
        lse: Some(x.lse.view()),
        query: x.q.view(),
        cache,
        indices: x.indices.view(),
        scale,
    })
}

/// Tokens {0, T/2, T-1} x up to four heads against the CPU reference, on a small cache of
/// the rows each token lists. Returns the worst relative Frobenius error of out (infinite
/// if a value is not finite or an lse disagrees).
fn parity(gpu: &Queue, s: &Shape, x: &Inputs, scale: f32) -> vt_core::Result<f64> {
    let t = s.tokens();
    let mut toks = vec![0, t / 2, t - 1];
    toks.dedup();
    let mut heads = vec![0, 1, s.h / 2, s.h - 1];
    heads.sort_unstable();
    heads.dedup();
    let got = gpu.read_f64(&x.out.view())?;
    let got_lse = gpu.read_f64(&x.lse.view())?;
    let nh = heads.len() as i64;
    let k = s.topk;
    let mut worst = 0.0f64;
    let cpu = Queue::new(Device::CPU)?;
    for &ti in &toks {
        let mut qv = Vec::with_capacity((nh * D) as usize);
        for &h in &heads {
            let base = ((ti * s.h + h) * D) as u64;
            qv.extend((0..D as u64).map(|e| filled_value(DType::BF16, Q_SEED, 1.0, base + e) as f64));
        }
        let slots = &x.idx[(ti * k) as usize..((ti + 1) * k) as usize];
        let local: Vec<i32> = (0..k as i32).collect();
        let cache = match &x.fp8 {
            Some(bytes) => {
                let mut rows = Vec::with_capacity((k * ROW8) as usize);
                for &sl in slots {
                    let at = (sl as i64 * ROW8) as usize;
                    rows.extend_from_slice(&bytes[at..at + ROW8 as usize]);
                }
                Buffer::from_bytes(&cpu, DType::Fp8DsMla, &[k, 1, ROW8], &rows)?
            }
            None => {
                let mut kv = Vec::with_capacity((k * D) as usize);
                for &sl in slots {
                    let base = (sl as i64 * D) as u64;
                    kv.extend(
                        (0..D as u64).map(|e| filled_value(DType::BF16, KV_SEED, 0.1, base + e) as f64),
                    );
                }
                Buffer::from_f64(&cpu, DType::F32, &[k, 1, D], &kv)?
            }
        };
        let qf = Buffer::from_f64(&cpu, DType::F32, &[1, nh, D], &qv)?;
        let ib = Buffer::from_slice(&cpu, &[1, k], &local)?;
        let out = Buffer::nan(&cpu, DType::F32, &[1, nh, DV])?;
        let lse = Buffer::nan(&cpu, DType::F32, &[nh, 1])?;
        vt_core::sparse_mla_attention(
            &cpu,
            &SparseMlaAttentionArgs {
                out: out.view(),
                lse: Some(lse.view()),
                query: qf.view(),
                cache: cache.view(),
                indices: ib.view(),
                scale,
            },
        )?;
        let want = out.to_f64(&cpu)?;
        let want_lse = lse.to_f64(&cpu)?;
        let (mut num, mut den, mut ok) = (0.0f64, 0.0f64, true);
        for (hi, &h) in heads.iter().enumerate() {
            for e in 0..DV as usize {
                let g = got[((ti * s.h + h) * DV) as usize + e];
                let w = want[hi * DV as usize + e];
                ok &= g.is_finite();
                num += (g - w) * (g - w);
                den += w * w;
            }
            let (gl, wl) = (got_lse[(h * t + ti) as usize], want_lse[hi]);
            ok &= (gl - wl).abs() <= 2e-3 * (1.0 + wl.abs());
        }
        worst = worst.max(if ok { (num / den.max(1e-30)).sqrt() } else { f64::INFINITY });
    }
    Ok(worst)
}

pub fn run(a: Args) -> Result<ExitCode, String> {
    let Args { json, peer, iters, alt, no_parity, kv16, only } = a;
    let peer = peer.as_deref().map(|f| peer_json::read(f, parse_peer)).transpose()?;
    let mut all = shapes();
    if kv16 {
        let dec: Vec<Shape> = all.iter().filter(|s| s.kind == Kind::Decode).copied().collect();
        all.extend(dec.into_iter().map(|s| Shape { kind: Kind::Decode16, ..s }));
    }
    let todo = crate::bench::select(all, &only, |s, o| s.matches(o))?;
    let q = cuda_queue(&[vt_core::OpId::SparseMlaAttention])?;
    let e = |e: vt_core::Error| e.to_string();
    let bench = Bench::new(&q, 256 << 20).map_err(e)?;
    let device = device_name();
    println!("device: {device}");
    let (bw, gemm) = ceilings(&bench)?;
    match &peer {
        Some(p) => println!("peer: {} ({} rows, this call's file)", p.name, p.rows.len()),
        None => println!("peer: none (no --peer FILE): FlashMLA columns print -, no peer in this call"),
    }
    let scale = 1.0 / (D as f32).sqrt();
    let bar = Progress::new(todo.len() as u64, "bench sparse");
    let mut fp8 = None;
    let mut rows = Vec::new();
    let mut failed = false;
    for s in todo {
        bar.step(format!("{}: inputs", s.label()));
        let x = make_inputs(&q, &bench, &s, &mut fp8).map_err(e)?;
        let a = args(&s, &x, &fp8, scale).map_err(e)?;
        let plan = sparse_mla_attention_with(&q, &a, &SparseOptions::default()).map_err(e)?;
        let kernel = match &plan.decode {
            Some(d) => format!("{} x{} p{}", plan.kernel, d.row_blocks, d.parts),
            None => plan.kernel.to_string(),
        };
        bar.step(format!("{}: CPU reference", s.label()));
        let err = if no_parity { f64::NAN } else { parity(&q, &s, &x, scale).map_err(e)? };
        failed |= !no_parity && (err.is_nan() || err >= 1e-2);
        bar.step(format!("{}: timing", s.label()));
        let mut t = bench
            .time_us(3, iters, true, || {
                sparse_mla_attention_with(&q, &a, &SparseOptions::default()).map(|_| ())
            })
            .map_err(e)?;
        let us = median(&mut t);
        let mut alts = Vec::new();
        for name in &alt {
            let Some(kernel) = alt_of(name) else { continue };
            let o = SparseOptions { kernel, ..SparseOptions::default() };
            let time = |o: &SparseOptions| -> vt_core::Result<f64> {
                let mut t =
                    bench.time_us(2, iters, true, || sparse_mla_attention_with(&q, &a, o).map(|_| ()))?;
                Ok(median(&mut t))
            };
            match time(&o).and_then(|t1| Ok((t1, time(&SparseOptions::default())?))) {
                Ok((t1, t2)) => alts.push(format!("{name} {t1:.1} us (default again {t2:.1})")),
                Err(err) => alts.push(format!("{name}: {err}")),
            }
        }
        let row = Row {
            shape: s,
            kernel,
            us,
            kv_rows: x.kv_rows,
            err,
            flash_us: peer.as_ref().and_then(|p| p.us(&s)),
        };
        bar.println(format_row(&row, bw, gemm));
        if !alts.is_empty() {
            bar.println(format!("    forced: {}", alts.join("; ")));
        }
        bar.inc();
        rows.push(row);
    }
    drop(bar);
    print!("{}", summarize(&rows, peer.is_some()));
    if let Some(f) = json {
        std::fs::write(&f, to_json(&rows, peer.as_ref(), bw, gemm, &device))
            .map_err(|er| format!("writing {}: {er}", f.display()))?;
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn floor_us(r: &Row, bw: f64, gemm: f64) -> f64 {
    (r.shape.bytes(r.kv_rows) / bw).max(r.shape.flops() / gemm) * 1e6
}

fn num(x: Option<f64>, prec: usize) -> String {
    x.map_or("-".to_string(), |v| format!("{v:.prec$}"))
}

fn format_row(r: &Row, bw: f64, gemm: f64) -> String {
    let s = &r.shape;
    format!(
        "{:<36} {:<20} {:>9.1} us {:>6.0} TFLOP/s {:>6.0} GB/s {:>5.1}% of floor  FlashMLA {:>9} us  vt/FlashMLA {:>6}  err {:.1e}",
        s.label(),
        r.kernel,
        r.us,
        s.flops() / r.us / 1e6,
        s.bytes(r.kv_rows) / r.us / 1e3,
        100.0 * floor_us(r, bw, gemm) / r.us,
        num(r.flash_us, 1),
        num(r.ratio(), 3),
        r.err
    )
}

fn summarize(rows: &[Row], have_peer: bool) -> String {
    let mut out = String::from("\ntargets (issue 19: vt / FlashMLA <= 1.00):\n");
    for r in rows {
        let line = match r.ratio() {
            Some(x) => format!("{}: {x:.3}: {}", r.shape.label(), if x <= 1.0 { "ok" } else { "MISS" }),
            None => format!(
                "{}: not judged, {}",
                r.shape.label(),
                if have_peer { "not in the peer file" } else { "no peer in this call" }
            ),
        };
        let _ = writeln!(out, "  {line}");
    }
    out
}

fn to_json(rows: &[Row], peer: Option<&Peer>, bw: f64, gemm: f64, device: &str) -> String {
    let list: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let s = &r.shape;
            serde_json::json!({
                "kind": s.kind.name(), "h_q": s.h, "b": s.b, "s_q": s.s_q, "s_kv": s.s_kv, "topk": s.topk,
                "kernel": r.kernel, "us": r.us, "tflops": s.flops() / r.us / 1e6,
                "gbps": s.bytes(r.kv_rows) / r.us / 1e3, "floor_us": floor_us(r, bw, gemm),
                "flashmla_us": r.flash_us, "ratio": r.ratio(), "parity_err": r.err.is_finite().then_some(r.err),
            })
        })
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({
        "device": device, "copy_gbps": bw / 1e9, "gemm_tflops": gemm / 1e12,
        "peer": peer.map(|p| p.name.clone()), "rows": list,
    }))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shapes_are_flashmlas_sparse_benchmark_rows() {
        let v = shapes();
        let dec: Vec<_> = v.iter().filter(|s| s.kind == Kind::Decode).collect();
        assert_eq!(dec.len(), 10);
        assert!(dec.iter().all(|s| s.s_q == 2 && s.s_kv == 32768));
        assert!(dec.iter().any(|s| (s.h, s.b, s.topk) == (128, 74, 2048)));
        assert!(dec.iter().any(|s| (s.h, s.b, s.topk) == (64, 148, 16384)));
        let pre: Vec<_> = v.iter().filter(|s| s.kind == Kind::Prefill).collect();
        assert_eq!(pre.len(), 5);
        assert!(pre.iter().all(|s| (s.h, s.b, s.s_q, s.topk) == (128, 1, 4096, 2048)));
        // No duplicate shapes: peer rows match one row each.
        for (i, a) in v.iter().enumerate() {
            assert!(v[i + 1..].iter().all(|b| b.key() != a.key()));
        }
    }

    #[test]
    fn counts_flops_and_bytes_as_flashmla_does() {
        let s = Shape { kind: Kind::Decode, h: 128, b: 2, s_q: 2, s_kv: 32768, topk: 2048 };
        assert_eq!(s.flops(), 2.0 * 4.0 * 128.0 * 2048.0 * 1088.0);
        assert_eq!(s.bytes(1000), 1000.0 * 656.0 + 2.0 * 4.0 * 128.0 * 1088.0);
        let p = Shape { kind: Kind::Prefill, h: 128, b: 1, s_q: 4096, s_kv: 8192, topk: 2048 };
        assert_eq!(p.bytes(10), 10.0 * 1152.0 + 2.0 * 4096.0 * 128.0 * 1088.0);
    }

    #[test]
    fn parses_the_peer_json_and_matches_rows() {
        let text = r#"{"peer": "FlashMLA", "rows": [
            {"kind": "decode", "h_q": 128, "b": 74, "s_q": 2, "s_kv": 32768, "topk": 2048, "us": 300.5, "tflops": 1, "gbps": 2},
            {"kind": "prefill", "h_q": 128, "b": 1, "s_q": 4096, "s_kv": 8192, "topk": 2048, "us": 4000}]}"#;
        let p = parse_peer(text).expect("parses");
        assert_eq!(p.name, "FlashMLA");
        let v = shapes();
        let d = v.iter().find(|s| s.kind == Kind::Decode && s.h == 128 && s.b == 74).expect("row");
        assert_eq!(p.us(d), Some(300.5));
        let d64 = v.iter().find(|s| s.kind == Kind::Decode && s.h == 64 && s.b == 74).expect("row");
        assert_eq!(p.us(d64), None);
        let pre = v.iter().find(|s| s.kind == Kind::Prefill && s.s_kv == 8192).expect("row");
        assert_eq!(p.us(pre), Some(4000.0));
    }

    #[test]
    fn rejects_bad_peer_json() {
        for bad in [
            "[]",
            r#"{"rows": [{"kind": "decode", "h_q": 128, "b": 2, "s_q": 2, "s_kv": 32768, "us": 1}]}"#,
            r#"{"rows": [{"kind": "dense", "h_q": 128, "b": 2, "s_q": 2, "s_kv": 32768, "topk": 2048, "us": 1}]}"#,
            r#"{"rows": [{"kind": "decode", "h_q": 128, "b": 2, "s_q": 2, "s_kv": 32768, "topk": 2048, "us": 0}]}"#,
            r#"{"rows": [{"kind": "decode", "h_q": 128, "b": 2, "s_q": 2, "s_kv": 32768, "topk": 2048, "us": 1},
                         {"kind": "decode", "h_q": 128, "b": 2, "s_q": 2, "s_kv": 32768, "topk": 2048, "us": 2}]}"#,
        ] {
            assert!(parse_peer(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_specs_select_shapes() {
        let v = shapes();
        let pick = |spec: &str| v.iter().filter(|s| s.matches(spec)).count();
        assert_eq!(pick("decode"), 10);
        assert_eq!(pick("prefill"), 5);
        assert_eq!(pick("prefill,s32768"), 1);
        assert_eq!(pick("decode,h64,b74"), 1);
        assert_eq!(pick("k16384"), 2);
        assert_eq!(pick("decode16"), 0, "bf16-cache decode rows only with --kv16");
        assert!(only_spec("decode,h64").is_ok());
        assert!(only_spec("x3").is_err());
        assert!(
            alt_name("wgmma").is_ok() && alt_name("wgmma_3wg").is_ok() && alt_name("sparse_generic").is_ok()
        );
        assert!(alt_name("tma").is_err());
    }

    #[test]
    fn index_rows_are_distinct_and_in_range() {
        let v = distinct_rows(5, 300, 200, 9);
        for row in v.chunks(200) {
            let mut r = row.to_vec();
            r.sort_unstable();
            r.dedup();
            assert_eq!(r.len(), 200);
            assert!(r.iter().all(|&p| (0..300).contains(&p)));
        }
    }

    #[test]
    fn without_a_peer_nothing_is_compared() {
        let s = shapes()[0];
        let r = Row { shape: s, kernel: "k".into(), us: 10.0, kv_rows: 5, err: 0.0, flash_us: None };
        assert_eq!(r.ratio(), None);
        assert!(summarize(&[r], false).contains("no peer in this call"));
    }
}
