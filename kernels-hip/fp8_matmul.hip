// The block-scaled fp8 ops (vt_core::fp8_block), kernels-cuda/fp8_matmul.cu's HIP twin in
// its simple form: QuantizeFp8 a thread per (row, 128-group), bit for bit the host's
// quantize_row (IEEE division, compiled with -ffp-contract=off); MatmulBTFp8 and
// BatchedMatmulFp8 a thread per output element over any strides, each 128-wide K group
// summed in f32 and then scaled: out[g, m, n] = sum_kb s * sum_{k in kb} A(m, k) q(n, k) with
// s = b_scale[g, kb, n / 128] (* a_scale[g, m, kb] when the activations are e4m3 codes).
// Written to be right, not fast (compiled, never run on AMD hardware).
#include "common.h"
#include "fp8_ds_mla.h"

template <typename T>
__device__ void quantize_fp8(unsigned char* out, i64 o0, float* scale, i64 s0, i64 s1, const T* x, i64 x0, i64 m,
                             i64 k) {
  const i64 groups = (k + 127) / 128;
  VT_FOR_THREADS(p, m * groups) {
    const i64 row = p / groups, grp = p % groups;
    const i64 c0 = grp * 128, c1 = c0 + 128 < k ? c0 + 128 : k;
    float amax = 0.0f;
    for (i64 c = c0; c < c1; ++c) amax = fmaxf(amax, fabsf(vt::to_f32(x[row * x0 + c])));
    const float s = amax / 448.0f;
    for (i64 c = c0; c < c1; ++c)
      out[row * o0 + c] = s == 0.0f ? 0 : vt::fp8ds::f32_to_e4m3(vt::to_f32(x[row * x0 + c]) / s);
    scale[row * s0 + grp * s1] = s;
  }
}

template <typename T>
__device__ void fp8_matmul_generic(T* out, i64 o0, i64 o1, i64 o2, const void* a, i64 a0, i64 a1, i64 a2,
                                   const float* as, i64 as0, i64 as1, i64 as2, const unsigned char* b, i64 b0,
                                   i64 b1, i64 b2, const float* bs, i64 bs0, i64 bs1, i64 bs2, i64 g, i64 m,
                                   i64 n, i64 k) {
  VT_FOR_THREADS(e, g * m * n) {
    const i64 gi = e / (m * n), rem = e % (m * n), i = rem / n, j = rem % n;
    const unsigned char* pb = b + gi * b0 + j * b2;
    const float* ps = bs + gi * bs0 + (j / 128) * bs2;
    float acc = 0.0f;
    for (i64 kb = 0; kb * 128 < k; ++kb) {
      const i64 k1 = kb * 128 + 128 < k ? kb * 128 + 128 : k;
      float part = 0.0f, sc = ps[kb * bs1];
      if (as != nullptr) {
        const unsigned char* pa = (const unsigned char*)a + gi * a0 + i * a1;
        for (i64 kk = kb * 128; kk < k1; ++kk)
          part += vt::fp8ds::e4m3_to_f32(pa[kk * a2]) * vt::fp8ds::e4m3_to_f32(pb[kk * b1]);
        sc *= as[gi * as0 + i * as1 + kb * as2];
      } else {
        const T* pa = (const T*)a + gi * a0 + i * a1;
        for (i64 kk = kb * 128; kk < k1; ++kk) part += vt::to_f32(pa[kk * a2]) * vt::fp8ds::e4m3_to_f32(pb[kk * b1]);
      }
      acc += part * sc;
    }
    out[gi * o0 + i * o1 + j * o2] = vt::from_f32<T>(acc);
  }
}

#define VT_FP8(S, T)                                                                                          \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) quantize_fp8_##S(                                    \
      unsigned char* out, i64 o0, float* scale, i64 s0, i64 s1, const T* x, i64 x0, i64 m, i64 k) {           \
    quantize_fp8<T>(out, o0, scale, s0, s1, x, x0, m, k);                                                    \
  }                                                                                                           \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) fp8_matmul_generic_##S(                              \
      T* out, i64 o0, i64 o1, i64 o2, const void* a, i64 a0, i64 a1, i64 a2, const float* as, i64 as0,         \
      i64 as1, i64 as2, const unsigned char* b, i64 b0, i64 b1, i64 b2, const float* bs, i64 bs0, i64 bs1,     \
      i64 bs2, i64 g, i64 m, i64 n, i64 k) {                                                                 \
    fp8_matmul_generic<T>(out, o0, o1, o2, a, a0, a1, a2, as, as0, as1, as2, b, b0, b1, b2, bs, bs0, bs1, bs2,  \
                          g, m, n, k);                                                                       \
  }
VT_FOR_EACH_FLOAT(VT_FP8)
