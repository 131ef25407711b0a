//! The op registry: (OpId, DeviceType) -> implementation, plus the backends themselves.
//!
//! Life cycle: at start-up each backend crate's `register()` probes its driver and, only
//! if a device exists, calls [`register_backend`] and [`register_op`] for every op it
//! implements. Entry points in [`crate::ops`] validate their arguments and then look the
//! implementation up here by the queue's device type. Registration may happen at any
//! time (later registrations replace earlier ones for the same key) but normally happens
//! once, before the first op; lookups are lock-free reads of a concurrent map.

use std::sync::{Arc, LazyLock};

use dashmap::DashMap;

use crate::ops::*;
use crate::{Backend, DeviceType, Error, Queue, Result};

macro_rules! define_ops {
    // `$d` is a literal `$` for the macro defined inside (`for_each_op!`).
    ($($id:ident => $args:ident, $doc:literal;)*) => { define_ops!(@with_dollar ($) $($id => $args, $doc;)*); };
    (@with_dollar ($d:tt) $($id:ident => $args:ident, $doc:literal;)*) => {
        /// Calls the macro `$m` with every op's name, in [`OpId::ALL`] order:
        /// `$m! { MatmulBT, BatchedMatmul, ... }`. Per-op test lists are generated from
        /// it, so a new op gets its tests without a hand-kept list:
        ///
        /// ```
        /// macro_rules! names { ($($op:ident),*) => { [$(stringify!($op)),*] } }
        /// let all = vt_core::for_each_op!(names);
        /// assert_eq!(all.len(), vt_core::OpId::ALL.len());
        /// assert_eq!(all[0], vt_core::OpId::ALL[0].name());
        /// ```
        #[macro_export]
        macro_rules! for_each_op {
            ($d m:ident) => { $d m! { $($id),* } };
        }

        /// Every op of the library. Names are the seed's (CamelCase).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpId { $(#[doc = $doc] $id),* }

        impl OpId {
            pub const ALL: &'static [OpId] = &[$(OpId::$id),*];

            pub const fn name(self) -> &'static str {
                match self { $(OpId::$id => stringify!($id)),* }
            }

            /// Parses an op name, case-insensitive, with or without underscores.
            pub fn parse(s: &str) -> Option<OpId> {
                let want: String = s.chars().filter(|c| *c != '_').collect::<String>().to_ascii_lowercase();
                OpId::ALL.iter().copied().find(|op| op.name().to_ascii_lowercase() == want)
            }
        }

        /// A backend's implementation of one op. The entry point has validated the
        /// arguments before calling it.
        #[derive(Clone)]
        pub enum OpImpl {
            $($id(Arc<dyn Fn(&Queue, &$args<'_>) -> Result<()> + Send + Sync>)),*
        }

        impl OpImpl {
            pub fn id(&self) -> OpId {
                match self { $(OpImpl::$id(_) => OpId::$id),* }
            }
        }
    };
}

define_ops! {
    MatmulBT => MatmulBTArgs, "`out[M,N] = a[M,K] . b[N,K]^T`";
    BatchedMatmul => BatchedMatmulArgs, "`out[G,M,N] = a[G,M,K] . b[G,K,N]`, any strides";
    RmsNorm => RmsNormArgs, "out = x / sqrt(mean(x^2) + eps) * w";
    RopeFromCache => RopeFromCacheArgs, "rotary embedding from a cos/sin cache, in place";
    FusedNormRope => FusedNormRopeArgs, "RmsNorm of the latent part and RoPE of the rope part of one row";
    ConcatAndCacheMla => ConcatAndCacheMlaArgs, "write [kv_c | k_pe] rows into the paged MLA cache";
    GatherMlaCache => GatherMlaCacheArgs, "gather cached context rows into a contiguous workspace";
    ConcatMlaNopeRope => ConcatMlaNopeRopeArgs, "out = [nope | rope], rope broadcast over heads";
    MlaDecodeAttention => MlaDecodeAttentionArgs, "absorbed MQA decode attention over the paged latent cache";
    PrefillAttention => PrefillAttentionArgs, "variable-length MHA, causal (bottom-right) or not";
    MergeAttnStates => MergeAttnStatesArgs, "merge two partial attention results by their lse";
    MatmulBTFp8 => MatmulBTFp8Args, "`out[M,N] = A[M,K] . W[N,K]^T`, W fp8 e4m3 in 128x128 block scales";
    BatchedMatmulFp8 => BatchedMatmulFp8Args, "`out[G,M,N] = A[G,M,K] . W[G,K,N]`, W fp8 e4m3 in 128x128 block scales";
    QuantizeFp8 => QuantizeFp8Args, "per-token fp8 e4m3 quantization in 1x128 groups";
    SparseMlaAttention => SparseMlaAttentionArgs, "absorbed MQA attention of each query over its listed cache slots (sparse MLA)";
    IndexerTopK => IndexerTopKArgs, "lightning-indexer scores over the paged indexer key cache, top-k slots per query";
    CacheIndexerKeys => CacheIndexerKeysArgs, "write indexer key rows into the paged indexer key cache";
    LayerNorm => LayerNormArgs, "out = (x - mean) / sqrt(var + eps) * w + b";
}

impl std::fmt::Display for OpId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

static OPS: LazyLock<DashMap<(OpId, DeviceType), OpImpl>> = LazyLock::new(DashMap::new);
static BACKENDS: LazyLock<DashMap<DeviceType, Arc<dyn Backend>>> = LazyLock::new(DashMap::new);

/// Makes a backend's devices, memory and queues available for its device type.
pub fn register_backend(backend: Arc<dyn Backend>) {
    BACKENDS.insert(backend.kind(), backend);
}

/// The backend driving `kind`, if one registered.
pub fn backend(kind: DeviceType) -> Option<Arc<dyn Backend>> {
    BACKENDS.get(&kind).map(|b| b.value().clone())
}

/// Registers (or replaces) the implementation of one op on one device type.
pub fn register_op(device: DeviceType, imp: OpImpl) {
    OPS.insert((imp.id(), device), imp);
}

/// Whether `op` has an implementation on `device`.
pub fn op_registered(op: OpId, device: DeviceType) -> bool {
    OPS.contains_key(&(op, device))
}

/// The ops registered on `device`, in [`OpId::ALL`] order.
pub fn registered_ops(device: DeviceType) -> Vec<OpId> {
    OpId::ALL.iter().copied().filter(|&op| op_registered(op, device)).collect()
}

/// Removes every op, the communicators and the backend of `device` (tests of the life
/// cycle use this).
pub fn unregister_device(device: DeviceType) {
    OPS.retain(|(_, d), _| *d != device);
    crate::comm::unregister_device(device);
    BACKENDS.remove(&device);
}

/// Checks a backend's op coverage: every op of [`OpId::ALL`] is either in `provided` (the
/// ops its `register()` can register) or in `declared_gaps` (the ops it says it lacks),
/// never both, never neither. Each backend crate calls this from a test, so a new op
/// fails that test until the backend implements it or declares the gap.
pub fn check_coverage(backend: &str, provided: &[OpId], declared_gaps: &[OpId]) -> Result<()> {
    let mut problems = Vec::new();
    for &op in OpId::ALL {
        match (provided.contains(&op), declared_gaps.contains(&op)) {
            (false, false) => problems.push(format!("{op} is neither registered nor declared a gap")),
            (true, true) => problems.push(format!("{op} is registered but also declared a gap")),
            _ => {}
        }
        if provided.iter().filter(|&&p| p == op).count() > 1 {
            problems.push(format!("{op} is registered twice"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::other(format!("{backend} op coverage"), problems.join("; ")))
    }
}

pub(crate) fn lookup(op: OpId, device: DeviceType) -> Result<OpImpl> {
    OPS.get(&(op, device)).map(|e| e.value().clone()).ok_or(Error::NotRegistered { op, device })
}

/// Looks up `$id` for the queue's device and calls it with `$args`, inside a span.
macro_rules! dispatch {
    ($queue:expr, $id:ident, $args:expr) => {{
        let queue: &$crate::Queue = $queue;
        let _span = tracing::debug_span!("vt_op", op = $crate::OpId::$id.name(), device = %queue.device()).entered();
        match $crate::registry::lookup($crate::OpId::$id, queue.device().kind)? {
            $crate::registry::OpImpl::$id(f) => f(queue, $args),
            other => Err($crate::Error::backend(
                "registry",
                format!("{} registered under {}", other.id(), $crate::OpId::$id),
            )),
        }
    }};
}
pub(crate) use dispatch;

/// What a backend's `register()` found at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The library loaded, devices exist, ops are registered.
    Registered { devices: usize },
    /// The library loaded but found no device; nothing was registered.
    NoDevice { detail: String },
    /// The library (driver, runtime) is not on this machine; nothing was registered.
    Unavailable { detail: String },
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Probe::Registered { devices } => write!(f, "registered ({devices} device(s))"),
            Probe::NoDevice { detail } => write!(f, "no device ({detail})"),
            Probe::Unavailable { detail } => write!(f, "unavailable ({detail})"),
        }
    }
}
