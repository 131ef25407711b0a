//! The kernel files of `kernels-cuda/`, embedded in the binary, and the headers they share.
//!
//! An op file names its kernel file with [`kernel_source!`](crate::kernel_source) and asks its queue for a
//! function by base name and dtype; the file defines `extern "C"` kernels named
//! `{base}_{bf16,f16,f32}` (see `kernels-cuda/common.cuh`, `VT_FOR_EACH_FLOAT`).

/// One `kernels-cuda/{name}.cu` file.
pub struct KernelSource {
    /// The file stem (`rms_norm`); also the module's cache key.
    pub name: &'static str,
    /// The file's text.
    pub code: &'static str,
}

impl std::fmt::Debug for KernelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.cu", self.name)
    }
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

/// `header!("common.cuh")`: the include name and text of `kernels-cuda/common.cuh`.
macro_rules! header {
    ($name:literal) => {
        ($name, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels-cuda/", $name)))
    };
}

/// Every header of `kernels-cuda/`, handed to NVRTC in memory by include name (its path
/// under `kernels-cuda/`). A new header must be added here (and is then part of every
/// module's cache key); a test fails on a header some kernel file or header includes that
/// is not listed.
pub const HEADERS: &[(&str, &str)] = &[
    header!("common.cuh"),
    header!("norm_rope.cuh"),
    header!("tensor_core.cuh"),
    header!("fp8_ds_mla.cuh"),
    header!("e4m3.cuh"),
    header!("prefill_attention/params.cuh"),
    header!("prefill_attention/sm80.cuh"),
    header!("prefill_attention/sm90.cuh"),
    header!("mla_decode_attention/params.cuh"),
    header!("mla_decode_attention/schedule.cuh"),
    header!("mla_decode_attention/key_row.cuh"),
    header!("mla_decode_attention/generic.cuh"),
    header!("mla_decode_attention/combine.cuh"),
    header!("mla_decode_attention/tiles.cuh"),
    header!("mla_decode_attention/mma_sm80.cuh"),
    header!("mla_decode_attention/wgmma_sm90.cuh"),
    header!("mla_decode_attention/wgmma_narrow_sm90.cuh"),
    header!("mla_decode_attention/wgmma_narrow_fp8_sm90.cuh"),
    header!("mla_decode_attention/wgmma_3wg_sm90.cuh"),
    header!("mla_decode_attention/wgmma_seesaw_sm90.cuh"),
    header!("mla_decode_attention/wgmma_fp8_sm90.cuh"),
    header!("mla_decode_attention/wgmma_fp8_pair_sm90.cuh"),
    header!("sparse_mla_attention/prefill_sm90.cuh"),
    header!("mla_decode_attention/fp8_tiles.cuh"),
];

/// `VT_CUDA_KERNELS_DIR`: a folder whose `.cu`/`.cuh` files replace the embedded copies
/// (files it lacks stay embedded). For kernel work: edit a kernel and rerun a test or the
/// bench without rebuilding. The disk cache is keyed by the text actually compiled.
pub const KERNELS_DIR_ENV: &str = "VT_CUDA_KERNELS_DIR";

fn override_dir() -> Option<std::path::PathBuf> {
    std::env::var_os(KERNELS_DIR_ENV).filter(|d| !d.is_empty()).map(Into::into)
}

fn read_override(dir: Option<&std::path::Path>, file: &str) -> vt_core::Result<Option<String>> {
    let Some(dir) = dir else { return Ok(None) };
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
    texts_from(src, override_dir().as_deref())
}

fn texts_from(
    src: &KernelSource,
    dir: Option<&std::path::Path>,
) -> vt_core::Result<(String, Vec<(&'static str, String)>)> {
    let code = read_override(dir, &format!("{}.cu", src.name))?.unwrap_or_else(|| src.code.to_string());
    let mut headers = Vec::with_capacity(HEADERS.len());
    for &(name, text) in HEADERS {
        headers.push((name, read_override(dir, name)?.unwrap_or_else(|| text.to_string())));
    }
    Ok((code, headers))
}

/// Compiles `src` for `target` through the disk cache ([`crate::nvrtc::cache_dir`]) exactly as
/// a queue's first use of it does: the same texts (with [`KERNELS_DIR_ENV`]'s overlays), options
/// and cache key. Run ahead of time for a device's architecture (`cargo xtask kernels
/// --warm-cache DIR --sm 90`, with `VT_CACHE_DIR=DIR` where the device runs), a first start
/// loads the module without compiling.
pub fn compile_module(
    src: &KernelSource,
    target: crate::nvrtc::Target,
) -> vt_core::Result<crate::nvrtc::Image> {
    let (code, headers) = texts(src)?;
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, t)| (*n, t.as_str())).collect();
    crate::nvrtc::compile(&format!("{}.cu", src.name), &code, &headers, target)
}

#[cfg(test)]
mod tests {
    use super::*;

    static SRC: KernelSource = crate::kernel_source!("rms_norm");

    /// The `#include "..."` names of a kernel text (system headers `<...>` are NVRTC's).
    fn includes(text: &str) -> impl Iterator<Item = &str> {
        text.lines().filter_map(|l| l.trim().strip_prefix("#include \"")?.split('"').next())
    }

    #[test]
    fn every_included_header_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels-cuda");
        let mut texts: Vec<(String, String)> =
            HEADERS.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect();
        for e in std::fs::read_dir(&dir).expect("kernels-cuda/") {
            let path = e.expect("entry").path();
            if path.extension().is_some_and(|x| x == "cu") {
                let text = std::fs::read_to_string(&path).expect("kernel file");
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                texts.push((name, text));
            }
        }
        let mut missing = Vec::new();
        for (file, text) in &texts {
            for inc in includes(text) {
                if !HEADERS.iter().any(|(n, _)| *n == inc) {
                    missing.push(format!("{file} includes {inc:?}"));
                }
            }
        }
        assert!(missing.is_empty(), "headers missing from kernels::HEADERS:\n{}", missing.join("\n"));
    }

    #[test]
    fn kernel_sources_are_embedded_unless_a_folder_has_the_file() {
        let dir = std::env::temp_dir().join(format!("vt-kernels-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        // No override folder, or one without the file: the embedded text.
        let (code, headers) = texts_from(&SRC, None).expect("embedded");
        assert_eq!(code, SRC.code);
        assert_eq!(headers.len(), HEADERS.len());
        let (code, _) = texts_from(&SRC, Some(&dir)).expect("empty folder");
        assert_eq!(code, SRC.code);
        // The folder's kernel and header replace the embedded ones; other headers stay.
        std::fs::write(dir.join("rms_norm.cu"), "// edited kernel").expect("write");
        std::fs::write(dir.join("common.cuh"), "// edited header").expect("write");
        let (code, headers) = texts_from(&SRC, Some(&dir)).expect("override");
        assert_eq!(code, "// edited kernel");
        for (name, text) in &headers {
            if *name == "common.cuh" {
                assert_eq!(text, "// edited header");
            } else {
                let embedded = HEADERS.iter().find(|(n, _)| n == name).map(|(_, t)| *t);
                assert_eq!(Some(text.as_str()), embedded);
            }
        }
        // A path that exists but cannot be read as text is an error naming the variable.
        std::fs::remove_file(dir.join("rms_norm.cu")).expect("rm");
        std::fs::create_dir_all(dir.join("rms_norm.cu")).expect("dir as file");
        let err = texts_from(&SRC, Some(&dir)).expect_err("a folder is not a file").to_string();
        assert!(err.contains(KERNELS_DIR_ENV), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
