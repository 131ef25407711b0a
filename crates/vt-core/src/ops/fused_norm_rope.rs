use crate::registry::dispatch;
use crate::validate::Check;
use crate::{OpId, Queue, Result, Tensor};

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
}

/// One launch for MLA's kv row: `latent_out = RmsNorm(kv[:, :L], weight, eps)` and
/// `rope_out = RoPE(kv[:, L:], positions)`.
///
/// - `kv` `[T, L+R]` (stride 1 on the last dim, rows may be strided: the merged
///   A-projection output), `weight` `[L]`, `latent_out` `[T,L]`, `rope_out` `[T,R]` (stride 1
///   on the last dim); one float dtype. `cos_sin_cache` `[max_pos, R]` f32 and
///   `positions` `[T]` i64 as for [`crate::rope_from_cache`].
/// - Outputs must not overlap each other or any input.
/// - Bit-identical to [`crate::rms_norm`] on `kv[:, :L]` followed by
///   [`crate::rope_from_cache`] on a copy of `kv[:, L:]` (same arithmetic, same order).
pub fn fused_norm_rope(q: &Queue, args: &FusedNormRopeArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, FusedNormRope, args)
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
    for (name, x) in [
        ("kv", &a.kv),
        ("weight", &a.weight),
        ("positions", &a.positions),
        ("cos_sin_cache", &a.cos_sin_cache),
    ] {
        c.disjoint("latent_out", &a.latent_out, name, x)?;
        c.disjoint("rope_out", &a.rope_out, name, x)?;
    }
    c.disjoint("rope_out", &a.rope_out, "latent_out", &a.latent_out)?;
    c.positive_finite("eps", a.eps)?;
    check_cache_and_positions(&c, &a.cos_sin_cache, &a.positions, r, t)
}
