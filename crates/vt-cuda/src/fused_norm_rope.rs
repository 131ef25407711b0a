//! FusedNormRope: RmsNorm of the latent part and RoPE of the rope part of each kv row in one
//! launch (`kernels-cuda/fused_norm_rope.cu`), bit-identical to the split ops because both
//! use `kernels-cuda/norm_rope.cuh` with the same block size.

use vt_core::{FusedNormRopeArgs, OpId, Queue, Result};

use crate::rms_norm::NORM_THREADS;
use crate::rope_from_cache::int;
use crate::{grid_1d, kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("fused_norm_rope");

const OP: OpId = OpId::FusedNormRope;

pub(crate) fn run(q: &Queue, a: &FusedNormRopeArgs<'_>) -> Result<()> {
    CudaQueue::of(q, OP)?.run(OP, &plan(a)?)
}

/// The kernel skips positions outside the cache.
pub(crate) fn plan(a: &FusedNormRopeArgs<'_>) -> Result<Vec<Launch>> {
    let (t, l) = (a.kv.dim(0), a.weight.dim(0));
    let r = a.kv.dim(1) - l;
    if t == 0 {
        return Ok(vec![]);
    }
    let args: [Arg; 16] = [
        a.latent_out.data_addr().into(),
        a.latent_out.stride(0).into(),
        a.rope_out.data_addr().into(),
        a.rope_out.stride(0).into(),
        a.kv.data_addr().into(),
        a.kv.stride(0).into(),
        a.weight.data_addr().into(),
        int(OP, "weight", l)?.into(),
        int(OP, "kv", r)?.into(),
        a.positions.data_addr().into(),
        a.positions.stride(0).into(),
        a.cos_sin_cache.data_addr().into(),
        a.cos_sin_cache.dim(0).into(),
        t.into(),
        a.eps.into(),
        (a.is_neox as i32).into(),
    ];
    Ok(vec![Launch::new(&SRC, "fused_norm_rope", a.kv.dtype(), (grid_1d(t), 1, 1), NORM_THREADS, args)])
}
