//! Writing `--output` safely: refused when it is the same file as an input, written to a
//! temporary file in the same folder and renamed over the old one, so a failed write never
//! leaves a truncated output (or clobbers an input).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use vt_core::{Error, Result};

/// The `(device, inode)` of the file at `path` (following symlinks), `None` when nothing
/// is there.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Errors, before any work, when `output` is the same file as one of `inputs` (`(flag,
/// path)`): the same path, another path or a symlink to it, or a hard link (compared by
/// device and inode).
pub fn refuse_overwriting_inputs(output: &Path, inputs: &[(&str, &Path)]) -> Result<()> {
    let Some(out) = file_id(output) else { return Ok(()) };
    for (flag, input) in inputs {
        if file_id(input) == Some(out) {
            return Err(Error::other(
                output.display().to_string(),
                format!(
                    "--output is the same file as {flag} {} (device and inode {}:{}); refusing to overwrite an input",
                    input.display(),
                    out.0,
                    out.1
                ),
            ));
        }
    }
    Ok(())
}

/// The temporary file next to `path`: `.{name}.tmp.{pid}` in the same folder, so the
/// rename stays within one file system.
fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "output".into());
    path.with_file_name(format!(".{name}.tmp.{}", std::process::id()))
}

/// Writes `path` atomically: `write` fills a temporary file in the same folder, which is
/// synced and renamed over `path`. On any error the temporary file is removed and `path`
/// is left as it was.
pub fn write_atomically(path: &Path, write: impl FnOnce(&mut File) -> std::io::Result<()>) -> Result<()> {
    let ctx = path.display().to_string();
    let tmp = temp_path(path);
    let result = (|| -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        write(&mut f)?;
        f.flush()?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::other(ctx, format!("cannot write: {e} (any previous file there is unchanged)"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vt-mla-output-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let d = dir("fail");
        let out = d.join("out.safetensors");
        std::fs::write(&out, b"old").unwrap();
        let r = write_atomically(&out, |f| {
            f.write_all(b"half of the ne")?;
            Err(std::io::Error::other("disk full"))
        });
        let msg = r.unwrap_err().to_string();
        assert!(msg.contains("out.safetensors") && msg.contains("disk full"), "{msg}");
        assert_eq!(std::fs::read(&out).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1, "the temporary file is removed");
        write_atomically(&out, |f| f.write_all(b"new")).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn inputs_are_recognized_by_device_and_inode() {
        let d = dir("same");
        let input = d.join("in");
        std::fs::write(&input, b"x").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        let other = d.join("other");
        std::fs::write(&other, b"x").unwrap();
        assert!(refuse_overwriting_inputs(&link, &[("--input", &input)]).is_err());
        assert!(refuse_overwriting_inputs(&d.join(".").join("in"), &[("--input", &input)]).is_err());
        assert!(refuse_overwriting_inputs(&other, &[("--input", &input)]).is_ok());
        assert!(refuse_overwriting_inputs(&d.join("absent"), &[("--input", &input)]).is_ok());
        let _ = std::fs::remove_dir_all(&d);
    }
}
