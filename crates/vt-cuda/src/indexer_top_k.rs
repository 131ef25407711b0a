//! IndexerTopK: DeepSeek-V3.2's lightning indexer on CUDA (`kernels-cuda/indexer_top_k.cu`),
//! in two launches per chunk of query rows:
//!
//! 1. scores of every visible token into an f32-key workspace `[rows, cap]` (`cap` = MB·BS,
//!    the most tokens a query can see): `indexer_scores_mma_{bf16,f16}` on tensor cores
//!    (mma.sync m16n8k16) when Di is a multiple of 16 and the query and cache rows are
//!    16-byte aligned, else `indexer_scores_{bf16,f16,f32}` (one thread per token, the CPU
//!    reference's arithmetic order, so bit-equal scores);
//! 2. `indexer_select_f32`: one CTA per query. Fast path (topk <= 4096): a lower bound on
//!    the scores' order-preserving u32 keys (every valid key for rows of <= 4096 tokens, else
//!    from a strided sample), one pass moving the keys above it into shared memory in
//!    position order, a stable radix sort of those (descending; equal scores stay in position
//!    order, the contract's tie rule), the first topk written as slots, -1 past them. Where
//!    the bound fails (ties at it, a skewed sample) or topk > 4096: the general path, a radix
//!    select (its row of keys in shared memory when it fits beside its 36 KB of bookkeeping,
//!    48,896 keys on an H100/H200) with the same tie rule and a bitonic sort of the chosen.
//!
//! A score CTA takes up to 16 tiles of 64 tokens (fewer when the call has few tiles, so that
//! a batch of one still fills the device); the tensor-core kernel keeps 3 tiles in flight.
//!
//! The workspace belongs to the queue (one per stream, grown on a larger call, so a warmed-up
//! call allocates nothing); calls with more rows than [`WORKSPACE_BYTES`] holds run in
//! chunks of rows. No length is read back: every CTA reads its query's position on the
//! device and exits early past it.
//!
//! # Floor (DeepSeek-V3.2: H = 64, Di = 128, bf16; docs/perf.md, Lightning indexer)
//!
//! Per query and visible token: 256 bytes of key (read once per query in decode: each
//! sequence has one query) and 2·H·Di = 16,384 FLOPs (tensor-core work), plus 4 bytes of
//! score written and read back by the select (≥ 5 passes from L2). Decode at B = 128 and
//! 64k context: 2.15 GB of keys, 0.51 ms at 4.2 TB/s; 137 GFLOP, 0.14 ms at 990 TFLOP/s:
//! bandwidth-bound. Prefill of 4096 causal queries over one sequence: 8.4 M (query, token)
//! pairs, 137 GFLOP (compute-bound, ~0.14 ms dense bf16), keys 1 MB (L2-resident).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use vt_core::{DType, Error, IndexerTopKArgs, OpId, Queue, Result, Tensor};

use crate::device::BACKEND;
use crate::rope_from_cache::int;
use crate::scratch::{self, Fill, PerQueue};
use crate::{kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("indexer_top_k");

const OP: OpId = OpId::IndexerTopK;

/// Tokens per tile of the score kernels (`KT` in the .cu file); a CTA takes `nt` tiles.
const KEY_TILE: i64 = 64;
/// Key tiles in flight in the tensor-core kernel (`STAGES`).
const STAGES: i64 = 3;
/// Most tiles per score CTA.
const MAX_TILES_PER_CTA: i64 = 16;
/// Key tiles of a call per score CTA below which CTAs get fewer tiles (more CTAs).
const TILES_PER_CTA_DIVISOR: i64 = 256;
/// Shared memory of the select kernel's bookkeeping (`SelShared`: 4096 u64 items, 256 bins,
/// counters; `SEL_SHARED_BYTES`), before the row's keys; all of it dynamic, so that the launch
/// raises the block's limit whenever the total passes 48 KB.
const SELECT_SHARED_BYTES: i64 = 36 * 1024;
/// Shared memory of the select kernel's fast path (`FastShared`: candidates and the sort's
/// second buffer, 2 x 4096 keys and positions, per-warp digit counters; `FAST_SHARED_BYTES`);
/// it overlays the bookkeeping and the row, so a launch gets at least this much.
const FAST_SHARED_BYTES: i64 = 97 * 1024;
/// Elements of padding per shared-memory row of the tensor-core kernel (`PAD`).
const PAD: i64 = 8;
const SCORE_THREADS: u32 = 128;
const SELECT_THREADS: u32 = 1024;
/// A per-block shared-memory limit every sm_80+ device allows (sm_86/sm_89: 99 KB).
#[cfg(test)]
pub(crate) const DEFAULT_SMEM_OPTIN: u32 = 101_376;
/// The tensor-core kernel's dynamic shared memory stays under what every sm_80+ device
/// gives a block (99 KB on sm_86/sm_89).
const MMA_SMEM_MAX: i64 = 101_376;
/// Dynamic shared memory of the two-queries-a-CTA kernel: Q [2][64][136] and 3 key tiles
/// [64][136] (bf16/f16), weights [2][64] and the head halves' sums [2][2][64] (f32), a valid
/// flag per stage and key row.
const PAIR_SMEM: u32 = 2 * 64 * 136 * 2 + 3 * 64 * 136 * 2 + 2 * 64 * 4 + 4 * 64 * 4 + 3 * 64;
/// The score workspace of one call stays under this; a call with more rows runs in chunks.
pub const WORKSPACE_BYTES: i64 = 256 << 20;
/// Rows per chunk also stay under the grid's y limit.
const MAX_CHUNK_ROWS: i64 = 65_535;

/// Which score kernel runs. The op uses [`Kernel::Auto`] (tensor cores where they apply);
/// the others are for tests and benchmarks ([`indexer_top_k_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Auto,
    /// One thread per token, bit-equal to the CPU reference's scores.
    Generic,
    /// mma.sync m16n8k16; an error where it does not apply (f32, Di % 16 != 0, unaligned rows).
    Mma,
}

/// The workspace's geometry for a call: row length (padded `cap`) and rows per chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub cap: i64,
    pub ld: i64,
    pub chunk_rows: i64,
}

pub(crate) fn layout(a: &IndexerTopKArgs<'_>) -> Result<Layout> {
    let cap = a
        .block_table
        .dim(1)
        .checked_mul(a.cache.dim(1))
        .ok_or_else(|| Error::invalid(OP, "block_table", "MB * BS overflows"))?;
    let ld = (cap.max(1) + 3) / 4 * 4;
    let chunk_rows = (WORKSPACE_BYTES / (ld * 4)).clamp(1, MAX_CHUNK_ROWS).min(a.query.dim(0).max(1));
    Ok(Layout { cap, ld, chunk_rows })
}

/// The tensor-core kernel's dynamic shared memory, or `None` where it does not apply.
fn mma_smem(a: &IndexerTopKArgs<'_>) -> Option<u32> {
    let (h, di) = (a.query.dim(1), a.query.dim(2));
    if !matches!(a.query.dtype(), DType::BF16 | DType::F16) || di % 16 != 0 || di == 0 {
        return None;
    }
    // Whole 16-byte rows: addresses and every used stride in 8-element units.
    let s = |t: &Tensor<'_>, k: usize| if t.dim(k) == 1 { 0 } else { t.stride(k) };
    let aligned = [a.query.data_addr(), a.cache.data_addr()].iter().all(|x| x % 16 == 0)
        && [s(&a.query, 0), s(&a.query, 1), s(&a.cache, 0), s(&a.cache, 1)].iter().all(|x| x % 8 == 0);
    if !aligned {
        return None;
    }
    let hp = (h + 63) / 64 * 64;
    let rs = di + PAD;
    // Q, the key stages, weights, the head halves' sums, a valid flag per stage and row.
    let bytes = hp * rs * 2 + STAGES * KEY_TILE * rs * 2 + hp * 4 + 2 * KEY_TILE * 4 + STAGES * KEY_TILE;
    (bytes <= MMA_SMEM_MAX).then_some(bytes as u32)
}

pub(crate) fn run(q: &Queue, a: &IndexerTopKArgs<'_>) -> Result<()> {
    indexer_top_k_with(q, a, Kernel::Auto).map(|_| ())
}

/// IndexerTopK with an explicit score kernel (the op itself uses [`Kernel::Auto`]). The
/// arguments must have passed `vt_core::indexer_top_k`'s validation: call that entry point
/// for the op; this is for tests and benchmarks, which build views to the contract.
/// Returns the score kernel's name (`"mma"`, `"generic"`, `"none"` for an empty call).
pub fn indexer_top_k_with(q: &Queue, a: &IndexerTopKArgs<'_>, kernel: Kernel) -> Result<&'static str> {
    let cq = CudaQueue::of(q, OP)?;
    if a.query.dim(0) == 0 {
        return Ok("none");
    }
    let l = layout(a)?;
    let ws = workspace(q, cq, l.chunk_rows * l.ld)?;
    let (name, launches) = plan(a, kernel, ws, &l, cq.smem_optin()?)?;
    cq.run(OP, &launches)?;
    Ok(name)
}

/// The score launches of [`indexer_top_k_with`] alone (their result stays in the
/// workspace): for benchmarks, which time the select as the difference. Same arguments.
pub fn indexer_scores_only(q: &Queue, a: &IndexerTopKArgs<'_>, kernel: Kernel) -> Result<()> {
    let cq = CudaQueue::of(q, OP)?;
    if a.query.dim(0) == 0 {
        return Ok(());
    }
    let l = layout(a)?;
    let ws = workspace(q, cq, l.chunk_rows * l.ld)?;
    let (_, launches) = plan(a, kernel, ws, &l, cq.smem_optin()?)?;
    let scores: Vec<Launch> = launches.into_iter().filter(|x| x.base != "indexer_select").collect();
    cq.run(OP, &scores)
}

/// Tiles per score CTA: up to 16, fewer when the call has few tiles (so that short calls
/// still spread over the device).
fn tiles_per_cta(rows: i64, cap: i64) -> i64 {
    let tiles = rows.saturating_mul((cap + KEY_TILE - 1) / KEY_TILE);
    (tiles / TILES_PER_CTA_DIVISOR).clamp(1, MAX_TILES_PER_CTA)
}

/// Keys of a row the select holds in shared memory (a multiple of 4; longer rows are read
/// from the workspace), given the device's opt-in shared-memory limit.
fn select_row_cap(l: &Layout, smem_optin: u32) -> i64 {
    let room = (smem_optin as i64 - SELECT_SHARED_BYTES).max(0) / 4 / 4 * 4;
    room.min(l.ld)
}

/// The launches for workspace address `ws` (at least `chunk_rows * ld` u32): per chunk of
/// rows, the scores then the selection. `smem_optin`: the device's per-block shared-memory
/// limit. Plain data, no device.
pub(crate) fn plan(
    a: &IndexerTopKArgs<'_>,
    kernel: Kernel,
    ws: u64,
    l: &Layout,
    smem_optin: u32,
) -> Result<(&'static str, Vec<Launch>)> {
    let (t, h, di) = (a.query.dim(0), a.query.dim(1), a.query.dim(2));
    let (nb, bs) = (a.cache.dim(0), a.cache.dim(1));
    let topk = a.out.dim(1);
    let smem = mma_smem(a);
    let mma = match (kernel, smem) {
        (Kernel::Generic, _) | (Kernel::Auto, None) => None,
        (_, Some(s)) => Some(s),
        (Kernel::Mma, None) => {
            return Err(Error::invalid(
                OP,
                "query",
                "the tensor-core kernel needs bf16/f16, Di a multiple of 16 and 16-byte aligned query and cache rows",
            ))
        }
    };
    // Slots are i32: every cache row must have one.
    int(OP, "cache", nb.checked_mul(bs).unwrap_or(i64::MAX))?;
    let (h32, di32, nb32, bs32) =
        (int(OP, "query", h)?, int(OP, "query", di)?, int(OP, "cache", nb)?, int(OP, "cache", bs)?);
    let nseq = int(OP, "block_table", a.block_table.dim(0))?;
    let topk32 = int(OP, "out", topk)?;
    let wf32 = i32::from(a.weights.dtype() == DType::F32);
    let pos64 = i32::from(a.positions.dtype() == DType::I64);
    // Two queries a CTA (keys loaded once for both when they share a sequence) at DeepSeek's
    // dims when the call averages two or more queries a sequence (prefill); decode keeps one.
    let pair = mma.is_some() && h <= 64 && di == 128 && t >= 2 * a.block_table.dim(0);
    // The kernels index tokens in 32 bits.
    int(OP, "block_table", l.cap)?;
    let nt = tiles_per_cta(l.chunk_rows.min(t), l.cap);
    let keys_per_cta = nt * KEY_TILE;
    let row_cap = select_row_cap(l, smem_optin);
    let select_smem = u32::try_from((SELECT_SHARED_BYTES + row_cap * 4).max(FAST_SHARED_BYTES))
        .map_err(|_| Error::invalid(OP, "block_table", "the select's shared memory does not fit a u32"))?;
    let key_blocks = u32::try_from((l.cap + keys_per_cta - 1) / keys_per_cta)
        .map_err(|_| Error::invalid(OP, "block_table", "MB * BS is too large for the score grid"))?;
    let mut launches = Vec::new();
    let mut row0 = 0;
    while row0 < t {
        let rows = l.chunk_rows.min(t - row0);
        let score_args: Vec<Arg> = vec![
            ws.into(),
            l.ld.into(),
            row0.into(),
            a.query.data_addr().into(),
            a.query.stride(0).into(),
            a.query.stride(1).into(),
            a.weights.data_addr().into(),
            a.weights.stride(0).into(),
            a.weights.stride(1).into(),
            wf32.into(),
            a.cache.data_addr().into(),
            a.cache.stride(0).into(),
            a.cache.stride(1).into(),
            nb32.into(),
            bs32.into(),
            a.block_table.data_addr().into(),
            a.block_table.stride(0).into(),
            a.block_table.stride(1).into(),
            nseq.into(),
            a.seq_ids.data_addr().into(),
            a.seq_ids.stride(0).into(),
            a.positions.data_addr().into(),
            a.positions.stride(0).into(),
            pos64.into(),
            l.cap.into(),
            h32.into(),
            di32.into(),
            a.scale.into(),
            (nt as i32).into(),
        ];
        let grid = (key_blocks, rows as u32, 1);
        launches.push(match (mma, pair) {
            (Some(_), true) => {
                // Two queries a CTA: the kernel also takes the chunk's row count.
                let mut args = score_args;
                args.insert(3, (rows as i32).into());
                let grid = (key_blocks, ((rows + 1) / 2) as u32, 1);
                Launch::new(&SRC, "indexer_scores_pair", a.query.dtype(), grid, 2 * SCORE_THREADS, args)
                    .with_smem(PAIR_SMEM)
            }
            (Some(s), false) => {
                // Q's fragments in registers at DeepSeek's dims (one 64-head pass, Di 128).
                let base = if h <= 64 && di == 128 { "indexer_scores_mma128" } else { "indexer_scores_mma" };
                Launch::new(&SRC, base, a.query.dtype(), grid, SCORE_THREADS, score_args).with_smem(s)
            }
            (None, _) => {
                Launch::new(&SRC, "indexer_scores", a.query.dtype(), grid, SCORE_THREADS, score_args)
            }
        });
        let select_args: Vec<Arg> = vec![
            a.out.data_addr().into(),
            a.out.stride(0).into(),
            a.out.stride(1).into(),
            topk32.into(),
            ws.into(),
            l.ld.into(),
            row0.into(),
            (rows as i32).into(),
            a.block_table.data_addr().into(),
            a.block_table.stride(0).into(),
            a.block_table.stride(1).into(),
            nseq.into(),
            bs32.into(),
            a.seq_ids.data_addr().into(),
            a.seq_ids.stride(0).into(),
            a.positions.data_addr().into(),
            a.positions.stride(0).into(),
            pos64.into(),
            l.cap.into(),
            (row_cap as i32).into(),
        ];
        // The selection's kernel has one symbol; `F32` names it (its scores are f32).
        launches.push(
            Launch::new(&SRC, "indexer_select", DType::F32, (rows as u32, 1, 1), SELECT_THREADS, select_args)
                .with_smem(select_smem),
        );
        row0 += rows;
    }
    let name = match (mma, pair) {
        (Some(_), true) => "mma pairs",
        (Some(_), false) => "mma",
        (None, _) => "generic",
    };
    Ok((name, launches))
}

/// The score workspace of every queue.
static WORKSPACES: PerQueue<1> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The address of at least `n` u32 of workspace on this queue.
fn workspace(q: &Queue, cq: &CudaQueue, n: i64) -> Result<u64> {
    let mut all = WORKSPACES
        .lock()
        .map_err(|_| Error::op_failed(OP, BACKEND, "a cache lock was poisoned by a panic"))?;
    let [addr] = scratch::buffers(&mut all, q, cq, [(DType::I32, n)], Fill::Uninit)?;
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::host_view as view;

    fn args<'a>(mem: &'a [u128], dt: DType, (t, h, di): (i64, i64, i64), q_off: i64) -> IndexerTopKArgs<'a> {
        let (nb, bs, mb, topk) = (64, 64, 32, if t > 100 { 8 } else { 2048 });
        IndexerTopKArgs {
            out: view(mem, DType::I32, 0, &[t, topk], &[topk, 1]),
            query: view(mem, dt, (1 << 20) + q_off, &[t, h, di], &[h * di, di, 1]),
            weights: view(mem, DType::F32, 1 << 21, &[t, h], &[h, 1]),
            cache: view(mem, dt, 1 << 22, &[nb, bs, di], &[bs * di, di, 1]),
            block_table: view(mem, DType::I32, 3 << 22, &[4, mb], &[mb, 1]),
            seq_ids: view(mem, DType::I32, 7 << 21, &[t], &[1]),
            positions: view(mem, DType::I64, 1 << 19, &[t], &[1]),
            scale: 0.088,
        }
    }

    #[test]
    fn deepseek_dims_take_the_tensor_cores() {
        let mem = vec![0u128; 1 << 22];
        let a = args(&mem, DType::BF16, (4, 64, 128), 0);
        // Q 64 x 136, three key tiles of 64 x 136, weights, the head halves' sums, flags.
        assert_eq!(mma_smem(&a), Some(64 * 136 * 2 + 3 * 64 * 136 * 2 + 64 * 4 + 512 + 3 * 64));
        let l = layout(&a).expect("layout");
        assert_eq!(l, Layout { cap: 2048, ld: 2048, chunk_rows: 4 });
        let (name, launches) = plan(&a, Kernel::Auto, 1 << 40, &l, 232_448).expect("plan");
        assert_eq!(name, "mma");
        assert_eq!(launches.len(), 2);
        // 4 rows x 32 tiles: one tile a CTA.
        assert_eq!(launches[0].grid, (32, 4, 1));
        // The whole 2048-key row fits the general path's shared memory; the fast path's
        // buffers are larger.
        assert_eq!(launches[1].smem, 97 * 1024);
        assert_eq!(launches[0].symbol(), "indexer_scores_mma128_bf16");
        assert_eq!(launches[1].symbol(), "indexer_select_f32");
    }

    #[test]
    fn other_shapes_fall_back_and_forcing_the_mma_there_is_an_error() {
        let mem = vec![0u128; 1 << 22];
        for a in [
            args(&mem, DType::F32, (4, 64, 128), 0),
            args(&mem, DType::BF16, (4, 64, 40), 0),
            args(&mem, DType::BF16, (4, 64, 128), 1),
        ] {
            assert_eq!(mma_smem(&a), None);
            let l = layout(&a).expect("layout");
            assert_eq!(plan(&a, Kernel::Auto, 1 << 40, &l, DEFAULT_SMEM_OPTIN).expect("plan").0, "generic");
            let err = plan(&a, Kernel::Mma, 1 << 40, &l, DEFAULT_SMEM_OPTIN).expect_err("no mma").to_string();
            assert!(err.contains("IndexerTopK") && err.contains("query"), "{err}");
        }
    }

    #[test]
    fn long_calls_run_in_chunks_of_rows() {
        let mem = vec![0u128; 1 << 22];
        let mut a = args(&mem, DType::BF16, (5000, 4, 16), 0);
        // 2048 blocks of 64: 128k tokens, 512 KiB of scores a row, 512 rows a chunk.
        a.block_table = view(&mem, DType::I32, 3 << 22, &[4, 2048], &[2048, 1]);
        let l = layout(&a).expect("layout");
        assert_eq!((l.cap, l.chunk_rows), (131_072, 512));
        let (_, launches) = plan(&a, Kernel::Auto, 1 << 40, &l, 232_448).expect("plan");
        assert_eq!(launches.len(), 2 * 10);
        let rows: u32 = launches.iter().filter(|x| x.base == "indexer_select").map(|x| x.grid.0).sum();
        assert_eq!(rows, 5000);
        // 16 tiles (1024 keys) a score CTA; select rows of 128k keys beyond the 48,896 that
        // fit in shared memory are read from the workspace.
        assert_eq!(launches[0].grid, (128, 512, 1));
        assert_eq!(launches[1].smem, 36 * 1024 + 48_896 * 4);
    }

    #[test]
    fn prefill_takes_two_queries_a_cta() {
        let mem = vec![0u128; 1 << 22];
        // 9 queries over block_table's 4 sequences: >= 2 a sequence.
        let a = args(&mem, DType::BF16, (9, 64, 128), 0);
        let l = layout(&a).expect("layout");
        let (name, launches) = plan(&a, Kernel::Auto, 1 << 40, &l, 232_448).expect("plan");
        assert_eq!(name, "mma pairs");
        assert_eq!(launches[0].symbol(), "indexer_scores_pair_bf16");
        assert_eq!((launches[0].grid.1, launches[0].block, launches[0].smem), (5, 256, PAIR_SMEM));
        assert_eq!(launches[0].args.len(), launches[1].args.len() + 10);
        // 7 queries: one a CTA.
        let a = args(&mem, DType::BF16, (7, 64, 128), 0);
        assert_eq!(plan(&a, Kernel::Auto, 1 << 40, &l, 232_448).expect("plan").0, "mma");
    }

    #[test]
    fn short_calls_get_more_score_ctas() {
        // Decode at b 1: 1024 tiles of 64 keys at 64k context, 4 a CTA (256 CTAs: the first
        // bench ran a tile a CTA, prologue-bound); b 128: 16 a CTA.
        assert_eq!(tiles_per_cta(1, 65_536), 4);
        assert_eq!(tiles_per_cta(1, 2048), 1);
        assert_eq!(tiles_per_cta(32, 32_768), 16);
        assert_eq!(tiles_per_cta(4, 32_768), 8);
        assert_eq!(tiles_per_cta(128, 65_536), 16);
    }
}
