//! One cos/sin cache per device and rope parameters, shared by every layer that needs it.
//!
//! A DeepSeek-V3 cache is 163840 positions x 64 f32 = 40 MiB, identical in all 61 layers:
//! built once per layer it took 2.4 GiB of device memory for one copy's worth of values.
//! [`RopeCosSinCache::shared`] hands every loader on the same device with the same values
//! the same buffer; every [`crate::MlaWeightStore`] holds one reference-counted handle, so the
//! buffer stays at one device address for as long as any layer (and hence any
//! [`crate::DecodeGraphs`] or [`crate::MlaBlock`] borrowing its views) lives, and is freed
//! with the last one. The process-wide registry keeps only weak references: it never keeps a
//! cache alive by itself.
//!
//! What decides sharing is everything the cache's values depend on ([`YarnRopeParams::cos_sin_cache`]):
//! the device, the element type (f32), the rope dim, the rows (`max_position_embeddings`),
//! `rope_theta` and every YaRN field, compared bit for bit (so `-0.0` and `0.0`, or an
//! inactive YaRN beside none, get caches of their own: never a wrong share). The pairing
//! (`is_neox`) is not part of it: it changes how the rope ops read the cache, not its values.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use vt_core::{Buffer, DType, Device, Queue, Result, Tensor};

use crate::rope::{YarnRopeParams, YarnScaling};

/// What a cos/sin cache's values (and where they live) depend on, floats by their bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CacheKey {
    device: Device,
    dtype: DType,
    rotary_dim: i64,
    rows: i64,
    base: u64,
    yarn: Option<YarnKey>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct YarnKey {
    factor: u64,
    original_max_position_embeddings: i64,
    beta_fast: u64,
    beta_slow: u64,
    mscale: u64,
    mscale_all_dim: u64,
    attn_factor: u64,
    extrapolation_factor: u64,
    truncate: bool,
}

impl CacheKey {
    fn new(device: Device, rope: &YarnRopeParams, rotary_dim: i64, rows: i64) -> CacheKey {
        // Destructured field by field: a field added to either struct fails to compile here
        // until it is either part of the key or known not to change the values.
        let YarnRopeParams { base, yarn, is_neox: _ } = *rope;
        let yarn = yarn.map(|y| {
            let YarnScaling {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                attn_factor,
                extrapolation_factor,
                truncate,
            } = y;
            YarnKey {
                factor: factor.to_bits(),
                original_max_position_embeddings,
                beta_fast: beta_fast.to_bits(),
                beta_slow: beta_slow.to_bits(),
                mscale: mscale.to_bits(),
                mscale_all_dim: mscale_all_dim.to_bits(),
                attn_factor: attn_factor.to_bits(),
                extrapolation_factor: extrapolation_factor.to_bits(),
                truncate,
            }
        });
        CacheKey { device, dtype: DType::F32, rotary_dim, rows, base: base.to_bits(), yarn }
    }
}

struct SharedCache {
    key: CacheKey,
    buffer: Buffer,
}

/// The live caches of the process, by key. Entries whose cache was freed are pruned on the
/// next lookup.
static REGISTRY: Mutex<Vec<(CacheKey, Weak<SharedCache>)>> = Mutex::new(Vec::new());

fn live(entries: &mut Vec<(CacheKey, Weak<SharedCache>)>, key: &CacheKey) -> Option<Arc<SharedCache>> {
    entries.retain(|(_, w)| w.strong_count() > 0);
    entries.iter().filter(|(k, _)| k == key).find_map(|(_, w)| w.upgrade())
}

/// A device's f32 cos/sin cache `[rows, rotary_dim]` ([`YarnRopeParams::cos_sin_cache`]),
/// shared by every holder of the same rope parameters on the same device (see the module
/// docs for what "the same" is). Cloning a handle shares the buffer; the buffer is freed when
/// the last handle is dropped and never moves before that, so a view of it (and a captured
/// graph holding its address) stays valid while its holder lives.
#[derive(Clone)]
pub struct RopeCosSinCache {
    inner: Arc<SharedCache>,
}

impl RopeCosSinCache {
    /// The cache of `rope` with `rows` positions of `rotary_dim` on the queue's device: the
    /// live one for these parameters if there is one, else a new one (computed, uploaded on
    /// `queue`, and synchronized, so any queue of the device may read it) registered for the
    /// next caller. Errors as [`YarnRopeParams::cos_sin_cache`] does (bounds, non-finite
    /// values, allocation), before touching the device.
    pub fn shared(
        queue: &Queue,
        rope: &YarnRopeParams,
        rotary_dim: i64,
        rows: i64,
    ) -> Result<RopeCosSinCache> {
        let key = CacheKey::new(queue.device(), rope, rotary_dim, rows);
        if let Some(inner) = live(&mut lock(), &key) {
            return Ok(RopeCosSinCache { inner });
        }
        // Built without the lock (it takes a while, and loaders of other devices need not
        // wait); two threads racing here build two, and the later one drops its own.
        let buffer = rope.cos_sin_cache_buffer(queue, rotary_dim, rows)?;
        queue.synchronize()?;
        let built = Arc::new(SharedCache { key, buffer });
        let mut entries = lock();
        if let Some(inner) = live(&mut entries, &key) {
            drop(entries);
            drop(built);
            return Ok(RopeCosSinCache { inner });
        }
        entries.push((key, Arc::downgrade(&built)));
        Ok(RopeCosSinCache { inner: built })
    }

    /// The live cache of these parameters on `device`, if some holder keeps one; builds
    /// nothing.
    pub fn find(
        device: Device,
        rope: &YarnRopeParams,
        rotary_dim: i64,
        rows: i64,
    ) -> Option<RopeCosSinCache> {
        let key = CacheKey::new(device, rope, rotary_dim, rows);
        live(&mut lock(), &key).map(|inner| RopeCosSinCache { inner })
    }

    /// The `[rows, rotary_dim]` f32 view the block reads
    /// ([`crate::MlaBlockWeights::rope_cos_sin_cache`]).
    pub fn view(&self) -> Tensor<'_> {
        self.inner.buffer.view()
    }

    /// The device address of the cache's first element (the same for every sharer).
    pub fn data_addr(&self) -> u64 {
        self.view().data_addr()
    }

    /// Whether `self` and `other` are the same buffer.
    pub fn same_buffer(&self, other: &RopeCosSinCache) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Bytes of device memory the cache takes (once, however many layers share it).
    pub fn bytes(&self) -> u64 {
        let b = &self.inner.buffer;
        b.numel() as u64 * b.dtype().size_of() as u64
    }

    pub fn device(&self) -> Device {
        self.inner.key.device
    }

    /// `max_position_embeddings`: the cache's rows.
    pub fn rows(&self) -> i64 {
        self.inner.key.rows
    }

    /// `qk_rope_head_dim`: the cache's columns.
    pub fn rotary_dim(&self) -> i64 {
        self.inner.key.rotary_dim
    }

    /// How many handles hold the buffer (one per weight store sharing it, plus any clone).
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.inner)
    }
}

impl std::fmt::Debug for RopeCosSinCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RopeCosSinCache([{}, {}] f32 on {}, {} holder(s))",
            self.rows(),
            self.rotary_dim(),
            self.device(),
            self.holders()
        )
    }
}

/// The registry, whatever a panicking holder left it in (its entries are only ever pushed
/// or pruned whole, so a poisoned lock still guards a consistent list).
fn lock() -> std::sync::MutexGuard<'static, Vec<(CacheKey, Weak<SharedCache>)>> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}
