//! vt-cpu: the reference backend. Every op of [`vt_core::OpId::ALL`], written to be
//! obviously right rather than fast: f32 accumulation, bf16/f16/f32 storage, strided
//! element access through `host::HostView`, one rounding to the storage dtype per
//! stored value. GPU backends are checked against these implementations.
//!
//! Call [`register`] once at start-up (applications usually go through
//! `vt_backends::init`); it is idempotent.

mod attention;
mod backend;
mod host;

mod batched_matmul;
mod concat_and_cache_mla;
mod concat_mla_nope_rope;
mod fused_norm_rope;
mod gather_mla_cache;
mod matmul_bt;
mod merge_attn_states;
mod mla_decode_attention;
mod prefill_attention;
mod rms_norm;
mod rope_from_cache;

use std::sync::Arc;

use vt_core::registry::{register_backend, register_op};
use vt_core::{DeviceType, OpImpl, Probe};

/// Registers the CPU backend and every op for [`DeviceType::Cpu`]. Idempotent: calling
/// it again re-registers the same implementations (also after
/// `vt_core::registry::unregister_device`).
pub fn register() -> Probe {
    register_backend(Arc::new(backend::CpuBackend));
    let cpu = DeviceType::Cpu;
    register_op(cpu, OpImpl::MatmulBT(Arc::new(matmul_bt::run)));
    register_op(cpu, OpImpl::BatchedMatmul(Arc::new(batched_matmul::run)));
    register_op(cpu, OpImpl::RmsNorm(Arc::new(rms_norm::run)));
    register_op(cpu, OpImpl::RopeFromCache(Arc::new(rope_from_cache::run)));
    register_op(cpu, OpImpl::FusedNormRope(Arc::new(fused_norm_rope::run)));
    register_op(cpu, OpImpl::ConcatAndCacheMla(Arc::new(concat_and_cache_mla::run)));
    register_op(cpu, OpImpl::GatherMlaCache(Arc::new(gather_mla_cache::run)));
    register_op(cpu, OpImpl::ConcatMlaNopeRope(Arc::new(concat_mla_nope_rope::run)));
    register_op(cpu, OpImpl::MlaDecodeAttention(Arc::new(mla_decode_attention::run)));
    register_op(cpu, OpImpl::PrefillAttention(Arc::new(prefill_attention::run)));
    register_op(cpu, OpImpl::MergeAttnStates(Arc::new(merge_attn_states::run)));
    tracing::debug!(ops = vt_core::registered_ops(cpu).len(), "cpu backend registered");
    Probe::Registered { devices: 1 }
}
