//! Collectives for tensor parallelism, as a per-device service.
//!
//! A backend registers a [`CommBackend`] per transport it offers for its device type, the
//! way it registers ops ([`register`], keyed by `(DeviceType, transport)`): vt-cuda
//! registers `"nccl"` for CUDA, vt-cpu the `"host"` communicator for the CPU (and
//! `vt_backends::init` for every other device type, since it only needs
//! [`Queue::read_f64`] and [`Queue::write_bytes`]). Libraries built on vt-core (the MLA
//! block's TP code) look a transport up by name ([`backend`]) and only ever see the
//! [`Communicator`] trait.

use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};

use dashmap::DashMap;

use crate::{DeviceType, Error, Queue, Result, Tensor};

/// One rank's end of a group of `world_size` ranks that reduce together.
///
/// Every rank of a group calls each collective the same number of times, in the same
/// order, with the same element count and dtype (the ranks of a tensor-parallel block do,
/// since they run the same steps). When a rank fails, every rank's [`Communicator::abort`]
/// is called so that its peers return an error instead of waiting for it forever.
pub trait Communicator: Send + Sync {
    /// This rank, `0..world_size`.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn world_size(&self) -> usize;
    /// The transport, for messages (`"host"`, `"nccl"`).
    fn transport(&self) -> &'static str;
    /// `x = sum over ranks of x`, in place, ordered on `queue` after the work already
    /// issued there. `x` is a contiguous bf16/f16/f32 view on the queue's device. Every rank
    /// ends with the same values.
    fn all_reduce_sum(&self, queue: &Queue, x: &Tensor<'_>) -> Result<()>;
    /// Stops this rank's pending collectives and makes later ones fail rather than wait.
    /// When one rank fails, the runner aborts every rank's communicator.
    fn abort(&self);
}

/// Makes communicator groups of one transport on one device type.
pub trait CommBackend: Send + Sync {
    /// The transport's name (`"host"`, `"nccl"`), the key it is registered under.
    fn transport(&self) -> &'static str;
    /// Whether ranks of one group may share a device (the host transport: yes, to emulate
    /// ranks; NCCL: no, one rank per device).
    fn ranks_may_share_a_device(&self) -> bool;
    /// One communicator per queue, all in one group: rank `i` issues on `queues[i]`.
    fn group(&self, queues: &[Queue]) -> Result<Vec<Box<dyn Communicator>>>;
}

/// The message of the error peers get after a rank aborted.
pub const ABORTED: &str = "another rank of the tensor-parallel group failed; the group was aborted";

/// `(device type, transport name)` -> the transport's communicator factory.
type CommMap = DashMap<(DeviceType, &'static str), Arc<dyn CommBackend>>;

static COMMS: LazyLock<CommMap> = LazyLock::new(DashMap::new);

/// Registers (or replaces) the `comm.transport()` communicator for `device`.
pub fn register(device: DeviceType, comm: Arc<dyn CommBackend>) {
    COMMS.insert((device, comm.transport()), comm);
}

/// The communicator registered for `device` under `transport`, if any.
pub fn backend(device: DeviceType, transport: &str) -> Option<Arc<dyn CommBackend>> {
    COMMS.iter().find(|e| e.key().0 == device && e.key().1 == transport).map(|e| e.value().clone())
}

/// The transports registered for `device`, sorted by name.
pub fn transports(device: DeviceType) -> Vec<&'static str> {
    let mut names: Vec<&'static str> =
        COMMS.iter().filter(|e| e.key().0 == device).map(|e| e.key().1).collect();
    names.sort_unstable();
    names
}

/// Removes `device`'s communicators (with its ops, by `registry::unregister_device`).
pub(crate) fn unregister_device(device: DeviceType) {
    COMMS.retain(|(d, _), _| *d != device);
}

/// A barrier that can be aborted: once any party aborts, every waiting and later
/// [`Gate::wait`] returns an error instead of blocking (std's `Barrier` would wait forever
/// for a rank that failed). The host communicator meets at these; the TP runner brackets
/// timed steps with them.
pub struct Gate {
    parties: usize,
    state: Mutex<GateState>,
    opened: Condvar,
}

struct GateState {
    arrived: usize,
    /// Incremented each time the gate opens.
    generation: u64,
    aborted: bool,
}

const GATE: &str = "Gate";

impl Gate {
    /// A gate that opens each time `parties` threads wait on it.
    pub fn new(parties: usize) -> Gate {
        Gate {
            parties,
            state: Mutex::new(GateState { arrived: 0, generation: 0, aborted: false }),
            opened: Condvar::new(),
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, GateState>> {
        self.state.lock().map_err(|_| poisoned())
    }

    /// Waits until every party arrived, or errors (with [`ABORTED`]) once the gate was
    /// aborted.
    pub fn wait(&self) -> Result<()> {
        let mut st = self.lock()?;
        if st.aborted {
            return Err(Error::other(GATE, ABORTED));
        }
        let gen = st.generation;
        st.arrived += 1;
        if st.arrived == self.parties {
            st.arrived = 0;
            st.generation += 1;
            self.opened.notify_all();
            return Ok(());
        }
        while st.generation == gen && !st.aborted {
            st = self.opened.wait(st).map_err(|_| poisoned())?;
        }
        if st.generation == gen {
            return Err(Error::other(GATE, ABORTED));
        }
        Ok(())
    }

    /// Wakes every waiting party with an error and makes later waits fail.
    pub fn abort(&self) {
        if let Ok(mut st) = self.state.lock() {
            st.aborted = true;
        }
        self.opened.notify_all();
    }
}

fn poisoned() -> Error {
    Error::other(GATE, "a lock was poisoned by a panicking rank")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aborted_gate_releases_its_waiters_with_an_error() {
        let g = Gate::new(2);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| g.wait());
            std::thread::sleep(std::time::Duration::from_millis(20));
            g.abort();
            let e = waiter.join().map_err(|_| "waiter panicked").and_then(|r| r.err().ok_or("no error"));
            assert!(e.is_ok_and(|e| e.to_string().contains(ABORTED)));
        });
        assert!(g.wait().is_err(), "later waits fail too");
    }

    #[test]
    fn a_gate_opens_for_every_party_repeatedly() {
        let g = Gate::new(3);
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..3).map(|_| s.spawn(|| (0..5).try_for_each(|_| g.wait()))).collect();
            for h in hs {
                assert!(h.join().is_ok_and(|r| r.is_ok()));
            }
        });
    }
}
