//! The test helpers of mla-block (goldens, synthetic layers, safetensors files), shared
//! as source, plus how to run this crate's `vt-mla` binary.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

#[path = "../../../mla-block/tests/common/mod.rs"]
mod block;
pub use block::*;

/// This package's `vt-mla` binary.
pub fn vt_mla() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vt-mla"))
}

/// `vt-mla run` on the case in `dir` (`config.json`, `weights.safetensors`,
/// `input.safetensors`), writing `out`, with `extra` arguments.
pub fn vt_mla_run(dir: &Path, out: &Path, extra: &[&str]) -> Output {
    vt_mla()
        .arg("run")
        .arg("--config")
        .arg(dir.join("config.json"))
        .arg("--weights")
        .arg(dir.join("weights.safetensors"))
        .arg("--input")
        .arg(dir.join("input.safetensors"))
        .arg("--output")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}
