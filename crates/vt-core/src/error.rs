//! The one error type of the workspace's library code.

use crate::{DeviceType, OpId};

/// What an [`Error::InvalidArgument`] is about: an op (by its [`OpId`]) or another API
/// (`Tensor`, `Buffer`, the MLA block, ...) by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    Op(OpId),
    Api(&'static str),
}

impl Subject {
    /// The op, when the subject is one.
    pub fn op(self) -> Option<OpId> {
        match self {
            Subject::Op(op) => Some(op),
            Subject::Api(_) => None,
        }
    }
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Op(op) => f.write_str(op.name()),
            Subject::Api(name) => f.write_str(name),
        }
    }
}

impl From<OpId> for Subject {
    fn from(op: OpId) -> Subject {
        Subject::Op(op)
    }
}

impl From<&'static str> for Subject {
    fn from(name: &'static str) -> Subject {
        Subject::Api(name)
    }
}

impl PartialEq<OpId> for Subject {
    fn eq(&self, op: &OpId) -> bool {
        *self == Subject::Op(*op)
    }
}

impl PartialEq<&str> for Subject {
    /// An op's name or an API's name (so tests may compare with either).
    fn eq(&self, name: &&str) -> bool {
        match self {
            Subject::Op(op) => op.name() == *name,
            Subject::Api(api) => api == name,
        }
    }
}

/// Errors from validation, dispatch and backends.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument broke a contract. `op` is the op ([`Subject::Op`]) or another API
    /// ([`Subject::Api`]), `arg` the argument.
    #[error("{op}: argument `{arg}`: {msg}")]
    InvalidArgument { op: Subject, arg: &'static str, msg: String },

    /// The op has no implementation for this device type.
    #[error("{op} is not registered for device type {device}")]
    NotRegistered { op: OpId, device: DeviceType },

    /// No backend drives this device type (or its ordinal does not exist).
    #[error("no backend for device {device}: {msg}")]
    NoDevice { device: String, msg: String },

    /// A backend failed (driver, compiler, library call). `backend` names it.
    #[error("{backend}: {msg}")]
    Backend { backend: &'static str, msg: String },

    /// A backend failed while running `op` (a launch, a library call).
    #[error("{backend}: {op}: {msg}")]
    OpFailed { op: OpId, backend: &'static str, msg: String },

    /// The device's backend cannot do `what` at all (graph capture on the CPU, ...): not a
    /// failure of this call, so callers may fall back (run eagerly) on it.
    #[error("{device}: {what} is not supported: {msg}")]
    Unsupported { device: String, what: &'static str, msg: String },

    /// Anything else with a short context (file loading, configuration, ...).
    #[error("{context}: {msg}")]
    Other { context: String, msg: String },
}

impl Error {
    /// An argument of `op` (an [`OpId`], or an API's name) broke its contract.
    pub fn invalid(op: impl Into<Subject>, arg: &'static str, msg: impl Into<String>) -> Error {
        Error::InvalidArgument { op: op.into(), arg, msg: msg.into() }
    }

    pub fn backend(backend: &'static str, msg: impl Into<String>) -> Error {
        Error::Backend { backend, msg: msg.into() }
    }

    /// `backend` failed while running `op`.
    pub fn op_failed(op: OpId, backend: &'static str, msg: impl Into<String>) -> Error {
        Error::OpFailed { op, backend, msg: msg.into() }
    }

    pub fn other(context: impl Into<String>, msg: impl Into<String>) -> Error {
        Error::Other { context: context.into(), msg: msg.into() }
    }

    /// The op the error is about, if any.
    pub fn op(&self) -> Option<OpId> {
        match self {
            Error::InvalidArgument { op, .. } => op.op(),
            Error::NotRegistered { op, .. } | Error::OpFailed { op, .. } => Some(*op),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
