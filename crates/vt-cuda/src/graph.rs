//! CUDA graph capture of a sequence of ops on one queue, and CUDA events: the CUDA
//! implementation of `vt_core::Queue::capture` / `record_event` (see `vt_core::graph`).
//!
//! Capture runs in the driver's thread-local mode: any call from the capturing thread that
//! could synchronize or allocate (cuMemAlloc, a blocking copy, a stream synchronize) fails
//! or invalidates the capture, while other threads are left alone (global mode would make
//! such calls fail in every thread of the process, e.g. another queue's cuBLAS set-up).
//! So a capture is both how a decode step becomes one replayable graph and the check that
//! its ops do neither once warmed up (modules loaded, buffers allocated).
//!
//! Once a queue has captured a graph, buffers an op caches per queue (MlaDecodeAttention's
//! split-KV partials) are never freed while the queue lives, even when a later, larger call
//! grows them: a graph may still read the old ones.

use std::any::Any;
use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaGraph};
use vt_core::{Error, EventImpl, GraphImpl, Queue, Result};

use crate::device::{drv, BACKEND};
use crate::CudaQueue;

/// A captured, instantiated graph; `launch` replays it on the stream it was captured on.
pub(crate) struct CudaGraphImpl {
    /// cuGraphLaunch calls on one executable graph must be serialized.
    inner: Mutex<CudaGraph>,
}

// SAFETY: the graph's handles are plain driver objects usable from any thread once the
// context is bound (CudaGraph::launch binds it); the mutex serializes every use of them, as
// the driver requires for one graph object.
unsafe impl Send for CudaGraphImpl {}
unsafe impl Sync for CudaGraphImpl {}

impl GraphImpl for CudaGraphImpl {
    fn launch(&self) -> Result<()> {
        let g =
            self.inner.lock().map_err(|_| Error::backend(BACKEND, "a graph lock was poisoned by a panic"))?;
        g.launch().map_err(drv("launching a CUDA graph"))
    }
}

thread_local! {
    /// Whether this thread is inside [`capture_on`]'s closure.
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is capturing (inside `Queue::capture` on a CUDA queue): it may
/// then make no allocation, free, synchronization or read-back. Ops that tidy up host-side
/// caches (freeing buffers of dropped queues) defer that work while this is true.
pub(crate) fn capturing() -> bool {
    CAPTURING.with(Cell::get)
}

/// Captures the work `f` issues on `cq`'s stream into an instantiated graph.
pub(crate) fn capture_on(cq: &CudaQueue, f: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn GraphImpl>> {
    cq.stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(drv("beginning stream capture"))?;
    let issued = {
        /// Restores the flag however `f` returns (a panic included).
        struct Flag(bool);
        impl Drop for Flag {
            fn drop(&mut self) {
                CAPTURING.with(|c| c.set(self.0));
            }
        }
        let _flag = Flag(CAPTURING.with(|c| c.replace(true)));
        f()
    };
    // Always end the capture, so the stream is usable again whatever happened.
    let ended = cq.stream.end_capture(CUgraphInstantiate_flags(0));
    issued?;
    match ended {
        Ok(Some(inner)) => {
            cq.captured.store(true, Ordering::Release);
            Ok(Box::new(CudaGraphImpl { inner: Mutex::new(inner) }))
        }
        Ok(None) => Err(Error::backend(BACKEND, "stream capture recorded nothing")),
        Err(e) => Err(Error::backend(
            BACKEND,
            format!("stream capture failed ({e}): an op synchronized, allocated or read back"),
        )),
    }
}

/// A CUDA event with timing, recorded on a queue's stream.
pub(crate) struct CudaEventImpl(CudaEvent);

impl CudaEventImpl {
    pub(crate) fn record(cq: &CudaQueue) -> Result<CudaEventImpl> {
        let ev = cq
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("recording an event"))?;
        Ok(CudaEventImpl(ev))
    }
}

impl EventImpl for CudaEventImpl {
    fn elapsed_ms(&self, later: &dyn EventImpl) -> Result<f64> {
        let Some(later) = later.as_any().downcast_ref::<CudaEventImpl>() else {
            return Err(Error::backend(BACKEND, "Event::elapsed_ms: the later event is not a CUDA event"));
        };
        // Waits for both events (cuEventSynchronize), then cuEventElapsedTime.
        self.0.elapsed_ms(&later.0).map(f64::from).map_err(drv("reading an event"))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Captures the work `f` issues on `queue` (a CUDA queue) into a graph without running it:
/// `queue.capture(f)` with an error naming the queue when it is not a CUDA queue. Errors if
/// `f` fails, or if anything it did is not capturable (a synchronization, an allocation, a
/// read-back).
pub fn capture(queue: &Queue, f: impl FnOnce() -> Result<()>) -> Result<vt_core::Graph> {
    CudaQueue::of(queue, "capture")?;
    queue.capture(f)
}
