// RmsNorm: out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w. One block of
// vt::NORM_THREADS threads per row (grid-stride over rows).
#include "norm_rope.cuh"

template <typename T>
__device__ void rms_norm(T* out, i64 out_rs, const T* x, i64 x_rs, const T* w, i64 rows, int d, float eps) {
    // A dependent GEMM after this (VT_PDL) may start prefetching its weights now.
    vt::grid_dep_launch();
    for (i64 t = blockIdx.x; t < rows; t += gridDim.x) {
        vt::rms_norm_row<T>(out + t * out_rs, x + t * x_rs, w, d, eps);
    }
}

#define VT_RMS_NORM(S, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(vt::NORM_THREADS)                               \
        rms_norm_##S(T* out, i64 out_rs, const T* x, i64 x_rs, const T* w, i64 rows, int d,      \
                     float eps) {                                                                \
        rms_norm<T>(out, out_rs, x, x_rs, w, rows, d, eps);                                      \
    }
VT_FOR_EACH_FLOAT(VT_RMS_NORM)
