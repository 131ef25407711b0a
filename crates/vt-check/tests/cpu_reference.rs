//! Every case of every op runs on the CPU against the CPU: the cases are valid calls
//! (they pass vt-core's validation), every declared output gets written, nothing else
//! changes, and the comparison of identical runs is exactly 0.
//!
//! To stay fast in a debug build each op runs in one dtype (bf16, f16, f32 in turn over
//! the ops) and long cases are skipped; `cargo xtask parity` (release, in CI) runs every
//! case in every dtype.

use vt_check::{cases, run_case, run_cell, DTYPES};
use vt_core::{DType, Device, OpId};

fn all_cases_match_on_the_cpu(op: OpId) {
    vt_cpu::register();
    let index = OpId::ALL.iter().position(|&o| o == op).unwrap();
    let dtype = DTYPES[index % DTYPES.len()];
    let all = cases(op, 1);
    assert!(all.len() >= 4, "{op}: only {} cases", all.len());
    for case in all.iter().filter(|c| !c.is_long()) {
        let report = run_case(case, Device::CPU, dtype).unwrap();
        assert!(report.passed(0.0), "{op} in {dtype}: {report:?}");
        assert_eq!(report.rel_err, 0.0);
    }
}

/// One test per op of `OpId::ALL` (`cases_run_on_the_cpu::RmsNorm`, ...), so a new op is
/// tested without editing this file.
macro_rules! cpu_cell_tests {
    ($($op:ident),*) => {
        #[allow(non_snake_case)]
        mod cases_run_on_the_cpu {
            $(
                #[test]
                fn $op() {
                    super::all_cases_match_on_the_cpu(vt_core::OpId::$op);
                }
            )*
        }
    };
}

vt_core::for_each_op!(cpu_cell_tests);

#[test]
fn cases_are_reproducible_from_the_seed() {
    let seeds = |s| cases(OpId::MlaDecodeAttention, s).iter().map(|c| c.seed()).collect::<Vec<_>>();
    assert_eq!(seeds(9), seeds(9));
    assert_ne!(seeds(9), seeds(10));
}

#[test]
fn decode_cases_include_a_long_sequence_and_an_empty_one() {
    let all = cases(OpId::MlaDecodeAttention, 1);
    assert!(all.iter().any(|c| c.is_long() && c.name().contains("3000, 0")), "{all:?}");
}

#[test]
fn run_cell_runs_every_case_and_reports_each() {
    vt_cpu::register();
    let cell = run_cell(OpId::RmsNorm, Device::CPU, DType::F16, 3).unwrap();
    assert_eq!(cell.cases.len(), cases(OpId::RmsNorm, 3).len());
    assert!(cell.passed(), "{cell}");
    assert!(cell.to_string().contains("RmsNorm on cpu:0 in f16 (seed 3): PASS"), "{cell}");
}

#[test]
fn a_prepared_case_runs_repeatedly_for_benches() {
    vt_cpu::register();
    let queue = vt_core::Queue::new(Device::CPU).unwrap();
    let case = &cases(OpId::MatmulBT, 4)[0];
    let prepared = case.prepare(&queue, DType::F32).unwrap();
    let out = prepared.buffers().last().unwrap();
    assert!(out.to_f64(&queue).unwrap().iter().all(|v| v.is_nan()), "outputs start poisoned");
    prepared.run().unwrap();
    let first = out.to_f64(&queue).unwrap();
    assert!(first.iter().all(|v| v.is_finite()));
    prepared.run().unwrap();
    assert_eq!(out.to_f64(&queue).unwrap(), first);
}

#[test]
fn run_cell_rejects_integer_dtypes() {
    vt_cpu::register();
    let err = run_cell(OpId::RmsNorm, Device::CPU, DType::I32, 1).unwrap_err();
    assert!(err.to_string().contains("dtype"), "{err}");
}
