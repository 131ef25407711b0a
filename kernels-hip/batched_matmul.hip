// BatchedMatmul: out[g, m, n] = sum_k a[g, m, k] * b[g, k, n], any strides on every dim, f32
// accumulation. A plain 16x16 shared-memory tiled GEMM (VT_BLOCK = 256 threads = one tile),
// grid-stride over tiles and batches. vt-hip uses rocBLAS when each matrix has a unit
// stride in one of its last two dims and rocBLAS is present; this kernel covers the rest
// (and MatmulBT without rocBLAS, as a batch of one with b seen transposed).
#include "common.h"

#define VT_TILE 16

template <typename T>
__device__ void batched_matmul(T* out, i64 o_s0, i64 o_s1, i64 o_s2, const T* a, i64 a_s0, i64 a_s1, i64 a_s2,
                               const T* b, i64 b_s0, i64 b_s1, i64 b_s2, i64 batch, i64 m, i64 n, i64 k) {
  __shared__ float as[VT_TILE][VT_TILE + 1];
  __shared__ float bs[VT_TILE][VT_TILE + 1];
  const int tx = threadIdx.x % VT_TILE, ty = threadIdx.x / VT_TILE;
  const i64 tiles_m = (m + VT_TILE - 1) / VT_TILE, tiles_n = (n + VT_TILE - 1) / VT_TILE;
  VT_FOR_BLOCKS(tile, batch * tiles_m * tiles_n) {
    const i64 g = tile / (tiles_m * tiles_n);
    const i64 row = ((tile / tiles_n) % tiles_m) * VT_TILE + ty;
    const i64 col = (tile % tiles_n) * VT_TILE + tx;
    const T* ag = a + g * a_s0;
    const T* bg = b + g * b_s0;
    float acc = 0.0f;
    for (i64 k0 = 0; k0 < k; k0 += VT_TILE) {
      const i64 ka = k0 + tx, kb = k0 + ty;
      as[ty][tx] = (row < m && ka < k) ? vt::to_f32(ag[row * a_s1 + ka * a_s2]) : 0.0f;
      bs[ty][tx] = (kb < k && col < n) ? vt::to_f32(bg[kb * b_s1 + col * b_s2]) : 0.0f;
      __syncthreads();
      for (int kk = 0; kk < VT_TILE; ++kk) acc += as[ty][kk] * bs[kk][tx];
      __syncthreads();
    }
    if (row < m && col < n) out[g * o_s0 + row * o_s1 + col * o_s2] = vt::from_f32<T>(acc);
  }
}

#define VT_BATCHED_MATMUL(NAME, T)                                                                         \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) batched_matmul_##NAME(                            \
      T* out, i64 o_s0, i64 o_s1, i64 o_s2, const T* a, i64 a_s0, i64 a_s1, i64 a_s2, const T* b, i64 b_s0,  \
      i64 b_s1, i64 b_s2, i64 batch, i64 m, i64 n, i64 k) {                                                \
    batched_matmul<T>(out, o_s0, o_s1, o_s2, a, a_s0, a_s1, a_s2, b, b_s0, b_s1, b_s2, batch, m, n, k);     \
  }
VT_FOR_EACH_FLOAT(VT_BATCHED_MATMUL)
