//! The kernel files of `kernels-cuda/`, embedded in the binary, and the headers they share.
//!
//! An op file names its kernel file with [`kernel_source!`] and asks its queue for a
//! function by base name and dtype; the file defines `extern "C"` kernels named
//! `{base}_{bf16,f16,f32}` (see `kernels-cuda/common.cuh`, `VT_FOR_EACH_FLOAT`).

/// One `kernels-cuda/{name}.cu` file.
pub struct KernelSource {
    /// The file stem (`rms_norm`); also the module's cache key.
    pub name: &'static str,
    /// The file's text.
    pub code: &'static str,
}

/// `kernel_source!("rms_norm")` embeds `kernels-cuda/rms_norm.cu`.
#[macro_export]
#[doc(hidden)]
macro_rules! kernel_source {
    ($name:literal) => {
        $crate::kernels::KernelSource {
            name: $name,
            code: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels-cuda/", $name, ".cu")),
        }
    };
}

/// Every header of `kernels-cuda/`, handed to NVRTC in memory by include name. A new
/// header must be added here (and is then part of every module's cache key).
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../../kernels-cuda/common.cuh")),
    ("norm_rope.cuh", include_str!("../../../kernels-cuda/norm_rope.cuh")),
];

/// `VT_CUDA_KERNELS_DIR`: a folder whose `.cu`/`.cuh` files replace the embedded copies
/// (files it lacks stay embedded). For kernel work: edit a kernel and rerun a test or the
/// bench without rebuilding. The disk cache is keyed by the text actually compiled.
pub const KERNELS_DIR_ENV: &str = "VT_CUDA_KERNELS_DIR";

fn override_dir() -> Option<std::path::PathBuf> {
    std::env::var_os(KERNELS_DIR_ENV).filter(|d| !d.is_empty()).map(Into::into)
}

fn read_override(file: &str) -> vt_core::Result<Option<String>> {
    let Some(dir) = override_dir() else { return Ok(None) };
    let path = dir.join(file);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(vt_core::Error::backend(
            "cuda",
            format!("{KERNELS_DIR_ENV}: reading {}: {e}", path.display()),
        )),
    }
}

/// The text of `src` and the headers to compile it with: the embedded copies, or the
/// files of [`KERNELS_DIR_ENV`] where it is set and has them.
pub(crate) fn texts(src: &KernelSource) -> vt_core::Result<(String, Vec<(&'static str, String)>)> {
    let code = read_override(&format!("{}.cu", src.name))?.unwrap_or_else(|| src.code.to_string());
    let mut headers = Vec::with_capacity(HEADERS.len());
    for &(name, text) in HEADERS {
        headers.push((name, read_override(name)?.unwrap_or_else(|| text.to_string())));
    }
    Ok((code, headers))
}
