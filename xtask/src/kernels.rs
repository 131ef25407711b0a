//! Placeholder until the `kernels` command lands; it fails loudly rather than pretending.

pub fn run(_args: &[String]) -> Result<std::process::ExitCode, String> {
    Err("`kernels` is not implemented yet".into())
}
