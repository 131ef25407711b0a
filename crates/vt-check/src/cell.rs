//! Running cases: one case on one backend, or one (op, backend, dtype) cell.

use std::fmt;

use vt_core::{op_registered, DType, Device, DeviceType, Error, OpId, Queue, Result};

use crate::case::Built;
use crate::{cases, compare, tolerance, Case};

/// The dtypes every op is checked in.
pub const DTYPES: [DType; 3] = [DType::BF16, DType::F16, DType::F32];

/// How one case went on one backend in one dtype.
#[derive(Clone, Debug)]
pub struct CaseReport {
    pub name: String,
    /// The case's own seed (see [`crate::case_seed`]).
    pub seed: u64,
    /// The largest relative Frobenius error over the case's outputs (infinite when one
    /// holds a NaN or a mismatched infinity, or the op failed).
    pub rel_err: f64,
    /// Everything wrong besides the size of the error, each naming the output or input:
    /// NaNs, mismatched infinities, writes outside the outputs, errors from the op.
    pub problems: Vec<String>,
}

impl CaseReport {
    pub fn passed(&self, tolerance: f64) -> bool {
        self.problems.is_empty() && self.rel_err <= tolerance
    }
}

/// How every case of one op went on one backend in one dtype.
#[derive(Clone, Debug)]
pub struct CellReport {
    pub op: OpId,
    pub device: Device,
    pub dtype: DType,
    /// The run's seed: `cargo xtask parity --seed N` replays it.
    pub seed: u64,
    pub tolerance: f64,
    pub cases: Vec<CaseReport>,
}

impl CellReport {
    /// Every case passed.
    pub fn passed(&self) -> bool {
        self.cases.iter().all(|c| c.passed(self.tolerance))
    }

    /// The largest error over the cases (0 with no cases).
    pub fn max_err(&self) -> f64 {
        self.cases.iter().map(|c| c.rel_err).fold(0.0, f64::max)
    }

    pub fn failures(&self) -> impl Iterator<Item = &CaseReport> {
        self.cases.iter().filter(|c| !c.passed(self.tolerance))
    }
}

impl fmt::Display for CellReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} on {} in {} (seed {}): {}, max rel. error {:.2e}, tolerance {:.0e}",
            self.op,
            self.device,
            self.dtype,
            self.seed,
            if self.passed() { "PASS" } else { "FAIL" },
            self.max_err(),
            self.tolerance
        )?;
        for c in &self.cases {
            let verdict = if c.passed(self.tolerance) { "PASS" } else { "FAIL" };
            writeln!(f, "  {verdict} {:9.2e}  {} (case seed {:#x})", c.rel_err, c.name, c.seed)?;
            for p in &c.problems {
                writeln!(f, "         {p}")?;
            }
        }
        Ok(())
    }
}

/// Runs every case of `op` on `device` (against the CPU) in `dtype`, inputs from `seed`.
///
/// Errors before running anything when the op is not registered on `device` or on the
/// CPU (register the reference first: `vt_cpu::register()` or `vt_backends::init()`),
/// when `dtype` is not bf16/f16/f32, or when no queue can be made. Failures of the op
/// itself are reported per case, not as an error.
pub fn run_cell(op: OpId, device: Device, dtype: DType, seed: u64) -> Result<CellReport> {
    let tol = check_runnable(op, device, dtype)?;
    let (dev_q, ref_q) = (Queue::new(device)?, Queue::new(Device::CPU)?);
    let cases = cases(op, seed);
    let reports = cases.iter().map(|c| run_on(c, &dev_q, &ref_q, dtype)).collect();
    Ok(CellReport { op, device, dtype, seed, tolerance: tol, cases: reports })
}

/// Runs one case on `device` (against the CPU) in `dtype`. Errors as [`run_cell`].
pub fn run_case(case: &Case, device: Device, dtype: DType) -> Result<CaseReport> {
    check_runnable(case.op(), device, dtype)?;
    Ok(run_on(case, &Queue::new(device)?, &Queue::new(Device::CPU)?, dtype))
}

fn check_runnable(op: OpId, device: Device, dtype: DType) -> Result<f64> {
    let tol = tolerance(op, dtype).ok_or_else(|| {
        Error::invalid("vt-check", "dtype", format!("{dtype} is not one of bf16, f16, f32"))
    })?;
    for kind in [DeviceType::Cpu, device.kind] {
        if !op_registered(op, kind) {
            return Err(Error::NotRegistered { op, device: kind });
        }
    }
    Ok(tol)
}

/// Uploads, poisons, runs on both queues, reads back and compares.
fn run_on(case: &Case, dev_q: &Queue, ref_q: &Queue, dtype: DType) -> CaseReport {
    let mut report =
        CaseReport { name: case.name().to_string(), seed: case.seed(), rel_err: 0.0, problems: Vec::new() };
    let fail = |report: &mut CaseReport, msg: String| {
        report.rel_err = f64::INFINITY;
        report.problems.push(msg);
    };
    let built = case.build();
    let dev = match run_side(&built, dev_q, dtype) {
        Ok(v) => v,
        Err(e) => {
            fail(&mut report, format!("failed on {}: {e}", dev_q.device()));
            return report;
        }
    };
    let reference = match run_side(&built, ref_q, dtype) {
        Ok(v) => v,
        Err(e) => {
            fail(&mut report, format!("the CPU reference failed: {e}"));
            return report;
        }
    };
    for (i, ((spec, dev), reference)) in built.bufs.iter().zip(&dev).zip(&reference).enumerate() {
        let output = built.outputs.iter().find(|o| o.buf == i);
        let c = match output {
            Some(o) => compare(dev, reference, &o.written),
            None => compare(dev, reference, &vec![false; dev.len()]),
        };
        let label = match output {
            Some(o) => format!("output `{}`", o.name),
            None => format!("input `{}`", spec.name),
        };
        report.rel_err = report.rel_err.max(c.rel_err);
        report.problems.extend(c.problems.into_iter().map(|p| format!("{label}: {p}")));
    }
    report
}

/// One side of a case: upload, run, read every buffer back.
fn run_side(built: &Built, q: &Queue, dtype: DType) -> Result<Vec<Vec<f64>>> {
    let bufs = built.upload(q, dtype)?;
    (built.exec)(q, &bufs)?;
    q.synchronize()?;
    bufs.iter().map(|b| b.to_f64(q)).collect()
}
