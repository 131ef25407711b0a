//! Device discovery, the [`Backend`] (memory) and the per-device state shared by queues:
//! the context, the architecture and the module/function cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream, DevicePtr};
use vt_core::{Backend, DType, DeviceType, Error, Probe, QueueImpl, Result};

use crate::kernels::{self, KernelSource};
use crate::nvrtc;
use crate::queue::CudaQueue;

pub(crate) const BACKEND: &str = "cuda";

/// Whether a shared library of cudarc's family `name` ("cuda", "nvrtc", "cublas") loads,
/// trying the same file names cudarc will. Checked before any cudarc call of that library,
/// because cudarc panics when the library is missing.
pub(crate) fn library_present(name: &str) -> bool {
    cudarc::get_lib_name_candidates(name).into_iter().any(|file| {
        // SAFETY: loading a CUDA library runs its initializers, which have no preconditions;
        // the handle is dropped (dlclose) at once and cudarc loads it again for itself.
        unsafe { libloading::Library::new(file) }.is_ok()
    })
}

/// Maps a driver error into the workspace error, naming what failed.
pub(crate) fn drv(what: &'static str) -> impl Fn(result::DriverError) -> Error {
    move |e| Error::backend(BACKEND, format!("{what}: {e}"))
}

/// Probes the driver. `Err` carries the [`Probe`] to report when nothing can be registered.
pub(crate) fn probe() -> Result<Arc<CudaBackend>, Probe> {
    if !library_present("cuda") {
        return Err(Probe::Unavailable { detail: "libcuda.so (the NVIDIA driver) not found".into() });
    }
    let fail = |e: result::DriverError| Probe::NoDevice { detail: format!("CUDA driver: {e}") };
    result::init().map_err(fail)?;
    let mut version = 0;
    // SAFETY: valid out-pointer; the driver library is present (checked above).
    unsafe { sys::cuDriverGetVersion(&mut version) }.result().map_err(fail)?;
    let count = CudaContext::device_count().map_err(fail)?;
    if count <= 0 {
        return Err(Probe::NoDevice {
            detail: format!("driver {} finds no CUDA device", fmt_version(version)),
        });
    }
    let mut devices = Vec::with_capacity(count as usize);
    for ordinal in 0..count as usize {
        devices.push(Arc::new(
            DeviceState::new(ordinal).map_err(|e| Probe::NoDevice { detail: e.to_string() })?,
        ));
    }
    Ok(Arc::new(CudaBackend { devices, driver_version: version }))
}

fn fmt_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// One device: its context and what has been compiled and loaded for it.
pub(crate) struct DeviceState {
    pub ctx: Arc<CudaContext>,
    pub name: String,
    /// Compute capability as XY (90 for sm_90).
    pub sm: u32,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<(&'static str, &'static str, DType), CudaFunction>>,
}

impl DeviceState {
    fn new(ordinal: usize) -> Result<DeviceState> {
        let ctx = CudaContext::new(ordinal).map_err(drv("creating a context"))?;
        // We hand raw device addresses around, never cudarc's CudaSlice, so its per-slice
        // event tracking would only add work.
        // SAFETY: no CudaSlice of this context exists yet.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().map_err(drv("compute capability"))?;
        let name = ctx.name().map_err(drv("device name"))?;
        Ok(DeviceState {
            ctx,
            name,
            sm: (major * 10 + minor) as u32,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The kernel `{base}_{dtype}` (e.g. `rms_norm_bf16`) of `src`, compiled and loaded on
    /// first use (NVRTC or the disk cache), then served from memory.
    pub fn function(&self, src: &KernelSource, base: &'static str, dtype: DType) -> Result<CudaFunction> {
        let key = (src.name, base, dtype);
        if let Some(f) = lock(&self.functions)?.get(&key) {
            return Ok(f.clone());
        }
        let module = self.module(src)?;
        let symbol = format!("{base}_{}", dtype.name());
        let f = module.load_function(&symbol).map_err(|e| {
            Error::backend(BACKEND, format!("kernel {symbol} not found in {}.cu: {e}", src.name))
        })?;
        lock(&self.functions)?.insert(key, f.clone());
        Ok(f)
    }

    /// The device address and size in bytes of the module global `name` of `src` (the module
    /// compiled and loaded on first use); `None` when the module has no such symbol (a lab
    /// build's table in the default build).
    pub fn global(
        &self,
        src: &KernelSource,
        name: &str,
        stream: &Arc<CudaStream>,
    ) -> Result<Option<(u64, usize)>> {
        let module = self.module(src)?;
        match module.get_global(name, stream) {
            Ok(view) => {
                let len = view.len();
                let (ptr, _sync) = view.device_ptr(stream);
                Ok(Some((ptr, len)))
            }
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_FOUND => Ok(None),
            Err(e) => Err(Error::backend(BACKEND, format!("module global {name} of {}.cu: {e}", src.name))),
        }
    }

    fn module(&self, src: &KernelSource) -> Result<Arc<CudaModule>> {
        // Held across the compile so two threads never compile the same file twice.
        let mut modules = lock(&self.modules)?;
        if let Some(m) = modules.get(src.name) {
            return Ok(m.clone());
        }
        let target = nvrtc::target_for(self.sm)?;
        let image = kernels::compile_module(src, target)?;
        let module = match target {
            nvrtc::Target::Cubin(_) => self.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(image.bytes)),
            nvrtc::Target::Ptx(_) | nvrtc::Target::PtxArchSpecific(_) => {
                let text = String::from_utf8_lossy(&image.bytes).trim_end_matches('\0').to_string();
                self.ctx.load_module(cudarc::nvrtc::Ptx::from_src(text))
            }
        }
        .map_err(|e| Error::backend(BACKEND, format!("loading {}.cu for sm_{}: {e}", src.name, self.sm)))?;
        tracing::debug!(kernel = src.name, cached = image.cached, "module loaded");
        modules.insert(src.name, module.clone());
        Ok(module)
    }
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    m.lock().map_err(|_| Error::backend(BACKEND, "a kernel cache lock was poisoned by a panic"))
}

/// The CUDA [`Backend`]: device memory and queues (streams).
pub struct CudaBackend {
    pub(crate) devices: Vec<Arc<DeviceState>>,
    driver_version: i32,
}

impl CudaBackend {
    pub(crate) fn device(&self, ordinal: usize) -> Result<&Arc<DeviceState>> {
        self.devices.get(ordinal).ok_or_else(|| Error::NoDevice {
            device: format!("cuda:{ordinal}"),
            msg: format!("{} CUDA device(s)", self.devices.len()),
        })
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> DeviceType {
        DeviceType::Cuda
    }

    fn description(&self) -> String {
        let nvrtc = match nvrtc::available().then(nvrtc::version) {
            Some(Ok((a, b))) => format!("nvrtc {a}.{b}"),
            _ => "no nvrtc".to_string(),
        };
        let blas = if library_present("cublas") { "cublas" } else { "no cublas" };
        format!("cuda: driver {}, {nvrtc}, {blas}", fmt_version(self.driver_version))
    }

    fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn device_name(&self, ordinal: usize) -> String {
        match self.devices.get(ordinal) {
            Some(d) => format!("{} (sm_{})", d.name, d.sm),
            None => format!("no CUDA device {ordinal}"),
        }
    }

    fn new_queue(&self, ordinal: usize) -> Result<Arc<dyn QueueImpl>> {
        Ok(Arc::new(CudaQueue::new(self.device(ordinal)?.clone())?))
    }

    fn alloc(&self, ordinal: usize, bytes: usize) -> Result<u64> {
        let dev = self.device(ordinal)?;
        dev.ctx.bind_to_thread().map_err(drv("binding the context"))?;
        // SAFETY: the context is current on this thread; cuMemAlloc returns memory aligned
        // to at least 256 bytes, as Backend::alloc promises.
        unsafe { result::malloc_sync(bytes.max(1)) }
            .map_err(|e| Error::backend(BACKEND, format!("allocating {bytes} bytes on cuda:{ordinal}: {e}")))
    }

    unsafe fn free(&self, ordinal: usize, addr: u64, _bytes: usize) {
        let Ok(dev) = self.device(ordinal) else { return };
        if dev.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: the caller guarantees `addr` came from `alloc` on this device and is not
        // used again. cuMemFree synchronizes the device before releasing the memory,
        // so no queued kernel still reads it.
        if let Err(e) = unsafe { result::free_sync(addr) } {
            tracing::warn!("cuMemFree on cuda:{ordinal} failed: {e}");
        }
    }
}
