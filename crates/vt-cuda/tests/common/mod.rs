//! What the GPU test files share: the CUDA queue (or a skip), the CPU queue, the error measure.
// Each test file uses what it needs of this module.
#![allow(dead_code)]

use std::sync::OnceLock;

use vt_core::{Device, DeviceType, Probe, Queue};

/// A queue on CUDA device 0 (the CPU and CUDA backends registered once per process), or
/// `None` with a line saying why the test is skipped.
pub fn gpu() -> Option<Queue> {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    let probe = PROBE.get_or_init(|| {
        vt_cpu::register();
        vt_cuda::register()
    });
    match probe {
        Probe::Registered { .. } => Some(Queue::new(Device::new(DeviceType::Cuda, 0)).unwrap()),
        other => {
            println!("SKIP: no CUDA device ({other})");
            None
        }
    }
}

/// The CPU reference's queue.
pub fn cpu() -> Queue {
    Queue::new(Device::CPU).unwrap()
}

/// Relative Frobenius error ||got - want|| / ||want||.
pub fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (g, w) in got.iter().zip(want) {
        num += (g - w) * (g - w);
        den += w * w;
    }
    (num / den.max(1e-30)).sqrt()
}
