use crate::registry::dispatch;
use crate::validate::{host_ints, Check};
use crate::{DType, OpId, Queue, Result, Tensor};

use super::rope_from_cache::check_cache_and_positions;

/// Arguments of [`fused_norm_rope`].
#[derive(Clone, Copy, Debug)]
pub struct FusedNormRopeArgs<'a> {
    pub latent_out: Tensor<'a>,
    pub rope_out: Tensor<'a>,
    pub kv: Tensor<'a>,
    pub weight: Tensor<'a>,
    pub positions: Tensor<'a>,
    pub cos_sin_cache: Tensor<'a>,
    pub eps: f32,
    pub is_neox: bool,
    /// Optional: also rotate the query's rope part of the first tokens (see
    /// [`NormRopeQuery`]).
    pub query: Option<NormRopeQuery<'a>>,
    /// Optional: also write each token's `[latent_out | rope_out]` row into a paged cache
    /// (see [`NormRopeCacheWrite`]).
    pub cache_write: Option<NormRopeCacheWrite<'a>>,
}

/// The query part of [`FusedNormRopeArgs`]: `out[t, h] = RoPE(input[t, h], positions[t])`
/// for the first `Tq` tokens (the MLA block's decode tokens, which come first in a step).
#[derive(Clone, Copy, Debug)]
pub struct NormRopeQuery<'a> {
    /// `[Tq, N, R]`, `Tq <= T`, R = kv's rope width.
    pub input: Tensor<'a>,
    /// `[Tq, N, R]`: the very same view as `input` (in place, as [`crate::rope_from_cache`])
    /// or disjoint from it (the block writes straight into the decode attention's query).
    pub out: Tensor<'a>,
}

/// The cache part of [`FusedNormRopeArgs`]: as [`crate::concat_and_cache_mla`] of
/// `latent_out` and `rope_out` with this cache and slot mapping.
#[derive(Clone, Copy, Debug)]
pub struct NormRopeCacheWrite<'a> {
    /// `[NB, BS, L+R]` of kv's dtype (stride 1 on the last dim; block and row strides free).
    /// An fp8_ds_mla cache is not accepted: [`crate::concat_and_cache_mla`] encodes those.
    pub cache: Tensor<'a>,
    /// `[T]` i64; a slot < 0 is padding (skipped); >= NB*BS an error on the CPU, skipped on
    /// GPUs.
    pub slot_mapping: Tensor<'a>,
}

/// One launch for MLA's kv row: `latent_out = RmsNorm(kv[:, :L], weight, eps)` and
/// `rope_out = RoPE(kv[:, L:], positions)`; optionally the query's rope and the cache write
/// too (the MLA block's `VT_FUSE_DECODE_QUERY` and `VT_FUSE_CACHE_WRITE`).
///
/// - `kv` `[T, L+R]` (stride 1 on the last dim, rows may be strided: the merged
///   A-projection output), `weight` `[L]`, `latent_out` `[T,L]`, `rope_out` `[T,R]` (stride 1
///   on the last dim); one float dtype. `cos_sin_cache` `[max_pos, R]` f32 and
///   `positions` `[T]` i64 as for [`crate::rope_from_cache`].
/// - `query` (optional, [`NormRopeQuery`]): `input` and `out` `[Tq, N, R]` with `Tq <= T`,
///   kv's dtype, stride 1 on the last dim; token t < Tq is rotated at `positions[t]`.
/// - `cache_write` (optional, [`NormRopeCacheWrite`]): `cache[s / BS, s % BS, :] =
///   [latent_out[t] | rope_out[t]]` for `s = slot_mapping[t]`, the same values (bits) as
///   `latent_out` and `rope_out` receive.
/// - Outputs (`latent_out`, `rope_out`, `query.out`, `cache_write.cache`) must not overlap
///   each other or any input, except that `query.out` may be exactly `query.input`.
/// - Bit-identical to [`crate::rms_norm`] on `kv[:, :L]` followed by
///   [`crate::rope_from_cache`] on a copy of `kv[:, L:]` (same arithmetic, same order), then
///   [`crate::rope_from_cache`] of the query (a position outside the cache leaves its
///   values unrotated: copied to an out-of-place `out`) and [`crate::concat_and_cache_mla`].
pub fn fused_norm_rope(q: &Queue, args: &FusedNormRopeArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, FusedNormRope, args)
}

/// Whether two views are the same elements in the same order (an in-place query).
fn same_view(a: &Tensor<'_>, b: &Tensor<'_>) -> bool {
    a.data_addr() == b.data_addr() && a.shape() == b.shape() && a.strides() == b.strides()
}

fn validate(q: &Queue, a: &FusedNormRopeArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::FusedNormRope, q.device());
    c.float("kv", &a.kv, 2)?;
    c.float("weight", &a.weight, 1)?;
    c.float("latent_out", &a.latent_out, 2)?;
    c.float("rope_out", &a.rope_out, 2)?;
    let dt = a.kv.dtype();
    for (name, t) in [("weight", &a.weight), ("latent_out", &a.latent_out), ("rope_out", &a.rope_out)] {
        c.same_dtype(name, t, dt)?;
    }
    let (t, l) = (a.kv.dim(0), a.weight.dim(0));
    let r = a.kv.dim(1) - l;
    if r <= 0 {
        return Err(
            c.err("kv", format!("width {} leaves no rope part after the {l}-wide latent", a.kv.dim(1)))
        );
    }
    c.dim("latent_out", &a.latent_out, 0, t, "kv's T")?;
    c.dim("latent_out", &a.latent_out, 1, l, "weight's L")?;
    c.dim("rope_out", &a.rope_out, 0, t, "kv's T")?;
    c.dim("rope_out", &a.rope_out, 1, r, "kv's width minus L")?;
    for (name, x) in
        [("kv", &a.kv), ("weight", &a.weight), ("latent_out", &a.latent_out), ("rope_out", &a.rope_out)]
    {
        c.unit_inner(name, x)?;
    }
    c.output("latent_out", &a.latent_out)?;
    c.output("rope_out", &a.rope_out)?;
    let mut inputs = vec![
        ("kv", a.kv),
        ("weight", a.weight),
        ("positions", a.positions),
        ("cos_sin_cache", a.cos_sin_cache),
    ];
    let mut outputs = vec![("latent_out", a.latent_out), ("rope_out", a.rope_out)];
    if let Some(qr) = &a.query {
        c.float("query.input", &qr.input, 3)?;
        c.float("query.out", &qr.out, 3)?;
        c.same_dtype("query.input", &qr.input, dt)?;
        c.same_dtype("query.out", &qr.out, dt)?;
        let tq = qr.input.dim(0);
        if tq > t {
            return Err(c.err("query.input", format!("has {tq} tokens, more than kv's T = {t}")));
        }
        c.dim("query.input", &qr.input, 2, r, "kv's rope width R")?;
        for d in 0..3 {
            c.dim("query.out", &qr.out, d, qr.input.dim(d), "query.input's shape")?;
        }
        c.unit_inner("query.input", &qr.input)?;
        c.unit_inner("query.out", &qr.out)?;
        c.output("query.out", &qr.out)?;
        if !same_view(&qr.input, &qr.out) {
            c.disjoint("query.out", &qr.out, "query.input", &qr.input)?;
        }
        // The other outputs must not overlap the query's input either.
        for (name, x) in &outputs {
            c.disjoint(name, x, "query.input", &qr.input)?;
        }
        outputs.push(("query.out", qr.out));
    }
    if let Some(cw) = &a.cache_write {
        if cw.cache.dtype() == DType::Fp8DsMla {
            return Err(c.err(
                "cache_write.cache",
                "is an fp8_ds_mla cache; FusedNormRope writes float caches only (ConcatAndCacheMla \
                 encodes fp8_ds_mla rows)",
            ));
        }
        c.float("cache_write.cache", &cw.cache, 3)?;
        c.same_dtype("cache_write.cache", &cw.cache, dt)?;
        c.dim("cache_write.cache", &cw.cache, 2, a.kv.dim(1), "kv's L + R")?;
        c.block_size("cache_write.cache", &cw.cache)?;
        c.unit_inner("cache_write.cache", &cw.cache)?;
        c.output("cache_write.cache", &cw.cache)?;
        c.typed("cache_write.slot_mapping", &cw.slot_mapping, 1, DType::I64)?;
        c.dim("cache_write.slot_mapping", &cw.slot_mapping, 0, t, "kv's T")?;
        if let Some(v) = host_ints(&c, "slot_mapping", &cw.slot_mapping)? {
            let slots = cw.cache.dim(0) * cw.cache.dim(1);
            if let Some((i, s)) = v.iter().enumerate().find(|(_, &s)| s >= slots) {
                return Err(c.err(
                    "cache_write.slot_mapping",
                    format!("slot_mapping[{i}] = {s} is past the cache's {slots} slots"),
                ));
            }
        }
        if let Some(qr) = &a.query {
            c.disjoint("cache_write.cache", &cw.cache, "query.input", &qr.input)?;
        }
        inputs.push(("cache_write.slot_mapping", cw.slot_mapping));
        outputs.push(("cache_write.cache", cw.cache));
    }
    for (oi, (oname, o)) in outputs.iter().enumerate() {
        for (iname, x) in &inputs {
            c.disjoint(oname, o, iname, x)?;
        }
        for (pname, p) in &outputs[..oi] {
            c.disjoint(oname, o, pname, p)?;
        }
    }
    c.positive_finite("eps", a.eps)?;
    check_cache_and_positions(&c, &a.cos_sin_cache, &a.positions, r, t)
}
