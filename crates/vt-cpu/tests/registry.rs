//! The registry's life cycle as the CPU backend sees it. The registry is global and one
//! test unregisters the CPU, so every test here holds [`SERIAL`].

mod common;

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard};

use vt_core::registry::{register_backend, unregister_device};
use vt_core::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn register_is_idempotent_and_registers_every_op() {
    let _serial = serial();
    assert_eq!(vt_cpu::register(), Probe::Registered { devices: 1 });
    assert_eq!(vt_cpu::register(), Probe::Registered { devices: 1 });
    assert_eq!(registered_ops(DeviceType::Cpu), OpId::ALL.to_vec());
    for &op in OpId::ALL {
        assert!(op_registered(op, DeviceType::Cpu), "{op} not registered on the CPU");
    }
    assert_eq!(comm::transports(DeviceType::Cpu), vec!["host"], "the host communicator is registered");
    let backend = registry::backend(DeviceType::Cpu).expect("the CPU backend is registered");
    assert_eq!(backend.device_count(), 1);
    assert!(matches!(Queue::new(Device::new(DeviceType::Cpu, 1)), Err(Error::NoDevice { .. })));
}

#[test]
fn cpu_buffers_are_256_byte_aligned_and_round_trip() {
    let _serial = serial();
    let q = common::queue();
    for n in [1i64, 3, 1000] {
        let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let b = Buffer::from_slice(&q, &[n], &v).unwrap();
        assert_eq!(b.view().base_addr() % 256, 0);
        assert_eq!(b.to_vec::<f32>(&q).unwrap(), v);
    }
    let empty = Buffer::zeros(&q, DType::BF16, &[0, 4]).unwrap();
    assert!(empty.to_f64(&q).unwrap().is_empty());
}

/// A backend with devices but no ops: calls on it must report NotRegistered.
struct NoOpsBackend;
struct NoOpsQueue;

impl Backend for NoOpsBackend {
    fn kind(&self) -> DeviceType {
        DeviceType::Hip
    }
    fn description(&self) -> String {
        "test backend without ops".into()
    }
    fn device_count(&self) -> usize {
        1
    }
    fn device_name(&self, _: usize) -> String {
        "fake".into()
    }
    fn new_queue(&self, _: usize) -> Result<Arc<dyn QueueImpl>> {
        Ok(Arc::new(NoOpsQueue))
    }
    fn alloc(&self, _: usize, bytes: usize) -> Result<u64> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 256).unwrap();
        // SAFETY: non-zero size.
        Ok(unsafe { std::alloc::alloc(layout) } as u64)
    }
    unsafe fn free(&self, _: usize, addr: u64, bytes: usize) {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 256).unwrap();
        // SAFETY: `addr` came from `alloc` with the same layout.
        unsafe { std::alloc::dealloc(addr as *mut u8, layout) }
    }
}

impl QueueImpl for NoOpsQueue {
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    unsafe fn copy_h2d(&self, dst: u64, src: &[u8]) -> Result<()> {
        // SAFETY: the caller guarantees the destination range is a live allocation.
        unsafe { std::ptr::copy(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }
    unsafe fn copy_d2h(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        // SAFETY: the caller guarantees the source range is a live allocation.
        unsafe { std::ptr::copy(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[test]
fn life_cycle_not_registered_unregister_and_register_again() {
    let _serial = serial();
    // A device type whose backend registered no op: a valid call is NotRegistered.
    register_backend(Arc::new(NoOpsBackend));
    let hip = Queue::new(Device::new(DeviceType::Hip, 0)).unwrap();
    assert!(registered_ops(DeviceType::Hip).is_empty());
    let x = Buffer::zeros(&hip, DType::F32, &[2, 4]).unwrap();
    let w = Buffer::zeros(&hip, DType::F32, &[4]).unwrap();
    let out = Buffer::nan(&hip, DType::F32, &[2, 4]).unwrap();
    match rms_norm(&hip, &RmsNormArgs { out: out.view(), x: x.view(), weight: w.view(), eps: 1e-6 }) {
        Err(Error::NotRegistered { op, device }) => {
            assert_eq!((op, device), (OpId::RmsNorm, DeviceType::Hip));
        }
        other => panic!("expected NotRegistered, got {other:?}"),
    }
    assert!(out.to_f64(&hip).unwrap().iter().all(|v| v.is_nan()), "a NotRegistered call wrote its output");
    drop((x, w, out));
    unregister_device(DeviceType::Hip);
    assert!(registry::backend(DeviceType::Hip).is_none());

    // The CPU: ops run; after unregistering they are NotRegistered (existing queues and
    // buffers stay usable); registering again restores every op.
    assert_eq!(vt_cpu::register(), Probe::Registered { devices: 1 });
    let q = Queue::new(Device::CPU).unwrap();
    let x = Buffer::from_f64(&q, DType::F32, &[1, 4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let w = Buffer::from_f64(&q, DType::F32, &[4], &[1.0; 4]).unwrap();
    let out = Buffer::nan(&q, DType::F32, &[1, 4]).unwrap();
    rms_norm(&q, &RmsNormArgs { out: out.view(), x: x.view(), weight: w.view(), eps: 1e-6 }).unwrap();
    assert!(out.to_f64(&q).unwrap().iter().all(|v| v.is_finite()));

    unregister_device(DeviceType::Cpu);
    assert!(registered_ops(DeviceType::Cpu).is_empty());
    assert!(comm::backend(DeviceType::Cpu, "host").is_none(), "unregistering removes the communicators");
    assert!(!op_registered(OpId::MatmulBT, DeviceType::Cpu));
    assert!(matches!(Queue::new(Device::CPU), Err(Error::NoDevice { .. })));
    let poisoned = Buffer::nan(&q, DType::F32, &[1, 4]).unwrap();
    match rms_norm(&q, &RmsNormArgs { out: poisoned.view(), x: x.view(), weight: w.view(), eps: 1e-6 }) {
        Err(Error::NotRegistered { op: OpId::RmsNorm, device: DeviceType::Cpu }) => {}
        other => panic!("expected NotRegistered after unregistering, got {other:?}"),
    }
    assert!(poisoned.to_f64(&q).unwrap().iter().all(|v| v.is_nan()));

    assert_eq!(vt_cpu::register(), Probe::Registered { devices: 1 });
    assert_eq!(registered_ops(DeviceType::Cpu), OpId::ALL.to_vec());
    assert!(comm::backend(DeviceType::Cpu, "host").is_some());
    rms_norm(&q, &RmsNormArgs { out: poisoned.view(), x: x.view(), weight: w.view(), eps: 1e-6 }).unwrap();
    assert_eq!(poisoned.to_f64(&q).unwrap(), out.to_f64(&q).unwrap());
}

/// The safe byte copies into and out of views: contiguous views only, exact sizes, the
/// queue's device; a slice of a buffer is written in place and nothing else changes.
#[test]
fn queue_write_and_read_bytes_of_a_view() {
    let _serial = serial();
    let q = common::queue();
    let b = Buffer::from_f64(&q, DType::F32, &[4, 2], &[0.0; 8]).unwrap();
    let rows = b.view().slice(0, 1, 3).unwrap();
    let bytes = encode_f64(DType::F32, &[1.0, 2.0, 3.0, 4.0]);
    q.write_bytes(&rows, &bytes).unwrap();
    assert_eq!(q.read_bytes(&rows).unwrap(), bytes);
    assert_eq!(b.to_f64(&q).unwrap(), vec![0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 0.0]);
    let e = q.write_bytes(&rows, &bytes[..4]).unwrap_err().to_string();
    assert!(e.contains("Queue::write_bytes") && e.contains("4 bytes") && e.contains("16 bytes"), "{e}");
    let col = b.view().slice(1, 0, 1).unwrap();
    let e = q.read_bytes(&col).unwrap_err().to_string();
    assert!(e.contains("Queue::read_bytes") && e.contains("contiguous"), "{e}");
}
