//! With no HIP runtime at all (library names that do not exist), the probe reports
//! `Unavailable`, registers nothing, and nothing panics. Its own test binary, so no other
//! test's registration can interfere.

use vt_core::{op_registered, registry, DeviceType, OpId, Probe};
use vt_hip::Libraries;

fn missing() -> Libraries {
    let none =
        vec!["libamdhip64-vt-test-does-not-exist.so".to_string(), "/nonexistent/libamdhip64.so".into()];
    Libraries { hip: none.clone(), hiprtc: none.clone(), rocblas: none }
}

#[test]
fn probe_without_the_library_is_unavailable_and_registers_nothing() {
    let probe = vt_hip::register_with(&missing());
    let Probe::Unavailable { detail } = &probe else { panic!("expected Unavailable, got {probe}") };
    assert!(detail.contains("libamdhip64 not found"), "{detail}");
    // Every candidate is named, so a user can see where it looked.
    assert!(detail.contains("/nonexistent/libamdhip64.so"), "{detail}");
    assert!(probe.to_string().starts_with("unavailable"), "{probe}");
    assert!(registry::backend(DeviceType::Hip).is_none());
    for &op in OpId::ALL {
        assert!(!op_registered(op, DeviceType::Hip), "{op} registered without a HIP runtime");
    }
    // Probing again is harmless.
    assert_eq!(vt_hip::register_with(&missing()), probe);
}

#[test]
fn selfcheck_without_the_library_is_an_error_not_a_panic() {
    let e = vt_hip::selfcheck::run(&missing(), "gfx90a", None).unwrap_err();
    assert!(e.contains("libamdhip64-vt-test-does-not-exist.so"), "{e}");
}
