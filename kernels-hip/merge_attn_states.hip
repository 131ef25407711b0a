// MergeAttnStates: out = (wp * prefix + ws * suffix) / (wp + ws), out_lse = m + ln(wp + ws)
// with m = max(lp, ls), wp = exp(lp - m), ws = exp(ls - m). An infinite lse (either sign)
// is an empty side: weight 0 and its values are never read; both empty gives out = 0 and
// out_lse = -inf. One block per (t, n) row (grid-stride). `out_lse` may be null.
#include "common.h"

__device__ __forceinline__ float vt_lse_or_empty(float x) { return __builtin_isinf(x) ? -VT_INF : x; }

template <typename T>
__device__ void merge_attn_states(T* out, i64 o_s0, i64 o_s1, float* out_lse, i64 ol_s0, i64 ol_s1,
                                  const T* prefix, i64 p_s0, i64 p_s1, const float* prefix_lse, i64 pl_s0,
                                  i64 pl_s1, const T* suffix, i64 s_s0, i64 s_s1, const float* suffix_lse,
                                  i64 sl_s0, i64 sl_s1, i64 tokens, i64 heads, i64 v) {
  VT_FOR_BLOCKS(row, tokens * heads) {
    const i64 t = row / heads, n = row % heads;
    const float lp = vt_lse_or_empty(prefix_lse[n * pl_s0 + t * pl_s1]);
    const float ls = vt_lse_or_empty(suffix_lse[n * sl_s0 + t * sl_s1]);
    const float m = fmaxf(lp, ls);
    T* dst = out + t * o_s0 + n * o_s1;
    const T* pr = prefix + t * p_s0 + n * p_s1;
    const T* sf = suffix + t * s_s0 + n * s_s1;
    if (m == -VT_INF) {
      for (i64 i = threadIdx.x; i < v; i += blockDim.x) vt_store(dst, i, 0.0f);
      if (out_lse && threadIdx.x == 0) out_lse[n * ol_s0 + t * ol_s1] = -VT_INF;
      continue;
    }
    const float wp = expf(lp - m), ws = expf(ls - m);
    const float sum = wp + ws;
    for (i64 i = threadIdx.x; i < v; i += blockDim.x) {
      float o = 0.0f;
      if (lp != -VT_INF) o += wp * vt_load(pr, i);
      if (ls != -VT_INF) o += ws * vt_load(sf, i);
      vt_store(dst, i, o / sum);
    }
    if (out_lse && threadIdx.x == 0) out_lse[n * ol_s0 + t * ol_s1] = m + logf(sum);
  }
}

#define VT_MERGE_ATTN_STATES(NAME, T)                                                                     \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) merge_attn_states_##NAME(                        \
      T* out, i64 o_s0, i64 o_s1, float* out_lse, i64 ol_s0, i64 ol_s1, const T* prefix, i64 p_s0, i64 p_s1, \
      const float* prefix_lse, i64 pl_s0, i64 pl_s1, const T* suffix, i64 s_s0, i64 s_s1,                  \
      const float* suffix_lse, i64 sl_s0, i64 sl_s1, i64 tokens, i64 heads, i64 v) {                      \
    merge_attn_states<T>(out, o_s0, o_s1, out_lse, ol_s0, ol_s1, prefix, p_s0, p_s1, prefix_lse, pl_s0,     \
                         pl_s1, suffix, s_s0, s_s1, suffix_lse, sl_s0, sl_s1, tokens, heads, v);          \
  }
VT_FOR_EACH_DTYPE(VT_MERGE_ATTN_STATES)
