//! Every kernels-hip file compiles with hiprtc through the backend's own compile path, and
//! every launch the ops plan matches the compiled kernel's arguments (count, sizes,
//! pointer/value kinds), workgroup limit and shared memory. Needs hiprtc (libamdhip64 of
//! ROCm 5.x, or libhiprtc), not a GPU; skips with a message where the library is absent
//! (`.ci/kernels` runs the same check through `cargo xtask kernels` after installing it).

use vt_hip::{selfcheck, Libraries};

#[test]
fn every_kernel_compiles_with_hiprtc_and_matches_its_planned_launches() {
    let report =
        match selfcheck::run(&Libraries::default(), "gfx90a", vt_hip::compile::cache_dir().as_deref()) {
            Ok(r) => r,
            // No HIP runtime here: `.ci/kernels` installs it after the tests run.
            Err(e) => {
                eprintln!("skipped: no HIP runtime / hiprtc on this machine ({e})");
                return;
            }
        };
    eprintln!("{report}");
    assert!(report.passed(), "{report}");
    assert_eq!(report.files, 10);
    // Every kernel is instantiated for f32, f16 and bf16.
    assert_eq!(report.kernels, 30);
    assert_eq!(report.wavefront_size, 64, "gfx90a runs 64-wide wavefronts");
    assert!(report.launches >= 30);
}

#[test]
fn kernels_compile_for_32_wide_waves_too() {
    // RDNA (gfx10/11) runs 32-wide waves: the reductions loop from warpSize / 2 and must not
    // assume 64 (or 32) lanes.
    let report =
        match selfcheck::run(&Libraries::default(), "gfx1030", vt_hip::compile::cache_dir().as_deref()) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipped: no HIP runtime / hiprtc on this machine ({e})");
                return;
            }
        };
    eprintln!("{report}");
    assert!(report.passed(), "{report}");
    assert_eq!(report.wavefront_size, 32, "gfx1030 runs 32-wide wavefronts");
}
