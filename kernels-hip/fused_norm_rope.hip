// FusedNormRope: one block per row t of kv[T, L+R] (grid-stride): latent_out[t] =
// RmsNorm(kv[t, :L], weight, eps) and rope_out[t] = RoPE(kv[t, L:]) at positions[t].
// The same helpers as rms_norm.hip and rope_from_cache.hip (common.h), the same block size
// and reduction order, so the result is bit-identical to RmsNorm + RopeFromCache on a copy.
// A position outside 0..max_pos copies the rope part unrotated (as that split path would).
#include "common.h"

template <typename T>
__device__ void fused_norm_rope(T* latent_out, i64 lo_s0, T* rope_out, i64 ro_s0, const T* kv, i64 kv_s0,
                                const T* weight, i64 rows, i64 l, i64 r, const i64* positions, i64 pos_stride,
                                const float* cos_sin, i64 max_pos, float eps, int is_neox) {
  __shared__ float scratch[VT_MAX_WAVES];
  const i64 half = r / 2;
  VT_FOR_BLOCKS(t, rows) {
    const T* row = kv + t * kv_s0;
    T* lo = latent_out + t * lo_s0;
    const float scale = vt_rms_scale(row, l, eps, scratch);
    for (i64 i = threadIdx.x; i < l; i += blockDim.x) {
      vt_store(lo, i, vt_rms_apply<T>(vt_load(row, i), scale, vt_load(weight, i)));
    }
    const T* pe = row + l;
    T* ro = rope_out + t * ro_s0;
    const i64 pos = positions[t * pos_stride];
    for (i64 i = threadIdx.x; i < half; i += blockDim.x) {
      i64 i0, i1;
      vt_rope_pair_index(i, r, is_neox != 0, &i0, &i1);
      const float x0 = vt_load(pe, i0), x1 = vt_load(pe, i1);
      float y0 = x0, y1 = x1;
      if (pos >= 0 && pos < max_pos) {
        vt_rope_rotate(x0, x1, cos_sin[pos * r + i], cos_sin[pos * r + half + i], &y0, &y1);
      }
      vt_store(ro, i0, y0);
      vt_store(ro, i1, y1);
    }
  }
}

#define VT_FUSED_NORM_ROPE(NAME, T)                                                                      \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) fused_norm_rope_##NAME(                         \
      T* latent_out, i64 lo_s0, T* rope_out, i64 ro_s0, const T* kv, i64 kv_s0, const T* weight, i64 rows, \
      i64 l, i64 r, const i64* positions, i64 pos_stride, const float* cos_sin, i64 max_pos, float eps,    \
      int is_neox) {                                                                                     \
    fused_norm_rope<T>(latent_out, lo_s0, rope_out, ro_s0, kv, kv_s0, weight, rows, l, r, positions,      \
                       pos_stride, cos_sin, max_pos, eps, is_neox);                                      \
  }
VT_FOR_EACH_DTYPE(VT_FUSED_NORM_ROPE)
