//! What a backend provides besides its ops: device discovery, memory and queues.
//!
//! Layering (as in cudarc): a backend crate wraps its driver in thin `Result` functions
//! and implements [`Backend`] and [`QueueImpl`]; everything above uses the small safe
//! types here, [`Queue`] and [`Buffer`], and never touches raw addresses.

use std::any::Any;
use std::sync::Arc;

use crate::graph::{EventImpl, GraphImpl};
use crate::{registry, DType, Device, DeviceType, Element, Error, Result, Tensor};

/// Device discovery and memory for one device type. Registered once at start-up with
/// [`registry::register_backend`].
pub trait Backend: Send + Sync {
    fn kind(&self) -> DeviceType;
    /// A short description: library and version (`"cuda: driver 13.0"`).
    fn description(&self) -> String;
    fn device_count(&self) -> usize;
    /// Human-readable name of one device (`"NVIDIA H200 (sm_90)"`).
    fn device_name(&self, ordinal: usize) -> String;
    /// Creates a new in-order queue (a stream) on device `ordinal`.
    fn new_queue(&self, ordinal: usize) -> Result<Arc<dyn QueueImpl>>;
    /// Allocates `bytes` bytes (at least 256-byte aligned) on device `ordinal`.
    fn alloc(&self, ordinal: usize, bytes: usize) -> Result<u64>;
    /// Frees an allocation made by [`Backend::alloc`].
    ///
    /// # Safety
    /// `addr` must come from `alloc(ordinal, bytes)` and not be used afterwards.
    unsafe fn free(&self, ordinal: usize, addr: u64, bytes: usize);
}

/// An in-order work queue on one device (a CUDA/HIP stream; the CPU runs work inline).
pub trait QueueImpl: Send + Sync + Any {
    /// Waits until all queued work has finished.
    fn synchronize(&self) -> Result<()>;
    /// Copies host bytes to device address `dst`; returns once `src` may be reused.
    ///
    /// # Safety
    /// `dst..dst+src.len()` must be inside a live allocation of this queue's device.
    unsafe fn copy_h2d(&self, dst: u64, src: &[u8]) -> Result<()>;
    /// Copies device bytes at `src` to the host, after all queued work has finished.
    ///
    /// # Safety
    /// `src..src+dst.len()` must be inside a live allocation of this queue's device.
    unsafe fn copy_d2h(&self, src: u64, dst: &mut [u8]) -> Result<()>;
    /// For backends to downcast to their own queue type.
    fn as_any(&self) -> &dyn Any;

    /// Whether [`QueueImpl::capture`] records work (default: no).
    fn supports_capture(&self) -> bool {
        false
    }

    /// Records the work `f` issues on this queue into a graph instead of running it (see
    /// [`crate::graph`]). Called by [`Queue::capture`] only when
    /// [`QueueImpl::supports_capture`] is true; the default errors with
    /// [`Error::Unsupported`].
    fn capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn GraphImpl>> {
        let _ = f;
        Err(crate::graph::capture_unsupported())
    }

    /// Records a timestamp after the work issued so far (see [`crate::graph::Event`]); the
    /// default errors with [`Error::Unsupported`].
    fn record_event(&self) -> Result<Box<dyn EventImpl>> {
        Err(crate::graph::events_unsupported())
    }
}

/// A queue on one device. Ops are issued on a queue; the CPU queue runs them inline.
#[derive(Clone)]
pub struct Queue {
    device: Device,
    inner: Arc<dyn QueueImpl>,
    backend: Arc<dyn Backend>,
}

impl Queue {
    /// A new queue on `device`. Errors if no backend drives that device.
    pub fn new(device: Device) -> Result<Queue> {
        let backend = registry::backend(device.kind).ok_or_else(|| Error::NoDevice {
            device: device.to_string(),
            msg: "no backend registered for this device type".into(),
        })?;
        if device.ordinal >= backend.device_count() {
            return Err(Error::NoDevice {
                device: device.to_string(),
                msg: format!("the backend has {} device(s)", backend.device_count()),
            });
        }
        let inner = backend.new_queue(device.ordinal)?;
        Ok(Queue { device, inner, backend })
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    /// The backend's queue, for the graph and event methods (`graph.rs`).
    pub(crate) fn queue_impl(&self) -> &dyn QueueImpl {
        self.inner.as_ref()
    }

    /// The backend's own queue type, for backends' op implementations.
    pub fn downcast<T: QueueImpl>(&self) -> Option<&T> {
        self.inner.as_any().downcast_ref::<T>()
    }

    /// Copies a view's elements to the host in logical (row-major) order as f64.
    /// Synchronizes the queue. For tests and tools, not for hot paths.
    pub fn read_f64(&self, t: &Tensor<'_>) -> Result<Vec<f64>> {
        self.check_device("read_f64", t)?;
        let Some((lo, hi)) = t.elem_span() else {
            return Ok(Vec::new());
        };
        let size = t.dtype().size_of();
        let mut bytes = host_bytes(((hi - lo) as usize) * size)?;
        // SAFETY: the span lies inside the view's allocation (checked when the view was
        // made) and the view's lifetime keeps the allocation alive.
        unsafe { self.inner.copy_d2h(t.base_addr() + lo as u64 * size as u64, &mut bytes)? };
        let mut out = crate::tensor::reserve_values(t)?;
        let base = bytes.as_ptr() as u64;
        crate::tensor::for_each_offset(t, |off| {
            // SAFETY: `off - lo` indexes inside `bytes`, which holds the whole span.
            out.push(unsafe { crate::tensor::read_host_elem(base, t.dtype(), off - lo) });
        });
        Ok(out)
    }

    /// Overwrites the contiguous view `dst` with `bytes` (exactly its size), ordered after
    /// the work already issued on this queue; returns once `bytes` may be reused. Each
    /// backend's [`QueueImpl::copy_h2d`] does the copy (a stream-ordered copy on GPUs, a
    /// plain copy on the CPU).
    pub fn write_bytes(&self, dst: &Tensor<'_>, bytes: &[u8]) -> Result<()> {
        const OP: &str = "Queue::write_bytes";
        let want = self.contiguous_bytes(OP, "dst", dst)?;
        if bytes.len() != want {
            return Err(Error::invalid(
                OP,
                "bytes",
                format!(
                    "{} bytes for a {} view of {:?} ({want} bytes)",
                    bytes.len(),
                    dst.dtype(),
                    dst.shape()
                ),
            ));
        }
        if want == 0 {
            return Ok(());
        }
        // SAFETY: `dst` is contiguous, so its `want` bytes from `data_addr` are its elements,
        // which lie inside its allocation (checked when the view was made); the view's
        // lifetime keeps the allocation alive for the call.
        unsafe { self.inner.copy_h2d(dst.data_addr(), bytes) }
    }

    /// The bytes of the contiguous view `src` (row-major), after all work issued on this
    /// queue has finished: the counterpart of [`Queue::write_bytes`].
    pub fn read_bytes(&self, src: &Tensor<'_>) -> Result<Vec<u8>> {
        let n = self.contiguous_bytes("Queue::read_bytes", "src", src)?;
        let mut out = host_bytes(n)?;
        if n > 0 {
            // SAFETY: as in `write_bytes`.
            unsafe { self.inner.copy_d2h(src.data_addr(), &mut out)? };
        }
        Ok(out)
    }

    /// The byte size of `t`, which must be contiguous and on this queue's device.
    fn contiguous_bytes(&self, op: &'static str, arg: &'static str, t: &Tensor<'_>) -> Result<usize> {
        if t.device() != self.device {
            return Err(Error::invalid(
                op,
                arg,
                format!("is on {} but the queue is on {}", t.device(), self.device),
            ));
        }
        if !t.is_contiguous() {
            return Err(Error::invalid(op, arg, format!("must be contiguous, strides {:?}", t.strides())));
        }
        Ok(t.numel() as usize * t.dtype().size_of())
    }

    fn check_device(&self, op: &'static str, t: &Tensor<'_>) -> Result<()> {
        if t.device() != self.device {
            return Err(Error::invalid(
                op,
                "tensor",
                format!("tensor is on {} but the queue is on {}", t.device(), self.device),
            ));
        }
        Ok(())
    }
}

/// An owning, contiguous allocation on one device. Freed on drop.
pub struct Buffer {
    addr: u64,
    bytes: usize,
    dtype: DType,
    shape: Vec<i64>,
    device: Device,
    backend: Arc<dyn Backend>,
}

impl Buffer {
    /// Allocates an uninitialized contiguous buffer of `shape` on the queue's device.
    pub fn uninit(queue: &Queue, dtype: DType, shape: &[i64]) -> Result<Buffer> {
        if shape.len() > crate::MAX_RANK || shape.iter().any(|&s| s < 0) {
            return Err(Error::invalid("Buffer", "shape", format!("{shape:?}")));
        }
        // Checked: a shape from input data whose size wraps must not allocate a wrong size.
        let bytes = crate::checked_bytes(dtype, shape)
            .map_err(|e| Error::invalid("Buffer", "shape", e.to_string()))?
            .max(dtype.size_of());
        let addr = queue.backend.alloc(queue.device.ordinal, bytes).map_err(|e| match e {
            Error::Backend { backend, msg } if !msg.contains(&bytes.to_string()) => Error::Backend {
                backend,
                msg: format!("allocating {bytes} bytes ({dtype} {shape:?}) on {}: {msg}", queue.device),
            },
            e => e,
        })?;
        Ok(Buffer {
            addr,
            bytes,
            dtype,
            shape: shape.to_vec(),
            device: queue.device,
            backend: queue.backend.clone(),
        })
    }

    /// A buffer filled with zeros.
    pub fn zeros(queue: &Queue, dtype: DType, shape: &[i64]) -> Result<Buffer> {
        let b = Buffer::uninit(queue, dtype, shape)?;
        b.fill_pattern(queue, &vec![0u8; dtype.size_of()])?;
        Ok(b)
    }

    /// A buffer filled with quiet NaNs (all-ones for integers): poison for outputs.
    pub fn nan(queue: &Queue, dtype: DType, shape: &[i64]) -> Result<Buffer> {
        let b = Buffer::uninit(queue, dtype, shape)?;
        b.fill_pattern(queue, dtype.nan_bytes())?;
        Ok(b)
    }

    /// A buffer holding `data` (row-major) with `shape`.
    pub fn from_slice<T: Element>(queue: &Queue, shape: &[i64], data: &[T]) -> Result<Buffer> {
        // SAFETY: `Element` types are plain old data; reading their bytes is sound.
        let bytes =
            unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data)) };
        Buffer::from_bytes(queue, T::DTYPE, shape, bytes)
    }

    /// A buffer of `dtype` and `shape` from raw little-endian bytes.
    pub fn from_bytes(queue: &Queue, dtype: DType, shape: &[i64], bytes: &[u8]) -> Result<Buffer> {
        let b = Buffer::uninit(queue, dtype, shape)?;
        b.write_bytes(queue, bytes)?;
        Ok(b)
    }

    /// A buffer of `dtype` holding `values` converted from f64 (rounded to nearest).
    pub fn from_f64(queue: &Queue, dtype: DType, shape: &[i64], values: &[f64]) -> Result<Buffer> {
        let bytes = encode_f64(dtype, values);
        Buffer::from_bytes(queue, dtype, shape, &bytes)
    }

    /// Overwrites the whole buffer with `bytes` (exactly its size).
    pub fn write_bytes(&self, queue: &Queue, bytes: &[u8]) -> Result<()> {
        let want = self.numel() as usize * self.dtype.size_of();
        if bytes.len() != want {
            return Err(Error::invalid(
                "Buffer",
                "bytes",
                format!("{} bytes for a buffer of {want}", bytes.len()),
            ));
        }
        self.check_queue(queue)?;
        if want == 0 {
            return Ok(());
        }
        // SAFETY: `addr` is our live allocation of `self.bytes >= want` bytes.
        unsafe { queue.inner.copy_h2d(self.addr, bytes) }
    }

    /// Fills every element with the byte pattern of one element (`pattern` is one
    /// element's bytes). Writes in pieces of at most 1 MiB, so filling a large buffer
    /// needs no host copy of its size.
    pub fn fill_pattern(&self, queue: &Queue, pattern: &[u8]) -> Result<()> {
        let es = self.dtype.size_of();
        if pattern.len() != es {
            return Err(Error::invalid(
                "Buffer",
                "pattern",
                format!("{} bytes for one {} element of {es}", pattern.len(), self.dtype),
            ));
        }
        self.check_queue(queue)?;
        let total = self.numel() as usize * es;
        let piece: Vec<u8> = pattern.iter().copied().cycle().take(total.min(FILL_PIECE_BYTES)).collect();
        let mut at = 0;
        while at < total {
            let n = piece.len().min(total - at);
            // SAFETY: `addr + at .. addr + at + n` lies inside our live allocation of
            // `self.bytes >= total` bytes.
            unsafe { queue.inner.copy_h2d(self.addr + at as u64, &piece[..n])? };
            at += n;
        }
        Ok(())
    }

    /// The buffer's bytes, after all queued work has finished.
    pub fn to_bytes(&self, queue: &Queue) -> Result<Vec<u8>> {
        self.check_queue(queue)?;
        let mut out = host_bytes(self.numel() as usize * self.dtype.size_of())?;
        if !out.is_empty() {
            // SAFETY: as in `write_bytes`.
            unsafe { queue.inner.copy_d2h(self.addr, &mut out)? };
        }
        Ok(out)
    }

    /// The elements as `T` (which must be the buffer's dtype).
    pub fn to_vec<T: Element>(&self, queue: &Queue) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::invalid(
                "Buffer",
                "T",
                format!("buffer holds {}, asked for {}", self.dtype, T::DTYPE),
            ));
        }
        let bytes = self.to_bytes(queue)?;
        let n = self.numel() as usize;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: `bytes` holds n elements of T; read_unaligned copes with alignment.
            out.push(unsafe { (bytes.as_ptr() as *const T).add(i).read_unaligned() });
        }
        Ok(out)
    }

    /// The elements converted to f64.
    pub fn to_f64(&self, queue: &Queue) -> Result<Vec<f64>> {
        queue.read_f64(&self.view())
    }

    /// A contiguous view of the whole buffer.
    pub fn view(&self) -> Tensor<'_> {
        // SAFETY: the allocation holds `numel` elements of `dtype` (shape validated in
        // `uninit`) and lives as long as `&self`.
        unsafe { Tensor::contiguous_unchecked(self.addr, self.dtype, self.device, &self.shape) }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }
    pub fn device(&self) -> Device {
        self.device
    }
    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }
    pub fn size_bytes(&self) -> usize {
        self.bytes
    }

    fn check_queue(&self, queue: &Queue) -> Result<()> {
        if queue.device != self.device {
            return Err(Error::invalid(
                "Buffer",
                "queue",
                format!("buffer is on {} but the queue is on {}", self.device, queue.device),
            ));
        }
        Ok(())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: `addr` came from `alloc(ordinal, bytes)` and every view of it borrowed
        // `self`, so none outlives this point.
        unsafe { self.backend.free(self.device.ordinal, self.addr, self.bytes) }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} {:?} on {})", self.dtype, self.shape, self.device)
    }
}

/// Bytes written per copy by [`Buffer::fill_pattern`] (a multiple of every element size).
const FILL_PIECE_BYTES: usize = 1 << 20;

/// `n` zero bytes on the host, or an error saying how many could not be allocated (a
/// plain `vec!` aborts the process instead).
pub fn host_bytes(n: usize) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|e| Error::backend("host", format!("cannot allocate {n} bytes of host memory: {e}")))?;
    v.resize(n, 0);
    Ok(v)
}

/// Encodes f64 values as little-endian bytes of `dtype` (round to nearest even).
pub fn encode_f64(dtype: DType, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size_of());
    for &v in values {
        match dtype {
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
            DType::F8E4M3 => out.push(f32_to_f8e4m3(v as f32)),
            // Raw row bytes (saturating cast); see `DType::Fp8DsMla`.
            DType::Fp8DsMla => out.push(v as u8),
        }
    }
    out
}

/// Encodes one f32 as OCP fp8 e4m3fn (saturating to +-448, round to nearest even; NaN
/// gives `0x7f`): [`crate::fp8_block::encode_e4m3`], which is tested against a search over
/// every code.
pub fn f32_to_f8e4m3(v: f32) -> u8 {
    crate::fp8_block::encode_e4m3(v)
}
