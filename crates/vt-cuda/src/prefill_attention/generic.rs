//! The generic PrefillAttention kernel: a tiled online-softmax loop with f32 accumulation,
//! for every dtype and head dims (`prefill_attention_generic_*` in
//! `kernels-cuda/prefill_attention.cu`).

use vt_core::{PrefillAttentionArgs, Result};

use super::{grid_fits, kernel, OP};
use crate::rope_from_cache::int;
use crate::{optional_lse, view_args, Arg, Launch};

/// `PF_BQ`, `PF_BK` and `PF_THREADS` of the kernel file.
const BQ: i64 = 16;
const BK: i64 = 16;
const THREADS: u32 = 128;

/// Dynamic shared memory of one block, laid out as the kernel file describes.
fn smem_bytes(d: i64, dv: i64) -> i64 {
    4 * (BQ * d + BK * d + BK * dv + BQ * dv + BQ * BK + 3 * BQ)
}

pub(super) fn plan(a: &PrefillAttentionArgs<'_>) -> Result<Vec<Launch>> {
    let (n, d, dv) = (a.query.dim(1), a.query.dim(2), a.v.dim(2));
    let b = a.cu_seqlens_q.dim(0) - 1;
    let tiles = (a.max_seqlen_q + BQ - 1) / BQ;
    grid_fits(tiles, n, b)?;
    let smem = smem_bytes(d, dv);
    let views = [
        view_args(&a.out),
        optional_lse(a.lse.as_ref()),
        view_args(&a.query),
        view_args(&a.k),
        view_args(&a.v),
    ];
    let mut args: Vec<Arg> = views.concat();
    args.extend::<[Arg; 10]>([
        a.cu_seqlens_q.data_addr().into(),
        a.cu_seqlens_q.stride(0).into(),
        a.cu_seqlens_k.data_addr().into(),
        a.cu_seqlens_k.stride(0).into(),
        a.query.dim(0).into(),
        a.k.dim(0).into(),
        int(OP, "query", d)?.into(),
        int(OP, "v", dv)?.into(),
        a.scale.into(),
        (a.causal as i32).into(),
    ]);
    let grid = (tiles as u32, n as u32, b as u32);
    // The kernel checks each sequence's bounds against Tq / Tk before touching rows.
    let smem = u32::try_from(smem).unwrap_or(u32::MAX);
    Ok(vec![kernel("prefill_attention_generic", a.query.dtype(), grid, THREADS, smem, args)])
}
