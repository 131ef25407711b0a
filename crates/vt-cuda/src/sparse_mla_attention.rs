//! SparseMlaAttention on CUDA: DeepSeek-V3.2's sparse MLA (absorbed MQA over the cache slots
//! each query token's indices row lists).
//!
//! Fast path: MlaDecodeAttention's kernels on the sparse problem read as a decode. Query
//! token t becomes sequence t with one query row per head (`[T, 1, N, D]`), its indices row
//! its block table, the cache a block-size-1 view (`[NB * BS, 1, W]`: slot s is block s),
//! every sequence `topk` long (seq_lens is a one-int device buffer holding `i32::MAX`,
//! read with stride 0: the kernels clamp a length to the block table's `topk * 1` tokens).
//! The decode kernels gather each token's row by its block id with cp.async, skip block ids
//! outside `0..NB * BS` (zero-filled and masked: the contract's -1 and past-the-cache
//! entries), attend a repeated block twice (the contract's repeat), and split the keys over
//! CTAs with a combine when the (token, head group) pairs do not fill the device. So the
//! fast kernels are exactly what `mla_decode_attention` picks: on sm_90 the wgmma kernel
//! (64 heads a CTA) for a 16-bit cache and N > 16, the mma.sync kernels (16/32/64 heads a
//! CTA) for N <= 16 and for the fp8_ds_mla cache, their generic kernel for f32, other dims
//! and unaligned views; see `mla_decode_attention/mod.rs` and `docs/perf.md`.
//!
//! The view needs a cache whose slots lie one stride apart (block stride = BS * row stride,
//! or one block, or BS = 1) and `NB * BS` within i32. Other caches (a layer of a
//! `[NB, layers, BS, D]` pool) take this op's own generic kernel
//! (`kernels-cuda/sparse_mla_attention.cu`): any dims, strides, dtypes and both cache
//! kinds, one CTA per (token, head), no split.
//!
//! Tokens are run [`ROWS_PER_CALL`] / N at a time (the decode kernels' partial buffers grow
//! with the token count). After the first call on a device (which allocates the seq_lens
//! int, and the decode kernels' partial buffers as MlaDecodeAttention does) a call of no
//! more tokens allocates nothing, reads nothing back and never waits: it can be captured in
//! a CUDA graph.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use vt_core::{
    Buffer, DType, Error, MlaDecodeAttentionArgs, OpId, Queue, Result, SparseMlaAttentionArgs, Tensor,
};

use crate::device::BACKEND;
use crate::mla_decode_attention::{self as decode, mla_decode_attention_with, DecodeOptions};
use crate::rope_from_cache::int;
use crate::{grid_1d, kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("sparse_mla_attention");

const OP: OpId = OpId::SparseMlaAttention;
/// Threads of the generic kernel (`sparse_mla::WARPS` warps, a listed index each).
const GEN_THREADS: u32 = 128;
/// The most dynamic shared memory a block may have on sm_80/sm_90.
const MAX_SMEM: i64 = 232_448;

/// Which kernel runs the op. The op uses [`Kernel::Auto`]; the others are for tests and
/// benchmarks ([`sparse_mla_attention_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// The decode kernels when the cache allows the block-size-1 view, else the generic one.
    Auto,
    /// This op's generic kernel (any layout).
    Generic,
    /// MlaDecodeAttention's kernels over the block-size-1 view, with that op's choice
    /// forced as given (an error for a cache without the view).
    Decode(decode::Kernel),
    /// This op's sm_90a prefill kernel (`sparse_mla_prefill`,
    /// `kernels-cuda/sparse_mla_attention/prefill_sm90.cuh`): a CTA per (token, 64 heads) over
    /// the token's whole topk, no split, FlashMLA's seesaw consumers and a warpgroup gathering
    /// the rows by cp.async. It needs sm_90, a bf16 or f16 query and cache, D 576, Dv 512, N a
    /// multiple of 64, the cache's slots one stride apart and 16-byte rows (an error elsewhere).
    /// Auto takes it with `VT_SPARSE_PREFILL` on (the default) where it would take the
    /// three-warpgroup gather form.
    Prefill,
}

/// Knobs of [`sparse_mla_attention_with`]; `Default` is what the op uses.
#[derive(Clone, Copy, Debug)]
pub struct SparseOptions {
    pub kernel: Kernel,
    /// The decode kernels' split: fewest 64-key tiles per part, most parts (see
    /// [`DecodeOptions`]).
    pub min_tiles: Option<u32>,
    pub max_parts: Option<u32>,
    /// Query tokens per decode-kernel call; `None`: [`ROWS_PER_CALL`] / N.
    pub tokens_per_call: Option<u32>,
}

impl Default for SparseOptions {
    fn default() -> Self {
        SparseOptions { kernel: Kernel::Auto, min_tiles: None, max_parts: None, tokens_per_call: None }
    }
}

/// Query rows (tokens x heads) per decode-kernel call. Those kernels' partial buffers hold
/// `(parts + T) x N x Dv` f32 (one slot per part and per sequence, here per token), so a
/// long prefill runs as several calls over consecutive tokens: 2^17 rows (1024 tokens at
/// N = 128) keep the buffers near 270 MB where one call over 4096 tokens would take 1.1 GB.
/// Each call still fills the device (1024 tokens x 2 head groups x topk / 64 tiles).
pub const ROWS_PER_CALL: i64 = 1 << 17;

/// What one call launched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// `sparse_generic`, `sparse_prefill`, or the decode kernel's name (`wgmma`, `mma64_fp8`, ...).
    pub kernel: &'static str,
    /// The decode kernels' plan (None for the generic kernel or an empty call).
    pub decode: Option<decode::Plan>,
}

/// The op as registered.
pub(crate) fn run(q: &Queue, a: &SparseMlaAttentionArgs<'_>) -> Result<()> {
    sparse_mla_attention_with(q, a, &SparseOptions::default()).map(|_| ())
}

/// The distance between consecutive slots of the cache when every slot `s` lies at
/// `s * stride` (the block-size-1 view exists), and `NB * BS` fits the decode kernels' i32.
pub(crate) fn slot_stride(cache: &Tensor<'_>) -> Option<i64> {
    let (nb, bs) = (cache.dim(0), cache.dim(1));
    i32::try_from(nb.checked_mul(bs)?).ok()?;
    if bs == 1 {
        Some(cache.stride(0))
    } else if nb == 1 || bs.checked_mul(cache.stride(1)) == Some(cache.stride(0)) {
        Some(cache.stride(1))
    } else {
        None
    }
}

/// SparseMlaAttention with explicit kernel choices (the op uses the defaults). The
/// arguments must have passed `vt_core::sparse_mla_attention`'s validation (this function is
/// for tests and benchmarks, which build views to the contract). Returns what ran.
pub fn sparse_mla_attention_with(
    q: &Queue,
    a: &SparseMlaAttentionArgs<'_>,
    opts: &SparseOptions,
) -> Result<Plan> {
    let cq = CudaQueue::of(q, OP)?;
    let (t, n) = (a.query.dim(0), a.query.dim(1));
    if t == 0 || n == 0 {
        return Ok(Plan { kernel: "none", decode: None });
    }
    let stride = slot_stride(&a.cache);
    // Forced, the prefill kernel's refusal is the caller's error; under Auto (VT_SPARSE_PREFILL,
    // on by default, where the decode kernels would take Wgmma3) it only moves the call on.
    let prefill = match opts.kernel {
        Kernel::Prefill => {
            prefill_ok(a, prefill_device(cq))?;
            true
        }
        Kernel::Auto => {
            vt_core::flags::sparse_prefill()
                && auto_kernel(a) == decode::Kernel::Wgmma3
                && prefill_ok(a, prefill_device(cq)).is_ok()
        }
        _ => false,
    };
    if prefill {
        cq.run(OP, &prefill_plan(a)?)?;
        return Ok(Plan { kernel: "sparse_prefill", decode: None });
    }
    let forced = match (opts.kernel, stride) {
        (Kernel::Generic | Kernel::Prefill, _) | (Kernel::Auto, None) => None,
        (Kernel::Auto, Some(s)) => Some((auto_kernel(a), s)),
        (Kernel::Decode(k), Some(s)) => Some((k, s)),
        (Kernel::Decode(_), None) => {
            return Err(Error::backend(
                BACKEND,
                format!(
                    "{OP}: the decode kernels need the cache's slots one stride apart (block stride = \
                     BS x row stride) and NB x BS within i32; cache shape {:?} strides {:?}",
                    a.cache.shape(),
                    a.cache.strides()
                ),
            ))
        }
    };
    let Some((kernel, stride)) = forced else {
        cq.run(OP, &generic_plan(a)?)?;
        return Ok(Plan { kernel: "sparse_generic", decode: None });
    };
    let o = DecodeOptions { kernel, min_tiles: opts.min_tiles, max_parts: opts.max_parts };
    let per = opts.tokens_per_call.map_or((ROWS_PER_CALL / n).max(1), |c| i64::from(c.max(1)));
    let mut plan = None;
    let mut t0 = 0;
    while t0 < t {
        let t1 = (t0 + per).min(t);
        let chunk = SparseMlaAttentionArgs {
            out: a.out.slice(0, t0, t1)?,
            lse: a.lse.map(|l| l.slice(1, t0, t1)).transpose()?,
            query: a.query.slice(0, t0, t1)?,
            cache: a.cache,
            indices: a.indices.slice(0, t0, t1)?,
            scale: a.scale,
        };
        let d = decode_args(&chunk, stride, seq_lens(q, t1 - t0)?)?;
        plan = Some(match mla_decode_attention_with(q, &d, &o) {
            // The kernel auto_kernel asked for cannot take this call here (unaligned views,
            // too little shared memory): the decode kernels' own choice. Nothing was launched
            // (their kernel choice failed before any launch).
            Err(_) if opts.kernel == Kernel::Auto && kernel != decode::Kernel::Auto => {
                mla_decode_attention_with(q, &d, &DecodeOptions { kernel: decode::Kernel::Auto, ..o })?
            }
            r => r?,
        });
        t0 = t1;
    }
    Ok(Plan { kernel: plan.as_ref().map_or("none", |p| p.kernel), decode: plan })
}

/// A 16-bit cache whose slots are listed fewer than this many times per call on average
/// (decode: each row about once, gathered from HBM) takes the mma.sync kernels instead of the
/// wgmma kernel the decode kernels' Auto picks (their deeper cp.async ring hides the random
/// HBM gathers better); a prefill re-reading an L2-sized kv keeps wgmma. H200, `bench sparse
/// --kv16 --alt mma` (docs/perf.md, Sparse MLA): decode at 64 / 128 heads, T 128 - 296, reuse
/// ~0.1 - 1: mma 0.77 - 0.92x the wgmma time; prefill, reuse 64 - 1024: mma 1.7 - 1.9x.
const MMA_MAX_REUSE: i64 = 4;
/// ... from this many query rows (T x N) and 64 heads: at T = 4 (h128 b2 s_q 2) wgmma was
/// faster (39 against 50 us); nothing was measured between T = 4 and 128.
const MMA_MIN_ROWS: i64 = 4096;

/// The decode kernel the op asks for on the block-size-1 view (a request that fails there, as
/// on a device without wgmma or whose blocks cannot hold the full ring, falls back to the
/// decode kernels' Auto). A 16-bit cache at 64+ heads: the mma.sync kernels where the slots are
/// listed fewer than [`MMA_MAX_REUSE`] times (a decode gather of [`MMA_MIN_ROWS`]+ rows); where
/// they are listed that often or more (a prefill re-reading an L2-sized kv), the three-warpgroup
/// kernel's gather form ([`decode::Kernel::Wgmma3`]: H100, twenty-fifth session, `bench sparse
/// --alt wgmma_3wg`, 128 heads, s_q 4096, topk 2048: 0-8% faster than the two-warpgroup wgmma
/// kernel at s_kv 8192 - 131072; 64 heads not measured). Else the decode kernels' Auto: over an
/// fp8_ds_mla cache its dequantizing 64-row kernel above 32 heads, which the same call measured
/// 0.67 - 0.87x the time of the raw-ring kernel's gather form on every decode row (with
/// F8R_VT, the twenty-fourth session's default; the twenty-third session had measured the raw
/// ring ahead by 0.5-6% before it). With `VT_MLA_GATHER` on, a 16-bit cache always goes to the
/// decode kernels' Auto, which then takes the three-warpgroup kernels' gather forms.
fn auto_kernel(a: &SparseMlaAttentionArgs<'_>) -> decode::Kernel {
    let (t, n, topk) = (a.query.dim(0), a.query.dim(1), a.indices.dim(1));
    let slots = a.cache.dim(0).saturating_mul(a.cache.dim(1)).max(1);
    let sixteen = a.cache.dtype() != DType::Fp8DsMla && a.query.dtype() != DType::F32;
    // VT_MLA_GATHER: the decode kernels' Auto takes the three-warpgroup gather forms.
    if !sixteen || vt_core::flags::mla_gather() || n < 64 {
        return decode::Kernel::Auto;
    }
    let rarely_listed = t.saturating_mul(topk) < MMA_MAX_REUSE.saturating_mul(slots);
    match (rarely_listed, t.saturating_mul(n) >= MMA_MIN_ROWS) {
        (true, true) => decode::Kernel::Mma,
        (true, false) => decode::Kernel::Auto,
        (false, _) => decode::Kernel::Wgmma3,
    }
}

/// One i32 `i32::MAX` per device, never freed: the decode view's seq_lens (read with stride
/// 0, clamped by the kernels to the block table's length).
static LENS: LazyLock<Mutex<HashMap<usize, &'static Buffer>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn seq_lens(q: &Queue, t: i64) -> Result<Tensor<'static>> {
    let ordinal = q.device().ordinal;
    let mut all =
        LENS.lock().map_err(|_| Error::op_failed(OP, BACKEND, "a cache lock was poisoned by a panic"))?;
    let buf = match all.get(&ordinal) {
        Some(b) => *b,
        None => {
            if crate::graph::capturing() {
                return Err(Error::backend(
                    BACKEND,
                    format!("{OP}: the first call on a device allocates; warm up before capturing a graph"),
                ));
            }
            let b: &'static Buffer = Box::leak(Box::new(Buffer::from_slice(q, &[1], &[i32::MAX])?));
            // Other queues of the device use it too: the copy must have landed.
            q.synchronize()?;
            all.insert(ordinal, b);
            b
        }
    };
    buf.view().as_strided(0, &[t], &[0])
}

/// The sparse arguments as MlaDecodeAttention's over the block-size-1 view of the cache
/// (slots `stride` apart), with `lens` as seq_lens.
pub(crate) fn decode_args<'a>(
    a: &SparseMlaAttentionArgs<'a>,
    stride: i64,
    lens: Tensor<'a>,
) -> Result<MlaDecodeAttentionArgs<'a>> {
    let (t, n, d) = (a.query.dim(0), a.query.dim(1), a.query.dim(2));
    let dv = a.out.dim(2);
    let (nb, bs, w) = (a.cache.dim(0), a.cache.dim(1), a.cache.dim(2));
    let slots = nb.checked_mul(bs).ok_or_else(|| Error::invalid(OP, "cache", "NB x BS overflows"))?;
    let as4 =
        |x: &Tensor<'a>, last: i64| x.as_strided(0, &[t, 1, n, last], &[x.stride(0), 0, x.stride(1), 1]);
    let lse = match &a.lse {
        Some(l) => Some(l.as_strided(0, &[t, n, 1], &[l.stride(1), l.stride(0), 0])?),
        None => None,
    };
    Ok(MlaDecodeAttentionArgs {
        out: as4(&a.out, dv)?,
        lse,
        query: as4(&a.query, d)?,
        cache: a.cache.as_strided(0, &[slots, 1, w], &[stride, stride, 1])?,
        block_table: a.indices,
        seq_lens: lens,
        scale: a.scale,
    })
}

/// The prefill kernel's argument block (`sparse_mla::PrefillParams`,
/// `kernels-cuda/sparse_mla_attention/prefill_sm90.cuh`: the same fields in the same order;
/// `prefill_facts_match_the_kernel` checks the layout). Strides in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PrefillParams {
    pub q: u64,
    pub out: u64,
    pub lse: u64,
    pub kv: u64,
    pub indices: u64,
    pub q_st: i64,
    pub q_sh: i64,
    pub o_st: i64,
    pub o_sh: i64,
    pub l_sh: i64,
    pub l_st: i64,
    pub kv_row: i64,
    pub i_st: i64,
    pub i_sk: i64,
    pub t0: i32,
    pub topk: i32,
    pub slots: i32,
    pub scale_log2: f32,
}

// SAFETY: plain old data with the layout of `sparse_mla::PrefillParams` (checked against the
// kernel by `prefill_facts_match_the_kernel` and by ptx_check's parameter sizes); its addresses
// come from validated views.
unsafe impl crate::launch::KernelStruct for PrefillParams {}

/// Threads of the prefill kernel (`sparse_mla::PF_THREADS`): two consumer warpgroups and a
/// producer.
pub(crate) const PREFILL_THREADS: u32 = 384;
/// Query heads a CTA of the prefill kernel (`sparse_mla::PF_ROWS`).
pub(crate) const PREFILL_HEADS: i64 = 64;
/// Dynamic shared memory of the prefill kernel (`sparse_mla::PrefillLayout::SMEM`): Q and two
/// 16-bit tiles (9 column blocks of 64 x 128 bytes each), P1 (64 x 128 bytes), the maxima and
/// row sums (2 x 64 floats each), the tiles' token flags (2 x 64 bytes), 11 mbarriers,
/// alignment.
pub(crate) const PREFILL_SMEM: u32 = 3 * 9 * 8192 + 8192 + 2 * 64 * 4 + 2 * 64 * 4 + 2 * 64 + 11 * 8 + 1024;
const _: () = assert!(PREFILL_SMEM as i64 <= MAX_SMEM, "the prefill layout fits a Hopper block");
/// Tokens a launch of the prefill kernel covers (grid.y).
const PREFILL_MAX_TOKENS: i64 = 65_535;

/// Whether the device runs the prefill kernel: sm_90 with the module built for sm_90a (its
/// wgmma kernels present).
fn prefill_device(cq: &CudaQueue) -> bool {
    cq.sm() == 90 && cq.function(&SRC, "sparse_mla_prefill", DType::BF16).is_ok()
}

/// Whether the prefill kernel takes these arguments (the error says why not): `device`
/// ([`prefill_device`]), a 16-bit query and cache of one dtype, D = 576, Dv = 512, N a multiple
/// of 64, the cache's slots one stride apart ([`slot_stride`]), and every row movable with
/// 16-byte copies (16-byte aligned starts, strides multiples of 8 elements).
pub(crate) fn prefill_ok(a: &SparseMlaAttentionArgs<'_>, device: bool) -> Result<()> {
    let (n, d, dv) = (a.query.dim(1), a.query.dim(2), a.out.dim(2));
    let dt = a.query.dtype();
    let no = |why: String| Err(Error::backend(BACKEND, format!("{OP}: the prefill kernel {why}")));
    if !device {
        return no("needs an sm_90 device and the module's sm_90a build".into());
    }
    if !matches!(dt, DType::BF16 | DType::F16) || a.cache.dtype() != dt {
        return no(format!(
            "needs a bf16 or f16 query and cache (query {dt:?}, cache {:?})",
            a.cache.dtype()
        ));
    }
    if d != 576 || dv != 512 || n % PREFILL_HEADS != 0 {
        return no(format!("needs D 576, Dv 512 and N a multiple of 64 (D {d}, Dv {dv}, N {n})"));
    }
    let Some(kv_row) = slot_stride(&a.cache) else {
        return no("needs the cache's slots one stride apart and NB x BS within i32".into());
    };
    let aligned = |t: &Tensor<'_>, strides: &[i64]| {
        t.data_addr().is_multiple_of(16) && strides.iter().all(|s| s % 8 == 0)
    };
    if !aligned(&a.query, &[a.query.stride(0), a.query.stride(1)])
        || !aligned(&a.out, &[a.out.stride(0), a.out.stride(1)])
        || !aligned(&a.cache, &[kv_row])
    {
        return no("needs 16-byte aligned rows (starts and strides multiples of 8 elements)".into());
    }
    i32::try_from(a.indices.dim(1)).map_err(|_| {
        Error::invalid(OP, "indices", format!("topk = {} exceeds the i32 range", a.indices.dim(1)))
    })?;
    Ok(())
}

/// The prefill kernel's launches (the caller checked [`prefill_ok`]): grid (N / 64, tokens),
/// a launch per [`PREFILL_MAX_TOKENS`] tokens.
pub(crate) fn prefill_plan(a: &SparseMlaAttentionArgs<'_>) -> Result<Vec<Launch>> {
    let (t, n) = (a.query.dim(0), a.query.dim(1));
    let kv_row = slot_stride(&a.cache).ok_or_else(|| {
        Error::backend(BACKEND, format!("{OP}: the prefill kernel needs the block-size-1 view"))
    })?;
    let slots = a.cache.dim(0).saturating_mul(a.cache.dim(1));
    let (l_addr, l_sh, l_st) =
        a.lse.map_or((0u64, 0i64, 0i64), |l| (l.data_addr(), l.stride(0), l.stride(1)));
    let mut launches = Vec::new();
    let mut t0 = 0;
    while t0 < t {
        let rows = (t - t0).min(PREFILL_MAX_TOKENS);
        let p = PrefillParams {
            q: a.query.data_addr(),
            out: a.out.data_addr(),
            lse: l_addr,
            kv: a.cache.data_addr(),
            indices: a.indices.data_addr(),
            q_st: a.query.stride(0),
            q_sh: a.query.stride(1),
            o_st: a.out.stride(0),
            o_sh: a.out.stride(1),
            l_sh,
            l_st,
            kv_row,
            i_st: a.indices.stride(0),
            i_sk: a.indices.stride(1),
            t0: int(OP, "query", t0)?,
            topk: int(OP, "indices", a.indices.dim(1))?,
            slots: int(OP, "cache", slots)?,
            scale_log2: a.scale * std::f32::consts::LOG2_E,
        };
        let grid = ((n / PREFILL_HEADS) as u32, rows as u32, 1);
        launches.push(
            Launch::new(
                &SRC,
                "sparse_mla_prefill",
                a.query.dtype(),
                grid,
                PREFILL_THREADS,
                vec![Arg::of_struct(p)],
            )
            .with_smem(PREFILL_SMEM),
        );
        t0 += rows;
    }
    Ok(launches)
}

/// The generic kernel's launch: `sparse_mla_generic_*` over a float cache,
/// `sparse_mla_generic_fp8_*` over an fp8_ds_mla one; one CTA per (token, head), grid-stride.
/// Head dims whose shared memory exceeds a block's are an error.
pub(crate) fn generic_plan(a: &SparseMlaAttentionArgs<'_>) -> Result<Vec<Launch>> {
    let (t, n, d) = (a.query.dim(0), a.query.dim(1), a.query.dim(2));
    let dv = a.out.dim(2);
    let rows = t.checked_mul(n).ok_or_else(|| Error::invalid(OP, "query", "T x N overflows"))?;
    if rows == 0 {
        return Ok(vec![]);
    }
    let smem = (d + (GEN_THREADS as i64 / 32) * dv) * 4;
    if smem > MAX_SMEM {
        return Err(Error::invalid(
            OP,
            "query",
            format!("head dims D = {d}, Dv = {dv} need {smem} bytes of shared memory (at most {MAX_SMEM})"),
        ));
    }
    let (l_addr, l_sh, l_st) =
        a.lse.map_or((0u64, 0i64, 0i64), |l| (l.data_addr(), l.stride(0), l.stride(1)));
    let base =
        if a.cache.dtype() == DType::Fp8DsMla { "sparse_mla_generic_fp8" } else { "sparse_mla_generic" };
    let args: [Arg; 23] = [
        a.query.data_addr().into(),
        a.query.stride(0).into(),
        a.query.stride(1).into(),
        a.out.data_addr().into(),
        a.out.stride(0).into(),
        a.out.stride(1).into(),
        l_addr.into(),
        l_sh.into(),
        l_st.into(),
        a.cache.data_addr().into(),
        a.cache.stride(0).into(),
        a.cache.stride(1).into(),
        a.indices.data_addr().into(),
        a.indices.stride(0).into(),
        a.indices.stride(1).into(),
        rows.into(),
        int(OP, "query", n)?.into(),
        int(OP, "query", d)?.into(),
        int(OP, "out", dv)?.into(),
        int(OP, "indices", a.indices.dim(1))?.into(),
        a.cache.dim(0).into(),
        a.cache.dim(1).into(),
        (a.scale * std::f32::consts::LOG2_E).into(),
    ];
    Ok(vec![Launch::new(&SRC, base, a.query.dtype(), (grid_1d(rows), 1, 1), GEN_THREADS, args)
        .with_smem(smem as u32)])
}

#[cfg(test)]
mod tests {
    use vt_core::{Buffer, DType, Device, Queue, SparseMlaAttentionArgs};

    use super::*;

    /// Without a GPU: the decode view of a sparse call (block-size-1 cache over a layer of a
    /// pool, indices as block tables, [T, 1, N, D] q / out from strided views, lse stored
    /// [T, N] passed transposed) run through the CPU's MlaDecodeAttention equals the CPU's
    /// SparseMlaAttention (on valid, repeated slots: the CPU decode reference rejects the
    /// negative block ids the GPU kernels skip; seq_lens holds topk, which the GPU's
    /// i32::MAX is clamped to).
    #[test]
    fn the_decode_view_computes_the_sparse_op() -> Result<()> {
        vt_cpu::register();
        let q = Queue::new(Device::CPU)?;
        let (t, n, d, dv, nb, bs, topk) = (3i64, 4i64, 24i64, 16i64, 5i64, 4i64, 7i64);
        let val = |i: i64| ((i * 2654435761) % 1000) as f64 / 500.0 - 1.0;
        let qv: Vec<f64> = (0..t * n * (d + 2)).map(val).collect();
        let pool: Vec<f64> = (0..2 * nb * bs * (d + 3)).map(|i| val(i + 17)).collect();
        let idx: Vec<f64> = (0..t * topk).map(|i| ((i * 7 + i / 3) % (nb * bs)) as f64).collect();
        let qb = Buffer::from_f64(&q, DType::F32, &[t, n, d + 2], &qv)?;
        let cb = Buffer::from_f64(&q, DType::F32, &[2, nb, bs, d + 3], &pool)?;
        let ib = Buffer::from_f64(&q, DType::I32, &[t, topk], &idx)?;
        let cache = cb.view().select(0, 1)?.slice(2, 0, d)?;
        let query = qb.view().slice(2, 1, d + 1)?;
        let mut results = Vec::new();
        for via_decode in [false, true] {
            let ob = Buffer::nan(&q, DType::F32, &[t, n, dv + 5])?;
            let lb = Buffer::nan(&q, DType::F32, &[t, n])?;
            let a = SparseMlaAttentionArgs {
                out: ob.view().slice(2, 0, dv)?,
                lse: Some(lb.view().transpose(0, 1)?),
                query,
                cache,
                indices: ib.view(),
                scale: 0.3,
            };
            if via_decode {
                let stride = slot_stride(&a.cache).expect("a pool layer has the view");
                assert_eq!(stride, d + 3);
                let lens = Buffer::from_f64(&q, DType::I32, &[1], &[topk as f64])?;
                let da = decode_args(&a, stride, lens.view().as_strided(0, &[t], &[0])?)?;
                vt_core::mla_decode_attention(&q, &da)?;
            } else {
                vt_core::sparse_mla_attention(&q, &a)?;
            }
            results.push((q.read_f64(&ob.view())?, q.read_f64(&lb.view())?));
        }
        assert!(results[0].0.iter().zip(&results[1].0).all(|(x, y)| x == y || (x.is_nan() && y.is_nan())));
        assert_eq!(results[0].1, results[1].1);
        assert!(results[0].1.iter().all(|v| v.is_finite()));
        Ok(())
    }

    /// The decode kernel the op asks for: the decode kernels' Auto over an fp8_ds_mla cache and
    /// over a 16-bit cache with few rows; the mma.sync kernels for a 16-bit decode gather of
    /// many rows; the three-warpgroup gather form where the slots are listed many times.
    #[test]
    fn auto_kernel_picks_by_cache_dtype_rows_and_reuse() {
        let mem = vec![0u128; 1 << 20];
        let view = |dt: DType, shape: &[i64]| {
            let s = vt_core::contiguous_strides(shape);
            crate::test_util::host_view(&mem, dt, 0, shape, &s[..shape.len()])
        };
        for (n, t, cache_dt, want) in [
            (64, 2, DType::Fp8DsMla, decode::Kernel::Auto),
            (128, 64, DType::Fp8DsMla, decode::Kernel::Auto),
            (32, 2, DType::Fp8DsMla, decode::Kernel::Auto),
            (128, 2, DType::BF16, decode::Kernel::Auto),
            (128, 64, DType::BF16, decode::Kernel::Mma),
        ] {
            let w = if cache_dt == DType::Fp8DsMla { 656 } else { 576 };
            let a = SparseMlaAttentionArgs {
                out: view(DType::BF16, &[t, n, 512]),
                lse: None,
                query: view(DType::BF16, &[t, n, 576]),
                cache: view(cache_dt, &[8, 64, w]),
                indices: view(DType::I32, &[t, 16]),
                scale: 0.5,
            };
            assert_eq!(auto_kernel(&a), want, "{n} heads over {cache_dt:?}");
        }
        // A prefill: 64 tokens x 16 indices over 64 slots (each listed 16 times) at 64 and 128
        // heads: the three-warpgroup gather form; at 32 heads the decode kernels' Auto.
        for (n, want) in
            [(128, decode::Kernel::Wgmma3), (64, decode::Kernel::Wgmma3), (32, decode::Kernel::Auto)]
        {
            let a = SparseMlaAttentionArgs {
                out: view(DType::BF16, &[64, n, 512]),
                lse: None,
                query: view(DType::BF16, &[64, n, 576]),
                cache: view(DType::BF16, &[1, 64, 576]),
                indices: view(DType::I32, &[64, 16]),
                scale: 0.5,
            };
            assert_eq!(auto_kernel(&a), want, "{n} heads, a prefill");
        }
    }

    /// Without a GPU: the prefill kernel's facts as the kernel header has them (NVRTC, PTX for
    /// compute_90a with a table appended) against the host's: threads, heads a CTA, dynamic
    /// shared memory, and the size, alignment and field offsets of its argument block.
    #[test]
    fn prefill_facts_match_the_kernel() {
        use crate::nvrtc::{self, Target};
        if !crate::test_util::nvrtc_ready() {
            return;
        }
        let fields = [
            "q",
            "out",
            "lse",
            "kv",
            "indices",
            "q_st",
            "q_sh",
            "o_st",
            "o_sh",
            "l_sh",
            "l_st",
            "kv_row",
            "i_st",
            "i_sk",
            "t0",
            "topk",
            "slots",
            "scale_log2",
        ];
        let host_offsets = [
            std::mem::offset_of!(PrefillParams, q),
            std::mem::offset_of!(PrefillParams, out),
            std::mem::offset_of!(PrefillParams, lse),
            std::mem::offset_of!(PrefillParams, kv),
            std::mem::offset_of!(PrefillParams, indices),
            std::mem::offset_of!(PrefillParams, q_st),
            std::mem::offset_of!(PrefillParams, q_sh),
            std::mem::offset_of!(PrefillParams, o_st),
            std::mem::offset_of!(PrefillParams, o_sh),
            std::mem::offset_of!(PrefillParams, l_sh),
            std::mem::offset_of!(PrefillParams, l_st),
            std::mem::offset_of!(PrefillParams, kv_row),
            std::mem::offset_of!(PrefillParams, i_st),
            std::mem::offset_of!(PrefillParams, i_sk),
            std::mem::offset_of!(PrefillParams, t0),
            std::mem::offset_of!(PrefillParams, topk),
            std::mem::offset_of!(PrefillParams, slots),
            std::mem::offset_of!(PrefillParams, scale_log2),
        ];
        let (code, headers) = crate::kernels::texts(&SRC).expect("kernel text");
        let offsets: Vec<String> = fields
            .iter()
            .map(|f| format!("(long long)((char*)&(((sparse_mla::PrefillParams*)0)->{f}) - (char*)0)"))
            .collect();
        let src = format!(
            "{code}\n#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
             extern \"C\" __device__ const long long sparse_prefill_facts[{}] = {{sparse_mla::PF_THREADS, \
             sparse_mla::PF_ROWS, sparse_mla::PrefillLayout::SMEM, sizeof(sparse_mla::PrefillParams), \
             alignof(sparse_mla::PrefillParams), {}}};\n#endif\n",
            5 + fields.len(),
            offsets.join(", ")
        );
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, t)| (*n, t.as_str())).collect();
        let image = nvrtc::compile("sparse_prefill_facts.cu", &src, &headers, Target::PtxArchSpecific(90))
            .expect("NVRTC compiles the facts build");
        let ptx = String::from_utf8_lossy(&image.bytes).into_owned();
        let t = crate::mla_decode_attention::facts::tables(&ptx);
        let f = &t["sparse_prefill_facts"];
        let mut want = vec![
            PREFILL_THREADS as i64,
            PREFILL_HEADS,
            PREFILL_SMEM as i64,
            std::mem::size_of::<PrefillParams>() as i64,
            std::mem::align_of::<PrefillParams>() as i64,
        ];
        want.extend(host_offsets.iter().map(|&o| o as i64));
        assert_eq!(f, &want, "device facts (threads, heads, smem, size, align, offsets of {fields:?})");
    }

    /// The prefill kernel's conditions: a 16-bit cache of the query's dtype with the
    /// block-size-1 view, D 576, Dv 512, N a multiple of 64, 16-byte rows, an sm_90 device; its
    /// launches cover every token in grid.y chunks of at most 65,535, 64 heads a CTA.
    #[test]
    fn prefill_kernel_takes_paired_16_bit_rows_and_covers_every_token() {
        let mem = vec![0u128; 1 << 20];
        // Tokens one stride 0 apart: 70,000 of them in a small allocation.
        let view = |dt: DType, shape: &[i64]| {
            let mut s = vt_core::contiguous_strides(shape);
            if shape[0] == 70_000 {
                s[0] = 0;
            }
            crate::test_util::host_view(&mem, dt, 0, shape, &s[..shape.len()])
        };
        let args = |n: i64, cache_dt: DType, w: i64| SparseMlaAttentionArgs {
            out: view(DType::BF16, &[70_000, n, 512]),
            lse: None,
            query: view(DType::BF16, &[70_000, n, 576]),
            cache: view(cache_dt, &[8, 64, w]),
            indices: view(DType::I32, &[70_000, 16]),
            scale: 0.5,
        };
        let a = args(128, DType::BF16, 576);
        prefill_ok(&a, true).expect("takes it");
        let e = prefill_ok(&a, false).expect_err("no device").to_string();
        assert!(e.contains("needs an sm_90 device"), "{e}");
        for (n, dt, w, what) in
            [(96, DType::BF16, 576, "N a multiple of 64"), (128, DType::Fp8DsMla, 656, "bf16 or f16")]
        {
            let e = prefill_ok(&args(n, dt, w), true).expect_err("refused").to_string();
            assert!(e.contains(what), "{e}");
        }
        let ls = prefill_plan(&a).expect("plan");
        assert_eq!(ls.len(), 2);
        assert_eq!(ls.iter().map(|l| l.grid.1 as i64).sum::<i64>(), 70_000);
        assert!(ls.iter().all(|l| l.grid.0 == 2 && l.block == PREFILL_THREADS && l.smem == PREFILL_SMEM));
    }

    #[test]
    fn slot_stride_needs_slots_one_stride_apart() {
        vt_cpu::register();
        let q = Queue::new(Device::CPU).expect("cpu queue");
        let b = Buffer::nan(&q, DType::BF16, &[4, 2, 8, 64]).expect("buffer");
        let whole = b.view().select(1, 0).expect("view"); // [4, 8, 64], blocks 2 x 8 rows apart
        assert_eq!(slot_stride(&whole), None);
        assert_eq!(slot_stride(&whole.slice(0, 0, 1).expect("one block")), Some(64));
        assert_eq!(slot_stride(&whole.slice(1, 0, 1).expect("bs 1")), Some(2 * 8 * 64));
        let flat = b.view().as_strided(0, &[8, 8, 64], &[512, 64, 1]).expect("view");
        assert_eq!(slot_stride(&flat), Some(64));
    }
}
