//! Start-up for applications: probe every backend compiled into this build and register
//! those that find a device. Libraries built on vt-core (such as mla-block) never depend
//! on this crate; binaries, tests and tools call [`init`] once.

use once_cell::sync::Lazy;
use vt_core::{DeviceType, Probe};

static PROBES: Lazy<Vec<(DeviceType, Probe)>> = Lazy::new(|| {
    vec![
        (DeviceType::Cpu, vt_cpu::register()),
        (DeviceType::Cuda, vt_cuda::register()),
        (DeviceType::Hip, vt_hip::register()),
    ]
});

/// Registers every backend that finds a device (idempotent) and returns what each found.
pub fn init() -> &'static [(DeviceType, Probe)] {
    &PROBES
}

/// The best device type present: CUDA, then HIP, then the CPU.
pub fn best_device() -> DeviceType {
    let found = |k| init().iter().any(|(d, p)| *d == k && matches!(p, Probe::Registered { .. }));
    [DeviceType::Cuda, DeviceType::Hip].into_iter().find(|&k| found(k)).unwrap_or(DeviceType::Cpu)
}
