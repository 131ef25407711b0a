//! A queue is one CUDA stream of one device, plus the cuBLAS handle and workspace that
//! the matmuls issue on it. Everything an op needs is created here, once, so an op call
//! allocates nothing and never waits for the device.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result, CudaFunction, CudaStream};
use vt_core::{DType, Error, EventImpl, GraphImpl, Queue, QueueImpl, Result, Subject};

use crate::device::{drv, library_present, DeviceState, BACKEND};
use crate::kernels::KernelSource;

/// cuBLAS's recommended workspace on Hopper; given to the handle up front so that no call
/// allocates (a requirement of CUDA graph capture).
const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle bound to one stream, with its preallocated workspace.
pub(crate) struct Blas {
    pub handle: blas_sys::cublasHandle_t,
    workspace: u64,
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle and workspace were created in `CudaQueue::new` and are released
        // once; the owning queue's context is current (bound in `CudaQueue::drop`).
        unsafe {
            let _ = blas::destroy_handle(self.handle);
            let _ = result::free_sync(self.workspace);
        }
    }
}

/// The CUDA [`QueueImpl`]: a non-blocking stream.
pub struct CudaQueue {
    pub(crate) device: Arc<DeviceState>,
    pub(crate) stream: Arc<CudaStream>,
    /// `None` when libcublas is not installed (the matmuls are then not registered).
    pub(crate) blas: Option<Blas>,
    /// Set once a graph has been captured on this stream: ops' per-queue buffers are then
    /// kept (not freed) when they grow, since a graph may still use the old ones.
    pub(crate) captured: AtomicBool,
}

// SAFETY: the stream and context are thread-safe driver objects. The cuBLAS handle is
// configured once in `new` and afterwards only passed to GEMM calls, which cuBLAS allows
// from several host threads even with the same handle.
unsafe impl Send for CudaQueue {}
unsafe impl Sync for CudaQueue {}

impl CudaQueue {
    pub(crate) fn new(device: Arc<DeviceState>) -> Result<CudaQueue> {
        let stream = device.ctx.new_stream().map_err(drv("creating a stream"))?;
        let blas = if library_present("cublas") { Some(Self::new_blas(&stream)?) } else { None };
        Ok(CudaQueue { device, stream, blas, captured: AtomicBool::new(false) })
    }

    fn new_blas(stream: &CudaStream) -> Result<Blas> {
        let berr =
            |what: &'static str| move |e: blas::CublasError| Error::backend(BACKEND, format!("{what}: {e}"));
        stream.context().bind_to_thread().map_err(drv("binding the context"))?;
        let handle = blas::create_handle().map_err(berr("cublasCreate"))?;
        // SAFETY: the context is current; the allocation is owned by the returned Blas.
        let workspace = match unsafe { result::malloc_sync(CUBLAS_WORKSPACE_BYTES) } {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: the handle was just created and is not used elsewhere.
                unsafe {
                    let _ = blas::destroy_handle(handle);
                }
                return Err(Error::backend(BACKEND, format!("allocating the cuBLAS workspace: {e}")));
            }
        };
        let out = Blas { handle, workspace };
        // SAFETY: `handle` is live; the stream belongs to the current context and outlives
        // the handle (both are owned by the same queue); the workspace stays allocated until
        // the handle is destroyed.
        unsafe {
            blas::set_stream(handle, stream.cu_stream() as blas_sys::cudaStream_t)
                .map_err(berr("cublasSetStream"))?;
            blas_sys::cublasSetWorkspace_v2(handle, workspace as *mut _, CUBLAS_WORKSPACE_BYTES)
                .result()
                .map_err(berr("cublasSetWorkspace"))?;
            // f32 accumulation everywhere: no TF32 for f32 inputs (the default math mode
            // already excludes it) and no reductions in the output's 16-bit type.
            blas_sys::cublasSetMathMode(
                handle,
                blas_sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
            )
            .result()
            .map_err(berr("cublasSetMathMode"))?;
        }
        Ok(out)
    }

    /// The CUDA queue behind a `vt_core::Queue`, or an error naming `what` (an [`OpId`],
    /// or the name of another API: graph capture, benches, NCCL).
    pub(crate) fn of(q: &Queue, what: impl Into<Subject>) -> Result<&CudaQueue> {
        q.downcast::<CudaQueue>().ok_or_else(|| match what.into() {
            Subject::Op(op) => Error::op_failed(op, BACKEND, "the queue is not a CUDA queue"),
            Subject::Api(api) => Error::backend(BACKEND, format!("{api}: the queue is not a CUDA queue")),
        })
    }

    /// The kernel `{base}_{dtype}` of `src` on this queue's device.
    pub(crate) fn function(
        &self,
        src: &KernelSource,
        base: &'static str,
        dtype: DType,
    ) -> Result<CudaFunction> {
        self.device.function(src, base, dtype)
    }

    /// The raw stream, e.g. for CUDA graph capture around a sequence of ops.
    pub fn cu_stream(&self) -> cudarc::driver::sys::CUstream {
        self.stream.cu_stream()
    }

    /// Whether a graph has been captured on this queue's stream.
    pub(crate) fn has_captured(&self) -> bool {
        self.captured.load(Ordering::Acquire)
    }

    /// The device's compute capability as XY (90 for sm_90).
    pub fn sm(&self) -> u32 {
        self.device.sm
    }
}

impl Drop for CudaQueue {
    fn drop(&mut self) {
        // The cuBLAS handle and workspace are released with the context current.
        let _ = self.device.ctx.bind_to_thread();
        self.blas = None;
    }
}

impl QueueImpl for CudaQueue {
    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(drv("synchronizing the stream"))
    }

    unsafe fn copy_h2d(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.device.ctx.bind_to_thread().map_err(drv("binding the context"))?;
        // SAFETY: the caller guarantees `dst` spans `src.len()` bytes of a live allocation
        // of this device. For pageable host memory cuMemcpyHtoDAsync returns once `src`
        // has been staged, so the caller may reuse it at once, with no stream sync.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(drv("copying host to device"))
    }

    unsafe fn copy_d2h(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.device.ctx.bind_to_thread().map_err(drv("binding the context"))?;
        // SAFETY: the caller guarantees `src` spans `dst.len()` bytes of a live allocation;
        // the stream is synchronized before `dst` is read, after all queued work.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(drv("copying device to host"))?;
        self.synchronize()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn supports_capture(&self) -> bool {
        true
    }

    fn capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn GraphImpl>> {
        crate::graph::capture_on(self, f)
    }

    fn record_event(&self) -> Result<Box<dyn EventImpl>> {
        Ok(Box::new(crate::graph::CudaEventImpl::record(self)?))
    }
}
