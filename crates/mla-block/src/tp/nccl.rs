//! The CUDA side of tensor parallelism (feature `nccl`): the NCCL communicator, and the
//! host-to-device write [`super::HostCommunicator`] needs to emulate ranks on CUDA.

use vt_core::{Error, Queue, QueueImpl, Result, Tensor};
use vt_cuda::nccl::NcclComm;
use vt_cuda::CudaQueue;

use super::comm::Communicator;

/// NCCL all-reduce (`ncclAllReduce`, sum) on each rank's own CUDA stream. One rank per
/// device, all made at once by `ncclCommInitAll` with `NCCL_NVLS_ENABLE=0`.
pub struct NcclCommunicator(NcclComm);

impl NcclCommunicator {
    /// One communicator per queue; `queues[i]` is rank `i`, each on its own CUDA device.
    /// Errors if libnccl is missing (naming it), a queue is not CUDA, or a device repeats.
    pub fn group(queues: &[Queue]) -> Result<Vec<NcclCommunicator>> {
        let refs: Vec<&Queue> = queues.iter().collect();
        Ok(NcclComm::init_all(&refs)?.into_iter().map(NcclCommunicator).collect())
    }

    /// The NCCL library's version, `major.minor.patch`.
    pub fn version() -> Result<String> {
        let (a, b, c) = vt_cuda::nccl::version()?;
        Ok(format!("{a}.{b}.{c}"))
    }
}

impl Communicator for NcclCommunicator {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn world_size(&self) -> usize {
        self.0.world_size()
    }

    fn transport(&self) -> &'static str {
        "nccl"
    }

    fn all_reduce_sum(&self, queue: &Queue, x: &Tensor<'_>) -> Result<()> {
        self.0.all_reduce_sum(queue, x)
    }

    fn abort(&self) {
        self.0.abort()
    }
}

/// Copies `bytes` into the contiguous CUDA view `x`, ordered on `queue`'s stream.
pub(crate) fn write_cuda(queue: &Queue, x: &Tensor<'_>, bytes: &[u8]) -> Result<()> {
    let cq = queue
        .downcast::<CudaQueue>()
        .ok_or_else(|| Error::invalid("HostCommunicator", "queue", "is not a CUDA queue"))?;
    // SAFETY: `x` is a contiguous view of exactly `bytes.len()` bytes (checked by the caller)
    // inside a live allocation of the queue's device (vt-core checks views against their
    // allocation; the borrow keeps it alive for this call, and the copy has read `bytes`
    // when it returns).
    unsafe { cq.copy_h2d(x.data_addr(), bytes) }
}
