//! Progress on a terminal (indicatif), quiet otherwise: every bar here is hidden when
//! stderr is not a terminal, so logs and test output stay clean.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use mla_block::{Checkpoint, HostWeights, MlaBlockDims};
use vt_core::{DType, Result};

fn on_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// A bar of `len` units in `template`'s style, or a hidden one off a terminal.
fn bar(len: u64, template: &str) -> ProgressBar {
    if !on_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    // The templates are constants of this file; a bad one falls back to the default style.
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// A spinner with `msg` while `f` runs (stages without a count: uploads, cache fills).
pub fn stage<T>(msg: impl Into<String>, f: impl FnOnce() -> T) -> T {
    let pb = spinner(msg);
    let out = f();
    pb.finish_and_clear();
    out
}

/// A ticking spinner with `msg`; call `finish_and_clear` when done.
pub fn spinner(msg: impl Into<String>) -> ProgressBar {
    if !on_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner().with_message(msg.into());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        pb.set_style(style);
    }
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// A bar over the `total` forwards of a schedule.
pub fn forwards(total: usize) -> ProgressBar {
    bar(total as u64, "forwards [{bar:40}] {pos}/{len} ({elapsed}, eta {eta})")
}

/// Reads the layer `"{prefix}{name}.weight"` of an opened checkpoint (mapped, fp8
/// dequantized unless `keep_fp8`) into host tensors in `dtype`, for the ranks of a
/// tensor-parallel run to split (see `HostWeights::from_checkpoint`).
pub fn load_weights(
    ckpt: &Checkpoint,
    dims: &MlaBlockDims,
    prefix: &str,
    dtype: DType,
    keep_fp8: bool,
) -> Result<HostWeights> {
    stage(format!("reading the weights `{prefix}*`"), || {
        HostWeights::from_checkpoint_with(ckpt, dims, prefix, Some(dtype), keep_fp8)
    })
}
