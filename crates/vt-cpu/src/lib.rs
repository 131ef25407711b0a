//! Placeholder: the CPU backend is being written.
use vt_core::Probe;

pub fn register() -> Probe {
    Probe::Unavailable { detail: "not implemented yet".into() }
}
