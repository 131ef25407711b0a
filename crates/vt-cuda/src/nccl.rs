//! NCCL all-reduce across the CUDA devices of one process, for tensor parallelism.
//!
//! One communicator per device, made together by `ncclCommInitAll` ([`NcclComm::init_all`]),
//! one host thread per device driving its own communicator on its own queue's stream.
//! [`crate::register`] registers [`NcclTransport`] as CUDA's `"nccl"` communicator
//! (`vt_core::comm`), which is how the MLA block's tensor parallelism reaches it.
//!
//! libnccl is loaded at run time (cudarc's dynamic loading), and only when a communicator
//! is made or [`version`] is asked: [`crate::register`] never touches it, so a machine
//! without NCCL registers the backend and runs everything except tensor parallelism over
//! several devices. cudarc panics when a library it needs is missing, so every entry point
//! checks first ([`available`]) and returns an error instead.
//!
//! NVLink SHARP / multicast (NVLS) stays off: [`NcclComm::init_all`] sets
//! `NCCL_NVLS_ENABLE=0` before NCCL reads its environment, because a program that uses
//! multicast can put a shared host's GPUs out of service.

use std::ffi::CStr;
use std::sync::{Arc, Mutex};

use cudarc::nccl::{result, sys};
use vt_core::comm::{CommBackend, Communicator};
use vt_core::{DType, Device, DeviceType, Error, Queue, Result, Tensor};

use crate::device::{drv, library_present, DeviceState};
use crate::queue::CudaQueue;

const NCCL: &str = "nccl";

/// The environment variable that enables NVLink SHARP (multicast) in NCCL; kept at `0`.
pub const NVLS_ENV: &str = "NCCL_NVLS_ENABLE";

/// Whether libnccl loads under one of the names cudarc tries (`libnccl.so`, ...).
pub fn available() -> bool {
    library_present(NCCL)
}

/// An error saying libnccl is missing, with a hint when only NCCL's versioned file name
/// (what the `nvidia-nccl` wheels and `libnccl2` packages ship) would load.
fn missing() -> Error {
    // SAFETY: as in `library_present`: loading runs the library's initializers only.
    let versioned = unsafe { libloading::Library::new("libnccl.so.2") }.is_ok();
    let hint = if versioned {
        "; only libnccl.so.2 loads: put a `libnccl.so` link to it in a directory on LD_LIBRARY_PATH"
    } else {
        "; install NCCL (libnccl2, or the nvidia-nccl-cu13 wheel) and put its lib directory on LD_LIBRARY_PATH"
    };
    Error::backend(
        NCCL,
        format!(
            "libnccl not found (tried {}){hint}; NCCL is needed for tensor parallelism on CUDA",
            cudarc::get_lib_name_candidates(NCCL).join(", ")
        ),
    )
}

fn ensure_loaded() -> Result<()> {
    if available() {
        Ok(())
    } else {
        Err(missing())
    }
}

/// Maps an NCCL status to the workspace error, with NCCL's own text for it.
fn nerr(what: &'static str) -> impl Fn(result::NcclError) -> Error {
    move |e| {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any status.
        let text = unsafe { CStr::from_ptr(sys::ncclGetErrorString(e.0)) }.to_string_lossy();
        Error::backend(NCCL, format!("{what}: {:?} ({text})", e.0))
    }
}

/// NCCL's version as (major, minor, patch).
pub fn version() -> Result<(i32, i32, i32)> {
    ensure_loaded()?;
    let v = result::get_nccl_version().map_err(nerr("ncclGetVersion"))?;
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch, older ones major*1000 + ...
    Ok(if v >= 10000 {
        (v / 10000, (v % 10000) / 100, v % 100)
    } else {
        (v / 1000, (v % 1000) / 100, v % 100)
    })
}

fn nccl_dtype(dt: DType) -> Option<sys::ncclDataType_t> {
    match dt {
        DType::F32 => Some(sys::ncclDataType_t::ncclFloat32),
        DType::BF16 => Some(sys::ncclDataType_t::ncclBfloat16),
        DType::F16 => Some(sys::ncclDataType_t::ncclFloat16),
        _ => None,
    }
}

/// A raw communicator handle; only touched under [`NcclComm`]'s mutex.
struct Handle(sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; the mutex in
// `NcclComm` serializes the calls.
unsafe impl Send for Handle {}

/// One rank of a communicator group: a device, its rank and the group size.
pub struct NcclComm {
    handle: Mutex<Handle>,
    device: Arc<DeviceState>,
    ordinal: usize,
    rank: usize,
    world_size: usize,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclComm(rank {} of {} on cuda:{})", self.rank, self.world_size, self.ordinal)
    }
}

impl NcclComm {
    /// One communicator per queue, all in one group (`ncclCommInitAll`): rank `i` is
    /// `queues[i]`'s device. The queues must be CUDA queues on distinct devices (NCCL
    /// refuses a device twice). Sets `NCCL_NVLS_ENABLE=0` first (see the module docs);
    /// call it before other threads start reading the environment.
    pub fn init_all(queues: &[&Queue]) -> Result<Vec<NcclComm>> {
        if queues.is_empty() {
            return Err(Error::invalid("NcclComm::init_all", "queues", "needs at least one queue"));
        }
        let mut states = Vec::with_capacity(queues.len());
        let mut ordinals: Vec<i32> = Vec::with_capacity(queues.len());
        for q in queues {
            let d = q.device();
            if d.kind != DeviceType::Cuda {
                return Err(Error::invalid(
                    "NcclComm::init_all",
                    "queues",
                    format!("{d} is not a CUDA device"),
                ));
            }
            if ordinals.contains(&(d.ordinal as i32)) {
                return Err(Error::invalid(
                    "NcclComm::init_all",
                    "queues",
                    format!("{d} appears twice: NCCL needs one rank per device"),
                ));
            }
            states.push(CudaQueue::of(q, "NcclComm::init_all")?.device.clone());
            ordinals.push(d.ordinal as i32);
        }
        ensure_loaded()?;
        if std::env::var(NVLS_ENV).ok().as_deref() != Some("0") {
            if let Ok(v) = std::env::var(NVLS_ENV) {
                tracing::warn!("{NVLS_ENV}={v} overridden: NVLink multicast stays off");
            }
            std::env::set_var(NVLS_ENV, "0");
        }
        let mut comms = vec![std::ptr::null_mut(); queues.len()];
        // SAFETY: `comms` has room for one handle per device in `ordinals`, both of length
        // `queues.len()`; NCCL fills every entry on success.
        unsafe { result::comm_init_all(comms.as_mut_ptr(), ordinals.len() as i32, ordinals.as_ptr()) }
            .map_err(nerr("ncclCommInitAll"))?;
        let world_size = comms.len();
        tracing::debug!(world_size, ?ordinals, "NCCL communicators made");
        Ok(comms
            .into_iter()
            .zip(states)
            .zip(ordinals)
            .enumerate()
            .map(|(rank, ((c, device), ordinal))| NcclComm {
                handle: Mutex::new(Handle(c)),
                device,
                ordinal: ordinal as usize,
                rank,
                world_size,
            })
            .collect())
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The device this rank runs on.
    pub fn device(&self) -> Device {
        Device::new(DeviceType::Cuda, self.ordinal)
    }

    /// Sums `x` over every rank, in place, ordered on `queue`'s stream (asynchronous, like
    /// an op). `x` is a contiguous bf16/f16/f32 view on this rank's device; every rank must
    /// call this with the same element count and dtype (the collective waits for all).
    pub fn all_reduce_sum(&self, queue: &Queue, x: &Tensor<'_>) -> Result<()> {
        const OP: &str = "NcclComm::all_reduce_sum";
        let dev = self.device();
        if queue.device() != dev || x.device() != dev {
            return Err(Error::invalid(
                OP,
                "x",
                format!(
                    "rank {} is on {dev}; got queue {} and x on {}",
                    self.rank,
                    queue.device(),
                    x.device()
                ),
            ));
        }
        if !x.is_contiguous() {
            return Err(Error::invalid(OP, "x", format!("must be contiguous, strides {:?}", x.strides())));
        }
        let Some(dtype) = nccl_dtype(x.dtype()) else {
            return Err(Error::invalid(OP, "x", format!("dtype {} is not bf16/f16/f32", x.dtype())));
        };
        if x.numel() == 0 {
            return Ok(());
        }
        let cq = CudaQueue::of(queue, OP)?;
        self.device.ctx.bind_to_thread().map_err(drv("binding the context"))?;
        let h = self.handle.lock().map_err(|_| Error::backend(NCCL, "a communicator lock was poisoned"))?;
        if h.0.is_null() {
            return Err(Error::backend(NCCL, format!("rank {}'s communicator was aborted", self.rank)));
        }
        let ptr = x.data_addr() as *mut std::ffi::c_void;
        // SAFETY: `x` is a contiguous view of `numel` elements of `dtype` in a live
        // allocation of this rank's device (vt-core checked the view; its lifetime keeps the
        // memory alive until the call returns, and the caller keeps it until the stream has
        // run the collective, as for any op). In place (send == recv) is allowed by NCCL.
        // The stream belongs to the same device as the communicator.
        unsafe {
            result::all_reduce(
                ptr,
                ptr,
                x.numel() as usize,
                dtype,
                sys::ncclRedOp_t::ncclSum,
                h.0,
                cq.cu_stream() as sys::cudaStream_t,
            )
        }
        .map(|_| ())
        .map_err(nerr("ncclAllReduce"))
    }

    /// Aborts the communicator: NCCL stops this rank's collectives still running on the
    /// device, and later calls return an error. Aborting every rank's communicator of a
    /// group is how a group stops when one rank failed (its peers would otherwise wait on
    /// the device for a collective that never comes).
    pub fn abort(&self) {
        if let Ok(mut h) = self.handle.lock() {
            if !h.0.is_null() {
                let _ = self.device.ctx.bind_to_thread();
                // SAFETY: the handle came from ncclCommInitAll and is released here once
                // (nulled, so Drop skips it).
                let _ = unsafe { result::comm_abort(h.0) };
                h.0 = std::ptr::null_mut();
            }
        }
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn transport(&self) -> &'static str {
        NCCL
    }

    fn all_reduce_sum(&self, queue: &Queue, x: &Tensor<'_>) -> Result<()> {
        NcclComm::all_reduce_sum(self, queue, x)
    }

    fn abort(&self) {
        NcclComm::abort(self)
    }
}

/// The `"nccl"` transport vt-cuda registers for CUDA devices: one rank per device, the
/// group made by [`NcclComm::init_all`]. Registering it does not load libnccl.
pub struct NcclTransport;

impl CommBackend for NcclTransport {
    fn transport(&self) -> &'static str {
        NCCL
    }

    fn ranks_may_share_a_device(&self) -> bool {
        false
    }

    fn group(&self, queues: &[Queue]) -> Result<Vec<Box<dyn Communicator>>> {
        let refs: Vec<&Queue> = queues.iter().collect();
        Ok(NcclComm::init_all(&refs)?.into_iter().map(|c| Box::new(c) as Box<dyn Communicator>).collect())
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let Ok(h) = self.handle.get_mut() else { return };
        if h.0.is_null() {
            return;
        }
        let _ = self.device.ctx.bind_to_thread();
        // SAFETY: the handle came from ncclCommInitAll and is destroyed once.
        if let Err(e) = unsafe { result::comm_destroy(h.0) } {
            tracing::warn!("ncclCommDestroy on cuda:{}: {:?}", self.ordinal, e.0);
        }
        h.0 = std::ptr::null_mut();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without libnccl (CI), asking for NCCL is an error that names it, never a panic.
    #[test]
    fn missing_nccl_is_an_error_not_a_panic() {
        if available() {
            let (major, minor, _) = version().unwrap();
            assert!(major >= 2, "NCCL {major}.{minor}");
            return;
        }
        let e = version().unwrap_err().to_string();
        assert!(e.contains("libnccl not found") && e.contains("tensor parallelism"), "{e}");
    }

    #[test]
    fn init_all_without_queues_is_an_error() {
        let e = NcclComm::init_all(&[]).unwrap_err().to_string();
        assert!(e.contains("at least one queue"), "{e}");
    }

    /// On a machine with CUDA and NCCL: a single-rank group's all-reduce leaves the data as
    /// it is; with two or more devices, every rank gets the sum.
    #[test]
    fn all_reduce_sums_over_the_devices_found() {
        if !matches!(crate::register(), vt_core::Probe::Registered { .. }) || !available() {
            eprintln!("skipped: no CUDA device or no libnccl");
            return;
        }
        let n = vt_core::registry::backend(DeviceType::Cuda).map_or(0, |b| b.device_count());
        let queues: Vec<Queue> =
            (0..n).map(|i| Queue::new(Device::new(DeviceType::Cuda, i)).unwrap()).collect();
        let refs: Vec<&Queue> = queues.iter().collect();
        let comms = NcclComm::init_all(&refs).unwrap();
        let len = 1000usize;
        for dt in [DType::F32, DType::BF16] {
            let bufs: Vec<vt_core::Buffer> = queues
                .iter()
                .enumerate()
                .map(|(r, q)| {
                    let vals: Vec<f64> = (0..len).map(|i| (i % 7) as f64 + r as f64).collect();
                    vt_core::Buffer::from_f64(q, dt, &[len as i64], &vals).unwrap()
                })
                .collect();
            std::thread::scope(|s| {
                for ((q, c), b) in queues.iter().zip(&comms).zip(&bufs) {
                    s.spawn(move || c.all_reduce_sum(q, &b.view()).unwrap());
                }
            });
            for (q, b) in queues.iter().zip(&bufs) {
                let got = b.to_f64(q).unwrap();
                for (i, g) in got.iter().enumerate() {
                    let want = n as f64 * (i % 7) as f64 + (n * (n - 1) / 2) as f64;
                    assert_eq!(*g, want, "{dt} element {i} on {}", q.device());
                }
            }
        }
    }
}
