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
//! - The fp8 block-scaled matmuls (MatmulBTFp8, BatchedMatmulFp8) and QuantizeFp8 are
//!   kernels of `kernels-cuda/fp8_matmul.cu` (see [`fp8_matmul`]): a weight-streaming
//!   kernel for weight-only decode, an e4m3 tensor-core kernel when both operands are fp8;
//!   or cuBLASLt's block-scaled fp8 GEMM (`cublaslt.rs`, where its layouts hold; `VT_FP8_LT`,
//!   on by default: `0` keeps the tensor-core kernel).
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
//!     CudaQueue::of(q, OpId::RmsNorm)?.run(OpId::RmsNorm, &plan(a)?) // the one launch layer
//! }
//!
//! /// Plain data, no device: what `ptx_check.rs` compares with the kernel's parameters.
//! pub(crate) fn plan(a: &RmsNormArgs<'_>) -> Result<Vec<Launch>> {
//!     let args: [Arg; 8] = [a.out.data_addr().into(), a.out.stride(0).into(), /* ... */];
//!     Ok(vec![Launch::new(&SRC, "rms_norm", a.x.dtype(), (grid, 1, 1), threads, args)]) // `rms_norm_bf16`, ...
//! }
//! ```
//!
//! then add `mod rms_norm;` and a line `OpImpl::RmsNorm(Arc::new(rms_norm::run))` in
//! [`kernel_ops`] (or name the op in [`OP_GAPS`]; a test fails on an op in neither), and a
//! sample call of `plan` in `ptx_check.rs` (a test fails on an op without one). Op files
//! hold no `unsafe` and call no driver function: `launch.rs` does the launches (scalar and
//! `#[repr(C)]` struct arguments, TMA descriptors, shared-memory limits, programmatic
//! dependent launches) and the cuBLAS calls.
//! The kernel file includes `common.cuh` (types, conversions, reductions) and defines
//! `extern "C"` kernels `{base}_bf16`, `{base}_f16`, `{base}_f32` (`VT_FOR_EACH_FLOAT`).
//! Kernels take element pointers of each view's first element plus explicit strides; they
//! skip out-of-range index values and never write outside their outputs. Arguments were
//! validated by vt-core: an op file only maps them to a launch (no re-validation). A new
//! header in `kernels-cuda/` is listed in [`kernels::HEADERS`]. `cargo xtask kernels`
//! compiles every kernel file for sm_80 and sm_90 without a GPU.

mod cublaslt;
mod device;
pub mod graph;
#[doc(hidden)]
pub mod kernels;
mod launch;
pub mod nccl;
pub mod nvrtc;
#[cfg(test)]
mod ptx_check;
mod queue;
mod scratch;

pub mod bench;

mod cache_indexer_keys;
mod concat_and_cache_mla;
mod concat_mla_nope_rope;
pub mod fp8_matmul;
mod fused_norm_rope;
mod gather_mla_cache;
pub mod indexer_top_k;
mod layer_norm;
mod matmul;
mod merge_attn_states;
pub mod mla_decode_attention;
pub mod prefill_attention;
mod rms_norm;
mod rope_from_cache;
pub mod skinny_gemm;
pub mod sparse_mla_attention;
#[cfg(test)]
mod test_util;

use std::sync::Arc;

use vt_core::registry::{register_backend, register_op};
use vt_core::{DeviceType, OpId, OpImpl, Probe};

pub use device::CudaBackend;
pub use queue::CudaQueue;

pub(crate) use kernels::KernelSource;
pub(crate) use launch::{Arg, Launch};

/// Ops the CUDA backend does not implement (the coverage test accepts exactly these).
///
/// None: every op has a CUDA implementation.
pub const OP_GAPS: &[OpId] = &[];

/// The ops that are NVRTC-compiled kernels (registered when NVRTC and the CUDA headers are
/// found).
pub fn kernel_ops() -> Vec<OpImpl> {
    vec![
        OpImpl::RmsNorm(Arc::new(rms_norm::run)),
        OpImpl::MlaDecodeAttention(Arc::new(mla_decode_attention::run)),
        OpImpl::RopeFromCache(Arc::new(rope_from_cache::run)),
        OpImpl::FusedNormRope(Arc::new(fused_norm_rope::run)),
        OpImpl::ConcatAndCacheMla(Arc::new(concat_and_cache_mla::run)),
        OpImpl::GatherMlaCache(Arc::new(gather_mla_cache::run)),
        OpImpl::ConcatMlaNopeRope(Arc::new(concat_mla_nope_rope::run)),
        OpImpl::PrefillAttention(Arc::new(prefill_attention::run)),
        OpImpl::MergeAttnStates(Arc::new(merge_attn_states::run)),
        OpImpl::MatmulBTFp8(Arc::new(fp8_matmul::run_matmul_bt)),
        OpImpl::BatchedMatmulFp8(Arc::new(fp8_matmul::run_batched)),
        OpImpl::QuantizeFp8(Arc::new(fp8_matmul::run_quantize)),
        OpImpl::IndexerTopK(Arc::new(indexer_top_k::run)),
        OpImpl::SparseMlaAttention(Arc::new(sparse_mla_attention::run)),
        OpImpl::CacheIndexerKeys(Arc::new(cache_indexer_keys::run)),
        OpImpl::LayerNorm(Arc::new(layer_norm::run)),
    ]
}

/// The ops that call cuBLAS (registered when libcublas is found).
pub fn cublas_ops() -> Vec<OpImpl> {
    vec![
        OpImpl::MatmulBT(Arc::new(matmul::matmul_bt)),
        OpImpl::BatchedMatmul(Arc::new(matmul::batched_matmul)),
    ]
}

/// Probes the CUDA driver and, when at least one device exists, registers the backend,
/// the NCCL communicator (libnccl itself is loaded only when a group is made) and every op
/// it can run: the kernels when NVRTC and the CUDA headers are found, the matmuls when
/// cuBLAS is. Never panics; a machine without CUDA gets [`Probe::Unavailable`].
pub fn register() -> Probe {
    let backend = match device::probe() {
        Ok(b) => b,
        Err(p) => return p,
    };
    let devices = backend.devices.len();
    register_backend(backend);
    vt_core::comm::register(DeviceType::Cuda, Arc::new(nccl::NcclTransport));

    match kernels_ready() {
        Ok(()) => kernel_ops().into_iter().for_each(|imp| register_op(DeviceType::Cuda, imp)),
        Err(e) => tracing::warn!("CUDA kernels not registered: {e}"),
    }
    // The matmuls need cuBLAS, and NVRTC for the rare view cuBLAS cannot take; a missing
    // NVRTC is reported by that call rather than hiding the matmuls.
    if device::library_present("cublas") {
        cublas_ops().into_iter().for_each(|imp| register_op(DeviceType::Cuda, imp));
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

#[cfg(test)]
mod coverage_tests {
    use super::*;

    /// Runs without a GPU: the tables `register` draws from cover every op or declare it.
    #[test]
    fn every_op_is_registered_or_declared_a_gap() -> vt_core::Result<()> {
        let ids: Vec<OpId> = kernel_ops().iter().chain(&cublas_ops()).map(OpImpl::id).collect();
        vt_core::check_coverage("cuda", &ids, OP_GAPS)
    }
}
