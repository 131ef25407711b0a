// Shared device helpers for every kernel file of kernels-cuda/.
//
// Conventions (see crates/vt-cuda/src/lib.rs):
// - Every tensor arrives as a pointer to its element [0, 0, ...] plus explicit element
//   strides as long long; the last dim has stride 1 wherever the op's contract says so.
// - Index values (slots, block ids, lengths, positions) are read on the device and are
//   never trusted: an out-of-range one skips its row, so no write leaves an output.
// - Arithmetic is f32; 16-bit values are widened on load and rounded once on store.
// - Each kernel is a template instantiated for bf16, f16 and f32 as extern "C" symbols
//   `{name}_bf16`, `{name}_f16`, `{name}_f32` with VT_FOR_EACH_FLOAT.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef long long i64;
typedef __nv_bfloat16 bf16;
typedef __half f16;

namespace vt {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(f16 x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ f16 from_f32<f16>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

// Rounds an f32 to T's precision and back (identity for f32).
template <typename T> __device__ __forceinline__ float round_to(float x) { return to_f32(from_f32<T>(x)); }

// Programmatic dependent launch (sm_90; crates/vt-cuda/src/launch.rs `Launch::dependent`).
// grid_dep_launch: this CTA no longer holds back the next kernel on the stream (it may start
// once every CTA of this grid has called it or exited). grid_dep_wait: waits until the
// previous kernel on the stream has completed and its writes are visible; a kernel launched
// dependent must call it, in every CTA, before it reads anything the previous kernels wrote
// or writes anything they read. Both are no-ops without the launch attribute and before sm_90.
__device__ __forceinline__ void grid_dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Sum over a warp; every lane gets the result. Fixed butterfly order: deterministic.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. Deterministic for a given blockDim.x. Ends with a barrier, so shared memory the
// block read before the call may be overwritten after it.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? partial[lane] : 0.0f;
    t = warp_sum(t);
    __syncthreads();  // `partial` may be reused by the next call
    return t;
}

}  // namespace vt

// Instantiates MACRO(suffix, type) for the three float dtypes.
#define VT_FOR_EACH_FLOAT(MACRO) MACRO(bf16, bf16) MACRO(f16, f16) MACRO(f32, float)
