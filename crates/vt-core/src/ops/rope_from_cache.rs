use crate::registry::dispatch;
use crate::validate::{host_ints, Check};
use crate::{DType, OpId, Queue, Result, Tensor};

/// Arguments of [`rope_from_cache`].
#[derive(Clone, Copy, Debug)]
pub struct RopeFromCacheArgs<'a> {
    pub query: Tensor<'a>,
    pub key: Option<Tensor<'a>>,
    pub positions: Tensor<'a>,
    pub cos_sin_cache: Tensor<'a>,
    pub is_neox: bool,
}

/// Rotates `query` `[T,Hq,R]` (and `key` `[T,Hk,R]` if given) in place by the angles of
/// `positions[t]` from `cos_sin_cache` `[max_pos, R]` (row = `[cos(R/2) | sin(R/2)]`, f32).
///
/// - `query`, `key`: the rotary slice itself (the caller slices the trailing R columns of a
///   head with a strided view); one float dtype; stride 1 on the last dim, any other
///   strides. `key` may have a different head count (1 for MLA's shared k_pe). `query` and
///   `key` must not overlap.
/// - `positions` `[T]` i64, each in `[0, max_pos)` (checked on the CPU; GPU kernels leave
///   a token with an out-of-range position unrotated).
/// - `is_neox`: pairs `(i, i + R/2)` (half split); otherwise GPT-J pairs `(2i, 2i+1)`.
///   Pair `i` uses `cos[i]`, `sin[i]`: `x0' = x0*cos - x1*sin`, `x1' = x1*cos + x0*sin`,
///   computed in f32 and rounded once.
pub fn rope_from_cache(q: &Queue, args: &RopeFromCacheArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, RopeFromCache, args)
}

fn validate(queue: &Queue, a: &RopeFromCacheArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::RopeFromCache, queue.device());
    c.float("query", &a.query, 3)?;
    let (t, r) = (a.query.dim(0), a.query.dim(2));
    c.unit_inner("query", &a.query)?;
    c.output("query", &a.query)?;
    check_cache_and_positions(&c, &a.cos_sin_cache, &a.positions, r, t)?;
    if let Some(k) = &a.key {
        c.float("key", k, 3)?;
        c.same_dtype("key", k, a.query.dtype())?;
        c.dim("key", k, 0, t, "query's T")?;
        c.dim("key", k, 2, r, "query's R")?;
        c.unit_inner("key", k)?;
        c.output("key", k)?;
        c.disjoint("key", k, "query", &a.query)?;
    }
    // query and key are rotated in place: they are outputs and must not overlap the inputs.
    for (name, x) in [("positions", &a.positions), ("cos_sin_cache", &a.cos_sin_cache)] {
        c.disjoint("query", &a.query, name, x)?;
        if let Some(k) = &a.key {
            c.disjoint("key", k, name, x)?;
        }
    }
    Ok(())
}

/// Shared by RopeFromCache and FusedNormRope: the cache is `[max_pos, R]` f32 contiguous,
/// R even and > 0; positions `[T]` i64 within the cache.
pub(crate) fn check_cache_and_positions(
    c: &Check,
    cache: &Tensor<'_>,
    positions: &Tensor<'_>,
    r: i64,
    t: i64,
) -> Result<()> {
    c.typed("cos_sin_cache", cache, 2, DType::F32)?;
    c.contiguous("cos_sin_cache", cache)?;
    c.dim("cos_sin_cache", cache, 1, r, "the rotary dim")?;
    if r <= 0 || r % 2 != 0 {
        return Err(c.err("cos_sin_cache", format!("rotary dim must be even and > 0, got {r}")));
    }
    c.typed("positions", positions, 1, DType::I64)?;
    c.dim("positions", positions, 0, t, "tokens")?;
    if let Some(v) = host_ints(c, "positions", positions)? {
        let max_pos = cache.dim(0);
        if let Some((i, p)) = v.iter().enumerate().find(|(_, &p)| p < 0 || p >= max_pos) {
            return Err(
                c.err("positions", format!("positions[{i}] = {p} is outside the cache's 0..{max_pos}"))
            );
        }
    }
    Ok(())
}
