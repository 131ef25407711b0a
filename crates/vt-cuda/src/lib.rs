//! vt-cuda: the CUDA backend of vt.
//!
//! Built on cudarc with dynamic loading, so it compiles on machines with no CUDA and finds
//! libcuda, libnvrtc and libcublas at run time. [`register`] probes the driver (checking
//! that the library loads before cudarc touches it), and only when a device exists
//! registers the [`vt_core::Backend`] (device memory, one stream per queue, copies) and
//! the ops.
//!
//! - MatmulBT and BatchedMatmul call cuBLAS (`cublasGemmStridedBatchedEx`, f32 compute, no
//!   TF32) on the views as they come, picking transpose flags and leading dimensions from
//!   the strides (see `matmul.rs`); views cuBLAS cannot express use a kernel.
//! - Every other op is a kernel in `kernels-cuda/`, compiled at run time by NVRTC for the
//!   device's architecture and cached on disk (see [`nvrtc`]).
//! - No op allocates device memory, reads device memory back or waits for the device: a
//!   sequence of ops can be captured in a CUDA graph once modules are loaded (warm-up);
//!   [`graph::capture`] does that, and its capture mode fails if an op syncs.
//!
//! # How an op file plugs in
//!
//! One file per op (or small family) in `src/`, named like the op, with one kernel file in
//! `kernels-cuda/` of the same name:
//!
//! ```ignore
//! // src/rms_norm.rs
//! static SRC: KernelSource = kernel_source!("rms_norm"); // embeds kernels-cuda/rms_norm.cu
//!
//! pub(crate) fn run(q: &Queue, a: &RmsNormArgs<'_>) -> Result<()> {
//!     let cq = CudaQueue::of(q, "RmsNorm")?;              // this backend's queue
//!     let f = cq.function(&SRC, "rms_norm", a.x.dtype())?; // `rms_norm_bf16`, compiled once
//!     // SAFETY: the arguments match the kernel's parameters; vt-core validated the views.
//!     unsafe { cq.launch("RmsNorm", &f, cfg((grid, 1, 1), threads, smem), &[a.out.data_addr().into(), ...]) }
//! }
//! ```
//!
//! then add `mod rms_norm;` and a line `op!(RmsNorm, rms_norm::run)` in [`register`].
//! The kernel file includes `common.cuh` (types, conversions, reductions) and defines
//! `extern "C"` kernels `{base}_bf16`, `{base}_f16`, `{base}_f32` (`VT_FOR_EACH_FLOAT`).
//! Kernels take element pointers of each view's first element plus explicit strides; they
//! skip out-of-range index values and never write outside their outputs. Arguments were
//! validated by vt-core: an op file only maps them to a launch (no re-validation). A new
//! header in `kernels-cuda/` is listed in [`kernels::HEADERS`]. `cargo xtask kernels`
//! compiles every kernel file for sm_80 and sm_90 without a GPU.

mod device;
pub mod graph;
#[doc(hidden)]
pub mod kernels;
pub mod nccl;
pub mod nvrtc;
mod queue;

pub mod bench;

mod concat_and_cache_mla;
mod concat_mla_nope_rope;
mod fused_norm_rope;
mod gather_mla_cache;
mod matmul;
mod merge_attn_states;
pub mod mla_decode_attention;
pub mod prefill_attention;
mod rms_norm;
mod rope_from_cache;

use std::sync::Arc;

use vt_core::registry::{register_backend, register_op};
use vt_core::{DeviceType, OpImpl, Probe};

pub use device::CudaBackend;
pub use queue::CudaQueue;

pub(crate) use kernels::KernelSource;
pub(crate) use queue::{cfg, Arg};

/// Probes the CUDA driver and, when at least one device exists, registers the backend and
/// every op it can run: the kernels when NVRTC and the CUDA headers are found, the matmuls
/// when cuBLAS is. Never panics; a machine without CUDA gets [`Probe::Unavailable`].
pub fn register() -> Probe {
    let backend = match device::probe() {
        Ok(b) => b,
        Err(p) => return p,
    };
    let devices = backend.devices.len();
    register_backend(backend);

    macro_rules! op {
        ($id:ident, $f:path) => {
            register_op(DeviceType::Cuda, OpImpl::$id(Arc::new($f)))
        };
    }

    match kernels_ready() {
        Ok(()) => {
            op!(RmsNorm, rms_norm::run);
            op!(MlaDecodeAttention, mla_decode_attention::run);
            op!(RopeFromCache, rope_from_cache::run);
            op!(FusedNormRope, fused_norm_rope::run);
            op!(ConcatAndCacheMla, concat_and_cache_mla::run);
            op!(GatherMlaCache, gather_mla_cache::run);
            op!(ConcatMlaNopeRope, concat_mla_nope_rope::run);
            op!(PrefillAttention, prefill_attention::run);
            op!(MergeAttnStates, merge_attn_states::run);
        }
        Err(e) => tracing::warn!("CUDA kernels not registered: {e}"),
    }
    // The matmuls need cuBLAS, and NVRTC for the rare view cuBLAS cannot take; a missing
    // NVRTC is reported by that call rather than hiding the matmuls.
    if device::library_present("cublas") {
        op!(MatmulBT, matmul::matmul_bt);
        op!(BatchedMatmul, matmul::batched_matmul);
    } else {
        tracing::warn!("libcublas not found: MatmulBT and BatchedMatmul not registered on CUDA");
    }
    Probe::Registered { devices }
}

/// NVRTC loads and finds the CUDA headers.
fn kernels_ready() -> vt_core::Result<()> {
    nvrtc::version()?;
    nvrtc::include_dirs().map(|_| ())
}

/// Grid size for a grid-stride loop over `n` independent rows or elements: one block each,
/// capped (the kernels loop over the rest).
pub(crate) fn grid_1d(n: i64) -> u32 {
    n.clamp(1, 1 << 20) as u32
}

/// A view's kernel arguments in the kernels' order: first-element address, then the strides
/// of its first two dims (in elements). Views of other ranks pass their strides by hand.
pub(crate) fn view_args(t: &vt_core::Tensor<'_>) -> [Arg; 3] {
    [t.data_addr().into(), t.stride(0).into(), t.stride(1).into()]
}

/// [`view_args`] of an optional lse view; a null address (and zero strides) when absent,
/// which the kernels read as "do not write lse".
pub(crate) fn optional_lse(lse: Option<&vt_core::Tensor<'_>>) -> [Arg; 3] {
    lse.map_or([0u64.into(), 0i64.into(), 0i64.into()], view_args)
}
