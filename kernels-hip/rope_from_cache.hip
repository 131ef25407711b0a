// RopeFromCache: rotates x [T, H, R] (strided, unit stride on R) in place from the cos/sin
// cache [max_pos, R] (f32, row = [cos(R/2) | sin(R/2)]) at positions[t]. One thread per
// rotary pair (grid-stride); vt-hip launches it once for q and once for k. A token whose
// position is outside the cache is left unrotated.
#include "norm_rope.h"

template <typename T>
__device__ void rope_from_cache(T* x, i64 x_st, i64 x_sh, i64 tokens, i64 heads, i64 r, const i64* pos, i64 pos_s,
                                const float* cache, i64 max_pos, int neox) {
  const i64 half = r / 2;
  VT_FOR_THREADS(j, tokens * heads * half) {
    const i64 i = j % half, h = (j / half) % heads, t = j / (half * heads);
    const i64 p = pos[t * pos_s];
    if (p < 0 || p >= max_pos) continue;
    T* row = x + t * x_st + h * x_sh;
    vt::rope_pair<T>(row, row, cache + p * r, r, i, neox != 0);
  }
}

#define VT_ROPE(S, T)                                                                                     \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK)                                                  \
      rope_from_cache_##S(T* x, i64 x_st, i64 x_sh, i64 tokens, i64 heads, i64 r, const i64* pos,         \
                          i64 pos_s, const float* cache, i64 max_pos, int neox) {                         \
    rope_from_cache<T>(x, x_st, x_sh, tokens, heads, r, pos, pos_s, cache, max_pos, neox);                \
  }
VT_FOR_EACH_FLOAT(VT_ROPE)
