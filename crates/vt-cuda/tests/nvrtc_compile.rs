//! NVRTC compiles the kernel files without a GPU (needs libnvrtc and the CUDA headers, e.g.
//! from .ci/kernels-cuda-deps; skipped with a note otherwise).

use vt_cuda::nvrtc::{self, Target};

fn nvrtc_ready() -> bool {
    if !nvrtc::available() {
        println!("SKIP: libnvrtc not found");
        return false;
    }
    if let Err(e) = nvrtc::include_dirs() {
        println!("SKIP: {e}");
        return false;
    }
    true
}

#[test]
fn rms_norm_compiles_for_sm_90_and_hits_the_cache_the_second_time() {
    if !nvrtc_ready() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("vt-nvrtc-test-{}", std::process::id()));
    let src = include_str!("../../../kernels-cuda/rms_norm.cu");
    let first =
        nvrtc::compile_in(Some(&dir), "rms_norm.cu", src, vt_cuda::kernels::HEADERS, Target::Cubin(90))
            .unwrap();
    assert!(!first.cached && first.bytes.len() > 100);
    let second =
        nvrtc::compile_in(Some(&dir), "rms_norm.cu", src, vt_cuda::kernels::HEADERS, Target::Cubin(90))
            .unwrap();
    assert!(second.cached);
    assert_eq!(first.bytes, second.bytes);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_compile_error_carries_the_nvrtc_log() {
    if !nvrtc_ready() {
        return;
    }
    let e = nvrtc::compile_in(
        None,
        "broken.cu",
        "extern \"C\" __global__ void k() { undeclared_thing(); }",
        &[],
        Target::Cubin(90),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("broken.cu") && e.contains("undeclared_thing"), "{e}");
}
