// Device helpers shared by every kernels-hip/*.hip file: storage types, f32 math of the
// ops, and wavefront-size-independent reductions.
//
// Compiled two ways: by hiprtc at run time (vt-hip passes -DVT_HIPRTC=1 and serves this
// header from memory) and by hipcc in `cargo xtask kernels` (ROCm 5.2 / clang 15, for
// gfx90a and gfx940). Both get -ffp-contract=off so every multiply and add rounds on its
// own, as on the CPU reference (and FusedNormRope stays bit-identical to RmsNorm +
// RopeFromCache).
//
// Wavefronts: CDNA (gfx9) runs 64 lanes, RDNA 32. Nothing here assumes either: reductions
// loop from `warpSize / 2`, and per-wave scratch has room for 1024 / 32 waves.
#pragma once

#ifndef VT_HIPRTC
#include <hip/hip_runtime.h>
#endif

typedef long long i64;

// +infinity (hiprtc has no math.h, so no INFINITY macro).
#define VT_INF __builtin_huge_valf()

// Threads per block of every kernel: a multiple of both wave sizes.
#define VT_BLOCK 256
// Upper bound on the waves of any block (1024 threads / 32 lanes).
#define VT_MAX_WAVES 32

// ---------------------------------------------------------------------------------------
// Storage types. ROCm 5.2 ships no hip_bf16.h, so bf16 is a raw 16-bit pattern with its
// own conversions (round to nearest even, NaN kept quiet: what Rust's `half` does). f16 is
// clang's native _Float16 (hardware conversion, round to nearest even).

struct vt_bf16 {
  unsigned short bits;
};
typedef _Float16 vt_f16;

__device__ __forceinline__ float vt_to_float(float x) { return x; }
__device__ __forceinline__ float vt_to_float(vt_f16 x) { return (float)x; }
__device__ __forceinline__ float vt_to_float(vt_bf16 x) {
  return __uint_as_float(((unsigned)x.bits) << 16);
}

template <typename T>
__device__ __forceinline__ T vt_from_float(float x);

template <>
__device__ __forceinline__ float vt_from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ vt_f16 vt_from_float<vt_f16>(float x) {
  return (vt_f16)x;
}
template <>
__device__ __forceinline__ vt_bf16 vt_from_float<vt_bf16>(float x) {
  unsigned u = __float_as_uint(x);
  vt_bf16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.bits = (unsigned short)((u >> 16) | 0x40u);  // NaN: keep sign and payload, force quiet
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    r.bits = (unsigned short)(u >> 16);
  }
  return r;
}

// `x` rounded to T's precision and back: what storing then loading does.
template <typename T>
__device__ __forceinline__ float vt_round(float x) {
  return vt_to_float(vt_from_float<T>(x));
}

template <typename T>
__device__ __forceinline__ float vt_load(const T* p, i64 i) {
  return vt_to_float(p[i]);
}
template <typename T>
__device__ __forceinline__ void vt_store(T* p, i64 i, float x) {
  p[i] = vt_from_float<T>(x);
}

// Instantiates `X(suffix, type)` once per float dtype: kernels are exported as
// `extern "C"` names `<op>_<suffix>` (e.g. `rms_norm_bf16`), which vt-hip looks up.
#define VT_FOR_EACH_DTYPE(X) \
  X(f32, float)              \
  X(f16, vt_f16)             \
  X(bf16, vt_bf16)

// ---------------------------------------------------------------------------------------
// Reductions over a wave and over a block, for any wave size.

__device__ __forceinline__ float vt_wave_sum(float v) {
  for (int o = warpSize / 2; o > 0; o >>= 1) v += __shfl_xor(v, o);
  return v;
}

// Sum over the block; every thread gets the same value (the per-wave partials are added
// in wave order by every thread, so the result is deterministic). `scratch` holds
// VT_MAX_WAVES floats. Must be reached by every thread of the block.
__device__ __forceinline__ float vt_block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % warpSize;
  const int wave = threadIdx.x / warpSize;
  const int waves = (blockDim.x + warpSize - 1) / warpSize;
  v = vt_wave_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[wave] = v;
  __syncthreads();
  float r = 0.0f;
  for (int w = 0; w < waves; ++w) r += scratch[w];
  return r;
}

// Grid-stride loop over `n` items, one block each.
#define VT_FOR_BLOCKS(i, n) for (i64 i = blockIdx.x; i < (n); i += gridDim.x)
// Grid-stride loop over `n` items, one thread each.
#define VT_FOR_THREADS(i, n) \
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// ---------------------------------------------------------------------------------------
// The ops' f32 math, one place for RmsNorm/FusedNormRope and RopeFromCache/FusedNormRope.

// RmsNorm's scale of one row `x[0..d)`: 1 / sqrt(mean(x^2) + eps). Block-wide.
template <typename T>
__device__ __forceinline__ float vt_rms_scale(const T* x, i64 d, float eps, float* scratch) {
  float ss = 0.0f;
  for (i64 i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = vt_load(x, i);
    ss += v * v;
  }
  ss = vt_block_sum(ss, scratch);
  return 1.0f / sqrtf(ss / (float)d + eps);
}

// One normalized element: `x * scale` rounded to the storage type, then times the weight.
template <typename T>
__device__ __forceinline__ float vt_rms_apply(float x, float scale, float w) {
  return vt_round<T>(x * scale) * w;
}

// Element indices of rotary pair `i` of an `r`-wide slice: neox pairs (i, i + r/2),
// GPT-J pairs (2i, 2i+1).
__device__ __forceinline__ void vt_rope_pair_index(i64 i, i64 r, bool neox, i64* i0, i64* i1) {
  if (neox) {
    *i0 = i;
    *i1 = i + r / 2;
  } else {
    *i0 = 2 * i;
    *i1 = 2 * i + 1;
  }
}

// Rotates one pair by (cos c, sin s).
__device__ __forceinline__ void vt_rope_rotate(float x0, float x1, float c, float s, float* y0, float* y1) {
  *y0 = x0 * c - x1 * s;
  *y1 = x1 * c + x0 * s;
}
