//! The probe on this machine, with the default library search. Three outcomes, each
//! checked strictly:
//! - no libamdhip64 (a clean CI machine before `.ci/kernels` installs it): `Unavailable`;
//! - libamdhip64 but no AMD GPU (no `/dev/kfd`, as on every machine here): `NoDevice`,
//!   naming the library that loaded, and nothing registered;
//! - an AMD GPU: `Registered` with every op.

use vt_core::{op_registered, registry, DeviceType, OpId, Probe};
use vt_hip::{sys, Libraries};

#[test]
fn probe_reports_no_device_when_the_library_loads_without_an_amd_gpu() {
    let libs = Libraries::default();
    let loadable = sys::open_first(&libs.hip).is_ok();
    let gpu_possible = std::path::Path::new("/dev/kfd").exists();
    let probe = vt_hip::register();
    eprintln!("hip probe: {probe} (library loadable: {loadable}, /dev/kfd: {gpu_possible})");
    match &probe {
        Probe::Unavailable { detail } => {
            assert!(!loadable, "libamdhip64 loads here, yet the probe says unavailable: {detail}");
            assert!(detail.contains("libamdhip64 not found"), "{detail}");
        }
        Probe::NoDevice { detail } => {
            assert!(loadable);
            assert!(detail.contains("loaded"), "{detail}");
            assert!(probe.to_string().starts_with("no device"), "{probe}");
        }
        Probe::Registered { devices } => {
            assert!(gpu_possible, "registered {devices} device(s) on a machine without /dev/kfd");
            assert!(*devices > 0);
        }
    }
    let registered = matches!(probe, Probe::Registered { .. });
    assert_eq!(registry::backend(DeviceType::Hip).is_some(), registered);
    for &op in OpId::ALL {
        assert_eq!(op_registered(op, DeviceType::Hip), registered, "{op}");
    }
    if !gpu_possible {
        assert!(!registered);
    }
    // A second probe agrees and does not crash (the library stays loaded).
    assert_eq!(std::mem::discriminant(&vt_hip::register()), std::mem::discriminant(&probe));
}
