//! The split-KV partial buffers of MlaDecodeAttention, one set per queue (stream): `(parts +
//! B) * s_q * N * Dv` f32 partial outputs, their lse and a per-sequence index, grown only
//! when a larger shape arrives, so that after warm-up a call allocates nothing.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use cudarc::driver::CudaStream;
use vt_core::{Buffer, DType, Error, Queue, Result};

use super::{lock, OP};
use crate::device::BACKEND;
use crate::CudaQueue;

/// The split-KV partial buffers of one queue.
struct Workspace {
    stream: Weak<CudaStream>,
    part_o: Option<Buffer>,
    part_lse: Option<Buffer>,
    seq_info: Option<Buffer>,
    /// Buffers outgrown after a graph was captured on the queue: kept until the queue goes,
    /// since a captured graph may still read or write them.
    retired: Vec<Buffer>,
}

static WORKSPACES: LazyLock<Mutex<HashMap<usize, Workspace>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Ensures `slot` holds at least `n` elements of `dtype`, allocating on growth only. An
/// outgrown buffer is freed (cuMemFree waits for queued work using it), or moved to
/// `retired` when `keep` (a graph captured on the queue may still use it).
fn ensure(
    q: &Queue,
    slot: &mut Option<Buffer>,
    retired: &mut Vec<Buffer>,
    keep: bool,
    dtype: DType,
    n: i64,
) -> Result<u64> {
    let n = n.max(1);
    if slot.as_ref().is_none_or(|b| b.numel() < n) {
        match slot.take() {
            Some(old) if keep => retired.push(old),
            old => drop(old),
        }
        *slot = Some(Buffer::uninit(q, dtype, &[n])?);
    }
    match slot {
        Some(b) => Ok(b.view().data_addr()),
        None => Err(Error::backend(BACKEND, format!("{OP}: workspace missing"))),
    }
}

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
    // Drop the workspaces of queues that no longer exist (not while this thread captures a
    // graph: freeing memory then would fail the capture; a later call does it).
    if !crate::graph::capturing() {
        all.retain(|_, w| w.stream.strong_count() > 0);
    }
    let key = Arc::as_ptr(&cq.stream) as usize;
    let w = all.entry(key).or_insert_with(|| Workspace {
        stream: Arc::downgrade(&cq.stream),
        part_o: None,
        part_lse: None,
        seq_info: None,
        retired: Vec::new(),
    });
    let keep = cq.has_captured();
    let po = ensure(q, &mut w.part_o, &mut w.retired, keep, DType::F32, slots * rows * dv)?;
    let pl = ensure(q, &mut w.part_lse, &mut w.retired, keep, DType::F32, slots * rows)?;
    let si = ensure(q, &mut w.seq_info, &mut w.retired, keep, DType::I32, 2 * b)?;
    Ok((po, pl, si))
}
