//! The split-KV partial buffers of MlaDecodeAttention, one set per queue (stream): `(parts +
//! B) * s_q * N * Dv` f32 partial outputs, their lse and a per-sequence index, grown only
//! when a larger shape arrives, so that after warm-up a call allocates nothing.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use vt_core::{DType, Queue, Result};

use super::lock;
use crate::scratch::{self, Fill, PerQueue};
use crate::CudaQueue;

/// Every queue's split-KV partial buffers: part_o, part_lse, seq_info.
static WORKSPACES: PerQueue<3> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The partial buffers for this queue: (part_o, part_lse, seq_info) addresses.
pub(super) fn workspace(
    q: &Queue,
    cq: &CudaQueue,
    slots: i64,
    rows: i64,
    dv: i64,
    b: i64,
) -> Result<(u64, u64, u64)> {
    let mut all = lock(&WORKSPACES)?;
    let want = [(DType::F32, slots * rows * dv), (DType::F32, slots * rows), (DType::I32, 2 * b)];
    let [po, pl, si] = scratch::buffers(&mut all, q, cq, want, Fill::Uninit)?;
    Ok((po, pl, si))
}
