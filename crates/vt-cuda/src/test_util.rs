//! Helpers shared by the unit tests of the op files.

use vt_core::{DType, Device, Tensor};

/// A view of `mem` (host memory that outlives it; never read here) at element `offset`:
/// for tests of launch planning, which read views' shapes, strides and addresses only.
pub(crate) fn host_view<'a>(
    mem: &'a [u128],
    dt: DType,
    offset: i64,
    shape: &[i64],
    strides: &[i64],
) -> Tensor<'a> {
    let extent = (mem.len() * 16 / dt.size_of()) as i64;
    // SAFETY: `mem` spans `extent` elements of `dt` and outlives the view.
    let t = unsafe {
        Tensor::from_raw_parts(mem.as_ptr() as u64, extent, dt, Device::CPU, shape, strides, offset)
    };
    t.expect("a valid test view")
}

/// Whether NVRTC and the CUDA headers are here for the tests that compile kernels; prints
/// why such a test skips when not.
pub(crate) fn nvrtc_ready() -> bool {
    if !crate::nvrtc::available() {
        println!("SKIP: libnvrtc not found");
        return false;
    }
    if let Err(e) = crate::nvrtc::include_dirs() {
        println!("SKIP: {e}");
        return false;
    }
    true
}
