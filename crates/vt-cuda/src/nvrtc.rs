//! Run-time compilation of `kernels-cuda/*.cu` with NVRTC, and the on-disk cache of what
//! it produced.
//!
//! - Include paths: `VT_CUDA_INCLUDE` (a `:`-separated list), else the first of
//!   `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda` whose `include/cuda_bf16.h` exists, with
//!   its `include/cccl` when present (CUDA 13 keeps `cuda/std/...` there). NVRTC itself
//!   finds no headers.
//! - Headers of this crate (`common.cuh`, ...) are handed to NVRTC in memory, so a kernel
//!   file compiles the same here, in `cargo xtask kernels` and on a GPU machine.
//! - The cache key is a SHA-256 of the source, every in-memory header, the options and the
//!   NVRTC version, plus the target; files live in `$VT_CACHE_DIR/cuda`, else
//!   `$XDG_CACHE_HOME/vt/cuda`, else `~/.cache/vt/cuda`. A second start compiles nothing.
//!   A cache that cannot be written is logged and skipped.
//! - A failed compile is an error that carries NVRTC's log.

use std::ffi::{c_char, c_int, CString};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys;
use vt_core::{Error, Result};

const BACKEND: &str = "cuda";

/// What NVRTC should produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Machine code for `sm_XY` (XY = major * 10 + minor): loads with no JIT.
    Cubin(u32),
    /// PTX for `compute_XY`: the driver compiles it for a newer device at load time.
    Ptx(u32),
    /// PTX for the arch-specific `compute_XYa` (sm_90a's wgmma and TMA kernels included):
    /// what the GPU-free check of the kernels' parameter lists reads; never loaded.
    PtxArchSpecific(u32),
}

/// The real architecture a cubin is built for: Hopper gets its arch-specific target
/// (sm_90a) so kernels may use wgmma (MlaDecodeAttention); such code runs on sm_90 devices
/// only, the only ones a `Cubin(90)` is loaded on.
fn cubin_arch(sm: u32) -> String {
    if sm == 90 {
        "sm_90a".to_string()
    } else {
        format!("sm_{sm}")
    }
}

impl Target {
    fn arch_option(self) -> String {
        match self {
            Target::Cubin(sm) => format!("--gpu-architecture={}", cubin_arch(sm)),
            Target::Ptx(sm) => format!("--gpu-architecture=compute_{sm}"),
            Target::PtxArchSpecific(sm) => format!("--gpu-architecture=compute_{sm}a"),
        }
    }

    fn tag(self) -> String {
        match self {
            Target::Cubin(sm) => format!("{}.cubin", cubin_arch(sm)),
            Target::Ptx(sm) => format!("compute_{sm}.ptx"),
            Target::PtxArchSpecific(sm) => format!("compute_{sm}a.ptx"),
        }
    }
}

/// Compiled code: a cubin, or NUL-terminated PTX text.
pub struct Image {
    pub bytes: Vec<u8>,
    pub target: Target,
    /// Whether the bytes came from the disk cache.
    pub cached: bool,
}

/// Whether libnvrtc can be loaded. Must be true before any other function here is called:
/// cudarc panics on a missing library.
pub fn available() -> bool {
    crate::device::library_present("nvrtc")
}

fn err(msg: impl Into<String>) -> Error {
    Error::backend(BACKEND, msg)
}

fn check(r: sys::nvrtcResult, what: &str) -> Result<()> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(err(format!("NVRTC {what}: {r:?}")))
    }
}

/// NVRTC's (major, minor) version.
pub fn version() -> Result<(i32, i32)> {
    if !available() {
        return Err(err("libnvrtc.so.13 not found (install the CUDA toolkit or nvidia-cuda-nvrtc)"));
    }
    let (mut major, mut minor) = (0 as c_int, 0 as c_int);
    // SAFETY: two valid out-pointers; the library is present (checked above).
    check(unsafe { sys::nvrtcVersion(&mut major, &mut minor) }, "version")?;
    Ok((major, minor))
}

/// The real architectures (XY of sm_XY) this NVRTC can produce machine code for.
pub fn supported_archs() -> Result<Vec<u32>> {
    version()?;
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer.
    check(unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) }, "arch count")?;
    let mut archs = vec![0 as c_int; n.max(0) as usize];
    // SAFETY: `archs` holds exactly `n` ints, as nvrtcGetSupportedArchs requires.
    check(unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }, "archs")?;
    Ok(archs.into_iter().map(|a| a as u32).collect())
}

/// The best target for a device of compute capability `sm`: its own machine code when this
/// NVRTC knows it, else PTX for the newest older architecture it knows.
pub fn target_for(sm: u32) -> Result<Target> {
    let archs = supported_archs()?;
    if archs.contains(&sm) {
        return Ok(Target::Cubin(sm));
    }
    archs
        .iter()
        .copied()
        .filter(|&a| a <= sm)
        .max()
        .map(Target::Ptx)
        .ok_or_else(|| err(format!("NVRTC supports none of the architectures up to sm_{sm}: {archs:?}")))
}

/// The CUDA include directories NVRTC needs (see the module docs for the search order).
pub fn include_dirs() -> Result<Vec<PathBuf>> {
    if let Some(list) = std::env::var_os("VT_CUDA_INCLUDE") {
        let dirs: Vec<PathBuf> = std::env::split_paths(&list).filter(|p| p.is_dir()).collect();
        if dirs.iter().any(|d| d.join("cuda_bf16.h").is_file()) {
            return Ok(dirs);
        }
        return Err(err(format!("VT_CUDA_INCLUDE={list:?} holds no cuda_bf16.h")));
    }
    let mut tried = Vec::new();
    let roots = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .chain(std::iter::once(PathBuf::from("/usr/local/cuda")));
    for root in roots {
        let inc = root.join("include");
        if inc.join("cuda_bf16.h").is_file() {
            let mut dirs = vec![inc.clone()];
            if inc.join("cccl").is_dir() {
                dirs.push(inc.join("cccl"));
            }
            return Ok(dirs);
        }
        tried.push(inc);
    }
    Err(err(format!(
        "no CUDA headers found for NVRTC (looked for cuda_bf16.h in {tried:?}); set CUDA_HOME to a \
         CUDA toolkit or to the nvidia/cu13 folder of the nvidia-cuda-runtime and nvidia-cuda-cccl wheels"
    )))
}

/// The options every kernel file is compiled with (besides the architecture).
fn options(includes: &[PathBuf]) -> Vec<String> {
    let mut o = vec![
        "--std=c++17".to_string(),
        // Line info costs nothing at run time and lets compute-sanitizer name source lines.
        "--generate-line-info".to_string(),
        "-DVT_NVRTC=1".to_string(),
    ];
    o.extend(includes.iter().map(|d| format!("--include-path={}", d.display())));
    o
}

/// Where compiled code is cached: `vt_core::kernel_cache::dir("cuda")` (see the module docs).
pub fn cache_dir() -> Option<PathBuf> {
    vt_core::kernel_cache::dir("cuda")
}

/// Compiles `source` (file `name`, e.g. `rms_norm.cu`) for `target`, or returns the cached
/// result of an identical earlier compile. `headers` are `(include name, text)` pairs.
pub fn compile(name: &str, source: &str, headers: &[(&str, &str)], target: Target) -> Result<Image> {
    compile_in(cache_dir().as_deref(), name, source, headers, target)
}

/// [`compile`] with an explicit cache folder (`None`: no disk cache).
pub fn compile_in(
    cache: Option<&Path>,
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    target: Target,
) -> Result<Image> {
    let ver = version()?;
    let includes = include_dirs()?;
    let opts = options(&includes);

    let mut key = vt_core::kernel_cache::Key::new();
    key.text(name).text(source);
    for (hn, ht) in headers {
        key.text(hn).text(ht);
    }
    for o in &opts {
        key.option(o);
    }
    let stem = name.trim_end_matches(".cu");
    let file = format!("{stem}-nvrtc{}.{}-{}-{}", ver.0, ver.1, target.tag(), key.digest());

    if let Some(bytes) = vt_core::kernel_cache::load(cache, &file) {
        tracing::debug!(kernel = name, file, "loaded compiled kernel from the disk cache");
        return Ok(Image { bytes, target, cached: true });
    }

    let start = std::time::Instant::now();
    let bytes = compile_uncached(name, source, headers, target, &opts)?;
    tracing::debug!(kernel = name, ?target, ms = start.elapsed().as_millis() as u64, "NVRTC compiled");
    vt_core::kernel_cache::store(cache, &file, &bytes);
    Ok(Image { bytes, target, cached: false })
}

type SizeFn = unsafe fn(sys::nvrtcProgram, *mut usize) -> sys::nvrtcResult;
type GetFn = unsafe fn(sys::nvrtcProgram, *mut c_char) -> sys::nvrtcResult;

/// Owns an nvrtcProgram and destroys it on every path out.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| err(format!("NVRTC {what} holds a NUL byte")))
}

fn compile_uncached(
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    target: Target,
    opts: &[String],
) -> Result<Vec<u8>> {
    let c_src = cstring(source, "source")?;
    let c_name = cstring(name, "file name")?;
    let h_texts = headers.iter().map(|(_, t)| cstring(t, "header")).collect::<Result<Vec<_>>>()?;
    let h_names = headers.iter().map(|(n, _)| cstring(n, "header name")).collect::<Result<Vec<_>>>()?;
    let h_text_ptrs: Vec<*const c_char> = h_texts.iter().map(|c| c.as_ptr()).collect();
    let h_name_ptrs: Vec<*const c_char> = h_names.iter().map(|c| c.as_ptr()).collect();
    let mut all_opts = opts.to_vec();
    all_opts.push(target.arch_option());
    let c_opts = all_opts.iter().map(|o| cstring(o, "option")).collect::<Result<Vec<_>>>()?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|c| c.as_ptr()).collect();

    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer refers to a NUL-terminated string alive for this call; the
    // header arrays both hold `headers.len()` entries.
    check(
        unsafe {
            sys::nvrtcCreateProgram(
                &mut prog,
                c_src.as_ptr(),
                c_name.as_ptr(),
                headers.len() as c_int,
                h_text_ptrs.as_ptr(),
                h_name_ptrs.as_ptr(),
            )
        },
        "create program",
    )?;
    let prog = Program(prog);
    // SAFETY: `prog` is live; the options array holds `opt_ptrs.len()` valid C strings.
    let status = unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    let log = program_log(&prog);
    if status != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(err(format!(
            "NVRTC failed to compile {name} for {} ({status:?}):\n{log}",
            target.arch_option().trim_start_matches("--gpu-architecture=")
        )));
    }
    if !log.trim().is_empty() {
        tracing::debug!(kernel = name, "NVRTC log:\n{log}");
    }
    let (size_fn, get_fn): (SizeFn, GetFn) = match target {
        Target::Cubin(_) => (sys::nvrtcGetCUBINSize, sys::nvrtcGetCUBIN),
        Target::Ptx(_) | Target::PtxArchSpecific(_) => (sys::nvrtcGetPTXSize, sys::nvrtcGetPTX),
    };
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; valid out-pointer.
    check(unsafe { size_fn(prog.0, &mut size) }, "output size")?;
    let mut bytes = vec![0u8; size];
    // SAFETY: `bytes` holds exactly the `size` bytes NVRTC reported.
    check(unsafe { get_fn(prog.0, bytes.as_mut_ptr() as *mut c_char) }, "output")?;
    if bytes.is_empty() {
        return Err(err(format!("NVRTC produced no code for {name}")));
    }
    Ok(bytes)
}

fn program_log(prog: &Program) -> String {
    let mut size = 0usize;
    // SAFETY: `prog` is live; valid out-pointer.
    if unsafe { sys::nvrtcGetProgramLogSize(prog.0, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS {
        return String::from("(no log)");
    }
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: `buf` holds at least `size` bytes.
    if unsafe { sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr() as *mut c_char) }
        != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return String::from("(no log)");
    }
    String::from_utf8_lossy(&buf).trim_end_matches('\0').to_string()
}
