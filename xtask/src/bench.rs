//! `cargo xtask bench decode [--peer FILE] [--json FILE] [--plot FILE] [--sweep] [--iters N]
//! [--only SPEC]... [--no-parity]`: MlaDecodeAttention on the first CUDA device, on FlashMLA's
//! benchmark shapes (the 14 s_q = 1 shapes of ../shared/ANCHORS.md and two s_q = 2 shapes).
//!
//! - Shapes: s_q = 1, one KV head, D = 576, Dv = 512, bf16, paged cache of block size 64
//!   unless a row says otherwise, sequence i of a batch has `seqlen + 2 i` tokens, pages
//!   scattered by a random permutation. Extra rows: block sizes 1/16/64 and s_q = 2.
//! - Counting (FlashMLA's): FLOPs = 2 s_q total_kv h_q (d + dv);
//!   bytes = 2 (total_kv d + b s_q h_q d + b s_q h_q dv).
//! - Ceilings measured in the same run: device-to-device copy (bytes read + written) and a
//!   cuBLAS bf16 GEMM 8192^3 on random data. floor = max(bytes / copy, FLOPs / GEMM).
//! - Timing: CUDA events around each call, the L2 flushed before each (256 MB written, as
//!   FlashMLA's `do_bench` does; `--clean-flush`: read, so the timed call has no dirty lines
//!   to write back), median of `--iters` (default 40) after warm-up. A `--peer` file must
//!   have been timed with the same flush (its `l2_flush`, absent = "write").
//! - Parity: before timing, each shape's output (NaN-poisoned) is checked against the CPU
//!   reference (vt-cpu) on three sequences (first, middle, last) and up to four heads.
//! - `--sweep` also times every kernel / minimum-tiles-per-part variant per shape; `--alt
//!   LIST` forced kernels and `--parts LIST` part counts, each between two default runs;
//!   `--only h128,b1,s8192` (repeatable) keeps matching shapes; `--no-parity` skips the
//!   CPU check (for profiler runs); `--plot FILE` (.svg or .png) draws time per shape, ours
//!   beside FlashMLA's (from `--peer`) and the floor.
//! - `--peer FILE`: the JSON of `tools/peers/flashmla_decode.py --json FILE`
//!   (`{"peer", "rows": [{"h_q","b","seqlen","s_q","us","gbps","tflops"}]}`), written in the
//!   same device call (`tools/device/decode_bench.sh` runs both). Rows match our block-size-64
//!   shapes by (h_q, b, seqlen, s_q); FlashMLA's time and the ratio vt / FlashMLA come only
//!   from that file. Without it those columns print `-` ("no peer in this call"): no peer
//!   figure is ever built in or copied from elsewhere.
//! - Targets (issue 13, item 2), listed ok / MISS after the table: ratio <= 1.00 at every
//!   shape with a peer row; >= 90% of the copy floor (bytes / copy ceiling) at 16 and 32 heads
//!   with b >= 64 (block size 64); b = 1, 8192 tokens <= 12 us at 16 and 128 heads; block
//!   sizes 1 and 16 within 10% of 64 at 16 and 128 heads; s_q = 2 within 10% of s_q = 1 at
//!   16 heads and <= 1.8x at 128 heads. A target whose rows were not run is left out.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use vt_core::{Buffer, DType, Device, DeviceType, MlaDecodeAttentionArgs, Queue};

use crate::peer_json::{self, L2Flush};
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
    /// FlashMLA's times: the JSON of tools/peers/flashmla_decode.py --json FILE, same device call.
    #[arg(long, value_name = "FILE")]
    pub peer: Option<PathBuf>,
    /// Draw time per shape (ours, FlashMLA from --peer, the floor) as .svg or .png.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Also time every kernel / minimum-tiles-per-part variant per shape.
    #[arg(long)]
    pub sweep: bool,
    /// Also time these kernels per shape, forced (`mma`, `mma_small`, `wgmma`, `wgmma_ss`,
    /// `wgmma_3wg`, `wgmma_3wg_x2`, `wgmma_fp8r`, `wgmma_fp8x2`, `wgmma_narrow`, `generic`), interleaved with the default so run-to-run
    /// drift does not bias the A/B; each is first checked against the CPU on poisoned outputs
    /// (unless `--no-parity`), its parity printed beside its time.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = kernel_name)]
    pub alt: Vec<String>,
    /// Also time the default kernel with at most these many parts (split-KV CTAs per row block),
    /// interleaved with the default like `--alt`: how the schedule's cut moves a shape.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = positive_u32)]
    pub parts: Vec<u32>,
    /// Timed runs per shape (median reported).
    #[arg(long, value_name = "N", default_value_t = 40, value_parser = positive)]
    pub iters: usize,
    /// Per shape, one more call after an L2 flush with the three-warpgroup kernels' lab timeline
    /// read back and summarized (where each CTA's time goes: the schedule, segment starts,
    /// waits, the tail, the combine). Needs a lab build: `tools/device/timeline.sh`.
    #[arg(long)]
    pub timeline: bool,
    /// Skip the CPU check before timing (for profiler runs).
    #[arg(long)]
    pub no_parity: bool,
    /// Clear the L2 before each timed call by reading 256 MB instead of writing it, so the call
    /// does not pay the write-back of the flush's dirty lines; a --peer file must be timed the
    /// same way (tools/peers/flashmla_decode.py --clean-flush writes "l2_flush": "read").
    #[arg(long)]
    pub clean_flush: bool,
    /// Keep shapes matching every key given (hN, bN, sN, bsN, sqN; kv8 = the fp8_ds_mla cache
    /// rows, kv16 = the bf16 ones), e.g. `h128,b1,s8192`; repeatable.
    #[arg(long, value_name = "SPEC", value_parser = only_spec)]
    pub only: Vec<String>,
}

/// A kernel name of `--alt` (clap value parser).
fn kernel_name(s: &str) -> Result<String, String> {
    kernel_of(s).map(|_| s.to_string()).ok_or_else(|| {
        format!(
            "`{s}` is not one of mma, mma_small, wgmma, wgmma_ss, wgmma_3wg, wgmma_3wg_x2, wgmma_3wg_pg, \
             wgmma_fp8r, wgmma_fp8x2, wgmma_narrow, generic"
        )
    })
}

fn kernel_of(s: &str) -> Option<Kernel> {
    match s {
        "mma" => Some(Kernel::Mma),
        "mma_small" => Some(Kernel::MmaSmall),
        "wgmma" => Some(Kernel::Wgmma),
        "wgmma_ss" => Some(Kernel::WgmmaSeesaw),
        "wgmma_3wg" => Some(Kernel::Wgmma3),
        "wgmma_3wg_x2" => Some(Kernel::Wgmma3Pair),
        "wgmma_3wg_pg" => Some(Kernel::Wgmma3Paged),
        "wgmma_fp8r" => Some(Kernel::WgmmaFp8Raw),
        "wgmma_fp8x2" => Some(Kernel::WgmmaFp8Pair),
        "wgmma_narrow" => Some(Kernel::WgmmaNarrow),
        "generic" => Some(Kernel::Generic),
        _ => None,
    }
}

/// A count of at least 1 (clap value parser).
pub fn positive(s: &str) -> Result<usize, String> {
    s.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| format!("`{s}` is not a positive count"))
}

/// A part count of at least 1 (clap value parser).
fn positive_u32(s: &str) -> Result<u32, String> {
    s.parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(|| format!("`{s}` is not a positive part count"))
}

/// `--only` keys: h, b, s, bs, sq, each followed by a number, and kv8 / kv16 (the fp8_ds_mla
/// or the bf16 cache rows).
fn only_spec(s: &str) -> Result<String, String> {
    for kv in s.split(',') {
        let i = kv.find(|c: char| c.is_ascii_digit()).unwrap_or(kv.len());
        let (k, v) = kv.split_at(i);
        if !matches!(k, "h" | "b" | "s" | "bs" | "sq" | "kv") || v.parse::<i64>().is_err() {
            return Err(format!("`{kv}` is not one of hN, bN, sN, bsN, sqN, kv8 (fp8 cache), kv16"));
        }
    }
    Ok(s.to_string())
}
const D: i64 = 576;
const DV: i64 = 512;
const Q_SEED: u64 = 11;
const KV_SEED: u64 = 12;

/// FlashMLA's block size: the peer's rows match our shapes of this block size only.
const PEER_BLOCK: i64 = 64;

/// (h_q, b, seqlen) of the ANCHORS.md table (s_q = 1, block size 64); no times: those come
/// from `--peer` only.
const ANCHORS: [(i64, i64, i64); 14] = [
    (16, 128, 4096),
    (16, 128, 8192),
    (16, 64, 16384),
    (16, 32, 4096),
    (16, 1, 8192),
    (32, 128, 8192),
    (64, 128, 4096),
    (64, 128, 8192),
    (64, 32, 4096),
    (128, 128, 4096),
    (128, 128, 8192),
    (128, 64, 16384),
    (128, 32, 4096),
    (128, 1, 8192),
];

/// (h_q, b, seqlen) of the fp8_ds_mla cache rows (block size 64, s_q = 1; issue 16): each
/// beside the bf16 row of the same shape.
const FP8: [(i64, i64, i64); 5] =
    [(16, 128, 4096), (16, 64, 16384), (32, 128, 8192), (64, 128, 4096), (128, 128, 4096)];

/// (h_q, b, seqlen) of the extra rows (block sizes 1 and 16, s_q = 2).
const EXTRA: [(i64, i64, i64); 2] = [(16, 128, 4096), (128, 32, 4096)];

#[derive(Clone, Copy, Debug)]
struct Shape {
    h: i64,
    b: i64,
    seqlen: i64,
    bs: i64,
    s_q: i64,
    tag: &'static str,
    /// The cache is fp8_ds_mla (656 bytes per token) instead of bf16.
    fp8: bool,
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
        let kv_row = if self.fp8 { vt_core::fp8_ds_mla::ROW_BYTES as f64 } else { 2.0 * D as f64 };
        self.total_kv() as f64 * kv_row + 2.0 * (rows * D as f64 + rows * DV as f64)
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
                "kv" => (v == 8) == self.fp8 && (v == 8 || v == 16),
                _ => false,
            }
        })
    }

    fn label(&self) -> String {
        let kv = if self.fp8 { " fp8" } else { "" };
        format!("h{} b{} s{} bs{} sq{}{kv}", self.h, self.b, self.seqlen, self.bs, self.s_q)
    }
}

fn shapes() -> Vec<Shape> {
    let mut v: Vec<Shape> = ANCHORS
        .iter()
        .map(|&(h, b, seqlen)| Shape { h, b, seqlen, bs: 64, s_q: 1, tag: "anchor", fp8: false })
        .collect();
    for (h, b, seqlen) in EXTRA {
        for bs in [1, 16] {
            v.push(Shape { h, b, seqlen, bs, s_q: 1, tag: "block size", fp8: false });
        }
        v.push(Shape { h, b, seqlen, bs: 64, s_q: 2, tag: "s_q 2", fp8: false });
    }
    for (h, b, seqlen) in FP8 {
        v.push(Shape { h, b, seqlen, bs: 64, s_q: 1, tag: "fp8 cache", fp8: true });
    }
    v
}

/// One row of the peer's JSON (tools/peers/flashmla_decode.py).
#[derive(Clone, Debug, PartialEq)]
pub struct PeerRow {
    pub h_q: i64,
    pub b: i64,
    pub seqlen: i64,
    pub s_q: i64,
    pub us: f64,
    pub gbps: Option<f64>,
    pub tflops: Option<f64>,
}

/// The peer's rows, from one file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Peer {
    /// The file's `peer` field ("" if absent).
    pub name: String,
    pub rows: Vec<PeerRow>,
    /// How the peer cleared the L2 before each timed call (its `l2_flush`).
    pub flush: L2Flush,
}

/// Parses `{"peer": NAME, "rows": [{"h_q","b","seqlen","s_q","us","gbps","tflops"}]}`. Every
/// row needs the four integer keys and a positive finite `us`; gbps and tflops are optional; two
/// rows with the same (h_q, b, seqlen, s_q) are an error.
fn parse_peer(text: &str) -> Result<Peer, String> {
    let (name, rows) = peer_json::parse(text, |r| {
        Ok(PeerRow {
            h_q: r.pos_int("h_q")?,
            b: r.pos_int("b")?,
            seqlen: r.pos_int("seqlen")?,
            s_q: r.pos_int("s_q")?,
            us: r.need_pos_num("us")?,
            gbps: r.num("gbps"),
            tflops: r.num("tflops"),
        })
    })?;
    peer_json::no_repeats(&rows, peer_key, |k| format!("{k:?}"))?;
    Ok(Peer { name, rows, flush: peer_json::l2_flush(text)? })
}

fn peer_key(r: &PeerRow) -> (i64, i64, i64, i64) {
    (r.h_q, r.b, r.seqlen, r.s_q)
}

impl Peer {
    /// The peer's time on `s`: its row with the same (h_q, b, seqlen, s_q); none for a block
    /// size other than FlashMLA's 64.
    fn us(&self, s: &Shape) -> Option<f64> {
        if s.bs != PEER_BLOCK {
            return None;
        }
        self.rows.iter().find(|r| peer_key(r) == (s.h, s.b, s.seqlen, s.s_q)).map(|r| r.us)
    }

    /// Rows matching none of `shapes` (a peer file from another shape list).
    fn unmatched(&self, shapes: &[Shape]) -> Vec<(i64, i64, i64, i64)> {
        self.rows
            .iter()
            .map(peer_key)
            .filter(|k| !shapes.iter().any(|s| s.bs == PEER_BLOCK && (s.h, s.b, s.seqlen, s.s_q) == *k))
            .collect()
    }
}

/// Says why a shape has no FlashMLA figure.
fn no_peer_note(peer: Option<&Peer>, s: &Shape) -> &'static str {
    match peer {
        None => "no peer in this call",
        Some(_) if s.bs != PEER_BLOCK => "the peer runs block size 64 only",
        Some(_) => "not in the peer file",
    }
}

struct Row {
    shape: Shape,
    /// FlashMLA's time on this shape, from `--peer` (this call's file) only.
    flash_us: Option<f64>,
    plan: Plan,
    us: f64,
    spread: (f64, f64),
    err: f64,
    parity: bool,
    sweep: Vec<(String, f64)>,
}

/// Splitmix64 step: the host side's randomness in the benches (page permutations, indices,
/// fp8 cache rows).
pub(crate) fn mix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform permutation of `v` (Fisher-Yates) drawn from [`mix`] seeded with `seed`.
pub(crate) fn shuffle<T>(v: &mut [T], seed: u64) {
    let mut st = seed;
    for i in (1..v.len()).rev() {
        v.swap(i, (mix(&mut st) % (i as u64 + 1)) as usize);
    }
}

/// Device buffers of one shape.
struct Inputs {
    q: Buffer,
    cache: Buffer,
    block_table: Buffer,
    seq_lens: Buffer,
    out: Buffer,
    lse: Buffer,
    /// The fp8_ds_mla cache's bytes (empty for a bf16 cache), for the CPU check.
    fp8_bytes: Vec<u8>,
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
    shuffle(&mut ids, 0x5eed_u64 ^ (s.h as u64) << 32 ^ s.bs as u64);
    let mut table = vec![0i32; (s.b * mb) as usize];
    let mut next = 0;
    for (i, &n) in blocks.iter().enumerate() {
        for j in 0..n {
            table[i * mb as usize + j as usize] = ids[next];
            next += 1;
        }
    }
    let qb = Buffer::uninit(q, DType::BF16, &[s.b, s.s_q, s.h, D])?;
    bench.fill(&qb.view(), Q_SEED, 1.0)?;
    let (cache, fp8_bytes) = if s.fp8 {
        let bytes = fp8_ds_mla_rows(nb * s.bs, KV_SEED, 1.0);
        (Buffer::from_bytes(q, DType::Fp8DsMla, &[nb, s.bs, ROW8], &bytes)?, bytes)
    } else {
        let cache = Buffer::uninit(q, DType::BF16, &[nb, s.bs, D])?;
        bench.fill(&cache.view(), KV_SEED, 1.0)?;
        (cache, Vec::new())
    };
    Ok(Inputs {
        q: qb,
        cache,
        block_table: Buffer::from_slice(q, &[s.b, mb], &table)?,
        seq_lens: Buffer::from_slice(q, &[s.b], &lens)?,
        out: Buffer::nan(q, DType::BF16, &[s.b, s.s_q, s.h, DV])?,
        lse: Buffer::nan(q, DType::F32, &[s.b, s.h, s.s_q])?,
        fp8_bytes,
        table,
        lens,
        mb,
    })
}

const ROW8: i64 = vt_core::fp8_ds_mla::ROW_BYTES as i64;

/// `rows` fp8_ds_mla rows of pseudo-random latent and rope values in [-amp, amp) (the host
/// encoder: amax / 448 scales), row i from a hash of i and `seed`, on all cores.
pub(crate) fn fp8_ds_mla_rows(rows: i64, seed: u64, amp: f32) -> Vec<u8> {
    use vt_core::fp8_ds_mla::{encode_row, LATENT, ROPE, ROW_BYTES};
    let mut out = vec![0u8; rows as usize * ROW_BYTES];
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let per = (rows as usize).div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        for (ci, chunk) in out.chunks_mut(per * ROW_BYTES).enumerate() {
            sc.spawn(move || {
                for (ri, row) in chunk.chunks_mut(ROW_BYTES).enumerate() {
                    let mut st = ((ci * per + ri) as u64) ^ seed << 40;
                    let mut val = || ((mix(&mut st) >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * amp;
                    let mut latent = [0f32; LATENT];
                    latent.iter_mut().for_each(|v| *v = val());
                    let mut rope = [0f32; ROPE];
                    rope.iter_mut().for_each(|v| *v = val());
                    let mut bytes = [0u8; ROW_BYTES];
                    encode_row(&latent, &rope, &mut bytes);
                    row.copy_from_slice(&bytes);
                }
            });
        }
    });
    out
}

fn args<'a>(x: &'a Inputs, scale: f32) -> MlaDecodeAttentionArgs<'a> {
    MlaDecodeAttentionArgs {
        out: x.out.view(),
        lse: Some(x.lse.view()),
        query: x.q.view(),
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
                    let mut kv = Vec::new();
                    let mut kv8 = Vec::new();
                    for j in 0..nblk {
                        let blk = x.table[(bi * x.mb + j) as usize] as u64;
                        if s.fp8 {
                            let at = (blk * (s.bs * ROW8) as u64) as usize;
                            kv8.extend_from_slice(&x.fp8_bytes[at..at + (s.bs * ROW8) as usize]);
                            continue;
                        }
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
                    let kf = if s.fp8 {
                        Buffer::from_bytes(&cpu, DType::Fp8DsMla, &[nblk.max(1), s.bs, ROW8], &kv8)?
                    } else {
                        Buffer::from_f64(&cpu, DType::F32, &[nblk.max(1), s.bs, D], &kv)?
                    };
                    vt_core::mla_decode_attention(
                        &cpu,
                        &vt_core::MlaDecodeAttentionArgs {
                            out: out.view(),
                            lse: Some(lse.view()),
                            query: qf.view(),
                            cache: kf.view(),
                            block_table: bt.view(),
                            seq_lens: sl.view(),
                            scale,
                        },
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

/// Largest relative Frobenius error of out that `parity` passes (bf16 outputs).
const PARITY_TOL: f64 = 1e-2;

/// One call of the forced kernel `o` on poisoned out / lse, checked as `parity` checks the
/// default kernel; `Some(relative error)`.
fn alt_parity(
    q: &Queue,
    s: &Shape,
    x: &Inputs,
    a: &MlaDecodeAttentionArgs<'_>,
    o: &DecodeOptions,
    scale: f32,
) -> vt_core::Result<Option<f64>> {
    x.out.fill_pattern(q, DType::BF16.nan_bytes())?;
    x.lse.fill_pattern(q, DType::F32.nan_bytes())?;
    mla_decode_attention_with(q, a, o)?;
    parity(q, s, x, scale).map(Some)
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

/// The shapes `--only` keeps (all when none is given); an error naming every spec that matches
/// none of them, before any GPU work (a misspelt filter would otherwise run nothing, or less
/// than asked, silently).
pub fn select<S>(all: Vec<S>, only: &[String], matches: impl Fn(&S, &str) -> bool) -> Result<Vec<S>, String> {
    let unmatched: Vec<&str> =
        only.iter().map(String::as_str).filter(|o| !all.iter().any(|s| matches(s, o))).collect();
    if !unmatched.is_empty() {
        return Err(format!("--only {} matches no shape of this bench", unmatched.join(", --only ")));
    }
    Ok(all.into_iter().filter(|s| only.is_empty() || only.iter().any(|o| matches(s, o))).collect())
}

/// The CUDA queue every bench runs on, once each of `ops` has a CUDA implementation (else
/// an error naming the op and the backends' probes).
pub fn cuda_queue(ops: &[vt_core::OpId]) -> Result<Queue, String> {
    let probes = vt_backends::init();
    if let Some(op) = ops.iter().find(|&&op| !vt_core::op_registered(op, DeviceType::Cuda)) {
        let p: Vec<String> = probes.iter().map(|(d, p)| format!("{d}: {p}")).collect();
        return Err(format!("no CUDA device with {op} ({})", p.join("; ")));
    }
    Queue::new(Device::new(DeviceType::Cuda, 0)).map_err(|e| e.to_string())
}

/// The name of CUDA device 0, as the backend reports it.
pub fn device_name() -> String {
    vt_core::registry::backend(DeviceType::Cuda).map(|b| b.device_name(0)).unwrap_or_default()
}

/// This run's ceilings, measured and printed: device copy bandwidth (bytes/s, read + write)
/// and the cuBLAS bf16 GEMM rate at 8192^3 (FLOP/s).
pub fn ceilings(bench: &Bench<'_>) -> Result<(f64, f64), String> {
    let e = |e: vt_core::Error| e.to_string();
    let copy_bw = bench.copy_bandwidth(1 << 30, 20).map_err(e)?;
    let gemm = bench.gemm_bf16_flops(8192, 20).map_err(e)?;
    println!(
        "ceilings (this run): device copy {:.0} GB/s (read + write), cuBLAS bf16 GEMM 8192^3 {:.0} TFLOP/s",
        copy_bw / 1e9,
        gemm / 1e12
    );
    Ok((copy_bw, gemm))
}

pub fn run(args_in: Args) -> Result<ExitCode, String> {
    let Args { json, peer, plot, sweep, alt, parts, iters, timeline, no_parity, clean_flush, only } = args_in;
    let check = !no_parity;
    let flush = if clean_flush { L2Flush::Read } else { L2Flush::Write };
    // The peer first: a bad file is reported before any GPU work.
    let peer = peer.as_deref().map(|f| peer_json::read(f, parse_peer)).transpose()?;
    if let Some(p) = &peer {
        peer_json::same_flush(
            p.flush,
            flush,
            "flashmla_decode.py --clean-flush",
            "default (no --clean-flush)",
        )?;
    }
    let todo = select(shapes(), &only, |s, o| s.matches(o))?;
    let q = cuda_queue(&[vt_core::OpId::MlaDecodeAttention])?;
    let e = |e: vt_core::Error| e.to_string();
    let bench = Bench::new(&q, 256 << 20).map_err(e)?.with_clean_flush(clean_flush);
    let name = device_name();
    println!("device: {name}");
    println!("L2 flush before each timed call: {}", flush.describe());
    let (copy_bw, gemm) = ceilings(&bench)?;
    match &peer {
        Some(p) => {
            let name = if p.name.is_empty() { "unnamed" } else { &p.name };
            println!("peer: {name} ({} rows, this call's file)", p.rows.len());
            let extra = p.unmatched(&shapes());
            if !extra.is_empty() {
                println!("peer rows matching no shape here (ignored): {extra:?}");
            }
        }
        None => println!("peer: none (no --peer FILE): FlashMLA columns print -, no peer in this call"),
    }
    let scale = 1.0 / (D as f32).sqrt();
    let mut rows: Vec<Row> = Vec::new();
    let bar = Progress::new(todo.len() as u64, "bench decode");
    for s in todo {
        bar.step(format!("{}: cache fill", s.label()));
        let x = make_inputs(&q, &bench, &s).map_err(e)?;
        let a = args(&x, scale);
        vt_core::mla_decode_attention(&q, &a).map_err(e)?;
        bar.step(format!("{}: CPU reference", s.label()));
        let err = if check { parity(&q, &s, &x, scale).map_err(e)? } else { f64::NAN };
        bar.step(format!("{}: timing", s.label()));
        let auto = DecodeOptions::default();
        let plan = mla_decode_attention_with(&q, &a, &auto).map_err(e)?;
        let (us, lo, hi) = time_call(&bench, &q, &a, &auto, iters).map_err(e)?;
        let mut sw = Vec::new();
        for name in &alt {
            let Some(kernel) = kernel_of(name) else { continue };
            let o = DecodeOptions { kernel, ..DecodeOptions::default() };
            // The forced kernel's output against the CPU first (out and lse poisoned, so a
            // kernel that writes nothing fails), unless --no-parity.
            let checked = if check { alt_parity(&q, &s, &x, &a, &o, scale) } else { Ok(None) };
            // Default, forced, default: the forced kernel's time beside the mean of the two.
            let r = checked.and_then(|p| {
                let (t, _, _) = time_call(&bench, &q, &a, &o, iters)?;
                let (t2, _, _) = time_call(&bench, &q, &a, &auto, iters)?;
                Ok((p, t, t2))
            });
            match r {
                Ok((p, t, t2)) => {
                    let label = match p {
                        Some(err) if err < PARITY_TOL => format!("{name} (parity PASS {err:.1e})"),
                        Some(err) => format!("{name} (parity FAIL {err:.1e})"),
                        None => name.clone(),
                    };
                    sw.push((label, t));
                    sw.push(("auto-again".to_string(), t2));
                }
                Err(err) => sw.push((format!("{name} ({err})"), f64::NAN)),
            }
        }
        for &mp in &parts {
            let o = DecodeOptions { max_parts: Some(mp), ..DecodeOptions::default() };
            let label = format!("parts<={mp}");
            let r = (|| {
                let (t, _, _) = time_call(&bench, &q, &a, &o, iters)?;
                let (t2, _, _) = time_call(&bench, &q, &a, &auto, iters)?;
                Ok::<_, vt_core::Error>((t, t2))
            })();
            match r {
                Ok((t, t2)) => {
                    sw.push((label, t));
                    sw.push(("auto-again".to_string(), t2));
                }
                Err(err) => sw.push((format!("{label} ({err})"), f64::NAN)),
            }
        }
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
        if timeline {
            bar.println(timeline_summary(&bench, &q, &a, &auto).map_err(e)?);
        }
        let flash_us = peer.as_ref().and_then(|p| p.us(&s));
        let row = Row {
            shape: s,
            flash_us,
            plan,
            us,
            spread: (lo, hi),
            err,
            parity: !check || err < PARITY_TOL,
            sweep: sw,
        };
        bar.println(format_row(&row, peer.as_ref(), copy_bw, gemm));
        bar.inc();
        rows.push(row);
    }
    drop(bar);
    let tg = targets(&rows, peer.is_some(), copy_bw);
    let summary = summarize(&rows, peer.as_ref(), &tg, copy_bw, gemm);
    print!("{summary}");
    if let Some(f) = json {
        std::fs::write(&f, to_json(&rows, peer.as_ref(), &tg, copy_bw, gemm, &name, flush))
            .map_err(|er| format!("writing {}: {er}", f.display()))?;
    }
    if let Some(f) = plot {
        crate::plot::write(&f, &chart(&rows, peer.as_ref(), copy_bw, gemm, &name))?;
        println!("plot: {}", f.display());
    }
    Ok(if rows.iter().all(|r| r.parity) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// One call of `a` after an L2 flush, with the lab timeline cleared before and read after,
/// summarized over the CTAs that ran tiles: medians and maxima in us, waits per tile.
fn timeline_summary(
    bench: &Bench<'_>,
    q: &Queue,
    a: &MlaDecodeAttentionArgs<'_>,
    o: &DecodeOptions,
) -> vt_core::Result<String> {
    use vt_cuda::mla_decode_attention::timeline;
    if !timeline::clear(q)? {
        return Ok(
            "    timeline: none in this build (a lab build with MLA_TIMELINE 1: tools/device/timeline.sh)"
                .into(),
        );
    }
    bench.flush_l2()?;
    mla_decode_attention_with(q, a, o)?;
    let Some(t) = timeline::read(q)? else { return Ok("    timeline: none".into()) };
    Ok(format_timeline(&t))
}

/// The summary of [`timeline_summary`] (pure: tested on a made-up timeline).
fn format_timeline(t: &vt_cuda::mla_decode_attention::timeline::Timeline) -> String {
    use vt_cuda::mla_decode_attention::timeline::{ev, EVENTS};
    let rows: Vec<&[u64; EVENTS]> = t.ctas.iter().filter(|r| r[ev::ENTRY] != 0 && r[ev::TILES] > 0).collect();
    if rows.is_empty() {
        return "    timeline: no CTA ran a tile (not a three-warpgroup kernel?)".into();
    }
    let t0 = rows.iter().map(|r| r[ev::ENTRY]).min().unwrap_or(0);
    let end = |r: &[u64; EVENTS]| r[ev::END0].max(r[ev::END1]);
    let t_end = rows.iter().map(|r| end(r)).max().unwrap_or(t0);
    let us = |ns: u64| ns as f64 / 1e3;
    // Median and maximum of a per-CTA quantity, in us.
    let stat = |f: &dyn Fn(&[u64; EVENTS]) -> f64| {
        let mut v: Vec<f64> = rows.iter().map(|r| f(r)).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        (v[v.len() / 2], v[v.len() - 1])
    };
    let d = |a: u64, b: u64| us(b.saturating_sub(a));
    let per_tile = |r: &[u64; EVENTS], k: usize| us(r[k]) / r[ev::TILES].max(1) as f64;
    let line = |name: &str, (m, x): (f64, f64)| format!("{name} {m:.1} / {x:.1}");
    let parts = [
        line("launch spread", stat(&|r| d(t0, r[ev::ENTRY]))),
        line("find_part", stat(&|r| d(r[ev::ENTRY], r[ev::PART]))),
        line("first Q", stat(&|r| d(r[ev::PART], r[ev::Q0]))),
        line("first tile", stat(&|r| d(r[ev::PART], r[ev::TILE0]))),
        line("first segment", stat(&|r| d(r[ev::Q0], r[ev::SEG0_END]))),
        line("last segment start", stat(&|r| d(t0, r[ev::QLAST]))),
        line("end", stat(&|r| d(t0, end(r)))),
    ];
    let waits = [
        line("WG0 FULL", stat(&|r| per_tile(r, ev::WAIT_FULL0))),
        line("WG0 P_FREE", stat(&|r| per_tile(r, ev::WAIT_PFREE0))),
        line("WG1 P_FULL", stat(&|r| per_tile(r, ev::WAIT_PFULL1))),
        line("WG1 FULL", stat(&|r| per_tile(r, ev::WAIT_FULL1))),
        line("WG0 S wait", stat(&|r| per_tile(r, ev::WAIT_S0))),
        line("WG0 softmax", stat(&|r| per_tile(r, ev::SOFTMAX0))),
        line("WG0 next tile landed (tiles)", stat(&|r| r[ev::LANDED0] as f64)),
        line("WG1 P V", stat(&|r| per_tile(r, ev::PV1))),
    ];
    let seg = stat(&|r| r[ev::SEGS] as f64);
    let tiles = stat(&|r| r[ev::TILES] as f64);
    let qwait = stat(&|r| us(r[ev::WAIT_Q0]));
    let store = stat(&|r| us(r[ev::STORE1]));
    // Per segment change (sums over the CTA's segments): WG1's wait at FIN, its Q load, WG0's
    // walk from FIN to the next Q_READY wait.
    let fin1 = stat(&|r| us(r[ev::WAIT_FIN1]));
    let qload = stat(&|r| us(r[ev::QLOAD1]));
    let next0 = stat(&|r| us(r[ev::NEXT0]));
    let c = &t.combine;
    let comb = if c[1] != u64::MAX && c[2] != 0 {
        format!(
            "combine: first CTA +{:.1} us, past the main grid +{:.1}, ends +{:.1} ({} CTAs merged)",
            d(t0, c[0]),
            d(t0, c[1]),
            d(t0, c[2]),
            c[3]
        )
    } else {
        "combine: no stamps".to_string()
    };
    format!(
        "    timeline ({} CTAs, us after the first CTA's start, median / max): {}
      segments {:.0} / {:.0}, tiles {:.0} / {:.0}; Q waits {:.1} / {:.1}, stores {:.1} / {:.1}, WG1 FIN waits {:.1} / {:.1}, Q loads {:.1} / {:.1}, WG0 FIN to next Q wait {:.1} / {:.1}; per tile: {}
      main kernel {:.1} us; {}",
        rows.len(),
        parts.join(", "),
        seg.0,
        seg.1,
        tiles.0,
        tiles.1,
        qwait.0,
        qwait.1,
        store.0,
        store.1,
        fin1.0,
        fin1.1,
        qload.0,
        qload.1,
        next0.0,
        next0.1,
        waits.join(", "),
        d(t0, t_end),
        comb
    )
}

fn floor_us(s: &Shape, bw: f64, gemm: f64) -> f64 {
    (s.bytes() / bw).max(s.flops() / gemm) * 1e6
}

/// Percent of the copy floor (bytes / this run's copy ceiling) that a time of `us` reaches.
fn pct_copy(s: &Shape, bw: f64, us: f64) -> f64 {
    100.0 * s.bytes() / bw * 1e6 / us
}

/// vt / FlashMLA on a row, when the peer file has its shape.
fn ratio(r: &Row) -> Option<f64> {
    r.flash_us.map(|f| r.us / f)
}

/// One target of issue 13 (item 2).
#[derive(Clone, Debug, PartialEq)]
struct Target {
    /// What is judged, e.g. `vt / FlashMLA, h16 b128 s4096 bs64 sq1`.
    what: String,
    /// The measured value; `None`: not judged (`note` says why).
    value: Option<f64>,
    /// `value <= limit` when true, `value >= limit` otherwise.
    at_most: bool,
    limit: f64,
    /// "", "us" or "%".
    unit: &'static str,
    note: &'static str,
}

impl Target {
    fn ok(&self) -> Option<bool> {
        self.value.map(|v| if self.at_most { v <= self.limit } else { v >= self.limit })
    }

    fn verdict(&self) -> &'static str {
        match self.ok() {
            Some(true) => "ok",
            Some(false) => "MISS",
            None => "-",
        }
    }

    fn fmt_value(&self, v: f64) -> String {
        match self.unit {
            "" => format!("{v:.3}"),
            u => format!("{v:.1}{}{u}", if u == "us" { " " } else { "" }),
        }
    }

    fn line(&self) -> String {
        let bound = format!("{} {}", if self.at_most { "<=" } else { ">=" }, self.fmt_value(self.limit));
        match self.value {
            Some(v) => format!("{}: {} (target {bound}): {}", self.what, self.fmt_value(v), self.verdict()),
            None => format!("{}: not judged, {} (target {bound})", self.what, self.note),
        }
    }
}

/// The targets of issue 13 over the rows run. A target whose rows were not run (`--only`) is
/// left out; the ratio targets of shapes without a peer figure are listed as not judged.
fn targets(rows: &[Row], have_peer: bool, bw: f64) -> Vec<Target> {
    let find = |h, b, seqlen, bs, s_q| {
        rows.iter().find(|r| {
            let s = &r.shape;
            !s.fp8 && (s.h, s.b, s.seqlen, s.bs, s.s_q) == (h, b, seqlen, bs, s_q)
        })
    };
    let t = |what: String, value: Option<f64>, at_most, limit, unit, note| Target {
        what,
        value,
        at_most,
        limit,
        unit,
        note,
    };
    let mut v = Vec::new();
    for r in rows.iter().filter(|r| r.shape.bs == PEER_BLOCK && !r.shape.fp8) {
        let note = if have_peer { "not in the peer file" } else { "no peer in this call" };
        v.push(t(format!("vt / FlashMLA, {}", r.shape.label()), ratio(r), true, 1.0, "", note));
    }
    for r in rows.iter().filter(|r| {
        [16, 32].contains(&r.shape.h) && r.shape.b >= 64 && r.shape.bs == PEER_BLOCK && !r.shape.fp8
    }) {
        let pct = pct_copy(&r.shape, bw, r.us);
        v.push(t(format!("% of copy floor, {}", r.shape.label()), Some(pct), false, 90.0, "%", ""));
    }
    // Issue 16: the fp8_ds_mla cache beside the bf16 cache and FlashMLA's bf16 on the same shape.
    for r in rows.iter().filter(|r| r.shape.fp8) {
        let s = &r.shape;
        let bf = rows.iter().find(|o| {
            !o.shape.fp8
                && (o.shape.h, o.shape.b, o.shape.seqlen, o.shape.bs, o.shape.s_q)
                    == (s.h, s.b, s.seqlen, s.bs, s.s_q)
        });
        if let Some(bf) = bf {
            if s.h <= 64 {
                v.push(t(
                    format!("fp8 speed-up over bf16, {}", s.label()),
                    Some(bf.us / r.us),
                    false,
                    1.6,
                    "x",
                    "",
                ));
            } else {
                v.push(t(format!("fp8 / bf16 time, {}", s.label()), Some(r.us / bf.us), true, 1.0, "", ""));
            }
        }
        if s.h <= 64 {
            let note = if have_peer { "not in the peer file" } else { "no peer in this call" };
            v.push(t(format!("fp8 / FlashMLA bf16, {}", s.label()), ratio(r), true, 1.0, "", note));
        }
        if s.h == 16 {
            v.push(t(
                format!("fp8 % of copy floor, {}", s.label()),
                Some(pct_copy(s, bw, r.us)),
                false,
                80.0,
                "%",
                "",
            ));
        }
    }
    for h in [16, 128] {
        if let Some(r) = find(h, 1, 8192, PEER_BLOCK, 1) {
            v.push(t(format!("time, {}", r.shape.label()), Some(r.us), true, 12.0, "us", ""));
        }
    }
    for (h, b, seqlen) in EXTRA {
        let Some(base) = find(h, b, seqlen, PEER_BLOCK, 1) else { continue };
        for bs in [1, 16] {
            if let Some(r) = find(h, b, seqlen, bs, 1) {
                let what = format!("block size {bs} / 64, h{h} b{b} s{seqlen}");
                v.push(t(what, Some(r.us / base.us), true, 1.10, "", ""));
            }
        }
        if let Some(r) = find(h, b, seqlen, PEER_BLOCK, 2) {
            let limit = if h <= 16 { 1.10 } else { 1.8 };
            v.push(t(
                format!("s_q 2 / s_q 1, h{h} b{b} s{seqlen}"),
                Some(r.us / base.us),
                true,
                limit,
                "",
                "",
            ));
        }
    }
    v
}

/// The plot: time per shape, ours beside FlashMLA's (from the peer file) and this run's floor.
fn chart(rows: &[Row], peer: Option<&Peer>, bw: f64, gemm: f64, device: &str) -> Chart {
    let labels = rows.iter().map(|r| format!("{} {}", r.shape.label(), r.plan.kernel)).collect();
    let mut series = vec![Series { name: "vt".into(), values: rows.iter().map(|r| Some(r.us)).collect() }];
    if let Some(p) = peer {
        let name = if p.name.is_empty() {
            "FlashMLA (this call)".to_string()
        } else {
            format!("{} (this call)", p.name)
        };
        series.push(Series { name, values: rows.iter().map(|r| r.flash_us).collect() });
    }
    series.push(Series {
        name: "floor (this run's ceilings)".into(),
        values: rows.iter().map(|r| Some(floor_us(&r.shape, bw, gemm))).collect(),
    });
    let no_peer = if peer.is_none() { ", no peer in this call" } else { "" };
    Chart {
        title: format!("MlaDecodeAttention, {device}: time per shape (lower is better){no_peer}"),
        unit: "time per call, us".into(),
        labels,
        series,
    }
}

fn format_row(r: &Row, peer: Option<&Peer>, bw: f64, gemm: f64) -> String {
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
    match (r.flash_us, ratio(r)) {
        (Some(f), Some(x)) => {
            let _ = write!(line, "  FlashMLA {f:.1} us, ratio {x:.2}");
        }
        _ => {
            let _ = write!(line, "  FlashMLA - ({})", no_peer_note(peer, s));
        }
    }
    let _ = write!(line, "  parity {} ({:.1e})", if r.parity { "PASS" } else { "FAIL" }, r.err);
    if !r.sweep.is_empty() {
        let v: Vec<String> = r.sweep.iter().map(|(l, t)| format!("{l} {t:.1}")).collect();
        let _ = write!(line, "\n    sweep: {}", v.join(", "));
    }
    line
}

fn summarize(rows: &[Row], peer: Option<&Peer>, tg: &[Target], bw: f64, gemm: f64) -> String {
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
            r.flash_us.map_or("-".into(), |f| format!("{f:.1}")),
            ratio(r).map_or("-".into(), |x| format!("{x:.2}")),
            if r.parity { "PASS" } else { "FAIL" }
        );
    }
    match peer {
        None => {
            let _ = writeln!(o, "FlashMLA: - everywhere: no peer in this call (--peer FILE from tools/peers/flashmla_decode.py)");
        }
        Some(p) => {
            let name = if p.name.is_empty() { "unnamed peer" } else { &p.name };
            let _ =
                writeln!(o, "FlashMLA: {name}, this call's file; - where the file has no row of the shape");
        }
    }
    let _ = writeln!(o, "\ntargets (issue 13):");
    for t in tg {
        let _ = writeln!(o, "- {}", t.line());
    }
    let count = |want: Option<bool>| tg.iter().filter(|t| t.ok() == want).count();
    let _ = writeln!(
        o,
        "targets: {} ok, {} MISS, {} not judged",
        count(Some(true)),
        count(Some(false)),
        count(None)
    );
    let pass = rows.iter().filter(|r| r.parity).count();
    let _ = writeln!(o, "parity: {pass} of {} shapes PASS", rows.len());
    let _ = writeln!(o, "(floors from this run: copy {:.0} GB/s, GEMM {:.0} TFLOP/s)", bw / 1e9, gemm / 1e12);
    o
}

/// A JSON number, or null when absent or not finite.
fn num(x: Option<f64>, prec: usize) -> String {
    x.filter(|v| v.is_finite()).map_or("null".into(), |v| format!("{v:.prec$}"))
}

fn to_json(
    rows: &[Row],
    peer: Option<&Peer>,
    tg: &[Target],
    bw: f64,
    gemm: f64,
    device: &str,
    flush: L2Flush,
) -> String {
    let peer_name = peer.map_or("null".into(), |p| format!("{:?}", p.name));
    let mut o = format!(
        "{{\"device\": {:?}, \"l2_flush\": {:?}, \"copy_gbps\": {:.1}, \"gemm_tflops\": {:.1}, \"peer\": {peer_name}, \"rows\": [\n",
        device,
        flush.word(),
        bw / 1e9,
        gemm / 1e12
    );
    for (i, r) in rows.iter().enumerate() {
        let s = &r.shape;
        let sweep: Vec<String> = r
            .sweep
            .iter()
            .map(|(l, t)| format!("{{\"variant\": {l:?}, \"us\": {}}}", num(Some(*t), 2)))
            .collect();
        let _ = writeln!(
            o,
            "  {{\"tag\": {:?}, \"h_q\": {}, \"b\": {}, \"seqlen\": {}, \"block_size\": {}, \"s_q\": {}, \
             \"kernel\": {:?}, \"row_blocks\": {}, \"parts\": {}, \"us\": {:.2}, \"gbps\": {:.1}, \"tflops\": {:.1}, \
             \"pct_floor\": {:.1}, \"pct_copy_floor\": {:.1}, \"flashmla_us\": {}, \"ratio\": {}, \
             \"parity_err\": {:.3e}, \"parity\": {}, \"sweep\": [{}]}}{}",
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
            pct_copy(s, bw, r.us),
            num(r.flash_us, 2),
            num(ratio(r), 4),
            if r.err.is_finite() { r.err } else { 1e9 },
            r.parity,
            sweep.join(", "),
            if i + 1 < rows.len() { "," } else { "" }
        );
    }
    o.push_str("], \"targets\": [\n");
    for (i, t) in tg.iter().enumerate() {
        let ok = t.ok().map_or("null", |b| if b { "true" } else { "false" });
        let _ = writeln!(
            o,
            "  {{\"target\": {:?}, \"value\": {}, \"bound\": {:?}, \"limit\": {}, \"unit\": {:?}, \"ok\": {ok}, \"note\": {:?}}}{}",
            t.what,
            num(t.value, 4),
            if t.at_most { "<=" } else { ">=" },
            t.limit,
            t.unit,
            t.note,
            if i + 1 < tg.len() { "," } else { "" }
        );
    }
    o.push_str("]}\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The timeline summary on a made-up call: two CTAs with tiles, one idle, the combine's span.
    #[test]
    fn timeline_summary_reports_the_ctas_that_ran_tiles() {
        use vt_cuda::mla_decode_attention::timeline::{ev, Timeline, EVENTS};
        let mut ctas = vec![[0u64; EVENTS]; 3];
        for (k, r) in ctas.iter_mut().take(2).enumerate() {
            let t = 1_000_000 + 1_000 * k as u64;
            r[ev::ENTRY] = t;
            r[ev::PART] = t + 2_000;
            r[ev::Q0] = t + 5_000;
            r[ev::TILE0] = t + 6_000;
            r[ev::SEG0_END] = t + 40_000;
            r[ev::QLAST] = t + 5_000;
            r[ev::END0] = t + 41_000;
            r[ev::END1] = t + 42_000;
            r[ev::SEGS] = 1;
            r[ev::TILES] = 16;
            r[ev::WAIT_FULL0] = 16_000;
            r[ev::SOFTMAX0] = 8_000;
            r[ev::LANDED0] = 15;
            r[ev::PV1] = 4_800;
            r[ev::WAIT_FIN1] = 1_500;
            r[ev::QLOAD1] = 3_000;
            r[ev::NEXT0] = 700;
        }
        let s = format_timeline(&Timeline { ctas, combine: [1_030_000, 1_043_000, 1_050_000, 64] });
        assert!(s.contains("(2 CTAs"), "{s}");
        assert!(s.contains("find_part 2.0 / 2.0"), "{s}");
        assert!(s.contains("WG0 FULL 1.0 / 1.0"), "{s}");
        assert!(s.contains("WG0 softmax 0.5 / 0.5"), "{s}");
        assert!(s.contains("WG0 next tile landed (tiles) 15.0 / 15.0"), "{s}");
        assert!(s.contains("WG1 P V 0.3 / 0.3"), "{s}");
        assert!(
            s.contains("WG1 FIN waits 1.5 / 1.5, Q loads 3.0 / 3.0, WG0 FIN to next Q wait 0.7 / 0.7"),
            "{s}"
        );
        assert!(s.contains("main kernel 43.0 us"), "{s}");
        assert!(s.contains("past the main grid +43.0, ends +50.0 (64 CTAs merged)"), "{s}");
        let none =
            format_timeline(&Timeline { ctas: vec![[0u64; EVENTS]; 2], combine: [u64::MAX, u64::MAX, 0, 0] });
        assert!(none.contains("no CTA ran a tile"), "{none}");
    }

    /// The shape of tools/peers/flashmla_decode.py's file (two rows, made-up times).
    const PEER: &str = r#"{"peer": "FlashMLA 9241ae3 dense decode", "rows": [
 {"h_q": 16, "b": 128, "seqlen": 4096, "s_q": 1, "us": 200.0, "gbps": 3000.5, "tflops": 80.1},
 {"h_q": 16, "b": 1, "seqlen": 8192, "s_q": 1, "us": 20.0, "gbps": 470.0, "tflops": 13.0},
 {"h_q": 16, "b": 128, "seqlen": 4096, "s_q": 2, "us": 210.0, "gbps": 2900.0, "tflops": 160.0},
 {"h_q": 99, "b": 3, "seqlen": 7, "s_q": 1, "us": 1.0, "gbps": 1.0, "tflops": 1.0}
]}"#;

    const BW: f64 = 4.0e12;

    fn shape(h: i64, b: i64, seqlen: i64, bs: i64, s_q: i64) -> Shape {
        Shape { h, b, seqlen, bs, s_q, tag: "test", fp8: false }
    }

    fn row(s: Shape, us: f64, peer: Option<&Peer>) -> Row {
        Row {
            shape: s,
            flash_us: peer.and_then(|p| p.us(&s)),
            plan: Plan { kernel: "wgmma", rows_per_cta: 64, row_blocks: 1, parts: 1, min_tiles: 1 },
            us,
            spread: (us, us),
            err: 1e-3,
            parity: true,
            sweep: Vec::new(),
        }
    }

    #[test]
    fn the_shape_list_holds_no_peer_times() {
        let v = shapes();
        assert_eq!(v.len(), 25, "16 peer shapes, 4 block-size rows, 5 fp8 cache rows");
        assert_eq!(v.iter().filter(|s| s.fp8).count(), FP8.len());
        assert!(v.iter().filter(|s| s.fp8).all(|s| s.bs == PEER_BLOCK && s.s_q == 1));
        let peer_shapes: Vec<_> = v.iter().filter(|s| s.bs == PEER_BLOCK && !s.fp8).collect();
        assert_eq!(peer_shapes.len(), 16, "14 anchors + two s_q = 2 shapes");
        assert!(peer_shapes.iter().any(|s| (s.h, s.b, s.seqlen, s.s_q) == (16, 128, 4096, 2)));
        assert!(peer_shapes.iter().any(|s| (s.h, s.b, s.seqlen, s.s_q) == (128, 32, 4096, 2)));
        assert_eq!(v.iter().filter(|s| s.s_q == 1 && s.bs == PEER_BLOCK && !s.fp8).count(), 14);
    }

    #[test]
    fn parses_the_peer_json() {
        let p = parse_peer(PEER).expect("parses");
        assert_eq!(p.name, "FlashMLA 9241ae3 dense decode");
        assert_eq!(p.rows.len(), 4);
        assert_eq!(
            p.rows[0],
            PeerRow {
                h_q: 16,
                b: 128,
                seqlen: 4096,
                s_q: 1,
                us: 200.0,
                gbps: Some(3000.5),
                tflops: Some(80.1)
            }
        );
        // gbps and tflops are optional; a missing name reads as "".
        let p = parse_peer(r#"{"rows": [{"h_q": 16, "b": 1, "seqlen": 8192, "s_q": 1, "us": 29}]}"#)
            .expect("parses");
        assert_eq!((p.name.as_str(), p.rows[0].us, p.rows[0].gbps), ("", 29.0, None));
    }

    #[test]
    fn a_peer_timed_with_another_l2_flush_is_refused() {
        let p = parse_peer(PEER).expect("parses");
        assert_eq!(p.flush, L2Flush::Write, "no l2_flush: do_bench's write");
        assert!(peer_json::same_flush(p.flush, L2Flush::Write, "c", "d").is_ok());
        let e = peer_json::same_flush(p.flush, L2Flush::Read, "c", "d")
            .expect_err("a write-flushed peer beside a clean run");
        assert!(e.contains("(write) differs from this run's (read)"), "{e}");
        let clean =
            r#"{"l2_flush": "read", "rows": [{"h_q": 16, "b": 1, "seqlen": 8192, "s_q": 1, "us": 20}]}"#;
        assert_eq!(parse_peer(clean).map(|p| p.flush), Ok(L2Flush::Read));
        assert!(parse_peer(r#"{"l2_flush": "dirty", "rows": []}"#).is_err());
    }

    #[test]
    fn rejects_bad_peer_json() {
        for bad in [
            "not json",
            "{}",
            r#"{"rows": {}}"#,
            r#"{"rows": [{"h_q": 16, "b": 1, "seqlen": 8192, "us": 29.0}]}"#,
            r#"{"rows": [{"h_q": 16, "b": 1, "seqlen": 8192, "s_q": 1}]}"#,
            r#"{"rows": [{"h_q": 16, "b": 1, "seqlen": 8192, "s_q": 1, "us": -3}]}"#,
            r#"{"rows": [{"h_q": 16.5, "b": 1, "seqlen": 8192, "s_q": 1, "us": 3}]}"#,
            r#"{"rows": [{"h_q": 16, "b": 1, "seqlen": 8192, "s_q": 1, "us": 3},
                         {"h_q": 16, "b": 1, "seqlen": 8192, "s_q": 1, "us": 4}]}"#,
        ] {
            assert!(parse_peer(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn matches_peer_rows_by_heads_batch_length_and_queries() {
        let p = parse_peer(PEER).expect("parses");
        assert_eq!(p.us(&shape(16, 128, 4096, 64, 1)), Some(200.0));
        assert_eq!(p.us(&shape(16, 128, 4096, 64, 2)), Some(210.0));
        assert_eq!(p.us(&shape(16, 1, 8192, 64, 1)), Some(20.0));
        // Another block size is not FlashMLA's shape; absent shapes have no figure.
        assert_eq!(p.us(&shape(16, 128, 4096, 16, 1)), None);
        assert_eq!(p.us(&shape(128, 128, 4096, 64, 1)), None);
        assert_eq!(p.us(&shape(16, 128, 8192, 64, 1)), None);
        assert_eq!(p.unmatched(&shapes()), vec![(99, 3, 7, 1)]);
        assert_eq!(no_peer_note(None, &shape(16, 1, 8192, 64, 1)), "no peer in this call");
        assert_eq!(no_peer_note(Some(&p), &shape(16, 128, 4096, 1, 1)), "the peer runs block size 64 only");
        assert_eq!(no_peer_note(Some(&p), &shape(128, 1, 8192, 64, 1)), "not in the peer file");
    }

    fn find<'a>(tg: &'a [Target], what: &str) -> &'a Target {
        tg.iter().find(|t| t.what == what).unwrap_or_else(|| panic!("no target {what}: {tg:#?}"))
    }

    fn rows(peer: Option<&Peer>) -> Vec<Row> {
        let base = shape(16, 128, 4096, 64, 1);
        // The copy floor of the base shape at BW, so "% of copy floor" is easy to set.
        let floor = base.bytes() / BW * 1e6;
        vec![
            row(base, floor / 0.95, peer),               // 95% of the copy floor
            row(shape(16, 1, 8192, 64, 1), 11.5, peer),  // <= 12 us
            row(shape(128, 1, 8192, 64, 1), 12.5, peer), // > 12 us
            row(shape(16, 128, 4096, 1, 1), floor / 0.95 * 1.05, peer),
            row(shape(16, 128, 4096, 16, 1), floor / 0.95 * 1.2, peer),
            row(shape(16, 128, 4096, 64, 2), floor / 0.95 * 1.15, peer),
            row(shape(32, 128, 8192, 64, 1), shape(32, 128, 8192, 64, 1).bytes() / BW * 1e6 / 0.8, peer),
            row(shape(128, 32, 4096, 64, 1), 100.0, peer),
            row(shape(128, 32, 4096, 64, 2), 175.0, peer),
        ]
    }

    #[test]
    fn ratios_and_targets_from_the_peer_file() {
        let p = parse_peer(PEER).expect("parses");
        let rs = rows(Some(&p));
        assert_eq!(ratio(&rs[1]), Some(11.5 / 20.0));
        assert_eq!(ratio(&rs[3]), None, "block size 1 has no peer figure");
        let tg = targets(&rs, true, BW);
        let r0 = find(&tg, "vt / FlashMLA, h16 b128 s4096 bs64 sq1");
        assert_eq!(r0.ok(), Some(rs[0].us <= 200.0));
        assert_eq!(find(&tg, "vt / FlashMLA, h16 b1 s8192 bs64 sq1").ok(), Some(true));
        let missing = find(&tg, "vt / FlashMLA, h128 b1 s8192 bs64 sq1");
        assert_eq!((missing.ok(), missing.note), (None, "not in the peer file"));
        assert!(!tg.iter().any(|t| t.what.starts_with("vt / FlashMLA") && t.what.contains("bs16")));
        // Copy floor at 16 and 32 heads, b >= 64 (both s_q), not at 128 heads nor b = 1.
        let c = find(&tg, "% of copy floor, h16 b128 s4096 bs64 sq1");
        assert!((c.value.unwrap_or(0.0) - 95.0).abs() < 1e-9 && c.ok() == Some(true));
        assert_eq!(find(&tg, "% of copy floor, h32 b128 s8192 bs64 sq1").ok(), Some(false));
        assert!(tg.iter().any(|t| t.what == "% of copy floor, h16 b128 s4096 bs64 sq2"));
        assert!(!tg
            .iter()
            .any(|t| t.what.starts_with("% of copy floor")
                && (t.what.contains("h128") || t.what.contains(" b1 "))));
        assert_eq!(find(&tg, "time, h16 b1 s8192 bs64 sq1").ok(), Some(true));
        assert_eq!(find(&tg, "time, h128 b1 s8192 bs64 sq1").ok(), Some(false));
        assert_eq!(find(&tg, "block size 1 / 64, h16 b128 s4096").ok(), Some(true));
        assert_eq!(find(&tg, "block size 16 / 64, h16 b128 s4096").ok(), Some(false));
        assert_eq!(find(&tg, "s_q 2 / s_q 1, h16 b128 s4096").ok(), Some(false), "1.15 > 1.10");
        let s2 = find(&tg, "s_q 2 / s_q 1, h128 b32 s4096");
        assert_eq!((s2.limit, s2.ok()), (1.8, Some(true)), "1.75 <= 1.8");
        // Block-size targets at 128 heads were not run: left out.
        assert!(!tg.iter().any(|t| t.what.starts_with("block size") && t.what.contains("h128")));

        let table = summarize(&rs, Some(&p), &tg, BW, 1e15);
        assert!(table.contains("| 200.0 |"), "{table}");
        assert!(table.contains("FlashMLA 9241ae3 dense decode, this call's file"), "{table}");
        assert!(table.contains("): MISS"), "{table}");
        let j = to_json(&rs, Some(&p), &tg, BW, 1e15, "test GPU", L2Flush::Write);
        let v: serde_json::Value = serde_json::from_str(&j).expect("our JSON parses");
        assert_eq!(v["peer"], "FlashMLA 9241ae3 dense decode");
        assert_eq!(v["l2_flush"], "write");
        assert_eq!(v["rows"][1]["flashmla_us"], 20.0);
        assert_eq!(v["rows"][3]["flashmla_us"], serde_json::Value::Null);
        assert_eq!(v["targets"].as_array().map(Vec::len), Some(tg.len()));
        let c = chart(&rs, Some(&p), BW, 1e15, "test GPU");
        assert_eq!(c.series.len(), 3);
        assert_eq!(c.series[1].values[1], Some(20.0));
        assert_eq!(c.series[1].values[3], None);
        assert!(format_row(&rs[1], Some(&p), BW, 1e15).contains("FlashMLA 20.0 us, ratio 0.57"));
    }

    #[test]
    fn without_a_peer_nothing_is_compared() {
        let rs = rows(None);
        assert!(rs.iter().all(|r| r.flash_us.is_none() && ratio(r).is_none()));
        let tg = targets(&rs, false, BW);
        let r0 = find(&tg, "vt / FlashMLA, h16 b128 s4096 bs64 sq1");
        assert_eq!((r0.ok(), r0.note), (None, "no peer in this call"));
        assert!(r0.line().contains("not judged, no peer in this call"));
        // The other targets need no peer.
        assert_eq!(find(&tg, "time, h16 b1 s8192 bs64 sq1").ok(), Some(true));
        let table = summarize(&rs, None, &tg, BW, 1e15);
        assert!(table.contains("| - | - | PASS |"), "{table}");
        assert!(table.contains("no peer in this call"), "{table}");
        assert!(format_row(&rs[0], None, BW, 1e15).contains("FlashMLA - (no peer in this call)"));
        let j = to_json(&rs, None, &tg, BW, 1e15, "test GPU", L2Flush::Read);
        let v: serde_json::Value = serde_json::from_str(&j).expect("our JSON parses");
        assert_eq!(v["peer"], serde_json::Value::Null);
        assert_eq!(v["l2_flush"], "read");
        assert!(v["rows"]
            .as_array()
            .is_some_and(|a| a.iter().all(|r| r["flashmla_us"].is_null() && r["ratio"].is_null())));
        let c = chart(&rs, None, BW, 1e15, "test GPU");
        assert_eq!(c.series.len(), 2, "vt and the floor only");
        assert!(c.title.contains("no peer in this call"));
    }

    #[test]
    fn fp8_cache_rows_count_656_bytes_a_token_and_are_judged_against_the_bf16_row() {
        let bf = shape(16, 128, 4096, 64, 1);
        let f8 = Shape { fp8: true, ..bf };
        let kv = bf.total_kv() as f64;
        assert_eq!(bf.bytes() - f8.bytes(), kv * (2.0 * D as f64 - 656.0));
        assert!(f8.matches("kv8") && !f8.matches("kv16") && bf.matches("kv16") && !bf.matches("kv8"));
        assert!(only_spec("h16,kv8").is_ok() && only_spec("kv").is_err());
        let all = shapes();
        let n = all.len();
        assert_eq!(select(shapes(), &[], |s, o| s.matches(o)).map(|v| v.len()), Ok(n));
        let some = select(shapes(), &["h16,b128".into()], |s, o| s.matches(o)).unwrap_or_default();
        assert!(!some.is_empty() && some.len() < n);
        let e =
            select(shapes(), &["h16".into(), "h999".into()], |s, o| s.matches(o)).err().unwrap_or_default();
        assert!(e.contains("--only h999") && !e.contains("h16"), "{e}");
        assert!(f8.label().ends_with(" fp8"));
        // fp8 twice as fast as bf16, under FlashMLA's bf16 time: both targets met; the fp8 row
        // joins none of issue 13's lists.
        let p = parse_peer(PEER).expect("parses");
        let rs = vec![row(bf, 200.0, Some(&p)), row(f8, 100.0, Some(&p))];
        let tg = targets(&rs, true, BW);
        assert_eq!(find(&tg, "fp8 speed-up over bf16, h16 b128 s4096 bs64 sq1 fp8").ok(), Some(true));
        let vs_peer = find(&tg, "fp8 / FlashMLA bf16, h16 b128 s4096 bs64 sq1 fp8");
        assert_eq!(vs_peer.value, rs[1].flash_us.map(|f| 100.0 / f));
        assert!(!tg.iter().any(|t| t.what.starts_with("vt / FlashMLA") && t.what.ends_with("fp8")));
    }
}
