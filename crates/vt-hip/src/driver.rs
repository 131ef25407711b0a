//! Thin `Result` wrappers over the raw tables of `sys.rs`, and the small owning types the
//! rest of the crate uses (streams, modules, rocBLAS handles). Every `unsafe` call into HIP
//! outside `sys.rs` is here.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use vt_core::{Error, Result};

use crate::sys::{self, HipApi, HipError, HiprtcApi, RocblasApi};

pub(crate) const BACKEND: &str = "hip";

pub(crate) fn err(msg: impl Into<String>) -> Error {
    Error::backend(BACKEND, msg)
}

/// Reads a C string the library owns (error names); `"?"` for null.
fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        return "?".into();
    }
    // SAFETY: the HIP/rocBLAS/hiprtc error-string functions return pointers to static,
    // NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The loaded HIP runtime (and, when found, hiprtc and rocBLAS). Copyable handle to tables
/// that live for the rest of the process.
#[derive(Clone, Copy)]
pub struct Runtime {
    pub(crate) hip: &'static HipApi,
    pub(crate) rtc: Option<&'static HiprtcApi>,
    pub(crate) blas: Option<&'static RocblasApi>,
}

/// What `hipGetDeviceProperties` says about one device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    /// Marketing name (`"AMD Instinct MI300X"`).
    pub name: String,
    /// Full target id (`"gfx942:sramecc+:xnack-"`): what hiprtc compiles for.
    pub arch: String,
    /// 64 on CDNA (gfx9), 32 on RDNA in wave32 mode. Kernels read `warpSize` themselves;
    /// this is for logs and `vt-mla info`.
    pub warp_size: i32,
    pub compute_units: i32,
    pub shared_mem_per_block: usize,
}

impl Runtime {
    pub(crate) fn check(&self, code: HipError, what: &str) -> Result<()> {
        if code == sys::HIP_SUCCESS {
            return Ok(());
        }
        Err(err(format!("{what}: {} ({code})", self.error_name(code))))
    }

    pub(crate) fn error_name(&self, code: HipError) -> String {
        // SAFETY: hipGetErrorString takes any value and returns a static string.
        c_str(unsafe { (self.hip.hipGetErrorString)(code) })
    }

    /// `hipInit(0)`: its error code is returned as is (no device is an expected outcome).
    pub(crate) fn init(&self) -> HipError {
        // SAFETY: plain call, flags must be 0.
        unsafe { (self.hip.hipInit)(0) }
    }

    pub(crate) fn device_count(&self) -> Result<usize> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        self.check(unsafe { (self.hip.hipGetDeviceCount)(&mut n) }, "hipGetDeviceCount")?;
        Ok(n.max(0) as usize)
    }

    /// The runtime version as `major.minor.patch` (HIP encodes it as M*10^7 + m*10^5 + p).
    pub(crate) fn version(&self) -> Result<String> {
        let mut v: c_int = 0;
        // SAFETY: valid out-pointer.
        self.check(unsafe { (self.hip.hipRuntimeGetVersion)(&mut v) }, "hipRuntimeGetVersion")?;
        Ok(format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000))
    }

    pub(crate) fn set_device(&self, ordinal: usize) -> Result<()> {
        // SAFETY: plain call; HIP checks the ordinal.
        self.check(unsafe { (self.hip.hipSetDevice)(ordinal as c_int) }, "hipSetDevice")
    }

    pub(crate) fn device_info(&self, ordinal: usize) -> Result<DeviceInfo> {
        // SAFETY: all-zero bytes are a valid value of this plain C struct.
        let mut p: Box<sys::DevicePropR0000> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `p` is at least as large as the struct the library fills (see sys.rs).
        self.check(
            unsafe { (self.hip.hipGetDeviceProperties)(&mut *p, ordinal as c_int) },
            "hipGetDeviceProperties",
        )?;
        let text = |chars: &[c_char]| -> String {
            let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let arch = text(&p.gcn_arch_name);
        if !arch.starts_with("gfx") {
            return Err(err(format!(
                "device {ordinal}: hipGetDeviceProperties gave target {arch:?}, not a gfx target \
                 (an unexpected hipDeviceProp_t layout?)"
            )));
        }
        Ok(DeviceInfo {
            ordinal,
            name: text(&p.name),
            arch,
            warp_size: p.warp_size,
            compute_units: p.multi_processor_count,
            shared_mem_per_block: p.shared_mem_per_block,
        })
    }

    pub(crate) fn malloc(&self, ordinal: usize, bytes: usize) -> Result<u64> {
        self.set_device(ordinal)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; HIP allocations are at least 256-byte aligned.
        self.check(unsafe { (self.hip.hipMalloc)(&mut p, bytes.max(1)) }, "hipMalloc")?;
        Ok(p as u64)
    }

    /// # Safety
    /// `addr` must come from [`Runtime::malloc`] and not be used afterwards.
    pub(crate) unsafe fn free(&self, ordinal: usize, addr: u64) {
        if self.set_device(ordinal).is_err() {
            return;
        }
        // SAFETY: per the caller's contract.
        let code = unsafe { (self.hip.hipFree)(addr as *mut c_void) };
        if code != sys::HIP_SUCCESS {
            tracing::warn!("hipFree failed: {}", self.error_name(code));
        }
    }
}

/// An owned HIP stream on one device. Destroyed on drop.
pub struct Stream {
    rt: Runtime,
    pub(crate) raw: sys::HipStream,
    pub(crate) ordinal: usize,
}

// SAFETY: a hipStream_t may be used from any thread; HIP serializes work on it.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    pub(crate) fn new(rt: Runtime, ordinal: usize) -> Result<Stream> {
        rt.set_device(ordinal)?;
        let mut raw: sys::HipStream = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        rt.check(unsafe { (rt.hip.hipStreamCreate)(&mut raw) }, "hipStreamCreate")?;
        Ok(Stream { rt, raw, ordinal })
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: `raw` is a live stream.
        self.rt.check(unsafe { (self.rt.hip.hipStreamSynchronize)(self.raw) }, "hipStreamSynchronize")
    }

    /// Copies host bytes to `dst` and waits for the copy (the source may be pageable).
    ///
    /// # Safety
    /// `dst..dst + src.len()` must lie in a live allocation on this stream's device.
    pub(crate) unsafe fn copy_h2d(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.rt.set_device(self.ordinal)?;
        // SAFETY: per the caller's contract; `src` is readable for its length.
        let code = unsafe {
            (self.rt.hip.hipMemcpyAsync)(
                dst as *mut c_void,
                src.as_ptr() as *const c_void,
                src.len(),
                sys::HIP_MEMCPY_HOST_TO_DEVICE,
                self.raw,
            )
        };
        self.rt.check(code, "hipMemcpyAsync (host to device)")?;
        self.synchronize()
    }

    /// Copies `dst.len()` bytes from `src` after the stream's earlier work.
    ///
    /// # Safety
    /// `src..src + dst.len()` must lie in a live allocation on this stream's device.
    pub(crate) unsafe fn copy_d2h(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.rt.set_device(self.ordinal)?;
        // SAFETY: per the caller's contract; `dst` is writable for its length and we wait
        // for the copy before returning.
        let code = unsafe {
            (self.rt.hip.hipMemcpyAsync)(
                dst.as_mut_ptr() as *mut c_void,
                src as *const c_void,
                dst.len(),
                sys::HIP_MEMCPY_DEVICE_TO_HOST,
                self.raw,
            )
        };
        self.rt.check(code, "hipMemcpyAsync (device to host)")?;
        self.synchronize()
    }

    /// Launches `f` with packed arguments (see [`crate::launch::KernelArgs`]).
    ///
    /// # Safety
    /// `params` must point to one value of the kernel's exact parameter type per parameter,
    /// and every address among them must be valid for what the kernel does with it.
    pub(crate) unsafe fn launch(
        &self,
        f: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.rt.set_device(self.ordinal)?;
        // SAFETY: per the caller's contract; `f` belongs to a module loaded on this device.
        let code = unsafe {
            (self.rt.hip.hipModuleLaunchKernel)(
                f.0,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                self.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.rt.check(code, "hipModuleLaunchKernel")
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: `raw` was created by hipStreamCreate and is destroyed once.
        let code = unsafe { (self.rt.hip.hipStreamDestroy)(self.raw) };
        if code != sys::HIP_SUCCESS {
            tracing::warn!("hipStreamDestroy failed: {}", self.rt.error_name(code));
        }
    }
}

/// A code object loaded on one device. Unloaded on drop.
pub struct Module {
    rt: Runtime,
    raw: sys::HipModule,
}

// SAFETY: a hipModule_t is a process-wide handle usable from any thread.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

/// A kernel of a live [`Module`] (the module is kept for the backend's lifetime).
#[derive(Clone, Copy, Debug)]
pub struct Function(sys::HipFunction);

// SAFETY: as for Module.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

impl Module {
    pub(crate) fn load(rt: Runtime, ordinal: usize, code: &[u8]) -> Result<Module> {
        rt.set_device(ordinal)?;
        let mut raw: sys::HipModule = std::ptr::null_mut();
        // SAFETY: `code` is a complete code object produced by hiprtc (or read back from the
        // cache, where it was written whole); HIP copies what it needs.
        rt.check(
            unsafe { (rt.hip.hipModuleLoadData)(&mut raw, code.as_ptr() as *const c_void) },
            "hipModuleLoadData",
        )?;
        Ok(Module { rt, raw })
    }

    pub(crate) fn function(&self, name: &str) -> Result<Function> {
        let c = CString::new(name).map_err(|_| err(format!("kernel name {name:?} holds a NUL byte")))?;
        let mut f: sys::HipFunction = std::ptr::null_mut();
        // SAFETY: live module, NUL-terminated name, valid out-pointer.
        self.rt.check(
            unsafe { (self.rt.hip.hipModuleGetFunction)(&mut f, self.raw, c.as_ptr()) },
            &format!("hipModuleGetFunction({name})"),
        )?;
        Ok(Function(f))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: `raw` was loaded by hipModuleLoadData and is unloaded once.
        unsafe { (self.rt.hip.hipModuleUnload)(self.raw) };
    }
}

/// A rocBLAS handle bound to one stream. Destroyed on drop.
pub struct BlasHandle {
    api: &'static RocblasApi,
    raw: sys::RocblasHandle,
}

// SAFETY: a rocBLAS handle may move between threads; the owning queue serializes its use.
unsafe impl Send for BlasHandle {}

impl BlasHandle {
    pub(crate) fn new(rt: Runtime, stream: &Stream) -> Result<BlasHandle> {
        let api = rt.blas.ok_or_else(|| err("rocBLAS is not loaded"))?;
        rt.set_device(stream.ordinal)?;
        let mut raw: sys::RocblasHandle = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the handle belongs to the current device.
        blas_check(api, unsafe { (api.rocblas_create_handle)(&mut raw) }, "rocblas_create_handle")?;
        let h = BlasHandle { api, raw };
        // SAFETY: live handle and stream of the same device.
        blas_check(api, unsafe { (api.rocblas_set_stream)(h.raw, stream.raw) }, "rocblas_set_stream")?;
        Ok(h)
    }

    /// Runs one rocBLAS strided batched GEMM described by `g` (column-major, f32 compute).
    ///
    /// # Safety
    /// Every matrix `g` describes must lie in live device allocations of the handle's device.
    pub(crate) unsafe fn gemm(&self, g: &crate::gemm::RocblasGemm) -> Result<()> {
        let alpha: f32 = 1.0;
        let beta: f32 = 0.0;
        let dt = g.dtype;
        // SAFETY: per the caller's contract; alpha/beta are host f32 (pointer mode host,
        // compute type f32); C and D are the same matrix, as rocBLAS allows.
        let status = unsafe {
            (self.api.rocblas_gemm_strided_batched_ex)(
                self.raw,
                g.trans_a,
                g.trans_b,
                g.m,
                g.n,
                g.k,
                &alpha as *const f32 as *const c_void,
                g.a as *const c_void,
                dt,
                g.lda,
                g.stride_a,
                g.b as *const c_void,
                dt,
                g.ldb,
                g.stride_b,
                &beta as *const f32 as *const c_void,
                g.c as *const c_void,
                dt,
                g.ldc,
                g.stride_c,
                g.c as *mut c_void,
                dt,
                g.ldc,
                g.stride_c,
                g.batch,
                sys::ROCBLAS_DATATYPE_F32_R,
                sys::ROCBLAS_GEMM_ALGO_STANDARD,
                0,
                0,
            )
        };
        blas_check(self.api, status, "rocblas_gemm_strided_batched_ex")
    }
}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        // SAFETY: created by rocblas_create_handle, destroyed once.
        unsafe { (self.api.rocblas_destroy_handle)(self.raw) };
    }
}

fn blas_check(api: &RocblasApi, status: sys::RocblasStatus, what: &str) -> Result<()> {
    if status == sys::ROCBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: returns a static string for any status.
    let name = c_str(unsafe { (api.rocblas_status_to_string)(status) });
    Err(err(format!("{what}: {name} ({status})")))
}

/// hiprtc's `(major, minor)`.
pub(crate) fn hiprtc_version(api: &HiprtcApi) -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0 as c_int, 0 as c_int);
    // SAFETY: two valid out-pointers.
    rtc_check(api, unsafe { (api.hiprtcVersion)(&mut major, &mut minor) }, "hiprtcVersion")?;
    Ok((major, minor))
}

fn rtc_check(api: &HiprtcApi, r: sys::HiprtcResult, what: &str) -> Result<()> {
    if r == sys::HIPRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: returns a static string for any value.
    let name = c_str(unsafe { (api.hiprtcGetErrorString)(r) });
    Err(err(format!("hiprtc {what}: {name} ({r})")))
}

/// Owns a hiprtc program and destroys it on every path out.
struct Program<'a> {
    api: &'a HiprtcApi,
    raw: sys::HiprtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: created by hiprtcCreateProgram, destroyed once.
        unsafe { (self.api.hiprtcDestroyProgram)(&mut self.raw) };
    }
}

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| err(format!("hiprtc {what} holds a NUL byte")))
}

/// Compiles one source with hiprtc; `headers` are `(include name, text)` pairs served from
/// memory. Returns the code object, or an error carrying hiprtc's log.
pub(crate) fn hiprtc_compile(
    api: &HiprtcApi,
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    options: &[String],
) -> Result<Vec<u8>> {
    let c_src = cstring(source, "source")?;
    let c_name = cstring(name, "file name")?;
    let h_texts = headers.iter().map(|(_, t)| cstring(t, "header")).collect::<Result<Vec<_>>>()?;
    let h_names = headers.iter().map(|(n, _)| cstring(n, "header name")).collect::<Result<Vec<_>>>()?;
    let h_text_ptrs: Vec<*const c_char> = h_texts.iter().map(|c| c.as_ptr()).collect();
    let h_name_ptrs: Vec<*const c_char> = h_names.iter().map(|c| c.as_ptr()).collect();
    let c_opts = options.iter().map(|o| cstring(o, "option")).collect::<Result<Vec<_>>>()?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|c| c.as_ptr()).collect();

    let mut raw: sys::HiprtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is a NUL-terminated string alive for the call; both header
    // arrays hold `headers.len()` entries.
    rtc_check(
        api,
        unsafe {
            (api.hiprtcCreateProgram)(
                &mut raw,
                c_src.as_ptr(),
                c_name.as_ptr(),
                headers.len() as c_int,
                h_text_ptrs.as_ptr(),
                h_name_ptrs.as_ptr(),
            )
        },
        "create program",
    )?;
    let prog = Program { api, raw };
    // SAFETY: live program; `opt_ptrs` holds valid C strings.
    let status = unsafe { (api.hiprtcCompileProgram)(prog.raw, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    let log = program_log(&prog);
    if status != sys::HIPRTC_SUCCESS {
        // SAFETY: static string for any value.
        let what = c_str(unsafe { (api.hiprtcGetErrorString)(status) });
        return Err(err(format!("hiprtc failed to compile {name} ({what}), options {options:?}:\n{log}")));
    }
    if !log.trim().is_empty() {
        tracing::debug!(kernel = name, "hiprtc log:\n{log}");
    }
    let mut size = 0usize;
    // SAFETY: compiled program; valid out-pointer.
    rtc_check(api, unsafe { (api.hiprtcGetCodeSize)(prog.raw, &mut size) }, "code size")?;
    let mut code = vec![0u8; size];
    // SAFETY: `code` holds exactly the reported size.
    rtc_check(api, unsafe { (api.hiprtcGetCode)(prog.raw, code.as_mut_ptr() as *mut c_char) }, "code")?;
    if code.is_empty() {
        return Err(err(format!("hiprtc produced no code for {name}")));
    }
    Ok(code)
}

fn program_log(prog: &Program<'_>) -> String {
    let mut size = 0usize;
    // SAFETY: live program, valid out-pointer.
    if unsafe { (prog.api.hiprtcGetProgramLogSize)(prog.raw, &mut size) } != sys::HIPRTC_SUCCESS {
        return "(no log)".into();
    }
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: `buf` holds at least `size` bytes.
    if unsafe { (prog.api.hiprtcGetProgramLog)(prog.raw, buf.as_mut_ptr() as *mut c_char) }
        != sys::HIPRTC_SUCCESS
    {
        return "(no log)".into();
    }
    String::from_utf8_lossy(&buf).trim_end_matches('\0').to_string()
}
