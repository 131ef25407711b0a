//! The decode kernels' lab timeline (docs/perf.md, "Twentieth session"): a build of
//! `kernels-cuda/mla_decode_attention/schedule.cuh` with `MLA_TIMELINE` defined 1 (through
//! `VT_CUDA_KERNELS_DIR`; `tools/device/timeline.sh` writes the overlay) makes the
//! three-warpgroup kernels record `%globaltimer` stamps and wait sums per CTA (the 16-bit narrow
//! kernels the stamps alone), and the combine
//! kernel its span, into module globals. [`clear`] resets them before a call, [`read`] reads
//! them after it; both answer `None` in the default build, which has no such table.

use vt_core::{Error, Queue, Result};

use super::SRC;
use crate::queue::CudaQueue;

/// Events per CTA (`mla::TL_EVENTS`), in `mla::TL_*` order.
pub const EVENTS: usize = 23;
/// CTAs the table holds (`mla::TL_CTAS`): the first ones by `blockIdx.y * gridDim.x + blockIdx.x`.
pub const CTAS: usize = 1024;

/// Indices into a CTA's row (`mla::TL_*`): stamps in ns of `%globaltimer`, counts, or ns summed.
pub mod ev {
    pub const ENTRY: usize = 0;
    pub const PART: usize = 1;
    pub const Q0: usize = 2;
    pub const TILE0: usize = 3;
    pub const SEG0_END: usize = 4;
    pub const QLAST: usize = 5;
    pub const END0: usize = 6;
    pub const END1: usize = 7;
    pub const SEGS: usize = 8;
    pub const TILES: usize = 9;
    pub const WAIT_FULL0: usize = 10;
    pub const WAIT_PFREE0: usize = 11;
    pub const WAIT_Q0: usize = 12;
    pub const WAIT_PFULL1: usize = 13;
    pub const WAIT_FULL1: usize = 14;
    pub const STORE1: usize = 15;
    pub const WAIT_S0: usize = 16;
    pub const SOFTMAX0: usize = 17;
    pub const LANDED0: usize = 18;
    pub const WAIT_FIN1: usize = 19;
    pub const QLOAD1: usize = 20;
    pub const PV1: usize = 21;
    pub const NEXT0: usize = 22;
}

/// One call's timeline: a row per CTA (all zero for a CTA that did not run or is past
/// [`CTAS`]) and the combine kernel's first start, first start past the main grid, last end
/// (ns) and the number of its CTAs that merged partials.
#[derive(Clone, Debug)]
pub struct Timeline {
    pub ctas: Vec<[u64; EVENTS]>,
    pub combine: [u64; 4],
}

/// A module global: its device address and size in bytes.
type Global = (u64, usize);

/// The table and the combine's fields, `None` in a build without them.
fn globals(q: &Queue) -> Result<Option<(Global, Global)>> {
    let cq = CudaQueue::of(q, "the decode timeline")?;
    let table = cq.device.global(&SRC, "mla_timeline", &cq.stream)?;
    let comb = cq.device.global(&SRC, "mla_timeline_combine", &cq.stream)?;
    match (table, comb) {
        (Some(t), Some(c)) => {
            if t.1 != CTAS * EVENTS * 8 || c.1 != 4 * 8 {
                return Err(Error::backend(
                    crate::device::BACKEND,
                    format!(
                        "the decode timeline's tables have {} and {} bytes, not {} and 32",
                        t.1,
                        c.1,
                        CTAS * EVENTS * 8
                    ),
                ));
            }
            Ok(Some((t, c)))
        }
        _ => Ok(None),
    }
}

/// Zeroes the table (the combine's first-start fields to `u64::MAX`, as it takes minima);
/// `Ok(false)` in a build without it. Ordered on the queue before the next call.
pub fn clear(q: &Queue) -> Result<bool> {
    let Some(((t, tn), (c, _))) = globals(q)? else { return Ok(false) };
    let cq = CudaQueue::of(q, "the decode timeline")?;
    let zeros = vec![0u8; tn];
    let comb: Vec<u8> = [u64::MAX, u64::MAX, 0, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
    // SAFETY: both addresses are module globals of exactly these sizes (checked in `globals`).
    unsafe {
        vt_core::QueueImpl::copy_h2d(cq, t, &zeros)?;
        vt_core::QueueImpl::copy_h2d(cq, c, &comb)?;
    }
    Ok(true)
}

/// The timeline of the calls since [`clear`] (after every queued call: it synchronizes);
/// `None` in a build without it.
pub fn read(q: &Queue) -> Result<Option<Timeline>> {
    let Some(((t, tn), (c, cn))) = globals(q)? else { return Ok(None) };
    let cq = CudaQueue::of(q, "the decode timeline")?;
    let mut raw = vec![0u8; tn];
    let mut craw = vec![0u8; cn];
    // SAFETY: both addresses are module globals of exactly these sizes (checked in `globals`).
    unsafe {
        vt_core::QueueImpl::copy_d2h(cq, t, &mut raw)?;
        vt_core::QueueImpl::copy_d2h(cq, c, &mut craw)?;
    }
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    let ctas = raw
        .chunks_exact(EVENTS * 8)
        .map(|row| {
            let mut r = [0u64; EVENTS];
            for (i, w) in row.chunks_exact(8).enumerate() {
                r[i] = word(w);
            }
            r
        })
        .collect();
    let mut combine = [0u64; 4];
    for (i, w) in craw.chunks_exact(8).enumerate() {
        combine[i] = word(w);
    }
    Ok(Some(Timeline { ctas, combine }))
}
