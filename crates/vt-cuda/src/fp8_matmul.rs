//! The block-scaled fp8 ops (`kernels-cuda/fp8_matmul.cu`): QuantizeFp8, MatmulBTFp8 and
//! BatchedMatmulFp8.
//!
//! Both matmuls become one batched problem `out[g] = A[g] . W[g]` over logical views
//! (`a [G,M,K]`, `b [G,K,N]`, `b_scale [G,KB,NB]`, `a_scale [G,M,KB]`, `out [G,M,N]`; MatmulBTFp8
//! is G = 1 with `b` and its scales read transposed), planned without a device
//! (`plan`) and run on one of four kernels ([`Kernel`]):
//!
//! - **Gemv** (weight-only, bf16/f16 activations): the decode kernel. Weights streamed
//!   with 16-byte loads, e4m3 converted to the activations' type in registers, mma.sync
//!   m16n8k16, each 128-group's sum scaled in f32. Needs K % 16 == 0, K-contiguous `a` and
//!   `b` with 16-byte aligned rows. Any M (8, 16 or 32 tokens per CTA; more M re-reads the
//!   weights per 32 tokens).
//! - **Wgmma** (both operands fp8, sm_90a): DeepGEMM's scheme: 128 x 128 tiles, a TMA
//!   producer warpgroup and two wgmma m64n128k32 e4m3 consumers, each 128-wide K tile's
//!   products summed in fresh accumulators and added into the f32 result times its scales.
//! - **Mma** (both operands fp8, sm_89+): the same tiles with mma.sync m16n8k32 e4m3 and a
//!   cp.async ring (for sm_89 and sm_100, which have no wgmma). Same layout needs.
//! - **Generic**: any strides and dtypes, a thread per output (f32 activations, odd views,
//!   devices without the instructions).
//! - **Skinny** (weight-only, bf16/f16 activations): the swap-AB kernel of
//!   [`crate::skinny_gemm`] (a 4-stage cp.async ring of weights and activations, split K
//!   reduced in the same launch by the last CTA, in split order). Needs K % 16 == 0 and
//!   16-byte aligned K-contiguous rows.
//! - **Lt** (both operands fp8, MatmulBTFp8 only, sm_90): cuBLASLt's block-scaled fp8 GEMM
//!   (`crate::cublaslt`; cuBLAS 12.9+: the weights in `BLK128x128_32F`, the activations in
//!   `VEC128_32F` scales), computed as cuBLAS's "TN" `out^T = W . a^T`. Taken only where the
//!   views already have the layouts cuBLASLt reads (no copy is ever made; see
//!   [`Kernel::Lt`]); cuBLASLt's heuristic must also have an algorithm for the shape.
//! - **Auto** picks Skinny for weight-only up to the M limit of
//!   [`crate::skinny_gemm::auto_max_m`] (`VT_SKINNY_GEMM` on; M <= 128), else Gemv for
//!   weight-only; for both-fp8, Lt where
//!   it applies unless `VT_FP8_LT=0` (on by default: at M 4096 the H200 measured it
//!   1.9-3.5x faster than Wgmma and 1.25-1.59x cuBLAS bf16 at a_proj, q_b, kv_b and o_proj,
//!   its graph-replay test passes; racecheck reports hazards inside cuBLASLt's own kernels,
//!   none in ours: docs/perf.md, "Nineteenth session"), else Wgmma (sm_90) or
//!   Mma when the views allow, else Generic.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use vt_core::fp8_block::blocks;
use vt_core::{
    BatchedMatmulFp8Args, DType, Error, MatmulBTFp8Args, OpId, QuantizeFp8Args, Queue, Result, Tensor,
};

use crate::cublaslt::LtGemm;
use crate::launch::TensorMapSpec;
use crate::rope_from_cache::int;
use crate::scratch::{self, Fill, PerQueue};
use crate::{grid_1d, kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("fp8_matmul");

/// Which kernel computes a fp8 matmul. The ops use [`Kernel::Auto`]; the others are for
/// tests and benchmarks ([`matmul_bt_fp8_with`], [`batched_matmul_fp8_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Auto,
    Generic,
    /// Weight-only, weight-streaming mma.sync m16n8k16 (bf16/f16 activations).
    Gemv,
    /// Both operands fp8, mma.sync m16n8k32 e4m3 (sm_89+).
    Mma,
    /// Both operands fp8, TMA + wgmma m64n128k32 e4m3 (sm_90a).
    Wgmma,
    /// Weight-only, the skinny swap-AB kernel of `skinny_gemm.rs` (cp.async ring, split K
    /// reduced in the same launch); bf16/f16 activations.
    Skinny,
    /// Both operands fp8 (MatmulBTFp8, sm_90): cuBLASLt's block-scaled fp8 GEMM.
    ///
    /// Its layout rules (cuBLASLt's block-scaled fp8 GEMM on Hopper, as
    /// torch's `_scaled_mm` checks them for its BlockWise1x128 / BlockWise128x128 modes):
    ///
    /// - MatmulBTFp8 with `a_scale` (both operands fp8) on sm_90; `out` bf16, f16 or f32;
    /// - M a positive multiple of 4 (cuBLASLt 13.0's heuristic has no algorithm for M 1, 7,
    ///   130 on the H200: measured; torch's `_scaled_mm` blockwise fails there the same way),
    ///   K > 0 and a multiple of 16, N a multiple of 16;
    /// - `a` `[M, K]` and `b` `[N, K]` K-contiguous, rows a multiple of 16 bytes apart
    ///   (cuBLAS's leading dimensions), `out` rows 16-byte multiples apart; `a`, `b`, `out`,
    ///   `a_scale`, `b_scale` 16-byte aligned;
    /// - `a_scale` `[M, ceil(K/128)]` stored transposed: stride 1 along M, M along the groups
    ///   (the `[ceil(K/128), M]` layout DeepGEMM and torch keep; QuantizeFp8 writes any scale
    ///   strides, so the caller allocates it that way);
    /// - `b_scale` `[ceil(N/128), ceil(K/128)]` row-major with rows `round_up(ceil(K/128), 4)`
    ///   apart (a checkpoint's `weight_scale_inv` as it is whenever ceil(K/128) % 4 == 0:
    ///   every DeepSeek-V3 projection).
    ///
    /// Any other view is refused by a forced Lt (an error naming the argument) and left to the
    /// other kernels by Auto.
    ///
    /// The algorithm is the heuristic's first choice per shape, or with `VT_LT_TUNE` on the
    /// fastest of its candidates, timed at the shape's first call outside a graph capture
    /// (which synchronizes the queue; see [`lt_tuned_shapes`]).
    Lt,
}

/// Warps per CTA of the Gemv kernel (`fp8mm::GEMV_WARPS`).
const GEMV_WARPS: u32 = 8;
/// The Mma kernel's CTA and dynamic shared memory (`fp8mm::MMA_THREADS`, `MMA_SMEM`).
const MMA_THREADS: u32 = 256;
const MMA_SMEM: u32 = 3 * 2 * 128 * 128;
const MMA_TILE: i64 = 128;
/// The Wgmma kernel's CTA and dynamic shared memory (`wgm::THREADS`; `wgm::OFF_BAR` +
/// 16 * STAGES mbarrier bytes + 1024 alignment slack, STAGES = 5).
const WGMMA_THREADS: u32 = 384;
const WGMMA_SMEM: u32 = 2 * 5 * 128 * 128 + 16 * 5 + 1024;

/// A view's address and its strides in the logical `[g, rows, cols]` order.
#[derive(Clone, Copy, Debug)]
struct V3 {
    addr: u64,
    s: [i64; 3],
    dtype: DType,
}

impl V3 {
    /// A batched view as it is.
    fn batched(t: &Tensor<'_>) -> V3 {
        V3 { addr: t.data_addr(), s: [t.stride(0), t.stride(1), t.stride(2)], dtype: t.dtype() }
    }
    /// A matrix as a batch of one; `transposed` swaps its two dims.
    fn matrix(t: &Tensor<'_>, transposed: bool) -> V3 {
        let (r, c) = if transposed { (t.stride(1), t.stride(0)) } else { (t.stride(0), t.stride(1)) };
        V3 { addr: t.data_addr(), s: [0, r, c], dtype: t.dtype() }
    }
    fn args(&self) -> [Arg; 4] {
        [self.addr.into(), self.s[0].into(), self.s[1].into(), self.s[2].into()]
    }
}

/// One batched fp8 matmul in logical terms.
#[derive(Clone, Copy, Debug)]
struct Problem {
    op: OpId,
    out: V3,
    a: V3,
    a_scale: Option<V3>,
    /// `[g, k, n]`.
    b: V3,
    /// `[g, kb, nb]`.
    b_scale: V3,
    g: i64,
    m: i64,
    n: i64,
    k: i64,
}

impl Problem {
    fn of_matmul_bt(x: &MatmulBTFp8Args<'_>) -> Problem {
        Problem {
            op: OpId::MatmulBTFp8,
            out: V3::matrix(&x.out, false),
            a: V3::matrix(&x.a, false),
            a_scale: x.a_scale.as_ref().map(|s| V3::matrix(s, false)),
            b: V3::matrix(&x.b, true),
            b_scale: V3::matrix(&x.b_scale, true),
            g: 1,
            m: x.a.dim(0),
            n: x.b.dim(0),
            k: x.a.dim(1),
        }
    }

    fn of_batched(x: &BatchedMatmulFp8Args<'_>) -> Problem {
        Problem {
            op: OpId::BatchedMatmulFp8,
            out: V3::batched(&x.out),
            a: V3::batched(&x.a),
            a_scale: x.a_scale.as_ref().map(V3::batched),
            b: V3::batched(&x.b),
            b_scale: V3::batched(&x.b_scale),
            g: x.a.dim(0),
            m: x.a.dim(1),
            n: x.b.dim(2),
            k: x.a.dim(2),
        }
    }

    fn dtype(&self) -> DType {
        self.out.dtype
    }

    /// The run of kernel parameters that `fp8_gemv_t*` and `fp8_gemm_mma` share (`b, b_b,
    /// b_n, bs, bs_b, bs_n, bs_k, m, n, k`): the K-contiguous weight, its scales in
    /// `[batch, N, K]` order, and M, N, K as i32 (an error past i32).
    fn weight_args(&self) -> Result<[Arg; 10]> {
        Ok([
            self.b.addr.into(),
            self.b.s[0].into(),
            self.b.s[2].into(),
            self.b_scale.addr.into(),
            self.b_scale.s[0].into(),
            self.b_scale.s[2].into(),
            self.b_scale.s[1].into(),
            int(self.op, "a", self.m)?.into(),
            int(self.op, "b", self.n)?.into(),
            int(self.op, "a", self.k)?.into(),
        ])
    }

    /// Rows along K are unit-stride and start 16-byte aligned in every batch entry and
    /// every row of both operands; sizes fit the kernels' i32 and grid limits.
    fn vector_ok(&self) -> bool {
        let aligned = |v: &V3, rows: i64| {
            let es = v.dtype.size_of() as i64;
            v.s[2] == 1
                && v.addr & 15 == 0
                && (rows <= 1 || (v.s[1] * es) % 16 == 0)
                && (self.g <= 1 || (v.s[0] * es) % 16 == 0)
        };
        // b is [g, k, n] logically: K-contiguous means its k stride is 1; rows are along n.
        let b_rows = V3 { s: [self.b.s[0], self.b.s[2], self.b.s[1]], ..self.b };
        self.k > 0
            && self.k % 16 == 0
            && aligned(&self.a, self.m)
            && aligned(&b_rows, self.n)
            && [self.m, self.n, self.k].iter().all(|&v| v <= i32::MAX as i64)
            && self.g <= 65535
    }

    /// The cuBLASLt form of this problem ([`Kernel::Lt`]), or the argument that breaks the
    /// rules and why.
    fn lt_plan(&self, sm: u32) -> std::result::Result<LtGemm, (&'static str, String)> {
        let no = |arg: &'static str, why: String| Err((arg, why));
        if self.op != OpId::MatmulBTFp8 {
            return no("a", "MatmulBTFp8 (BatchedMatmulFp8 is not routed to cuBLASLt)".into());
        }
        let Some(sc) = self.a_scale else {
            return no("a_scale", "fp8 activations with their 1 x 128 scales (a_scale given)".into());
        };
        if sm != 90 {
            return no(
                "a",
                format!("sm_90 (cuBLASLt's block-scaled fp8 modes are Hopper's); this is sm_{sm}"),
            );
        }
        let (m, n, k) = (self.m, self.n, self.k);
        if m < 1 || m % 4 != 0 {
            return no(
                "a",
                format!("M a positive multiple of 4 (cuBLASLt has no algorithm otherwise); got M {m}"),
            );
        }
        if k < 1 || k % 16 != 0 || n % 16 != 0 {
            return no("b", format!("K > 0 a multiple of 16, N a multiple of 16; got M {m}, N {n}, K {k}"));
        }
        let es = self.dtype().size_of() as i64;
        // b is [g, k, n] logically: K-contiguous is stride 1 along k; its rows are along n.
        let (lda, ldb, ldd) = (self.b.s[2], self.a.s[1], self.out.s[1]);
        if self.b.s[1] != 1 || lda < k || lda % 16 != 0 {
            return no(
                "b",
                format!("K-contiguous rows 16-byte multiples apart (at least K); got row stride {lda}"),
            );
        }
        if self.a.s[2] != 1 || ldb < k || ldb % 16 != 0 {
            return no(
                "a",
                format!("K-contiguous rows 16-byte multiples apart (at least K); got row stride {ldb}"),
            );
        }
        if self.out.s[2] != 1 || ldd < n || (ldd * es) % 16 != 0 {
            return no("out", format!("N-contiguous rows 16-byte multiples apart; got row stride {ldd}"));
        }
        let (kb, nb) = (blocks(k), blocks(n));
        // a_scale [m, kb]: stride 1 along m, m along kb.
        if sc.s[1] != 1 || (kb > 1 && sc.s[2] != m) {
            return no(
                "a_scale",
                format!(
                    "the [ceil(K/128), M] layout (strides 1, M = {m}); got strides {}, {}",
                    sc.s[1], sc.s[2]
                ),
            );
        }
        // b_scale as [g, kb, nb]: stride 1 along kb, round_up(kb, 4) along nb.
        let ld_s = (kb + 3) / 4 * 4;
        if (kb > 1 && self.b_scale.s[1] != 1) || (nb > 1 && self.b_scale.s[2] != ld_s) {
            return no(
                "b_scale",
                format!(
                    "row-major [ceil(N/128), ceil(K/128)] with rows round_up(ceil(K/128), 4) = {ld_s} apart; got strides {}, {}",
                    self.b_scale.s[2], self.b_scale.s[1]
                ),
            );
        }
        for (arg, addr) in [
            ("a", self.a.addr),
            ("b", self.b.addr),
            ("out", self.out.addr),
            ("a_scale", sc.addr),
            ("b_scale", self.b_scale.addr),
        ] {
            if addr % 16 != 0 {
                return no(arg, format!("a 16-byte aligned first element; got address {addr:#x}"));
            }
        }
        Ok(LtGemm {
            m: n as u64,
            n: m as u64,
            k: k as u64,
            a: self.b.addr,
            lda,
            b: self.a.addr,
            ldb,
            d: self.out.addr,
            ldd,
            a_scale: self.b_scale.addr,
            b_scale: sc.addr,
            out: self.dtype(),
        })
    }

    /// The skinny kernel's view of this problem (weight-only forms).
    fn skinny(&self) -> crate::skinny_gemm::Problem {
        // b is [g, k, n] logically; the skinny kernel reads w[g, n, k]; the scales likewise.
        let w = (self.b.addr, [self.b.s[0], self.b.s[2], self.b.s[1]]);
        let ws = (self.b_scale.addr, [self.b_scale.s[0], self.b_scale.s[2], self.b_scale.s[1]]);
        crate::skinny_gemm::Problem {
            op: self.op,
            dtype: self.dtype(),
            out: (self.out.addr, self.out.s),
            a: (self.a.addr, self.a.s),
            w,
            w8: true,
            ws: Some(ws),
            g: self.g,
            m: self.m,
            n: self.n,
            k: self.k,
        }
    }

    fn skinny_ok(&self) -> bool {
        self.a_scale.is_none() && self.a.dtype == self.dtype() && self.skinny().unsupported().is_none()
    }

    fn gemv_ok(&self) -> bool {
        self.a_scale.is_none() && matches!(self.dtype(), DType::BF16 | DType::F16) && self.vector_ok()
    }

    fn mma_ok(&self, sm: u32) -> bool {
        self.a_scale.is_some() && sm >= 89 && self.vector_ok()
    }

    /// The TMA maps also need every byte stride below 2^40 and M, N, K below 2^31.
    fn wgmma_ok(&self, sm: u32) -> bool {
        self.a_scale.is_some() && sm == 90 && self.vector_ok()
    }
}

/// The TMA map of a K-contiguous fp8 operand: dims (K, rows, batch) in bytes, boxes of
/// 128 x 128 x 1. `row_stride` / `batch_stride` in bytes (= elements).
fn fp8_map(
    what: &'static str,
    addr: u64,
    (k, rows, g): (i64, i64, i64),
    row_stride: i64,
    batch_stride: i64,
) -> TensorMapSpec {
    // A batch of one: any multiple of 16 past the matrix serves as its (unused) stride.
    let bs = if g <= 1 { (row_stride * rows).max(16) } else { batch_stride };
    TensorMapSpec {
        what,
        dtype: DType::F8E4M3,
        addr,
        dims: [k as u64, rows as u64, g.max(1) as u64],
        strides: [row_stride.max(16) as u64, bs as u64],
        boxes: [128, 128, 1],
        swizzle: true,
    }
}

/// Tokens per Gemv CTA: 8 * tt.
fn gemv_tt(m: i64) -> i64 {
    match m {
        0..=8 => 1,
        9..=16 => 2,
        _ => 4,
    }
}

/// K-slices (warps per 16-row tile) of a Gemv CTA: as many as there are 128-groups, up to 8.
fn gemv_wk(k: i64) -> i64 {
    let groups = blocks(k);
    [8, 4, 2, 1].into_iter().find(|&w| w <= groups).unwrap_or(1)
}

/// How a fp8 matmul runs: the kernel, and optionally the number of K splits (the Gemv and
/// Wgmma kernels can split K over CTAs, writing f32 partials that a second launch adds up;
/// `None`: chosen from the device's SM count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Options {
    pub kernel: Kernel,
    pub splits: Option<u32>,
}

impl Default for Fp8Options {
    fn default() -> Self {
        Fp8Options { kernel: Kernel::Auto, splits: None }
    }
}

/// What the planner needs to know of the device.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Device {
    pub sm: u32,
    pub sms: u32,
}

/// The f32 partials of the split-K launches are capped at this many bytes.
const MAX_PARTIAL_BYTES: i64 = 256 << 20;

/// `ceil(a / b)` for positive `b`.
fn cdiv(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// K splits of `units` (128-groups or K tiles) for `base` CTAs: enough CTAs for two waves
/// (`Some(s)` forces `s`), at most one split per unit, partials within the cap; returns
/// (splits, units per split).
fn split_k(forced: Option<u32>, base: i64, units: i64, sms: u32, partial_elems_per_split: i64) -> (i64, i64) {
    let units = units.max(1);
    let want = match forced {
        Some(s) => s.max(1) as i64,
        None if base >= 2 * sms as i64 => 1,
        None => cdiv(2 * sms as i64, base.max(1)),
    };
    let cap = (MAX_PARTIAL_BYTES / 4 / partial_elems_per_split.max(1)).max(1);
    let s = want.min(units).min(cap).max(1);
    let per = cdiv(units, s);
    (cdiv(units, per), per)
}

/// The launches of one fp8 matmul and the kernel they run: plain data, no device (the PTX
/// check compares them with the kernels' parameter lists). `part` is the address of the
/// split-K partials (the first call may pass 0 to learn their size: the returned element
/// count). A forced kernel that cannot take the arguments is an error.
fn plan_problem(
    dev: Device,
    p: &Problem,
    opts: &Fp8Options,
    part: u64,
) -> Result<(Kernel, Vec<Launch>, i64)> {
    let sm = dev.sm;
    let chosen = match opts.kernel {
        Kernel::Auto if p.skinny_ok() && crate::skinny_gemm::auto_takes(&p.skinny()) => Kernel::Skinny,
        Kernel::Auto if p.gemv_ok() => Kernel::Gemv,
        Kernel::Auto if p.wgmma_ok(sm) => Kernel::Wgmma,
        Kernel::Auto if p.mma_ok(sm) => Kernel::Mma,
        Kernel::Auto => Kernel::Generic,
        k => k,
    };
    let refuse = |what: &str| {
        Err(Error::invalid(
            p.op,
            "a",
            format!(
                "the {chosen:?} kernel needs {what}; got {} activations, M {}, N {}, K {}",
                p.a.dtype, p.m, p.n, p.k
            ),
        ))
    };
    match chosen {
        Kernel::Gemv if !p.gemv_ok() => {
            return refuse("bf16/f16 activations, K % 16 == 0 and 16-byte aligned K-contiguous rows")
        }
        Kernel::Mma if !p.mma_ok(sm) => {
            return refuse("fp8 activations, sm_89+, K % 16 == 0 and 16-byte aligned K-contiguous rows")
        }
        Kernel::Wgmma if !p.wgmma_ok(sm) => {
            return refuse("fp8 activations, sm_90, K % 16 == 0 and 16-byte aligned K-contiguous rows")
        }
        Kernel::Skinny if !p.skinny_ok() => {
            return refuse("bf16/f16 activations, K % 16 == 0 and 16-byte aligned K-contiguous rows")
        }
        Kernel::Lt => return Err(lt_not_planned(p.op)),
        _ => {}
    }
    if p.g == 0 || p.m == 0 || p.n == 0 {
        return Ok((chosen, Vec::new(), 0));
    }
    let dt = p.dtype();
    let gmn = p.g * p.m * p.n;
    let grid_z = |splits: i64| -> Result<u32> {
        let z = p.g * splits;
        if z > 65535 {
            return Err(Error::invalid(
                p.op,
                "a",
                format!("{} batch entries x {splits} K splits exceed the grid", p.g),
            ));
        }
        Ok(z as u32)
    };
    // The split-K epilogue: out = the sum of the partials.
    let combine = |splits: i64| -> Launch {
        let mut args: Vec<Arg> = Vec::with_capacity(10);
        args.extend(p.out.args());
        args.extend([part.into(), gmn.into(), (splits as i32).into(), p.g.into(), p.m.into(), p.n.into()]);
        Launch::new(&SRC, "fp8_split_combine", dt, (grid_1d(cdiv(gmn, 256)), 1, 1), 256, args)
    };
    let mut launches = Vec::new();
    let mut part_elems = 0;
    match chosen {
        Kernel::Skinny => {
            // `part` is the skinny kernel's own workspace here (counters + partials).
            (launches, part_elems) = crate::skinny_gemm::plan(
                dev.sms,
                crate::skinny_gemm::tma_allowed(dev.sm),
                &p.skinny(),
                opts.splits,
                part,
            )?;
        }
        Kernel::Gemv => {
            let tt = gemv_tt(p.m);
            let tb = cdiv(p.m, 8 * tt);
            let groups = blocks(p.k);
            // Unsplit: the default K-slices inside a CTA; split: 128-row CTAs (8 row tiles,
            // one K-slice each) over `splits` ranges of groups.
            let wk0 = gemv_wk(p.k);
            let base0 = cdiv(p.n, 16 * (GEMV_WARPS as i64 / wk0)) * tb * p.g;
            let base1 = cdiv(p.n, 16 * GEMV_WARPS as i64) * tb * p.g;
            let (splits, gps) = match opts.splits {
                None if base0 >= 2 * dev.sms as i64 => (1, groups),
                forced => split_k(forced, base1, groups, dev.sms, gmn),
            };
            let wk = if splits > 1 { 1 } else { wk0 };
            let rows_per_cta = 16 * (GEMV_WARPS as i64 / wk);
            let grid = (
                int(p.op, "b", cdiv(p.n, rows_per_cta))? as u32,
                int(p.op, "a", tb)? as u32,
                grid_z(splits)?,
            );
            if grid.1 > 65535 {
                return Err(Error::invalid(p.op, "a", format!("M {} exceeds the Gemv kernel's grid", p.m)));
            }
            let base = match tt {
                1 => "fp8_gemv_t1",
                2 => "fp8_gemv_t2",
                _ => "fp8_gemv_t4",
            };
            let part_arg = if splits > 1 { part } else { 0 };
            let mut args: Vec<Arg> = vec![
                p.out.addr.into(),
                p.out.s[0].into(),
                p.out.s[1].into(),
                p.out.s[2].into(),
                p.a.addr.into(),
                p.a.s[0].into(),
                p.a.s[1].into(),
            ];
            args.extend(p.weight_args()?);
            args.extend([
                (wk as i32).into(),
                part_arg.into(),
                gmn.into(),
                (splits as i32).into(),
                (gps as i32).into(),
            ]);
            launches.push(Launch::new(&SRC, base, dt, grid, 32 * GEMV_WARPS, args));
            if splits > 1 {
                part_elems = splits * gmn;
                launches.push(combine(splits));
            }
        }
        Kernel::Mma => {
            let a_scale = p.a_scale.ok_or_else(|| no_a_scale(p.op, "Mma"))?;
            let grid = (
                int(p.op, "b", cdiv(p.n, MMA_TILE))? as u32,
                int(p.op, "a", cdiv(p.m, MMA_TILE))? as u32,
                grid_z(1)?,
            );
            if grid.1 > 65535 {
                return Err(Error::invalid(p.op, "a", format!("M {} exceeds the Mma kernel's grid", p.m)));
            }
            let mut args: Vec<Arg> = vec![
                p.out.addr.into(),
                p.out.s[0].into(),
                p.out.s[1].into(),
                p.out.s[2].into(),
                p.a.addr.into(),
                p.a.s[0].into(),
                p.a.s[1].into(),
                a_scale.addr.into(),
                a_scale.s[0].into(),
                a_scale.s[1].into(),
                a_scale.s[2].into(),
            ];
            args.extend(p.weight_args()?);
            launches.push(Launch::new(&SRC, "fp8_gemm_mma", dt, grid, MMA_THREADS, args).with_smem(MMA_SMEM));
        }
        Kernel::Wgmma => {
            let a_scale = p.a_scale.ok_or_else(|| no_a_scale(p.op, "Wgmma"))?;
            let tiles = cdiv(p.n, MMA_TILE) * cdiv(p.m, MMA_TILE) * p.g;
            let k_tiles = cdiv(p.k, MMA_TILE);
            // One wave's worth of CTAs, each split at least two K tiles deep.
            let want = match opts.splits {
                Some(s) => s as i64,
                None if tiles >= dev.sms as i64 => 1,
                None => cdiv(dev.sms as i64, tiles).min(k_tiles / 2),
            };
            let (splits, kpt) = split_k(Some(want.max(1) as u32), tiles, k_tiles, dev.sms, gmn);
            let grid = (
                int(p.op, "b", cdiv(p.n, MMA_TILE))? as u32,
                int(p.op, "a", cdiv(p.m, MMA_TILE))? as u32,
                grid_z(splits)?,
            );
            if grid.1 > 65535 {
                return Err(Error::invalid(p.op, "a", format!("M {} exceeds the Wgmma kernel's grid", p.m)));
            }
            let maps = Arg::TensorMaps(vec![
                fp8_map("a", p.a.addr, (p.k, p.m, p.g), p.a.s[1], p.a.s[0]),
                fp8_map("b", p.b.addr, (p.k, p.n, p.g), p.b.s[2], p.b.s[0]),
            ]);
            let part_arg = if splits > 1 { part } else { 0 };
            let args: Vec<Arg> = vec![
                maps,
                p.out.addr.into(),
                p.out.s[0].into(),
                p.out.s[1].into(),
                p.out.s[2].into(),
                a_scale.addr.into(),
                a_scale.s[0].into(),
                a_scale.s[1].into(),
                a_scale.s[2].into(),
                p.b_scale.addr.into(),
                p.b_scale.s[0].into(),
                p.b_scale.s[2].into(),
                p.b_scale.s[1].into(),
                int(p.op, "a", p.m)?.into(),
                int(p.op, "b", p.n)?.into(),
                int(p.op, "a", p.k)?.into(),
                part_arg.into(),
                gmn.into(),
                (splits as i32).into(),
                (kpt as i32).into(),
            ];
            launches.push(
                Launch::new(&SRC, "fp8_gemm_wgmma", dt, grid, WGMMA_THREADS, args).with_smem(WGMMA_SMEM),
            );
            if splits > 1 {
                part_elems = splits * gmn;
                launches.push(combine(splits));
            }
        }
        Kernel::Lt => return Err(lt_not_planned(p.op)),
        Kernel::Generic | Kernel::Auto => {
            let none = V3 { addr: 0, s: [0; 3], dtype: DType::F32 };
            let mut args: Vec<Arg> = Vec::with_capacity(24);
            args.extend(p.out.args());
            args.extend(p.a.args());
            args.extend(p.a_scale.unwrap_or(none).args());
            args.extend(p.b.args());
            args.extend(p.b_scale.args());
            args.extend([p.g.into(), p.m.into(), p.n.into(), p.k.into()]);
            launches.push(Launch::new(
                &SRC,
                "fp8_matmul_generic",
                dt,
                (grid_1d(cdiv(gmn, 256)), 1, 1),
                256,
                args,
            ));
        }
    }
    Ok((chosen, launches, part_elems))
}

/// A kernel for two fp8 operands reached without `a_scale` (its `*_ok` check requires it).
fn no_a_scale(op: OpId, kernel: &str) -> Error {
    Error::op_failed(op, "cuda", format!("the {kernel} kernel needs fp8 activations (a_scale); none given"))
}

/// [`Kernel::Lt`] is a cuBLASLt call, not a launch plan.
fn lt_not_planned(op: OpId) -> Error {
    Error::invalid(op, "a", "the Lt kernel runs through cuBLASLt and has no launch plan")
}

/// The plan of a MatmulBTFp8 call (the PTX check's samples).
#[cfg(test)]
pub(crate) fn plan_matmul_bt(
    dev: Device,
    x: &MatmulBTFp8Args<'_>,
    opts: &Fp8Options,
    part: u64,
) -> Result<(Kernel, Vec<Launch>, i64)> {
    plan_problem(dev, &Problem::of_matmul_bt(x), opts, part)
}

/// The plan of a BatchedMatmulFp8 call (the PTX check's samples).
#[cfg(test)]
pub(crate) fn plan_batched(
    dev: Device,
    x: &BatchedMatmulFp8Args<'_>,
    opts: &Fp8Options,
    part: u64,
) -> Result<(Kernel, Vec<Launch>, i64)> {
    plan_problem(dev, &Problem::of_batched(x), opts, part)
}

/// Plans, sizes this queue's partials when the plan splits K, plans again with their
/// address, and runs.
fn run_problem(q: &Queue, p: &Problem, opts: &Fp8Options) -> Result<Kernel> {
    let cq = CudaQueue::of(q, p.op)?;
    let dev = Device { sm: cq.sm(), sms: cq.sm_count()? };
    match opts.kernel {
        Kernel::Lt => {
            let g = p.lt_plan(dev.sm).map_err(|(arg, why)| {
                Error::invalid(p.op, arg, format!("the Lt kernel (cuBLASLt block-scaled fp8) needs {why}"))
            })?;
            crate::cublaslt::matmul(q, cq, p.op, &g)?;
            return Ok(Kernel::Lt);
        }
        // VT_FP8_LT (on by default; `0` keeps Wgmma / Mma): faster than Wgmma and bf16 cuBLAS
        // at large M on the H200, its graph replay passes (docs/perf.md, "Nineteenth session").
        Kernel::Auto if p.a_scale.is_some() && vt_core::flags::fp8_lt() => {
            if let Ok(g) = p.lt_plan(dev.sm) {
                if crate::cublaslt::supported(q, cq, p.op, &g)? {
                    crate::cublaslt::matmul(q, cq, p.op, &g)?;
                    return Ok(Kernel::Lt);
                }
            }
        }
        _ => {}
    }
    let (mut chosen, mut launches, elems) = plan_problem(dev, p, opts, 0)?;
    if elems > 0 {
        let part = if chosen == Kernel::Skinny {
            crate::skinny_gemm::workspace(q, cq, p.op, elems)?
        } else {
            partials(q, cq, elems)?
        };
        (chosen, launches, _) = plan_problem(dev, p, opts, part)?;
    }
    cq.run(p.op, &launches)?;
    Ok(chosen)
}

/// MatmulBTFp8 with the kernel chosen by the caller; returns the kernel that ran. For tests
/// and benchmarks: arguments must have passed vt-core's validation (call the op first).
pub fn matmul_bt_fp8_with(q: &Queue, x: &MatmulBTFp8Args<'_>, kernel: Kernel) -> Result<Kernel> {
    matmul_bt_fp8_with_options(q, x, &Fp8Options { kernel, splits: None })
}

/// [`matmul_bt_fp8_with`] with the K splits forced too.
pub fn matmul_bt_fp8_with_options(q: &Queue, x: &MatmulBTFp8Args<'_>, opts: &Fp8Options) -> Result<Kernel> {
    run_problem(q, &Problem::of_matmul_bt(x), opts)
}

/// How many cuBLASLt shapes (keys: device, shape, leading dimensions, output type,
/// alignments) this process has tuned so far: their [`Kernel::Lt`] algorithm was chosen by
/// `VT_LT_TUNE`'s timing of the heuristic's candidates (the heuristic's first where none
/// could be timed). For tests and benchmarks.
pub fn lt_tuned_shapes() -> usize {
    crate::cublaslt::tuned_shapes()
}

/// BatchedMatmulFp8 with the kernel chosen by the caller (see [`matmul_bt_fp8_with`]).
pub fn batched_matmul_fp8_with(q: &Queue, x: &BatchedMatmulFp8Args<'_>, kernel: Kernel) -> Result<Kernel> {
    batched_matmul_fp8_with_options(q, x, &Fp8Options { kernel, splits: None })
}

/// [`batched_matmul_fp8_with`] with the K splits forced too.
pub fn batched_matmul_fp8_with_options(
    q: &Queue,
    x: &BatchedMatmulFp8Args<'_>,
    opts: &Fp8Options,
) -> Result<Kernel> {
    run_problem(q, &Problem::of_batched(x), opts)
}

pub(crate) fn run_matmul_bt(q: &Queue, x: &MatmulBTFp8Args<'_>) -> Result<()> {
    matmul_bt_fp8_with(q, x, Kernel::Auto).map(|_| ())
}

pub(crate) fn run_batched(q: &Queue, x: &BatchedMatmulFp8Args<'_>) -> Result<()> {
    batched_matmul_fp8_with(q, x, Kernel::Auto).map(|_| ())
}

/// The split-K partials of every queue.
static PARTIALS: PerQueue<1> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The address of at least `elems` f32 partials for this queue.
fn partials(q: &Queue, cq: &CudaQueue, elems: i64) -> Result<u64> {
    let mut all = PARTIALS
        .lock()
        .map_err(|_| Error::op_failed(OpId::MatmulBTFp8, "cuda", "a lock was poisoned by a panic"))?;
    let [addr] = scratch::buffers(&mut all, q, cq, [(DType::F32, elems)], Fill::Uninit)?;
    Ok(addr)
}

/// Rows a half-warp of the wide quantize kernel has in flight (`fp8mm::QUANT_ROWS`).
const QUANT_ROWS: i64 = 4;

/// Input bytes from which Auto takes the wide kernel (with `VT_QUANT_WIDE` on): on an H100
/// (docs/perf.md, "Forty-fourth session") it was 1.1-1.6x faster at 12.6-235 MB of input (q_b,
/// a_proj, o_proj at M 4096) and 0.4-2.2 us slower at 4 MB and under (kv_b M 4096, every M 1 and
/// 128 call), where its fewer, longer-lived blocks start slower.
pub const QUANT_WIDE_MIN_BYTES: i64 = 8 << 20;

/// QuantizeFp8's two kernels (the same bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantKernel {
    /// The wide kernel from [`QUANT_WIDE_MIN_BYTES`] of input with `VT_QUANT_WIDE` on (the
    /// default), the warp kernel otherwise.
    Auto,
    /// `quantize_fp8_*`: a warp per (row, 128-group), 8 bytes a lane, one row at a time.
    Warp,
    /// `quantize_fp8_wide_*`: a half-warp per (row, group), 16 bytes a lane, four rows at once.
    Wide,
}

/// QuantizeFp8's launch. `Warp` (`fp8mm::quantize`): a warp per (row, 128-group), 8 warps a
/// block: 2^lw groups of a row by 8 / 2^lw rows (lw: as many groups as the row has, up to 8);
/// grid x the groups, y the rows (the kernel loops past 65535 blocks). `Wide`
/// (`fp8mm::quantize_wide`): a half-warp per (row, group), 16 half-warps a block: 2^lw groups
/// (up to 16) by 16 / 2^lw rows, each half-warp QUANT_ROWS rows at once; grid x the groups, y
/// the rows, at most 32 blocks an SM's worth in all (`sms`), the kernel looping over the rows
/// past that (so the blocks that run keep their loads in flight instead of starting up).
pub(crate) fn plan_quantize(x: &QuantizeFp8Args<'_>, kernel: QuantKernel, sms: u32) -> Result<Vec<Launch>> {
    let (m, k) = (x.x.dim(0), x.x.dim(1));
    if m == 0 || k == 0 {
        return Ok(Vec::new());
    }
    let wide = match kernel {
        QuantKernel::Auto => auto_quant_kernel(m, k, x.x.dtype()) == QuantKernel::Wide,
        QuantKernel::Warp => false,
        QuantKernel::Wide => true,
    };
    let groups = blocks(k);
    // Groups a block takes in x: 2^lw, as many as the row has up to 8 (16 wide).
    let lw = match groups {
        16.. if wide => 4,
        8.. => 3,
        4..=7 => 2,
        2..=3 => 1,
        _ => 0,
    };
    let gx = cdiv(groups, 1 << lw);
    let gx32 = i32::try_from(gx)
        .map_err(|_| Error::invalid(OpId::QuantizeFp8, "x", "its 128-column groups do not fit a grid's x"))?
        as u32;
    let (name, gy) = if wide {
        let cap = (32 * sms.max(1) as i64 / gx).clamp(1, 65535);
        ("quantize_fp8_wide", cdiv(m, (16 >> lw) * QUANT_ROWS).min(cap))
    } else {
        ("quantize_fp8", cdiv(m, 8 >> lw).min(65535))
    };
    let args: [Arg; 9] = [
        x.out.data_addr().into(),
        x.out.stride(0).into(),
        x.scale.data_addr().into(),
        x.scale.stride(0).into(),
        x.scale.stride(1).into(),
        x.x.data_addr().into(),
        x.x.stride(0).into(),
        m.into(),
        k.into(),
    ];
    Ok(vec![Launch::new(&SRC, name, x.x.dtype(), (gx32, gy as u32, 1), 256, args)])
}

/// The kernel Auto takes for an [m, k] input of `dt`: `Wide` with `VT_QUANT_WIDE` on from
/// [`QUANT_WIDE_MIN_BYTES`] of input, else `Warp`.
pub fn auto_quant_kernel(m: i64, k: i64, dt: DType) -> QuantKernel {
    if vt_core::flags::quant_wide() && wide_pays(m, k, dt) {
        QuantKernel::Wide
    } else {
        QuantKernel::Warp
    }
}

/// Auto's size rule: the wide kernel from [`QUANT_WIDE_MIN_BYTES`] of input (saturating: a
/// product past i64 is large).
fn wide_pays(m: i64, k: i64, dt: DType) -> bool {
    m.saturating_mul(k).saturating_mul(dt.size_of() as i64) >= QUANT_WIDE_MIN_BYTES
}

pub(crate) fn run_quantize(q: &Queue, x: &QuantizeFp8Args<'_>) -> Result<()> {
    quantize_fp8_with(q, x, QuantKernel::Auto)
}

/// QuantizeFp8 on the kernel the caller chooses (tests and benches A/B the two; both write the
/// op's bytes). The arguments are the op's (`vt_core::quantize_fp8`'s contract), not validated
/// again here: pass views that op accepts.
pub fn quantize_fp8_with(q: &Queue, x: &QuantizeFp8Args<'_>, kernel: QuantKernel) -> Result<()> {
    let op = OpId::QuantizeFp8;
    let cq = CudaQueue::of(q, op)?;
    cq.run(op, &plan_quantize(x, kernel, cq.sm_count()?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::host_view;

    /// The cuBLASLt form of a MatmulBTFp8 call and its refusals, without a GPU: the
    /// operands swap into cuBLAS's column-major TN form, and each layout rule names the
    /// argument that breaks it.
    #[test]
    fn lt_plan_maps_the_views_and_names_what_breaks_its_rules() {
        let mem = vec![0u128; 1 << 16];
        let (f8, f32) = (DType::F8E4M3, DType::F32);
        let (m, n, k) = (8i64, 272i64, 1040i64);
        let (kb, nb) = (blocks(k), blocks(n)); // 9, 3: scale rows padded to 12
        let out = host_view(&mem, DType::BF16, 8, &[m, n], &[n + 16, 1]);
        let a = host_view(&mem, f8, 0, &[m, k], &[k + 16, 1]);
        let b = host_view(&mem, f8, 0, &[n, k], &[k, 1]);
        let bs = host_view(&mem, f32, 0, &[nb, kb], &[12, 1]);
        let asc = host_view(&mem, f32, 4, &[m, kb], &[1, m]);
        let x = MatmulBTFp8Args { out, a, a_scale: Some(asc), b, b_scale: bs };
        let g = Problem::of_matmul_bt(&x).lt_plan(90).unwrap();
        assert_eq!((g.m, g.n, g.k, g.lda, g.ldb, g.ldd), (272, 8, 1040, 1040, 1056, 288));
        assert_eq!((g.a, g.b, g.d), (b.data_addr(), a.data_addr(), out.data_addr()));
        assert_eq!((g.a_scale, g.b_scale, g.out), (bs.data_addr(), asc.data_addr(), DType::BF16));
        let arg = |x: &MatmulBTFp8Args<'_>, sm: u32| {
            Problem::of_matmul_bt(x).lt_plan(sm).map(|_| ()).unwrap_err().0
        };
        assert_eq!(arg(&x, 89), "a");
        assert_eq!(arg(&MatmulBTFp8Args { a_scale: None, ..x }, 90), "a_scale");
        let asr = host_view(&mem, f32, 0, &[m, kb], &[kb, 1]);
        assert_eq!(arg(&MatmulBTFp8Args { a_scale: Some(asr), ..x }, 90), "a_scale");
        let bs9 = host_view(&mem, f32, 0, &[nb, kb], &[kb, 1]);
        assert_eq!(arg(&MatmulBTFp8Args { b_scale: bs9, ..x }, 90), "b_scale");
        let o3 = host_view(&mem, DType::BF16, 3, &[m, n], &[n + 16, 1]);
        assert_eq!(arg(&MatmulBTFp8Args { out: o3, ..x }, 90), "out");
        let o_ld = host_view(&mem, DType::BF16, 8, &[m, n], &[n + 3, 1]);
        assert_eq!(arg(&MatmulBTFp8Args { out: o_ld, ..x }, 90), "out");
        let a_ld = host_view(&mem, f8, 0, &[m, k], &[k + 8, 1]);
        assert_eq!(arg(&MatmulBTFp8Args { a: a_ld, ..x }, 90), "a");
        let b_off = host_view(&mem, f8, 8, &[n, k], &[k, 1]);
        assert_eq!(arg(&MatmulBTFp8Args { b: b_off, ..x }, 90), "b");
        let (o200, b200) = (
            host_view(&mem, DType::BF16, 8, &[m, 200], &[n + 16, 1]),
            host_view(&mem, f8, 0, &[200, k], &[k, 1]),
        );
        let bs200 = host_view(&mem, f32, 0, &[2, kb], &[12, 1]);
        assert_eq!(arg(&MatmulBTFp8Args { out: o200, b: b200, b_scale: bs200, ..x }, 90), "b");
        // M not a multiple of 4 (1, 7): cuBLASLt has no algorithm.
        for mm in [1, 7] {
            let (o1, a1) = (
                host_view(&mem, DType::BF16, 8, &[mm, n], &[n + 16, 1]),
                host_view(&mem, f8, 0, &[mm, k], &[k + 16, 1]),
            );
            let as1 = host_view(&mem, f32, 4, &[mm, kb], &[1, mm]);
            assert_eq!(arg(&MatmulBTFp8Args { out: o1, a: a1, a_scale: Some(as1), b, b_scale: bs }, 90), "a");
        }
    }

    #[test]
    fn gemv_tiles_follow_m_and_k() {
        assert_eq!(
            (gemv_tt(1), gemv_tt(8), gemv_tt(9), gemv_tt(16), gemv_tt(17), gemv_tt(4096)),
            (1, 1, 2, 2, 4, 4)
        );
        assert_eq!((gemv_wk(128), gemv_wk(256), gemv_wk(512), gemv_wk(1536), gemv_wk(7168)), (1, 2, 4, 8, 8));
        assert_eq!(gemv_wk(16), 1);
    }

    /// Auto's size rule, at the shapes the H100 timed: wide for q_b, a_proj and o_proj at M 4096
    /// (12.6 MB and more of bf16), the warp kernel for kv_b at M 4096 (4 MB) and every M <= 128.
    #[test]
    fn auto_takes_the_wide_quantize_from_8_mib_of_input() {
        assert!(wide_pays(4096, 1536, DType::BF16));
        assert!(wide_pays(4096, 7168, DType::BF16));
        assert!(wide_pays(4096, 16384, DType::BF16));
        assert!(!wide_pays(4096, 512, DType::BF16));
        assert!(!wide_pays(128, 16384, DType::BF16));
        assert!(!wide_pays(1, 7168, DType::BF16));
        assert!(wide_pays(2048, 1024, DType::F32), "8 MiB of f32");
        assert!(!wide_pays(2048, 1023, DType::F32));
        assert!(wide_pays(i64::MAX, 2, DType::BF16), "saturates");
    }

    /// The wide quantize kernel's grid: x covers every 128-group (16 a block where a row has 16 or more), y
    /// the rows QUANT_ROWS x (16 / 2^lw) a block at a time, capped at 32 blocks an SM, so the
    /// kernel's row loop runs past the cap (the byte-exact GPU test's 65543 rows of 8 groups).
    #[test]
    fn quantize_grid_covers_the_groups_and_caps_the_rows_at_32_blocks_an_sm() {
        let mem = vec![0u128; 1 << 12];
        // (Rows 0 apart: the plan reads only the shape; the views stay inside `mem`.)
        let grid = |m: i64, k: i64| {
            let x = host_view(&mem, DType::BF16, 0, &[m, k], &[0, 1]);
            let out = host_view(&mem, DType::F8E4M3, 0, &[m, k], &[0, 1]);
            let scale = host_view(&mem, DType::F32, 0, &[m, blocks(k)], &[0, 1]);
            plan_quantize(&QuantizeFp8Args { out, scale, x }, QuantKernel::Wide, 132).unwrap()[0].grid
        };
        assert_eq!(grid(4096, 7168), (4, 1024, 1)); // 56 groups: lw 4, 1 row x 4 a pass, under the cap
        assert_eq!(grid(1, 7168), (4, 1, 1));
        assert_eq!(grid(4096, 16384), (8, 528, 1));
        assert_eq!(grid(65543, 1024), (1, 4224, 1)); // 8 rows a pass: 8193 wanted, the loop runs
        assert_eq!(grid(7, 200), (1, 1, 1)); // 2 groups: lw 1, 8 rows x 4 a pass
        assert_eq!(grid(5, 100), (1, 1, 1));
        assert_eq!(grid(4096, 512), (1, 256, 1)); // 4 groups: lw 2, 4 rows x 4
        assert!(plan_quantize(
            &QuantizeFp8Args {
                out: host_view(&mem, DType::F8E4M3, 0, &[0, 8], &[8, 1]),
                scale: host_view(&mem, DType::F32, 0, &[0, 1], &[1, 1]),
                x: host_view(&mem, DType::BF16, 0, &[0, 8], &[8, 1]),
            },
            QuantKernel::Wide,
            132
        )
        .unwrap()
        .is_empty());
    }
}
