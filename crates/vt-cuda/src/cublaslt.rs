//! vt-cuda's one layer of cuBLASLt calls (libcublasLt, loaded at run time by cudarc), for the
//! block-scaled fp8 matmul ([`crate::fp8_matmul`]'s `Kernel::Lt`).
//!
//! The op file builds an [`LtGemm`] (plain data: cuBLAS's column-major shapes, leading
//! dimensions, addresses, output type) from validated views; this file turns it into
//! descriptors, asks the heuristic once per shape (cached per device), and enqueues
//! `cublasLtMatmul` on the queue's stream with the queue's own workspace. Its `unsafe` is
//! here only: cudarc's raw attribute setters (a pointer and a size each), the destroys
//! of the descriptors this file created, the heuristic query and the matmul.
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
//! - A missing libcublasLt is an error naming the op (checked with libloading before cudarc
//!   touches the library, which would panic).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, LazyLock, Mutex, OnceLock, Weak};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::CudaStream;
use vt_core::{Buffer, DType, Error, OpId, Queue, Result};

use crate::device::{drv, library_present, BACKEND};
use crate::CudaQueue;

/// cuBLASLt's workspace per queue (cuBLAS's recommendation on Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

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

type Algos = HashMap<Key, std::result::Result<sys::cublasLtMatmulAlgo_t, String>>;
static ALGOS: LazyLock<Mutex<Algos>> = LazyLock::new(|| Mutex::new(HashMap::new()));

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

/// The heuristic's best algorithm for `g`, or why there is none (a descriptor cuBLASLt
/// refuses, no algorithm, too much workspace), asked once per key.
fn algo(
    op: OpId,
    handle: sys::cublasLtHandle_t,
    key: Key,
    g: &LtGemm,
) -> Result<std::result::Result<sys::cublasLtMatmulAlgo_t, String>> {
    if let Some(a) = ALGOS.lock().map_err(|_| poisoned(op))?.get(&key) {
        return Ok(a.clone());
    }
    let found = find(op, handle, key, g);
    if let Err(why) = &found {
        tracing::debug!(%op, ?key, %why, "no cuBLASLt block-scaled fp8 algorithm");
    }
    ALGOS.lock().map_err(|_| poisoned(op))?.insert(key, found.clone());
    Ok(found)
}

/// One heuristic query (`algo` caches it).
fn find(
    op: OpId,
    handle: sys::cublasLtHandle_t,
    key: Key,
    g: &LtGemm,
) -> std::result::Result<sys::cublasLtMatmulAlgo_t, String> {
    let d = Descs::new(op, g).map_err(|e| e.to_string())?;
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

/// A preference descriptor, destroyed on drop.
struct Pref(sys::cublasLtMatmulPreference_t);

impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by `algo` and destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

/// Whether cuBLASLt has an algorithm for `g` on this queue's device (asks the heuristic the
/// first time; creates the queue's handle and workspace). `false` without libcublasLt, or
/// when cuBLASLt refuses the descriptors (an older library without the block-scaled modes).
pub(crate) fn supported(q: &Queue, cq: &CudaQueue, op: OpId, g: &LtGemm) -> Result<bool> {
    if !present() {
        return Ok(false);
    }
    let key = g.key(Arc::as_ptr(&cq.device.ctx) as usize);
    with_queue(q, cq, op, |handle, _| Ok(algo(op, handle, key, g)?.is_ok()))
}

/// Enqueues `g` on the queue's stream. `g` comes from validated views (every matrix it
/// describes lies inside them); an error when cuBLASLt has no algorithm for it.
pub(crate) fn matmul(q: &Queue, cq: &CudaQueue, op: OpId, g: &LtGemm) -> Result<()> {
    let key = g.key(Arc::as_ptr(&cq.device.ctx) as usize);
    with_queue(q, cq, op, |handle, workspace| {
        let a = algo(op, handle, key, g)?.map_err(|why| {
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
        let (alpha, beta) = (1.0f32, 0.0f32);
        cq.device.ctx.bind_to_thread().map_err(drv("binding the context"))?;
        // SAFETY: the descriptors describe exactly `g`'s matrices, which lie inside validated
        // views (the op's contract and `fp8_matmul::lt_plan`'s checks: K-major operands,
        // leading dimensions and scale layouts as cuBLASLt reads them); `a` came from the
        // heuristic for this key; C = D with beta 0 (never read); alpha and beta are host
        // f32 values read during the call (host pointer mode); the workspace is this
        // queue's, WORKSPACE_BYTES long, used in stream order only; the call enqueues on
        // the queue's stream and neither allocates nor syncs.
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
                &a,
                workspace as *mut c_void,
                WORKSPACE_BYTES,
                cq.stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(lt_err(op, "cublasLtMatmul"))
    })
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
}
