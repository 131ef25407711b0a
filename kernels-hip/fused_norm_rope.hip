// FusedNormRope: for each row t of kv [T, L+R], latent_out[t] = RmsNorm(kv[t, :L], w) and
// rope_out[t] = RoPE(kv[t, L:], positions[t]) in one launch. Uses the same device
// functions and block size as rms_norm.hip and rope_from_cache.hip, so the result is
// bit-identical to RmsNorm followed by RopeFromCache on a copy of the rope part (a token
// whose position is outside the cache gets the unrotated copy).
#include "norm_rope.h"

template <typename T>
__device__ void fused_norm_rope(T* latent, i64 lat_s, T* rope, i64 rope_s, const T* kv, i64 kv_s, const T* w,
                                i64 tokens, i64 l, i64 r, const i64* pos, i64 pos_s, const float* cache,
                                i64 max_pos, float eps, int neox) {
  VT_FOR_BLOCKS(t, tokens) {
    const T* row = kv + t * kv_s;
    vt::rms_norm_row<T>(latent + t * lat_s, row, w, l, eps);
    const T* in = row + l;
    T* out = rope + t * rope_s;
    const i64 p = pos[t * pos_s];
    if (p < 0 || p >= max_pos) {
      for (i64 i = threadIdx.x; i < r; i += blockDim.x) out[i] = in[i];
    } else {
      for (i64 i = threadIdx.x; i < r / 2; i += blockDim.x) vt::rope_pair<T>(out, in, cache + p * r, r, i, neox != 0);
    }
  }
}

#define VT_FUSED(S, T)                                                                                      \
  extern "C" __global__ void __launch_bounds__(VT_NORM_THREADS)                                             \
      fused_norm_rope_##S(T* latent, i64 lat_s, T* rope, i64 rope_s, const T* kv, i64 kv_s, const T* w,     \
                          i64 tokens, i64 l, i64 r, const i64* pos, i64 pos_s, const float* cache,          \
                          i64 max_pos, float eps, int neox) {                                               \
    fused_norm_rope<T>(latent, lat_s, rope, rope_s, kv, kv_s, w, tokens, l, r, pos, pos_s, cache, max_pos,  \
                       eps, neox);                                                                          \
  }
VT_FOR_EACH_FLOAT(VT_FUSED)
