//! Start-up for applications: probe every backend compiled into this build and register
//! those that find a device. Libraries built on vt-core (such as mla-block) never depend
//! on this crate; binaries, tests and tools call [`init`] once.
//!
//! Features `cuda` and `hip` (both on by default) choose the GPU backends built in; the
//! CPU is always there.

use std::sync::{Arc, LazyLock};

use vt_core::{DeviceType, Probe};

static PROBES: LazyLock<Vec<(DeviceType, Probe)>> = LazyLock::new(|| {
    #[allow(unused_mut)] // without GPU features only the CPU is pushed
    let mut probes = vec![(DeviceType::Cpu, vt_cpu::register())];
    #[cfg(feature = "cuda")]
    probes.push((DeviceType::Cuda, vt_cuda::register()));
    #[cfg(feature = "hip")]
    probes.push((DeviceType::Hip, vt_hip::register()));
    // The host communicator works on any device through the queues' copies: register it
    // for every GPU type found, so several tensor-parallel ranks can share one GPU.
    for (kind, probe) in &probes {
        if *kind != DeviceType::Cpu && matches!(probe, Probe::Registered { .. }) {
            vt_core::comm::register(*kind, Arc::new(vt_cpu::HostTransport));
        }
    }
    probes
});

/// Registers every backend that finds a device (idempotent) and returns what each backend
/// built into this binary found (a device type missing from the list is not built in).
pub fn init() -> &'static [(DeviceType, Probe)] {
    &PROBES
}

/// The best device type present: CUDA, then HIP, then the CPU.
pub fn best_device() -> DeviceType {
    let found = |k| init().iter().any(|(d, p)| *d == k && matches!(p, Probe::Registered { .. }));
    [DeviceType::Cuda, DeviceType::Hip].into_iter().find(|&k| found(k)).unwrap_or(DeviceType::Cpu)
}
