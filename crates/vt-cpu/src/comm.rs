//! The host communicator: tensor-parallel all-reduce through host memory. Registered for
//! the CPU by [`crate::register`] (and by `vt_backends::init` for the GPU device types,
//! to emulate several ranks on one GPU): it only reads and writes views through the
//! queue's safe copies, so it works on any backend.

use std::sync::{Arc, Mutex};

use vt_core::comm::{CommBackend, Communicator, Gate};
use vt_core::{encode_f64, Error, Queue, Result, Tensor};

const OP: &str = "HostCommunicator";

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
        HostTransport.transport()
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
        queue.write_bytes(x, &encode_f64(x.dtype(), &sum?))
    }

    fn abort(&self) {
        self.shared.gate.abort()
    }
}

/// The `"host"` transport: groups of [`HostCommunicator`]s, any number of ranks, several
/// of them may share a device.
pub struct HostTransport;

impl CommBackend for HostTransport {
    fn transport(&self) -> &'static str {
        "host"
    }

    fn ranks_may_share_a_device(&self) -> bool {
        true
    }

    fn group(&self, queues: &[Queue]) -> Result<Vec<Box<dyn Communicator>>> {
        Ok(HostCommunicator::group(queues.len())?
            .into_iter()
            .map(|c| Box::new(c) as Box<dyn Communicator>)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vt_core::{Buffer, DType, Device};

    #[test]
    fn ranks_get_the_sum_and_a_bad_view_is_an_error() -> Result<()> {
        crate::register();
        let comms = HostTransport.group(&[Queue::new(Device::CPU)?, Queue::new(Device::CPU)?])?;
        let q = Queue::new(Device::CPU)?;
        let bufs = [
            Buffer::from_f64(&q, DType::F32, &[3], &[1.0, 2.0, 3.0])?,
            Buffer::from_f64(&q, DType::F32, &[3], &[10.0, 20.0, 30.0])?,
        ];
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> =
                comms.iter().zip(&bufs).map(|(c, b)| s.spawn(|| c.all_reduce_sum(&q, &b.view()))).collect();
            hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(poisoned()))).collect()
        });
        results.into_iter().collect::<Result<()>>()?;
        for b in &bufs {
            assert_eq!(b.to_f64(&q)?, vec![11.0, 22.0, 33.0]);
        }
        let ints = Buffer::zeros(&q, DType::I32, &[3])?;
        let e = comms[0].all_reduce_sum(&q, &ints.view()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("not bf16/f16/f32"), "{e}");
        Ok(())
    }
}
