//! MlaDecodeAttention: split-KV ("flash-decoding") attention over the paged latent cache
//! (`kernels-cuda/mla_decode_attention.cu` and its headers in
//! `kernels-cuda/mla_decode_attention/`, whose comments describe the kernels).
//!
//! Each call launches two kernels on the queue's stream and nothing else:
//! 1. the main kernel, grid (parts, row blocks): the KV tiles of all sequences are cut into
//!    `parts` equal ranges, each CTA computing its range from `seq_lens` on the device (no
//!    host sync, no metadata kernel), and writing either the final output of a sequence it
//!    holds whole or one normalized partial per sequence it holds a piece of; the wgmma
//!    kernels first try giving every part whole sequences when the batch is balanced enough
//!    (`schedule.cuh`, whole-sequence mode), which needs no partials;
//! 2. the combine kernel, which merges the partials of cut sequences by their log-sum-exp
//!    and writes empty sequences (out = 0, lse = -inf).
//!
//! Kernel choice (bf16/f16 with D = 576, Dv = 512 and 16-byte aligned rows): on sm_90 the
//! narrow wgmma kernel (16 or 32 rows per CTA, products transposed) when the query rows per
//! sequence (s_q * N) are at most 32 and the cache is read through the TMA (block sizes that
//! are multiples of 64), else, above 32 query rows through the TMA, the three-warpgroup wgmma
//! kernel (64 query rows per CTA: S and the softmax in one warpgroup, P V split over two), else
//! the two-warpgroup wgmma kernel (64 rows) when they exceed 16, else the mma.sync kernel with
//! 16 rows per CTA; elsewhere the mma.sync kernel (16, 32 or 64 rows per CTA).
//! f32, other head dims and unaligned views take the generic kernel; an fp8_ds_mla cache
//! takes on sm_90 the narrow wgmma kernel's fp8 form at most 32 query rows (a producer warp
//! fills a ring of raw rows, one TMA box a tile when 64 divides the block size, both products
//! take the cache operand from registers, S^T as an fp8 product against the query split in two
//! e4m3 parts), above that with bf16 queries through the TMA the three-warpgroup kernel's
//! raw-ring form (S as an e4m3 product on the codes as loaded, V dequantized by the warpgroups
//! that multiply it), else the 64-row wgmma kernel's fp8 form (a third warpgroup
//! dequantizing), elsewhere the mma.sync kernels.
//!
//! This file is the dispatch (`choose`: which kernel, how many parts; `launches`: the
//! argument block and the two launches). Each kernel family plans its main launch in its own
//! file, beside its header: `generic` (`generic.cuh`), `mma_sm80` (`mma_sm80.cuh`),
//! `wgmma_sm90` (`wgmma_sm90.cuh`), and the combine kernel in `combine`
//! (`combine.cuh`); `workspace` holds the partial buffers. What these files plan with is
//! checked against the kernel headers by the NVRTC test in `facts.rs`. A new family is a
//! header, a planning file returning a `MainKernel`, a [`Kernel`] variant and its arm in
//! `choose` (and its facts: `MLA_FACTS` beside its entry points, its rows in `facts.rs`).
//!
//! Partial buffers: `(parts + B) * s_q * N * Dv` f32 plus lse and a per-sequence index,
//! allocated on the first call and cached per queue (stream), grown only when a larger
//! shape arrives; after that warm-up a call allocates nothing, reads nothing back and never
//! waits, so a decode step can be captured in a CUDA graph. Once a graph has been captured
//! on the queue, outgrown buffers are kept until the queue is dropped (a graph may still use
//! them): capture the largest batch first (mla-block's `DecodeGraphs` does) and nothing is
//! kept.

#[cfg(test)]
mod choice_tests;
mod combine;
#[cfg(test)]
pub(crate) mod facts;
mod generic;
mod mma_sm80;
pub mod timeline;
mod wgmma_sm90;
mod workspace;

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use vt_core::{DType, Error, MlaDecodeAttentionArgs, OpId, Queue, Result, Tensor};

use crate::device::BACKEND;
use crate::launch::KernelStruct;
use crate::{kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("mla_decode_attention");

const OP: OpId = OpId::MlaDecodeAttention;
/// Fast-path head and value dims (DeepSeek MLA: kv_lora_rank 512 + rope 64): `mla::FD`,
/// `mla::FDV`, what the tensor-core kernels are built for.
const FAST_D: i64 = 576;
const FAST_DV: i64 = 512;
/// KV tokens per tile, the unit of the split (`mla::BN`).
const TILE_TOKENS: i64 = 64;
/// Threads of the tensor-core and combine kernels (`mla::THREADS`: 8 warps).
const THREADS: u32 = 256;
/// The most dynamic shared memory a block may have on sm_80/sm_90.
const MAX_SMEM: u32 = 232_448;

/// The kernels' argument block; must match `mla::Params` in
/// `kernels-cuda/mla_decode_attention/params.cuh` (`facts.rs` checks every field's offset
/// and size against it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    q: u64,
    out: u64,
    lse: u64,
    cache: u64,
    block_table: u64,
    seq_lens: u64,
    part_o: u64,
    part_lse: u64,
    seq_info: u64,
    q_sb: i64,
    q_ss: i64,
    q_sh: i64,
    o_sb: i64,
    o_ss: i64,
    o_sh: i64,
    l_sb: i64,
    l_sh: i64,
    l_ss: i64,
    c_sblk: i64,
    c_srow: i64,
    bt_sb: i64,
    bt_sm: i64,
    sl_s: i64,
    b: i32,
    s_q: i32,
    n: i32,
    d: i32,
    dv: i32,
    nb: i32,
    bs: i32,
    mb: i32,
    m_total: i32,
    num_parts: i32,
    min_tiles: i32,
    combine_wpr: i32,
    scale_log2: f32,
}

// SAFETY: plain old data with the C layout of the kernel's `mla::Params` (same field order
// and types), passed by value as the kernels' first parameter; its addresses are validated
// views or workspaces sized for the call (see `launches`).
unsafe impl KernelStruct for Params {}

/// Which kernel computes the attention. The op always uses [`Kernel::Auto`]; the others are
/// for benchmarks and tests ([`mla_decode_attention_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Auto,
    Generic,
    /// mma.sync with the full KV ring (5 half tiles at 16/32 rows, 4 at 64).
    Mma,
    /// mma.sync with the small KV ring (3 half tiles, 2 at 64 rows): what a device with
    /// less shared memory per block than the full ring needs (an A100) gets.
    MmaSmall,
    Wgmma,
    /// The narrow wgmma kernel (sm_90a): both products transposed so the KV tile's tokens
    /// fill wgmma's M and 16 or 32 query rows its N (nothing padded to 64 rows).
    WgmmaNarrow,
    /// The 64-row wgmma kernel with FlashMLA's seesaw schedule (sm_90a, a 16-bit cache whose
    /// block size is a multiple of 64, TMA loads): both warpgroups compute S, for alternate
    /// tiles, and each holds half of O's columns.
    WgmmaSeesaw,
    /// The 64-row wgmma kernel with three warpgroups over a 16-bit cache (sm_90a): warpgroup 0
    /// computes S and the softmax, warpgroups 1 and 2 one half of P V each. TMA loads where the
    /// block size is a multiple of 64 (`wgmma_3wg`), else its gather form (`wgmma_3wg_cp`: any
    /// block size, rows copied by cp.async; Auto's choice at most 16 rows over such a cache).
    Wgmma3,
    /// The 64-row wgmma kernel over an fp8_ds_mla cache with S on the raw codes (sm_90a, bf16
    /// queries): a two-slot ring of raw tiles, S as an e4m3 product against the query split
    /// into two e4m3 parts, O^T = V^T P^T with V^T built in registers from the codes by the two
    /// warpgroups that multiply it. TMA loads where the block size is a multiple of 64
    /// (`wgmma_fp8r`), else its gather form (`wgmma_fp8r_cp`: any block size, rows copied by
    /// cp.async; forced or `VT_MLA_GATHER` only).
    WgmmaFp8Raw,
    /// The 64-row wgmma kernel over an fp8_ds_mla cache as CTA pairs (sm_90a; `wgmma_fp8x2`):
    /// [`Kernel::Wgmma`]'s fp8 form in clusters of two CTAs along the row blocks, each CTA
    /// gathering and dequantizing half of every tile into both CTAs' stages (distributed shared
    /// memory). Needs an even number of 64-row blocks (128 heads, or 64 heads x 2 query tokens).
    /// Auto takes it with `VT_MLA_FP8_PAIR` on (the default) where the two-warpgroup fp8 form
    /// would run.
    WgmmaFp8Pair,
    /// [`Kernel::Wgmma3`] over a 16-bit cache read through the TMA as CTA pairs (sm_90a;
    /// `wgmma_3wg_x2`): the two CTAs of a cluster are consecutive row blocks of the same parts,
    /// each issues every other column block of a tile multicast to both, so the pair reads each
    /// tile once. Needs an even number of 64-row blocks and a block size 64 divides, or of 16 or
    /// 32 rows (its paged form, `wgmma_3wg_x2_pg`, as [`Kernel::Wgmma3Paged`]). Auto takes it
    /// with `VT_MLA_3WG_PAIR` on (the default).
    Wgmma3Pair,
    /// [`Kernel::Wgmma3`] over a 16-bit cache of 16- or 32-row pages read through the TMA
    /// (sm_90a; `wgmma_3wg_pg`): a 64-token tile is 2-4 pages, each loaded as one TMA box of BS
    /// rows per 64 features, pages with a block id outside the cache masked. Auto takes it (or
    /// its pairs) above 32 query rows over such a cache.
    Wgmma3Paged,
}

/// Knobs of [`mla_decode_attention_with`]; `Default` is what the op uses.
#[derive(Clone, Copy, Debug)]
pub struct DecodeOptions {
    pub kernel: Kernel,
    /// Fewest KV tiles (64 tokens) per part; `None`: the built-in choice.
    pub min_tiles: Option<u32>,
    /// Upper bound on the number of parts; `None`: one CTA per SM.
    pub max_parts: Option<u32>,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions { kernel: Kernel::Auto, min_tiles: None, max_parts: None }
    }
}

/// What one call launched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// `generic`, `mma16`, `mma32`, `mma64` (`mma16s`, ... with the small ring), `wgmma`,
    /// `wgmma_tma`, `wgmma_ss` (the seesaw form), `wgmma_n16[_tma]`, `wgmma_n32[_tma]`; over an
    /// fp8_ds_mla cache the same names with `_fp8` (`generic_fp8`, `mma64_fp8`, `wgmma_n16_fp8`,
    /// `wgmma_fp8`, ...); the three-warpgroup kernels `wgmma_3wg` and, over an fp8_ds_mla cache,
    /// `wgmma_fp8r` (the raw-ring kernel), with `_cp` their gather forms; `wgmma_3wg_x2` the CTA
    /// pairs; `wgmma_3wg_pg` and `wgmma_3wg_x2_pg` over pages of 16 or 32 rows.
    pub kernel: &'static str,
    /// Query rows per CTA of the main kernel (1 for the generic kernel).
    pub rows_per_cta: u32,
    /// grid.y of the main kernel.
    pub row_blocks: u32,
    /// grid.x of the main kernel.
    pub parts: u32,
    pub min_tiles: u32,
}

/// The op as registered.
pub(crate) fn run(q: &Queue, a: &MlaDecodeAttentionArgs<'_>) -> Result<()> {
    mla_decode_attention_with(q, a, &DecodeOptions::default()).map(|_| ())
}

/// What the kernels need to know about a device, looked up once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceInfo {
    /// Compute capability, major * 10 + minor.
    pub sm: u32,
    pub sms: u32,
    /// The module holds the sm_90a wgmma kernels.
    pub wgmma: bool,
    /// Largest dynamic shared memory a CTA may opt into (227 KB on the H200, 163 KB on an
    /// A100): Auto takes the mma kernels' small KV ring where the full one does not fit,
    /// and the generic kernel where neither does.
    pub smem_optin: u32,
    /// Clusters of the pair kernel (`mla_decode_wgmma_fp8x2`) resident at once (0: the module
    /// has none, or the driver did not say): its parts are capped so that one wave holds them.
    pub pair_clusters: u32,
}

static DEVICES: LazyLock<Mutex<HashMap<usize, DeviceInfo>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    m.lock().map_err(|_| Error::op_failed(OP, BACKEND, "a cache lock was poisoned by a panic"))
}

fn device_info(cq: &CudaQueue, ordinal: usize) -> Result<DeviceInfo> {
    if let Some(i) = lock(&DEVICES)?.get(&ordinal) {
        return Ok(*i);
    }
    let sms = cq.sm_count()?;
    // The wgmma kernels exist only when the module was built for sm_90a.
    let wgmma = cq.sm() == 90 && cq.function(&SRC, "mla_decode_wgmma", DType::BF16).is_ok();
    let smem_optin = cq.smem_optin()?;
    let pair_clusters = if wgmma && wgmma_sm90::SMEM <= smem_optin {
        let pair = wgmma_sm90::fp8_pair();
        let probe =
            Launch::new(&SRC, pair.base, DType::BF16, (1, wgmma_sm90::PAIR_CTAS, 1), pair.threads, vec![])
                .with_smem(pair.smem);
        // A failed query only takes the pair kernel off this device: said once (device_info
        // runs once per device), and the forced kernel's refusal shows 0 resident.
        cq.max_active_clusters(OP, &probe).unwrap_or_else(|e| {
            tracing::warn!("{OP}: the CTA-pair kernel's occupancy query failed, the kernel is off: {e}");
            0
        })
    } else {
        0
    };
    let info = DeviceInfo { sm: cq.sm(), sms, wgmma, smem_optin, pair_clusters };
    lock(&DEVICES)?.insert(ordinal, info);
    Ok(info)
}

fn to_i32(arg: &'static str, what: &str, v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(OP, arg, format!("{what} = {v} exceeds the i32 range")))
}

/// 16-byte aligned start and strides (of `dims`) that are multiples of 8 elements: rows can
/// be moved with 16-byte copies.
fn rows_aligned(t: &Tensor<'_>, dims: &[usize]) -> bool {
    t.data_addr().is_multiple_of(16) && dims.iter().all(|&d| t.stride(d) % 8 == 0)
}

/// Whether the tensor-core kernels take these arguments: a 16-bit query, D = 576, Dv = 512,
/// query and out rows movable with 16-byte copies, and a 16-bit cache likewise or an
/// fp8_ds_mla cache whose 656-byte rows start 16-byte aligned (the mma kernels only).
fn tensor_core_ok(a: &MlaDecodeAttentionArgs<'_>) -> bool {
    let cache_ok = if a.cache.dtype() == DType::Fp8DsMla {
        a.cache.data_addr().is_multiple_of(16) && a.cache.stride(0) % 16 == 0 && a.cache.stride(1) % 16 == 0
    } else {
        rows_aligned(&a.cache, &[0, 1])
    };
    a.query.dim(3) == FAST_D
        && a.out.dim(3) == FAST_DV
        && a.query.dtype() != DType::F32
        && rows_aligned(&a.query, &[0, 1, 2])
        && cache_ok
        && rows_aligned(&a.out, &[0, 1, 2])
}

/// MlaDecodeAttention with explicit kernel choices (the op itself uses the defaults).
/// The arguments must have passed `vt_core::mla_decode_attention`'s validation: call that
/// entry point for the op; this function is for benchmarks and tests, which call it with
/// views they built to the contract. Returns what was launched.
pub fn mla_decode_attention_with(
    q: &Queue,
    a: &MlaDecodeAttentionArgs<'_>,
    opts: &DecodeOptions,
) -> Result<Plan> {
    let cq = CudaQueue::of(q, OP)?;
    let (b, m_total, dv) = (a.query.dim(0), a.query.dim(1) * a.query.dim(2), a.out.dim(3));
    if b == 0 || m_total == 0 {
        return Ok(Plan { kernel: "none", rows_per_cta: 0, row_blocks: 0, parts: 0, min_tiles: 0 });
    }
    let info = device_info(cq, q.device().ordinal)?;
    let tma = vt_core::flags::mla_decode_tma();
    let flags = ChoiceFlags {
        tma,
        seesaw: vt_core::flags::mla_seesaw(),
        three_wg: vt_core::flags::mla_three_wg(),
        gather: vt_core::flags::mla_gather(),
        pair: vt_core::flags::mla_fp8_pair(),
        three_wg_pair: vt_core::flags::mla_3wg_pair(),
        combine_stride: vt_core::flags::mla_combine_stride(),
    };
    let c = choose(a, &info, opts, flags)?;
    let ws = workspace::workspace(q, cq, c.plan.parts as i64 + b, m_total, dv, b)?;
    cq.run(OP, &launches(a, &c, &info, ws)?)?;
    Ok(c.plan)
}

/// A kernel family's main launch for one call, as its planning file makes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MainKernel {
    /// The entry point without its dtype (`mla_decode_mma16`: `mla_decode_mma16_bf16`, ...).
    pub base: &'static str,
    /// [`Plan::kernel`].
    pub name: &'static str,
    /// Query rows per CTA (grid.y = ceil(s_q * N / rows)).
    pub rows: i64,
    /// Dynamic shared memory per CTA, bytes.
    pub smem: u32,
    pub threads: u32,
    /// CTAs per cluster along grid.y, the kernel's `__cluster_dims__` (1: no cluster); grid.y
    /// is then a multiple of it.
    pub cluster_y: u32,
    /// The tensor maps of the cache the kernel takes as its second parameter.
    pub maps: CacheMaps,
    /// CTAs per SM the number of parts is sized for.
    pub ctas_per_sm: i64,
}

/// The cache's tensor maps a main kernel takes (its second parameter), if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CacheMaps {
    /// No second parameter: the kernel loads the cache by cp.async or bulk copies.
    None,
    /// One map of whole rows in boxes of 64 tokens ([`wgmma_sm90::cache_map`]).
    Tiles,
    /// The raw-ring kernel's two maps of an fp8_ds_mla cache ([`wgmma_sm90::fp8_raw_maps`]).
    Fp8Rows,
}

impl CacheMaps {
    /// [`CacheMaps::Tiles`] when the TMA loads are taken, else [`CacheMaps::None`].
    pub(crate) fn tiles(tma: bool) -> CacheMaps {
        if tma {
            CacheMaps::Tiles
        } else {
            CacheMaps::None
        }
    }
}

/// What [`choose`] picked: the plan and the main kernel's launch shape.
#[derive(Clone, Debug)]
pub(crate) struct Choice {
    pub plan: Plan,
    main: MainKernel,
    combine_wpr: i64,
    /// The combine's strided form (`VT_MLA_COMBINE_STRIDE`).
    combine_stride: bool,
}

/// The `VT_*` flags [`choose`] follows, passed in so that the choice tests do not depend on
/// the environment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChoiceFlags {
    /// `VT_MLA_DECODE_TMA`: the cache may be read through the TMA.
    pub tma: bool,
    /// `VT_MLA_SEESAW` (Auto only).
    pub seesaw: bool,
    /// `VT_MLA_3WG` (Auto only): the three-warpgroup kernels above 32 query rows.
    pub three_wg: bool,
    /// `VT_MLA_GATHER` (Auto only): their gather forms where the TMA does not read the cache.
    pub gather: bool,
    /// `VT_MLA_FP8_PAIR` (Auto only): the fp8 form of the 64-row kernel as CTA pairs.
    pub pair: bool,
    /// `VT_MLA_3WG_PAIR` (Auto only): the 16-bit three-warpgroup kernel as CTA pairs.
    pub three_wg_pair: bool,
    /// `VT_MLA_COMBINE_STRIDE`: the combine kernel's strided form.
    pub combine_stride: bool,
}

impl ChoiceFlags {
    /// `tma` and `seesaw` as given, `three_wg` on, the CTA pairs and the gather forms off (the
    /// tests that check those turn them on).
    #[cfg(test)]
    pub(crate) fn new(tma: bool, seesaw: bool) -> ChoiceFlags {
        ChoiceFlags {
            tma,
            seesaw,
            three_wg: true,
            gather: false,
            pair: false,
            three_wg_pair: false,
            combine_stride: false,
        }
    }
}

/// The kernel, its shared memory and the number of parts for a call with `b > 0` sequences
/// and `s_q * N > 0` query rows on a device described by `info`, following `flags`.
pub(crate) fn choose(
    a: &MlaDecodeAttentionArgs<'_>,
    info: &DeviceInfo,
    opts: &DecodeOptions,
    flags: ChoiceFlags,
) -> Result<Choice> {
    let ChoiceFlags {
        tma: tma_flag,
        seesaw: seesaw_flag,
        three_wg: three_wg_flag,
        gather: gather_flag,
        pair: pair_flag,
        three_wg_pair: three_wg_pair_flag,
        combine_stride,
    } = flags;
    let (b, s_q, n) = (a.query.dim(0), a.query.dim(1), a.query.dim(2));
    let m_total = s_q * n;
    let fits = |bytes: u32| bytes <= info.smem_optin;
    let fast = tensor_core_ok(a);
    let fp8 = a.cache.dtype() == DType::Fp8DsMla;
    let kernel = match opts.kernel {
        Kernel::Auto if !fast => Kernel::Generic,
        // At most 32 query rows over a 16-bit cache the TMA loads: the narrow wgmma kernel
        // (H200, same call as FlashMLA: 0.87x the mma16 kernel's time at 16 heads, b 128,
        // s 4096, 0.96x the 64-row wgmma kernel's at 32 heads; with cp.async loads, block
        // sizes 1 and 16, it was 1.40x / 1.03x the mma16 kernel's: docs/perf.md).
        Kernel::Auto
            if !fp8
                && info.wgmma
                && m_total <= 32
                && wgmma_sm90::narrow(a, m_total, tma_flag).maps == CacheMaps::Tiles
                && fits(wgmma_sm90::narrow_smem(32)) =>
        {
            Kernel::WgmmaNarrow
        }
        // At most 32 query rows over an fp8_ds_mla cache: the narrow kernel's fp8 form
        // (its first version, H200 call 3 of 2026-12-01: 0.90x the mma16_fp8 kernel's time at
        // h16 b128 s4096, 0.82x the mma32_fp8 kernel's at h32 b128 s8192; the register-operand
        // form of 2026-12-03 is 0.64x the first at h16 b128 s4096 with the TMA: docs/perf.md;
        // at 64 and 128 heads, 16 or 32 rows per CTA re-read the cache per row block: 1.13x /
        // 1.18x the mma64_fp8 kernel's, so those keep it).
        Kernel::Auto
            if fp8
                && info.wgmma
                && m_total <= 32
                && fits(wgmma_sm90::narrow_fp8_smem(wgmma_sm90::narrow_rows(m_total))) =>
        {
            Kernel::WgmmaNarrow
        }
        // With VT_MLA_SEESAW on (off by default: racecheck), over a 16-bit cache read through
        // the TMA, with two or more row blocks and a full batch: the 64-row kernel's seesaw form
        // (H200, same calls: 3-6% faster at 128 heads and B 64 / 128 in its fastest form, 4%
        // slower at 128 heads B 32 and 0-10% slower at 64 heads, where one row block is
        // memory-bound and the seesaw's later loads cost; docs/perf.md, "Fifteenth session").
        Kernel::Auto
            if info.wgmma
                && m_total > wgmma_sm90::ROWS as i64
                && b >= wgmma_sm90::SEESAW_MIN_BATCH
                && fits(wgmma_sm90::SMEM)
                && seesaw_flag
                && wgmma_sm90::seesaw_ok(a, tma_flag) =>
        {
            Kernel::WgmmaSeesaw
        }
        // With VT_MLA_3WG_PAIR on (the default since the thirty-first session, when the block's
        // step and its CUDA graphs ran with it), over a 16-bit cache read through the TMA with
        // row blocks in pairs and at least THREE_WG_PAIR_MIN_BATCH sequences: the
        // three-warpgroup kernel below as CTA pairs reading each tile once (thirtieth session,
        // same calls as FlashMLA: on an H100 0.92-0.95x the single CTAs' time at 128 heads b128
        // s8192 and b64 s16384, 0.95-0.99x at b128 s4096 and b32, 1.03-1.04x at b1; on an H200,
        // interleaved, 0.98-1.00x at b >= 64, 0.98x at b32, 1.00x at b1; docs/perf.md).
        Kernel::Auto
            if !fp8
                && info.wgmma
                && three_wg_flag
                && three_wg_pair_flag
                && b >= wgmma_sm90::THREE_WG_PAIR_MIN_BATCH
                && info.pair_clusters > 0
                && wgmma_sm90::pair_ok(m_total)
                && wgmma_sm90::three_wg_tma_ok(a, tma_flag)
                && fits(wgmma_sm90::w3_smem(false)) =>
        {
            Kernel::Wgmma3Pair
        }
        // Over a 16-bit cache of 16- or 32-row pages, more than 32 query rows: the
        // three-warpgroup kernel's paged TMA form (thirty-ninth session: the two-warpgroup
        // cp.async kernel took h128 b32 s4096 1.35x its time at block size 64 there).
        Kernel::Auto
            if !fp8
                && info.wgmma
                && three_wg_flag
                && m_total > 32
                && wgmma_sm90::three_wg_paged_ok(a, tma_flag)
                && fits(wgmma_sm90::w3_smem(false)) =>
        {
            Kernel::Wgmma3Paged
        }
        // More than 32 query rows over a cache read through the TMA (block sizes that 64
        // divides): the 64-row kernel with three warpgroups, S and the softmax in one, P V split
        // over the other two (H200, same call as FlashMLA, 2026-12-05: 5-13% faster than the
        // two-warpgroup kernel at every 64 / 128-head shape; over an fp8_ds_mla cache with bf16
        // queries its raw-ring form, 19-23% faster than the dequantizing warpgroup's:
        // docs/perf.md, "Eighteenth session").
        // With VT_MLA_GATHER on (off by default: at h128 b32 they were 1.00x the cp.async
        // wgmma kernel's time at block size 1 and 1.08x at 16, H100, twenty-fourth session), also
        // over a cache the TMA does not read: the same kernels' gather forms, rows copied by
        // cp.async (docs/perf.md, "Twentieth session"); `three_wg` / `fp8_raw` pick the form.
        Kernel::Auto
            if info.wgmma
                && three_wg_flag
                && m_total > 32
                && if wgmma_sm90::three_wg_ok(a, tma_flag) || wgmma_sm90::fp8_raw_ok(a, tma_flag) {
                    fits(wgmma_sm90::w3_smem(fp8))
                } else {
                    gather_flag
                        && (!fp8 || wgmma_sm90::fp8_raw_dtypes(a))
                        && fits(wgmma_sm90::w3_cp_smem(fp8))
                } =>
        {
            if fp8 {
                Kernel::WgmmaFp8Raw
            } else {
                Kernel::Wgmma3
            }
        }
        // At most 16 query rows over a 16-bit cache the TMA does not read (block sizes 1, 16,
        // ...): the three-warpgroup kernel's gather form, its 64-row tile mostly padding (H100,
        // twenty-fourth session: 0.86x the mma16 kernel's time at h16 b128 s4096 block size 1,
        // 0.96x at block size 16; docs/perf.md). Above 16 rows the cp.async wgmma kernels below
        // keep these caches (at h128 b32 the gather form was 1.00x at block size 1, 1.08x at 16).
        Kernel::Auto
            if !fp8
                && info.wgmma
                && three_wg_flag
                && m_total <= 16
                && !wgmma_sm90::three_wg_ok(a, tma_flag)
                && fits(wgmma_sm90::w3_cp_smem(false)) =>
        {
            Kernel::Wgmma3
        }
        // More than 16 query rows (over an fp8_ds_mla cache: more than 32, fewer take the
        // narrow kernel above): the 64-row wgmma kernel (its fp8 form dequantizes in a third
        // warpgroup: docs/perf.md).
        // With VT_MLA_FP8_PAIR on (the default), over an fp8_ds_mla cache with row blocks in
        // pairs: the same kernel as CTA pairs (docs/sparse-design.md, D3; H100, twenty-seventh
        // session: 0.80-0.84x the single-CTA kernel's time on the sparse op at 128 heads, b 64-148,
        // 1.03x at b 2).
        Kernel::Auto
            if fp8
                && pair_flag
                && info.wgmma
                && info.pair_clusters > 0
                && wgmma_sm90::pair_ok(m_total)
                && fits(wgmma_sm90::SMEM) =>
        {
            Kernel::WgmmaFp8Pair
        }
        Kernel::Auto if info.wgmma && m_total > 16 && fits(wgmma_sm90::SMEM) => Kernel::Wgmma,
        Kernel::Auto if mma_sm80::smem_for(m_total, false, fp8).is_some_and(fits) => Kernel::Mma,
        // Less shared memory per block than the full ring needs (an A100): the small ring.
        Kernel::Auto if mma_sm80::smem_for(m_total, true, fp8).is_some_and(fits) => Kernel::MmaSmall,
        Kernel::Auto => Kernel::Generic,
        Kernel::Mma
        | Kernel::MmaSmall
        | Kernel::Wgmma
        | Kernel::WgmmaNarrow
        | Kernel::WgmmaSeesaw
        | Kernel::Wgmma3
        | Kernel::WgmmaFp8Raw
        | Kernel::WgmmaFp8Pair
        | Kernel::Wgmma3Pair
        | Kernel::Wgmma3Paged
            if !fast =>
        {
            return Err(Error::backend(
                BACKEND,
                format!(
                    "{OP}: the tensor-core kernels need bf16/f16, D = 576, Dv = 512, rows movable in \
                     16-byte chunks"
                ),
            ))
        }
        Kernel::Wgmma
        | Kernel::WgmmaNarrow
        | Kernel::WgmmaSeesaw
        | Kernel::Wgmma3
        | Kernel::WgmmaFp8Raw
        | Kernel::WgmmaFp8Pair
        | Kernel::Wgmma3Pair
        | Kernel::Wgmma3Paged
            if !info.wgmma =>
        {
            return Err(Error::backend(BACKEND, format!("{OP}: no sm_90a wgmma kernel on this device")))
        }
        Kernel::WgmmaSeesaw if !wgmma_sm90::seesaw_ok(a, tma_flag) => {
            return Err(Error::backend(
                BACKEND,
                format!(
                    "{OP}: the seesaw kernel needs a 16-bit cache read through the TMA (block size a \
                     multiple of 64, VT_MLA_DECODE_TMA on)"
                ),
            ))
        }
        Kernel::Wgmma3 if fp8 => {
            return Err(Error::backend(
                BACKEND,
                format!(
                    "{OP}: the three-warpgroup kernel needs a 16-bit cache; over an fp8_ds_mla cache \
                     force the raw-ring fp8 kernel"
                ),
            ))
        }
        Kernel::WgmmaFp8Pair if !fp8 || !wgmma_sm90::pair_ok(m_total) || info.pair_clusters == 0 => {
            return Err(Error::backend(
                BACKEND,
                format!(
                    "{OP}: the pair kernel needs an fp8_ds_mla cache, an even number of 64-row blocks \
                     (s_q * N = {m_total}) and a device that holds its clusters ({} resident)",
                    info.pair_clusters
                ),
            ))
        }
        Kernel::Wgmma3Pair
            if fp8
                || !wgmma_sm90::pair_ok(m_total)
                || !wgmma_sm90::three_wg_tma_ok(a, tma_flag)
                || info.pair_clusters == 0 =>
        {
            return Err(Error::backend(
                BACKEND,
                format!(
                    "{OP}: the three-warpgroup pair kernel needs a 16-bit cache read through the TMA \
                     (block size 16, 32 or a multiple of 64, VT_MLA_DECODE_TMA on), an even number of \
                     64-row blocks (s_q * N = {m_total}) and a device that holds its clusters ({} \
                     resident)",
                    info.pair_clusters
                ),
            ))
        }
        Kernel::Wgmma3Paged if !wgmma_sm90::three_wg_paged_ok(a, tma_flag) => {
            return Err(Error::backend(
                BACKEND,
                format!(
                    "{OP}: the three-warpgroup kernel's paged form needs a 16-bit cache of block size 16 \
                     or 32 (got {}) read through the TMA (VT_MLA_DECODE_TMA on)",
                    a.cache.dim(1)
                ),
            ))
        }
        Kernel::WgmmaFp8Raw if !wgmma_sm90::fp8_raw_dtypes(a) => {
            return Err(Error::backend(
                BACKEND,
                format!("{OP}: the raw-ring fp8 kernel needs bf16 queries over an fp8_ds_mla cache"),
            ))
        }
        k => k,
    };

    let no_kernel = |what: &str| Error::backend(BACKEND, format!("{OP}: {what}"));
    let main = match kernel {
        Kernel::Wgmma if fp8 => wgmma_sm90::fp8(),
        Kernel::Wgmma => wgmma_sm90::main(a, tma_flag),
        Kernel::WgmmaSeesaw => wgmma_sm90::seesaw(),
        Kernel::Wgmma3 => wgmma_sm90::three_wg(a, tma_flag),
        Kernel::WgmmaFp8Raw => wgmma_sm90::fp8_raw(a, tma_flag),
        Kernel::WgmmaFp8Pair => wgmma_sm90::fp8_pair(),
        Kernel::Wgmma3Pair => wgmma_sm90::three_wg_pair(wgmma_sm90::three_wg_paged_ok(a, tma_flag)),
        Kernel::Wgmma3Paged => wgmma_sm90::three_wg_paged(),
        Kernel::WgmmaNarrow => wgmma_sm90::narrow(a, m_total, tma_flag),
        Kernel::Mma => {
            mma_sm80::main(m_total, false, fp8).ok_or_else(|| no_kernel("no mma kernel for this shape"))?
        }
        Kernel::MmaSmall => mma_sm80::main(m_total, true, fp8).ok_or_else(|| {
            no_kernel("no small-ring kernel for 64 query rows per CTA over an fp8_ds_mla cache")
        })?,
        Kernel::Generic | Kernel::Auto => generic::main(a)?,
    };
    if kernel != Kernel::Generic && !fits(main.smem) {
        return Err(Error::backend(
            BACKEND,
            format!(
                "{OP}: the {} kernel needs {} bytes of shared memory per block, this device allows {}",
                main.name, main.smem, info.smem_optin
            ),
        ));
    }
    let row_blocks = (m_total + main.rows - 1) / main.rows;
    if row_blocks > 65_535 || m_total > 65_535 {
        return Err(Error::invalid(
            OP,
            "query",
            format!("s_q * N = {m_total} query rows per sequence is too many"),
        ));
    }
    // One CTA per SM for the tensor-core kernels (their shared memory allows no more); the
    // small generic kernel gets 8.
    let mut parts = (info.sms as i64 * main.ctas_per_sm / row_blocks).max(1);
    if main.cluster_y > 1 {
        // One wave of clusters: a part is row_blocks / cluster_y clusters.
        parts = parts.min((info.pair_clusters as i64 * main.cluster_y as i64 / row_blocks).max(1));
    }
    if let Some(mp) = opts.max_parts {
        parts = parts.min(mp.max(1) as i64);
    }
    let min_tiles = opts.min_tiles.unwrap_or(1).max(1);
    let plan = Plan {
        kernel: main.name,
        rows_per_cta: main.rows as u32,
        row_blocks: row_blocks as u32,
        parts: parts as u32,
        min_tiles,
    };
    Ok(Choice { plan, main, combine_wpr: combine::warps_per_row(parts, b), combine_stride })
}

/// The main and combine launches of `c`, with the split-KV workspace `(part_o, part_lse,
/// seq_info)` sized for `c.plan.parts + B` partials of `s_q * N` rows of Dv. The kernels
/// never index past the shapes and strides passed beside the addresses (block ids and
/// lengths read on the device are clamped; the TMA map bounds every read by the cache's
/// dims, blocks outside it reading zeros).
pub(crate) fn launches(
    a: &MlaDecodeAttentionArgs<'_>,
    c: &Choice,
    info: &DeviceInfo,
    (part_o, part_lse, seq_info): (u64, u64, u64),
) -> Result<Vec<Launch>> {
    let (b, s_q, n, d) = (a.query.dim(0), a.query.dim(1), a.query.dim(2), a.query.dim(3));
    let (dv, m_total, dt) = (a.out.dim(3), s_q * n, a.query.dtype());
    let l = a.lse;
    let p = Params {
        q: a.query.data_addr(),
        out: a.out.data_addr(),
        lse: l.map_or(0, |t| t.data_addr()),
        cache: a.cache.data_addr(),
        block_table: a.block_table.data_addr(),
        seq_lens: a.seq_lens.data_addr(),
        part_o,
        part_lse,
        seq_info,
        q_sb: a.query.stride(0),
        q_ss: a.query.stride(1),
        q_sh: a.query.stride(2),
        o_sb: a.out.stride(0),
        o_ss: a.out.stride(1),
        o_sh: a.out.stride(2),
        l_sb: l.map_or(0, |t| t.stride(0)),
        l_sh: l.map_or(0, |t| t.stride(1)),
        l_ss: l.map_or(0, |t| t.stride(2)),
        c_sblk: a.cache.stride(0),
        c_srow: a.cache.stride(1),
        bt_sb: a.block_table.stride(0),
        bt_sm: a.block_table.stride(1),
        sl_s: a.seq_lens.stride(0),
        b: to_i32("query", "B", b)?,
        s_q: to_i32("query", "s_q", s_q)?,
        n: to_i32("query", "N", n)?,
        d: to_i32("query", "D", d)?,
        dv: to_i32("out", "Dv", dv)?,
        nb: to_i32("cache", "number of blocks", a.cache.dim(0))?,
        bs: to_i32("cache", "block size", a.cache.dim(1))?,
        mb: to_i32("block_table", "blocks per sequence", a.block_table.dim(1))?,
        m_total: to_i32("query", "s_q * N", m_total)?,
        num_parts: c.plan.parts as i32,
        min_tiles: c.plan.min_tiles as i32,
        combine_wpr: c.combine_wpr as i32,
        scale_log2: a.scale * std::f32::consts::LOG2_E,
    };
    let mut main_args = vec![Arg::of_struct(p)];
    match c.main.maps {
        CacheMaps::None => {}
        // `mla::TmaMap`: the tensor map of the cache, the TMA kernel's second parameter.
        CacheMaps::Tiles => main_args.push(Arg::TensorMaps(vec![wgmma_sm90::cache_map(&a.cache)])),
        // `mla::RawMaps`: the rows' two maps, one parameter.
        CacheMaps::Fp8Rows => main_args.push(Arg::TensorMaps(wgmma_sm90::fp8_raw_maps(&a.cache).to_vec())),
    }
    let main_grid = (c.plan.parts, c.plan.row_blocks, 1);
    let main =
        Launch::new(&SRC, c.main.base, dt, main_grid, c.main.threads, main_args).with_smem(c.main.smem);
    let combine = combine::launch(&p, dt, (b, m_total, dv), c.combine_wpr, c.combine_stride, info);
    Ok(vec![main, combine])
}
