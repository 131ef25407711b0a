//! FusedNormRope: kernels-hip/fused_norm_rope.hip, one block per row (the same block size
//! and helpers as RmsNorm and RopeFromCache, hence bit-identical to them).

use vt_core::{FusedNormRopeArgs, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};

pub(crate) fn plan(a: &FusedNormRopeArgs<'_>) -> Result<Vec<Step>> {
    let (t, l) = (a.kv.dim(0), a.weight.dim(0));
    let r = a.kv.dim(1) - l;
    let args = KernelArgs::new()
        .tensor(&a.latent_out)
        .i64(a.latent_out.stride(0))
        .tensor(&a.rope_out)
        .i64(a.rope_out.stride(0))
        .tensor(&a.kv)
        .i64(a.kv.stride(0))
        .tensor(&a.weight)
        .i64s(&[t, l, r])
        .tensor(&a.positions)
        .i64(a.positions.stride(0))
        .tensor(&a.cos_sin_cache)
        .i64(a.cos_sin_cache.dim(0))
        .f32(a.eps)
        .i32(a.is_neox as i32);
    Ok(kernels([Launch::new("fused_norm_rope", "fused_norm_rope.hip", a.kv.dtype(), t, args)?]))
}

pub(crate) fn run(q: &Queue, a: &FusedNormRopeArgs<'_>) -> Result<()> {
    HipQueue::of(OpId::FusedNormRope, q)?.run(&plan(a)?)
}
