// The matmuls' fallback for views cuBLAS cannot express (neither of a matrix's last two
// strides is 1, a broadcast row stride, K = 0): out[g, i, j] = sum_k a[g, i, k] b[g, k, j]
// with f32 accumulation, one thread per output element (grid-stride). MatmulBT passes b
// transposed (its strides swapped).
#include "common.cuh"

template <typename T>
__device__ void batched_matmul(T* out, i64 o0, i64 o1, i64 o2, const T* a, i64 a0, i64 a1, i64 a2, const T* b, i64 b0,
                               i64 b1, i64 b2, i64 g, i64 m, i64 n, i64 k) {
    const i64 total = g * m * n;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        const i64 gi = e / (m * n), rem = e % (m * n), i = rem / n, j = rem % n;
        const T* pa = a + gi * a0 + i * a1;
        const T* pb = b + gi * b0 + j * b2;
        float acc = 0.0f;
        for (i64 kk = 0; kk < k; ++kk) acc = fmaf(vt::to_f32(pa[kk * a2]), vt::to_f32(pb[kk * b1]), acc);
        out[gi * o0 + i * o1 + j * o2] = vt::from_f32<T>(acc);
    }
}

#define VT_BMM(S, T)                                                                                       \
    extern "C" __global__ void batched_matmul_##S(T* out, i64 o0, i64 o1, i64 o2, const T* a, i64 a0,      \
                                                  i64 a1, i64 a2, const T* b, i64 b0, i64 b1, i64 b2,      \
                                                  i64 g, i64 m, i64 n, i64 k) {                            \
        batched_matmul<T>(out, o0, o1, o2, a, a0, a1, a2, b, b0, b1, b2, g, m, n, k);                      \
    }
VT_FOR_EACH_FLOAT(VT_BMM)
