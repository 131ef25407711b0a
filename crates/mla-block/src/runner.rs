//! Running whole sequences through the block under a schedule of prefill and decode steps:
//! what `vt-mla run` does, as a library function the tests share.

use std::fmt;
use std::str::FromStr;

use vt_core::{Buffer, DType, Error, Queue, Result, Tensor};

use crate::block::MlaBlock;
use crate::kv_cache::PagedKvCache;
use crate::metadata::{MlaBatchMetadata, StepSeq};
use crate::weights::HostTensor;
use crate::workspace::{MlaLimits, MlaWorkspace};

/// One entry of a schedule, taken by every sequence together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The next N tokens in one forward (chunked prefill when earlier tokens are cached).
    Prefill(i64),
    /// N one-token decode forwards.
    Decode(i64),
}

/// `prefill:N,decode:N,...`: how each sequence's T tokens are split into steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule(pub Vec<Step>);

impl Schedule {
    /// All T tokens in one prefill (the default).
    pub fn all_at_once(t: i64) -> Schedule {
        Schedule(vec![Step::Prefill(t)])
    }

    /// Tokens the schedule covers (saturating at `i64::MAX`; see [`Schedule::checked_total`]).
    pub fn total(&self) -> i64 {
        self.checked_total().unwrap_or(i64::MAX)
    }

    /// Tokens the schedule covers, `None` when the sum overflows i64.
    pub fn checked_total(&self) -> Option<i64> {
        self.0.iter().try_fold(0i64, |acc, s| match s {
            Step::Prefill(n) | Step::Decode(n) => acc.checked_add(*n),
        })
    }

    /// The schedule covers exactly `t` tokens.
    pub fn check(&self, t: i64) -> Result<()> {
        if let Some(s) = self.0.iter().find(|s| matches!(s, Step::Prefill(n) | Step::Decode(n) if *n <= 0)) {
            return Err(Error::invalid("Schedule", "schedule", format!("{s:?}: every count must be > 0")));
        }
        let Some(total) = self.checked_total() else {
            return Err(Error::invalid(
                "Schedule",
                "schedule",
                format!("`{self}`: the sum of the counts overflows i64 (each sequence has {t} tokens)"),
            ));
        };
        if total != t {
            return Err(Error::invalid(
                "Schedule",
                "schedule",
                format!("`{self}` covers {total} tokens but each sequence has {t}"),
            ));
        }
        Ok(())
    }

    /// The forwards the schedule expands to: `(tokens per sequence, decode)`.
    pub fn forwards(&self) -> impl Iterator<Item = (i64, bool)> + '_ {
        self.0.iter().flat_map(|s| match *s {
            Step::Prefill(n) => vec![(n, false)],
            Step::Decode(n) => vec![(1, true); n.max(0) as usize],
        })
    }
}

impl FromStr for Schedule {
    type Err = Error;

    fn from_str(s: &str) -> Result<Schedule> {
        let bad = |msg: String| Error::invalid("Schedule", "schedule", msg);
        let mut steps = Vec::new();
        for part in s.split(',').map(str::trim) {
            let (kind, n) = part
                .split_once(':')
                .ok_or_else(|| bad(format!("`{part}` is not `prefill:N` or `decode:N`")))?;
            let n: i64 = n.trim().parse().map_err(|_| bad(format!("`{part}`: `{n}` is not a count")))?;
            if n <= 0 {
                return Err(bad(format!("`{part}`: the count must be > 0")));
            }
            steps.push(match kind.trim() {
                "prefill" => Step::Prefill(n),
                "decode" => Step::Decode(n),
                other => return Err(bad(format!("`{part}`: unknown step kind `{other}`"))),
            });
        }
        Ok(Schedule(steps))
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match s {
                Step::Prefill(n) => write!(f, "prefill:{n}")?,
                Step::Decode(n) => write!(f, "decode:{n}")?,
            }
        }
        Ok(())
    }
}

/// Options of [`run_schedule`].
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    /// Tokens per KV cache block.
    pub block_size: i64,
    /// Rows of the chunked-context workspace (default: every cached token at once, capped
    /// at 64Ki rows).
    pub chunk_workspace_tokens: Option<i64>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { block_size: 64, chunk_workspace_tokens: None }
    }
}

/// What [`run_schedule`] observed besides the output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    pub forwards: usize,
    /// Context chunks gathered over all forwards.
    pub context_chunks: usize,
    /// `(decode, workspace allocations so far)` after each forward.
    pub allocations: Vec<(bool, usize)>,
}

/// One sequence's part of one forward in [`run_steps`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqPart {
    /// Index of the sequence (0..S).
    pub seq: usize,
    /// Its next `tokens` tokens.
    pub tokens: i64,
    /// Decode form (then `tokens` must be 1 and the part must precede every prefill part).
    pub decode: bool,
}

/// The forwards a schedule expands to, every sequence taking each step together.
pub fn schedule_forwards(schedule: &Schedule, num_seqs: usize) -> Vec<Vec<SeqPart>> {
    schedule
        .forwards()
        .map(|(tokens, decode)| (0..num_seqs).map(|seq| SeqPart { seq, tokens, decode }).collect())
        .collect()
}

/// Runs S sequences of T tokens (`hidden` `[S,T,H]`, `positions` `[S*T]`) through the block
/// under `schedule`, with a fresh paged cache of exactly the blocks needed. Returns `out`
/// `[S,T,H]` in the block's dtype.
pub fn run_schedule(
    queue: &Queue,
    block: &MlaBlock<'_>,
    hidden: &HostTensor,
    positions: &[i64],
    schedule: &Schedule,
    opts: &RunOptions,
) -> Result<(HostTensor, RunStats)> {
    run_schedule_with_progress(queue, block, hidden, positions, schedule, opts, &|_, _| {})
}

/// [`run_schedule`], calling `progress(done, total)` after each of the `total` forwards is
/// issued (for a progress bar; on a GPU queue issuing runs ahead of the device).
pub fn run_schedule_with_progress(
    queue: &Queue,
    block: &MlaBlock<'_>,
    hidden: &HostTensor,
    positions: &[i64],
    schedule: &Schedule,
    opts: &RunOptions,
    progress: &dyn Fn(usize, usize),
) -> Result<(HostTensor, RunStats)> {
    let forwards = checked_schedule_forwards(hidden, schedule)?;
    run_forwards("run_steps", queue, block, hidden, positions, &forwards, opts, block.dtype(), progress)
}

/// [`run_schedule_with_progress`] with the KV cache in `cache` (`--kv-cache-dtype`):
/// `Auto` is the activation dtype, `Fp8DsMla` the 656-byte fp8 rows (L = 512, R = 64).
#[allow(clippy::too_many_arguments)]
pub fn run_schedule_with_cache(
    queue: &Queue,
    block: &MlaBlock<'_>,
    hidden: &HostTensor,
    positions: &[i64],
    schedule: &Schedule,
    opts: &RunOptions,
    cache: crate::KvCacheDtype,
    progress: &dyn Fn(usize, usize),
) -> Result<(HostTensor, RunStats)> {
    let forwards = checked_schedule_forwards(hidden, schedule)?;
    let cache_dt = cache.resolve(block.dtype())?;
    run_forwards("run_schedule", queue, block, hidden, positions, &forwards, opts, cache_dt, progress)
}

/// [`schedule_forwards`] for the S sequences of `hidden` `[S,T,H]`, after checking that
/// `schedule` covers T tokens.
pub(crate) fn checked_schedule_forwards(
    hidden: &HostTensor,
    schedule: &Schedule,
) -> Result<Vec<Vec<SeqPart>>> {
    check_tokens("run_schedule", hidden)?;
    let t = hidden.shape.get(1).copied().unwrap_or(0);
    schedule.check(t)?;
    let s = hidden.shape.first().copied().unwrap_or(0).max(0) as usize;
    Ok(schedule_forwards(schedule, s))
}

/// `hidden_states` `[S, T, H]` holds at least one sequence of at least one token: an
/// empty input is blamed, not the schedule derived from it.
pub fn check_tokens(op: &'static str, hidden: &HostTensor) -> Result<()> {
    if let [s, t, _] = hidden.shape[..] {
        for (what, v) in [("S", s), ("T", t)] {
            if v <= 0 {
                return Err(Error::invalid(
                    op,
                    "hidden_states",
                    format!("shape {:?} [S, T, H] has {what} = {v}: nothing to run", hidden.shape),
                ));
            }
        }
    }
    Ok(())
}

/// Runs arbitrary forwards: each is a list of sequence parts (decode parts first), taking
/// each listed sequence's next tokens. Every sequence must end up with all T tokens.
pub fn run_steps(
    queue: &Queue,
    block: &MlaBlock<'_>,
    hidden: &HostTensor,
    positions: &[i64],
    forwards: &[Vec<SeqPart>],
    opts: &RunOptions,
) -> Result<(HostTensor, RunStats)> {
    run_forwards("run_steps", queue, block, hidden, positions, forwards, opts, block.dtype(), &|_, _| {})
}

/// One block's run of `forwards` with a cache of `cache_dt`, behind [`run_steps`] and the
/// `run_schedule*` entry points (errors name `op`): plans and stages the rows, runs each
/// forward with a `progress(done, total)` call after it, and unstages `out` `[S,T,H]`.
#[allow(clippy::too_many_arguments)]
fn run_forwards(
    op: &'static str,
    queue: &Queue,
    block: &MlaBlock<'_>,
    hidden: &HostTensor,
    positions: &[i64],
    forwards: &[Vec<SeqPart>],
    opts: &RunOptions,
    cache_dt: DType,
    progress: &dyn Fn(usize, usize),
) -> Result<(HostTensor, RunStats)> {
    let plan = RowPlan::new(op, block, hidden, positions, forwards, opts)?;
    let mut done = 0;
    let (got, stats) =
        plan.run_with_cache(queue, block, positions, forwards, opts, cache_dt, |ws, xin, meta, kv, yout| {
            block.forward(queue, ws, xin, meta, kv, yout)?;
            done += 1;
            progress(done, forwards.len());
            Ok(())
        })?;
    Ok((plan.unstage(block.dtype(), &got), stats))
}

/// The host side of a run (shared by every rank of a tensor-parallel one): the order in
/// which the forwards take the rows of `hidden`, and the inputs in that order.
pub(crate) struct RowPlan {
    pub(crate) s: i64,
    pub(crate) t: i64,
    pub(crate) h: i64,
    /// `(sequence, token)` of each staged row.
    order: Vec<(i64, i64)>,
    /// Rows of the largest forward.
    pub(crate) max_step: i64,
    pub(crate) staged: Vec<u8>,
}

impl RowPlan {
    /// Checks `hidden` `[S,T,H]`, `positions`, `opts` and `forwards` against `block` (errors
    /// name `op`) and stages the rows of `hidden` in the order the forwards take them.
    pub(crate) fn new(
        op: &'static str,
        block: &MlaBlock<'_>,
        hidden: &HostTensor,
        positions: &[i64],
        forwards: &[Vec<SeqPart>],
        opts: &RunOptions,
    ) -> Result<RowPlan> {
        let (dt, hd) = (block.dtype(), block.dims().hidden_size);
        let [s, t, h] = hidden.shape[..] else {
            return Err(Error::invalid(
                op,
                "hidden_states",
                format!("shape {:?} is not [S, T, H]", hidden.shape),
            ));
        };
        if h != hd || hidden.dtype != dt {
            return Err(Error::invalid(
                op,
                "hidden_states",
                format!("is {} {:?}, the block expects {dt} [S, T, {hd}]", hidden.dtype, hidden.shape),
            ));
        }
        let st = s
            .checked_mul(t)
            .filter(|n| n.checked_mul(h).and_then(|x| x.checked_mul(dt.size_of() as i64)).is_some())
            .ok_or_else(|| {
                Error::invalid(
                    op,
                    "hidden_states",
                    format!("shape {:?}: its size overflows i64", hidden.shape),
                )
            })?;
        if s < 0 || t < 0 {
            return Err(Error::invalid(op, "hidden_states", format!("shape {:?} is negative", hidden.shape)));
        }
        if positions.len() as i64 != st {
            return Err(Error::invalid(
                op,
                "positions",
                format!("holds {} entries for S*T = {st}", positions.len()),
            ));
        }
        if opts.block_size <= 0 {
            return Err(Error::invalid(op, "block_size", format!("must be > 0, got {}", opts.block_size)));
        }
        let row = h as usize * dt.size_of();
        if hidden.bytes.len() != st as usize * row {
            return Err(Error::invalid(
                op,
                "hidden_states",
                format!(
                    "holds {} bytes, its shape {:?} needs {}",
                    hidden.bytes.len(),
                    hidden.shape,
                    (s * t) as usize * row
                ),
            ));
        }
        let mut order = Vec::with_capacity((s * t) as usize);
        let mut done = vec![0i64; s as usize];
        let mut max_step = 0;
        for (f, parts) in forwards.iter().enumerate() {
            let mut rows = 0;
            for part in parts {
                let Some(t0) = done.get_mut(part.seq) else {
                    return Err(Error::invalid(
                        op,
                        "forwards",
                        format!("forward {f} names sequence {} of {s}", part.seq),
                    ));
                };
                if part.tokens <= 0 || *t0 + part.tokens > t {
                    return Err(Error::invalid(
                        op,
                        "forwards",
                        format!(
                            "forward {f}: sequence {} has {} of {t} tokens left, asked for {}",
                            part.seq,
                            t - *t0,
                            part.tokens
                        ),
                    ));
                }
                order.extend((*t0..*t0 + part.tokens).map(|ti| (part.seq as i64, ti)));
                *t0 += part.tokens;
                rows += part.tokens;
            }
            max_step = max_step.max(rows);
        }
        if let Some(si) = done.iter().position(|&n| n != t) {
            return Err(Error::invalid(
                op,
                "forwards",
                format!("sequence {si} gets {} of its {t} tokens", done[si]),
            ));
        }
        let mut staged = Vec::with_capacity(hidden.bytes.len());
        for &(si, ti) in &order {
            let at = ((si * t + ti) as usize) * row;
            staged.extend_from_slice(&hidden.bytes[at..at + row]);
        }
        Ok(RowPlan { s, t, h, order, max_step, staged })
    }

    /// Runs the planned forwards on `queue` with a fresh paged cache of `cache_dt` (the
    /// activation dtype or fp8_ds_mla) and workspace: `forward(ws, hidden, meta, kv_cache,
    /// out)` is one step of `block` (or of its rank). Returns the output rows in staged
    /// order, and what the run observed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_with_cache(
        &self,
        queue: &Queue,
        block: &MlaBlock<'_>,
        positions: &[i64],
        forwards: &[Vec<SeqPart>],
        opts: &RunOptions,
        cache_dt: DType,
        mut forward: impl FnMut(
            &mut MlaWorkspace,
            &Tensor<'_>,
            &MlaBatchMetadata,
            &Tensor<'_>,
            &Tensor<'_>,
        ) -> Result<()>,
    ) -> Result<(Vec<u8>, RunStats)> {
        let (s, t, h) = (self.s, self.t, self.h);
        let dt = block.dtype();
        let x = Buffer::from_bytes(queue, dt, &[s * t, h], &self.staged)?;
        let y = Buffer::nan(queue, dt, &[s * t, h])?;
        let bs = opts.block_size;
        let blocks_per_seq = t / bs + i64::from(t % bs != 0);
        let row_dim = block.dims().cache_row_dim();
        if block.dims().is_sparse() && cache_dt == DType::Fp8DsMla {
            return Err(Error::invalid(
                "PagedKvCache",
                "kv_cache_dtype",
                "a DeepSeek-V3.2 block keeps its indexer keys beside the latents in the activation dtype; \
                 fp8_ds_mla rows cannot hold them yet (use auto or bf16)",
            ));
        }
        let num_blocks = s.saturating_mul(blocks_per_seq).max(1);
        // The cache is sized by the block size: name it, with the bytes, when it cannot be had.
        // Sized by the cache dtype's row bytes (656 per token for fp8_ds_mla).
        let row = crate::kv_cache::row_bytes(cache_dt, row_dim)?;
        let cache_err = |why: String| {
            let bytes = num_blocks as i128 * bs as i128 * row as i128;
            Error::invalid(
                "PagedKvCache",
                "block_size",
                format!(
                    "the KV cache of {num_blocks} block(s) of block size {bs} x {row_dim} {cache_dt} ({row} bytes a \
                     row) needs {bytes} bytes: {why}"
                ),
            )
        };
        let fits = num_blocks
            .checked_mul(bs)
            .and_then(|x| x.checked_mul(row))
            .is_some_and(|b| isize::try_from(b).is_ok());
        if !fits {
            return Err(cache_err("more than any allocation".into()));
        }
        let mut cache = PagedKvCache::new(queue, cache_dt, num_blocks, bs, row_dim)
            .map_err(|e| cache_err(e.to_string()))?;
        let chunk_ws = opts.chunk_workspace_tokens.unwrap_or((s * t).clamp(1, 65536));
        let mut ws = MlaWorkspace::new(MlaLimits {
            max_tokens: self.max_step.max(1),
            max_seqs: s.max(1),
            max_blocks_per_seq: blocks_per_seq.max(1),
            chunk_workspace_tokens: chunk_ws.max(1),
        })?;
        let ids: Vec<_> = (0..s).map(|_| cache.add_sequence()).collect();
        let mut meta = MlaBatchMetadata::default();
        let mut stats = RunStats::default();
        let mut row0 = 0i64;
        let mut done = vec![0i64; s as usize];
        for parts in forwards {
            let seqs: Vec<StepSeq<'_>> = parts
                .iter()
                .map(|p| {
                    let at = p.seq * t as usize + done[p.seq] as usize;
                    done[p.seq] += p.tokens;
                    StepSeq {
                        seq: ids[p.seq],
                        positions: &positions[at..at + p.tokens as usize],
                        decode: p.decode,
                    }
                })
                .collect();
            meta.plan(&mut cache, &seqs, chunk_ws)?;
            let rows = meta.num_tokens();
            let xin = x.view().slice(0, row0, row0 + rows)?;
            let yout = y.view().slice(0, row0, row0 + rows)?;
            forward(&mut ws, &xin, &meta, &cache.view(), &yout)?;
            stats.forwards += 1;
            stats.context_chunks += meta.chunks.len();
            stats.allocations.push((meta.num_decode_tokens == rows, ws.allocations()));
            row0 += rows;
        }
        Ok((y.to_bytes(queue)?, stats))
    }

    /// `out` `[S,T,H]` from the output rows `got` in staged order.
    pub(crate) fn unstage(&self, dt: DType, got: &[u8]) -> HostTensor {
        let row = self.h as usize * dt.size_of();
        let mut out = vec![0u8; got.len()];
        for (i, &(si, ti)) in self.order.iter().enumerate() {
            let at = ((si * self.t + ti) as usize) * row;
            out[at..at + row].copy_from_slice(&got[i * row..(i + 1) * row]);
        }
        HostTensor { dtype: dt, shape: vec![self.s, self.t, self.h], bytes: out }
    }
}

/// The positions input of the CLI: `positions` `[S,T]` i64 if given, else `0..T` for each
/// sequence.
pub fn positions_or_default(positions: Option<&HostTensor>, s: i64, t: i64) -> Result<Vec<i64>> {
    match positions {
        None => {
            // S and T come from a file's header: an `[S, T, 0]` tensor holds no bytes
            // whatever S * T is, so the count is checked and reserved fallibly.
            let bad = |msg: String| {
                Error::invalid(
                    "input",
                    "positions",
                    format!("the default positions 0..{t} for {s} sequences: {msg}"),
                )
            };
            let n = s
                .checked_mul(t)
                .filter(|_| s >= 0 && t >= 0)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| bad("S * T is negative or overflows".into()))?;
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|e| bad(format!("{n} entries cannot be allocated ({e})")))?;
            v.extend((0..s).flat_map(|_| 0..t));
            Ok(v)
        }
        Some(p) => {
            if p.dtype != DType::I64 || p.shape != [s, t] {
                return Err(Error::invalid(
                    "input",
                    "positions",
                    format!("is {} {:?}, expected i64 [{s}, {t}]", p.dtype, p.shape),
                ));
            }
            Ok(p.bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect())
        }
    }
}
