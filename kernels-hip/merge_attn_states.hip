// MergeAttnStates: out = (wp * prefix + ws * suffix) / (wp + ws), out_lse = m + ln(wp + ws)
// with m = max(lp, ls), wp = exp(lp - m), ws = exp(ls - m). An infinite lse (either sign)
// is an empty side: weight 0 and its values are never read; both empty gives out = 0 and
// out_lse = -inf. One block per (t, n) row (grid-stride). `out_lse` may be null.
#include "common.h"

template <typename T>
__device__ void merge_attn_states(T* out, i64 o_s0, i64 o_s1, float* out_lse, i64 ol_s0, i64 ol_s1,
                                  const T* prefix, i64 p_s0, i64 p_s1, const float* prefix_lse, i64 pl_s0,
                                  i64 pl_s1, const T* suffix, i64 s_s0, i64 s_s1, const float* suffix_lse,
                                  i64 sl_s0, i64 sl_s1, i64 tokens, i64 heads, i64 v) {
  VT_FOR_BLOCKS(row, tokens * heads) {
    const i64 t = row / heads, n = row % heads;
    float lp = prefix_lse[n * pl_s0 + t * pl_s1];
    float ls = suffix_lse[n * sl_s0 + t * sl_s1];
    if (vt::is_inf(lp)) lp = vt::neg_inf();
    if (vt::is_inf(ls)) ls = vt::neg_inf();
    const float m = fmaxf(lp, ls);
    T* dst = out + t * o_s0 + n * o_s1;
    const T* pr = prefix + t * p_s0 + n * p_s1;
    const T* sf = suffix + t * s_s0 + n * s_s1;
    if (m == vt::neg_inf()) {
      for (i64 i = threadIdx.x; i < v; i += blockDim.x) dst[i] = vt::from_f32<T>(0.0f);
      if (out_lse && threadIdx.x == 0) out_lse[n * ol_s0 + t * ol_s1] = vt::neg_inf();
      continue;
    }
    const float wp = expf(lp - m), ws = expf(ls - m);
    const float sum = wp + ws;
    // An empty side is not read at all: its rows may hold anything (even NaN).
    const bool use_p = lp != vt::neg_inf(), use_s = ls != vt::neg_inf();
    for (i64 i = threadIdx.x; i < v; i += blockDim.x) {
      float o = 0.0f;
      if (use_p) o += wp * vt::to_f32(pr[i]);
      if (use_s) o += ws * vt::to_f32(sf[i]);
      dst[i] = vt::from_f32<T>(o / sum);
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
VT_FOR_EACH_FLOAT(VT_MERGE_ATTN_STATES)
