//! Tensor parallelism of the MLA block across the devices of one host, sharded as vLLM
//! shards DeepSeek's attention: the heads are split evenly over `tp` ranks.
//!
//! - Per rank ([`shard_weights`]): `q_b_proj` (or `q_proj`) and `kv_b_proj` column-parallel
//!   (the rows of the rank's heads; `W_UK_T` / `W_UV` absorbed from them), `o_proj`
//!   row-parallel (the input columns of the rank's heads), the A-projections and both
//!   layernorms replicated. Each rank runs the ordinary [`MlaBlock`](crate::MlaBlock) with
//!   `num_heads / tp` heads and its own paged latent cache (replicated: the latent is shared
//!   by all heads, so every rank writes the same rows, as upstream does for MLA), in the
//!   activation dtype or fp8_ds_mla ([`run_schedule_tp_with_cache`]).
//! - After `o_proj` each rank holds a partial sum over its heads; a [`Communicator`] sums
//!   them in place on every rank ([`forward_rank`]).
//! - One host thread per rank in one process ([`run_steps_tp`], [`bench_decode`]): a
//!   [`TpGroup`] holds one queue and one communicator per rank. Communicators are a
//!   per-device service the backends register (`vt_core::comm`): NCCL on CUDA
//!   ([`Transport::Nccl`], one GPU per rank, from vt-cuda) or the host communicator
//!   ([`Transport::Host`], from vt-cpu; the CPU's, and any GPU's to share it among ranks).
//!   This crate names no backend.
//!
//! ```ignore
//! let group = TpGroup::open(DeviceType::Cuda, 2, Transport::Auto)?;  // NCCL, cuda:0 and cuda:1
//! let model = TpModel::load(&group, &cfg, &host_weights)?;          // split + upload per rank
//! let blocks = model.blocks(None)?;
//! let (out, stats) = run_schedule_tp(&group, &blocks, &hidden, &positions, &schedule, &opts)?;
//! ```

pub mod dcp;
mod group;
mod parity;
pub(crate) mod random;
mod run;
mod shard;

pub use group::{device_count, TpGroup, Transport};
pub use parity::{compare_tp, compare_tp_against, rel_frobenius, tp1_reference, TpCase, TpComparison};
pub use random::RandomLayerSpec;
pub(crate) use run::median_and_fastest;
pub use run::{
    bench_decode, forward_rank, run_schedule_tp, run_schedule_tp_with_cache, run_schedule_tp_with_progress,
    run_steps_tp, DecodeBenchOptions, DecodeBenchResult, TpModel, TpRunStats,
};
pub use shard::{check_tp, head_range, rank_dims, shard_weights};
pub use vt_core::comm::{Communicator, ABORTED};
