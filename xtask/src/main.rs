//! `cargo xtask <command>`: the project's tools (`cargo xtask --help`, and `--help` on every
//! command and subcommand).
//!
//! - `parity [--backend LIST] [--op LIST] [--dtype LIST] [--seed N]`: every op on every
//!   backend found, against the CPU reference (see `parity.rs`).
//! - `parity --tp N [--backend cpu|cuda]`: the tensor-parallel MLA block against TP = 1
//!   on the goldens and a random layer (see `parity_tp.rs`).
//! - `kernels [--backend cuda,hip] [--file SUBSTRING]`: compile every GPU kernel file
//!   without a GPU (see `kernels.rs`).
//! - `bench decode [--json FILE] [--peer FILE] [--plot FILE]`: MLA decode attention timings on
//!   a GPU against FlashMLA (see `bench.rs`).
//! - `bench prefill [--json FILE] [--peer FILE] [--plot FILE]`: prefill attention timings on
//!   a GPU against torch SDPA (see `bench_prefill.rs`).
//! - `bench gemm [--json FILE] [--m LIST] [--only NAME]`: a DeepSeek-V3 layer's GEMMs, bf16
//!   beside fp8 block-scaled weights, against this run's floors (see `bench_gemm.rs`).
//! - `bench sparse [--json FILE] [--peer FILE] [--only SPEC]`: SparseMlaAttention on FlashMLA's
//!   sparse decode and prefill shapes against FlashMLA (see `bench_sparse.rs`).
//! - `bench indexer [--json FILE] [--only SPEC]`: IndexerTopK (DeepSeek-V3.2's lightning
//!   indexer) at decode and prefill against this run's floors (see `bench_indexer.rs`).
//!
//! Usage errors (unknown options, bad values) print the usage and exit 2; a run that fails
//! exits 1.

mod bench;
mod bench_gemm;
mod bench_indexer;
mod bench_prefill;
mod bench_sparse;
mod kernels;
mod kernels_hip;
mod parity;
mod parity_tp;
mod peer_json;
mod plot;
mod progress;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "vt's tools: parity, kernel compilation, GPU benches"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every op on every backend found against the CPU reference; with --tp, the
    /// tensor-parallel MLA block against TP = 1.
    Parity(parity::Args),
    /// Compile every GPU kernel file without a GPU (NVRTC, hipcc, hiprtc).
    Kernels(kernels::Args),
    /// Time ops on the first CUDA device against their floors and peers.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// MlaDecodeAttention on FlashMLA's benchmark shapes.
    Decode(bench::Args),
    /// PrefillAttention (the MLA prefill shapes) against torch SDPA (cuDNN, flash).
    Prefill(bench_prefill::Args),
    /// A DeepSeek-V3 layer's GEMMs, bf16 (cuBLAS) beside fp8 block-scaled weights.
    Gemm(bench_gemm::Args),
    /// SparseMlaAttention (DeepSeek-V3.2) on FlashMLA's sparse decode and prefill shapes.
    Sparse(bench_sparse::Args),
    /// IndexerTopK (DeepSeek-V3.2's lightning indexer) at decode and prefill, % of floor.
    Indexer(bench_indexer::Args),
}

fn main() -> ExitCode {
    // clap prints the usage and exits 2 on a usage error, 0 for --help.
    let cli = Cli::parse();
    let (name, result) = match cli.command {
        Command::Parity(a) => ("parity", parity::run(a)),
        Command::Kernels(a) => ("kernels", kernels::run(a)),
        Command::Bench(BenchCommand::Decode(a)) => ("bench decode", bench::run(a)),
        Command::Bench(BenchCommand::Prefill(a)) => ("bench prefill", bench_prefill::run(a)),
        Command::Bench(BenchCommand::Gemm(a)) => ("bench gemm", bench_gemm::run(a)),
        Command::Bench(BenchCommand::Sparse(a)) => ("bench sparse", bench_sparse::run(a)),
        Command::Bench(BenchCommand::Indexer(a)) => ("bench indexer", bench_indexer::run(a)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("xtask").chain(args.iter().copied()))
    }

    #[test]
    fn help_works_on_every_command_and_subcommand() {
        for args in [
            &["--help"][..],
            &["parity", "--help"],
            &["kernels", "--help"],
            &["bench", "--help"],
            &["bench", "decode", "--help"],
            &["bench", "prefill", "--help"],
            &["bench", "gemm", "--help"],
            &["bench", "sparse", "--help"],
            &["bench", "indexer", "--help"],
        ] {
            let e = parse(args).expect_err("--help stops parsing");
            assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{args:?}");
            assert_eq!(e.exit_code(), 0, "{args:?}");
        }
    }

    #[test]
    fn usage_errors_exit_2() {
        for args in [
            &["bogus"][..],
            &["parity", "--nope"],
            &["parity", "--backend", "tpu"],
            &["parity", "--seed", "-1"],
            &["parity", "--transport", "host"],
            &["parity", "--tp", "2", "--op", "RmsNorm"],
            &["bench", "decode", "--iters", "0"],
            &["bench", "decode", "--json"],
            &["bench", "prefill", "--iters=x"],
            &["bench", "gemm", "--m", "0"],
            &["bench", "gemm", "--splits", "0"],
            &["bench", "gemm", "--splits", "65"],
            &["bench", "sparse", "--only", "dense"],
            &["bench", "indexer", "--only", "h64"],
            &["bench", "indexer", "--iters", "0"],
        ] {
            let e = parse(args).expect_err("a usage error");
            assert_eq!(e.exit_code(), 2, "{args:?}: {e}");
        }
    }

    #[test]
    fn key_equals_value_is_accepted() {
        let cli =
            parse(&["bench", "decode", "--json=out.json", "--iters=7", "--only=h128,b1", "--peer=f.json"])
                .expect("parses");
        match cli.command {
            Command::Bench(BenchCommand::Decode(a)) => {
                assert_eq!(a.json.as_deref(), Some(std::path::Path::new("out.json")));
                assert_eq!(a.peer.as_deref(), Some(std::path::Path::new("f.json")));
                assert_eq!(a.iters, 7);
                assert_eq!(a.only, vec!["h128,b1".to_string()]);
            }
            other => panic!("parsed as {other:?}"),
        }
        match parse(&["bench", "gemm", "--splits=3", "--m=1,32"]).expect("parses").command {
            Command::Bench(BenchCommand::Gemm(a)) => assert_eq!((a.splits, a.m), (Some(3), vec![1, 32])),
            other => panic!("parsed as {other:?}"),
        }
        let cli = parse(&["parity", "--backend=cpu", "--seed=5", "--op=RmsNorm,MatmulBT"]).expect("parses");
        match cli.command {
            Command::Parity(a) => {
                assert_eq!(a.seed, Some(5));
                assert_eq!(a.op.len(), 2);
            }
            other => panic!("parsed as {other:?}"),
        }
    }
}
