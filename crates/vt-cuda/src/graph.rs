//! CUDA graph capture of a sequence of ops on one queue.
//!
//! Capture runs in the driver's thread-local mode: any call from the capturing thread that
//! could synchronize or allocate (cuMemAlloc, a blocking copy, a stream synchronize) fails
//! or invalidates the capture, while other threads are left alone (global mode would make
//! such calls fail in every thread of the process, e.g. another queue's cuBLAS set-up).
//! So [`capture`] is both how a decode step becomes one replayable graph and the check that
//! its ops do neither once warmed up (modules loaded, buffers allocated).

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use vt_core::{Error, Queue, Result};

use crate::device::{drv, BACKEND};
use crate::CudaQueue;

/// A captured, instantiated graph; [`Graph::launch`] replays it on the queue's stream.
pub struct Graph {
    inner: CudaGraph,
}

impl Graph {
    /// Enqueues one replay (asynchronous, like the ops themselves).
    pub fn launch(&self) -> Result<()> {
        self.inner.launch().map_err(drv("launching a CUDA graph"))
    }
}

/// Captures the work `f` issues on `queue` (a CUDA queue) into a graph without running it.
/// Errors if `f` fails, or if anything it did is not capturable (a synchronization, an
/// allocation, a read-back).
pub fn capture(queue: &Queue, f: impl FnOnce() -> Result<()>) -> Result<Graph> {
    let cq = CudaQueue::of(queue, "capture")?;
    cq.stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(drv("beginning stream capture"))?;
    let issued = f();
    // Always end the capture, so the stream is usable again whatever happened.
    let ended = cq.stream.end_capture(CUgraphInstantiate_flags(0));
    issued?;
    match ended {
        Ok(Some(inner)) => Ok(Graph { inner }),
        Ok(None) => Err(Error::backend(BACKEND, "stream capture recorded nothing")),
        Err(e) => Err(Error::backend(
            BACKEND,
            format!("stream capture failed ({e}): an op synchronized, allocated or read back"),
        )),
    }
}
