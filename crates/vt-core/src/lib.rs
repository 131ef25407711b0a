//! vt-core: the backend-independent half of vt.
//!
//! - [`DType`], [`DeviceType`], [`Device`]: what memory holds and where it lives.
//! - [`Tensor`]: a non-owning strided view (no copies for slices, transposes, reshapes).
//! - [`Buffer`], [`Queue`]: owning device memory and in-order work queues, provided by a
//!   registered [`Backend`].
//! - [`registry`]: (OpId, DeviceType) -> implementation, filled by backends at start-up.
//! - [`comm`]: the tensor-parallel [`comm::Communicator`]s backends register per device type.
//! - [`ops`]: one validated, typed entry point per op; its doc comment is the contract.
//! - [`graph`]: recording a queue's work once and replaying it ([`Graph`], CUDA graphs),
//!   and device timestamps ([`Event`]).
//! - [`fp8_block`]: DeepSeek's block-scaled fp8 (weights 128 x 128, activations 1 x 128).
//! - [`flags`]: the one place `VT_*` environment flags are read.
//! - [`kernel_cache`]: the disk cache of run-time compiled GPU code (CUDA and HIP backends).
//!
//! See `docs/architecture.md` for the registry's life cycle.

mod backend;
pub mod comm;
mod device;
mod dtype;
mod error;
pub mod flags;
pub mod fp8_block;
pub mod fp8_ds_mla;
pub mod graph;
pub mod kernel_cache;
pub mod ops;
pub mod registry;
mod tensor;
mod validate;

pub use backend::{encode_f64, f32_to_f8e4m3, host_bytes, Backend, Buffer, Queue, QueueImpl};
pub use device::{Device, DeviceType};
pub use dtype::{DType, Element};
pub use error::{Error, Result, Subject};
pub use graph::{Event, EventImpl, Graph, GraphImpl};
pub use ops::*;
pub use registry::{check_coverage, op_registered, registered_ops, OpId, OpImpl, Probe};
pub use tensor::{
    checked_bytes, checked_numel, contiguous_strides, f8e4m3_to_f32, for_each_offset,
    for_each_strided_offset, read_host_elem, Tensor, MAX_RANK,
};
