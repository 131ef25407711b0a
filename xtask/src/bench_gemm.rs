//! `cargo xtask bench gemm [--json FILE] [--peer FILE] [--iters N] [--only SPEC]... [--m LIST] [--no-parity] [--splits N]`:
//! the GEMMs of a DeepSeek-V3 layer (TP = 1) on the first CUDA device, bf16 (cuBLAS, through
//! MatmulBT / BatchedMatmul) beside fp8 with 128 x 128 block-scaled weights (MatmulBTFp8 /
//! BatchedMatmulFp8), against floors from ceilings measured in the same run (issue 17).
//!
//! - Shapes: `a_proj` (the fused q_a + kv_a projection, N 2112, K 7168), `q_b` (24576 x
//!   1536), `kv_b` (32768 x 512, prefill rows only), `o_proj` (7168 x 16384), and the
//!   absorbed decode BMMs over 128 heads (`q_absorb`: K 128 (P) -> N 512 (L); `v_up`: K 512
//!   -> N 128 (V); decode rows only). M (tokens): 1, 8, 32, 64, 128 (decode) and 4096
//!   (prefill) unless `--m` says otherwise.
//! - Columns: `bf16` (cuBLAS, forced), `sk16` (bf16 on the skinny swap-AB kernel, forced;
//!   decode rows), `w8` (weight-only fp8: bf16 activations, the Gemv kernel, forced), `sk8`
//!   (weight-only fp8 on the skinny kernel, forced; decode rows),
//!   `w8a8` (both fp8 on vt's kernel: Wgmma forced on sm_90, where Auto now takes cuBLASLt,
//!   Auto elsewhere; BMMs: Auto; on activations quantized beforehand),
//!   `lt` (both fp8 on cuBLASLt's block-scaled GEMM, `Kernel::Lt`, forced, the same operands;
//!   linear rows only: the absorbed BMMs are not routed to it; `-` where it refuses the views
//!   or has no algorithm, the reason printed once), `quant` (QuantizeFp8 of the activations on
//!   its first kernel, `QuantKernel::Warp` forced: the cost `w8a8` leaves out; % of its copy
//!   floor: bf16 read, codes and scales written), `wide` (the same on the wide kernel,
//!   `QuantKernel::Wide` forced, its bytes checked equal to the first one's: `same bytes` /
//!   `BYTES DIFFER`) and `w8a8+q` (the better of `w8a8` and `lt`, plus the quantize the op takes
//!   under `VT_QUANT_WIDE`).
//! - Counting: FLOPs = 2 G M N K; bytes = weights (fp8: 1 byte an element plus the f32
//!   scales; bf16: 2) + activations (2 bytes an element, 1 when quantized, plus scales) +
//!   outputs (2 bytes), each once.
//! - Ceilings (this run): device copy bandwidth (bytes read + written, 1 GiB copies) and a
//!   cuBLAS bf16 GEMM 8192^3. floor = max(bytes / copy, FLOPs / peak) with peak = the
//!   measured bf16 rate for bf16 and twice it for fp8 (the H100/H200 spec ratio of the fp8
//!   and bf16 tensor rates); the fp8 wgmma kernel's own rate at 8192^3 is printed beside it.
//! - Timing: CUDA events around each call, the L2 flushed before each by reading 256 MB (so the
//!   call starts with a clean L2; `--dirty-flush` writes them instead, as runs before 2026-12-01
//!   18:40 did, which leaves up to 50 MB of dirty lines whose write-back the call pays), median
//!   of `--iters` (default 30) after warm-up.
//! - `--peer FILE`: the JSON of `tools/peers/fp8_blockwise_gemm.py --json FILE` (torch's
//!   `_scaled_mm` with 1 x 128 / 128 x 128 scales and torch's bf16 matmul on the linear
//!   GEMMs, from the same device call): a second table, vt's `lt` and `w8a8` beside torch's
//!   fp8 and bf16 times per (GEMM, M) found in both, and DeepGEMM's `fp8_gemm_nt` on the same
//!   scales where the file has it (the peer script times it when `deep_gemm` imports:
//!   tools/peers/build_deepgemm.sh).
//! - Parity: the skinny bf16 output against cuBLAS's on the GPU (whole output); before timing, the fp8 outputs of three rows (first, middle, last; BMMs: the
//!   first and last head) are checked against the CPU reference on the same bytes
//!   (tolerance: vt-check's bf16 row).
//! - Targets (issue 17, item 2), listed ok / MISS after the table: decode rows (M <= 128),
//!   fp8 weight-only (the better of `w8`, `w8a8+q`) at >= 85% of the weight-streaming floor
//!   (fp8 bytes / copy ceiling); prefill rows (M >= 4096), `w8a8` TFLOP/s >= 1.4x the bf16
//!   cuBLAS TFLOP/s of the same shape in this run (listed for `w8a8` and for `lt`); and (issue 18) decode rows in bf16, the better
//!   of cuBLAS and the skinny kernel at >= 85% of the bf16 weight-streaming floor. The decode step's total (every decode
//!   GEMM of one layer) is printed per M for bf16 and fp8.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use vt_core::fp8_block::blocks;
use vt_core::{
    BatchedMatmulArgs, BatchedMatmulFp8Args, Buffer, DType, Device, MatmulBTArgs, MatmulBTFp8Args, OpId,
    QuantizeFp8Args, Queue, Tensor,
};
use vt_cuda::bench::{median, Bench};
use vt_cuda::fp8_matmul::{
    auto_quant_kernel, batched_matmul_fp8_with_options, matmul_bt_fp8_with, matmul_bt_fp8_with_options,
    quantize_fp8_with, Fp8Options, Kernel, QuantKernel,
};
use vt_cuda::skinny_gemm::{batched_matmul_with, matmul_bt_with, GemmKernel, GemmOptions};

use crate::bench::{cuda_queue, device_name, positive};
use crate::peer_json::{self, L2Flush};
use crate::progress::Progress;

/// `cargo xtask bench gemm` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write the rows (and this run's ceilings) as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// torch's block-scaled fp8 GEMM from the same device call: the JSON of
    /// tools/peers/fp8_blockwise_gemm.py --json FILE.
    #[arg(long, value_name = "FILE")]
    pub peer: Option<PathBuf>,
    /// Timed runs per cell (median reported).
    #[arg(long, value_name = "N", default_value_t = 30, value_parser = positive)]
    pub iters: usize,
    /// Token counts M, comma-separated (default 1,8,32,64,128,4096).
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = positive)]
    pub m: Vec<usize>,
    /// Keep GEMMs whose name contains one of these (a_proj, q_b, kv_b, o_proj, q_absorb, v_up);
    /// comma-separated or repeated.
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip the CPU check before timing (for profiler runs).
    #[arg(long)]
    pub no_parity: bool,
    /// K splits for the skinny kernel's columns (`sk16`, `sk8`) instead of its planner's
    /// choice (for sweeps: the planner picks from waves and ring fill).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub splits: Option<u32>,
    /// Flush the L2 by writing 256 MB (the earlier runs' method) instead of reading it: the
    /// timed call then also pays the write-back of up to 50 MB of dirty lines.
    #[arg(long)]
    pub dirty_flush: bool,
}

/// Tokens at and below this are decode rows; at and above [`PREFILL_M`] prefill rows.
const DECODE_MAX_M: i64 = 128;
const PREFILL_M: i64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Form {
    /// A linear layer: `out[M, N] = a[M, K] . W[N, K]^T`.
    Linear,
    /// Per-head weights over G heads: `out[g] = a[g] . W[g]`, `a` a view of `[M, G, K]`.
    Absorbed,
}

#[derive(Clone, Copy, Debug)]
struct Gemm {
    name: &'static str,
    form: Form,
    g: i64,
    n: i64,
    k: i64,
    /// Run at decode M, at prefill M.
    decode: bool,
    prefill: bool,
}

/// The GEMMs of a DeepSeek-V3 layer at TP = 1.
fn gemms() -> Vec<Gemm> {
    let l = |name, n, k, decode, prefill| Gemm { name, form: Form::Linear, g: 1, n, k, decode, prefill };
    let h = |name, n, k| Gemm { name, form: Form::Absorbed, g: 128, n, k, decode: true, prefill: false };
    vec![
        l("a_proj", 1536 + 576, 7168, true, true),
        l("q_b", 128 * 192, 1536, true, true),
        l("kv_b", 128 * 256, 512, false, true),
        l("o_proj", 7168, 128 * 128, true, true),
        h("q_absorb", 512, 128),
        h("v_up", 128, 512),
    ]
}

impl Gemm {
    fn flops(&self, m: i64) -> f64 {
        2.0 * (self.g * m * self.n * self.k) as f64
    }
    fn scale_bytes(&self) -> f64 {
        4.0 * (self.g * blocks(self.n) * blocks(self.k)) as f64
    }
    /// Bytes moved once: weights, activations (`act_bytes` an element, plus per-token scales
    /// when quantized), outputs in bf16.
    fn bytes(&self, m: i64, w_bytes: f64, act_bytes: f64) -> f64 {
        let gnk = (self.g * self.n * self.k) as f64;
        let act = (self.g * m * self.k) as f64 * act_bytes
            + if act_bytes < 2.0 { 4.0 * (self.g * m * blocks(self.k)) as f64 } else { 0.0 };
        let w = gnk * w_bytes + if w_bytes < 2.0 { self.scale_bytes() } else { 0.0 };
        w + act + 2.0 * (self.g * m * self.n) as f64
    }
}

/// SplitMix64 bytes: fp8 codes without the NaN codes (0x7f, 0xff).
fn codes(seed: u64, n: usize) -> Vec<u8> {
    let mut z = seed;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = z;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        for b in x.to_le_bytes() {
            if out.len() < n {
                out.push(if b & 0x7f == 0x7f { b ^ 1 } else { b });
            }
        }
    }
    out
}

/// Block scales 2^-9 .. 2^-6, varying per block.
fn scales(seed: u64, n: usize) -> Vec<u8> {
    codes(seed, n)
        .into_iter()
        .flat_map(|b| (2f32.powi(-9) * (1.0 + (b as f32) / 96.0)).to_le_bytes())
        .collect()
}

/// One GEMM's device operands at one M (weights shared over M).
struct Weights {
    bf16: Buffer,
    fp8: Buffer,
    scale: Buffer,
    /// Host copies for the parity check.
    fp8_host: Vec<u8>,
    scale_host: Vec<u8>,
}

impl Weights {
    fn new(q: &Queue, bench: &Bench<'_>, s: &Gemm, seed: u64) -> vt_core::Result<Weights> {
        let (g, n, k) = (s.g, s.n, s.k);
        let bf16 = Buffer::uninit(q, DType::BF16, &[g * n * k])?;
        bench.fill(&bf16.view(), seed, 0.05)?;
        let fp8_host = codes(seed ^ 1, (g * n * k) as usize);
        let scale_host = scales(seed ^ 2, (g * blocks(n) * blocks(k)) as usize);
        let fp8 = Buffer::from_bytes(q, DType::F8E4M3, &[g * n * k], &fp8_host)?;
        let scale = Buffer::from_bytes(q, DType::F32, &[g * blocks(n) * blocks(k)], &scale_host)?;
        Ok(Weights { bf16, fp8, scale, fp8_host, scale_host })
    }
}

/// Views of the operands in the form of `s`: weights as the block keeps them (bf16:
/// `[N, K]` rows, or `[G, K, N]` per head as W_UK_T / W_UV; fp8: `[N, K]`, or per head
/// K-contiguous `[G, N, K]` read as `[G, K, N]`), activations `[M, K]` or a `[G, M, K]` view of
/// `[M, G, K]`, outputs likewise.
struct Views<'a> {
    w16: Tensor<'a>,
    w8: Tensor<'a>,
    w8s: Tensor<'a>,
}

fn weight_views<'a>(s: &Gemm, w: &'a Weights) -> vt_core::Result<Views<'a>> {
    let (g, n, k) = (s.g, s.n, s.k);
    let (nb, kb) = (blocks(n), blocks(k));
    Ok(match s.form {
        Form::Linear => Views {
            w16: w.bf16.view().as_strided(0, &[n, k], &[k, 1])?,
            w8: w.fp8.view().as_strided(0, &[n, k], &[k, 1])?,
            w8s: w.scale.view().as_strided(0, &[nb, kb], &[kb, 1])?,
        },
        Form::Absorbed => Views {
            w16: w.bf16.view().as_strided(0, &[g, k, n], &[k * n, n, 1])?,
            w8: w.fp8.view().as_strided(0, &[g, k, n], &[n * k, 1, k])?,
            w8s: w.scale.view().as_strided(0, &[g, kb, nb], &[nb * kb, 1, kb])?,
        },
    })
}

/// `[M, K]` (Linear) or the `[G, M, K]` view of `[M, G, K]` (Absorbed) over `buf`.
fn act_view<'a>(s: &Gemm, buf: &'a Buffer, m: i64, width: i64) -> vt_core::Result<Tensor<'a>> {
    match s.form {
        Form::Linear => buf.view().as_strided(0, &[m, width], &[width, 1]),
        Form::Absorbed => buf.view().as_strided(0, &[s.g, m, width], &[width, s.g * width, 1]),
    }
}

/// The per-token scales `[M, KB]` stored transposed (`[KB, M]`, as DeepGEMM keeps them), or
/// `[G, M, KB]` over `[M, G, KB]`.
fn act_scale_view<'a>(s: &Gemm, buf: &'a Buffer, m: i64) -> vt_core::Result<Tensor<'a>> {
    let kb = blocks(s.k);
    match s.form {
        Form::Linear => buf.view().as_strided(0, &[m, kb], &[1, m]),
        Form::Absorbed => buf.view().as_strided(0, &[s.g, m, kb], &[kb, s.g * kb, 1]),
    }
}

/// QuantizeFp8's scale view over `buf` for a cell's 2-D `[M G, K]` activations: the linear
/// GEMMs' `[M, KB]` as their products read it; the absorbed heads' rows in order.
fn quant_scale_view<'a>(s: &Gemm, buf: &'a Buffer, m: i64) -> vt_core::Result<Tensor<'a>> {
    match s.form {
        Form::Linear => act_scale_view(s, buf, m),
        Form::Absorbed => {
            let kb = blocks(s.k);
            buf.view().as_strided(0, &[m * s.g, kb], &[kb, 1])
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Row {
    name: &'static str,
    m: i64,
    bf16_us: f64,
    /// bf16 on the skinny kernel.
    sk16_us: Option<f64>,
    w8_us: Option<f64>,
    /// fp8 weight-only on the skinny kernel.
    sk8_us: Option<f64>,
    w8a8_us: Option<f64>,
    /// Both fp8 on cuBLASLt (`Kernel::Lt`, forced).
    lt_us: Option<f64>,
    quant_us: Option<f64>,
    /// QuantizeFp8 on the wide kernel (`QuantKernel::Wide`, `VT_QUANT_WIDE`), forced.
    quant_wide_us: Option<f64>,
    /// The wide kernel's codes and scales equal the op's, byte for byte.
    quant_wide_same: bool,
    /// The op's Auto takes the wide kernel on this row's activations.
    quant_auto_wide: bool,
    /// Bytes QuantizeFp8 moves: the bf16 activations read, their codes and scales written.
    bytes_quant: f64,
    w8a8_kernel: String,
    err: f64,
    /// The skinny bf16 output against cuBLAS's.
    err16: f64,
    parity: bool,
    flops: f64,
    bytes_bf16: f64,
    bytes_w8: f64,
    bytes_w8a8: f64,
}

impl Row {
    /// The best fp8 time with the activations as the op receives them at decode (bf16): the
    /// weight-only kernel or quantize + both-fp8.
    fn best_decode_fp8(&self) -> Option<f64> {
        [self.w8_us, self.sk8_us, self.w8a8_quant()].into_iter().flatten().reduce(f64::min)
    }

    /// The better both-fp8 time plus the activations' quantization on the kernel the op takes
    /// (`VT_QUANT_WIDE` and the size rule, `auto_quant_kernel`): the `w8a8+q` column.
    fn w8a8_quant(&self) -> Option<f64> {
        let quant = if self.quant_auto_wide { self.quant_wide_us } else { self.quant_us };
        self.best_w8a8().zip(quant).map(|(a, b)| a + b)
    }

    /// The floors of the bf16, weight-only fp8 and both-fp8 columns (us) under the copy
    /// bandwidth `bw` and the peaks.
    fn floors(&self, bw: f64, bf16_peak: f64, fp8_peak: f64) -> (f64, f64, f64) {
        (
            floor_us(self.bytes_bf16, self.flops, bw, bf16_peak),
            floor_us(self.bytes_w8, self.flops, bw, fp8_peak),
            floor_us(self.bytes_w8a8, self.flops, bw, fp8_peak),
        )
    }

    /// The better both-fp8 time: the Auto kernel or cuBLASLt.
    fn best_w8a8(&self) -> Option<f64> {
        [self.w8a8_us, self.lt_us].into_iter().flatten().reduce(f64::min)
    }

    /// The best bf16 time: cuBLAS or the skinny kernel.
    fn best_bf16(&self) -> f64 {
        self.sk16_us.map_or(self.bf16_us, |s| s.min(self.bf16_us))
    }
}

fn time(bench: &Bench<'_>, iters: usize, f: impl FnMut() -> vt_core::Result<()>) -> vt_core::Result<f64> {
    let mut t = bench.time_us(3, iters, true, f)?;
    Ok(median(&mut t))
}

/// The fp8 outputs of a few rows (heads) against the CPU reference on the same bytes.
#[allow(clippy::too_many_arguments)]
fn parity(
    gpu: &Queue,
    s: &Gemm,
    w: &Weights,
    m: i64,
    a: &Tensor<'_>,
    a_scale: Option<&Tensor<'_>>,
    out: &Tensor<'_>,
) -> vt_core::Result<f64> {
    let cpu = Queue::new(Device::CPU)?;
    let (g, n, k) = (s.g, s.n, s.k);
    let (nb, kb) = (blocks(n), blocks(k));
    let wbuf = Buffer::from_bytes(&cpu, DType::F8E4M3, &[g * n * k], &w.fp8_host)?;
    let sbuf = Buffer::from_bytes(&cpu, DType::F32, &[g * nb * kb], &w.scale_host)?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    match s.form {
        Form::Linear => {
            let mut rows = vec![0, m / 2, m - 1];
            rows.dedup();
            for r in rows {
                let a_row = gpu.read_bytes(&a.slice(0, r, r + 1)?)?;
                let ab = Buffer::from_bytes(&cpu, a.dtype(), &[1, k], &a_row)?;
                let asb = match a_scale {
                    Some(sc) => Some(Buffer::from_f64(
                        &cpu,
                        DType::F32,
                        &[1, kb],
                        &gpu.read_f64(&sc.slice(0, r, r + 1)?)?,
                    )?),
                    None => None,
                };
                let ob = Buffer::nan(&cpu, DType::BF16, &[1, n])?;
                vt_core::matmul_bt_fp8(
                    &cpu,
                    &MatmulBTFp8Args {
                        out: ob.view(),
                        a: ab.view(),
                        a_scale: asb.as_ref().map(|b| b.view()),
                        b: wbuf.view().as_strided(0, &[n, k], &[k, 1])?,
                        b_scale: sbuf.view().as_strided(0, &[nb, kb], &[kb, 1])?,
                    },
                )?;
                want.extend(ob.to_f64(&cpu)?);
                got.extend(gpu.read_f64(&out.slice(0, r, r + 1)?)?);
            }
        }
        Form::Absorbed => {
            for h in [0, g - 1] {
                let a_h = gpu.read_f64(&a.slice(0, h, h + 1)?)?;
                let ab = Buffer::from_f64(&cpu, a.dtype(), &[1, m, k], &a_h)?;
                let asb = match a_scale {
                    Some(sc) => Some(Buffer::from_f64(
                        &cpu,
                        DType::F32,
                        &[1, m, kb],
                        &gpu.read_f64(&sc.slice(0, h, h + 1)?)?,
                    )?),
                    None => None,
                };
                let ob = Buffer::nan(&cpu, DType::BF16, &[1, m, n])?;
                vt_core::batched_matmul_fp8(
                    &cpu,
                    &BatchedMatmulFp8Args {
                        out: ob.view(),
                        a: ab.view(),
                        a_scale: asb.as_ref().map(|b| b.view()),
                        b: wbuf.view().as_strided(h * n * k, &[1, k, n], &[n * k, 1, k])?,
                        b_scale: sbuf.view().as_strided(h * nb * kb, &[1, kb, nb], &[nb * kb, 1, kb])?,
                    },
                )?;
                want.extend(ob.to_f64(&cpu)?);
                got.extend(gpu.read_f64(&out.slice(0, h, h + 1)?)?);
            }
        }
    }
    Ok(vt_check::rel_fro_error(&got, &want))
}

/// A both-fp8 kernel's rate on an 8192^3 product (FLOP per second), for comparison with the
/// bf16 ceiling: `Kernel::Auto` (our wgmma kernel on sm_90; activation scales row-major) or
/// `Kernel::Lt` (cuBLASLt; activation scales stored `[KB, M]`, its layout); `None` when it
/// cannot run here (Lt's reason printed).
fn fp8_rate(q: &Queue, bench: &Bench<'_>, iters: usize, which: Kernel) -> vt_core::Result<Option<f64>> {
    let n = 8192i64;
    let a = Buffer::from_bytes(q, DType::F8E4M3, &[n, n], &codes(11, (n * n) as usize))?;
    let b = Buffer::from_bytes(q, DType::F8E4M3, &[n, n], &codes(12, (n * n) as usize))?;
    let sa = Buffer::from_bytes(q, DType::F32, &[n, n / 128], &scales(13, (n * n / 128) as usize))?;
    let sb = Buffer::from_bytes(q, DType::F32, &[n / 128, n / 128], &scales(14, (n * n / 16384) as usize))?;
    let out = Buffer::uninit(q, DType::BF16, &[n, n])?;
    let sa_view = match which {
        Kernel::Lt => sa.view().as_strided(0, &[n, n / 128], &[1, n])?,
        _ => sa.view(),
    };
    let x = MatmulBTFp8Args {
        out: out.view(),
        a: a.view(),
        a_scale: Some(sa_view),
        b: b.view(),
        b_scale: sb.view(),
    };
    vt_core::matmul_bt_fp8(q, &x)?;
    if which == Kernel::Lt {
        if let Err(er) = matmul_bt_fp8_with(q, &x, Kernel::Lt) {
            lt_refused("8192^3", n, &er);
            return Ok(None);
        }
    }
    let mut kernel = which;
    let mut t = bench.time_us(3, iters, false, || {
        kernel = matmul_bt_fp8_with(q, &x, which)?;
        Ok(())
    })?;
    if kernel == Kernel::Generic {
        return Ok(None);
    }
    Ok(Some(2.0 * (n as f64).powi(3) / (median(&mut t) * 1e-6)))
}

pub fn run(a: Args) -> Result<ExitCode, String> {
    let Args { json, peer, iters, m, only, no_parity, dirty_flush, splits } = a;
    let peer = peer.as_deref().map(|f| peer_json::read(f, parse_peer)).transpose()?;
    let flush = if dirty_flush { L2Flush::Write } else { L2Flush::Read };
    if let Some(p) = &peer {
        peer_json::same_flush(p.flush, flush, "fp8_blockwise_gemm.py --clean-flush", "--dirty-flush")?;
    }
    let ms: Vec<i64> =
        if m.is_empty() { vec![1, 8, 32, 64, 128, PREFILL_M] } else { m.iter().map(|&x| x as i64).collect() };
    let q = cuda_queue(&[OpId::MatmulBT, OpId::MatmulBTFp8, OpId::BatchedMatmulFp8, OpId::QuantizeFp8])?;
    let e = |e: vt_core::Error| e.to_string();
    let bench = Bench::new(&q, 256 << 20).map_err(e)?.with_clean_flush(!dirty_flush);
    let device = device_name();
    println!("device: {device}; L2 flushed before each timed call by {}", flush.describe());
    let copy_bw = bench.copy_bandwidth(1 << 30, 20).map_err(e)?;
    let bf16_peak = bench.gemm_bf16_flops(8192, 20).map_err(e)?;
    let fp8_peak = 2.0 * bf16_peak;
    let ours = fp8_rate(&q, &bench, 10, Kernel::Auto).map_err(e)?;
    let lt_rate = fp8_rate(&q, &bench, 10, Kernel::Lt).map_err(e)?;
    // What a call costs under this timing protocol before it moves a byte: a 1-element kernel
    // between the same events after the same flush (launch, start-up, event resolution).
    let tiny = Buffer::uninit(&q, DType::F32, &[1]).map_err(e)?;
    let launch_us = time(&bench, 20, || bench.fill(&tiny.view(), 1, 1.0)).map_err(e)?;
    println!("timing floor of this protocol (a 1-element kernel, L2 flushed, median): {launch_us:.1} us");
    println!(
        "ceilings (this run): device copy {:.0} GB/s (read + write), cuBLAS bf16 GEMM 8192^3 {:.0} TFLOP/s, \
         fp8 peak taken as 2x = {:.0} TFLOP/s (vt's fp8 wgmma kernel at 8192^3: {}; cuBLASLt block-scaled fp8 at 8192^3: {})",
        copy_bw / 1e9,
        bf16_peak / 1e12,
        fp8_peak / 1e12,
        ours.map_or("n/a".to_string(), |r| format!("{:.0} TFLOP/s", r / 1e12)),
        lt_rate.map_or("n/a".to_string(), |r| format!("{:.0} TFLOP/s ({:.2}x bf16)", r / 1e12, r / bf16_peak))
    );
    let todo: Vec<Gemm> = gemms()
        .into_iter()
        .filter(|g| only.is_empty() || only.iter().any(|o| g.name.contains(o.as_str())))
        .collect();
    let cells: usize = todo.iter().map(|g| ms.iter().filter(|&&m| runs_at(g, m)).count()).sum();
    let bar = Progress::new(cells as u64, "bench gemm");
    let mut rows = Vec::new();
    for (gi, s) in todo.iter().enumerate() {
        let w = Weights::new(&q, &bench, s, 100 + gi as u64).map_err(e)?;
        let v = weight_views(s, &w).map_err(e)?;
        for &m in ms.iter().filter(|&&m| runs_at(s, m)) {
            bar.step(format!("{} M {m}", s.name));
            let row = cell(&q, &bench, s, &w, &v, m, iters, !no_parity, splits).map_err(e)?;
            bar.println(format_row(&row, copy_bw, bf16_peak, fp8_peak));
            bar.inc();
            rows.push(row);
        }
    }
    drop(bar);
    let tg = targets(&rows, copy_bw);
    print!("{}", summarize(&rows, &tg, copy_bw, bf16_peak, fp8_peak));
    if let Some(p) = &peer {
        print!("{}", peer_table(&rows, p));
    }
    if let Some(f) = json {
        std::fs::write(&f, to_json(&rows, &tg, copy_bw, bf16_peak, (ours, lt_rate), &device))
            .map_err(|er| format!("writing {}: {er}", f.display()))?;
    }
    Ok(if rows.iter().all(|r| r.parity) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn runs_at(g: &Gemm, m: i64) -> bool {
    (m <= DECODE_MAX_M && g.decode) || (m > DECODE_MAX_M && g.prefill)
}

/// The activations of a cell's fp8 products: bf16 (weight-only fp8) or quantized to fp8.
#[derive(Clone, Copy, Debug)]
enum Act {
    Bf16,
    Fp8,
}

/// A cell's three products in the form of its GEMM, so that one sequence of calls times
/// the columns of both forms: the forms differ only in their entry points.
enum Products<'a> {
    Linear { b16: MatmulBTArgs<'a>, w8: MatmulBTFp8Args<'a>, w8a8: MatmulBTFp8Args<'a> },
    Absorbed { b16: BatchedMatmulArgs<'a>, w8: BatchedMatmulFp8Args<'a>, w8a8: BatchedMatmulFp8Args<'a> },
}

impl Products<'_> {
    /// The bf16 product through vt-core's dispatch (as the block runs it).
    fn bf16_default(&self, q: &Queue) -> vt_core::Result<()> {
        match self {
            Products::Linear { b16, .. } => vt_core::matmul_bt(q, b16),
            Products::Absorbed { b16, .. } => vt_core::batched_matmul(q, b16),
        }
    }

    /// The bf16 product on the kernel `opts` forces.
    fn bf16(&self, q: &Queue, opts: &GemmOptions) -> vt_core::Result<()> {
        match self {
            Products::Linear { b16, .. } => matmul_bt_with(q, b16, opts).map(|_| ()),
            Products::Absorbed { b16, .. } => batched_matmul_with(q, b16, opts).map(|_| ()),
        }
    }

    /// The fp8 product on `act` activations through vt-core's dispatch.
    fn fp8_default(&self, q: &Queue, act: Act) -> vt_core::Result<()> {
        match (self, act) {
            (Products::Linear { w8, .. }, Act::Bf16) => vt_core::matmul_bt_fp8(q, w8),
            (Products::Linear { w8a8, .. }, Act::Fp8) => vt_core::matmul_bt_fp8(q, w8a8),
            (Products::Absorbed { w8, .. }, Act::Bf16) => vt_core::batched_matmul_fp8(q, w8),
            (Products::Absorbed { w8a8, .. }, Act::Fp8) => vt_core::batched_matmul_fp8(q, w8a8),
        }
    }

    /// The fp8 product on `act` activations on the kernel `opts` forces: the kernel that ran.
    fn fp8(&self, q: &Queue, act: Act, opts: &Fp8Options) -> vt_core::Result<Kernel> {
        match (self, act) {
            (Products::Linear { w8, .. }, Act::Bf16) => matmul_bt_fp8_with_options(q, w8, opts),
            (Products::Linear { w8a8, .. }, Act::Fp8) => matmul_bt_fp8_with_options(q, w8a8, opts),
            (Products::Absorbed { w8, .. }, Act::Bf16) => batched_matmul_fp8_with_options(q, w8, opts),
            (Products::Absorbed { w8a8, .. }, Act::Fp8) => batched_matmul_fp8_with_options(q, w8a8, opts),
        }
    }
}

/// One (GEMM, M) cell: bf16, w8, quantize, w8a8.
#[allow(clippy::too_many_arguments)]
fn cell(
    q: &Queue,
    bench: &Bench<'_>,
    s: &Gemm,
    w: &Weights,
    v: &Views<'_>,
    m: i64,
    iters: usize,
    check: bool,
    splits: Option<u32>,
) -> vt_core::Result<Row> {
    let sk8 = Fp8Options { kernel: Kernel::Skinny, splits };
    let (g, n, k) = (s.g, s.n, s.k);
    let x = Buffer::uninit(q, DType::BF16, &[g * m * k])?;
    bench.fill(&x.view(), 7 + m as u64, 1.0)?;
    let x8 = Buffer::uninit(q, DType::F8E4M3, &[g * m * k])?;
    let xs = Buffer::uninit(q, DType::F32, &[g * m * blocks(k)])?;
    let out = Buffer::nan(q, DType::BF16, &[g * m * n])?;
    let xa = act_view(s, &x, m, k)?;
    let xq = act_view(s, &x8, m, k)?;
    let o = act_view(s, &out, m, n)?;
    // Quantize (a 2-D op: the Absorbed form's [M, G*K] rows are exactly its [G, M, K] heads).
    let (x2, x82) =
        (x.view().as_strided(0, &[m * g, k], &[k, 1])?, x8.view().as_strided(0, &[m * g, k], &[k, 1])?);
    let quant = QuantizeFp8Args { out: x82, scale: quant_scale_view(s, &xs, m)?, x: x2 };
    vt_core::quantize_fp8(q, &quant)?;
    let xsv = act_scale_view(s, &xs, m)?;
    let mut row = Row {
        name: s.name,
        m,
        flops: s.flops(m),
        bytes_bf16: s.bytes(m, 2.0, 2.0),
        bytes_w8: s.bytes(m, 1.0, 2.0),
        bytes_w8a8: s.bytes(m, 1.0, 1.0),
        bytes_quant: (g * m * k * 3 + g * m * blocks(k) * 4) as f64,
        parity: true,
        ..Row::default()
    };
    let p = match s.form {
        Form::Linear => Products::Linear {
            b16: MatmulBTArgs { out: o, a: xa, b: v.w16 },
            w8: MatmulBTFp8Args { out: o, a: xa, a_scale: None, b: v.w8, b_scale: v.w8s },
            w8a8: MatmulBTFp8Args { out: o, a: xq, a_scale: Some(xsv), b: v.w8, b_scale: v.w8s },
        },
        // The weights N-contiguous, as the block keeps W_UK_T / W_UV in 16 bits.
        Form::Absorbed => Products::Absorbed {
            b16: BatchedMatmulArgs { out: o, a: xa, b: v.w16 },
            w8: BatchedMatmulFp8Args { out: o, a: xa, a_scale: None, b: v.w8, b_scale: v.w8s },
            w8a8: BatchedMatmulFp8Args { out: o, a: xq, a_scale: Some(xsv), b: v.w8, b_scale: v.w8s },
        },
    };
    p.bf16_default(q)?;
    let cublas = GemmOptions { kernel: GemmKernel::Cublas, splits: None };
    let skinny = GemmOptions { kernel: GemmKernel::Skinny, splits };
    row.bf16_us = time(bench, iters, || p.bf16(q, &cublas))?;
    if m <= DECODE_MAX_M {
        let want = q.read_f64(&o)?;
        p.bf16(q, &skinny)?;
        row.err16 = vt_check::rel_fro_error(&q.read_f64(&o)?, &want);
        row.sk16_us = Some(time(bench, iters, || p.bf16(q, &skinny))?);
    }
    p.fp8_default(q, Act::Bf16)?;
    p.fp8_default(q, Act::Fp8)?;
    let mut errs = Vec::new();
    let gemv = Fp8Options { kernel: Kernel::Gemv, splits: None };
    p.fp8(q, Act::Bf16, &gemv)?;
    if check {
        errs.push(parity(q, s, w, m, &xa, None, &o)?);
    }
    row.w8_us = Some(time(bench, iters, || p.fp8(q, Act::Bf16, &gemv).map(|_| ()))?);
    if m <= DECODE_MAX_M {
        p.fp8(q, Act::Bf16, &sk8)?;
        if check {
            errs.push(parity(q, s, w, m, &xa, None, &o)?);
        }
        row.sk8_us = Some(time(bench, iters, || p.fp8(q, Act::Bf16, &sk8).map(|_| ()))?);
    }
    // Our tensor-core kernel: on the linear layers forced to Wgmma on sm_90 (Auto takes
    // cuBLASLt there unless VT_FP8_LT=0: the `lt` column below), Auto elsewhere (Mma on
    // sm_89/100); Auto on the BMMs.
    let sm90 = || q.downcast::<vt_cuda::CudaQueue>().is_some_and(|c| c.sm() == 90);
    let ours = if s.form == Form::Linear && sm90() { Kernel::Wgmma } else { Kernel::Auto };
    let ours = Fp8Options { kernel: ours, splits: None };
    let kernel = p.fp8(q, Act::Fp8, &ours)?;
    row.w8a8_kernel = format!("{kernel:?}");
    if check {
        errs.push(parity(q, s, w, m, &xq, Some(&xsv), &o)?);
    }
    row.w8a8_us = Some(time(bench, iters, || p.fp8(q, Act::Fp8, &ours).map(|_| ()))?);
    // cuBLASLt on the same operands (the activation scales are stored [KB, M], the weight
    // scales row-major: its layouts for these shapes); refused shapes print why. The linear
    // layers only: the absorbed BMMs are not routed to it.
    if s.form == Form::Linear {
        let lt = Fp8Options { kernel: Kernel::Lt, splits: None };
        match p.fp8(q, Act::Fp8, &lt) {
            Ok(_) => {
                if check {
                    errs.push(parity(q, s, w, m, &xq, Some(&xsv), &o)?);
                }
                row.lt_us = Some(time(bench, iters, || p.fp8(q, Act::Fp8, &lt).map(|_| ()))?);
            }
            Err(er) => lt_refused(s.name, m, &er),
        }
    }
    row.err = errs.into_iter().fold(0.0, f64::max);
    // The timing's last run leaves the first kernel's bytes in x8 / xs.
    row.quant_us = Some(time(bench, iters, || quantize_fp8_with(q, &quant, QuantKernel::Warp))?);
    // The wide quantize kernel beside the first one (forced, whatever VT_QUANT_WIDE says): its
    // bytes (into NaN-poisoned twins of the same views, which cover their buffers) against the
    // first one's, then its time.
    let (x8w, xsw) =
        (Buffer::nan(q, DType::F8E4M3, &[g * m * k])?, Buffer::nan(q, DType::F32, &[g * m * blocks(k)])?);
    let quant_w = QuantizeFp8Args {
        out: x8w.view().as_strided(0, &[m * g, k], &[k, 1])?,
        scale: quant_scale_view(s, &xsw, m)?,
        x: quant.x,
    };
    quantize_fp8_with(q, &quant_w, QuantKernel::Wide)?;
    row.quant_wide_same = x8w.to_bytes(q)? == x8.to_bytes(q)? && xsw.to_bytes(q)? == xs.to_bytes(q)?;
    row.quant_wide_us = Some(time(bench, iters, || quantize_fp8_with(q, &quant_w, QuantKernel::Wide))?);
    row.quant_auto_wide = auto_quant_kernel(m * g, k, quant.x.dtype()) == QuantKernel::Wide;
    let tol = vt_check::tolerance(OpId::MatmulBTFp8, DType::BF16).unwrap_or(2e-2);
    row.parity = (!check || row.err <= tol) && row.err16 <= tol;
    Ok(row)
}

/// Prints why cuBLASLt did not run a cell (once per GEMM).
fn lt_refused(name: &str, m: i64, e: &vt_core::Error) {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if !seen.iter().any(|n| n == name) {
        seen.push(name.to_string());
        eprintln!("lt: {name} M {m} not run on cuBLASLt: {e}");
    }
}

fn floor_us(bytes: f64, flops: f64, bw: f64, peak: f64) -> f64 {
    (bytes / bw).max(flops / peak) * 1e6
}

fn cell_str(us: Option<f64>, floor: f64) -> String {
    us.map_or("-".into(), |u| format!("{u:.1} ({:.0}%)", 100.0 * floor / u))
}

fn format_row(r: &Row, bw: f64, bf16_peak: f64, fp8_peak: f64) -> String {
    let (f16, f8, f8a8) = r.floors(bw, bf16_peak, fp8_peak);
    let wq = r.w8a8_quant();
    format!(
        "{:<9} M {:>5}  bf16 {:>14}  sk16 {:>14}  w8 {:>14}  sk8 {:>14}  w8a8[{}] {:>14}  lt {:>14}  quant {:>11} wide {:>11} {}  w8a8+q {:>14}  {:>5.0} TFLOP/s bf16, {:>5.0} fp8, {:>5.0} lt ({}x bf16)  parity {} ({:.1e}, sk16 {:.1e})",
        r.name,
        r.m,
        cell_str(Some(r.bf16_us), f16),
        cell_str(r.sk16_us, f16),
        cell_str(r.w8_us, f8),
        cell_str(r.sk8_us, f8),
        r.w8a8_kernel,
        cell_str(r.w8a8_us, f8a8),
        cell_str(r.lt_us, f8a8),
        cell_str(r.quant_us, r.bytes_quant / bw * 1e6),
        cell_str(r.quant_wide_us, r.bytes_quant / bw * 1e6),
        if r.quant_wide_same { "same bytes" } else { "BYTES DIFFER" },
        cell_str(wq, f8a8),
        r.flops / r.bf16_us / 1e6,
        r.w8a8_us.map_or(0.0, |u| r.flops / u / 1e6),
        r.lt_us.map_or(0.0, |u| r.flops / u / 1e6),
        r.lt_us.map_or("-".into(), |u| format!("{:.2}", r.bf16_us / u)),
        if r.parity { "PASS" } else { "FAIL" },
        r.err,
        r.err16
    )
}

/// One target of issue 17, item 2.
#[derive(Clone, Debug)]
struct Target {
    what: String,
    value: f64,
    limit: f64,
    unit: &'static str,
}

impl Target {
    fn ok(&self) -> bool {
        self.value >= self.limit
    }
    fn line(&self) -> String {
        format!(
            "{}: {:.2}{} (target >= {:.2}{}): {}",
            self.what,
            self.value,
            self.unit,
            self.limit,
            self.unit,
            if self.ok() { "ok" } else { "MISS" }
        )
    }
}

fn targets(rows: &[Row], bw: f64) -> Vec<Target> {
    let mut v = Vec::new();
    for r in rows {
        if r.m <= DECODE_MAX_M {
            // Issue 18: bf16 decode GEMMs (cuBLAS or the skinny kernel) at >= 85% of the bf16
            // weight-streaming floor.
            v.push(Target {
                what: format!("% of copy floor, bf16 {} M {}", r.name, r.m),
                value: 100.0 * (r.bytes_bf16 / bw * 1e6) / r.best_bf16(),
                limit: 85.0,
                unit: "%",
            });
            if let Some(us) = r.best_decode_fp8() {
                // The weight-streaming floor: the fp8 weight-only bytes at the copy ceiling.
                let pct = 100.0 * (r.bytes_w8 / bw * 1e6) / us;
                v.push(Target {
                    what: format!("% of copy floor, fp8 {} M {}", r.name, r.m),
                    value: pct,
                    limit: 85.0,
                    unit: "%",
                });
            }
        } else if r.m >= PREFILL_M {
            if let Some(us) = r.w8a8_us {
                let x = r.bf16_us / us;
                v.push(Target {
                    what: format!("fp8 w8a8 / bf16 cuBLAS TFLOP/s, {} M {}", r.name, r.m),
                    value: x,
                    limit: 1.4,
                    unit: "x",
                });
            }
            if let Some(us) = r.lt_us {
                v.push(Target {
                    what: format!("fp8 cuBLASLt / bf16 cuBLAS TFLOP/s, {} M {}", r.name, r.m),
                    value: r.bf16_us / us,
                    limit: 1.4,
                    unit: "x",
                });
            }
        }
    }
    v
}

fn summarize(rows: &[Row], tg: &[Target], bw: f64, bf16_peak: f64, fp8_peak: f64) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "\n| GEMM | M | bf16 cuBLAS us (% floor) | bf16 skinny us (% floor) | fp8 w8 Gemv us (% floor) | fp8 w8 skinny us (% floor) | fp8 w8a8 us (% floor) | fp8 cuBLASLt us (% floor) | quantize us (% copy floor) | quantize wide us (% copy floor) | best w8a8 + quantize us | bf16 TFLOP/s | w8a8 TFLOP/s | cuBLASLt TFLOP/s | cuBLASLt / bf16 | parity |");
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let (f16, f8, f8a8) = r.floors(bw, bf16_peak, fp8_peak);
        let wq = r.w8a8_quant();
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {}{} | {} | {:.0} | {} | {} | {} | {} ({:.1e}) |",
            r.name,
            r.m,
            cell_str(Some(r.bf16_us), f16),
            cell_str(r.sk16_us, f16),
            cell_str(r.w8_us, f8),
            cell_str(r.sk8_us, f8),
            cell_str(r.w8a8_us, f8a8),
            r.w8a8_kernel,
            cell_str(r.lt_us, f8a8),
            cell_str(r.quant_us, r.bytes_quant / bw * 1e6),
            cell_str(r.quant_wide_us, r.bytes_quant / bw * 1e6),
            if r.quant_wide_same { "" } else { " BYTES DIFFER" },
            cell_str(wq, f8a8),
            r.flops / r.bf16_us / 1e6,
            r.w8a8_us.map_or("-".into(), |u| format!("{:.0}", r.flops / u / 1e6)),
            r.lt_us.map_or("-".into(), |u| format!("{:.0}", r.flops / u / 1e6)),
            r.lt_us.map_or("-".into(), |u| format!("{:.2}x", r.bf16_us / u)),
            if r.parity { "PASS" } else { "FAIL" },
            r.err.max(r.err16)
        );
    }
    // The decode step: every decode GEMM of one layer at each decode M.
    let mut ms: Vec<i64> = rows.iter().filter(|r| r.m <= DECODE_MAX_M).map(|r| r.m).collect();
    ms.sort();
    ms.dedup();
    for m in ms {
        let at: Vec<&Row> = rows.iter().filter(|r| r.m == m).collect();
        let bf: f64 = at.iter().map(|r| r.bf16_us).sum();
        let bf_best: f64 = at.iter().map(|r| r.best_bf16()).sum();
        let bytes16: f64 = at.iter().map(|r| r.bytes_bf16).sum();
        let f8: Option<f64> = at.iter().map(|r| r.best_decode_fp8()).sum();
        let bytes8: f64 = at.iter().map(|r| r.bytes_w8).sum();
        let _ = writeln!(
            o,
            "decode step GEMMs at M {m} ({}): bf16 cuBLAS {bf:.1} us, bf16 best {bf_best:.1} us (floor {:.1} us), fp8 best {} (weight-streaming floor {:.1} us)",
            at.iter().map(|r| r.name).collect::<Vec<_>>().join(" + "),
            bytes16 / bw * 1e6,
            f8.map_or("-".into(), |u| format!("{u:.1} us")),
            bytes8 / bw * 1e6
        );
    }
    let _ = writeln!(o, "\ntargets (issue 17, item 2; issue 18, item 3 for bf16):");
    for t in tg {
        let _ = writeln!(o, "  {}", t.line());
    }
    let miss = tg.iter().filter(|t| !t.ok()).count();
    let _ = writeln!(o, "{} of {} targets met", tg.len() - miss, tg.len());
    o
}

/// One row of the peer's JSON (tools/peers/fp8_blockwise_gemm.py): torch's times in us.
#[derive(Clone, Debug, PartialEq)]
struct PeerRow {
    gemm: String,
    m: i64,
    bf16_us: f64,
    /// `None` where torch refused the shape (`error` in the file).
    fp8_us: Option<f64>,
    error: Option<String>,
    /// DeepGEMM's `fp8_gemm_nt` (the same scales), where it was built and ran
    /// (tools/peers/build_deepgemm.sh); else its error, if any.
    deepgemm_us: Option<f64>,
    deepgemm_error: Option<String>,
}

/// The peer file: its name, rows and how it cleared the L2 (its `l2_flush`).
#[derive(Clone, Debug, PartialEq)]
struct Peer {
    name: String,
    rows: Vec<PeerRow>,
    flush: L2Flush,
}

/// Parses `{"peer": NAME, "rows": [{"gemm", "m", "bf16_ms", "fp8_ms"?, "error"?, "deepgemm_ms"?,
/// "deepgemm_error"?}]}`.
fn parse_peer(text: &str) -> Result<Peer, String> {
    let (name, rows) = peer_json::parse(text, |r| {
        let us = |k: &str| r.pos_num(k).map(|ms| ms * 1e3);
        let text = |k: &str| r.str(k).map(str::to_string);
        Ok(PeerRow {
            gemm: r.need_str("gemm")?,
            m: r.pos_int("m")?,
            bf16_us: r.need_pos_num("bf16_ms")? * 1e3,
            fp8_us: us("fp8_ms"),
            error: text("error"),
            deepgemm_us: us("deepgemm_ms"),
            deepgemm_error: text("deepgemm_error"),
        })
    })?;
    Ok(Peer { name, rows, flush: peer_json::l2_flush(text)? })
}

/// vt beside the peer on the (GEMM, M) cells both have.
fn peer_table(rows: &[Row], p: &Peer) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "\npeer: {} (same device call)", p.name);
    let _ = writeln!(o, "| GEMM | M | vt bf16 cuBLAS us | torch bf16 us | vt w8a8 us | vt cuBLASLt us | torch fp8 blockwise us | vt best fp8 / torch fp8 | DeepGEMM us | vt best fp8 / DeepGEMM |");
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let Some(pr) = p.rows.iter().find(|x| x.gemm == r.name && x.m == r.m) else { continue };
        let us = |x: Option<f64>| x.map_or("-".to_string(), |u| format!("{u:.1}"));
        // A peer's time, or why it has none.
        let peer_us = |us: Option<f64>, err: &Option<String>| match (us, err) {
            (Some(u), _) => format!("{u:.1}"),
            (None, Some(e)) => format!("- ({})", e.chars().take(60).collect::<String>()),
            (None, None) => "-".into(),
        };
        // Speed-ups: the peer's time over ours (above 1: vt is faster).
        let speedup = |peer: Option<f64>| {
            r.best_w8a8().zip(peer).map_or("-".to_string(), |(a, b)| format!("{:.2}x", b / a))
        };
        let (torch8, ratio) = (peer_us(pr.fp8_us, &pr.error), speedup(pr.fp8_us));
        let (dg, dg_ratio) = (peer_us(pr.deepgemm_us, &pr.deepgemm_error), speedup(pr.deepgemm_us));
        let _ = writeln!(
            o,
            "| {} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.m,
            r.bf16_us,
            pr.bf16_us,
            us(r.w8a8_us),
            us(r.lt_us),
            torch8,
            ratio,
            dg,
            dg_ratio
        );
    }
    o
}

fn num(x: Option<f64>) -> String {
    x.map_or("null".into(), |v| format!("{v:.3}"))
}

fn to_json(
    rows: &[Row],
    tg: &[Target],
    bw: f64,
    bf16_peak: f64,
    (ours, lt): (Option<f64>, Option<f64>),
    device: &str,
) -> String {
    let mut o = format!(
        "{{\"device\": {device:?}, \"copy_gbps\": {:.1}, \"bf16_tflops\": {:.1}, \"fp8_wgmma_tflops\": {}, \"fp8_lt_tflops\": {}, \"rows\": [\n",
        bw / 1e9,
        bf16_peak / 1e12,
        num(ours.map(|r| r / 1e12)),
        num(lt.map(|r| r / 1e12))
    );
    for (i, r) in rows.iter().enumerate() {
        let _ = writeln!(
            o,
            "  {{\"gemm\": {:?}, \"m\": {}, \"bf16_us\": {:.3}, \"sk16_us\": {}, \"w8_us\": {}, \"sk8_us\": {}, \"w8a8_us\": {}, \"w8a8_kernel\": {:?}, \"lt_us\": {}, \"quant_us\": {}, \"quant_wide_us\": {}, \"quant_wide_same\": {}, \"flops\": {:.0}, \"bytes_bf16\": {:.0}, \"bytes_w8\": {:.0}, \"bytes_w8a8\": {:.0}, \"err\": {:.3e}, \"err16\": {:.3e}, \"parity\": {}}}{}",
            r.name,
            r.m,
            r.bf16_us,
            num(r.sk16_us),
            num(r.w8_us),
            num(r.sk8_us),
            num(r.w8a8_us),
            r.w8a8_kernel,
            num(r.lt_us),
            num(r.quant_us),
            num(r.quant_wide_us),
            r.quant_wide_same,
            r.flops,
            r.bytes_bf16,
            r.bytes_w8,
            r.bytes_w8a8,
            r.err,
            r.err16,
            r.parity,
            if i + 1 < rows.len() { "," } else { "" }
        );
    }
    o.push_str("], \"targets\": [\n");
    for (i, t) in tg.iter().enumerate() {
        let _ = writeln!(
            o,
            "  {{\"what\": {:?}, \"value\": {:.3}, \"limit\": {:.3}, \"ok\": {}}}{}",
            t.what,
            t.value,
            t.limit,
            t.ok(),
            if i + 1 < tg.len() { "," } else { "" }
        );
    }
    o.push_str("]}\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layer_gemms_and_their_counts() {
        let g = gemms();
        let a = g.iter().find(|x| x.name == "a_proj").unwrap();
        assert_eq!((a.n, a.k), (2112, 7168));
        // 374 MB of bf16 weights in a decode step's GEMMs (issue 17): a_proj + q_b + o_proj + the two absorbed.
        let bf16: f64 = g.iter().filter(|x| x.decode).map(|x| 2.0 * (x.g * x.n * x.k) as f64).sum();
        assert!((bf16 / 1e6 - 374.2).abs() < 0.1, "{bf16}");
        // fp8 bytes are half plus the scales.
        assert!(
            (a.bytes(1, 1.0, 2.0) - (2112.0 * 7168.0 + 4.0 * 17.0 * 56.0 + 2.0 * 7168.0 + 2.0 * 2112.0))
                .abs()
                < 1.0
        );
        assert_eq!(a.flops(4096), 2.0 * 4096.0 * 2112.0 * 7168.0);
        assert!(runs_at(a, 1) && runs_at(a, 4096));
        let kv_b = g.iter().find(|x| x.name == "kv_b").unwrap();
        assert!(!runs_at(kv_b, 8) && runs_at(kv_b, 4096));
    }

    #[test]
    fn the_peer_file_parses_and_refuses_bad_rows() {
        let p = parse_peer(
            r#"{"peer": "torch x", "rows": [{"gemm": "q_b", "m": 4096, "bf16_ms": 0.4, "fp8_ms": 0.25},
                {"gemm": "kv_b", "m": 4096, "bf16_ms": 0.2, "error": "no"}]}"#,
        )
        .unwrap();
        assert_eq!(p.name, "torch x");
        assert_eq!(p.rows[0].fp8_us, Some(250.0));
        assert_eq!((p.rows[1].fp8_us, p.rows[1].error.as_deref()), (None, Some("no")));
        assert_eq!((p.rows[0].deepgemm_us, p.rows[1].deepgemm_us), (None, None));
        let p = parse_peer(
            r#"{"rows": [{"gemm": "q_b", "m": 4096, "bf16_ms": 0.4, "deepgemm_ms": 0.2},
                {"gemm": "a_proj", "m": 1, "bf16_ms": 0.02, "deepgemm_error": "not built"}]}"#,
        )
        .unwrap();
        assert_eq!(p.rows[0].deepgemm_us, Some(200.0));
        assert_eq!((p.rows[1].deepgemm_us, p.rows[1].deepgemm_error.as_deref()), (None, Some("not built")));
        // A file without "l2_flush" was timed by do_bench (a write flush): this bench's default
        // (a read flush) refuses it; `--clean-flush`'s file matches.
        assert_eq!(p.flush, L2Flush::Write);
        assert!(peer_json::same_flush(p.flush, L2Flush::Read, "c", "d").is_err());
        let clean = parse_peer(r#"{"l2_flush": "read", "rows": [{"gemm": "q_b", "m": 1, "bf16_ms": 0.02}]}"#);
        assert_eq!(clean.map(|p| p.flush), Ok(L2Flush::Read));
        assert!(parse_peer(r#"{"rows": [{"gemm": "q_b", "m": 0, "bf16_ms": 1}]}"#).is_err());
        assert!(parse_peer(r#"{"rows": [{"gemm": "q_b", "m": 1}]}"#).is_err());
        assert!(parse_peer("[]").is_err());
    }

    #[test]
    fn codes_hold_no_nan() {
        assert!(codes(5, 100_000).iter().all(|&b| b & 0x7f != 0x7f));
    }
}
