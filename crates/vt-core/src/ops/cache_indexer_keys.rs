use crate::registry::dispatch;
use crate::validate::{host_ints, Check};
use crate::{DType, OpId, Queue, Result, Tensor};

/// Arguments of [`cache_indexer_keys`].
#[derive(Clone, Copy, Debug)]
pub struct CacheIndexerKeysArgs<'a> {
    /// The tokens' indexer keys `[T, Di]`.
    pub k: Tensor<'a>,
    pub cache: Tensor<'a>,
    pub slot_mapping: Tensor<'a>,
}

/// `cache[s / BS, s % BS, :] = k[t]` for `s = slot_mapping[t]`: writes DeepSeek-V3.2's
/// indexer keys into their paged cache, the one IndexerTopK reads.
///
/// - `k` `[T, Di]`, `cache` `[NB, BS, Di]` (DeepSeek: Di = 128); one float dtype (bf16, f16,
///   f32; an fp8 indexer cache is not supported yet); stride 1 on the last dim of each,
///   other strides free (`k` may be a column slice of a wider projection output, the cache
///   a layer of a larger pool). Any block size BS >= 1.
/// - `slot_mapping` `[T]` i64, the MLA cache's slot mapping (ConcatAndCacheMla's): a slot
///   < 0 is padding and that token is skipped; a slot >= NB * BS is an error on the CPU, and
///   GPU kernels will skip it.
/// - `cache` must not overlap the inputs. Two tokens with the same slot: the last wins on
///   the CPU; unspecified on GPUs.
///
/// The keys are written as given: the block computes them before (`LayerNorm(wk(x))`, with
/// weight and bias, then the half-split rope on the first 64 dims; transformers'
/// `DeepseekV32Indexer`).
pub fn cache_indexer_keys(q: &Queue, args: &CacheIndexerKeysArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, CacheIndexerKeys, args)
}

fn validate(q: &Queue, a: &CacheIndexerKeysArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::CacheIndexerKeys, q.device());
    c.float("k", &a.k, 2)?;
    c.float("cache", &a.cache, 3)?;
    c.same_dtype("k", &a.k, a.cache.dtype())?;
    let t = a.k.dim(0);
    c.dim("cache", &a.cache, 2, a.k.dim(1), "k's Di")?;
    c.block_size("cache", &a.cache)?;
    c.unit_inner("k", &a.k)?;
    c.unit_inner("cache", &a.cache)?;
    c.output("cache", &a.cache)?;
    c.disjoint("cache", &a.cache, "k", &a.k)?;
    c.typed("slot_mapping", &a.slot_mapping, 1, DType::I64)?;
    c.dim("slot_mapping", &a.slot_mapping, 0, t, "k's T")?;
    c.disjoint("cache", &a.cache, "slot_mapping", &a.slot_mapping)?;
    if let Some(v) = host_ints(&c, "slot_mapping", &a.slot_mapping)? {
        let slots = a.cache.dim(0).saturating_mul(a.cache.dim(1));
        if let Some((i, s)) = v.iter().enumerate().find(|(_, &s)| s >= slots) {
            return Err(
                c.err("slot_mapping", format!("slot_mapping[{i}] = {s} is past the cache's {slots} slots"))
            );
        }
    }
    Ok(())
}
