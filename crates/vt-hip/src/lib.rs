//! vt-hip: the ROCm/HIP backend of vt.
//!
//! Compiled and checked without AMD hardware; never run on an AMD GPU (see
//! `docs/backends.md`, HIP section).
//!
//! - HIP, hiprtc and rocBLAS are loaded at run time ([`sys`]: a small table of C functions
//!   opened with libloading), so building this crate and starting its binaries need no ROCm.
//! - Layering as in cudarc: [`sys`] (the raw table, the one place that resolves symbols),
//!   `driver` (thin `Result` wrappers and owning types: streams, modules, rocBLAS handles),
//!   `backend` (the safe [`vt_core::Backend`] and queue), and one file per op that plans
//!   its launches as plain data (`launch.rs`) before running them.
//! - GEMMs go to rocBLAS (`rocblas_gemm_strided_batched_ex`, f32 compute); the other ops
//!   are kernels from `kernels-hip/` (one `.hip` file per op), compiled by hiprtc on first
//!   use for the device's own target and cached on disk ([`compile`]).
//!
//! [`register`] probes the runtime: no library gives [`Probe::Unavailable`], a library
//! without a device gives [`Probe::NoDevice`]; in both cases nothing is registered.

pub mod compile;
mod driver;
pub mod launch;
pub mod selfcheck;
pub mod sys;

mod backend;
mod codeobject;
mod gemm;

mod batched_matmul;
mod cache_indexer_keys;
mod concat_and_cache_mla;
mod concat_mla_nope_rope;
mod fp8_matmul;
mod fused_norm_rope;
mod gather_mla_cache;
mod indexer_top_k;
mod layer_norm;
mod matmul_bt;
mod merge_attn_states;
mod mla_decode_attention;
mod prefill_attention;
mod rms_norm;
mod rope_from_cache;
mod sparse_mla_attention;

use std::sync::Arc;

use vt_core::registry::{register_backend, register_op};
use vt_core::{DeviceType, OpId, OpImpl, Probe};

pub use backend::{HipBackend, HipQueue};
pub use driver::DeviceInfo;
pub use sys::Libraries;

/// Probes the HIP runtime at the usual places ([`Libraries::default`]) and registers the
/// backend and its ops when at least one AMD device is present.
pub fn register() -> Probe {
    register_with(&Libraries::default())
}

/// [`register`] with explicit library candidates (tests point these at names that do not
/// exist to check the "no ROCm" path).
pub fn register_with(libs: &Libraries) -> Probe {
    let (hip, opened) = match sys::load_hip(&libs.hip) {
        Ok(x) => x,
        Err(e) => {
            tracing::debug!("HIP runtime not found: {e}");
            return Probe::Unavailable { detail: format!("libamdhip64 not found ({e})") };
        }
    };
    let base = driver::Runtime { hip, rtc: None, blas: None };
    let version = base.version().unwrap_or_else(|e| format!("unknown version: {e}"));
    let loaded = format!("{} (HIP {version}) loaded", opened.name);
    let init = base.init();
    let count = match base.device_count() {
        Ok(n) => n,
        Err(e) => {
            let e = match e {
                vt_core::Error::Backend { msg, .. } => msg,
                other => other.to_string(),
            };
            let detail = format!("{loaded}; hipInit: {} ({init}); {e}", base.error_name(init));
            tracing::debug!("{detail}");
            return Probe::NoDevice { detail };
        }
    };
    if count == 0 {
        return Probe::NoDevice { detail: format!("{loaded}; hipGetDeviceCount reports 0 devices") };
    }
    let mut devices = Vec::with_capacity(count);
    for ordinal in 0..count {
        match base.device_info(ordinal) {
            Ok(d) => devices.push(d),
            Err(e) => {
                return Probe::Unavailable {
                    detail: format!("{loaded}; {count} device(s) but unusable: {e}"),
                }
            }
        }
    }
    let rtc = match sys::load_hiprtc(&opened, &libs.hiprtc) {
        Ok((api, name)) => {
            tracing::debug!("hiprtc from {name}");
            Some(api)
        }
        Err(e) => {
            tracing::warn!(
                "hiprtc not found ({e}): HIP kernels cannot be compiled; only GEMMs are registered"
            );
            None
        }
    };
    let blas = match sys::load_rocblas(&libs.rocblas) {
        Ok((api, name)) => {
            tracing::debug!("rocBLAS from {name}");
            Some(api)
        }
        Err(e) => {
            tracing::warn!("rocBLAS not found ({e}): GEMMs use the batched_matmul kernel");
            None
        }
    };
    if rtc.is_none() && blas.is_none() {
        return Probe::Unavailable { detail: format!("{loaded}, but neither hiprtc nor rocBLAS was found") };
    }
    let rt = driver::Runtime { hip, rtc, blas };
    let names: Vec<String> = devices.iter().map(|d| format!("{} ({})", d.name, d.arch)).collect();
    let description = format!(
        "hip: {loaded}; {}; {}",
        if rtc.is_some() { "hiprtc kernels" } else { "no hiprtc" },
        if blas.is_some() { "rocBLAS" } else { "no rocBLAS" }
    );
    tracing::info!("HIP devices: {}", names.join(", "));
    let shared = Arc::new(backend::Shared::new(rt, devices, description));
    register_backend(Arc::new(HipBackend { shared }));
    register_ops(rtc.is_some());
    Probe::Registered { devices: count }
}

/// Ops the HIP backend does not implement (the coverage test accepts exactly these): none.
pub const OP_GAPS: &[OpId] = &[];

/// The GEMMs: rocBLAS, or the batched_matmul kernel without it (always registered).
pub fn gemm_ops() -> Vec<OpImpl> {
    vec![OpImpl::MatmulBT(Arc::new(matmul_bt::run)), OpImpl::BatchedMatmul(Arc::new(batched_matmul::run))]
}

/// The hiprtc-compiled kernels (registered when hiprtc is present).
pub fn kernel_ops() -> Vec<OpImpl> {
    vec![
        OpImpl::RmsNorm(Arc::new(rms_norm::run)),
        OpImpl::RopeFromCache(Arc::new(rope_from_cache::run)),
        OpImpl::FusedNormRope(Arc::new(fused_norm_rope::run)),
        OpImpl::ConcatAndCacheMla(Arc::new(concat_and_cache_mla::run)),
        OpImpl::GatherMlaCache(Arc::new(gather_mla_cache::run)),
        OpImpl::ConcatMlaNopeRope(Arc::new(concat_mla_nope_rope::run)),
        OpImpl::MlaDecodeAttention(Arc::new(mla_decode_attention::run)),
        OpImpl::PrefillAttention(Arc::new(prefill_attention::run)),
        OpImpl::MergeAttnStates(Arc::new(merge_attn_states::run)),
        OpImpl::MatmulBTFp8(Arc::new(fp8_matmul::run_matmul_bt)),
        OpImpl::BatchedMatmulFp8(Arc::new(fp8_matmul::run_batched)),
        OpImpl::QuantizeFp8(Arc::new(fp8_matmul::run_quantize)),
        OpImpl::LayerNorm(Arc::new(layer_norm::run)),
        OpImpl::SparseMlaAttention(Arc::new(sparse_mla_attention::run)),
        OpImpl::IndexerTopK(Arc::new(indexer_top_k::run)),
        OpImpl::CacheIndexerKeys(Arc::new(cache_indexer_keys::run)),
    ]
}

/// Registers every op (`kernels`: hiprtc is present), or only the GEMMs (rocBLAS alone).
fn register_ops(kernels: bool) {
    let mut ops = gemm_ops();
    if kernels {
        ops.extend(kernel_ops());
    }
    ops.into_iter().for_each(|imp| register_op(DeviceType::Hip, imp));
}

#[cfg(test)]
mod coverage_tests {
    use super::*;

    /// Runs without a GPU: the tables `register` draws from cover every op or declare it.
    #[test]
    fn every_op_is_registered_or_declared_a_gap() -> vt_core::Result<()> {
        let ids: Vec<OpId> = gemm_ops().iter().chain(&kernel_ops()).map(OpImpl::id).collect();
        vt_core::check_coverage("hip", &ids, OP_GAPS)
    }
}
