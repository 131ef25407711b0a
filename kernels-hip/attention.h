// The attention core shared by mla_decode_attention.hip and prefill_attention.hip: one
// query row against a run of keys with an online softmax, one block per query row.
//
// Keys are taken in tiles of VT_KEY_TILE: each wave computes whole dot products (lanes
// stride over the head dim, then a wave sum), the tile's scores go to shared memory, and
// every thread keeps the same running max `m` and denominator `l` (each reads the tile's
// scores in the same order, so they agree bit for bit). The value accumulator lives in
// shared memory, each element owned by one thread, which rescales it by exp(m_old - m_new)
// when the max grows.
#pragma once
#include "common.h"

#define VT_KEY_TILE 128

// Dynamic shared memory the core needs, in floats: q[d] + acc[dv] + scores[VT_KEY_TILE].
// (vt-hip computes the same number on the host.)
#define VT_ATTN_SMEM_FLOATS(d, dv) ((d) + (dv) + VT_KEY_TILE)

namespace vt {

// `keys.row(j)` / `values.row(j)`: key / value row j, indexable (`row[i]`, unit stride):
// a pointer into a float cache, or an fp8_ds_mla row that dequantizes on load
// (fp8_ds_mla.h's row_ref, whose elements are already f32).
template <typename T, typename Keys, typename Values>
__device__ void attend_row(const T* q, i64 d, i64 dv, i64 n_keys, float scale, const Keys& keys,
                           const Values& values, float* smem, T* out, float* lse) {
  float* qs = smem;
  float* acc = smem + d;
  float* p = smem + d + dv;
  const int lane = threadIdx.x % warpSize;
  const int wave = threadIdx.x / warpSize;
  const int waves = (blockDim.x + warpSize - 1) / warpSize;

  for (i64 i = threadIdx.x; i < d; i += blockDim.x) qs[i] = vt::to_f32(q[i]);
  for (i64 i = threadIdx.x; i < dv; i += blockDim.x) acc[i] = 0.0f;
  __syncthreads();

  float m = vt::neg_inf(), l = 0.0f;
  for (i64 j0 = 0; j0 < n_keys; j0 += VT_KEY_TILE) {
    const int nk = (int)((n_keys - j0) < VT_KEY_TILE ? (n_keys - j0) : VT_KEY_TILE);
    for (int jj = wave; jj < nk; jj += waves) {
      const auto k = keys.row(j0 + jj);
      float s = 0.0f;
      for (i64 i = lane; i < d; i += warpSize) s += qs[i] * vt::to_f32(k[i]);
      s = vt::wave_sum(s);
      if (lane == 0) p[jj] = s * scale;
    }
    __syncthreads();
    float tile_max = vt::neg_inf();
    for (int jj = 0; jj < nk; ++jj) tile_max = fmaxf(tile_max, p[jj]);
    const float m_new = fmaxf(m, tile_max);
    const float corr = (m == vt::neg_inf()) ? 0.0f : expf(m - m_new);
    __syncthreads();  // every thread has read the raw scores
    for (int jj = threadIdx.x; jj < nk; jj += blockDim.x) p[jj] = expf(p[jj] - m_new);
    __syncthreads();
    float tile_sum = 0.0f;
    for (int jj = 0; jj < nk; ++jj) tile_sum += p[jj];
    l = l * corr + tile_sum;
    m = m_new;
    for (i64 i = threadIdx.x; i < dv; i += blockDim.x) {
      float a = acc[i] * corr;
      for (int jj = 0; jj < nk; ++jj) a += p[jj] * vt::to_f32(values.row(j0 + jj)[i]);
      acc[i] = a;
    }
    __syncthreads();  // the next tile overwrites p
  }

  if (n_keys <= 0) {
    for (i64 i = threadIdx.x; i < dv; i += blockDim.x) out[i] = vt::from_f32<T>(0.0f);
    if (lse && threadIdx.x == 0) *lse = vt::neg_inf();
    return;
  }
  for (i64 i = threadIdx.x; i < dv; i += blockDim.x) out[i] = vt::from_f32<T>(acc[i] / l);
  if (lse && threadIdx.x == 0) *lse = m + logf(l);
}

}  // namespace vt
