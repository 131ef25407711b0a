//! The sm_80+ mma.sync PrefillAttention kernel (`kernels-cuda/prefill_attention/sm80.cuh`).

use vt_core::{Error, PrefillAttentionArgs, Result};

use super::{Params, OP};
use crate::device::BACKEND;
use crate::CudaQueue;

/// Query rows per CTA.
pub(super) const TILE_ROWS: i64 = 64;

pub(super) fn run(_cq: &CudaQueue, _a: &PrefillAttentionArgs<'_>, _p: &Params) -> Result<()> {
    Err(Error::backend(BACKEND, format!("{OP}: the mma.sync kernel is not built yet")))
}
