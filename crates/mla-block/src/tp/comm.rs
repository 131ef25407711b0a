//! The communicator the tensor-parallel block all-reduces through: a trait with one
//! implementation per transport. [`HostCommunicator`] sums host copies of every rank's
//! buffer (the CPU backend's ranks, tests, and emulating several ranks on one GPU); the NCCL
//! one (feature `nccl`) lives in `tp/nccl.rs`.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use vt_core::{encode_f64, DeviceType, Error, Queue, Result, Tensor};

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

/// The message of the error peers get after a rank aborted.
pub const ABORTED: &str = "another rank of the tensor-parallel group failed; the group was aborted";

const OP: &str = "HostCommunicator";

/// A barrier that can be aborted: once any party aborts, every waiting and later
/// [`Gate::wait`] returns an error instead of blocking (std's `Barrier` would wait forever
/// for a rank that failed).
pub(crate) struct Gate {
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

impl Gate {
    pub(crate) fn new(parties: usize) -> Gate {
        Gate {
            parties,
            state: Mutex::new(GateState { arrived: 0, generation: 0, aborted: false }),
            opened: Condvar::new(),
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, GateState>> {
        self.state.lock().map_err(|_| poisoned())
    }

    /// Waits until every party arrived, or errors once the gate was aborted.
    pub(crate) fn wait(&self) -> Result<()> {
        let mut st = self.lock()?;
        if st.aborted {
            return Err(Error::other(OP, ABORTED));
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
            return Err(Error::other(OP, ABORTED));
        }
        Ok(())
    }

    pub(crate) fn abort(&self) {
        if let Ok(mut st) = self.state.lock() {
            st.aborted = true;
        }
        self.opened.notify_all();
    }
}

fn poisoned() -> Error {
    Error::other(OP, "a lock was poisoned by a panicking rank")
}

struct Shared {
    world_size: usize,
    gate: Gate,
    /// Each rank's contribution to the current all-reduce.
    slots: Mutex<Vec<Vec<f64>>>,
}

/// A communicator whose all-reduce goes through host memory: every rank copies its buffer
/// to the host, the ranks meet at a barrier, each sums all contributions in rank order
/// (in f64, rounded once to the dtype) and writes the sum back. Every rank gets the same
/// bits. Slow (two barriers and a device round trip per call), and meant for the CPU
/// backend, for tests, and for running several ranks on one GPU.
///
/// Supports views on the CPU backend and, with the `nccl` feature, on CUDA.
pub struct HostCommunicator {
    rank: usize,
    shared: Arc<Shared>,
}

impl HostCommunicator {
    /// The `world_size` ranks of one group, rank `i` at index `i`.
    pub fn group(world_size: usize) -> Result<Vec<HostCommunicator>> {
        if world_size == 0 {
            return Err(Error::invalid(OP, "world_size", "a group needs at least one rank"));
        }
        let shared = Arc::new(Shared {
            world_size,
            gate: Gate::new(world_size),
            slots: Mutex::new(vec![Vec::new(); world_size]),
        });
        Ok((0..world_size).map(|rank| HostCommunicator { rank, shared: shared.clone() }).collect())
    }
}

impl Communicator for HostCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world_size
    }

    fn transport(&self) -> &'static str {
        "host"
    }

    fn all_reduce_sum(&self, queue: &Queue, x: &Tensor<'_>) -> Result<()> {
        if x.device() != queue.device() {
            return Err(Error::invalid(
                OP,
                "x",
                format!("is on {}, the queue on {}", x.device(), queue.device()),
            ));
        }
        if !x.is_contiguous() {
            return Err(Error::invalid(OP, "x", format!("must be contiguous, strides {:?}", x.strides())));
        }
        if !x.dtype().is_compute_float() {
            return Err(Error::invalid(OP, "x", format!("dtype {} is not bf16/f16/f32", x.dtype())));
        }
        if !can_write_back(x.device().kind) {
            return Err(Error::invalid(OP, "x", format!("cannot write back to {} memory", x.device())));
        }
        let mine = queue.read_f64(x)?;
        let world = self.shared.world_size;
        if world == 1 {
            return Ok(());
        }
        self.shared.slots.lock().map_err(|_| poisoned())?[self.rank] = mine;
        self.shared.gate.wait()?;
        let sum = {
            let slots = self.shared.slots.lock().map_err(|_| poisoned())?;
            let n = slots[self.rank].len();
            if let Some(r) = slots.iter().position(|s| s.len() != n) {
                Err(Error::invalid(
                    OP,
                    "x",
                    format!("rank {} reduces {n} elements, rank {r} {}", self.rank, slots[r].len()),
                ))
            } else {
                Ok((0..n).map(|i| slots.iter().map(|s| s[i]).sum::<f64>()).collect::<Vec<f64>>())
            }
        };
        // Everyone has read every slot once all pass this second barrier, so the next call
        // may overwrite them.
        self.shared.gate.wait()?;
        write_back(queue, x, &encode_f64(x.dtype(), &sum?))
    }

    fn abort(&self) {
        self.shared.gate.abort()
    }
}

/// Device types whose memory [`write_back`] can write.
fn can_write_back(kind: DeviceType) -> bool {
    kind == DeviceType::Cpu || (cfg!(feature = "nccl") && kind == DeviceType::Cuda)
}

/// Overwrites the contiguous view `x` with `bytes` (exactly its size).
#[cfg_attr(not(feature = "nccl"), allow(unused_variables))]
fn write_back(queue: &Queue, x: &Tensor<'_>, bytes: &[u8]) -> Result<()> {
    let want = x.numel() as usize * x.dtype().size_of();
    if bytes.len() != want {
        return Err(Error::other(OP, format!("{} bytes for a view of {want}", bytes.len())));
    }
    if want == 0 {
        return Ok(());
    }
    match x.device().kind {
        DeviceType::Cpu => {
            // SAFETY: CPU allocations are host memory; `x` is contiguous, so its `want` bytes
            // from `data_addr` lie inside its allocation (vt-core checks a view against its
            // allocation when it is made) and its lifetime keeps the allocation alive. The
            // CPU queue runs ops inline, so no op is touching it, and this rank's output is
            // written by this rank's thread only.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), x.data_addr() as *mut u8, want) };
            Ok(())
        }
        #[cfg(feature = "nccl")]
        DeviceType::Cuda => super::nccl::write_cuda(queue, x, bytes),
        _ => Err(Error::invalid(OP, "x", format!("cannot write back to {} memory", x.device()))),
    }
}
