// RMS normalization of one row and rotary embedding of one row, shared by rms_norm.cu,
// rope_from_cache.cu and fused_norm_rope.cu so that FusedNormRope is bit-identical to
// RmsNorm followed by RopeFromCache: same functions, same block size, same order, and
// explicitly rounded operations (__fmul_rn, ...) that the compiler may not contract.
#pragma once
#include "common.cuh"

namespace vt {

// Threads per row of RmsNorm and FusedNormRope. The reduction order depends on it, so both
// kernels must be launched with this block size.
constexpr int NORM_THREADS = 256;

// out[i] = round(round(x[i] * s) * w[i]) with s = 1 / sqrt(sum(x^2) / D + eps) (f32).
// Called by all NORM_THREADS threads of a block; `out` may equal `x` (each thread reads
// and writes only its own elements, and all reads of the sum precede the barrier).
// `out2` (optional): a second row that receives the same values (FusedNormRope's cache write).
template <typename T>
__device__ __forceinline__ void rms_norm_row(T* out, const T* x, const T* w, int d, float eps,
                                             T* out2 = nullptr) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        // The weights into L1 now, while the sum is reduced: the second pass then waits on no
        // DRAM round trip of its own (a decode step's norms run one row, weights not in L2).
        asm volatile("prefetch.global.L1 [%0];" ::"l"(w + i));
        const float v = to_f32(x[i]);
        ss = __fmaf_rn(v, v, ss);
    }
    ss = block_sum(ss);
    const float scale = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), eps)));
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float n = round_to<T>(__fmul_rn(to_f32(x[i]), scale));
        const T y = from_f32<T>(__fmul_rn(n, to_f32(w[i])));
        out[i] = y;
        if (out2 != nullptr) out2[i] = y;
    }
}

// Rotates pair `i` of an R-wide row: reads `in`, writes `out` (may be the same row).
// neox: elements (i, i + R/2); GPT-J: (2i, 2i + 1). `cs` is the position's cache row,
// [cos(R/2) | sin(R/2)]. `out2` (optional): a second row that receives the same values.
template <typename T>
__device__ __forceinline__ void rope_pair(T* out, const T* in, const float* cs, int r, int i, bool neox,
                                          T* out2 = nullptr) {
    const int half = r / 2;
    const int i0 = neox ? i : 2 * i;
    const int i1 = neox ? i + half : 2 * i + 1;
    const float c = cs[i], s = cs[half + i];
    const float x0 = to_f32(in[i0]), x1 = to_f32(in[i1]);
    const T y0 = from_f32<T>(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));
    const T y1 = from_f32<T>(__fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)));
    out[i0] = y0;
    out[i1] = y1;
    if (out2 != nullptr) {
        out2[i0] = y0;
        out2[i1] = y1;
    }
}

}  // namespace vt
