//! IndexerTopK: DeepSeek-V3.2's lightning indexer, kernels-hip/indexer_top_k.hip, two
//! launches per chunk of query rows through a workspace owned by the queue:
//!
//! 1. `indexer_scores_{dtype}`: one block per query row, one thread per visible token, the
//!    CPU reference's arithmetic order (bit-equal scores), stored as order-preserving u32
//!    keys in `[chunk_rows, ld]` (`ld` >= MB * BS, the most tokens a query can see);
//! 2. `indexer_select_f32`: one block per row, an exact radix select of the top `topk` by
//!    (score descending, position ascending), sorted in the row's `[items_ld]` u64 item
//!    workspace (bitonic), written as slots, -1 past them.
//!
//! The workspace (scores, then items) is sized with checked arithmetic and kept at most
//! [`WORKSPACE_BYTES`] by running long calls in chunks of rows (a single row larger than
//! that still runs, alone). The queue keeps it for later calls (grown on a larger one).

use vt_core::{DType, Error, IndexerTopKArgs, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};

const OP: OpId = OpId::IndexerTopK;

/// A call's workspace stays under this (unless one row alone is larger); longer calls
/// run in chunks of rows.
pub(crate) const WORKSPACE_BYTES: i64 = 256 << 20;

/// The workspace's geometry for a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// MB * BS: the most tokens a query can see.
    pub cap: i64,
    /// u32 score keys per workspace row (`cap` rounded up to even, so the items that follow
    /// the scores are 8-byte aligned).
    pub ld: i64,
    /// u64 items per row: `min(topk, cap)` rounded up to a power of two (the bitonic sort's
    /// length).
    pub items_ld: i64,
    /// Query rows per chunk (launch pair).
    pub chunk_rows: i64,
    /// Byte offset of the items behind the scores, and the workspace's size.
    pub items_offset: i64,
    pub bytes: i64,
}

fn overflow(arg: &'static str, what: &str) -> Error {
    Error::invalid(OP, arg, format!("{what} overflows"))
}

pub(crate) fn layout(a: &IndexerTopKArgs<'_>) -> Result<Layout> {
    let (mb, nb, bs) = (a.block_table.dim(1), a.cache.dim(0), a.cache.dim(1));
    let cap = mb.checked_mul(bs).ok_or_else(|| overflow("block_table", "MB x BS"))?;
    // Items hold a token position in 32 bits and `out` holds slots as i32.
    if cap > i64::from(i32::MAX) {
        return Err(Error::invalid(
            OP,
            "block_table",
            format!("MB x BS = {cap} token positions exceed the kernels' i32 range"),
        ));
    }
    let slots = nb.checked_mul(bs).ok_or_else(|| overflow("cache", "NB x BS"))?;
    if slots > i64::from(i32::MAX) {
        return Err(Error::invalid(OP, "cache", format!("NB x BS = {slots} slots exceed the i32 out holds")));
    }
    let ld = (cap.max(1) + 1) / 2 * 2;
    let m = a.out.dim(1).min(cap).max(1);
    let items_ld = i64::try_from(
        u64::try_from(m)
            .map_err(|_| overflow("out", "topk"))?
            .checked_next_power_of_two()
            .unwrap_or(u64::MAX),
    )
    .map_err(|_| overflow("out", "topk's power of two"))?;
    let score_row = ld.checked_mul(4).ok_or_else(|| overflow("block_table", "the score row's bytes"))?;
    let item_row = items_ld.checked_mul(8).ok_or_else(|| overflow("out", "the item row's bytes"))?;
    let row_bytes =
        score_row.checked_add(item_row).ok_or_else(|| overflow("out", "a workspace row's bytes"))?;
    let chunk_rows = (WORKSPACE_BYTES / row_bytes).clamp(1, a.query.dim(0).max(1));
    let items_offset =
        chunk_rows.checked_mul(score_row).ok_or_else(|| overflow("query", "the score workspace's bytes"))?;
    let bytes =
        chunk_rows.checked_mul(row_bytes).ok_or_else(|| overflow("query", "the workspace's bytes"))?;
    Ok(Layout { cap, ld, items_ld, chunk_rows, items_offset, bytes })
}

/// The launches for a workspace at device address `ws` of at least `l.bytes` bytes: per
/// chunk of rows, the scores then the selection. Plain data, no device.
pub(crate) fn plan(a: &IndexerTopKArgs<'_>, l: &Layout, ws: u64) -> Result<Vec<Step>> {
    let t = a.query.dim(0);
    let (h, di) = (a.query.dim(1), a.query.dim(2));
    let (c, bt, w, o) = (&a.cache, &a.block_table, &a.weights, &a.out);
    let wf32 = i32::from(w.dtype() == DType::F32);
    let pos64 = i32::from(a.positions.dtype() == DType::I64);
    let items = ws
        .checked_add(u64::try_from(l.items_offset).map_err(|_| overflow("query", "the workspace offset"))?)
        .ok_or_else(|| overflow("query", "the workspace address"))?;
    let mut launches = Vec::new();
    let mut row0 = 0;
    while row0 < t {
        let rows = l.chunk_rows.min(t - row0);
        let scores = KernelArgs::new()
            .ptr(ws)
            .i64s(&[l.ld, row0, rows])
            .tensor(&a.query)
            .i64s(&[a.query.stride(0), a.query.stride(1)])
            .tensor(w)
            .i64s(&[w.stride(0), w.stride(1)])
            .i32(wf32)
            .tensor(c)
            .i64s(&[c.stride(0), c.stride(1), c.dim(0), c.dim(1)])
            .tensor(bt)
            .i64s(&[bt.stride(0), bt.stride(1), bt.dim(0)])
            .tensor(&a.seq_ids)
            .i64(a.seq_ids.stride(0))
            .tensor(&a.positions)
            .i64(a.positions.stride(0))
            .i32(pos64)
            .i64s(&[l.cap, h, di])
            .f32(a.scale);
        launches.push(Launch::new("indexer_scores", "indexer_top_k.hip", a.query.dtype(), rows, scores)?);
        let select = KernelArgs::new()
            .tensor(o)
            .i64s(&[o.stride(0), o.stride(1), o.dim(1)])
            .ptr(ws)
            .i64(l.ld)
            .ptr(items)
            .i64s(&[l.items_ld, row0, rows])
            .tensor(bt)
            .i64s(&[bt.stride(0), bt.stride(1), bt.dim(0), c.dim(1)])
            .tensor(&a.seq_ids)
            .i64(a.seq_ids.stride(0))
            .tensor(&a.positions)
            .i64(a.positions.stride(0))
            .i32(pos64)
            .i64(l.cap);
        // The selection's kernel has one symbol; `F32` names it (its scores are f32).
        launches.push(Launch::new("indexer_select", "indexer_top_k.hip", DType::F32, rows, select)?);
        row0 += rows;
    }
    Ok(kernels(launches))
}

pub(crate) fn run(q: &Queue, a: &IndexerTopKArgs<'_>) -> Result<()> {
    if a.query.dim(0) == 0 {
        return Ok(());
    }
    let hq = HipQueue::of(OP, q)?;
    let l = layout(a)?;
    let bytes = usize::try_from(l.bytes).map_err(|_| overflow("query", "the workspace's bytes"))?;
    hq.with_scratch(OP, bytes, |ws| hq.run(&plan(a, &l, ws)?))
}

#[cfg(test)]
mod tests {
    use vt_core::{DType, Error, IndexerTopKArgs, OpId, Subject};

    use super::{layout, plan, Layout, WORKSPACE_BYTES};
    use crate::launch::{Arg, Step};
    use crate::selfcheck::Fake;

    fn args(f: &mut Fake, dt: DType, t: i64, topk: i64, mb: i64) -> IndexerTopKArgs<'static> {
        IndexerTopKArgs {
            out: f.c(DType::I32, &[t, topk]).unwrap(),
            query: f.c(dt, &[t, 64, 128]).unwrap(),
            weights: f.c(DType::F32, &[t, 64]).unwrap(),
            cache: f.t(dt, &[64, 64, 128], &[2 * 64 * 128, 128, 1]).unwrap(),
            block_table: f.c(DType::I32, &[4, mb]).unwrap(),
            seq_ids: f.c(DType::I32, &[t]).unwrap(),
            positions: f.c(DType::I64, &[t]).unwrap(),
            scale: 0.088,
        }
    }

    fn kernels(steps: &[Step]) -> Vec<(&str, u32, usize)> {
        steps
            .iter()
            .map(|s| match s {
                Step::Kernel(l) => (l.kernel.as_str(), l.grid, l.args.0.len()),
                Step::Gemm(g) => panic!("{g:?}"),
            })
            .collect()
    }

    /// Decode at DeepSeek's dims: one score and one select launch, a block per query; the
    /// items (topk 2048 of 2048 visible: 2048 a row) follow the scores in the workspace.
    #[test]
    fn decode_is_one_score_and_one_select_launch_over_one_workspace() {
        let mut f = Fake::new();
        let a = args(&mut f, DType::BF16, 4, 2048, 32);
        let l = layout(&a).unwrap();
        let expect = Layout {
            cap: 2048,
            ld: 2048,
            items_ld: 2048,
            chunk_rows: 4,
            items_offset: 4 * 2048 * 4,
            bytes: 4 * 2048 * 12,
        };
        assert_eq!(l, expect);
        let steps = plan(&a, &l, 1 << 40).unwrap();
        assert_eq!(kernels(&steps), [("indexer_scores_bf16", 4, 29), ("indexer_select_f32", 4, 21)]);
        let Step::Kernel(sel) = &steps[1] else { unreachable!() };
        assert_eq!(sel.args.0[4], Arg::Ptr(1 << 40));
        assert_eq!(sel.args.0[6], Arg::Ptr((1 << 40) + 4 * 2048 * 4));
        assert_eq!(sel.args.0[3], Arg::I64(2048), "topk");
    }

    /// A small topk over a long context keeps small item rows; a call whose workspace would
    /// pass WORKSPACE_BYTES runs in chunks of rows, each a score and a select launch.
    #[test]
    fn long_calls_run_in_chunks_and_items_follow_topk() {
        let mut f = Fake::new();
        // 2048 blocks of 64: 128k tokens, 512 KiB of scores a row, topk 3 -> 4 items.
        let a = args(&mut f, DType::F32, 5000, 3, 2048);
        let l = layout(&a).unwrap();
        assert_eq!((l.cap, l.ld, l.items_ld), (131_072, 131_072, 4));
        assert_eq!(l.chunk_rows, WORKSPACE_BYTES / (131_072 * 4 + 32));
        assert!(l.bytes <= WORKSPACE_BYTES);
        let steps = plan(&a, &l, 1 << 40).unwrap();
        let k = kernels(&steps);
        assert_eq!(k.len() as i64, 2 * ((5000 + l.chunk_rows - 1) / l.chunk_rows));
        let rows: u32 = k.iter().filter(|x| x.0 == "indexer_select_f32").map(|x| x.1).sum();
        assert_eq!(rows, 5000);
        // Odd MB x BS: the score rows are padded to even (8-byte aligned items).
        let mut a = args(&mut f, DType::F16, 2, 8, 3);
        a.cache = f.c(DType::F16, &[64, 5, 128]).unwrap();
        let l = layout(&a).unwrap();
        assert_eq!((l.cap, l.ld, l.items_ld, l.items_offset), (15, 16, 8, 2 * 16 * 4));
    }

    #[test]
    fn positions_past_the_kernels_range_are_an_error_naming_block_table() {
        let mut f = Fake::new();
        let mut a = args(&mut f, DType::BF16, 1, 8, 1);
        a.block_table = f.c(DType::I32, &[1, 1 << 26]).unwrap();
        let e = layout(&a).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::InvalidArgument { op: Subject::Op(OpId::IndexerTopK), arg: "block_table", .. }
            ),
            "{e}"
        );
    }
}
