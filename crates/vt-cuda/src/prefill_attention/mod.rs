//! PrefillAttention: varlen flash attention for the MLA prefill path
//! (`kernels-cuda/prefill_attention.cu` and its headers in `kernels-cuda/prefill_attention/`).
//!
//! Three kernels, one contract (vt-core's `prefill_attention`):
//! - `wgmma` (sm_90a, `sm90.cuh`): FlashAttention-3 style. One CTA = 128 query rows of one
//!   head of one sequence; a producer warpgroup streams K/V tiles of 128 keys through a
//!   two-stage cp.async ring (mbarriers), two consumer warpgroups (64 rows each) run
//!   S = Q K^T and O += P V on wgmma with P kept in registers, the softmax of tile t
//!   overlapping the P V product of tile t - 1.
//! - `mma` (sm_80+, `sm80.cuh`): FlashAttention-2 class mma.sync kernel.
//! - `generic` (any device, any dtype and head dims): the f32 tiled kernel.
//!
//! [`Kernel::Auto`] takes `wgmma` on sm_90 and `mma` on other sm_80+ devices for 16-bit
//! dtypes, head dims (qk, v) in [`FAST_DIMS`] and views whose rows are 16-byte aligned;
//! everything else takes `generic`. Grid (query tiles of `max_seqlen_q`, heads, sequences):
//! sizes come from the arguments, never from lengths read back, so a call can be captured
//! in a CUDA graph.

mod generic;
mod sm80;
mod sm90;

use vt_core::{DType, Error, OpId, PrefillAttentionArgs, Queue, Result, Tensor};

use crate::device::BACKEND;
use crate::launch::KernelStruct;
use crate::{kernel_source, Arg, CudaQueue, KernelSource, Launch};

pub(crate) static SRC: KernelSource = kernel_source!("prefill_attention");
pub(crate) const OP: OpId = OpId::PrefillAttention;

/// Head dims (qk, v) the tensor-core kernels are built for: DeepSeek MLA's prefill shape,
/// and the common non-MLA ones.
pub const FAST_DIMS: [(i64, i64); 3] = [(192, 128), (128, 128), (64, 64)];

/// Which kernel computes the attention. The op uses [`Kernel::Auto`]; the others are for
/// tests and benchmarks ([`prefill_attention_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Auto,
    Generic,
    /// mma.sync (sm_80+), FlashAttention-2 class.
    Mma,
    /// wgmma (sm_90a), FlashAttention-3 class.
    Wgmma,
}

/// The op as registered.
pub(crate) fn run(q: &Queue, a: &PrefillAttentionArgs<'_>) -> Result<()> {
    prefill_attention_with(q, a, Kernel::Auto).map(|_| ())
}

/// The argument block of the tensor-core kernels; must match `pf::Params` in
/// `kernels-cuda/prefill_attention/params.cuh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    q: u64,
    k: u64,
    v: u64,
    out: u64,
    lse: u64,
    cuq: u64,
    cuk: u64,
    q_st: i64,
    q_sh: i64,
    k_st: i64,
    k_sh: i64,
    v_st: i64,
    v_sh: i64,
    o_st: i64,
    o_sh: i64,
    l_sh: i64,
    l_st: i64,
    cuq_s: i64,
    cuk_s: i64,
    tq_total: i64,
    tk_total: i64,
    n_heads: i32,
    n_seqs: i32,
    pub(crate) q_tiles: i32,
    causal: i32,
    scale_log2: f32,
    d: i32,
    dv: i32,
    /// sm90 grid order (see `sm90::grid_order`).
    order: i32,
}

// SAFETY: plain old data with the C layout of the kernel's `pf::Params` (same field order
// and types), passed by value as the kernels' first parameter. Every address in it is a view
// vt-core validated against its allocation; the kernels check each sequence's bounds (read
// on the device) against Tq / Tk and never index past the shapes and strides beside them.
unsafe impl KernelStruct for Params {}

impl Params {
    /// The argument block for query tiles of `tile_rows` rows.
    fn new(a: &PrefillAttentionArgs<'_>, tile_rows: i64) -> Result<Params> {
        let n = a.query.dim(1);
        let b = a.cu_seqlens_q.dim(0) - 1;
        let tiles = (a.max_seqlen_q + tile_rows - 1) / tile_rows;
        grid_fits(tiles, n, b)?;
        let (lse, l_sh, l_st) =
            a.lse.as_ref().map_or((0, 0, 0), |l| (l.data_addr(), l.stride(0), l.stride(1)));
        Ok(Params {
            q: a.query.data_addr(),
            k: a.k.data_addr(),
            v: a.v.data_addr(),
            out: a.out.data_addr(),
            lse,
            cuq: a.cu_seqlens_q.data_addr(),
            cuk: a.cu_seqlens_k.data_addr(),
            q_st: a.query.stride(0),
            q_sh: a.query.stride(1),
            k_st: a.k.stride(0),
            k_sh: a.k.stride(1),
            v_st: a.v.stride(0),
            v_sh: a.v.stride(1),
            o_st: a.out.stride(0),
            o_sh: a.out.stride(1),
            l_sh,
            l_st,
            cuq_s: a.cu_seqlens_q.stride(0),
            cuk_s: a.cu_seqlens_k.stride(0),
            tq_total: a.query.dim(0),
            tk_total: a.k.dim(0),
            n_heads: n as i32,
            n_seqs: b as i32,
            q_tiles: tiles as i32,
            causal: a.causal as i32,
            scale_log2: a.scale * std::f32::consts::LOG2_E,
            // Head dims are checked against FAST_DIMS before a tensor-core kernel is chosen.
            d: i32::try_from(a.query.dim(2)).unwrap_or(0),
            dv: i32::try_from(a.v.dim(2)).unwrap_or(0),
            order: 0,
        })
    }
}

/// CUDA's grid limits (x < 2^31, y and z <= 65535), checked before any narrowing.
pub(crate) fn grid_fits(tiles: i64, n: i64, b: i64) -> Result<()> {
    if tiles > i32::MAX as i64 || n > 65535 || b > 65535 {
        return Err(Error::invalid(
            OP,
            "query",
            format!("grid of {tiles} query tiles x {n} heads x {b} sequences exceeds CUDA's limits"),
        ));
    }
    Ok(())
}

/// A view the tensor-core kernels can load and store with 16-byte accesses (and describe to
/// the tensor memory accelerator): 16-bit elements, a 16-byte aligned first element, token
/// and head strides multiples of 8 (a dim of size 1 ignores its stride), and token counts
/// that fit the TMA's 32-bit coordinates.
fn rows_aligned(t: &Tensor<'_>) -> bool {
    let stride_ok = |d: usize| t.dim(d) == 1 || (t.stride(d) > 0 && (t.stride(d) as u64).is_multiple_of(8));
    t.data_addr().is_multiple_of(16) && stride_ok(0) && stride_ok(1) && t.dim(0) <= i32::MAX as i64
}

/// Whether the tensor-core kernels take these arguments (dtype, head dims, alignment).
fn tensor_core_ok(a: &PrefillAttentionArgs<'_>) -> bool {
    matches!(a.query.dtype(), DType::BF16 | DType::F16)
        && FAST_DIMS.contains(&(a.query.dim(2), a.v.dim(2)))
        && [&a.query, &a.k, &a.v, &a.out].into_iter().all(rows_aligned)
}

/// [`Kernel::Auto`]'s choice for a device of compute capability `sm` (major * 10 + minor).
fn choose(sm: u32, a: &PrefillAttentionArgs<'_>) -> Kernel {
    if !tensor_core_ok(a) {
        Kernel::Generic
    } else if sm == 90 {
        Kernel::Wgmma
    } else if sm >= 80 {
        Kernel::Mma
    } else {
        Kernel::Generic
    }
}

/// PrefillAttention with the kernel chosen by the caller; returns the kernel that ran.
/// Arguments must have passed vt-core's validation (call through `vt_core::prefill_attention`
/// for untrusted input; this entry point is for tests and benchmarks, which validate by
/// calling the op first). A forced tensor-core kernel that cannot take the arguments is a
/// clear error.
pub fn prefill_attention_with(q: &Queue, a: &PrefillAttentionArgs<'_>, kernel: Kernel) -> Result<Kernel> {
    let cq = CudaQueue::of(q, OP)?;
    let (chosen, launches) = plan(cq.sm(), a, kernel)?;
    if !launches.is_empty() {
        cq.run(OP, &launches)?;
    }
    Ok(chosen)
}

/// The launches of one call on a device of compute capability `sm`, planned without the
/// device (plain data; the PTX check in `ptx_check.rs` compares them with the kernels'
/// parameter lists), and the kernel they run. Nothing to launch for an empty problem.
pub(crate) fn plan(sm: u32, a: &PrefillAttentionArgs<'_>, kernel: Kernel) -> Result<(Kernel, Vec<Launch>)> {
    let (n, b) = (a.query.dim(1), a.cu_seqlens_q.dim(0) - 1);
    let chosen = match kernel {
        Kernel::Auto => choose(sm, a),
        k => k,
    };
    if b <= 0 || n == 0 || a.max_seqlen_q == 0 || a.query.dim(0) == 0 {
        return Ok((chosen, Vec::new()));
    }
    if matches!(chosen, Kernel::Mma | Kernel::Wgmma) && !tensor_core_ok(a) {
        return Err(Error::invalid(
            OP,
            "query",
            format!(
                "the {chosen:?} kernel takes bf16/f16, head dims (qk, v) in {FAST_DIMS:?} and 16-byte aligned rows; \
                 got {:?}, ({}, {})",
                a.query.dtype(),
                a.query.dim(2),
                a.v.dim(2)
            ),
        ));
    }
    let launches = match chosen {
        Kernel::Generic | Kernel::Auto => generic::plan(a)?,
        Kernel::Mma => sm80::plan(a, &Params::new(a, sm80::TILE_ROWS)?)?,
        Kernel::Wgmma => {
            if sm != 90 {
                return Err(Error::backend(
                    BACKEND,
                    format!("{OP}: the wgmma kernel needs sm_90, device is sm_{sm}"),
                ));
            }
            sm90::plan(a, &Params::new(a, sm90::TILE_ROWS)?)?
        }
    };
    Ok((chosen, launches))
}

/// The launch of the kernel `{base}_{dtype}` with `smem` bytes of dynamic shared memory and
/// `args`; [`CudaQueue::run`] raises the kernel's shared-memory limit (checked against the
/// device's opt-in limit first).
pub(crate) fn kernel(
    base: &'static str,
    dt: DType,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    args: Vec<Arg>,
) -> Launch {
    Launch::new(&SRC, base, dt, grid, block, args).with_smem(smem)
}
