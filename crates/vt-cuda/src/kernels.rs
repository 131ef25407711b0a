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
