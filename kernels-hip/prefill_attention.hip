// PrefillAttention: variable-length MHA. Query row i of sequence b (rows cu_q[b] ..
// cu_q[b+1]) and head n sees keys cu_k[b] .. cu_k[b+1] of k[Tk, N, D] / v[Tk, N, Dv]; causal
// (bottom-right) limits it to the first lk - lq + i + 1 of them. One block per (b, i, n)
// with i < max_seqlen_q (grid-stride); rows past a sequence's length do nothing. A
// sequence whose cumulative lengths are decreasing or point past q / k is skipped.
// Dynamic shared memory: VT_ATTN_SMEM_FLOATS(D, Dv) floats.
#include "attention.h"

template <typename T>
struct strided_rows {
  const T* base;  // row 0 of this sequence and head
  i64 s0;
  __device__ const T* row(i64 j) const { return base + j * s0; }
};

template <typename T>
__device__ void prefill_attention(T* out, i64 o_s0, i64 o_s1, float* lse, i64 l_s0, i64 l_s1, const T* q,
                                  i64 q_s0, i64 q_s1, const T* k, i64 k_s0, i64 k_s1, const T* v, i64 v_s0,
                                  i64 v_s1, const int* cu_q, i64 cuq_stride, const int* cu_k, i64 cuk_stride,
                                  i64 batch, i64 max_q, i64 total_q, i64 total_k, i64 heads, i64 d, i64 dv,
                                  int causal, float scale) {
  extern __shared__ float smem[];
  VT_FOR_BLOCKS(row, batch * max_q * heads) {
    const i64 n = row % heads;
    const i64 i = (row / heads) % max_q;
    const i64 b = row / (heads * max_q);
    const i64 q0 = cu_q[b * cuq_stride], q1 = cu_q[(b + 1) * cuq_stride];
    const i64 k0 = cu_k[b * cuk_stride], k1 = cu_k[(b + 1) * cuk_stride];
    if (q0 < 0 || q1 < q0 || q1 > total_q || k0 < 0 || k1 < k0 || k1 > total_k) continue;
    const i64 lq = q1 - q0, lk = k1 - k0;
    if (i >= lq) continue;
    i64 n_keys = lk;
    if (causal) {
      n_keys = lk - lq + i + 1;
      if (n_keys < 0) n_keys = 0;
      if (n_keys > lk) n_keys = lk;
    }
    const strided_rows<T> keys = {k + k0 * k_s0 + n * k_s1, k_s0};
    const strided_rows<T> values = {v + k0 * v_s0 + n * v_s1, v_s0};
    float* l = lse ? lse + n * l_s0 + (q0 + i) * l_s1 : (float*)0;
    vt::attend_row(q + (q0 + i) * q_s0 + n * q_s1, d, dv, n_keys, scale, keys, values, smem,
                  out + (q0 + i) * o_s0 + n * o_s1, l);
  }
}

#define VT_PREFILL_ATTENTION(NAME, T)                                                                      \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) prefill_attention_##NAME(                         \
      T* out, i64 o_s0, i64 o_s1, float* lse, i64 l_s0, i64 l_s1, const T* q, i64 q_s0, i64 q_s1, const T* k, \
      i64 k_s0, i64 k_s1, const T* v, i64 v_s0, i64 v_s1, const int* cu_q, i64 cuq_stride, const int* cu_k, \
      i64 cuk_stride, i64 batch, i64 max_q, i64 total_q, i64 total_k, i64 heads, i64 d, i64 dv, int causal,  \
      float scale) {                                                                                       \
    prefill_attention<T>(out, o_s0, o_s1, lse, l_s0, l_s1, q, q_s0, q_s1, k, k_s0, k_s1, v, v_s0, v_s1,     \
                         cu_q, cuq_stride, cu_k, cuk_stride, batch, max_q, total_q, total_k, heads, d, dv,  \
                         causal, scale);                                                                   \
  }
VT_FOR_EACH_FLOAT(VT_PREFILL_ATTENTION)
