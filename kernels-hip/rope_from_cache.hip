// RopeFromCache: rotates x[T,H,R] (strided, unit stride on R) in place by the angles of
// positions[t] from cos_sin_cache[max_pos, R] (row = [cos(R/2) | sin(R/2)], f32). One
// thread per rotary pair (grid-stride). vt-hip launches it once for q and once for k.
// A token whose position is outside 0..max_pos is left unrotated.
#include "common.h"

template <typename T>
__device__ void rope_from_cache(T* x, i64 x_s0, i64 x_s1, i64 tokens, i64 heads, i64 r,
                                const i64* positions, i64 pos_stride, const float* cos_sin, i64 max_pos,
                                int is_neox) {
  const i64 half = r / 2;
  VT_FOR_THREADS(idx, tokens * heads * half) {
    const i64 i = idx % half;
    const i64 h = (idx / half) % heads;
    const i64 t = idx / (half * heads);
    const i64 pos = positions[t * pos_stride];
    if (pos < 0 || pos >= max_pos) continue;
    T* row = x + t * x_s0 + h * x_s1;
    i64 i0, i1;
    vt_rope_pair_index(i, r, is_neox != 0, &i0, &i1);
    float y0, y1;
    vt_rope_rotate(vt_load(row, i0), vt_load(row, i1), cos_sin[pos * r + i], cos_sin[pos * r + half + i], &y0,
                   &y1);
    vt_store(row, i0, y0);
    vt_store(row, i1, y1);
  }
}

#define VT_ROPE_FROM_CACHE(NAME, T)                                                                     \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK)                                                \
      rope_from_cache_##NAME(T* x, i64 x_s0, i64 x_s1, i64 tokens, i64 heads, i64 r, const i64* positions, \
                             i64 pos_stride, const float* cos_sin, i64 max_pos, int is_neox) {          \
    rope_from_cache<T>(x, x_s0, x_s1, tokens, heads, r, positions, pos_stride, cos_sin, max_pos, is_neox); \
  }
VT_FOR_EACH_DTYPE(VT_ROPE_FROM_CACHE)
