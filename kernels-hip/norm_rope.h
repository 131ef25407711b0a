// RMS normalization of one row and rotary embedding of one pair, shared by rms_norm.hip,
// rope_from_cache.hip and fused_norm_rope.hip so that FusedNormRope is bit-identical to
// RmsNorm followed by RopeFromCache: same functions, same block size, same order, no
// contraction (-ffp-contract=off). The HIP twin of kernels-cuda/norm_rope.cuh.
#pragma once
#include "common.h"

namespace vt {

// Threads per row of RmsNorm and FusedNormRope. The reduction order depends on it, so both
// kernels are launched with this block size.
#define VT_NORM_THREADS VT_BLOCK

// out[i] = round(round(x[i] * s) * w[i]) with s = 1 / sqrt(sum(x^2) / D + eps) (f32).
// Called by all threads of a block; `out` may equal `x` (each thread reads and writes only
// its own elements, and all reads of the sum precede the barrier).
// `out2` (optional): a second row that receives the same values (FusedNormRope's cache write).
template <typename T>
__device__ __forceinline__ void rms_norm_row(T* out, const T* x, const T* w, i64 d, float eps, T* out2 = nullptr) {
  float ss = 0.0f;
  for (i64 i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = to_f32(x[i]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float scale = 1.0f / sqrtf(ss / (float)d + eps);
  for (i64 i = threadIdx.x; i < d; i += blockDim.x) {
    const float n = round_to<T>(to_f32(x[i]) * scale);
    const T y = from_f32<T>(n * to_f32(w[i]));
    out[i] = y;
    if (out2 != nullptr) out2[i] = y;
  }
}

// Rotates pair `i` of an R-wide row: reads `in`, writes `out` (may be the same row).
// neox: elements (i, i + R/2); GPT-J: (2i, 2i + 1). `cs` is the position's cache row,
// [cos(R/2) | sin(R/2)].
// `out2` (optional): a second row that receives the same values.
template <typename T>
__device__ __forceinline__ void rope_pair(T* out, const T* in, const float* cs, i64 r, i64 i, bool neox,
                                          T* out2 = nullptr) {
  const i64 half = r / 2;
  const i64 i0 = neox ? i : 2 * i;
  const i64 i1 = neox ? i + half : 2 * i + 1;
  const float c = cs[i], s = cs[half + i];
  const float x0 = to_f32(in[i0]), x1 = to_f32(in[i1]);
  const T y0 = from_f32<T>(x0 * c - x1 * s);
  const T y1 = from_f32<T>(x1 * c + x0 * s);
  out[i0] = y0;
  out[i1] = y1;
  if (out2 != nullptr) {
    out2[i0] = y0;
    out2[i1] = y1;
  }
}

}  // namespace vt
