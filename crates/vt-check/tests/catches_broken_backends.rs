//! The harness catches wrong backends. A fake device (host memory registered as the HIP
//! device type; no HIP backend is linked into this test) runs the CPU implementation and
//! then breaks its result on purpose: a perturbed element, an element left unwritten,
//! a write outside the output, a write into an input, a finite lse where the reference
//! has -inf, an error. Each must fail its cell; the faithful copy must pass with error 0.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard};

use vt_check::run_cell;
use vt_core::registry::{register_backend, register_op};
use vt_core::{
    encode_f64, read_host_elem, Backend, DType, Device, DeviceType, Error, MergeAttnStatesArgs, OpId, OpImpl,
    Queue, QueueImpl, Result, RmsNormArgs, Tensor,
};

const FAKE: DeviceType = DeviceType::Hip;
const DEV: Device = Device { kind: FAKE, ordinal: 0 };

struct HostBackend;

struct HostQueue;

fn layout(bytes: usize) -> Layout {
    Layout::from_size_align(bytes.max(1), 256).unwrap()
}

impl Backend for HostBackend {
    fn kind(&self) -> DeviceType {
        FAKE
    }
    fn description(&self) -> String {
        "fake device in host memory (vt-check tests)".into()
    }
    fn device_count(&self) -> usize {
        1
    }
    fn device_name(&self, _: usize) -> String {
        "fake".into()
    }
    fn new_queue(&self, _: usize) -> Result<Arc<dyn QueueImpl>> {
        Ok(Arc::new(HostQueue))
    }
    fn alloc(&self, _: usize, bytes: usize) -> Result<u64> {
        // SAFETY: the layout has a non-zero size.
        Ok(unsafe { alloc_zeroed(layout(bytes)) } as u64)
    }
    unsafe fn free(&self, _: usize, addr: u64, bytes: usize) {
        dealloc(addr as *mut u8, layout(bytes))
    }
}

impl QueueImpl for HostQueue {
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    unsafe fn copy_h2d(&self, dst: u64, src: &[u8]) -> Result<()> {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len());
        Ok(())
    }
    unsafe fn copy_d2h(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len());
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The same memory seen as a CPU tensor, so the CPU implementation can run on it.
fn on_cpu<'a>(t: &Tensor<'a>) -> Tensor<'a> {
    let extent = t.elem_span().map_or(0, |(_, hi)| hi);
    // SAFETY: the fake device's memory is host memory; the view lies inside it.
    unsafe {
        Tensor::from_raw_parts(
            t.base_addr(),
            extent,
            t.dtype(),
            Device::CPU,
            t.shape(),
            t.strides(),
            t.offset(),
        )
    }
    .unwrap()
}

/// Writes `v` (rounded to the dtype) at element offset `off` of `t`'s allocation.
fn poke(t: &Tensor<'_>, off: i64, v: f64) {
    let bytes = encode_f64(t.dtype(), &[v]);
    let dst = t.base_addr() + off as u64 * t.dtype().size_of() as u64;
    // SAFETY: callers pass an offset inside the allocation.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, bytes.len()) };
}

fn peek(t: &Tensor<'_>, off: i64) -> f64 {
    // SAFETY: as for `poke`.
    unsafe { read_host_elem(t.base_addr(), t.dtype(), off) }
}

/// Registers the fake device and `rms_norm` = CPU RmsNorm followed by `sabotage`, and
/// holds a lock so tests that register different sabotage do not interleave.
fn fake_rms_norm(
    sabotage: impl Fn(&RmsNormArgs<'_>) -> Result<()> + Send + Sync + 'static,
) -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    vt_cpu::register();
    register_backend(Arc::new(HostBackend));
    let imp = move |_: &Queue, a: &RmsNormArgs<'_>| {
        let cpu = Queue::new(Device::CPU)?;
        vt_core::rms_norm(
            &cpu,
            &vt_core::RmsNormArgs {
                out: on_cpu(&a.out),
                x: on_cpu(&a.x),
                weight: on_cpu(&a.weight),
                eps: a.eps,
            },
        )?;
        sabotage(a)
    };
    register_op(FAKE, OpImpl::RmsNorm(Arc::new(imp)));
    let merge = |_: &Queue, a: &MergeAttnStatesArgs<'_>| {
        let cpu = Queue::new(Device::CPU)?;
        let args = MergeAttnStatesArgs {
            out: on_cpu(&a.out),
            out_lse: a.out_lse.as_ref().map(on_cpu),
            prefix: on_cpu(&a.prefix),
            prefix_lse: on_cpu(&a.prefix_lse),
            suffix: on_cpu(&a.suffix),
            suffix_lse: on_cpu(&a.suffix_lse),
        };
        vt_core::merge_attn_states(&cpu, &args)?;
        // Sabotage for the lse test: a query with no keys gets a finite lse.
        if let Some(l) = &a.out_lse {
            vt_core::for_each_offset(l, |off| {
                if peek(l, off) == f64::NEG_INFINITY {
                    poke(l, off, -1e30);
                }
            });
        }
        Ok(())
    };
    register_op(FAKE, OpImpl::MergeAttnStates(Arc::new(merge)));
    guard
}

fn problems(op: OpId, dtype: DType) -> (bool, String) {
    let cell = run_cell(op, DEV, dtype, 5).unwrap();
    (cell.passed(), cell.to_string())
}

#[test]
fn a_faithful_backend_passes_with_zero_error() {
    let _g = fake_rms_norm(|_| Ok(()));
    for dtype in vt_check::DTYPES {
        let cell = run_cell(OpId::RmsNorm, DEV, dtype, 5).unwrap();
        assert!(cell.passed(), "{cell}");
        assert_eq!(cell.max_err(), 0.0, "{cell}");
    }
}

#[test]
fn a_one_percent_error_in_one_element_fails_in_f32() {
    let _g = fake_rms_norm(|a| {
        if a.out.numel() > 0 {
            let off = a.out.offset();
            poke(&a.out, off, peek(&a.out, off) * 1.01);
        }
        Ok(())
    });
    let (passed, report) = problems(OpId::RmsNorm, DType::F32);
    assert!(!passed, "{report}");
    // bf16 keeps 8 bits: one element 1% off in thousands stays inside its tolerance.
    let (passed, report) = problems(OpId::RmsNorm, DType::BF16);
    assert!(passed, "{report}");
}

#[test]
fn an_element_left_unwritten_fails_in_every_dtype() {
    let _g = fake_rms_norm(|a| {
        if let Some((_, hi)) = a.out.elem_span() {
            poke(&a.out, hi - 1, f64::NAN);
        }
        Ok(())
    });
    for dtype in vt_check::DTYPES {
        let (passed, report) = problems(OpId::RmsNorm, dtype);
        assert!(!passed, "{report}");
        assert!(report.contains("NaN in the output"), "{report}");
    }
}

#[test]
fn a_write_outside_the_output_fails() {
    // Only views that start inside their buffer have room before them (the strided case).
    let _g = fake_rms_norm(|a| {
        if a.out.offset() > 0 && !a.out.same_view(&a.x) {
            poke(&a.out, a.out.offset() - 1, 0.0);
        }
        Ok(())
    });
    let (passed, report) = problems(OpId::RmsNorm, DType::F16);
    assert!(!passed, "{report}");
    assert!(report.contains("output `out`: 1 x element outside the output"), "{report}");
}

#[test]
fn a_write_into_an_input_fails() {
    let _g = fake_rms_norm(|a| {
        if a.x.numel() > 0 && !a.out.same_view(&a.x) {
            poke(&a.x, a.x.offset(), 123.0);
        }
        Ok(())
    });
    let (passed, report) = problems(OpId::RmsNorm, DType::BF16);
    assert!(!passed, "{report}");
    assert!(report.contains("input `x`"), "{report}");
}

#[test]
fn a_finite_lse_where_the_reference_has_neg_inf_fails() {
    let _g = fake_rms_norm(|_| Ok(()));
    let (passed, report) = problems(OpId::MergeAttnStates, DType::F32);
    assert!(!passed, "{report}");
    assert!(report.contains("infinity that does not match"), "{report}");
    // Cases without empty sides still pass: only the -inf positions were changed.
    assert!(report.contains("  PASS"), "{report}");
}

#[test]
fn an_op_that_returns_an_error_fails_its_cases() {
    let _g = fake_rms_norm(|_| Err(Error::backend("fake", "kernel launch failed")));
    let (passed, report) = problems(OpId::RmsNorm, DType::F32);
    assert!(!passed, "{report}");
    assert!(report.contains("failed on hip:0: fake: kernel launch failed"), "{report}");
}

#[test]
fn an_op_missing_on_the_device_is_reported_as_not_registered() {
    let _g = fake_rms_norm(|_| Ok(()));
    match run_cell(OpId::PrefillAttention, DEV, DType::F32, 5) {
        Err(Error::NotRegistered { op: OpId::PrefillAttention, device: FAKE }) => {}
        other => panic!("expected NotRegistered, got {other:?}"),
    }
}
