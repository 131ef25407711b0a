//! Decode context parallelism (DCP), as vLLM's ROCm AITER MLA backend does it: the paged
//! latent cache is split across the `dcp` ranks of a DCP group by token, **token `j` of a
//! sequence on DCP rank `j % dcp`** (round-robin, interleave 1), so each rank holds about
//! `1/dcp` of every sequence. A decode step:
//!
//! 1. every rank computes the absorbed queries of its TP heads (`num_heads / tp`);
//! 2. the queries are gathered over the DCP group (`dcp * num_heads / tp` heads);
//! 3. each rank runs `MlaDecodeAttention` with lse over its share of the cache;
//! 4. the partial outputs and lse are exchanged through the DCP group's communicator and
//!    each rank merges, for its own heads, the `dcp` partials with `MergeAttnStates`;
//! 5. `W_UV`, `o_proj` and the TP all-reduce as without DCP.
//!
//! The communicator only sums (`all_reduce_sum`), so the gathers are sums of zero-filled
//! buffers in which each rank wrote its own slot: adding exact zeros changes no value
//! (`-inf + 0 = -inf` for empty partials), so a gather is exact in every dtype.
//!
//! Prefill runs unsplit: every rank attends over the step's new tokens (it has all of
//! them), and writes only its own tokens into its cache (the others get slot -1, which
//! `ConcatAndCacheMla` skips). A prefill after cached tokens of the same sequence
//! (chunked-context prefill) would need the whole context on every rank and is refused
//! under DCP; so is a forward mixing decode and prefill parts.
//!
//! The shares may be fp8_ds_mla caches ([`run_schedule_dcp_with_cache`]): each rank
//! encodes the rows it owns exactly as the DCP = 1 cache would (a row's encoding depends on
//! that row alone), its decode attention dequantizes them on load, and the partials and
//! their merge are in the activation dtype as without fp8.

use vt_core::comm::Communicator;
use vt_core::{
    concat_mla_nope_rope, merge_attn_states, mla_decode_attention, Buffer, ConcatMlaNopeRopeArgs, DType,
    Error, MergeAttnStatesArgs, MlaDecodeAttentionArgs, Queue, Result,
};

use super::group::TpGroup;
use super::run::{check_rank_blocks, on_every_rank, rank0_result, TpRunStats};
use crate::block::{DecodeAttention, MlaBlock};
use crate::kv_cache::{BlockAllocator, KvCacheDtype, PagedKvCache};
use crate::metadata::{MlaBatchMetadata, StepSeq};
use crate::runner::{checked_schedule_forwards, RowPlan, RunOptions, RunStats, Schedule, SeqPart};
use crate::weights::HostTensor;
use crate::workspace::{MlaLimits, MlaWorkspace};

const OP: &str = "decode context parallelism";

/// The DCP rank that caches token `j` of a sequence.
pub fn dcp_owner(j: i64, dcp: usize) -> usize {
    (j.rem_euclid(dcp.max(1) as i64)) as usize
}

/// Rank `me` of a DCP group of `dcp`: decode attention over its share of the cache,
/// merged with the group's other shares.
struct DcpDecode<'c> {
    comm: &'c dyn Communicator,
    dcp: usize,
    me: usize,
}

impl DecodeAttention for DcpDecode<'_> {
    fn attend(&self, q: &Queue, a: &MlaDecodeAttentionArgs<'_>) -> Result<()> {
        let (b, sq, n, dq) = (a.query.dim(0), a.query.dim(1), a.query.dim(2), a.query.dim(3));
        let dv = a.out.dim(3);
        if sq != 1 {
            return Err(Error::invalid(
                OP,
                "query",
                format!("s_q = {sq}: DCP decodes one token per sequence"),
            ));
        }
        let (d, me) = (self.dcp as i64, self.me as i64);
        let dn = d
            .checked_mul(n)
            .ok_or_else(|| Error::invalid(OP, "dcp", format!("{d} x {n} heads overflow i64")))?;
        let dt = a.query.dtype();
        // 2. The group's queries, [B, dcp*N, D]: this rank's heads at head offset me*N.
        let qg = Buffer::zeros(q, dt, &[b, dn, dq])?;
        let own_q = qg.view().as_strided(me * n * dq, &[b, n, dq], &[dn * dq, dq, 1])?;
        let query = a.query.select(1, 0)?;
        // A strided copy: ConcatMlaNopeRope with the split at Dv (latent | rope).
        concat_mla_nope_rope(
            q,
            &ConcatMlaNopeRopeArgs {
                out: own_q,
                nope: query.slice(2, 0, dv)?,
                rope: query.slice(2, dv, dq)?,
            },
        )?;
        self.comm.all_reduce_sum(q, &qg.view())?;
        // 3. Attention over this rank's share into its slot of the partials' gather
        // buffers: out [dcp, B, dcp*N, Dv], lse [dcp, B, dcp*N] (f32).
        let pg = Buffer::zeros(q, dt, &[d, b, dn, dv])?;
        let lg = Buffer::zeros(q, DType::F32, &[d, b, dn])?;
        let bdn = b * dn;
        mla_decode_attention(
            q,
            &MlaDecodeAttentionArgs {
                out: pg.view().as_strided(me * bdn * dv, &[b, 1, dn, dv], &[dn * dv, dn * dv, dv, 1])?,
                lse: Some(lg.view().as_strided(me * bdn, &[b, dn, 1], &[dn, 1, 1])?),
                query: qg.view().as_strided(0, &[b, 1, dn, dq], &[dn * dq, dn * dq, dq, 1])?,
                ..*a
            },
        )?;
        // 4. Every rank's partials, then this rank's heads merged over the group.
        self.comm.all_reduce_sum(q, &pg.view())?;
        self.comm.all_reduce_sum(q, &lg.view())?;
        let part =
            |src: i64| pg.view().as_strided(src * bdn * dv + me * n * dv, &[b, n, dv], &[dn * dv, dv, 1]);
        let part_lse = |src: i64| lg.view().as_strided(src * bdn + me * n, &[n, b], &[1, dn]);
        let acc = [Buffer::zeros(q, dt, &[b, n, dv])?, Buffer::zeros(q, dt, &[b, n, dv])?];
        let acc_lse = [Buffer::zeros(q, DType::F32, &[n, b])?, Buffer::zeros(q, DType::F32, &[n, b])?];
        let out = a.out.select(1, 0)?;
        let (mut cur, mut cur_lse) = (part(0)?, part_lse(0)?);
        for src in 1..d {
            let last = src == d - 1;
            let k = (src % 2) as usize;
            let (o, ol) = if last { (out, None) } else { (acc[k].view(), Some(acc_lse[k].view())) };
            merge_attn_states(
                q,
                &MergeAttnStatesArgs {
                    out: o,
                    out_lse: ol,
                    prefix: cur,
                    prefix_lse: cur_lse,
                    suffix: part(src)?,
                    suffix_lse: part_lse(src)?,
                },
            )?;
            if let Some(ol) = ol {
                (cur, cur_lse) = (o, ol);
            }
        }
        Ok(())
    }
}

/// [`super::run_schedule_tp`] under decode context parallelism (`group.dcp() > 1`; with
/// dcp = 1 it is the plain TP run).
pub fn run_schedule_dcp(
    group: &TpGroup,
    blocks: &[MlaBlock<'_>],
    hidden: &HostTensor,
    positions: &[i64],
    schedule: &Schedule,
    opts: &RunOptions,
) -> Result<(HostTensor, TpRunStats)> {
    run_schedule_dcp_with_cache(group, blocks, hidden, positions, schedule, opts, KvCacheDtype::Auto)
}

/// [`run_schedule_dcp`] with every rank's share of the KV cache in `cache`
/// (`--kv-cache-dtype`; `Fp8DsMla`: the 656-byte fp8 rows, L = 512, R = 64). A row's
/// encoding depends only on its token, so the shares hold exactly the rows the DCP = 1
/// block's fp8 cache holds, split by token.
pub fn run_schedule_dcp_with_cache(
    group: &TpGroup,
    blocks: &[MlaBlock<'_>],
    hidden: &HostTensor,
    positions: &[i64],
    schedule: &Schedule,
    opts: &RunOptions,
    cache: KvCacheDtype,
) -> Result<(HostTensor, TpRunStats)> {
    let forwards = checked_schedule_forwards(hidden, schedule)?;
    run_steps_dcp_with_cache(group, blocks, hidden, positions, &forwards, opts, cache)
}

/// [`super::run_steps_tp`] with each rank's cache holding only its DCP share (see the
/// module docs). Returns rank 0's `out` `[S,T,H]`.
pub fn run_steps_dcp(
    group: &TpGroup,
    blocks: &[MlaBlock<'_>],
    hidden: &HostTensor,
    positions: &[i64],
    forwards: &[Vec<SeqPart>],
    opts: &RunOptions,
) -> Result<(HostTensor, TpRunStats)> {
    run_steps_dcp_with_cache(group, blocks, hidden, positions, forwards, opts, KvCacheDtype::Auto)
}

/// [`run_steps_dcp`] with the ranks' cache shares in `cache` (see
/// [`run_schedule_dcp_with_cache`]).
pub fn run_steps_dcp_with_cache(
    group: &TpGroup,
    blocks: &[MlaBlock<'_>],
    hidden: &HostTensor,
    positions: &[i64],
    forwards: &[Vec<SeqPart>],
    opts: &RunOptions,
    cache: KvCacheDtype,
) -> Result<(HostTensor, TpRunStats)> {
    if group.dcp() <= 1 {
        return super::run::run_steps_tp_with_progress(
            group,
            blocks,
            hidden,
            positions,
            forwards,
            opts,
            cache,
            &|_, _| {},
        );
    }
    check_rank_blocks(OP, group, blocks)?;
    let plan = RowPlan::new(OP, &blocks[0], hidden, positions, forwards, opts)?;
    let cache_dt = cache.resolve(blocks[0].dtype())?;
    let dcp = group.dcp();
    let results = on_every_rank(group, &[], |r, q, comm| {
        let dcomm =
            group.dcp_comm(r).ok_or_else(|| Error::other(OP, format!("rank {r} has no DCP communicator")))?;
        let hook = DcpDecode { comm: dcomm, dcp, me: r % dcp };
        let reduce = |out: &vt_core::Tensor<'_>| comm.all_reduce_sum(q, out);
        rank_run(&plan, &blocks[r], q, &hook, positions, forwards, (opts, cache_dt), reduce)
    })?;
    Ok(rank0_result(&plan, blocks[0].dtype(), &results))
}

fn bad(arg: &'static str, msg: String) -> Error {
    Error::invalid(OP, arg, msg)
}

/// Blocks of `bs` tokens for `n` tokens.
fn blocks_for(n: i64, bs: i64) -> i64 {
    n / bs + i64::from(n % bs != 0)
}

/// One rank's run: [`RowPlan::run_with_cache`] with a host-only allocator of the whole
/// sequences (the step's positions and prefill layout) and the rank's cache of its share
/// (slots, decode tables and lengths).
#[allow(clippy::too_many_arguments)]
fn rank_run(
    plan: &RowPlan,
    block: &MlaBlock<'_>,
    q: &Queue,
    hook: &DcpDecode<'_>,
    positions: &[i64],
    forwards: &[Vec<SeqPart>],
    (opts, cache_dt): (&RunOptions, DType),
    reduce: impl Fn(&vt_core::Tensor<'_>) -> Result<()>,
) -> Result<(Vec<u8>, RunStats)> {
    let (s, t, h) = (plan.s, plan.t, plan.h);
    let (dcp, me) = (hook.dcp, hook.me);
    let dt = block.dtype();
    let bs = opts.block_size;
    let x = Buffer::from_bytes(q, dt, &[s * t, h], &plan.staged)?;
    let y = Buffer::nan(q, dt, &[s * t, h])?;
    let local_t = blocks_for(t, dcp as i64);
    let num_blocks = |per: i64| {
        s.checked_mul(blocks_for(per, bs))
            .map(|n| n.max(1))
            .ok_or_else(|| bad("block_size", format!("{s} sequences x {per} tokens overflow i64 blocks")))
    };
    let mut cache = PagedKvCache::new(q, cache_dt, num_blocks(local_t)?, bs, block.dims().cache_row_dim())?;
    let mut whole = BlockAllocator::new(num_blocks(t)?, bs)?;
    let chunk_ws = opts.chunk_workspace_tokens.unwrap_or((s * t).clamp(1, 65536));
    let mut ws = MlaWorkspace::new(MlaLimits {
        max_tokens: plan.max_step.max(1),
        max_seqs: s.max(1),
        max_blocks_per_seq: blocks_for(t, bs).max(1),
        chunk_workspace_tokens: chunk_ws.max(1),
    })?;
    let ids: Vec<_> = (0..s).map(|_| (whole.add_sequence(), cache.add_sequence())).collect();
    let mut meta = MlaBatchMetadata::default();
    let mut stats = RunStats::default();
    let (mut row0, mut done) = (0i64, vec![0i64; s as usize]);
    for (f, parts) in forwards.iter().enumerate() {
        let decodes = parts.iter().filter(|p| p.decode).count();
        if decodes != 0 && decodes != parts.len() {
            return Err(bad(
                "forwards",
                format!("forward {f} mixes decode and prefill parts (not under DCP)"),
            ));
        }
        let mut seqs = Vec::with_capacity(parts.len());
        for p in parts {
            let ctx = done[p.seq];
            if !p.decode && ctx > 0 {
                return Err(bad(
                    "schedule",
                    format!(
                        "forward {f}: a prefill after {ctx} cached tokens of sequence {} (chunked-context \
                         prefill is not implemented under DCP: prefill once, then decode)",
                        p.seq
                    ),
                ));
            }
            if p.decode && ctx + 1 < dcp as i64 {
                return Err(bad(
                    "schedule",
                    format!(
                        "forward {f}: sequence {} decodes token {ctx}, before each of the {dcp} DCP ranks holds \
                         one of its tokens (prefill at least {dcp} tokens first)",
                        p.seq
                    ),
                ));
            }
            let at = p.seq * t as usize + ctx as usize;
            done[p.seq] += p.tokens;
            seqs.push(StepSeq {
                seq: ids[p.seq].0,
                positions: &positions[at..at + p.tokens as usize],
                decode: p.decode,
            });
        }
        // The whole sequences' plan, then the rank's share substituted for the cache side.
        meta.plan(&mut whole, &seqs, chunk_ws)?;
        meta.slot_mapping.clear();
        let (mut dec_rows, mut pre_rows) = (Vec::new(), Vec::new());
        let mut local = Vec::new();
        for (p, st) in parts.iter().zip(&seqs) {
            let local_id = ids[p.seq].1;
            let n = st.positions.len() as i64;
            let ctx = done[p.seq] - n;
            let owned = (ctx..ctx + n).filter(|&j| dcp_owner(j, dcp) == me).count() as i64;
            local.clear();
            cache.append(local_id, owned, &mut local)?;
            let mut mine = local.iter();
            for j in ctx..ctx + n {
                let slot = if dcp_owner(j, dcp) == me {
                    *mine.next().ok_or_else(|| bad("dcp", "the rank's share ran out of slots".into()))?
                } else {
                    -1
                };
                meta.slot_mapping.push(slot);
            }
            let table = cache.block_table(local_id)?.to_vec();
            if p.decode {
                let len = cache.seq_len(local_id)?;
                meta.decode_seq_lens[dec_rows.len()] = i32::try_from(len)
                    .map_err(|_| bad("decode_seq_lens", format!("{len} does not fit i32")))?;
                dec_rows.push(table);
            } else {
                // Unused (no context chunks under DCP) but checked: as wide as the whole
                // sequence needs, the rank's blocks padded with its first.
                pre_rows.push((table, blocks_for(n, bs)));
            }
        }
        let pad = |rows: &[Vec<i32>], width: i64| -> Vec<i32> {
            rows.iter()
                .flat_map(|r| {
                    let first = r.first().copied().unwrap_or(0);
                    r.iter().copied().chain(std::iter::repeat(first)).take(width as usize)
                })
                .collect()
        };
        meta.decode_max_blocks = dec_rows.iter().map(|r| r.len() as i64).max().unwrap_or(0);
        meta.decode_block_table = pad(&dec_rows, meta.decode_max_blocks);
        let pre_w = pre_rows.iter().map(|(r, w)| (r.len() as i64).max(*w)).max().unwrap_or(0);
        meta.prefill_max_blocks = pre_w;
        let rows: Vec<Vec<i32>> = pre_rows.into_iter().map(|(r, _)| r).collect();
        meta.prefill_block_table = pad(&rows, pre_w);
        let nrows = meta.num_tokens();
        let xin = x.view().slice(0, row0, row0 + nrows)?;
        let yout = y.view().slice(0, row0, row0 + nrows)?;
        block.forward_with(hook, q, &mut ws, &xin, &meta, &cache.view(), &yout)?;
        reduce(&yout)?;
        stats.forwards += 1;
        stats.allocations.push((meta.num_decode_tokens == nrows, ws.allocations()));
        row0 += nrows;
    }
    Ok((y.to_bytes(q)?, stats))
}
