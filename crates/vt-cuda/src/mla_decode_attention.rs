//! MlaDecodeAttention: split-KV ("flash-decoding") attention over the paged latent cache
//! (`kernels-cuda/mla_decode_attention.cu`, whose header comment describes the kernels).
//!
//! Each call launches two kernels on the queue's stream and nothing else:
//! 1. the main kernel, grid (parts, row blocks): the KV tiles of all sequences are cut into
//!    `parts` equal ranges, each CTA computing its range from `seq_lens` on the device (no
//!    host sync, no metadata kernel), and writing either the final output of a sequence it
//!    holds whole or one normalized partial per sequence it holds a piece of;
//! 2. the combine kernel, which merges the partials of cut sequences by their log-sum-exp
//!    and writes empty sequences (out = 0, lse = -inf).
//!
//! Kernel choice (bf16/f16 with D = 576, Dv = 512 and 16-byte aligned rows): on sm_90 the
//! wgmma kernel (64 query rows per CTA) when the query rows per sequence (s_q * N) exceed
//! 16, else the mma.sync kernel with 16 rows per CTA; elsewhere the mma.sync kernel (16, 32
//! or 64 rows per CTA).
//! f32, other head dims and unaligned views take the generic kernel.
//!
//! Partial buffers: `(parts + B) * s_q * N * Dv` f32 plus lse and a per-sequence index,
//! allocated on the first call and cached per queue (stream), grown only when a larger
//! shape arrives; after that warm-up a call allocates nothing, reads nothing back and never
//! waits, so a decode step can be captured in a CUDA graph. Once a graph has been captured
//! on the queue, outgrown buffers are kept until the queue is dropped (a graph may still use
//! them): capture the largest batch first (mla-block's `DecodeGraphs` does) and nothing is
//! kept.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use cudarc::driver::CudaStream;
use vt_core::{Buffer, DType, Error, MlaDecodeAttentionArgs, OpId, Queue, Result, Tensor};

use crate::device::BACKEND;
use crate::launch::{KernelStruct, TensorMapSpec};
use crate::{kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("mla_decode_attention");

const OP: OpId = OpId::MlaDecodeAttention;
/// Fast-path head and value dims (DeepSeek MLA: kv_lora_rank 512 + rope 64).
const FAST_D: i64 = 576;
const FAST_DV: i64 = 512;
const THREADS: u32 = 256;
const GEN_THREADS: u32 = 128;
/// The most dynamic shared memory a block may have on sm_80/sm_90.
const MAX_SMEM: u32 = 232_448;

/// The kernels' argument block; must match `mla::Params` in the kernel file.
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
    /// `generic`, `mma16`, `mma32`, `mma64` (`mma16s`, ... with the small ring) or `wgmma`.
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
    let info = DeviceInfo { sm: cq.sm(), sms, wgmma, smem_optin };
    lock(&DEVICES)?.insert(ordinal, info);
    Ok(info)
}

/// Dynamic shared memory of the wgmma kernel with `mt` query rows per CTA
/// (`mla::Layout<MT>::SMEM`: Q, two KV tiles, P, reductions, token and bad-block flags,
/// schedule, alignment).
const fn tc_smem(mt: u32) -> u32 {
    let tile = 9 * 64 * 128;
    9 * mt * 128 + 2 * tile + mt * 128 + 2 * 128 * 4 + 2 * 64 + 2 * 8 + 40 * 4 + 2 * 8 + 1024
}

/// Whether the wgmma kernel loads the cache through the TMA: a tile of 64 tokens is one box
/// of 64 rows of one block (64 divides BS) and the block count fits the map's 32-bit
/// coordinates (one past the last block reads zeros). Smaller blocks take the cp.async
/// loads: with one box per block per 64 features, BS = 1 and 16 measured 5.1x and 1.07x
/// slower through the TMA on the H200 (docs/perf.md). The kernel handles any BS dividing 64.
fn tma_ok(cache: &Tensor<'_>) -> bool {
    let bs = cache.dim(1);
    bs > 0 && (bs as u64).is_multiple_of(64) && cache.dim(0) < i32::MAX as i64
}

/// The cache's tensor map: (feature, row in block, block), boxes of 64 features x
/// min(BS, 64) rows x 1 block, 128-byte swizzle (`mla::swz`). The caller checked the rows
/// (16-byte aligned start, strides multiples of 8 elements) and `tma_ok`.
fn cache_map(cache: &Tensor<'_>) -> TensorMapSpec {
    let (nb, bs, d) = (cache.dim(0) as u64, cache.dim(1) as u64, cache.dim(2) as u64);
    // A dim of size 1 may carry any stride; the map wants a positive multiple of 16 bytes.
    let row_bytes = if bs == 1 { d * 2 } else { cache.stride(1) as u64 * 2 };
    let blk_bytes = if nb == 1 { bs * row_bytes } else { cache.stride(0) as u64 * 2 };
    TensorMapSpec {
        what: "cache",
        dtype: cache.dtype(),
        addr: cache.data_addr(),
        dims: [d, bs, nb],
        strides: [row_bytes, blk_bytes],
        boxes: [64, bs.min(64) as u32, 1],
    }
}

/// Half-tile slots of the mma.sync kernels' KV ring (`HS` of `mla_decode_mma{16,32,64}[s]`).
const fn mma_slots(mt: u32, small: bool) -> u32 {
    match (mt <= 32, small) {
        (true, false) => 5,
        (false, false) => 4,
        (true, true) => 3,
        (false, true) => 2,
    }
}

/// Dynamic shared memory of the mma.sync kernels with `mt` query rows per CTA and a ring of
/// `slots` half tiles (`mla::MmaLayout<MT, HS>::SMEM`: Q, the ring, P, reductions, per-tile
/// token and bad-block flags, schedule, alignment).
const fn mma_smem(mt: u32, slots: u32) -> u32 {
    let half = 9 * 32 * 128;
    let ring = slots.div_ceil(2);
    9 * mt * 128 + slots * half + mt * 128 + 2 * 128 * 4 + ring * 64 + ring * 16 + 40 * 4 + 1024
}

/// The split-KV partial buffers of one queue.
struct Workspace {
    stream: Weak<CudaStream>,
    part_o: Option<Buffer>,
    part_lse: Option<Buffer>,
    seq_info: Option<Buffer>,
    /// Buffers outgrown after a graph was captured on the queue: kept until the queue goes,
    /// since a captured graph may still read or write them.
    retired: Vec<Buffer>,
}

static WORKSPACES: LazyLock<Mutex<HashMap<usize, Workspace>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Ensures `slot` holds at least `n` elements of `dtype`, allocating on growth only. An
/// outgrown buffer is freed (cuMemFree waits for queued work using it), or moved to
/// `retired` when `keep` (a graph captured on the queue may still use it).
fn ensure(
    q: &Queue,
    slot: &mut Option<Buffer>,
    retired: &mut Vec<Buffer>,
    keep: bool,
    dtype: DType,
    n: i64,
) -> Result<u64> {
    let n = n.max(1);
    if slot.as_ref().is_none_or(|b| b.numel() < n) {
        match slot.take() {
            Some(old) if keep => retired.push(old),
            old => drop(old),
        }
        *slot = Some(Buffer::uninit(q, dtype, &[n])?);
    }
    match slot {
        Some(b) => Ok(b.view().data_addr()),
        None => Err(Error::backend(BACKEND, format!("{OP}: workspace missing"))),
    }
}

/// The partial buffers for this queue: (part_o, part_lse, seq_info) addresses.
fn workspace(q: &Queue, cq: &CudaQueue, slots: i64, rows: i64, dv: i64, b: i64) -> Result<(u64, u64, u64)> {
    let mut all = lock(&WORKSPACES)?;
    // Drop the workspaces of queues that no longer exist.
    all.retain(|_, w| w.stream.strong_count() > 0);
    let key = Arc::as_ptr(&cq.stream) as usize;
    let w = all.entry(key).or_insert_with(|| Workspace {
        stream: Arc::downgrade(&cq.stream),
        part_o: None,
        part_lse: None,
        seq_info: None,
        retired: Vec::new(),
    });
    let keep = cq.has_captured();
    let po = ensure(q, &mut w.part_o, &mut w.retired, keep, DType::F32, slots * rows * dv)?;
    let pl = ensure(q, &mut w.part_lse, &mut w.retired, keep, DType::F32, slots * rows)?;
    let si = ensure(q, &mut w.seq_info, &mut w.retired, keep, DType::I32, 2 * b)?;
    Ok((po, pl, si))
}

fn to_i32(arg: &'static str, what: &str, v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(OP, arg, format!("{what} = {v} exceeds the i32 range")))
}

/// 16-byte aligned start and strides (of `dims`) that are multiples of 8 elements: rows can
/// be moved with 16-byte copies.
fn rows_aligned(t: &Tensor<'_>, dims: &[usize]) -> bool {
    t.data_addr().is_multiple_of(16) && dims.iter().all(|&d| t.stride(d) % 8 == 0)
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
    let c = choose(a, &info, opts, tma)?;
    let ws = workspace(q, cq, c.plan.parts as i64 + b, m_total, dv, b)?;
    cq.run(OP, &launches(a, &c, &info, ws)?)?;
    Ok(c.plan)
}

/// What [`choose`] picked: the plan and the main kernel's launch shape.
#[derive(Clone, Debug)]
pub(crate) struct Choice {
    pub plan: Plan,
    base: &'static str,
    /// The main kernel loads the cache through the TMA (its second parameter is the map).
    tma: bool,
    smem: u32,
    threads: u32,
    combine_wpr: i64,
}

/// The kernel, its shared memory and the number of parts for a call with `b > 0` sequences
/// and `s_q * N > 0` query rows on a device described by `info`; `tma_flag`: the
/// `VT_MLA_DECODE_TMA` flag.
pub(crate) fn choose(
    a: &MlaDecodeAttentionArgs<'_>,
    info: &DeviceInfo,
    opts: &DecodeOptions,
    tma_flag: bool,
) -> Result<Choice> {
    let (b, s_q, n, d) = (a.query.dim(0), a.query.dim(1), a.query.dim(2), a.query.dim(3));
    let dv = a.out.dim(3);
    let m_total = s_q * n;
    let dt = a.query.dtype();
    // An fp8_ds_mla cache runs the generic kernel, dequantizing on load (the tensor-core
    // kernels read 16-bit rows only).
    let fp8 = a.cache.dtype() == DType::Fp8DsMla;

    let mma_rows = if m_total <= 16 {
        16
    } else if m_total <= 32 {
        32
    } else {
        64
    };
    let fits = |bytes: u32| bytes <= info.smem_optin;
    let fast = !fp8
        && d == FAST_D
        && dv == FAST_DV
        && dt != DType::F32
        && rows_aligned(&a.query, &[0, 1, 2])
        && rows_aligned(&a.cache, &[0, 1])
        && rows_aligned(&a.out, &[0, 1, 2]);
    let kernel = match opts.kernel {
        Kernel::Auto if !fast => Kernel::Generic,
        Kernel::Auto if info.wgmma && m_total > 16 && fits(tc_smem(64)) => Kernel::Wgmma,
        Kernel::Auto if fits(mma_smem(mma_rows, mma_slots(mma_rows, false))) => Kernel::Mma,
        // Less shared memory per block than the full ring needs (an A100): the small ring.
        Kernel::Auto if fits(mma_smem(mma_rows, mma_slots(mma_rows, true))) => Kernel::MmaSmall,
        Kernel::Auto => Kernel::Generic,
        Kernel::Mma | Kernel::MmaSmall | Kernel::Wgmma if !fast => {
            return Err(Error::backend(
                BACKEND,
                format!(
                    "{OP}: the tensor-core kernels need bf16/f16, D = 576, Dv = 512, aligned rows and a \
                     16-bit (not fp8_ds_mla) cache"
                ),
            ))
        }
        Kernel::Wgmma if !info.wgmma => {
            return Err(Error::backend(BACKEND, format!("{OP}: no sm_90a wgmma kernel on this device")))
        }
        k => k,
    };

    let mma = |small: bool| -> (&'static str, &'static str, i64, u32, u32) {
        let names = match (mma_rows, small) {
            (16, false) => ("mla_decode_mma16", "mma16"),
            (32, false) => ("mla_decode_mma32", "mma32"),
            (_, false) => ("mla_decode_mma64", "mma64"),
            (16, true) => ("mla_decode_mma16s", "mma16s"),
            (32, true) => ("mla_decode_mma32s", "mma32s"),
            (_, true) => ("mla_decode_mma64s", "mma64s"),
        };
        (names.0, names.1, mma_rows as i64, mma_smem(mma_rows, mma_slots(mma_rows, small)), THREADS)
    };
    let tma = kernel == Kernel::Wgmma && tma_ok(&a.cache) && tma_flag;
    let (base, name, mt, smem, threads): (&'static str, &'static str, i64, u32, u32) = match kernel {
        Kernel::Wgmma if tma => ("mla_decode_wgmma_tma", "wgmma_tma", 64, tc_smem(64), THREADS),
        Kernel::Wgmma => ("mla_decode_wgmma", "wgmma", 64, tc_smem(64), THREADS),
        Kernel::Mma => mma(false),
        Kernel::MmaSmall => mma(true),
        _ => {
            let bytes = (d + 4 * dv) * 4;
            if bytes > MAX_SMEM as i64 {
                return Err(Error::invalid(
                    OP,
                    "query",
                    format!("head dims D = {d}, Dv = {dv} need {bytes} bytes of shared memory (at most {MAX_SMEM})"),
                ));
            }
            if fp8 {
                ("mla_decode_generic_fp8", "generic_fp8", 1, bytes as u32, GEN_THREADS)
            } else {
                ("mla_decode_generic", "generic", 1, bytes as u32, GEN_THREADS)
            }
        }
    };
    if kernel != Kernel::Generic && !fits(smem) {
        return Err(Error::backend(
            BACKEND,
            format!(
                "{OP}: the {name} kernel needs {smem} bytes of shared memory per block, this device allows {}",
                info.smem_optin
            ),
        ));
    }
    let row_blocks = (m_total + mt - 1) / mt;
    if row_blocks > 65_535 || m_total > 65_535 {
        return Err(Error::invalid(
            OP,
            "query",
            format!("s_q * N = {m_total} query rows per sequence is too many"),
        ));
    }
    // One CTA per SM for the tensor-core kernels (their shared memory allows no more); the
    // small generic kernel gets 8.
    let per_sm: i64 = if kernel == Kernel::Generic { 8 } else { 1 };
    let mut parts = (info.sms as i64 * per_sm / row_blocks).max(1);
    if let Some(mp) = opts.max_parts {
        parts = parts.min(mp.max(1) as i64);
    }
    let min_tiles = opts.min_tiles.unwrap_or(1).max(1);
    // Combine: when sequences are cut into many pieces (16 or more each: few sequences,
    // many parts), 8 warps share each row's partials; otherwise a warp per row (8 warps
    // per row at b = 32 launched 8192 mostly idle CTAs: measured slower).
    let wpr: i64 = if parts >= 16 * b { 8 } else { 1 };

    let main_grid = if kernel == Kernel::Generic { m_total } else { row_blocks };
    let plan = Plan {
        kernel: name,
        rows_per_cta: mt as u32,
        row_blocks: main_grid as u32,
        parts: parts as u32,
        min_tiles,
    };
    Ok(Choice { plan, base, tma, smem, threads, combine_wpr: wpr })
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
    if c.tma {
        // `mla::TmaMap`: the tensor map of the cache, the TMA kernel's second parameter.
        main_args.push(Arg::TensorMaps(vec![cache_map(&a.cache)]));
    }
    let main_grid = (c.plan.parts, c.plan.row_blocks, 1);
    let main = Launch::new(&SRC, c.base, dt, main_grid, c.threads, main_args).with_smem(c.smem);
    let rows_per_cta = 8 / c.combine_wpr;
    let comb_grid =
        (b as u32, ((m_total + rows_per_cta - 1) / rows_per_cta) as u32, ((dv + 127) / 128) as u32);
    let combine = Launch::new(&SRC, "mla_decode_combine", dt, comb_grid, THREADS, [Arg::of_struct(p)]);
    // On sm_90 the combine launches while the main kernel runs (programmatic dependent
    // launch) and waits for it on the device, hiding its launch latency.
    let combine = if info.sm >= 90 { combine.dependent() } else { combine };
    Ok(vec![main, combine])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An A100's opt-in shared memory per block (163 KB); an H100/H200 allows 227 KB.
    const A100_SMEM: u32 = 166_912;
    const H200_SMEM: u32 = 232_448;

    #[test]
    fn the_small_ring_fits_an_a100_and_the_full_ring_fits_a_hopper() {
        for mt in [16, 32, 64] {
            assert!(mma_smem(mt, mma_slots(mt, true)) <= A100_SMEM, "small ring, {mt} rows");
            assert!(mma_smem(mt, mma_slots(mt, false)) <= H200_SMEM, "full ring, {mt} rows");
        }
        // The full rings are what an A100 cannot hold (so Auto picks the small one there).
        for mt in [16, 32, 64] {
            assert!(mma_smem(mt, mma_slots(mt, false)) > A100_SMEM, "full ring, {mt} rows");
        }
        assert!(tc_smem(64) <= H200_SMEM);
    }
}
