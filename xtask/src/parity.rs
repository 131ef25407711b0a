//! Placeholder until the `parity` command lands; it fails loudly rather than pretending.

pub fn run(_args: &[String]) -> Result<std::process::ExitCode, String> {
    Err("`parity` is not implemented yet".into())
}
