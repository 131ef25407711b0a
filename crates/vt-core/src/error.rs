//! The one error type of the workspace's library code.

use crate::{DeviceType, OpId};

/// Errors from validation, dispatch and backends.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument broke an op's contract. `op` is the op (or API) name, `arg` the argument.
    #[error("{op}: argument `{arg}`: {msg}")]
    InvalidArgument { op: &'static str, arg: &'static str, msg: String },

    /// The op has no implementation for this device type.
    #[error("{op} is not registered for device type {device}")]
    NotRegistered { op: OpId, device: DeviceType },

    /// No backend drives this device type (or its ordinal does not exist).
    #[error("no backend for device {device}: {msg}")]
    NoDevice { device: String, msg: String },

    /// A backend failed (driver, compiler, library call). `backend` names it.
    #[error("{backend}: {msg}")]
    Backend { backend: &'static str, msg: String },

    /// Anything else with a short context (file loading, configuration, ...).
    #[error("{context}: {msg}")]
    Other { context: String, msg: String },
}

impl Error {
    pub fn invalid(op: &'static str, arg: &'static str, msg: impl Into<String>) -> Error {
        Error::InvalidArgument { op, arg, msg: msg.into() }
    }

    pub fn backend(backend: &'static str, msg: impl Into<String>) -> Error {
        Error::Backend { backend, msg: msg.into() }
    }

    pub fn other(context: impl Into<String>, msg: impl Into<String>) -> Error {
        Error::Other { context: context.into(), msg: msg.into() }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
