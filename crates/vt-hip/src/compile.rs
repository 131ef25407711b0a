//! The kernel sources (kernels-hip/, built into the binary) and their run-time compilation
//! with hiprtc, cached on disk.
//!
//! - Each `.hip` file is compiled on first use for the exact target of the device that
//!   runs it (`gcnArchName`, e.g. `gfx942:sramecc+:xnack-`), so one binary serves every
//!   AMD GPU that its user's ROCm knows, including ones newer than any toolchain here.
//! - Headers (`common.h`, `norm_rope.h`, `attention.h`) are served to hiprtc from memory; the file then
//!   compiles the same here, in `cargo xtask kernels` (hipcc) and on an AMD machine.
//! - The cache key is a SHA-256 of the file name, the source, every header, the options
//!   and the hiprtc version, plus the target. Files live in `$VT_CACHE_DIR/hip`, else
//!   `$XDG_CACHE_HOME/vt/hip`, else `~/.cache/vt/hip`; a second start compiles nothing. A
//!   cache that cannot be written is logged and skipped.
//! - A failed compile is an error that carries hiprtc's log. Compiles run one at a time.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use vt_core::Result;

use crate::driver::{self, err};
use crate::sys::HiprtcApi;

macro_rules! kernel_files {
    ($($name:literal),* $(,)?) => {
        /// Every kernel file: `(file name, source)`.
        pub const SOURCES: &[(&str, &str)] = &[$(($name, include_str!(concat!("../../../kernels-hip/", $name)))),*];
    };
}

kernel_files!(
    "batched_matmul.hip",
    "cache_indexer_keys.hip",
    "concat_and_cache_mla.hip",
    "concat_mla_nope_rope.hip",
    "fp8_matmul.hip",
    "fused_norm_rope.hip",
    "gather_mla_cache.hip",
    "indexer_top_k.hip",
    "layer_norm.hip",
    "merge_attn_states.hip",
    "mla_decode_attention.hip",
    "prefill_attention.hip",
    "rms_norm.hip",
    "rope_from_cache.hip",
    "sparse_mla_attention.hip",
);

/// The headers the kernel files include, served from memory.
pub const HEADERS: &[(&str, &str)] = &[
    ("common.h", include_str!("../../../kernels-hip/common.h")),
    ("norm_rope.h", include_str!("../../../kernels-hip/norm_rope.h")),
    ("attention.h", include_str!("../../../kernels-hip/attention.h")),
    ("fp8_ds_mla.h", include_str!("../../../kernels-hip/fp8_ds_mla.h")),
];

/// The options every file is compiled with, besides the target. `cargo xtask kernels`
/// passes the same ones to hipcc.
pub const OPTIONS: &[&str] = &["-O3", "-std=c++17", "-ffp-contract=off", "-DVT_HIPRTC=1"];

static COMPILE_LOCK: Mutex<()> = Mutex::new(());

/// The source of one kernel file.
pub fn source(file: &str) -> Result<&'static str> {
    SOURCES
        .iter()
        .find(|(n, _)| *n == file)
        .map(|(_, s)| *s)
        .ok_or_else(|| err(format!("no kernel file {file} in kernels-hip/")))
}

/// Where compiled code objects are cached: `vt_core::kernel_cache::dir("hip")` (see the
/// module docs).
pub fn cache_dir() -> Option<PathBuf> {
    vt_core::kernel_cache::dir("hip")
}

/// A compiled code object.
pub struct CodeObject {
    pub bytes: Vec<u8>,
    /// Whether it came from the disk cache.
    pub cached: bool,
}

/// Compiles kernel file `file` for target `arch` (a gcnArchName such as `gfx90a` or
/// `gfx942:sramecc+:xnack-`), or returns the cached result of an identical compile.
pub fn compile(api: &HiprtcApi, file: &str, arch: &str) -> Result<CodeObject> {
    compile_with_cache(api, file, arch, cache_dir().as_deref())
}

pub(crate) fn compile_with_cache(
    api: &HiprtcApi,
    file: &str,
    arch: &str,
    cache: Option<&Path>,
) -> Result<CodeObject> {
    let src = source(file)?;
    let ver = driver::hiprtc_version(api)?;
    let mut opts: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    opts.push(format!("--offload-arch={arch}"));

    let mut key = vt_core::kernel_cache::Key::new();
    key.text(file).text(src);
    for (name, text) in HEADERS {
        key.text(name).text(text);
    }
    for o in &opts {
        key.option(o);
    }
    let target: String = arch.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    let stem = file.trim_end_matches(".hip");
    let name = format!("{stem}-hiprtc{}.{}-{target}-{}.co", ver.0, ver.1, key.digest());

    if let Some(bytes) = vt_core::kernel_cache::load(cache, &name) {
        tracing::debug!(kernel = file, name, "loaded a code object from the disk cache");
        return Ok(CodeObject { bytes, cached: true });
    }
    let start = std::time::Instant::now();
    let bytes = {
        // hiprtc of ROCm 5.2 crashes when two programs compile at once (seen here: SIGSEGV
        // with two threads compiling), so compiles are serialized process-wide.
        let _one_at_a_time = COMPILE_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        driver::hiprtc_compile(api, file, src, HEADERS, &opts)?
    };
    tracing::debug!(kernel = file, arch, ms = start.elapsed().as_millis() as u64, "hiprtc compiled");
    vt_core::kernel_cache::store(cache, &name, &bytes);
    Ok(CodeObject { bytes, cached: false })
}
