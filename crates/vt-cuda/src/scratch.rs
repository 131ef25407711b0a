//! Buffers that an op keeps per queue (stream) across calls (split-K partials, score rows,
//! ...): grown only when a larger call arrives, so that after warm-up a call allocates
//! nothing (CUDA graph capture). One copy of the bookkeeping for every op that needs it.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use cudarc::driver::CudaStream;
use vt_core::{Buffer, DType, Queue, Result};

use crate::CudaQueue;

/// One queue's `N` buffers of an op.
pub(crate) struct Scratch<const N: usize> {
    stream: Weak<CudaStream>,
    bufs: [Option<Buffer>; N],
    /// Buffers outgrown after a graph was captured on the queue: a captured graph may still
    /// use them, so they live as long as the queue.
    retired: Vec<Buffer>,
}

/// An op's [`Scratch`] of every queue, keyed by stream:
/// `static X: PerQueue<N> = LazyLock::new(|| Mutex::new(HashMap::new()));`.
pub(crate) type PerQueue<const N: usize> = LazyLock<Mutex<HashMap<usize, Scratch<N>>>>;

/// What a newly allocated buffer holds.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Fill {
    Uninit,
    Zeros,
}

/// The addresses of `cq`'s buffers in `all` (locked by the caller, whose error names its
/// op), buffer `i` holding at least `want[i] = (dtype, elements)` (at least one element).
/// An outgrown buffer is freed first (cuMemFree waits for queued work using it), or retired
/// once a graph was captured on the queue.
pub(crate) fn buffers<const N: usize>(
    all: &mut HashMap<usize, Scratch<N>>,
    q: &Queue,
    cq: &CudaQueue,
    want: [(DType, i64); N],
    fill: Fill,
) -> Result<[u64; N]> {
    // Drop the buffers of queues that no longer exist (not while this thread captures a
    // graph: freeing memory then would fail the capture; a later call does it).
    if !crate::graph::capturing() {
        all.retain(|_, s| s.stream.strong_count() > 0);
    }
    let s = all.entry(Arc::as_ptr(&cq.stream) as usize).or_insert_with(|| Scratch {
        stream: Arc::downgrade(&cq.stream),
        bufs: std::array::from_fn(|_| None),
        retired: Vec::new(),
    });
    let keep = cq.has_captured();
    let mut addrs = [0; N];
    for ((slot, (dtype, n)), addr) in s.bufs.iter_mut().zip(want).zip(&mut addrs) {
        let n = n.max(1);
        let buf = match slot.take() {
            Some(b) if b.numel() >= n => b,
            old => {
                match old {
                    Some(old) if keep => s.retired.push(old),
                    old => drop(old),
                }
                match fill {
                    Fill::Uninit => Buffer::uninit(q, dtype, &[n])?,
                    Fill::Zeros => Buffer::zeros(q, dtype, &[n])?,
                }
            }
        };
        *addr = slot.insert(buf).view().data_addr();
    }
    Ok(addrs)
}
