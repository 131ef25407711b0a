//! Raw bindings: the HIP runtime, hiprtc and rocBLAS functions this crate calls, resolved at
//! run time from the shared libraries. This is the one place that loads libraries and
//! turns symbols into function pointers; everything above it goes through `driver.rs`.
//!
//! Why a small table instead of `hip-sys`: hip-sys links `libamdhip64` at build time, so the
//! workspace would not build (or its binaries would not start) without ROCm. The table holds
//! only the ~30 functions used, with the C signatures of ROCm 5.x and 6.x (both keep them
//! unchanged; `hipGetDeviceProperties` keeps its pre-6.0 struct layout under its plain name,
//! see [`DevicePropR0000`]).
//!
//! Loaded libraries are never closed: the HIP runtime starts threads and registers exit
//! handlers, and unloading it under them is not safe. A process loads each at most a few
//! times (once per `register()`).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::PathBuf;

use libloading::Library;

pub type HipError = c_int;
pub type HipStream = *mut c_void;
pub type HipModule = *mut c_void;
pub type HipFunction = *mut c_void;
pub type HiprtcProgram = *mut c_void;
pub type HiprtcResult = c_int;
pub type RocblasHandle = *mut c_void;
pub type RocblasStatus = c_int;

pub const HIP_SUCCESS: HipError = 0;
pub const HIP_ERROR_NO_DEVICE: HipError = 100;
pub const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;
pub const HIPRTC_SUCCESS: HiprtcResult = 0;

pub const ROCBLAS_STATUS_SUCCESS: RocblasStatus = 0;
pub const ROCBLAS_OPERATION_NONE: c_int = 111;
pub const ROCBLAS_OPERATION_TRANSPOSE: c_int = 112;
pub const ROCBLAS_DATATYPE_F16_R: c_int = 150;
pub const ROCBLAS_DATATYPE_F32_R: c_int = 151;
pub const ROCBLAS_DATATYPE_BF16_R: c_int = 168;
pub const ROCBLAS_GEMM_ALGO_STANDARD: c_int = 0;

/// The leading part of `hipDeviceProp_t` as `hipGetDeviceProperties` fills it: ROCm 5.x's
/// struct, which ROCm 6.x keeps under that exported name (as `hipDeviceProp_tR0000`; its
/// headers map the name to `hipGetDevicePropertiesR0600` only for newly compiled code).
/// Only the fields up to `gcn_arch_name` are spelled out; `_rest` covers the remaining
/// ~140 bytes with room to spare, so the library never writes past this struct.
#[repr(C)]
pub struct DevicePropR0000 {
    pub name: [c_char; 256],
    pub total_global_mem: usize,
    pub shared_mem_per_block: usize,
    pub regs_per_block: c_int,
    pub warp_size: c_int,
    pub max_threads_per_block: c_int,
    pub max_threads_dim: [c_int; 3],
    pub max_grid_size: [c_int; 3],
    pub clock_rate: c_int,
    pub memory_clock_rate: c_int,
    pub memory_bus_width: c_int,
    pub total_const_mem: usize,
    pub major: c_int,
    pub minor: c_int,
    pub multi_processor_count: c_int,
    pub l2_cache_size: c_int,
    pub max_threads_per_multi_processor: c_int,
    pub compute_mode: c_int,
    pub clock_instruction_rate: c_int,
    pub arch: c_uint,
    pub concurrent_kernels: c_int,
    pub pci_domain_id: c_int,
    pub pci_bus_id: c_int,
    pub pci_device_id: c_int,
    pub max_shared_memory_per_multi_processor: usize,
    pub is_multi_gpu_board: c_int,
    pub can_map_host_memory: c_int,
    pub gcn_arch: c_int,
    pub gcn_arch_name: [c_char; 256],
    pub _rest: [u8; 3072],
}

// Offsets measured with gcc against ROCm 5.2's hip_runtime_api.h (offsetof); the R0000
// struct of ROCm 6.x has the same fields in the same order.
const _: () = assert!(std::mem::offset_of!(DevicePropR0000, warp_size) == 276);
const _: () = assert!(std::mem::offset_of!(DevicePropR0000, major) == 328);
const _: () = assert!(std::mem::offset_of!(DevicePropR0000, gcn_arch_name) == 396);

/// Declares a table of C functions and its loader, which resolves every entry by its own
/// name and names the first one missing.
macro_rules! fn_table {
    ($(#[$meta:meta])* pub struct $name:ident { $($f:ident: fn($($arg:ty),* $(,)?) -> $ret:ty;)* }) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        pub struct $name {
            $(pub $f: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl $name {
            /// # Safety
            /// `lib` must be the library these C signatures describe.
            unsafe fn resolve(lib: &'static Library) -> Result<$name, String> {
                Ok($name {
                    $($f: *unsafe {
                        lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                            concat!(stringify!($f), "\0").as_bytes(),
                        )
                    }
                    .map_err(|e| format!("symbol {} missing: {e}", stringify!($f)))?,)*
                })
            }
        }
    };
}

fn_table! {
    /// The HIP runtime (libamdhip64).
    pub struct HipApi {
        hipInit: fn(c_uint) -> HipError;
        hipGetDeviceCount: fn(*mut c_int) -> HipError;
        hipGetDeviceProperties: fn(*mut DevicePropR0000, c_int) -> HipError;
        hipRuntimeGetVersion: fn(*mut c_int) -> HipError;
        hipGetErrorString: fn(HipError) -> *const c_char;
        hipSetDevice: fn(c_int) -> HipError;
        hipMalloc: fn(*mut *mut c_void, usize) -> HipError;
        hipFree: fn(*mut c_void) -> HipError;
        hipMemcpyAsync: fn(*mut c_void, *const c_void, usize, c_int, HipStream) -> HipError;
        hipStreamCreate: fn(*mut HipStream) -> HipError;
        hipStreamDestroy: fn(HipStream) -> HipError;
        hipStreamSynchronize: fn(HipStream) -> HipError;
        hipModuleLoadData: fn(*mut HipModule, *const c_void) -> HipError;
        hipModuleUnload: fn(HipModule) -> HipError;
        hipModuleGetFunction: fn(*mut HipFunction, HipModule, *const c_char) -> HipError;
        hipModuleLaunchKernel: fn(
            HipFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, HipStream,
            *mut *mut c_void, *mut *mut c_void,
        ) -> HipError;
    }
}

fn_table! {
    /// hiprtc: inside libamdhip64 up to ROCm 5.x, its own libhiprtc from ROCm 6.0.
    pub struct HiprtcApi {
        hiprtcVersion: fn(*mut c_int, *mut c_int) -> HiprtcResult;
        hiprtcGetErrorString: fn(HiprtcResult) -> *const c_char;
        hiprtcCreateProgram: fn(
            *mut HiprtcProgram, *const c_char, *const c_char, c_int, *const *const c_char,
            *const *const c_char,
        ) -> HiprtcResult;
        hiprtcCompileProgram: fn(HiprtcProgram, c_int, *const *const c_char) -> HiprtcResult;
        hiprtcDestroyProgram: fn(*mut HiprtcProgram) -> HiprtcResult;
        hiprtcGetProgramLogSize: fn(HiprtcProgram, *mut usize) -> HiprtcResult;
        hiprtcGetProgramLog: fn(HiprtcProgram, *mut c_char) -> HiprtcResult;
        hiprtcGetCodeSize: fn(HiprtcProgram, *mut usize) -> HiprtcResult;
        hiprtcGetCode: fn(HiprtcProgram, *mut c_char) -> HiprtcResult;
    }
}

fn_table! {
    /// rocBLAS (its C API and enum values are the same from ROCm 5.0 to 6.x).
    pub struct RocblasApi {
        rocblas_create_handle: fn(*mut RocblasHandle) -> RocblasStatus;
        rocblas_destroy_handle: fn(RocblasHandle) -> RocblasStatus;
        rocblas_set_stream: fn(RocblasHandle, HipStream) -> RocblasStatus;
        rocblas_status_to_string: fn(RocblasStatus) -> *const c_char;
        rocblas_gemm_strided_batched_ex: fn(
            RocblasHandle, c_int, c_int, c_int, c_int, c_int, *const c_void,
            *const c_void, c_int, c_int, i64,
            *const c_void, c_int, c_int, i64,
            *const c_void,
            *const c_void, c_int, c_int, i64,
            *mut c_void, c_int, c_int, i64,
            c_int, c_int, c_int, i32, u32,
        ) -> RocblasStatus;
    }
}

/// Where to look for each library: names for the dynamic loader or absolute paths, tried
/// in order.
#[derive(Clone, Debug)]
pub struct Libraries {
    pub hip: Vec<String>,
    pub hiprtc: Vec<String>,
    pub rocblas: Vec<String>,
}

impl Default for Libraries {
    /// `$ROCM_PATH/lib` (when set), the loader's search path, then `/opt/rocm/lib`.
    fn default() -> Libraries {
        let roots: Vec<PathBuf> = ["ROCM_PATH", "HIP_PATH"]
            .iter()
            .filter_map(|v| std::env::var_os(v).map(|p| PathBuf::from(p).join("lib")))
            .collect();
        let names = |base: &str, versions: &[&str]| -> Vec<String> {
            let mut v: Vec<String> =
                roots.iter().map(|r| r.join(format!("{base}.so")).display().to_string()).collect();
            v.push(format!("{base}.so"));
            v.extend(versions.iter().map(|ver| format!("{base}.so.{ver}")));
            v.push(format!("/opt/rocm/lib/{base}.so"));
            v
        };
        Libraries {
            hip: names("libamdhip64", &["6", "5"]),
            hiprtc: names("libhiprtc", &["6", "7"]),
            rocblas: names("librocblas", &["4", "3", "0"]),
        }
    }
}

/// A library opened for good (see the module docs), with the name it was found under.
pub struct Opened {
    pub lib: &'static Library,
    pub name: String,
}

/// Opens the first of `candidates` that loads; the error lists what every attempt said.
pub fn open_first(candidates: &[String]) -> Result<Opened, String> {
    let mut tried = Vec::new();
    for name in candidates {
        // SAFETY: loading runs the library's initializers; the ROCm libraries' are
        // designed to run on load, with or without a GPU.
        match unsafe { Library::new(name.as_str()) } {
            Ok(lib) => return Ok(Opened { lib: Box::leak(Box::new(lib)), name: name.clone() }),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(tried.join("; "))
}

/// The HIP runtime's table, from the first of `candidates` that loads and has every symbol.
pub fn load_hip(candidates: &[String]) -> Result<(&'static HipApi, Opened), String> {
    let opened = open_first(candidates)?;
    // SAFETY: the library is libamdhip64, whose C API the table spells out.
    let api = unsafe { HipApi::resolve(opened.lib) }.map_err(|e| format!("{}: {e}", opened.name))?;
    Ok((Box::leak(Box::new(api)), opened))
}

/// hiprtc: first from the HIP library itself (ROCm <= 5.x, and always the matching
/// version), else from the first of `candidates`.
pub fn load_hiprtc(hip: &Opened, candidates: &[String]) -> Result<(&'static HiprtcApi, String), String> {
    // SAFETY: libamdhip64 of ROCm 5.x exports hiprtc with the table's signatures.
    if let Ok(api) = unsafe { HiprtcApi::resolve(hip.lib) } {
        return Ok((Box::leak(Box::new(api)), hip.name.clone()));
    }
    let opened = open_first(candidates)?;
    // SAFETY: the library is libhiprtc, whose C API the table spells out.
    let api = unsafe { HiprtcApi::resolve(opened.lib) }.map_err(|e| format!("{}: {e}", opened.name))?;
    Ok((Box::leak(Box::new(api)), opened.name))
}

/// rocBLAS's table, from the first of `candidates` that loads.
pub fn load_rocblas(candidates: &[String]) -> Result<(&'static RocblasApi, String), String> {
    let opened = open_first(candidates)?;
    // SAFETY: the library is librocblas, whose C API the table spells out.
    let api = unsafe { RocblasApi::resolve(opened.lib) }.map_err(|e| format!("{}: {e}", opened.name))?;
    Ok((Box::leak(Box::new(api)), opened.name))
}
