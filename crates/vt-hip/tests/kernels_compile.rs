//! Every kernels-hip file compiles with hiprtc through the backend's own compile path, and
//! every launch the ops plan matches the compiled kernel's arguments (count, sizes,
//! pointer/value kinds), workgroup limit and shared memory. Needs hiprtc (libamdhip64 of
//! ROCm 5.x, or libhiprtc), not a GPU; skips with a message where the library is absent
//! (`.ci/kernels` runs the same check through `cargo xtask kernels` after installing it).

use vt_hip::selfcheck::{self, Report};
use vt_hip::Libraries;

/// The self-check for `arch`, or `None` (skipped, with a message) where there is no HIP
/// runtime / hiprtc: `.ci/kernels` installs it after the tests run.
fn selfcheck_for(arch: &str) -> Option<Report> {
    match selfcheck::run(&Libraries::default(), arch, vt_hip::compile::cache_dir().as_deref()) {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("skipped: no HIP runtime / hiprtc on this machine ({e})");
            None
        }
    }
}

#[test]
fn every_kernel_compiles_with_hiprtc_and_matches_its_planned_launches() {
    let Some(report) = selfcheck_for("gfx90a") else { return };
    eprintln!("{report}");
    assert!(report.passed(), "{report}");
    assert_eq!(report.files, 15);
    // Every kernel is instantiated for f32, f16 and bf16: 14 ops' kernels (LayerNorm the
    // 11th; SparseMlaAttention, IndexerTopK's scores and CacheIndexerKeys), the four
    // fp8_ds_mla cache kernels (writer, gather, decode, sparse attention) and the two of the
    // fp8 matmuls (QuantizeFp8, the generic fp8 matmul); plus IndexerTopK's one select kernel.
    assert_eq!(report.kernels, 61);
    assert_eq!(report.wavefront_size, 64, "gfx90a runs 64-wide wavefronts");
    assert!(report.launches >= 39);
}

#[test]
fn kernels_compile_for_32_wide_waves_too() {
    // RDNA (gfx10/11) runs 32-wide waves: the reductions loop from warpSize / 2 and must not
    // assume 64 (or 32) lanes.
    let Some(report) = selfcheck_for("gfx1030") else { return };
    eprintln!("{report}");
    assert!(report.passed(), "{report}");
    assert_eq!(report.wavefront_size, 32, "gfx1030 runs 32-wide wavefronts");
}
