//! The safe layer: [`HipBackend`] (devices, memory, queues) and [`HipQueue`] (a stream, a
//! lazily created rocBLAS handle, and the launcher that compiles and loads kernel files on
//! first use).

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use vt_core::{Backend, DeviceType, Error, OpId, Queue, QueueImpl, Result};

use crate::compile;
use crate::driver::{err, BlasHandle, DeviceInfo, Function, Module, Runtime, Stream};
use crate::launch::{Launch, Step};

/// State shared by the backend and its queues.
pub(crate) struct Shared {
    pub rt: Runtime,
    pub devices: Vec<DeviceInfo>,
    pub description: String,
    /// Loaded code objects per (device, kernel file), with their looked-up kernels.
    modules: Mutex<HashMap<(usize, &'static str), Arc<Loaded>>>,
}

struct Loaded {
    module: Module,
    functions: Mutex<HashMap<String, Function>>,
}

impl Shared {
    pub fn new(rt: Runtime, devices: Vec<DeviceInfo>, description: String) -> Shared {
        Shared { rt, devices, description, modules: Mutex::new(HashMap::new()) }
    }

    /// The kernel `name` of `file` on device `ordinal`: compiled (or read from the disk
    /// cache) and loaded on first use.
    fn function(&self, ordinal: usize, file: &'static str, name: &str) -> Result<Function> {
        let loaded = {
            let mut modules = self.modules.lock().map_err(|_| err("kernel cache lock poisoned"))?;
            match modules.get(&(ordinal, file)) {
                Some(l) => l.clone(),
                None => {
                    let rtc = self.rt.rtc.ok_or_else(|| {
                        err(format!("cannot compile {file}: hiprtc was not found with the HIP runtime"))
                    })?;
                    let dev = self.devices.get(ordinal).ok_or_else(|| err(format!("no device {ordinal}")))?;
                    let code = compile::compile(rtc, file, &dev.arch)?;
                    let module = Module::load(self.rt, ordinal, &code.bytes)?;
                    let l = Arc::new(Loaded { module, functions: Mutex::new(HashMap::new()) });
                    modules.insert((ordinal, file), l.clone());
                    l
                }
            }
        };
        let mut fns = loaded.functions.lock().map_err(|_| err("kernel cache lock poisoned"))?;
        if let Some(f) = fns.get(name) {
            return Ok(*f);
        }
        let f = loaded.module.function(name)?;
        fns.insert(name.to_string(), f);
        Ok(f)
    }
}

/// The HIP backend: every AMD device the runtime reports.
pub struct HipBackend {
    pub(crate) shared: Arc<Shared>,
}

impl Backend for HipBackend {
    fn kind(&self) -> DeviceType {
        DeviceType::Hip
    }

    fn description(&self) -> String {
        self.shared.description.clone()
    }

    fn device_count(&self) -> usize {
        self.shared.devices.len()
    }

    fn device_name(&self, ordinal: usize) -> String {
        match self.shared.devices.get(ordinal) {
            Some(d) => format!("{} ({}, wave{})", d.name, d.arch, d.warp_size),
            None => format!("no HIP device {ordinal}"),
        }
    }

    fn new_queue(&self, ordinal: usize) -> Result<Arc<dyn QueueImpl>> {
        let stream = Stream::new(self.shared.rt, ordinal)?;
        Ok(Arc::new(HipQueue {
            blas: Mutex::new(None),
            scratch: Mutex::new(None),
            stream,
            shared: self.shared.clone(),
        }))
    }

    fn alloc(&self, ordinal: usize, bytes: usize) -> Result<u64> {
        self.shared.rt.malloc(ordinal, bytes)
    }

    unsafe fn free(&self, ordinal: usize, addr: u64, _bytes: usize) {
        // SAFETY: forwarded contract of `Backend::free`.
        unsafe { self.shared.rt.free(ordinal, addr) }
    }
}

/// A HIP stream with its rocBLAS handle (created on the first GEMM) and its scratch
/// memory (created on the first op that needs a workspace).
pub struct HipQueue {
    // Declared before `stream` so the handle is destroyed before its stream.
    blas: Mutex<Option<BlasHandle>>,
    scratch: Mutex<Option<Scratch>>,
    stream: Stream,
    shared: Arc<Shared>,
}

/// Device memory a queue keeps for ops' workspaces (IndexerTopK's scores), grown on demand.
struct Scratch {
    addr: u64,
    bytes: usize,
}

impl HipQueue {
    /// The HIP queue behind a vt-core queue (errors if it is another backend's).
    pub(crate) fn of(op: OpId, q: &Queue) -> Result<&HipQueue> {
        q.downcast::<HipQueue>().ok_or_else(|| Error::op_failed(op, "hip", "the queue is not a HIP queue"))
    }

    /// Runs `f` with the address of at least `bytes` bytes of this queue's scratch memory,
    /// held for the call (another thread's op on this queue waits). The memory is kept for
    /// later calls and grown when a call needs more: the old allocation is freed only after
    /// the stream has finished the work queued on it, which may still read it.
    pub(crate) fn with_scratch<R>(
        &self,
        op: OpId,
        bytes: usize,
        f: impl FnOnce(u64) -> Result<R>,
    ) -> Result<R> {
        let mut scratch =
            self.scratch.lock().map_err(|_| Error::op_failed(op, "hip", "scratch lock poisoned"))?;
        if scratch.as_ref().is_none_or(|s| s.bytes < bytes) {
            if let Some(old) = scratch.as_ref() {
                self.stream.synchronize()?;
                // SAFETY: `old.addr` came from `malloc` on this device; the stream, the only
                // user of this queue's scratch, has finished every launch that read it.
                unsafe { self.shared.rt.free(self.stream.ordinal, old.addr) };
                *scratch = None;
            }
            let addr = self.shared.rt.malloc(self.stream.ordinal, bytes)?;
            *scratch = Some(Scratch { addr, bytes });
        }
        let addr = scratch.as_ref().map(|s| s.addr).ok_or_else(|| err("scratch missing"))?;
        f(addr)
    }

    /// Whether GEMMs can go to rocBLAS.
    pub(crate) fn has_blas(&self) -> bool {
        self.shared.rt.blas.is_some()
    }

    /// Runs planned steps in order on this stream.
    ///
    /// The plans come from the ops' `plan` functions, which take every address from views
    /// that vt-core validated (inside live allocations of this device, outputs disjoint
    /// from inputs) and pass sizes and strides that keep every kernel access inside them.
    pub(crate) fn run(&self, steps: &[Step]) -> Result<()> {
        for step in steps {
            match step {
                Step::Kernel(l) => self.launch(l)?,
                Step::Gemm(g) => {
                    let mut blas = self.blas.lock().map_err(|_| err("rocBLAS handle lock poisoned"))?;
                    if blas.is_none() {
                        *blas = Some(BlasHandle::new(self.shared.rt, &self.stream)?);
                    }
                    if let Some(h) = blas.as_ref() {
                        // SAFETY: the GEMM's matrices lie in validated views (see above).
                        unsafe { h.gemm(g)? };
                    }
                }
            }
        }
        Ok(())
    }

    fn launch(&self, l: &Launch) -> Result<()> {
        let f = self.shared.function(self.stream.ordinal, l.file, &l.kernel)?;
        let mut slots = l.args.slots();
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        // SAFETY: `params` holds one pointer per kernel parameter, each to an 8-byte slot
        // whose low bytes are the value in the parameter's C type (the argument lists are
        // checked against the compiled kernels' metadata by `selfcheck`); the addresses come
        // from validated views (see `run`). `slots` outlives the call.
        unsafe { self.stream.launch(f, [l.grid, 1, 1], [l.block, 1, 1], l.shared_bytes, &mut params) }
    }
}

impl Drop for HipQueue {
    fn drop(&mut self) {
        let scratch = self.scratch.get_mut().map(Option::take).unwrap_or_else(|p| p.into_inner().take());
        if let Some(s) = scratch {
            if let Err(e) = self.stream.synchronize() {
                tracing::warn!("HIP queue scratch: stream synchronize failed before free: {e}");
            }
            // SAFETY: `s.addr` came from `malloc` on this device; the stream has finished
            // (or failed) the work queued on it, and the queue is going away.
            unsafe { self.shared.rt.free(self.stream.ordinal, s.addr) };
        }
    }
}

impl QueueImpl for HipQueue {
    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()
    }

    unsafe fn copy_h2d(&self, dst: u64, src: &[u8]) -> Result<()> {
        // SAFETY: forwarded contract of `QueueImpl::copy_h2d`.
        unsafe { self.stream.copy_h2d(dst, src) }
    }

    unsafe fn copy_d2h(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        // SAFETY: forwarded contract of `QueueImpl::copy_d2h`.
        unsafe { self.stream.copy_d2h(src, dst) }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
