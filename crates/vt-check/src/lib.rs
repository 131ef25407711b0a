//! vt-check: the parity harness. Every op of a backend against the CPU reference.
//!
//! For each [`OpId`] there is a list of [`Case`]s ([`cases`]): shapes that matter for the
//! MLA block, non-contiguous views, paged caches of several block sizes, padding slots,
//! empty sequences. A case draws its inputs as f64 from a seeded ChaCha RNG, uploads the
//! same values (rounded once to the dtype under test) to the backend under test and to
//! the CPU, poisons every output with NaN on both, runs the op through the vt-core entry
//! point on both, reads everything back and compares:
//!
//! - inside each output: max relative Frobenius error `||out - ref|| / ||ref||`
//!   ([`rel_fro_error`]); a NaN (an element left unwritten, or computed as NaN) fails,
//!   and infinities (an lse of `-inf` for a query that saw no key) must match exactly;
//! - everywhere else (the rest of each output's buffer, every input): bit-identical to
//!   the reference, so writes outside an output or into an input are caught.
//!
//! A case passes when it has no such problem and its error is within [`tolerance`] (one
//! table for every op and dtype). The reference backend must be registered first
//! (`vt_cpu::register()` or `vt_backends::init()`); vt-check depends on vt-core only, so
//! backend crates can use it in their tests and benches:
//!
//! ```no_run
//! # use vt_core::{DType, Device, DeviceType, OpId};
//! vt_cpu::register(); // the reference
//! // ... register the backend under test, then:
//! let cell = vt_check::run_cell(OpId::RmsNorm, Device::new(DeviceType::Cuda, 0), DType::BF16, 7)?;
//! assert!(cell.passed(), "{cell}");
//! # Ok::<(), vt_core::Error>(())
//! ```
//!
//! `cargo xtask parity` runs every (op, backend, dtype) cell and prints one table.

mod case;
mod cases;
mod cell;
mod compare;
mod tolerance;

pub use case::{case_seed, Case, Prepared};
pub use cases::cases;
pub use cell::{run_case, run_cell, CaseReport, CellReport, DTYPES};
pub use compare::{compare, rel_fro_error, Comparison};
pub use tolerance::{tolerance, TOLERANCES};

pub use vt_core::OpId;
