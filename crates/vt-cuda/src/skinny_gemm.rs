//! The skinny (decode-shaped) GEMM of `kernels-cuda/skinny_gemm.cu`: `out[g] = A[g] . W[g]^T`
//! for few tokens, with the weight streamed once in the swap-AB form (weight rows on the
//! MMA's M side, tokens on its N side). It serves
//!
//! - MatmulBT and BatchedMatmul with 16-bit weights ([`matmul_bt_with`],
//!   [`batched_matmul_with`]; the ops call them with [`GemmKernel::Auto`]), beside cuBLAS;
//! - MatmulBTFp8 / BatchedMatmulFp8 weight-only (e4m3 weights, 128 x 128 f32 block scales,
//!   16-bit activations) as `fp8_matmul::Kernel::Skinny`.
//!
//! Needs: bf16/f16 activations and outputs, K-contiguous activation rows and weight rows
//! (stride 1 along K; 16-bit weights may instead be N-contiguous, as the block keeps the
//! absorbed W_UK_T / W_UV, with N % 8 == 0) whose starts are 16-byte aligned, K % 8 == 0
//! (16-bit weights) or K % 16 == 0 (fp8). Outputs take any strides.
//!
//! Plan: a CTA is 64 weight rows x 8 NT tokens (NT = 1, 2, 4, 8: the fewest fragments that
//! hold min(M, 64) tokens; more tokens are more token blocks, adjacent in the grid so the
//! second reads the weights from L2) x a range of 128-wide K chunks. K is split over CTAs
//! when the rows and tokens alone make too few CTAs: the split count minimizes
//! waves x chunks per CTA over the device's CTA slots (ties to fewer splits). The splits of
//! a tile are reduced in the same launch by the last CTA to arrive, in split order
//! (deterministic), through a per-queue workspace of counters (zeroed once; every launch
//! leaves them zero) and f32 partials.
//!
//! TMA form (sm_90, `VT_SKINNY_TMA`, on by default): fp8 weights at up to 32 tokens whose K
//! has 8+ chunks run `skinny_w8tma_*`, the same tile fed by a producer warp through 3-D TMA maps
//! of the weight and the activations (boxes of 64 rows x 128 bytes and 64 elements x 8 NT
//! tokens, 128-byte swizzle, zeros past N, M and K) into a 4-7 deep mbarrier ring whose depth
//! the plan picks with the K splits (`tma_plan`: shallower rings fit more CTAs an SM, so a
//! split grid can run in one wave).
//!
//! [`GemmKernel::Auto`] (the ops) takes the skinny kernel where `VT_SKINNY_GEMM` is on (the
//! default), the views allow, and M is at most [`auto_max_m`] for the shape (measured on the
//! H200, see docs/perf.md: 0 for 16-bit weights, which stay on cuBLAS; 128 for fp8
//! weight-only); else cuBLAS (16-bit) or the fp8 ops' other kernels.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use vt_core::{BatchedMatmulArgs, DType, Error, MatmulBTArgs, OpId, Queue, Result, Tensor};

use crate::launch::TensorMapSpec;
use crate::rope_from_cache::int;
use crate::scratch::{self, Fill, PerQueue};
use crate::{kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("skinny_gemm");

/// `skinny::THREADS`, `ROWS`, `CHUNK` of the kernel file.
const THREADS: i64 = 128;
const ROWS: i64 = 64;
const CHUNK: i64 = 128;
/// Split-K tile counters at the start of the workspace (u32 each); a plan with more tiles
/// does not split.
const COUNTERS: i64 = 1 << 16;
/// Split-K partials are capped at this many bytes.
const MAX_PARTIAL_BYTES: i64 = 128 << 20;

/// The ring's depth (`skinny::stages_of`): 4; 3 at 8 token fragments; 6 for fp8 weights at
/// up to 2.
fn stages(kind: WeightKind, nt: i64) -> i64 {
    match (kind, nt) {
        (_, 8..) => 3,
        (WeightKind::W8, ..=2) => 6,
        _ => 4,
    }
}

/// Dynamic shared memory of a CTA that runs `chunks` K chunks: min(chunks, stages) stages of
/// (weights + 8 NT activation rows), as `skinny::stage_bytes` counts them (a CTA of fewer
/// chunks than the ring's depth touches only its first stages).
pub(crate) fn smem_for(kind: WeightKind, nt: i64, chunks: i64) -> i64 {
    let (astr, pieces) = match kind {
        WeightKind::W16 => (320, 8),
        WeightKind::W8 => (272, 4),
        WeightKind::W16N => (272, 8),
    };
    chunks.clamp(1, stages(kind, nt)) * (4 * pieces * 32 * 16 + 8 * nt * astr)
}

/// The TMA form streams a ring where K has at least this many 128-wide chunks (the linear
/// projections: 12-128); the absorbed BMMs (1 and 4 chunks) measured the same or up to 6%
/// slower on it (H200, docs/perf.md "Fourteenth session") and keep the cp.async form.
const TMA_MIN_CHUNKS: i64 = 8;

/// The TMA form's deepest ring (`skinny::tma_stages`, the size of its mbarrier arrays): 7
/// stages at 8 tokens, 6 at 16, 4 at 32 (three CTAs an SM); [`tma_plan`] picks the depth.
fn tma_stages(nt: i64) -> i64 {
    match nt {
        1 => 7,
        2 => 6,
        _ => 4,
    }
}

/// Dynamic shared memory of the TMA form for a CTA of `chunks` K chunks (`skinny::tma_smem`):
/// 1024 bytes of alignment slack and min(chunks, stages) ring stages (a 64 x 128-byte weight box
/// and two 64-element x 8 NT-token activation boxes each; the mbarriers are static).
pub(crate) fn tma_smem(nt: i64, chunks: i64) -> i64 {
    1024 + chunks.clamp(1, tma_stages(nt)) * (ROWS * CHUNK + 2 * 8 * nt * 128)
}

/// TMA-form CTAs an SM: by shared memory, and by registers (160 threads of 62 / 86 / 128 at
/// NT 1 / 2 / 4, NVRTC sm_90a: at most 6 / 4 / 3; the shallow-ring kernels' 70 / 92 allow 5 / 4,
/// and their rings of 4+ stages hold an SM to 5 / 4 by shared memory anyway).
fn tma_per_sm(nt: i64, chunks: i64) -> i64 {
    per_sm(tma_smem(nt, chunks)).min(match nt {
        1 => 6,
        2 => 4,
        _ => 3,
    })
}

/// How the kernel reads the weight (`skinny::W16`, `W8`, `W16N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WeightKind {
    /// 16-bit, K-contiguous rows.
    W16,
    /// e4m3 codes, K-contiguous rows, with block scales.
    W8,
    /// 16-bit, N-contiguous (stride 1 along N: the absorbed W_UK_T / W_UV as the block keeps
    /// them), fragments by ldmatrix.trans.
    W16N,
}

/// Which kernel computes a 16-bit MatmulBT / BatchedMatmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmKernel {
    /// The measured rule: the skinny kernel at small M where it applies, else cuBLAS.
    Auto,
    /// cuBLAS (or the strided fallback kernel for views cuBLAS cannot express).
    Cublas,
    /// The skinny swap-AB kernel (an error where the views do not allow it).
    Skinny,
}

/// How a 16-bit matmul runs: the kernel and, for the skinny kernel, the K splits (`None`:
/// chosen from the device's SM count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmOptions {
    pub kernel: GemmKernel,
    pub splits: Option<u32>,
}

/// The largest M for which Auto takes the skinny kernel, per shape and weight type
/// (measured: docs/perf.md, "Decode GEMMs"). 16-bit weights: 0 (cuBLAS), since cuBLAS was
/// ahead or tied at every measured shape. fp8 weight-only: 128 (the kernel's M limit): v3
/// beat or tied the Gemv kernel in 23 of 25 cells of the H200 bench (q_b M 128: 63.1 against
/// 224.2 us) and passed its GPU tests (`skinny_gemm` 7/7, `fp8_matmul` 14/14, 2026-12-02).
/// `VT_SKINNY_GEMM16` on: 128 for 16-bit weights too.
pub fn auto_max_m(w8: bool, _n: i64, _k: i64) -> i64 {
    if w8 || vt_core::flags::skinny_gemm16() {
        128
    } else {
        0
    }
}

/// One skinny problem in logical terms: `out[g, m, n] = sum_k a[g, m, k] w[g, n, k]`
/// (times the block scales for fp8 weights). Strides in elements, `[batch, row, col]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Problem {
    pub op: OpId,
    /// The activations' and output's type.
    pub dtype: DType,
    pub out: (u64, [i64; 3]),
    pub a: (u64, [i64; 3]),
    /// `[g, n, k]`, 16-bit (the activations' type) or e4m3.
    pub w: (u64, [i64; 3]),
    pub w8: bool,
    /// `[g, n / 128, k / 128]` f32 (fp8 weights).
    pub ws: Option<(u64, [i64; 3])>,
    pub g: i64,
    pub m: i64,
    pub n: i64,
    pub k: i64,
}

impl Problem {
    pub(crate) fn of_matmul_bt(x: &MatmulBTArgs<'_>) -> Problem {
        let t = |v: &Tensor<'_>| (v.data_addr(), [0, v.stride(0), v.stride(1)]);
        Problem {
            op: OpId::MatmulBT,
            dtype: x.out.dtype(),
            out: t(&x.out),
            a: t(&x.a),
            w: t(&x.b),
            w8: false,
            ws: None,
            g: 1,
            m: x.a.dim(0),
            n: x.b.dim(0),
            k: x.a.dim(1),
        }
    }

    pub(crate) fn of_batched(x: &BatchedMatmulArgs<'_>) -> Problem {
        let t = |v: &Tensor<'_>| (v.data_addr(), [v.stride(0), v.stride(1), v.stride(2)]);
        let b = &x.b; // [g, k, n]: the kernel's w[g, n, k]
        Problem {
            op: OpId::BatchedMatmul,
            dtype: x.out.dtype(),
            out: t(&x.out),
            a: t(&x.a),
            w: (b.data_addr(), [b.stride(0), b.stride(2), b.stride(1)]),
            w8: false,
            ws: None,
            g: x.a.dim(0),
            m: x.a.dim(1),
            n: x.b.dim(2),
            k: x.a.dim(2),
        }
    }

    /// How the kernel reads the weight (valid where [`Problem::unsupported`] is `None`).
    pub(crate) fn kind(&self) -> WeightKind {
        match (self.w8, self.w.1[2] == 1) {
            (true, _) => WeightKind::W8,
            (false, true) => WeightKind::W16,
            (false, false) => WeightKind::W16N,
        }
    }

    /// Whether every row and batch step of the activations and the weight moves forward (a
    /// stride of 0 broadcasts a row: the cp.async form reads such views, a TMA map does not
    /// take them).
    fn steps_forward(&self) -> bool {
        let fwd = |s: [i64; 3], rows: i64| (rows <= 1 || s[1] > 0) && (self.g <= 1 || s[0] > 0);
        fwd(self.a.1, self.m) && fwd(self.w.1, self.n)
    }

    /// The TMA map of the fp8 weight (`skinny::Maps::w`): bytes (K, N, G), boxes of 128 x 64 x 1.
    fn tma_map_w(&self) -> TensorMapSpec {
        map_3d("b", DType::F8E4M3, self.w.0, (self.k, self.n, self.g), 1, self.w.1, [128, ROWS as u32, 1])
    }

    /// The TMA map of the activations (`skinny::Maps::a`): (K, M, G) elements, boxes of
    /// 64 x 8 NT x 1 (two per 128-wide chunk).
    fn tma_map_a(&self, nt: i64) -> TensorMapSpec {
        map_3d("a", self.dtype, self.a.0, (self.k, self.m, self.g), 2, self.a.1, [64, 8 * nt as u32, 1])
    }

    /// Why the skinny kernel cannot take this problem, or `None` when it can.
    pub(crate) fn unsupported(&self) -> Option<String> {
        if !matches!(self.dtype, DType::BF16 | DType::F16) {
            return Some(format!("bf16/f16 activations (got {})", self.dtype));
        }
        let kmod = if self.w8 { 16 } else { 8 };
        if self.k <= 0 || self.k % kmod != 0 {
            return Some(format!("K > 0 and a multiple of {kmod} (got {})", self.k));
        }
        let es_w = if self.w8 { 1 } else { 2 };
        // Rows along K unit-stride, every row (and batch entry) start 16-byte aligned.
        let aligned = |(addr, s): (u64, [i64; 3]), es: i64, rows: i64| {
            s[2] == 1
                && addr % 16 == 0
                && (rows <= 1 || (s[1] * es) % 16 == 0)
                && (self.g <= 1 || (s[0] * es) % 16 == 0)
        };
        if !aligned(self.a, 2, self.m) {
            return Some("K-contiguous activation rows starting 16-byte aligned".into());
        }
        let (wa, ws) = self.w;
        let n_contiguous = (wa, [ws[0], ws[2], ws[1]]);
        if !aligned(self.w, es_w, self.n) && (self.w8 || !aligned(n_contiguous, 2, self.k)) {
            return Some(
                "K-contiguous (or, 16-bit, N-contiguous) weight rows starting 16-byte aligned".into(),
            );
        }
        if self.kind() == WeightKind::W16N && self.n % 8 != 0 {
            return Some(format!("N a multiple of 8 for N-contiguous weights (got {})", self.n));
        }
        if [self.m, self.n, self.k].iter().any(|&v| v > i32::MAX as i64) {
            return Some("M, N and K within i32".into());
        }
        None
    }
}

/// A 128-byte-swizzled 3-D TMA map of a `[g, rows, k]` operand with element strides `s`
/// (`s[2]` = 1; [`Problem::unsupported`] has checked that the row and batch strides are
/// 16-byte multiples wherever there is more than one row / batch entry). A single row or batch
/// entry is never stepped over, so its stride is only given a valid value.
fn map_3d(
    what: &'static str,
    dtype: DType,
    addr: u64,
    (k, rows, g): (i64, i64, i64),
    es: i64,
    s: [i64; 3],
    boxes: [u32; 3],
) -> TensorMapSpec {
    let row = if rows > 1 { s[1] * es } else { (k * es + 15) / 16 * 16 };
    let batch = if g > 1 { s[0] * es } else { row * rows.max(1) };
    TensorMapSpec {
        what,
        dtype,
        addr,
        dims: [k as u64, rows as u64, g.max(1) as u64],
        strides: [row as u64, batch as u64],
        boxes,
        swizzle: true,
    }
}

/// The token fragments (of 8) per CTA: the fewest of 1, 2, 4, 8 that hold min(M, 64).
fn fragments(m: i64) -> i64 {
    match m {
        ..=8 => 1,
        9..=16 => 2,
        17..=32 => 4,
        _ => 8,
    }
}

fn cdiv(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// CTAs resident per SM, from the shared memory (227 KB usable on the H100/H200) and a cap.
fn per_sm(smem: i64) -> i64 {
    ((227 << 10) / (smem + 1024)).clamp(1, 8)
}

/// The cost of `base` CTAs over `chunks` 128-chunks cut `s` ways on `slots` resident CTAs,
/// and the splits that cut really makes (`chunks` in equal runs): waves x (chunks per CTA + 2)
/// (a CTA costs about two chunks more than its chunks, filling the ring), +1 for a split (the
/// partials' round trip and the reduction).
fn split_cost(base: i64, chunks: i64, slots: i64, s: i64) -> (i64, i64) {
    let per = cdiv(chunks, s.max(1));
    let s_eff = cdiv(chunks, per);
    (cdiv(base * s_eff, slots.max(1)) * (per + 2) + i64::from(s_eff > 1), s_eff)
}

/// K splits for `base` CTAs over `chunks` 128-chunks on `slots` resident CTAs: the count
/// minimizing [`split_cost`] (ties: fewer splits), within `max`.
fn choose_splits(base: i64, chunks: i64, slots: i64, max: i64) -> i64 {
    let mut best = (i64::MAX, 1);
    for s in 1..=max.min(chunks).max(1) {
        let (cost, s_eff) = split_cost(base, chunks, slots, s);
        if cost < best.0 {
            best = (cost, s_eff);
        }
    }
    best.1
}

/// The shallowest ring the TMA form's planner gives a CTA. H200, "Fourteenth session": rings of
/// 4 (5 CTAs an SM, one wave of 560 CTAs at 5 K splits) ran o_proj at M 1 / 8 / 16 in 38.4 /
/// 37.3 / 38.9 us against 40.4 / 40.8 / 42.6 with the full ring (3 CTAs an SM, two waves at 7
/// splits); shallower rings were not measured. At NT 4 the deepest ring is this one, and the
/// kernel takes that depth as a constant (`FIXED` in skinny_gemm.cu: keep them in step).
const TMA_MIN_DEPTH: i64 = 4;

/// Ring stages an SM should have in flight (resident CTAs x stages each) before a shallower
/// ring is taken: q_b at M 1 (384 CTAs, about 3 an SM) ran 21.2 us with 4 stages a CTA (12 an
/// SM) against 16.0 with 7 (21 an SM), same call as above.
const TMA_MIN_SM_STAGES: i64 = 16;

/// The K splits that give each SM one CTA of a full ring, where the row blocks are few
/// (`base` at most half the SMs) and some split count fills 90%+ of the SMs with one CTA each:
/// `sms / base` splits whose CTAs hold at least `depth` chunks. H100, twenty-fifth session, a_proj
/// 2112 x 7168 at M 1 / 8 (33 row blocks, 56 chunks), forced splits against the wave planner's
/// 12 (14.9 / 14.7 us): 4 splits (132 CTAs of 14 chunks) 13.3 / 13.5, 3 14.2 / 14.0, 6 14.5 /
/// 14.3, 8 14.7 / 14.7; under ncu DRAM throughput 40% at 4 splits against 35% at 12 (several
/// CTAs an SM share its bandwidth, each paying its own start and a slice of the reduction). As
/// the plan, same call pattern, against the wave plan: a_proj 5-8% faster at M 1 / 8, 17% at 16
/// and 22% at 32 (16.4 -> 13.6, 21.6 -> 16.9 us).
fn one_cta_an_sm(base: i64, chunks: i64, sms: i64, cap: i64, depth: i64) -> Option<i64> {
    let want = sms / base.max(1);
    if want < 2 || want > cap.min(chunks) {
        return None;
    }
    let cpb = cdiv(chunks, want);
    let splits = cdiv(chunks, cpb);
    let ctas = base * splits;
    (10 * ctas >= 9 * sms && ctas <= sms && cpb >= depth).then_some(splits)
}

/// The TMA form's ring depth and K splits for `base` CTAs over `chunks` chunks on `sms` SMs.
/// Per depth, from the deepest ring (`tma_stages`) down to [`TMA_MIN_DEPTH`]: the splits
/// (`forced`, else [`choose_splits`] on that depth's resident-CTA slots) and their
/// [`split_cost`]; the cheapest plan wins, ties to the deeper ring. A shallower ring must cost
/// at most 85% of the best deeper ring's plan (the cost counts waves and chunks, not what a
/// shallower ring itself costs) and keep [`TMA_MIN_SM_STAGES`] stages in flight an SM. H100,
/// twenty-fifth session, against the fixed rings in the same call: o_proj (cost ratios 0.67 /
/// 0.81 at M 1-8 / 9-16) ran 5.5-7% faster; a_proj 2112 x 7168 at M 1-16 (0.875: 14 splits on
/// rings of 4 against 12 on 5) ran 2-5% slower, so the margin keeps it on the deeper ring.
/// Returns (depth, splits); the depth is at most the chunks a CTA runs.
fn tma_plan(nt: i64, base: i64, chunks: i64, sms: i64, cap: i64, forced: Option<i64>) -> (i64, i64) {
    let deepest = tma_stages(nt);
    if forced.is_none() {
        if let Some(splits) = one_cta_an_sm(base, chunks, sms, cap, deepest) {
            return (deepest, splits);
        }
    }
    let mut best: Option<(i64, i64, i64)> = None; // (cost, depth, splits)
    for depth in (TMA_MIN_DEPTH.min(deepest)..=deepest).rev() {
        let per_sm = tma_per_sm(nt, chunks.min(depth));
        let slots = sms.max(1) * per_sm;
        let want = forced.unwrap_or_else(|| choose_splits(base, chunks, slots, cap));
        let (cost, splits) = split_cost(base, chunks, slots, want);
        let cpb = cdiv(chunks, splits);
        let resident = per_sm.min(cdiv(base * splits, sms.max(1)));
        let shallow_ok =
            |deep_cost: i64| 100 * cost <= 85 * deep_cost && resident * depth.min(cpb) >= TMA_MIN_SM_STAGES;
        match best {
            None => best = Some((cost, depth, splits)),
            Some((c, ..)) if cost < c && shallow_ok(c) => best = Some((cost, depth, splits)),
            _ => {}
        }
    }
    let (_, depth, splits) = best.unwrap_or((0, deepest, 1));
    (depth.min(cdiv(chunks, splits)).max(1), splits)
}

/// The launch of one skinny problem and the workspace it needs (f32 elements, counters
/// included; 0 when K is not split). `ws` is the workspace's address (0 to learn the size).
/// `tma`: the device and `VT_SKINNY_TMA` allow the TMA form (sm_90), which fp8 weights at up
/// to 32 tokens then take where K has `TMA_MIN_CHUNKS` chunks or more and the views step
/// forward. Plain data, no device (the PTX check compares it with the kernels'
/// parameter lists).
pub(crate) fn plan(
    sms: u32,
    tma: bool,
    p: &Problem,
    splits: Option<u32>,
    ws: u64,
) -> Result<(Vec<Launch>, i64)> {
    if let Some(why) = p.unsupported() {
        return Err(Error::invalid(
            p.op,
            "a",
            format!("the skinny kernel needs {why}; M {}, N {}, K {}", p.m, p.n, p.k),
        ));
    }
    if p.g == 0 || p.m == 0 || p.n == 0 {
        return Ok((Vec::new(), 0));
    }
    let nt = fragments(p.m);
    let tb = cdiv(p.m, 8 * nt);
    let rb = cdiv(p.n, ROWS);
    let chunks = cdiv(p.k, CHUNK);
    let base = tb * rb * p.g;
    let tiles = base;
    let per_tile = THREADS * nt * 4; // f32 partials of one tile and split
    let cap = if tiles > COUNTERS { 1 } else { (MAX_PARTIAL_BYTES / 4 / (tiles * per_tile)).clamp(1, 64) };
    let kind = p.kind();
    let tma = tma && kind == WeightKind::W8 && nt <= 4 && chunks >= TMA_MIN_CHUNKS && p.steps_forward();
    let forced = splits.map(|s| (s.max(1) as i64).min(chunks).min(cap));
    let (depth, want) = if tma {
        tma_plan(nt, base, chunks, sms as i64, cap, forced)
    } else {
        // Slots as for a CTA of all the chunks (short-K problems get more CTAs an SM).
        let slots = sms.max(1) as i64 * per_sm(smem_for(kind, nt, chunks));
        (0, forced.unwrap_or_else(|| choose_splits(base, chunks, slots, cap)))
    };
    let cpb = cdiv(chunks, want);
    let splits = cdiv(chunks, cpb);
    let z = p.g * splits;
    if rb > 65535 || z > 65535 || tb > i32::MAX as i64 {
        return Err(Error::invalid(
            p.op,
            "b",
            format!("N {} / G {} x {splits} K splits exceed the skinny kernel's grid", p.n, p.g),
        ));
    }
    let need = if splits > 1 { COUNTERS + tiles * splits * per_tile } else { 0 };
    let (part, counters) = if splits > 1 { (ws + 4 * COUNTERS as u64, ws) } else { (0, 0) };
    let (ws_addr, ws_s) = p.ws.unwrap_or((0, [0; 3]));
    let grid = (tb as u32, rb as u32, z as u32);
    // Both forms: out[g, m, n], then (form's operands), then the scales, sizes and split-K.
    let out: [Arg; 4] = [p.out.0.into(), p.out.1[0].into(), p.out.1[1].into(), p.out.1[2].into()];
    let rest: [Arg; 11] = [
        ws_addr.into(),
        ws_s[0].into(),
        ws_s[1].into(),
        ws_s[2].into(),
        int(p.op, "a", p.m)?.into(),
        int(p.op, "b", p.n)?.into(),
        int(p.op, "a", p.k)?.into(),
        (cpb as i32).into(),
        (splits as i32).into(),
        part.into(),
        counters.into(),
    ];
    if tma {
        let maps = Arg::TensorMaps(vec![p.tma_map_w(), p.tma_map_a(nt)]);
        let args: Vec<Arg> =
            std::iter::once(maps).chain(out).chain(rest).chain([(depth as i32).into()]).collect();
        // A ring shallower than the deepest that wraps takes the kernels whose depth is a
        // run-time value; else the deepest ring's (a CTA of fewer chunks touches only those).
        let shallow = depth < tma_stages(nt) && cpb > depth;
        let name = match (nt, shallow) {
            (1, false) => "skinny_w8tma_t1",
            (2, false) => "skinny_w8tma_t2",
            (1, true) => "skinny_w8tma_shallow_t1",
            (2, true) => "skinny_w8tma_shallow_t2",
            _ => "skinny_w8tma_t4",
        };
        // `depth` is at most `cpb` (tma_plan), so this is the deepest ring's stages clamped to a
        // CTA's chunks, or the shallow ring's.
        let l = Launch::new(&SRC, name, p.dtype, grid, (THREADS + 32) as u32, args)
            .with_smem(tma_smem(nt, depth) as u32);
        return Ok((vec![l], need));
    }
    // The weight's row stride: along N for K-contiguous rows, along K for N-contiguous ones.
    let w_rows = if kind == WeightKind::W16N { p.w.1[2] } else { p.w.1[1] };
    let operands: [Arg; 6] =
        [p.a.0.into(), p.a.1[0].into(), p.a.1[1].into(), p.w.0.into(), p.w.1[0].into(), w_rows.into()];
    let args: Vec<Arg> = out.into_iter().chain(operands).chain(rest).collect();
    let base_name = match (kind, nt) {
        (WeightKind::W16, 1) => "skinny_w16_t1",
        (WeightKind::W16, 2) => "skinny_w16_t2",
        (WeightKind::W16, 4) => "skinny_w16_t4",
        (WeightKind::W16, _) => "skinny_w16_t8",
        (WeightKind::W8, 1) => "skinny_w8_t1",
        (WeightKind::W8, 2) => "skinny_w8_t2",
        (WeightKind::W8, 4) => "skinny_w8_t4",
        (WeightKind::W8, _) => "skinny_w8_t8",
        (WeightKind::W16N, 1) => "skinny_w16n_t1",
        (WeightKind::W16N, 2) => "skinny_w16n_t2",
        (WeightKind::W16N, 4) => "skinny_w16n_t4",
        (WeightKind::W16N, _) => "skinny_w16n_t8",
    };
    let l = Launch::new(&SRC, base_name, p.dtype, grid, THREADS as u32, args)
        .with_smem(smem_for(kind, nt, cpb) as u32);
    Ok((vec![l], need))
}

/// Plans, sizes this queue's workspace when the plan splits K, plans again with its address,
/// and runs.
pub(crate) fn run(q: &Queue, p: &Problem, splits: Option<u32>) -> Result<()> {
    let cq = CudaQueue::of(q, p.op)?;
    let sms = cq.sm_count()?;
    let tma = tma_allowed(cq.sm());
    let (mut launches, need) = plan(sms, tma, p, splits, 0)?;
    if need > 0 {
        let ws = workspace(q, cq, p.op, need)?;
        launches = plan(sms, tma, p, splits, ws)?.0;
    }
    if vt_core::flags::pdl() {
        // The kernel waits (griddepcontrol.wait) before touching anything but its weights.
        launches = launches.into_iter().map(|l| l.dependent_on(cq.sm())).collect();
    }
    cq.run(p.op, &launches)
}

/// Whether the TMA form may run on a device of compute capability `sm` (sm_90 and later, with
/// `VT_SKINNY_TMA` on).
pub(crate) fn tma_allowed(sm: u32) -> bool {
    sm >= 90 && vt_core::flags::skinny_tma()
}

/// Whether [`GemmKernel::Auto`] / the fp8 ops' Auto take the skinny kernel for `p`.
pub(crate) fn auto_takes(p: &Problem) -> bool {
    vt_core::flags::skinny_gemm() && p.unsupported().is_none() && p.m <= auto_max_m(p.w8, p.n, p.k)
}

fn run_16(
    q: &Queue,
    p: &Problem,
    opts: &GemmOptions,
    cublas: impl FnOnce() -> Result<()>,
) -> Result<GemmKernel> {
    let chosen = match opts.kernel {
        GemmKernel::Auto if auto_takes(p) => GemmKernel::Skinny,
        GemmKernel::Auto => GemmKernel::Cublas,
        k => k,
    };
    match chosen {
        GemmKernel::Skinny => run(q, p, opts.splits)?,
        _ => cublas()?,
    }
    Ok(chosen)
}

/// MatmulBT with the kernel chosen by the caller; returns the kernel that ran. For tests and
/// benchmarks (A/B against cuBLAS): arguments must have passed vt-core's validation (call
/// the op first).
pub fn matmul_bt_with(q: &Queue, x: &MatmulBTArgs<'_>, opts: &GemmOptions) -> Result<GemmKernel> {
    run_16(q, &Problem::of_matmul_bt(x), opts, || crate::matmul::cublas_matmul_bt(q, x))
}

/// BatchedMatmul with the kernel chosen by the caller (see [`matmul_bt_with`]).
pub fn batched_matmul_with(q: &Queue, x: &BatchedMatmulArgs<'_>, opts: &GemmOptions) -> Result<GemmKernel> {
    run_16(q, &Problem::of_batched(x), opts, || crate::matmul::cublas_batched_matmul(q, x))
}

/// The split-K workspace of every queue: counters then partials, zeroed when allocated
/// (every launch leaves its counters zero).
static WORKSPACES: PerQueue<1> = LazyLock::new(|| Mutex::new(HashMap::new()));

pub(crate) fn workspace(q: &Queue, cq: &CudaQueue, op: OpId, elems: i64) -> Result<u64> {
    let mut all =
        WORKSPACES.lock().map_err(|_| Error::op_failed(op, "cuda", "a lock was poisoned by a panic"))?;
    let [addr] = scratch::buffers(&mut all, q, cq, [(DType::F32, elems)], Fill::Zeros)?;
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vt_core::fp8_block::blocks;

    fn problem(w8: bool, g: i64, m: i64, n: i64, k: i64) -> Problem {
        Problem {
            op: OpId::MatmulBT,
            dtype: DType::BF16,
            out: (1 << 32, [m * n, n, 1]),
            a: (2 << 32, [m * k, k, 1]),
            w: (3 << 32, [n * k, k, 1]),
            w8,
            ws: w8.then_some((4 << 32, [blocks(n) * blocks(k), blocks(k), 1])),
            g,
            m,
            n,
            k,
        }
    }

    #[test]
    fn fragments_follow_m() {
        assert_eq!([1, 8, 9, 16, 17, 32, 33, 64, 65, 128].map(fragments), [1, 1, 2, 2, 4, 4, 8, 8, 8, 8]);
    }

    #[test]
    fn decode_shapes_split_k_to_fill_the_device() {
        // a_proj 2112 x 7168 bf16 at M = 1 on 132 SMs: 33 row blocks, 56 chunks.
        let (l, need) = plan(132, false, &problem(false, 1, 1, 2112, 7168), None, 0).unwrap();
        let grid = l[0].grid;
        assert_eq!((grid.0, grid.1), (1, 33));
        assert!(grid.2 > 4 && need > 0, "{grid:?}");
        // q_b 24576 x 1536: 384 row blocks already fill the device.
        let (l, need) = plan(132, false, &problem(false, 1, 1, 24576, 1536), None, 0).unwrap();
        assert_eq!((l[0].grid, need), ((1, 384, 1), 0));
        // 128 tokens: two 64-token blocks.
        let (l, _) = plan(132, false, &problem(true, 1, 128, 7168, 16384), None, 0).unwrap();
        assert_eq!((l[0].grid.0, l[0].grid.1), (2, 112));
        // Forced splits are clamped to the chunk count.
        let (l, _) = plan(132, false, &problem(false, 1, 3, 100, 256), Some(64), 0).unwrap();
        assert_eq!(l[0].grid.2, 2);
    }

    #[test]
    fn fp8_weights_up_to_32_tokens_take_the_tma_form_where_allowed() {
        // o_proj: shallow rings of 4 at up to 16 tokens (they wrap), the deepest ring at 32.
        for (m, base, nt) in [
            (1, "skinny_w8tma_shallow_t1", 1),
            (16, "skinny_w8tma_shallow_t2", 2),
            (32, "skinny_w8tma_t4", 4),
        ] {
            let (l, _) = plan(132, true, &problem(true, 1, m, 7168, 16384), None, 0).unwrap();
            let (depth, _) = tma_plan(nt, 112, 128, 132, 64, None);
            assert_eq!((l[0].base, l[0].block, l[0].smem), (base, 160, tma_smem(nt, depth) as u32));
            // A full ring: three CTAs an SM.
            assert_eq!(tma_per_sm(nt, 128), 3, "{}", tma_smem(nt, 128));
        }
        // A CTA of one chunk (K split 8 ways) allocates one stage: six CTAs an SM (registers).
        assert_eq!((tma_smem(1, 1), tma_per_sm(1, 1)), (1024 + 10240, 6));
        let (l, _) = plan(132, true, &problem(true, 1, 1, 64, 1024), Some(8), 0).unwrap();
        assert_eq!((l[0].base, l[0].smem, l[0].grid.2), ("skinny_w8tma_t1", tma_smem(1, 1) as u32, 8));
        // The absorbed BMMs' K (128, 512: fewer than 8 chunks) keeps the cp.async form.
        let (l, _) = plan(132, true, &problem(true, 128, 1, 512, 128), None, 0).unwrap();
        assert_eq!(l[0].base, "skinny_w8_t1");
        // 33 tokens, 16-bit weights, or a device / flag that does not allow it: cp.async.
        assert_eq!(
            plan(132, true, &problem(true, 1, 33, 7168, 16384), None, 0).unwrap().0[0].base,
            "skinny_w8_t8"
        );
        assert_eq!(
            plan(132, true, &problem(false, 1, 1, 7168, 16384), None, 0).unwrap().0[0].base,
            "skinny_w16_t1"
        );
        assert_eq!(
            plan(132, false, &problem(true, 1, 1, 7168, 16384), None, 0).unwrap().0[0].base,
            "skinny_w8_t1"
        );
    }

    /// The shared memory the host allocates (`smem_for`, `tma_smem`) is what the kernel file's
    /// constexpr functions count, for every form, token fragment count and short ring: checked
    /// by static_asserts that NVRTC compiles against the kernel source (no GPU; skipped
    /// without libnvrtc). A mismatch would let a kernel index past its allocation.
    #[test]
    fn kernel_facts_match_the_host_plan() {
        use crate::nvrtc::{self, Target};
        if !crate::test_util::nvrtc_ready() {
            return;
        }
        let (code, headers) = crate::kernels::texts(&SRC).expect("kernel text");
        let mut src = format!("{code}\n");
        for chunks in 1..=8 {
            for nt in [1, 2, 4, 8] {
                for (kind, k) in
                    [(WeightKind::W16, "W16"), (WeightKind::W8, "W8"), (WeightKind::W16N, "W16N")]
                {
                    let w8 = i64::from(kind == WeightKind::W8);
                    src.push_str(&format!(
                        "static_assert(({chunks} < skinny::stages_of<{w8}, {nt}>() ? {chunks} : \
                         skinny::stages_of<{w8}, {nt}>()) * skinny::stage_bytes<skinny::{k}, {nt}>() == {}, \
                         \"smem_for({k}, {nt}, {chunks})\");\n",
                        smem_for(kind, nt, chunks)
                    ));
                }
                if nt <= 4 {
                    src.push_str(&format!(
                        "static_assert(skinny::tma_smem<{nt}>({chunks}) == {}, \"tma_smem({nt}, {chunks})\");\n",
                        tma_smem(nt, chunks)
                    ));
                }
            }
        }
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, t)| (*n, t.as_str())).collect();
        if let Err(e) = nvrtc::compile("skinny_gemm_facts.cu", &src, &headers, Target::PtxArchSpecific(90)) {
            panic!("the host's shared-memory plan differs from skinny_gemm.cu: {e}");
        }
    }

    #[test]
    fn broadcast_rows_keep_the_cp_async_form() {
        // Every token reads the same activation row (stride 0): no TMA map of it.
        let mut p = problem(true, 1, 4, 7168, 16384);
        p.a.1[1] = 0;
        assert_eq!(plan(132, true, &p, None, 0).unwrap().0[0].base, "skinny_w8_t1");
        p.a.1[1] = 16384;
        assert_eq!(plan(132, true, &p, None, 0).unwrap().0[0].base, "skinny_w8tma_shallow_t1");
    }

    #[test]
    fn tma_maps_give_single_rows_and_batches_a_valid_stride() {
        // One token of K 720 (bf16: 1440 bytes a row), one batch entry.
        let p = problem(true, 1, 1, 200, 720);
        let a = p.tma_map_a(1);
        assert_eq!((a.dims, a.strides, a.boxes), ([720, 1, 1], [1440, 1440], [64, 8, 1]));
        let w = p.tma_map_w();
        assert_eq!((w.dims, w.strides, w.boxes), ([720, 200, 1], [720, 144000], [128, 64, 1]));
        // Per-head weights: the batch stride is the weight's own.
        let p = problem(true, 4, 3, 512, 128);
        assert_eq!(p.tma_map_w().strides, [128, 512 * 128]);
        assert_eq!(p.tma_map_a(1).strides, [256, 3 * 256]);
    }

    /// The ring depth follows the grid (H200 figures in `TMA_MIN_DEPTH`'s and
    /// `TMA_MIN_SM_STAGES`' docs), on 132 SMs.
    #[test]
    fn tma_ring_depth_follows_the_grid() {
        // o_proj 7168 x 16384 (112 row blocks, 128 chunks) at M 1-8 and 16: rings of 4, one
        // wave of 5 / 4 CTAs an SM, against two waves of the deepest ring's 3.
        assert_eq!(tma_plan(1, 112, 128, 132, 64, None), (4, 5));
        assert_eq!(tma_plan(2, 112, 128, 132, 64, None), (4, 4));
        // q_b 24576 x 1536 (384 row blocks, 12 chunks): the deepest ring, no split (3 splits on
        // rings of 4 cost 13 against 14: within the margin), its fixed-depth kernel.
        assert_eq!(tma_plan(1, 384, 12, 132, 64, None), (7, 1));
        let (l, _) = plan(132, true, &problem(true, 1, 1, 24576, 1536), None, 0).unwrap();
        assert_eq!((l[0].base, l[0].smem), ("skinny_w8tma_t1", tma_smem(1, 12) as u32));
        // At 32 tokens (3 CTAs an SM whatever the depth) the deepest ring.
        assert_eq!(tma_plan(4, 112, 128, 132, 64, None).0, 4);
        // a_proj 2112 x 7168 (33 row blocks, 56 chunks): one CTA an SM, 4 splits of 14 chunks
        // on the deepest ring; forced to 12 splits, the waves' plan (a CTA's ring its 5 chunks).
        assert_eq!(tma_plan(1, 33, 56, 132, 64, None), (7, 4));
        assert_eq!(tma_plan(2, 33, 56, 132, 64, None), (6, 4));
        assert_eq!(tma_plan(1, 33, 56, 132, 64, Some(12)), (5, 12));
        // Row blocks that fill 90% of the SMs only at several CTAs an SM, or more than half the
        // SMs: the waves' plan.
        assert_eq!(one_cta_an_sm(48, 12, 132, 64, 7), None);
        assert_eq!(one_cta_an_sm(112, 128, 132, 64, 7), None);
        assert_eq!(one_cta_an_sm(44, 56, 132, 64, 7), Some(3));
        // Too few chunks for a full ring a CTA: the waves' plan.
        assert_eq!(one_cta_an_sm(33, 20, 132, 64, 7), None);
        // Forced splits keep the cheapest depth for them; the depth never exceeds a CTA's chunks.
        assert_eq!(tma_plan(1, 112, 128, 132, 64, Some(7)), (7, 7));
        assert_eq!(tma_plan(1, 1, 8, 132, 64, Some(8)), (1, 8));
    }

    #[test]
    fn splits_minimize_waves_times_depth() {
        // Two full waves either way: no split.
        assert_eq!(choose_splits(528, 12, 264, 64), 1);
        // 1.5 waves: more, shorter CTAs would fill the waves better but pay their start-up.
        assert_eq!(choose_splits(400, 12, 264, 64), 1);
        // 33 CTAs on 264 slots over 56 chunks: 8 splits of 7 chunks fill one wave.
        assert_eq!(choose_splits(33, 56, 264, 64), 8);
    }

    #[test]
    fn views_the_kernel_cannot_take_are_named() {
        let p = problem(false, 1, 4, 64, 100);
        assert!(p.unsupported().unwrap().contains("multiple of 8"));
        let mut p = problem(false, 1, 4, 64, 128);
        p.w.1[2] = 2;
        assert!(p.unsupported().unwrap().contains("weight"));
        let mut p = problem(true, 1, 4, 64, 136);
        assert!(p.unsupported().unwrap().contains("multiple of 16"));
        p.dtype = DType::F32;
        assert!(p.unsupported().unwrap().contains("bf16/f16"));
        assert!(plan(132, false, &p, None, 0).is_err());
    }
}
