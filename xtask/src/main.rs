//! `cargo xtask <command>`: the project's tools.
//!
//! - `parity [--backend LIST] [--op LIST] [--seed N]`: every op on every backend found,
//!   against the CPU reference (see `parity.rs`).
//! - `parity --tp N [--backend cpu|cuda]`: the tensor-parallel MLA block against TP = 1
//!   on the goldens and a random layer (see `parity_tp.rs`).
//! - `kernels`: compile every GPU kernel file without a GPU (see `kernels.rs`).
//! - `bench decode [--json FILE]`: MLA decode attention timings on a GPU (see `bench.rs`).

mod bench;
mod kernels;
mod kernels_hip;
mod parity;
mod parity_tp;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => ("help", &[][..]),
    };
    let result = match cmd {
        "parity" => parity::run(rest),
        "kernels" => kernels::run(rest),
        "bench" => bench::run(rest),
        _ => {
            eprintln!("usage: cargo xtask parity [--backend LIST] [--op LIST] [--seed N]");
            eprintln!("       cargo xtask kernels");
            eprintln!("       cargo xtask bench decode [--json FILE]");
            return if cmd == "help" || cmd == "--help" { ExitCode::SUCCESS } else { ExitCode::from(2) };
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}
