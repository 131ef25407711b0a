// LayerNorm: out[t, :] = (x[t, :] - mean) / sqrt(var + eps) * w + b, two passes in f32,
// rounded once. One block of VT_BLOCK threads per row (grid-stride over rows). `out` may
// be `x` (in place): each thread writes only its own elements, after the block_sum
// barriers that follow every read of the row. The HIP twin of kernels-cuda/layer_norm.cu.
#include "common.h"

template <typename T>
__device__ void layer_norm(T* out, i64 out_rs, const T* x, i64 x_rs, const T* w, const T* b, i64 rows, i64 d,
                           float eps) {
  VT_FOR_BLOCKS(t, rows) {
    const T* xr = x + t * x_rs;
    T* orow = out + t * out_rs;
    float s = 0.0f;
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) s += vt::to_f32(xr[i]);
    const float mean = vt::block_sum(s) / (float)d;
    float ss = 0.0f;
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) {
      const float c = vt::to_f32(xr[i]) - mean;
      ss += c * c;
    }
    const float rstd = 1.0f / sqrtf(vt::block_sum(ss) / (float)d + eps);
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) {
      const float c = (vt::to_f32(xr[i]) - mean) * rstd;
      orow[i] = vt::from_f32<T>(c * vt::to_f32(w[i]) + vt::to_f32(b[i]));
    }
  }
}

#define VT_LAYER_NORM(S, T)                                                                                 \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK)                                                    \
      layer_norm_##S(T* out, i64 out_rs, const T* x, i64 x_rs, const T* w, const T* b, i64 rows, i64 d,     \
                     float eps) {                                                                           \
    layer_norm<T>(out, out_rs, x, x_rs, w, b, rows, d, eps);                                                \
  }
VT_FOR_EACH_FLOAT(VT_LAYER_NORM)
