//! The sm_90a wgmma PrefillAttention kernel (`kernels-cuda/prefill_attention/sm90.cuh`).

use vt_core::{Error, PrefillAttentionArgs, Result};

use super::{Params, OP};
use crate::device::BACKEND;
use crate::CudaQueue;

/// Query rows per CTA (two consumer warpgroups of 64).
pub(super) const TILE_ROWS: i64 = 128;

pub(super) fn run(_cq: &CudaQueue, _a: &PrefillAttentionArgs<'_>, _p: &Params) -> Result<()> {
    Err(Error::backend(BACKEND, format!("{OP}: the wgmma kernel is not built yet")))
}
