//! vt-cuda's one layer of cuBLASLt calls (libcublasLt, loaded at run time by cudarc), for the
//! block-scaled fp8 matmul ([`crate::fp8_matmul`]'s `Kernel::Lt`).
//!
//! The op file builds an [`LtGemm`] (plain data: cuBLAS's column-major shapes, leading
//! dimensions, addresses, output type) from validated views; this file turns it into
//! descriptors, asks the heuristic once per shape (cached per device), and enqueues
//! `cublasLtMatmul` on the queue's stream with the queue's own workspace. Its `unsafe` is
//! here only: cudarc's raw attribute setters (a pointer and a size each), the destroys
//! of the descriptors this file created, the heuristic queries and the matmul.
//!
//! - Scales: `A` (the weights, K-major) in `CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F`,
//!   `B` (the activations, K-major) in `CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F` (cuBLAS
//!   12.9+, Hopper); f32 compute, alpha 1, beta 0, no fast accumulation (the block-scaled
//!   modes do not allow it), no epilogue.
//! - Workspace: 32 MiB per queue, allocated by the first Lt call on the queue and kept for
//!   the queue's life (never regrown), so that after warm-up a call allocates nothing and
//!   can be captured in a CUDA graph (the first call must not be inside a capture: its
//!   allocation would fail it).
//! - Descriptors are created per call (host objects, a few microseconds; no device work);
//!   the heuristic's algorithm (plain data) is cached per (device, shape, alignments).
//! - `VT_LT_TUNE` (off by default): the first [`matmul`] of a key outside a CUDA graph
//!   capture asks the heuristic for up to [`MAX_CANDIDATES`] algorithms instead of one,
//!   times each usable one on the call's own operands and the queue's stream (one untimed
//!   run, then [`TIMED_RUNS`] between CUDA events; the fastest run counts) and caches the
//!   fastest for the key (PyTorch's TunableOp for this one call). That call synchronizes its
//!   queue (reading the events) and runs the GEMM ~30 times: warm up before capturing a
//!   graph. The cache entry remembers whether it was tuned, so a key first met inside a
//!   capture (or by [`supported`], which never tunes) is tuned at its next call outside one.
//!   Tuning holds this file's queue lock, so other queues' cuBLASLt calls wait for it.
//! - A missing libcublasLt is an error naming the op (checked with libloading before cudarc
//!   touches the library, which would panic).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::{Arc, LazyLock, Mutex, OnceLock, Weak};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaStream;
use vt_core::{Buffer, DType, Error, OpId, Queue, Result};

use crate::device::{drv, library_present, BACKEND};
use crate::CudaQueue;

/// cuBLASLt's workspace per queue (cuBLAS's recommendation on Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// `VT_LT_TUNE`: how many algorithms the heuristic is asked for.
const MAX_CANDIDATES: usize = 8;

/// `VT_LT_TUNE`: timed runs per candidate (after one untimed run).
const TIMED_RUNS: usize = 3;

/// One block-scaled fp8 GEMM in cuBLAS's column-major terms:
/// `D[m, n] = op_T(A)[m, k] . B[k, n]` with `A` stored `[k, m]` (K-major, leading dimension
/// `lda`), `B` stored `[k, n]` (K-major, `ldb`) and `D` `[m, n]` (`ldd`), all in elements.
/// For vt's row-major `out[M, N] = a[M, K] . W[N, K]^T`: A = W, B = a, D = out, m = N,
/// n = M ("TN", the only fp8 form cuBLASLt has). `a_scale`: W's `[ceil(m/128),
/// ceil(k/128)]` f32 block scales (k-blocks contiguous, rows `round_up(ceil(k/128), 4)`
/// apart); `b_scale`: a's `[ceil(k/128), n]` f32 scales (n contiguous).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LtGemm {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub a: u64,
    pub lda: i64,
    pub b: u64,
    pub ldb: i64,
    pub d: u64,
    pub ldd: i64,
    pub a_scale: u64,
    pub b_scale: u64,
    /// `D`'s type: bf16, f16 or f32.
    pub out: DType,
}

/// Largest power of two dividing `addr`, capped at 256 (what the heuristic is told).
fn alignment(addr: u64) -> u32 {
    if addr == 0 {
        return 256;
    }
    (1u64 << addr.trailing_zeros().min(8)) as u32
}

/// What the heuristic's choice depends on: everything but the addresses (whose alignment
/// classes stand in for them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    device: usize,
    m: u64,
    n: u64,
    k: u64,
    lda: i64,
    ldb: i64,
    ldd: i64,
    out: DType,
    align: [u32; 3],
}

impl LtGemm {
    fn key(&self, device: usize) -> Key {
        Key {
            device,
            m: self.m,
            n: self.n,
            k: self.k,
            lda: self.lda,
            ldb: self.ldb,
            ldd: self.ldd,
            out: self.out,
            align: [alignment(self.a), alignment(self.b), alignment(self.d)],
        }
    }
}

/// Whether libcublasLt can be loaded (probed once).
pub(crate) fn present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| library_present("cublasLt"))
}

fn lt_err(op: OpId, what: &'static str) -> impl Fn(lt::CublasError) -> Error {
    move |e| Error::op_failed(op, BACKEND, format!("{what}: {e}"))
}

fn data_type(op: OpId, dt: DType) -> Result<sys::cudaDataType> {
    Ok(match dt {
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        other => {
            return Err(Error::invalid(op, "out", format!("dtype {other} is not a cuBLASLt fp8 output")))
        }
    })
}

/// A cuBLASLt handle and workspace of one queue (stream).
struct LtQueue {
    stream: Weak<CudaStream>,
    handle: sys::cublasLtHandle_t,
    workspace: Buffer,
}

// SAFETY: the handle is only passed to cuBLASLt calls, which NVIDIA documents as thread-safe
// for one handle (it holds no stream or mutable state of its own); the workspace is used by
// one stream only (the handle's queue), in stream order.
unsafe impl Send for LtQueue {}

impl Drop for LtQueue {
    fn drop(&mut self) {
        // SAFETY: created in `queue_state` and destroyed once, here.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

static QUEUES: LazyLock<Mutex<HashMap<usize, LtQueue>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// An algorithm, or why there is none (a descriptor cuBLASLt refuses, no algorithm, too much
/// workspace).
type Found = std::result::Result<sys::cublasLtMatmulAlgo_t, String>;

/// A key's cached choice.
#[derive(Clone, Debug)]
struct Choice {
    algo: Found,
    /// Chosen by [`tune`] (`VT_LT_TUNE`), not the heuristic's first choice taken as is.
    tuned: bool,
}

static ALGOS: LazyLock<Mutex<HashMap<Key, Choice>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn poisoned(op: OpId) -> Error {
    Error::op_failed(op, BACKEND, "a lock was poisoned by a panic")
}

/// Runs `f` with this queue's handle and workspace address, creating them on first use.
fn with_queue<T>(
    q: &Queue,
    cq: &CudaQueue,
    op: OpId,
    f: impl FnOnce(sys::cublasLtHandle_t, u64) -> Result<T>,
) -> Result<T> {
    if !present() {
        return Err(Error::op_failed(
            op,
            BACKEND,
            "libcublasLt not found (the Lt kernel needs cuBLASLt 12.9+)",
        ));
    }
    let mut all = QUEUES.lock().map_err(|_| poisoned(op))?;
    if !crate::graph::capturing() {
        all.retain(|_, s| s.stream.strong_count() > 0);
    }
    let key = Arc::as_ptr(&cq.stream) as usize;
    let s = match all.entry(key) {
        Entry::Occupied(e) => e.into_mut(),
        Entry::Vacant(v) => {
            cq.device.ctx.bind_to_thread().map_err(drv("binding the context"))?;
            // Raw bytes: any 1-byte dtype serves.
            let workspace = Buffer::uninit(q, DType::F8E4M3, &[WORKSPACE_BYTES as i64])?;
            let handle = lt::create_handle().map_err(lt_err(op, "cublasLtCreate"))?;
            v.insert(LtQueue { stream: Arc::downgrade(&cq.stream), handle, workspace })
        }
    };
    f(s.handle, s.workspace.view().data_addr())
}

/// The descriptors of one call, destroyed on drop.
struct Descs {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each was created by `Descs::new` (null ones were never created) and is
        // destroyed once, after the last call that used it was enqueued (cuBLASLt copies
        // what it needs at enqueue time).
        unsafe {
            if !self.d.is_null() {
                let _ = lt::destroy_matrix_layout(self.d);
            }
            if !self.b.is_null() {
                let _ = lt::destroy_matrix_layout(self.b);
            }
            if !self.a.is_null() {
                let _ = lt::destroy_matrix_layout(self.a);
            }
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
        }
    }
}

/// Sets one attribute of a matmul descriptor to the bytes of `v`.
fn set_desc<T: Copy>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> std::result::Result<(), lt::CublasError> {
    // SAFETY: `desc` is live (owned by the caller's `Descs`); cuBLASLt copies
    // `size_of::<T>()` bytes from `v`, which is a valid `T` of exactly the type the
    // attribute documents (the callers pass the documented types).
    unsafe {
        lt::set_matmul_desc_attribute(desc, attr, v as *const T as *const c_void, std::mem::size_of::<T>())
    }
}

impl Descs {
    fn new(op: OpId, g: &LtGemm) -> Result<Descs> {
        use sys::cublasLtMatmulDescAttributes_t as A;
        let f8 = sys::cudaDataType::CUDA_R_8F_E4M3;
        let out = data_type(op, g.out)?;
        let mut d = Descs {
            desc: std::ptr::null_mut(),
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
        };
        let e = |what| lt_err(op, what);
        d.desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(e("cublasLtMatmulDescCreate"))?;
        d.a = lt::create_matrix_layout(f8, g.k, g.m, g.lda).map_err(e("cublasLtMatrixLayoutCreate (A)"))?;
        d.b = lt::create_matrix_layout(f8, g.k, g.n, g.ldb).map_err(e("cublasLtMatrixLayoutCreate (B)"))?;
        d.d = lt::create_matrix_layout(out, g.m, g.n, g.ldd).map_err(e("cublasLtMatrixLayoutCreate (D)"))?;
        // cublasOperation_t (4 bytes, as the attribute documents); the scale modes are 4-byte enums.
        use cudarc::cublas::sys::cublasOperation_t as Op;
        let (t, n) = (Op::CUBLAS_OP_T, Op::CUBLAS_OP_N);
        let blk = sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        let vec = sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        let (sa, sb) = (g.a_scale as *const c_void, g.b_scale as *const c_void);
        let set = |attr, r: std::result::Result<(), lt::CublasError>| {
            r.map_err(|er| {
                Error::op_failed(op, BACKEND, format!("cublasLtMatmulDescSetAttribute({attr:?}): {er}"))
            })
        };
        set(A::CUBLASLT_MATMUL_DESC_TRANSA, set_desc(d.desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &t))?;
        set(A::CUBLASLT_MATMUL_DESC_TRANSB, set_desc(d.desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &n))?;
        set(
            A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
            set_desc(d.desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &blk),
        )?;
        set(
            A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
            set_desc(d.desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec),
        )?;
        set(
            A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
            set_desc(d.desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa),
        )?;
        set(
            A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
            set_desc(d.desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb),
        )?;
        Ok(d)
    }
}

/// How many keys have an algorithm chosen by [`tune`] (`fp8_matmul::lt_tuned_shapes`); 0 if
/// the lock was poisoned.
pub(crate) fn tuned_shapes() -> usize {
    ALGOS.lock().map_or(0, |all| all.values().filter(|c| c.tuned && c.algo.is_ok()).count())
}

/// What [`tune`] needs besides the handle: the queue (its stream and context) and its
/// workspace's address.
#[derive(Clone, Copy)]
struct Tuner<'a> {
    cq: &'a CudaQueue,
    workspace: u64,
}

/// The algorithm for `g`, cached per key: the heuristic's first choice ([`find`]), or with
/// `tuner` (`VT_LT_TUNE` on, not capturing) the fastest candidate ([`tune`]); a cached
/// untuned choice is replaced when a `tuner` comes. Errors only for a poisoned lock.
fn algo(
    op: OpId,
    handle: sys::cublasLtHandle_t,
    key: Key,
    g: &LtGemm,
    tuner: Option<Tuner<'_>>,
) -> Result<Found> {
    if let Some(c) = ALGOS.lock().map_err(|_| poisoned(op))?.get(&key) {
        // A key with no algorithm has nothing to tune.
        if c.tuned || tuner.is_none() || c.algo.is_err() {
            return Ok(c.algo.clone());
        }
    }
    let choice = match tuner {
        Some(t) => Choice { algo: tune(op, handle, key, g, t), tuned: true },
        None => Choice { algo: find(op, handle, key, g), tuned: false },
    };
    if let Err(why) = &choice.algo {
        tracing::debug!(%op, ?key, %why, "no cuBLASLt block-scaled fp8 algorithm");
    }
    ALGOS.lock().map_err(|_| poisoned(op))?.insert(key, choice.clone());
    Ok(choice.algo)
}

/// One heuristic query for the best algorithm (`algo` caches it).
fn find(op: OpId, handle: sys::cublasLtHandle_t, key: Key, g: &LtGemm) -> Found {
    let d = Descs::new(op, g).map_err(|e| e.to_string())?;
    let pref = preference(key)?;
    // SAFETY: every descriptor is live (owned by `d` and `pref`) and describes `g`'s
    // matrices; the heuristic only reads them and writes its result.
    match unsafe { lt::get_matmul_algo_heuristic(handle, d.desc, d.a, d.b, d.d, d.d, pref.0) } {
        Ok(h) if h.workspaceSize <= WORKSPACE_BYTES => Ok(h.algo),
        Ok(h) => {
            Err(format!("its algorithm wants {} workspace bytes (have {WORKSPACE_BYTES})", h.workspaceSize))
        }
        Err(e) => Err(format!("cublasLtMatmulAlgoGetHeuristic: {e}")),
    }
}

/// `VT_LT_TUNE`: times each usable candidate of the heuristic ([`candidates`], [`usable`]) on
/// `g`'s own operands on the queue's stream ([`time_ms`]) and returns the fastest
/// ([`fastest`]: the heuristic's order breaks ties; candidates that fail are skipped). `D` is
/// overwritten, which the caller's own call then writes again (the op's contract forbids
/// `D` aliasing `A` or `B`). Synchronizes the stream. Without candidates, [`find`]'s answer;
/// if none could be timed, the heuristic's first.
fn tune(op: OpId, handle: sys::cublasLtHandle_t, key: Key, g: &LtGemm, t: Tuner<'_>) -> Found {
    let d = Descs::new(op, g).map_err(|e| e.to_string())?;
    let cands = match candidates(handle, &d, key) {
        Ok(found) => usable(&found),
        Err(why) => {
            tracing::debug!(%op, ?key, %why, "VT_LT_TUNE: no cuBLASLt candidates; the heuristic's first");
            Vec::new()
        }
    };
    if cands.is_empty() {
        return find(op, handle, key, g);
    }
    let times: Vec<Result<f32>> = cands
        .iter()
        .map(|c| {
            t.cq.device.ctx.bind_to_thread().map_err(drv("binding the context"))?;
            time_ms(t.cq, || {
                launch(handle, t.workspace, t.cq, &d, g, &c.algo).map_err(lt_err(op, "cublasLtMatmul"))
            })
        })
        .collect();
    let best = fastest(&times).unwrap_or(0);
    let summary: Vec<String> = cands
        .iter()
        .zip(&times)
        .enumerate()
        .map(|(i, (c, r))| {
            let time = match r {
                Ok(ms) => format!("{:.1} us", ms * 1e3),
                Err(e) => format!("failed ({e})"),
            };
            format!("#{i}: {time}, workspace {} B, waves {:.2}", c.workspaceSize, c.wavesCount)
        })
        .collect();
    tracing::debug!(
        %op,
        ?key,
        chosen = best,
        candidates = %summary.join("; "),
        "VT_LT_TUNE: timed the cuBLASLt block-scaled fp8 candidates (#0 is the heuristic's first)"
    );
    Ok(cands[best].algo)
}

/// Up to [`MAX_CANDIDATES`] of the heuristic's algorithms for `d`'s matrices, in its order
/// (best estimate first), as it returns them (each with its own `state`).
fn candidates(
    handle: sys::cublasLtHandle_t,
    d: &Descs,
    key: Key,
) -> std::result::Result<Vec<sys::cublasLtMatmulHeuristicResult_t>, String> {
    let pref = preference(key)?;
    let mut found = [MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::uninit(); MAX_CANDIDATES];
    let mut count: c_int = 0;
    // SAFETY: every descriptor is live (owned by `d` and `pref`) and describes the call's
    // matrices; the heuristic only reads them, writes at most `requestedAlgoCount` =
    // MAX_CANDIDATES results into `found` (exactly that many long) and their number into
    // `count`; only the first `count` (clamped to the array) are read, as initialized.
    unsafe {
        sys::cublasLtMatmulAlgoGetHeuristic(
            handle,
            d.desc,
            d.a,
            d.b,
            d.d,
            d.d,
            pref.0,
            MAX_CANDIDATES as c_int,
            found.as_mut_ptr().cast(),
            &mut count,
        )
        .result()
        .map_err(|e| format!("cublasLtMatmulAlgoGetHeuristic ({MAX_CANDIDATES} requested): {e}"))?;
        let n = usize::try_from(count).unwrap_or(0).min(MAX_CANDIDATES);
        Ok(found[..n].iter().map(|h| h.assume_init()).collect())
    }
}

/// The candidates cuBLASLt can run with this file's workspace, in the heuristic's order:
/// state success and at most [`WORKSPACE_BYTES`] of workspace.
fn usable(found: &[sys::cublasLtMatmulHeuristicResult_t]) -> Vec<sys::cublasLtMatmulHeuristicResult_t> {
    found
        .iter()
        .filter(|h| {
            h.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && h.workspaceSize <= WORKSPACE_BYTES
        })
        .copied()
        .collect()
}

/// The index of the fastest timed candidate (`times[i]`: candidate `i`'s time, or why it
/// could not be timed, skipped); a later candidate must be strictly faster, so ties go to
/// the heuristic's order. `None` when none was timed.
fn fastest<E>(times: &[std::result::Result<f32, E>]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, t) in times.iter().enumerate() {
        if let Ok(t) = *t {
            if t.is_finite() && best.is_none_or(|(_, b)| t < b) {
                best = Some((i, t));
            }
        }
    }
    best.map(|(i, _)| i)
}

/// Runs `f` (one enqueue on `cq`'s stream) once untimed, then [`TIMED_RUNS`] times, each
/// between two CUDA events, and returns the fastest run in milliseconds. Synchronizes the
/// stream (reading the events). An error stops it (work already enqueued still runs).
fn time_ms(cq: &CudaQueue, mut f: impl FnMut() -> Result<()>) -> Result<f32> {
    let event =
        || cq.device.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(drv("creating an event"));
    let mut events = Vec::with_capacity(TIMED_RUNS);
    for _ in 0..TIMED_RUNS {
        events.push((event()?, event()?));
    }
    f()?;
    for (start, end) in &events {
        start.record(&cq.stream).map_err(drv("recording an event"))?;
        f()?;
        end.record(&cq.stream).map_err(drv("recording an event"))?;
    }
    let mut best = f32::INFINITY;
    for (start, end) in &events {
        // Waits for both events (cuEventSynchronize), then cuEventElapsedTime.
        best = best.min(start.elapsed_ms(end).map_err(drv("reading an event"))?);
    }
    Ok(best)
}

/// A preference descriptor for `key`: this file's workspace size and `key`'s alignments.
fn preference(key: Key) -> std::result::Result<Pref, String> {
    let pref = Pref(lt::create_matmul_pref().map_err(|e| format!("cublasLtMatmulPreferenceCreate: {e}"))?);
    use sys::cublasLtMatmulPreferenceAttributes_t as P;
    let ws = WORKSPACE_BYTES as u64;
    // SAFETY: `pref` is live; cuBLASLt copies 8 bytes from `ws`, a u64 (the attribute's
    // size_t).
    unsafe {
        lt::set_matmul_pref_attribute(
            pref.0,
            P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &ws as *const u64 as *const c_void,
            8,
        )
    }
    .map_err(|e| format!("cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES): {e}"))?;
    for (attr, a) in [
        (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align[0]),
        (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align[1]),
        (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align[2]),
        (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align[2]),
    ] {
        // SAFETY: as above; the alignment attributes are u32 (4 bytes).
        unsafe { lt::set_matmul_pref_attribute(pref.0, attr, &a as *const u32 as *const c_void, 4) }
            .map_err(|e| format!("cublasLtMatmulPreferenceSetAttribute({attr:?}): {e}"))?;
    }
    Ok(pref)
}

/// A preference descriptor, destroyed on drop.
struct Pref(sys::cublasLtMatmulPreference_t);

impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by `preference` and destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

/// Whether cuBLASLt has an algorithm for `g` on this queue's device (asks the heuristic the
/// first time, never tunes; creates the queue's handle and workspace). `false` without
/// libcublasLt, or when cuBLASLt refuses the descriptors (an older library without the
/// block-scaled modes).
pub(crate) fn supported(q: &Queue, cq: &CudaQueue, op: OpId, g: &LtGemm) -> Result<bool> {
    if !present() {
        return Ok(false);
    }
    let key = g.key(Arc::as_ptr(&cq.device.ctx) as usize);
    with_queue(q, cq, op, |handle, _| Ok(algo(op, handle, key, g, None)?.is_ok()))
}

/// Enqueues `g` on the queue's stream. `g` comes from validated views (every matrix it
/// describes lies inside them); an error when cuBLASLt has no algorithm for it. With
/// `VT_LT_TUNE` on and outside a graph capture, a key's first call (or its first since a
/// capture met it) times the heuristic's candidates first ([`tune`]: synchronizes).
pub(crate) fn matmul(q: &Queue, cq: &CudaQueue, op: OpId, g: &LtGemm) -> Result<()> {
    let key = g.key(Arc::as_ptr(&cq.device.ctx) as usize);
    // Tuning synchronizes the stream, which a capture forbids.
    let tune = vt_core::flags::lt_tune() && !crate::graph::capturing();
    with_queue(q, cq, op, |handle, workspace| {
        let tuner = tune.then_some(Tuner { cq, workspace });
        let a = algo(op, handle, key, g, tuner)?.map_err(|why| {
            Error::invalid(
                op,
                "a",
                format!(
                    "cuBLASLt has no block-scaled fp8 algorithm for M {} N {} K {} ({} output) on this device: {why}",
                    g.n, g.m, g.k, g.out
                ),
            )
        })?;
        let d = Descs::new(op, g)?;
        cq.device.ctx.bind_to_thread().map_err(drv("binding the context"))?;
        launch(handle, workspace, cq, &d, g, &a).map_err(lt_err(op, "cublasLtMatmul"))
    })
}

/// Enqueues one `cublasLtMatmul` of `g` with `algo` on `cq`'s stream (the context bound by
/// the caller).
fn launch(
    handle: sys::cublasLtHandle_t,
    workspace: u64,
    cq: &CudaQueue,
    d: &Descs,
    g: &LtGemm,
    algo: &sys::cublasLtMatmulAlgo_t,
) -> std::result::Result<(), lt::CublasError> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the descriptors (`Descs::new(_, g)`, live while `d` is) describe exactly `g`'s
    // matrices, which lie inside validated views (the op's contract and
    // `fp8_matmul::lt_plan`'s checks: K-major operands, leading dimensions and scale
    // layouts as cuBLASLt reads them); `algo` came from the heuristic for these descriptors
    // and this key's alignments; C = D with beta 0 (never read); alpha and beta are host f32
    // values read during the call (host pointer mode); the workspace is this queue's,
    // WORKSPACE_BYTES long, used in stream order only; the call enqueues on the queue's
    // stream and neither allocates nor syncs.
    unsafe {
        lt::matmul(
            handle,
            d.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            g.a as *const c_void,
            d.a,
            g.b as *const c_void,
            d.b,
            g.d as *const c_void,
            d.d,
            g.d as *mut c_void,
            d.d,
            algo,
            workspace as *mut c_void,
            WORKSPACE_BYTES,
            cq.stream.cu_stream() as sys::cudaStream_t,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_classes() {
        assert_eq!(
            (alignment(0), alignment(1), alignment(16), alignment(48), alignment(4096)),
            (256, 1, 16, 16, 256)
        );
    }

    /// A heuristic result as cuBLASLt would return it, told apart by `algo.data[0]`.
    fn result(id: u64, state: sys::cublasStatus_t, workspace: usize) -> sys::cublasLtMatmulHeuristicResult_t {
        let mut algo = sys::cublasLtMatmulAlgo_t { data: [0; 8] };
        algo.data[0] = id;
        sys::cublasLtMatmulHeuristicResult_t {
            algo,
            workspaceSize: workspace,
            state,
            wavesCount: 1.0,
            reserved: [0; 4],
        }
    }

    #[test]
    fn usable_keeps_successful_candidates_within_the_workspace_in_order() {
        use sys::cublasStatus_t as S;
        let found = [
            result(1, S::CUBLAS_STATUS_SUCCESS, 0),
            result(2, S::CUBLAS_STATUS_NOT_SUPPORTED, 0),
            result(3, S::CUBLAS_STATUS_SUCCESS, WORKSPACE_BYTES + 1),
            result(4, S::CUBLAS_STATUS_SUCCESS, WORKSPACE_BYTES),
            result(5, S::CUBLAS_STATUS_INVALID_VALUE, 1024),
            result(6, S::CUBLAS_STATUS_SUCCESS, 1 << 20),
        ];
        let ids: Vec<u64> = usable(&found).iter().map(|h| h.algo.data[0]).collect();
        assert_eq!(ids, [1, 4, 6]);
        assert!(usable(&[]).is_empty());
        assert!(usable(&found[1..3]).is_empty());
    }

    #[test]
    fn fastest_skips_failures_and_keeps_the_heuristic_order_on_ties() {
        let ok = |ms: f32| -> std::result::Result<f32, &str> { Ok(ms) };
        let bad = || -> std::result::Result<f32, &str> { Err("launch failed") };
        assert_eq!(fastest(&[ok(0.30), ok(0.25), ok(0.27)]), Some(1));
        // A failed candidate is skipped, however it would have timed.
        assert_eq!(fastest(&[bad(), ok(0.40), bad(), ok(0.35)]), Some(3));
        // Ties: the earlier candidate (the heuristic's preference) stays.
        assert_eq!(fastest(&[ok(0.20), ok(0.20), ok(0.21)]), Some(0));
        assert_eq!(fastest(&[ok(0.30), ok(0.20), ok(0.20)]), Some(1));
        // A time that is not a number is no time.
        assert_eq!(fastest(&[ok(f32::NAN), ok(0.5), ok(f32::INFINITY)]), Some(1));
        // Nothing timed: the caller falls back to the heuristic's first (index 0).
        assert_eq!(fastest(&[bad(), bad()]), None);
        assert_eq!(fastest::<()>(&[]), None);
    }
}
