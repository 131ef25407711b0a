//! The sm_90a wgmma PrefillAttention kernel (`kernels-cuda/prefill_attention/sm90.cuh`,
//! whose header comment describes it): 128 query rows per CTA, a producer warpgroup that
//! drives the tensor memory accelerator (TMA) and two consumer warpgroups (384 threads),
//! K/V tiles of 128 keys in a two-stage ring.

use vt_core::{DType, Error, PrefillAttentionArgs, Result, Tensor};

use super::{kernel, Params, OP};
use crate::launch::TensorMapSpec;
use crate::{Arg, Launch};

/// Query rows per CTA (two consumer warpgroups of 64).
pub(super) const TILE_ROWS: i64 = 128;
const BN: u32 = 128;
const STAGES: u32 = 2;
const THREADS: u32 = 384;

/// Dynamic shared memory of one CTA, as `Layout::SMEM` in the kernel file: Q of two
/// warpgroups, two K and two V stages, eight mbarriers, 1 KB of alignment slack.
pub(super) fn smem_bytes(d: u32, dv: u32) -> u32 {
    2 * d * 128 + STAGES * BN * (d + dv) * 2 + 8 * STAGES * 4 + 1024
}

fn base_name(d: i64, dv: i64) -> Option<&'static str> {
    match (d, dv) {
        (192, 128) => Some("prefill_attention_wgmma_192x128"),
        (128, 128) => Some("prefill_attention_wgmma_128x128"),
        (64, 64) => Some("prefill_attention_wgmma_64x64"),
        _ => None,
    }
}

/// The 3-D tensor map (dim, head, token) of a `[T, N, dim]` view, boxes of 64 columns x 1
/// head x 128 tokens with 128-byte swizzle: the layout the kernel's wgmma descriptors read.
/// The caller checked the view with `rows_aligned` (16-byte aligned start, strides of whole
/// 16-byte units, T < 2^31). The maps bound every TMA read by the views' dims (rows past Tk
/// are zero-filled).
fn tensor_map(t: &Tensor<'_>, what: &'static str) -> Result<TensorMapSpec> {
    if !matches!(t.dtype(), DType::BF16 | DType::F16) {
        return Err(Error::invalid(
            OP,
            what,
            format!("the wgmma kernel takes bf16 or f16, not {:?}", t.dtype()),
        ));
    }
    // A dim of size 1 may carry any stride; the map needs a positive multiple of 16 bytes.
    let stride_bytes = |d: usize| if t.dim(d) == 1 { 128 } else { t.stride(d) as u64 * 2 };
    Ok(TensorMapSpec {
        what,
        dtype: t.dtype(),
        addr: t.data_addr(),
        dims: [t.dim(2) as u64, t.dim(1) as u64, t.dim(0) as u64],
        strides: [stride_bytes(1), stride_bytes(0)],
        boxes: [64, 1, BN],
        swizzle: true,
    })
}

/// K/V bytes under which the grid runs tile-major (`order` 1): all heads' K/V stay in L2
/// (50 MB on an H100/H200) while every head's longest causal tiles run first. Above it the
/// CTAs of one head run together so its K/V is read from memory about once.
const TILE_MAJOR_KV_BYTES: i64 = 40 << 20;

/// The grid order for these arguments: 1 (heads fastest, longest tiles first over the whole
/// grid) for causal attention over small K/V, else 0 (query tiles of one head together).
/// `VT_LAB_PREFILL_ORDER=0|1` forces one (measurements in docs/perf.md).
fn grid_order(a: &PrefillAttentionArgs<'_>) -> i32 {
    match std::env::var("VT_LAB_PREFILL_ORDER").ok().as_deref().map(str::trim) {
        Some("0") => return 0,
        Some("1") => return 1,
        Some(v) => {
            // Read per call (a lab switch); said once.
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| tracing::warn!("VT_LAB_PREFILL_ORDER={v:?} ignored: it takes 0 or 1"));
        }
        None => {}
    }
    let kv =
        a.k.dim(0)
            .saturating_mul(a.query.dim(1))
            .saturating_mul(a.query.dim(2) + a.v.dim(2))
            .saturating_mul(2);
    i32::from(a.causal && kv <= TILE_MAJOR_KV_BYTES)
}

pub(super) fn plan(a: &PrefillAttentionArgs<'_>, p: &Params) -> Result<Vec<Launch>> {
    let mut p = *p;
    // Tile-major puts the query tiles on grid.y (at most 65535).
    p.order = if p.q_tiles <= 65_535 { grid_order(a) } else { 0 };
    let p = &p;
    let (d, dv) = (a.query.dim(2), a.v.dim(2));
    let base = base_name(d, dv)
        .ok_or_else(|| Error::invalid(OP, "query", format!("no wgmma kernel for head dims ({d}, {dv})")))?;
    // `pf::sm90::Maps`: the TMA descriptors of K and V, the kernel's second parameter.
    let maps = Arg::TensorMaps(vec![tensor_map(&a.k, "k")?, tensor_map(&a.v, "v")?]);
    // d and dv are one of the pairs above, so the narrowing is exact.
    let smem = smem_bytes(d as u32, dv as u32);
    let (tiles, heads, seqs) = (p.q_tiles as u32, a.query.dim(1) as u32, (a.cu_seqlens_q.dim(0) - 1) as u32);
    let grid = if p.order == 1 { (heads, tiles, seqs) } else { (tiles, heads, seqs) };
    Ok(vec![kernel(base, a.query.dtype(), grid, THREADS, smem, vec![Arg::of_struct(*p), maps])])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wgmma_layout_fits_a_hopper_block() {
        for (d, dv) in super::super::FAST_DIMS {
            assert!(smem_bytes(d as u32, dv as u32) <= 232_448, "({d}, {dv})");
            assert!(base_name(d, dv).is_some());
        }
    }
}
