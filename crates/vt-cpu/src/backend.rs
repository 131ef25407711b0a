//! The CPU [`Backend`]: one device (the host), 256-byte aligned `std::alloc`
//! allocations, and a queue that runs work inline (copies are memcpy).

use std::alloc::Layout;
use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use vt_core::{Backend, DeviceType, Error, EventImpl, QueueImpl, Result};

/// Alignment of every host allocation (what GPU allocators guarantee, so code tested on
/// the CPU sees the same alignment).
const ALIGN: usize = 256;

pub(crate) struct CpuBackend;

impl CpuBackend {
    fn layout(bytes: usize) -> Result<Layout> {
        Layout::from_size_align(bytes.max(1), ALIGN)
            .map_err(|e| Error::backend("cpu", format!("cannot allocate {bytes} bytes: {e}")))
    }

    fn check_ordinal(ordinal: usize) -> Result<()> {
        if ordinal != 0 {
            return Err(Error::NoDevice {
                device: format!("cpu:{ordinal}"),
                msg: "the CPU backend has 1 device".into(),
            });
        }
        Ok(())
    }
}

impl Backend for CpuBackend {
    fn kind(&self) -> DeviceType {
        DeviceType::Cpu
    }

    fn description(&self) -> String {
        "cpu: host memory, ops run inline (reference backend)".into()
    }

    fn device_count(&self) -> usize {
        1
    }

    fn device_name(&self, _ordinal: usize) -> String {
        format!(
            "host CPU ({} threads available)",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        )
    }

    fn new_queue(&self, ordinal: usize) -> Result<Arc<dyn QueueImpl>> {
        Self::check_ordinal(ordinal)?;
        Ok(Arc::new(CpuQueue))
    }

    fn alloc(&self, ordinal: usize, bytes: usize) -> Result<u64> {
        Self::check_ordinal(ordinal)?;
        let layout = Self::layout(bytes)?;
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(Error::backend("cpu", format!("out of host memory allocating {bytes} bytes")));
        }
        Ok(p as u64)
    }

    unsafe fn free(&self, _ordinal: usize, addr: u64, bytes: usize) {
        if let Ok(layout) = Self::layout(bytes) {
            // SAFETY: the caller guarantees `addr` came from `alloc(_, bytes)`, which used
            // this same layout, and is not used afterwards.
            unsafe { std::alloc::dealloc(addr as *mut u8, layout) }
        }
    }
}

/// The CPU queue: every op has finished when its call returns.
pub(crate) struct CpuQueue;

impl QueueImpl for CpuQueue {
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    unsafe fn copy_h2d(&self, dst: u64, src: &[u8]) -> Result<()> {
        // SAFETY: the caller guarantees `dst..dst+len` lies in a live host allocation;
        // `src` is a Rust slice, so the two cannot overlap a live reference wrongly.
        unsafe { std::ptr::copy(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn copy_d2h(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        // SAFETY: the caller guarantees `src..src+len` lies in a live host allocation.
        unsafe { std::ptr::copy(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    // No `capture`: the queue runs every op inline, so there is nothing to record (the
    // default `supports_capture` is false and `Queue::capture` says why).

    /// The host clock: every op issued before has finished when this is called.
    fn record_event(&self) -> Result<Box<dyn EventImpl>> {
        Ok(Box::new(CpuEvent(Instant::now())))
    }
}

/// A CPU timestamp.
struct CpuEvent(Instant);

impl EventImpl for CpuEvent {
    fn elapsed_ms(&self, later: &dyn EventImpl) -> Result<f64> {
        let Some(later) = later.as_any().downcast_ref::<CpuEvent>() else {
            return Err(Error::backend("cpu", "Event::elapsed_ms: the later event is not a CPU event"));
        };
        Ok(later.0.saturating_duration_since(self.0).as_secs_f64() * 1e3)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
