// Shared device helpers for every kernel file of kernels-hip/. The names and conventions
// are those of kernels-cuda/common.cuh, so a HIP kernel reads like its CUDA counterpart;
// the differences are the ones the hardware and ROCm impose:
//
// - Wavefronts are 64 lanes on CDNA (gfx9) and 32 on RDNA: reductions loop from
//   `warpSize / 2` and per-wave scratch has room for 1024 / 32 waves. Nothing assumes 32.
// - ROCm 5.2 has no hip_bf16.h: bf16 is a raw 16-bit pattern with its own conversions.
// - ROCm 5.2's `__fmul_rn`-style intrinsics are not all correctly rounded (`__frcp_rn` and
//   `__fsqrt_rn` map to the fast approximations), so the HIP kernels use plain operators
//   and are compiled with -ffp-contract=off: every multiply and add rounds on its own, as
//   on the CPU reference, and FusedNormRope stays bit-identical to RmsNorm + RopeFromCache.
//
// Conventions (see crates/vt-hip/src/launch.rs):
// - Every tensor arrives as a pointer to its element [0, 0, ...] plus explicit element
//   strides as long long; the last dim has stride 1 wherever the op's contract says so.
// - Index values (slots, block ids, lengths, positions) are read on the device and never
//   trusted: an out-of-range one skips its row, so no write leaves an output.
// - Arithmetic is f32; 16-bit values are widened on load and rounded once on store.
// - Each kernel is a template instantiated for bf16, f16 and f32 as extern "C" symbols
//   `{name}_bf16`, `{name}_f16`, `{name}_f32` with VT_FOR_EACH_FLOAT.
//
// Compiled by hiprtc at run time (vt-hip passes -DVT_HIPRTC=1 and serves the headers from
// memory) and by hipcc in `cargo xtask kernels`.
#pragma once

#ifndef VT_HIPRTC
#include <hip/hip_runtime.h>
#endif

typedef long long i64;

// bf16 storage: the upper half of an f32.
struct bf16 {
  unsigned short bits;
};
// f16 storage: clang's native half type (hardware conversions, round to nearest even).
typedef _Float16 f16;

// Threads per block of every kernel: a multiple of both wave sizes.
#define VT_BLOCK 256
// Upper bound on the waves of any block (1024 threads / 32 lanes).
#define VT_MAX_WAVES 32

namespace vt {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(f16 x) { return (float)x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float(((unsigned)x.bits) << 16); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ f16 from_f32<f16>(float x) {
  return (f16)x;
}
// Round to nearest, ties to even; a NaN keeps its sign and payload and is made quiet (what
// Rust's `half` does).
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  unsigned u = __float_as_uint(x);
  bf16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.bits = (unsigned short)((u >> 16) | 0x40u);
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    r.bits = (unsigned short)(u >> 16);
  }
  return r;
}

// Rounds an f32 to T's precision and back (identity for f32).
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_f32(from_f32<T>(x));
}

// -inf by its bit pattern (hiprtc has no math.h, hence no INFINITY).
__device__ __forceinline__ float neg_inf() { return __uint_as_float(0xff800000u); }
__device__ __forceinline__ bool is_inf(float x) { return x == neg_inf() || x == -neg_inf(); }

// Sum over a wave of any size; every lane gets the result. Fixed butterfly order.
__device__ __forceinline__ float wave_sum(float v) {
  for (int o = warpSize / 2; o > 0; o >>= 1) v += __shfl_xor(v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of warpSize, at most 1024); every thread gets
// the result, adding the per-wave partials in wave order, so it is deterministic for a
// given blockDim.x and wave size. Starts and ends with a barrier: shared memory the block
// read before the call may be overwritten after it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[VT_MAX_WAVES];
  const int lane = threadIdx.x % warpSize, wave = threadIdx.x / warpSize;
  const int waves = (blockDim.x + warpSize - 1) / warpSize;
  v = wave_sum(v);
  __syncthreads();
  if (lane == 0) partial[wave] = v;
  __syncthreads();
  float t = 0.0f;
  for (int w = 0; w < waves; ++w) t += partial[w];
  __syncthreads();  // `partial` may be reused by the next call
  return t;
}

}  // namespace vt

// Grid-stride loop over `n` items, one block each.
#define VT_FOR_BLOCKS(i, n) for (i64 i = blockIdx.x; i < (n); i += gridDim.x)
// Grid-stride loop over `n` items, one thread each.
#define VT_FOR_THREADS(i, n) \
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// Instantiates MACRO(suffix, type) for the three float dtypes.
#define VT_FOR_EACH_FLOAT(MACRO) MACRO(bf16, bf16) MACRO(f16, f16) MACRO(f32, float)
