//! The typed entry points, one file per op. Each file holds the op's contract (shapes,
//! strides, dtypes, aliasing, errors) as the doc comment of its entry point, the argument
//! struct backends receive, and the validation. Backends do not re-validate.
//!
//! Common rules:
//! - every tensor must be on the queue's device;
//! - floating-point operands share one dtype (bf16, f16 or f32); lse tensors are f32;
//!   index tensors are i32 or i64 as stated; accumulation is f32; fp8 e4m3 operands
//!   (with their f32 block scales) only where an op says so (the `*Fp8` matmuls, QuantizeFp8);
//! - outputs must not overlap themselves or any input unless the op says otherwise;
//! - index values (slots, block ids, lengths) are checked here when they are readable on
//!   the host (the CPU device). On GPUs the kernels skip out-of-range indices instead, so
//!   a bad index never writes outside an output; it leaves the affected rows unwritten.

mod batched_matmul;
mod batched_matmul_fp8;
mod cache_indexer_keys;
mod concat_and_cache_mla;
mod concat_mla_nope_rope;
mod fused_norm_rope;
mod gather_mla_cache;
mod indexer_top_k;
mod layer_norm;
mod matmul_bt;
mod matmul_bt_fp8;
mod merge_attn_states;
mod mla_decode_attention;
mod prefill_attention;
mod quantize_fp8;
mod rms_norm;
mod rope_from_cache;
mod sparse_mla_attention;

pub use batched_matmul::*;
pub use batched_matmul_fp8::*;
pub use cache_indexer_keys::*;
pub use concat_and_cache_mla::*;
pub use concat_mla_nope_rope::*;
pub use fused_norm_rope::*;
pub use gather_mla_cache::*;
pub use indexer_top_k::*;
pub use layer_norm::*;
pub use matmul_bt::*;
pub use matmul_bt_fp8::*;
pub use merge_attn_states::*;
pub use mla_decode_attention::*;
pub use prefill_attention::*;
pub use quantize_fp8::*;
pub use rms_norm::*;
pub use rope_from_cache::*;
pub use sparse_mla_attention::*;
