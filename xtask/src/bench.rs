//! Placeholder until the `bench` command lands; it fails loudly rather than pretending.

pub fn run(_args: &[String]) -> Result<std::process::ExitCode, String> {
    Err("`bench` is not implemented yet".into())
}
