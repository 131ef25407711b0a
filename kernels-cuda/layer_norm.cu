// LayerNorm: out[t, :] = (x[t, :] - mean) / sqrt(var + eps) * w + b, two passes in f32,
// rounded once. One block of LN_THREADS threads per row (grid-stride over rows); the row
// is read twice (mean, then the centered sum of squares) and a third time for the output,
// all from L1/L2 for DeepSeek-V3.2's 128-wide rows. `out` may be `x` (in place): every
// read of a thread's elements precedes its writes, and block_sum's barriers order the
// other threads' reads before them.
#include "common.cuh"

template <typename T>
__device__ void layer_norm(T* out, i64 out_rs, const T* x, i64 x_rs, const T* w, const T* b, i64 rows, int d,
                           float eps) {
    for (i64 t = blockIdx.x; t < rows; t += gridDim.x) {
        const T* xr = x + t * x_rs;
        T* orow = out + t * out_rs;
        float s = 0.0f;
        for (int i = threadIdx.x; i < d; i += blockDim.x) s += vt::to_f32(xr[i]);
        const float mean = vt::block_sum(s) / (float)d;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            const float c = vt::to_f32(xr[i]) - mean;
            ss = fmaf(c, c, ss);
        }
        const float rstd = rsqrtf(vt::block_sum(ss) / (float)d + eps);
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            const float c = (vt::to_f32(xr[i]) - mean) * rstd;
            orow[i] = vt::from_f32<T>(fmaf(c, vt::to_f32(w[i]), vt::to_f32(b[i])));
        }
    }
}

#define VT_LAYER_NORM(S, T)                                                                                 \
    extern "C" __global__ void __launch_bounds__(128)                                                       \
        layer_norm_##S(T* out, i64 out_rs, const T* x, i64 x_rs, const T* w, const T* b, i64 rows, int d,   \
                       float eps) {                                                                         \
        layer_norm<T>(out, out_rs, x, x_rs, w, b, rows, d, eps);                                            \
    }
VT_FOR_EACH_FLOAT(VT_LAYER_NORM)
