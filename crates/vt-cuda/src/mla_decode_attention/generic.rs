//! The generic MlaDecodeAttention kernel (`kernels-cuda/mla_decode_attention/generic.cuh`):
//! any D, Dv, strides and float dtype, a float or fp8_ds_mla cache; a warp per key, f32
//! math, one query row per CTA. The correctness path for f32, fp8_ds_mla caches, other head
//! dims and unaligned views.

use vt_core::{DType, Error, MlaDecodeAttentionArgs, Result};

use super::{CacheMaps, MainKernel, MAX_SMEM, OP};

/// Threads per CTA (`mla::GEN_THREADS`: 4 warps, a key each).
pub(super) const THREADS: u32 = 128;
/// CTAs per SM the parts are sized for: the kernel is small.
const CTAS_PER_SM: i64 = 8;

/// Dynamic shared memory for head dims D, Dv (`mla::generic_smem`): the query row and one
/// Dv accumulator row per warp, f32.
pub(super) fn smem_bytes(d: i64, dv: i64) -> i64 {
    (d + (THREADS as i64 / 32) * dv) * 4
}

/// The main launch: `mla_decode_generic_*`, or `mla_decode_generic_fp8_*` over an
/// fp8_ds_mla cache (dequantized on load). Head dims whose shared memory exceeds a block's
/// are an error.
pub(super) fn main(a: &MlaDecodeAttentionArgs<'_>) -> Result<MainKernel> {
    let (d, dv) = (a.query.dim(3), a.out.dim(3));
    let bytes = smem_bytes(d, dv);
    if bytes > MAX_SMEM as i64 {
        return Err(Error::invalid(
            OP,
            "query",
            format!("head dims D = {d}, Dv = {dv} need {bytes} bytes of shared memory (at most {MAX_SMEM})"),
        ));
    }
    let (base, name) = if a.cache.dtype() == DType::Fp8DsMla {
        ("mla_decode_generic_fp8", "generic_fp8")
    } else {
        ("mla_decode_generic", "generic")
    };
    Ok(MainKernel {
        base,
        name,
        rows: 1,
        smem: bytes as u32,
        threads: THREADS,
        maps: CacheMaps::None,
        ctas_per_sm: CTAS_PER_SM,
        cluster_y: 1,
    })
}
