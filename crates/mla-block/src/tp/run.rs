//! Running the tensor-parallel block: per-rank weights, the per-step forward of one rank,
//! and whole sequences under a schedule with one host thread per rank.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use vt_core::{Buffer, DType, Error, Queue, Result, Tensor};

use super::group::TpGroup;
use super::shard::shard_weights;
use crate::block::MlaBlock;
use crate::config::MlaConfig;
use crate::kv_cache::{KvCacheDtype, PagedKvCache};
use crate::metadata::{MlaBatchMetadata, StepSeq};
use crate::runner::{checked_schedule_forwards, RowPlan, RunOptions, RunStats, Schedule, SeqPart};
use crate::weights::{HostTensor, HostWeights, MlaWeightStore};
use crate::workspace::{MlaLimits, MlaWorkspace};
use vt_core::comm::{Communicator, Gate};

const OP: &str = "tensor-parallel MLA";

/// One step of one rank: the rank's block (its heads) writes its partial `o_proj` output
/// to `out`, then the communicator sums the partials of all ranks into `out` on every rank.
/// `hidden`, `meta` and the cache's contents are the same on every rank.
// `MlaBlock::forward`'s arguments plus the communicator: the one function over clippy's
// default limit of 7 (clippy.toml no longer raises it).
#[allow(clippy::too_many_arguments)]
pub fn forward_rank(
    block: &MlaBlock<'_>,
    comm: &dyn Communicator,
    q: &Queue,
    ws: &mut MlaWorkspace,
    hidden: &Tensor<'_>,
    meta: &MlaBatchMetadata,
    kv_cache: &Tensor<'_>,
    out: &Tensor<'_>,
) -> Result<()> {
    block.forward(q, ws, hidden, meta, kv_cache, out)?;
    comm.all_reduce_sum(q, out)
}

/// The weights of every rank of a group, each on its rank's device.
pub struct TpModel {
    cfg: MlaConfig,
    rank_cfg: MlaConfig,
    stores: Vec<MlaWeightStore>,
}

impl TpModel {
    /// Splits the full layer's host weights (see [`super::shard_weights`]) and uploads each
    /// rank's part to its queue's device. Errors if the heads do not split evenly.
    pub fn load(group: &TpGroup, cfg: &MlaConfig, w: &HostWeights) -> Result<TpModel> {
        let tp = group.tp();
        let mut stores = Vec::with_capacity(tp);
        let mut rank_cfg = *cfg;
        for (r, q) in group.queues().iter().enumerate() {
            let (c, hw) = shard_weights(cfg, w, tp, r)?;
            stores.push(MlaWeightStore::from_host(q, &c, &hw)?);
            rank_cfg = c;
        }
        Ok(TpModel { cfg: *cfg, rank_cfg, stores })
    }

    /// The full layer's config.
    pub fn config(&self) -> &MlaConfig {
        &self.cfg
    }

    /// One rank's config (`num_heads / tp` heads).
    pub fn rank_config(&self) -> &MlaConfig {
        &self.rank_cfg
    }

    /// Rank `r`'s weights.
    pub fn store(&self, r: usize) -> Option<&MlaWeightStore> {
        self.stores.get(r)
    }

    /// One block per rank; `fused` as [`MlaBlock::set_fused_norm_rope`].
    pub fn blocks(&self, fused: Option<bool>) -> Result<Vec<MlaBlock<'_>>> {
        self.stores
            .iter()
            .map(|s| {
                let mut b = MlaBlock::new(self.rank_cfg.dims, s.views(), self.cfg.rope.is_neox)?;
                b.set_fused_norm_rope(fused);
                Ok(b)
            })
            .collect()
    }
}

/// What [`run_steps_tp`] observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TpRunStats {
    /// Rank 0's forwards, context chunks and workspace allocations.
    pub run: RunStats,
    /// All-reduces each rank issued (one per forward).
    pub all_reduces: usize,
    /// Every rank ended with the same output bits.
    pub ranks_identical: bool,
}

/// [`crate::runner::run_schedule`] with every rank of `group`: S sequences of T tokens
/// (`hidden` `[S,T,H]`, `positions` `[S*T]`) under `schedule`. `blocks[r]` runs on rank r's
/// queue. Returns rank 0's `out` `[S,T,H]`.
pub fn run_schedule_tp(
    group: &TpGroup,
    blocks: &[MlaBlock<'_>],
    hidden: &HostTensor,
    positions: &[i64],
    schedule: &Schedule,
    opts: &RunOptions,
) -> Result<(HostTensor, TpRunStats)> {
    run_schedule_tp_with_progress(group, blocks, hidden, positions, schedule, opts, &|_, _| {})
}

/// [`run_schedule_tp`], with rank 0 calling `progress(done, total)` after each forward.
pub fn run_schedule_tp_with_progress(
    group: &TpGroup,
    blocks: &[MlaBlock<'_>],
    hidden: &HostTensor,
    positions: &[i64],
    schedule: &Schedule,
    opts: &RunOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(HostTensor, TpRunStats)> {
    let forwards = checked_schedule_forwards(hidden, schedule)?;
    run_steps_tp_with_progress(
        group,
        blocks,
        hidden,
        positions,
        &forwards,
        opts,
        KvCacheDtype::Auto,
        progress,
    )
}

/// [`run_schedule_tp_with_progress`] with every rank's KV cache in `cache`
/// (`--kv-cache-dtype`): `Auto` is the activation dtype, `Fp8DsMla` the 656-byte fp8 rows
/// (L = 512, R = 64). The replicated cache is encoded the same way on every rank (each
/// rank's latent rows are the same bits), so the ranks attend over the same fp8 bytes as
/// the TP = 1 block with that cache.
#[allow(clippy::too_many_arguments)]
pub fn run_schedule_tp_with_cache(
    group: &TpGroup,
    blocks: &[MlaBlock<'_>],
    hidden: &HostTensor,
    positions: &[i64],
    schedule: &Schedule,
    opts: &RunOptions,
    cache: KvCacheDtype,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(HostTensor, TpRunStats)> {
    let forwards = checked_schedule_forwards(hidden, schedule)?;
    run_steps_tp_with_progress(group, blocks, hidden, positions, &forwards, opts, cache, progress)
}

/// Runs `f(rank)` on one scoped thread per rank and returns the results in rank order.
/// The first rank to fail aborts the group and `gates` (so no peer waits for it forever),
/// and its error is the one returned.
pub(super) fn on_every_rank<T: Send>(
    group: &TpGroup,
    gates: &[&Gate],
    f: impl Fn(usize, &Queue, &dyn Communicator) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    if group.is_aborted() {
        return Err(Error::other(
            OP,
            "this tensor-parallel group was aborted by an earlier failed run (its communicators cannot be \
             reused): open a new TpGroup",
        ));
    }
    let first_failure = AtomicUsize::new(usize::MAX);
    let results: Vec<Result<T>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..group.tp())
            .map(|r| {
                let (f, first_failure) = (&f, &first_failure);
                sc.spawn(move || {
                    let q = &group.queues()[r];
                    let Some(comm) = group.comm(r) else {
                        return Err(Error::other(OP, format!("rank {r} has no communicator")));
                    };
                    let _guard = AbortOnPanic(group, gates);
                    let res = f(r, q, comm);
                    if res.is_err() {
                        let _ =
                            first_failure.compare_exchange(usize::MAX, r, Ordering::SeqCst, Ordering::SeqCst);
                        abort_all(group, gates);
                    }
                    res
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| h.join().unwrap_or_else(|_| Err(Error::other(OP, format!("rank {r} panicked")))))
            .collect()
    });
    let culprit = first_failure.load(Ordering::SeqCst);
    let mut out = Vec::with_capacity(results.len());
    let mut first_err = None;
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Ok(v) => out.push(v),
            Err(e) if r == culprit || (culprit == usize::MAX && first_err.is_none()) => {
                first_err = Some(Error::other(OP, format!("rank {r}: {e}")))
            }
            Err(e) if first_err.is_none() => first_err = Some(Error::other(OP, format!("rank {r}: {e}"))),
            Err(_) => {}
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Aborts every rank's communicator and the gates: a failed rank's peers then get errors
/// instead of waiting for it (on the host, or on the device for NCCL).
fn abort_all(group: &TpGroup, gates: &[&Gate]) {
    group.abort();
    gates.iter().for_each(|g| g.abort());
}

/// Aborts the group if the rank's thread unwinds, so its peers do not wait for it.
struct AbortOnPanic<'a>(&'a TpGroup, &'a [&'a Gate]);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            abort_all(self.0, self.1);
        }
    }
}

/// [`crate::runner::run_steps`] with every rank of `group`, one host thread per rank: each
/// rank stages the same inputs, keeps its own paged latent cache (replicated: every rank
/// writes the same rows) and workspace, and ends each forward with an all-reduce of its
/// output rows. Returns rank 0's `out` `[S,T,H]`.
pub fn run_steps_tp(
    group: &TpGroup,
    blocks: &[MlaBlock<'_>],
    hidden: &HostTensor,
    positions: &[i64],
    forwards: &[Vec<SeqPart>],
    opts: &RunOptions,
) -> Result<(HostTensor, TpRunStats)> {
    run_steps_tp_with_progress(
        group,
        blocks,
        hidden,
        positions,
        forwards,
        opts,
        KvCacheDtype::Auto,
        &|_, _| {},
    )
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run_steps_tp_with_progress(
    group: &TpGroup,
    blocks: &[MlaBlock<'_>],
    hidden: &HostTensor,
    positions: &[i64],
    forwards: &[Vec<SeqPart>],
    opts: &RunOptions,
    cache: KvCacheDtype,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(HostTensor, TpRunStats)> {
    check_rank_blocks(OP, group, blocks)?;
    for (r, (b, q)) in blocks.iter().zip(group.queues()).enumerate() {
        if b.device() != q.device() || b.dims() != blocks[0].dims() || b.dtype() != blocks[0].dtype() {
            return Err(Error::invalid(
                OP,
                "blocks",
                format!(
                    "block {r} ({} {} on {}) does not match rank {r}'s queue on {} or block 0",
                    b.dtype(),
                    b.dims().num_heads,
                    b.device(),
                    q.device()
                ),
            ));
        }
    }
    let plan = RowPlan::new(OP, &blocks[0], hidden, positions, forwards, opts)?;
    let cache_dt = cache.resolve(blocks[0].dtype())?;
    let results = on_every_rank(group, &[], |r, q, comm| {
        let block = &blocks[r];
        let mut done = 0;
        plan.run_with_cache(q, block, positions, forwards, opts, cache_dt, |ws, xin, meta, cache, yout| {
            forward_rank(block, comm, q, ws, xin, meta, cache, yout)?;
            done += 1;
            if r == 0 {
                progress(done, forwards.len());
            }
            Ok(())
        })
    })?;
    Ok(rank0_result(&plan, blocks[0].dtype(), &results))
}

/// Errors (naming `op`) unless `blocks` holds one block per rank of `group`.
pub(super) fn check_rank_blocks(op: &'static str, group: &TpGroup, blocks: &[MlaBlock<'_>]) -> Result<()> {
    if blocks.len() != group.tp() || blocks.is_empty() {
        return Err(Error::invalid(
            op,
            "blocks",
            format!("{} blocks for {} ranks", blocks.len(), group.tp()),
        ));
    }
    Ok(())
}

/// Rank 0's `out` `[S,T,H]` and stats from every rank's output rows (in `plan`'s staged
/// order) and stats, shared by the TP and DCP runs: each forward ends with one all-reduce,
/// and the ranks must agree bit for bit.
pub(super) fn rank0_result(
    plan: &RowPlan,
    dt: DType,
    results: &[(Vec<u8>, RunStats)],
) -> (HostTensor, TpRunStats) {
    let (out0, stats0) = &results[0];
    let ranks_identical = results.iter().all(|(o, _)| o == out0);
    (
        plan.unstage(dt, out0),
        TpRunStats { run: stats0.clone(), all_reduces: stats0.forwards, ranks_identical },
    )
}

/// Sizes of [`bench_decode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeBenchOptions {
    /// Sequences decoding together (one token each per step).
    pub batch: i64,
    /// Tokens cached per sequence before the timed steps (prefilled through the block).
    pub context: i64,
    /// Untimed decode steps first.
    pub warmup: usize,
    /// Timed decode steps per round.
    pub steps: usize,
    /// Rounds; the median round is reported.
    pub rounds: usize,
    /// Tokens per KV cache block.
    pub block_size: i64,
    /// Prefill token budget of one forward while filling the cache.
    pub prefill_tokens: i64,
}

impl DecodeBenchOptions {
    /// Checks the sizes (errors name `op`) and returns how many positions each sequence
    /// takes, `context` plus every decode step, at most `max_position` (the rope's). Shared
    /// by [`bench_decode`] and [`crate::layers::bench_decode_layers`].
    pub(crate) fn checked_positions(&self, op: &'static str, max_position: i64) -> Result<i64> {
        crate::dims::check_positive(
            op,
            &[
                ("batch", self.batch),
                ("context", self.context),
                ("block_size", self.block_size),
                ("prefill_tokens", self.prefill_tokens),
            ],
        )?;
        if self.steps == 0 || self.rounds == 0 {
            return Err(Error::invalid(op, "steps", "steps and rounds must be > 0"));
        }
        let decode_steps = self
            .steps
            .checked_mul(self.rounds)
            .and_then(|n| n.checked_add(self.warmup))
            .and_then(|n| i64::try_from(n).ok())
            .ok_or_else(|| Error::invalid(op, "steps", "warmup + steps * rounds overflows"))?;
        let total = self
            .context
            .checked_add(decode_steps)
            .ok_or_else(|| Error::invalid(op, "context", "context + decode steps overflows"))?;
        if total > max_position {
            return Err(Error::invalid(
                op,
                "context",
                format!("context + decode steps = {total} exceed the {max_position} rope positions"),
            ));
        }
        Ok(total)
    }

    /// Whole sequences per prefill forward (at least one, at most `batch`) while filling
    /// the cache, and that forward's rows. Call after [`Self::checked_positions`].
    pub(crate) fn prefill_seqs_and_rows(&self) -> (i64, i64) {
        let seqs = (self.prefill_tokens / self.context).clamp(1, self.batch);
        (seqs, seqs * self.context)
    }
}

/// The median and the fastest of the rounds' times (at least one round).
pub(crate) fn median_and_fastest(rounds_ms: &[f64]) -> (f64, f64) {
    let mut sorted = rounds_ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    (sorted[sorted.len() / 2], sorted[0])
}

impl Default for DecodeBenchOptions {
    fn default() -> Self {
        DecodeBenchOptions {
            batch: 64,
            context: 1024,
            warmup: 5,
            steps: 20,
            rounds: 5,
            block_size: 64,
            prefill_tokens: 8192,
        }
    }
}

/// What [`bench_decode`] measured: wall time per decode step (all ranks' forwards and the
/// all-reduce, from a common start until every rank's queue has finished).
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeBenchResult {
    pub tp: usize,
    /// The median round's time per step, milliseconds.
    pub ms_per_step: f64,
    /// The fastest round's time per step.
    pub min_ms_per_step: f64,
    /// Every round's time per step.
    pub rounds_ms: Vec<f64>,
}

/// Times decode steps of `blocks` (one per rank of `group`): fills each sequence's cache
/// with `context` tokens by prefill forwards, runs `warmup` decode steps, then `rounds`
/// rounds of `steps` decode steps of `batch` sequences each. Inputs are random
/// (`seed`), the same on every rank.
pub fn bench_decode(
    group: &TpGroup,
    blocks: &[MlaBlock<'_>],
    opts: &DecodeBenchOptions,
    seed: u64,
) -> Result<DecodeBenchResult> {
    let o = *opts;
    check_rank_blocks(OP, group, blocks)?;
    let total = o.checked_positions("bench_decode", blocks[0].max_position())?;
    let d = *blocks[0].dims();
    let dt = blocks[0].dtype();
    let (seqs_per_prefill, prefill_rows) = o.prefill_seqs_and_rows();
    let mut rng = super::random::SplitMix64::new(seed);
    let prefill_hidden =
        super::random::uniform_bytes(&mut rng, dt, (prefill_rows * d.hidden_size) as usize, 1.0);
    let decode_hidden = super::random::uniform_bytes(&mut rng, dt, (o.batch * d.hidden_size) as usize, 1.0);
    let (start, end) = (Gate::new(group.tp()), Gate::new(group.tp()));
    let times = on_every_rank(group, &[&start, &end], |r, q, comm| {
        let block = &blocks[r];
        let bs = o.block_size;
        let blocks_per_seq = (total + bs - 1) / bs;
        let mut cache = PagedKvCache::new(q, dt, o.batch * blocks_per_seq, bs, d.cache_row_dim())?;
        let mut ws = MlaWorkspace::new(MlaLimits {
            max_tokens: prefill_rows.max(o.batch),
            max_seqs: o.batch,
            max_blocks_per_seq: blocks_per_seq,
            chunk_workspace_tokens: prefill_rows,
        })?;
        let ids: Vec<_> = (0..o.batch).map(|_| cache.add_sequence()).collect();
        let px = Buffer::from_bytes(q, dt, &[prefill_rows, d.hidden_size], &prefill_hidden)?;
        let py = Buffer::nan(q, dt, &[prefill_rows, d.hidden_size])?;
        let dx = Buffer::from_bytes(q, dt, &[o.batch, d.hidden_size], &decode_hidden)?;
        let dy = Buffer::nan(q, dt, &[o.batch, d.hidden_size])?;
        let mut meta = MlaBatchMetadata::default();
        let ctx_pos: Vec<i64> = (0..o.context).collect();
        for group_ids in ids.chunks(seqs_per_prefill as usize) {
            let seqs: Vec<StepSeq<'_>> =
                group_ids.iter().map(|&seq| StepSeq { seq, positions: &ctx_pos, decode: false }).collect();
            meta.plan(&mut cache, &seqs, prefill_rows)?;
            let rows = meta.num_tokens();
            let (xin, yout) = (px.view().slice(0, 0, rows)?, py.view().slice(0, 0, rows)?);
            forward_rank(block, comm, q, &mut ws, &xin, &meta, &cache.view(), &yout)?;
        }
        let mut pos = o.context;
        let mut step =
            |meta: &mut MlaBatchMetadata, ws: &mut MlaWorkspace, cache: &mut PagedKvCache| -> Result<()> {
                let p = [pos];
                let seqs: Vec<StepSeq<'_>> =
                    ids.iter().map(|&seq| StepSeq { seq, positions: &p, decode: true }).collect();
                meta.plan(cache, &seqs, prefill_rows)?;
                forward_rank(block, comm, q, ws, &dx.view(), meta, &cache.view(), &dy.view())?;
                pos += 1;
                Ok(())
            };
        for _ in 0..o.warmup {
            step(&mut meta, &mut ws, &mut cache)?;
        }
        q.synchronize()?;
        let mut rounds = Vec::with_capacity(o.rounds);
        for _ in 0..o.rounds {
            start.wait()?;
            let t0 = Instant::now();
            for _ in 0..o.steps {
                step(&mut meta, &mut ws, &mut cache)?;
            }
            q.synchronize()?;
            end.wait()?;
            rounds.push(t0.elapsed().as_secs_f64() * 1e3 / o.steps as f64);
        }
        let out = dy.to_f64(q)?;
        if out.iter().any(|v| !v.is_finite()) {
            return Err(Error::other("bench_decode", "a decode step produced a non-finite output"));
        }
        Ok(rounds)
    })?;
    // A round lasts until its slowest rank has finished.
    let rounds_ms: Vec<f64> = (0..o.rounds).map(|i| times.iter().map(|t| t[i]).fold(0.0, f64::max)).collect();
    let (ms_per_step, min_ms_per_step) = median_and_fastest(&rounds_ms);
    Ok(DecodeBenchResult { tp: group.tp(), ms_per_step, min_ms_per_step, rounds_ms })
}
