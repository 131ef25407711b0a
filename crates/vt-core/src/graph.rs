//! Recording a queue's work once and replaying it ([`Graph`], CUDA graphs), and timing work
//! on the device ([`Event`]).
//!
//! Backend-neutral: [`Queue::capture`] runs a closure whose ops are recorded instead of run,
//! and [`Graph::launch`] enqueues a replay on the queue it was captured on. Each backend
//! implements [`QueueImpl::capture`]:
//!
//! | backend | capture | events |
//! |---|---|---|
//! | CUDA | CUDA stream capture in thread-local mode (any sync, allocation or read-back from the capturing thread fails the capture) | CUDA events |
//! | CPU | not supported (its queue runs work inline: nothing to record); [`Queue::capture`] returns [`Error::Unsupported`] | host clock at record time (the work has finished by then) |
//! | HIP | not supported yet ([`Error::Unsupported`]: the HIP backend loads no hipGraph or hipEvent symbols) | not supported |
//!
//! A graph replays the launches it recorded with the addresses they had: every buffer a
//! captured op read or wrote must stay allocated, at the same address, for as long as the
//! graph is replayed; new inputs are written into those buffers (for example by
//! `Queue::write_bytes`, ordered on the queue) before a replay. Code above the backends
//! (mla-block's `DecodeGraphs`) keeps that contract.
//!
//! [`QueueImpl::capture`]: crate::QueueImpl::capture

use std::any::Any;

use crate::{Device, Error, Queue, Result};

/// A backend's recorded graph: [`Graph`] wraps it.
pub trait GraphImpl: Send + Sync {
    /// Enqueues one replay on the queue the graph was captured on (asynchronous, like the
    /// ops themselves).
    fn launch(&self) -> Result<()>;
}

/// The work a closure issued on one queue, recorded by [`Queue::capture`]; [`Graph::launch`]
/// replays it on that queue.
pub struct Graph {
    device: Device,
    inner: Box<dyn GraphImpl>,
}

impl Graph {
    /// Enqueues one replay on the queue it was captured on, ordered after the work already
    /// issued there.
    pub fn launch(&self) -> Result<()> {
        self.inner.launch()
    }

    /// The device of the queue it was captured on.
    pub fn device(&self) -> Device {
        self.device
    }
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph(on {})", self.device)
    }
}

/// A backend's timestamp on a queue: [`Event`] wraps it.
pub trait EventImpl: Send + Sync + Any {
    /// Milliseconds from this event to `later` (an event of the same backend and device),
    /// waiting until `later` has completed.
    fn elapsed_ms(&self, later: &dyn EventImpl) -> Result<f64>;
    /// For backends to downcast `later` to their own event type.
    fn as_any(&self) -> &dyn Any;
}

/// A point in a queue's work, recorded by [`Queue::record_event`]: the difference of two
/// events of one queue is the device time of the work issued between them.
pub struct Event {
    device: Device,
    inner: Box<dyn EventImpl>,
}

impl Event {
    /// Milliseconds from `self` to `later` (recorded after it on the same device); waits
    /// until `later` has completed.
    pub fn elapsed_ms(&self, later: &Event) -> Result<f64> {
        if later.device != self.device {
            return Err(Error::invalid(
                "Event::elapsed_ms",
                "later",
                format!("is an event of {}, this one of {}", later.device, self.device),
            ));
        }
        self.inner.elapsed_ms(later.inner.as_ref())
    }

    pub fn device(&self) -> Device {
        self.device
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event(on {})", self.device)
    }
}

impl Queue {
    /// Whether [`Queue::capture`] can record work on this queue (CUDA: yes; CPU and HIP:
    /// no, see the module docs).
    pub fn supports_capture(&self) -> bool {
        self.queue_impl().supports_capture()
    }

    /// Records the work `f` issues on this queue into a [`Graph`] without running it. Errors
    /// with [`Error::Unsupported`] where the backend cannot capture (check
    /// [`Queue::supports_capture`] first to run eagerly instead), when `f` fails, or when
    /// anything `f` did cannot be captured (on CUDA: a synchronization, an allocation or a
    /// read-back from the capturing thread; warm the work up once outside capture first).
    pub fn capture(&self, f: impl FnOnce() -> Result<()>) -> Result<Graph> {
        if !self.supports_capture() {
            return Err(Error::Unsupported {
                device: self.device().to_string(),
                what: "graph capture",
                msg: capture_unsupported_reason(self.device()),
            });
        }
        let mut f = Some(f);
        let mut call = || match f.take() {
            Some(f) => f(),
            None => Err(Error::other("Queue::capture", "the capture closure was called twice")),
        };
        let inner = self.queue_impl().capture(&mut call).map_err(|e| self.name_device(e))?;
        Ok(Graph { device: self.device(), inner })
    }

    /// Records a timestamp after the work issued so far on this queue (asynchronous on GPU
    /// queues). [`Event::elapsed_ms`] of two events is the device time between them.
    pub fn record_event(&self) -> Result<Event> {
        let inner = self.queue_impl().record_event().map_err(|e| self.name_device(e))?;
        Ok(Event { device: self.device(), inner })
    }

    /// An [`Error::Unsupported`] from a backend's default method, with this queue's device.
    fn name_device(&self, e: Error) -> Error {
        match e {
            Error::Unsupported { what, msg, .. } => {
                Error::Unsupported { device: self.device().to_string(), what, msg }
            }
            e => e,
        }
    }
}

/// Why a device type's queues cannot capture (the [`Error::Unsupported`] message).
fn capture_unsupported_reason(device: Device) -> String {
    match device.kind {
        crate::DeviceType::Cpu => {
            "the CPU queue runs every op inline when it is called, so there is nothing to record; run the \
             steps eagerly (graphs need CUDA)"
                .into()
        }
        crate::DeviceType::Hip => {
            "the HIP backend does not wrap hipGraph yet; run the steps eagerly (graphs need CUDA)".into()
        }
        crate::DeviceType::Cuda => "this CUDA queue cannot capture".into(),
    }
}

/// The [`Error::Unsupported`] of a queue without events, for backends' default
/// [`QueueImpl::record_event`](crate::QueueImpl::record_event).
pub(crate) fn events_unsupported() -> Error {
    Error::Unsupported {
        device: "this backend".into(),
        what: "events",
        msg: "its queues record no timestamps".into(),
    }
}

/// The [`Error::Unsupported`] of the default [`QueueImpl::capture`](crate::QueueImpl::capture).
pub(crate) fn capture_unsupported() -> Error {
    Error::Unsupported {
        device: "this backend".into(),
        what: "graph capture",
        msg: "its queues cannot record work".into(),
    }
}
