//! The CPU queue and `vt_core::graph`: capture is refused with `Error::Unsupported` (the
//! queue runs ops inline, nothing to record) without running the closure; events are host
//! timestamps.

use vt_core::{rms_norm, Buffer, DType, Device, Error, Queue, RmsNormArgs};

fn q() -> Queue {
    vt_cpu::register();
    Queue::new(Device::CPU).unwrap()
}

#[test]
fn capture_on_the_cpu_is_unsupported_and_runs_nothing() {
    let q = q();
    assert!(!q.supports_capture());
    let mut ran = false;
    let err = q
        .capture(|| {
            ran = true;
            Ok(())
        })
        .unwrap_err();
    assert!(!ran, "the closure ran");
    match &err {
        Error::Unsupported { device, what, msg } => {
            assert_eq!(device, "cpu:0");
            assert_eq!(*what, "graph capture");
            assert!(msg.contains("inline") && msg.contains("CUDA"), "{msg}");
        }
        other => panic!("expected Unsupported, got {other}"),
    }
    assert!(err.to_string().starts_with("cpu:0: graph capture is not supported"), "{err}");
}

#[test]
fn cpu_events_time_the_work_between_them() {
    let q = q();
    let x = Buffer::from_f64(&q, DType::F32, &[256, 1024], &vec![0.5; 256 * 1024]).unwrap();
    let w = Buffer::from_f64(&q, DType::F32, &[1024], &vec![1.0; 1024]).unwrap();
    let a = q.record_event().unwrap();
    let b = q.record_event().unwrap();
    for _ in 0..20 {
        rms_norm(&q, &RmsNormArgs { out: x.view(), x: x.view(), weight: w.view(), eps: 1e-6 }).unwrap();
    }
    let c = q.record_event().unwrap();
    let empty = a.elapsed_ms(&b).unwrap();
    let work = b.elapsed_ms(&c).unwrap();
    assert!(empty >= 0.0 && work > 0.0 && work.is_finite(), "{empty} {work}");
    assert_eq!(c.device(), Device::CPU);
    // Backwards is clamped at zero.
    assert_eq!(c.elapsed_ms(&a).unwrap(), 0.0);
}
