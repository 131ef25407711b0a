// RmsNorm: out[t,:] = round(x[t,:] * scale) * weight, scale = 1/sqrt(mean(x[t,:]^2) + eps).
// One block per row (grid-stride), VT_BLOCK threads. `out` may be `x` (in place): each
// thread writes only elements it read itself, after the block-wide sum.
#include "common.h"

template <typename T>
__device__ void rms_norm(T* out, i64 out_row_stride, const T* x, i64 x_row_stride, const T* weight, i64 rows,
                         i64 d, float eps) {
  __shared__ float scratch[VT_MAX_WAVES];
  VT_FOR_BLOCKS(t, rows) {
    const T* xr = x + t * x_row_stride;
    T* orow = out + t * out_row_stride;
    const float scale = vt_rms_scale(xr, d, eps, scratch);
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) {
      vt_store(orow, i, vt_rms_apply<T>(vt_load(xr, i), scale, vt_load(weight, i)));
    }
  }
}

#define VT_RMS_NORM(NAME, T)                                                                            \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK)                                                \
      rms_norm_##NAME(T* out, i64 out_row_stride, const T* x, i64 x_row_stride, const T* weight, i64 rows, \
                      i64 d, float eps) {                                                               \
    rms_norm<T>(out, out_row_stride, x, x_row_stride, weight, rows, d, eps);                            \
  }
VT_FOR_EACH_DTYPE(VT_RMS_NORM)
