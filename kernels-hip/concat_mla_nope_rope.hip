// ConcatMlaNopeRope: out[t, n, :] = [nope[t, n, :] | rope[t, n, :]]. A rope with one head is
// broadcast over the N heads by passing its head stride as 0. One block per (t, n) row
// (grid-stride).
#include "common.h"

template <typename T>
__device__ void concat_mla_nope_rope(T* out, i64 o_s0, i64 o_s1, const T* nope, i64 n_s0, i64 n_s1,
                                     const T* rope, i64 r_s0, i64 r_s1, i64 tokens, i64 heads, i64 p, i64 r) {
  VT_FOR_BLOCKS(row, tokens * heads) {
    const i64 t = row / heads, n = row % heads;
    T* dst = out + t * o_s0 + n * o_s1;
    const T* a = nope + t * n_s0 + n * n_s1;
    const T* b = rope + t * r_s0 + n * r_s1;
    for (i64 i = threadIdx.x; i < p; i += blockDim.x) dst[i] = a[i];
    for (i64 i = threadIdx.x; i < r; i += blockDim.x) dst[p + i] = b[i];
  }
}

#define VT_CONCAT_MLA_NOPE_ROPE(NAME, T)                                                                  \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) concat_mla_nope_rope_##NAME(                     \
      T* out, i64 o_s0, i64 o_s1, const T* nope, i64 n_s0, i64 n_s1, const T* rope, i64 r_s0, i64 r_s1,    \
      i64 tokens, i64 heads, i64 p, i64 r) {                                                              \
    concat_mla_nope_rope<T>(out, o_s0, o_s1, nope, n_s0, n_s1, rope, r_s0, r_s1, tokens, heads, p, r);    \
  }
VT_FOR_EACH_FLOAT(VT_CONCAT_MLA_NOPE_ROPE)
