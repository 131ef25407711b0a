//! Loads one layer's attention weights on the CPU backend and reports the time and the
//! bytes the block keeps (issue 14's load-time / peak-RSS measurement; run it under
//! `/usr/bin/time -v` for the peak RSS):
//!
//! ```text
//! python3 tools/fixtures/checkpoints.py random-v3 --out /tmp/v3layer
//! cargo build --release -p mla-block --example load_layer
//! /usr/bin/time -v target/release/examples/load_layer /tmp/v3layer [LAYER]
//! ```
//!
//! `DIR` holds `config.json` and the checkpoint (`model.safetensors`, or shards with
//! `model.safetensors.index.json`).

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use mla_block::{layer_prefix, Checkpoint, MlaConfig, MlaWeightStore};
use vt_core::{Device, Queue};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: load_layer DIR [LAYER]");
        return ExitCode::from(2);
    };
    let layer = args.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    match run(Path::new(&dir), layer) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load_layer: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(dir: &Path, layer: usize) -> vt_core::Result<()> {
    vt_backends::init();
    let q = Queue::new(Device::CPU)?;
    let cfg = MlaConfig::from_file(&dir.join("config.json"))?;
    let t0 = Instant::now();
    let ckpt = Checkpoint::open(dir)?;
    let store = MlaWeightStore::from_checkpoint(&q, &cfg, &ckpt, &layer_prefix(layer), None)?;
    q.synchronize()?;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "loaded layer {layer} in {secs:.3} s ({}, {} of {} file(s) mapped); the block keeps {:.1} MB",
        store.dtype(),
        ckpt.mapped_files(),
        ckpt.num_files(),
        store.device_bytes() as f64 / 1e6
    );
    Ok(())
}
