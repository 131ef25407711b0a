//! FusedNormRope: kernels-hip/fused_norm_rope.hip, one block per row (the same block size
//! and helpers as RmsNorm and RopeFromCache, hence bit-identical to them); the optional query
//! rope and cache write in the same launch.

use vt_core::{FusedNormRopeArgs, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};

pub(crate) fn plan(a: &FusedNormRopeArgs<'_>) -> Result<Vec<Step>> {
    let (t, l) = (a.kv.dim(0), a.weight.dim(0));
    let r = a.kv.dim(1) - l;
    let mut args = KernelArgs::new()
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
    // No query: null pointers and 0 tokens; no cache write: a null cache.
    args = match &a.query {
        Some(x) => args
            .tensor(&x.input)
            .i64s(&[x.input.stride(0), x.input.stride(1)])
            .tensor(&x.out)
            .i64s(&[x.out.stride(0), x.out.stride(1), x.input.dim(1), x.input.dim(0)]),
        None => args.ptr(0).i64s(&[0, 0]).ptr(0).i64s(&[0, 0, 0, 0]),
    };
    args = match &a.cache_write {
        Some(x) => args
            .tensor(&x.cache)
            .i64s(&[x.cache.stride(0), x.cache.stride(1)])
            .tensor(&x.slot_mapping)
            .i64s(&[x.slot_mapping.stride(0), x.cache.dim(0), x.cache.dim(1)]),
        None => args.ptr(0).i64s(&[0, 0]).ptr(0).i64s(&[0, 0, 1]),
    };
    Ok(kernels([Launch::new("fused_norm_rope", "fused_norm_rope.hip", a.kv.dtype(), t, args)?]))
}

pub(crate) fn run(q: &Queue, a: &FusedNormRopeArgs<'_>) -> Result<()> {
    HipQueue::of(OpId::FusedNormRope, q)?.run(&plan(a)?)
}
