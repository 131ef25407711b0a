//! The disk cache of GPU code compiled at run time, shared by the backends that compile
//! their kernels on first use (vt-cuda with NVRTC, vt-hip with hiprtc).
//!
//! An entry is one file named by the caller from the kernel file, the compiler version,
//! the target and a [`Key`] digest of everything that changes the compiled bytes (source,
//! headers, options). Files are written atomically (temporary file, then rename), so two
//! processes compiling the same kernel at once never read a torn file.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The cache folder of `backend` (`"cuda"`, `"hip"`): `$VT_CACHE_DIR/{backend}`, else
/// `$XDG_CACHE_HOME/vt/{backend}`, else `$HOME/.cache/vt/{backend}`; `None` when none is set.
pub fn dir(backend: &str) -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    dir_from(var("VT_CACHE_DIR"), var("XDG_CACHE_HOME"), var("HOME"), backend)
}

fn dir_from(
    vt: Option<PathBuf>,
    xdg: Option<PathBuf>,
    home: Option<PathBuf>,
    backend: &str,
) -> Option<PathBuf> {
    vt.map(|d| d.join(backend))
        .or_else(|| xdg.map(|d| d.join("vt").join(backend)))
        .or_else(|| home.map(|h| h.join(".cache").join("vt").join(backend)))
}

/// Builds the digest that names a cache entry. Texts are length-prefixed and options
/// NUL-terminated, so no two different inputs run together into the same byte stream.
#[derive(Default)]
pub struct Key(Sha256);

impl Key {
    pub fn new() -> Key {
        Key::default()
    }

    /// Adds a text (a file name, a source, a header's name or text).
    pub fn text(&mut self, s: &str) -> &mut Key {
        self.0.update((s.len() as u64).to_le_bytes());
        self.0.update(s.as_bytes());
        self
    }

    /// Adds a compiler option.
    pub fn option(&mut self, s: &str) -> &mut Key {
        self.0.update(s.as_bytes());
        self.0.update([0u8]);
        self
    }

    /// The first 12 bytes of the SHA-256, as 24 hex digits.
    pub fn digest(&self) -> String {
        self.0.clone().finalize().iter().take(12).map(|b| format!("{b:02x}")).collect()
    }
}

/// The bytes of entry `file` in `dir`, if it exists and is not empty.
pub fn load(dir: Option<&Path>, file: &str) -> Option<Vec<u8>> {
    let bytes = std::fs::read(dir?.join(file)).ok()?;
    (!bytes.is_empty()).then_some(bytes)
}

/// Stores entry `file` in `dir` (creating the folder). A failure is logged, not returned:
/// the cache only saves time.
pub fn store(dir: Option<&Path>, file: &str, bytes: &[u8]) {
    let Some(dir) = dir else { return };
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".{file}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, dir.join(file))
    };
    if let Err(e) = write() {
        tracing::warn!(dir = %dir.display(), file, "cannot write the kernel cache: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_folder_follows_vt_cache_dir_then_xdg_then_home() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(dir_from(p("/v"), p("/x"), p("/h"), "cuda"), p("/v/cuda"));
        assert_eq!(dir_from(None, p("/x"), p("/h"), "hip"), p("/x/vt/hip"));
        assert_eq!(dir_from(None, None, p("/h"), "cuda"), p("/h/.cache/vt/cuda"));
        assert_eq!(dir_from(None, None, None, "cuda"), None);
    }

    #[test]
    fn keys_differ_when_any_input_or_its_split_differs() {
        let d = |parts: &[&str], opts: &[&str]| {
            let mut k = Key::new();
            parts.iter().for_each(|p| {
                k.text(p);
            });
            opts.iter().for_each(|o| {
                k.option(o);
            });
            k.digest()
        };
        let base = d(&["a.cu", "src"], &["-O3"]);
        assert_eq!(base.len(), 24);
        assert_eq!(base, d(&["a.cu", "src"], &["-O3"]), "deterministic");
        assert_ne!(base, d(&["a.cu", "src2"], &["-O3"]));
        assert_ne!(base, d(&["a.cus", "rc"], &["-O3"]), "length prefixes keep texts apart");
        assert_ne!(base, d(&["a.cu", "src"], &["-O2"]));
        assert_ne!(d(&[], &["ab", "c"]), d(&[], &["a", "bc"]), "options are terminated");
    }

    #[test]
    fn stored_entries_load_back_and_empty_or_missing_ones_do_not() {
        let dir = std::env::temp_dir().join(format!("vt-kernel-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(load(Some(&dir), "k.bin"), None, "missing folder");
        store(Some(&dir), "k.bin", b"code");
        assert_eq!(load(Some(&dir), "k.bin").as_deref(), Some(&b"code"[..]));
        std::fs::write(dir.join("empty.bin"), b"").expect("write");
        assert_eq!(load(Some(&dir), "empty.bin"), None, "an empty file is not an entry");
        assert_eq!(load(None, "k.bin"), None, "no cache folder");
        store(None, "k.bin", b"ignored");
        let leftovers = std::fs::read_dir(&dir).expect("dir").filter(|e| {
            e.as_ref().map(|e| e.file_name().to_string_lossy().ends_with(".tmp")).unwrap_or(false)
        });
        assert_eq!(leftovers.count(), 0, "no temporary files left behind");
        std::fs::remove_dir_all(&dir).ok();
    }
}
