// The fp8_ds_mla latent-cache row (vt_core::fp8_ds_mla, the contract's byte layout): 656
// bytes per token = 512 e4m3fn latent codes | 4 f32 scales (one per 128 values) | 64 bf16
// rope values. value = e4m3(code) * scale. kernels-cuda/fp8_ds_mla.cuh's HIP twin.
//
// These helpers reproduce the host's encode_row / decode_row bit for bit: the scale is
// amax / 448 (an IEEE division: HIP's f32 `/` is correctly rounded unless fast-math is on,
// and the files are compiled with -ffp-contract=off), a code is e4m3(v / scale) rounded to
// nearest even with saturation to +-448 (scale 0: code 0), a decoded value is the f32
// product e4m3 * scale. Bytes are read and written one at a time (a row view may start at
// any byte), so nothing here assumes alignment; written to be right, not fast.
#pragma once

#include "common.h"

namespace vt {
namespace fp8ds {

constexpr int LATENT = 512;
constexpr int ROPE = 64;
constexpr int GROUP = 128;
constexpr int GROUPS = LATENT / GROUP;
constexpr int SCALE_OFFSET = LATENT;
constexpr int ROPE_OFFSET = SCALE_OFFSET + 4 * GROUPS;
constexpr int ROW_BYTES = ROPE_OFFSET + 2 * ROPE;  // 656
constexpr int DECODED = LATENT + ROPE;             // 576

// One e4m3fn byte as f32 (exact: every code is an f32). 0x7f / 0xff are NaN.
__device__ __forceinline__ float e4m3_to_f32(unsigned char b) {
  const unsigned sign = (unsigned)(b & 0x80) << 24;
  const unsigned e = (b >> 3) & 0xf, m = b & 7;
  if (e == 0xf && m == 7) return __uint_as_float(0x7fc00000u | sign);
  if (e == 0) return __uint_as_float(sign | __float_as_uint((float)m * 0.001953125f));  // m * 2^-9
  return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));  // 2^(e-7) * (1 + m/8)
}

// Round half to even of a non-negative f32 below 2^23 (where adding and subtracting 2^23
// rounds to an integer in the current, round-to-nearest-even, mode): rintf without libm,
// which hiprtc lacks.
__device__ __forceinline__ float rint_nonneg(float a) {
  const float two23 = 8388608.0f;
  const float r = (a + two23) - two23;  // two separate roundings under -ffp-contract=off
  return r;
}

// f32 to e4m3fn, round to nearest even, saturating to +-448; NaN gives 0x7f.
__device__ __forceinline__ unsigned char f32_to_e4m3(float v) {
  if (v != v) return 0x7f;
  const unsigned char sign = (unsigned char)((__float_as_uint(v) >> 24) & 0x80);
  const float a = fminf(fabsf(v), 448.0f);
  if (a < 0.015625f) {
    // Subnormal range (below 2^-6): codes are multiples of 2^-9; q = 8 is 2^-6 = code 8.
    return (unsigned char)(sign | (unsigned char)rint_nonneg(a * 512.0f));
  }
  int e = (int)((__float_as_uint(a) >> 23) & 0xff) - 127;  // a is a normal f32 here
  // a * 2^(3 - e) in [8, 16): exact (a power-of-two scaling), then rounded half to even.
  float q = rint_nonneg(a * __uint_as_float((unsigned)(127 + 3 - e) << 23));
  if (q == 16.0f) {
    q = 8.0f;
    ++e;
  }
  return (unsigned char)(sign | (unsigned char)(((e + 7) << 3) | ((int)q - 8)));
}

__device__ __forceinline__ float load_f32(const unsigned char* p) {
  const unsigned u = (unsigned)p[0] | ((unsigned)p[1] << 8) | ((unsigned)p[2] << 16) | ((unsigned)p[3] << 24);
  return __uint_as_float(u);
}

__device__ __forceinline__ void store_f32(unsigned char* p, float v) {
  const unsigned u = __float_as_uint(v);
  p[0] = (unsigned char)(u & 0xff);
  p[1] = (unsigned char)((u >> 8) & 0xff);
  p[2] = (unsigned char)((u >> 16) & 0xff);
  p[3] = (unsigned char)(u >> 24);
}

__device__ __forceinline__ float scale_of(const unsigned char* row, int g) {
  return load_f32(row + SCALE_OFFSET + 4 * g);
}

// Decoded value i (< 576) of a row: latent i < 512 dequantized, else rope i - 512.
__device__ __forceinline__ float value(const unsigned char* row, i64 i) {
  if (i < LATENT) return e4m3_to_f32(row[i]) * scale_of(row, (int)(i / GROUP));
  const unsigned char* r = row + ROPE_OFFSET + 2 * (i - LATENT);
  return __uint_as_float(((unsigned)r[0] | ((unsigned)r[1] << 8)) << 16);  // bf16 -> f32
}

// A row as the attention core reads keys and values: `row[i]` is decoded value i.
struct row_ref {
  const unsigned char* p;
  __device__ __forceinline__ float operator[](i64 i) const { return value(p, i); }
};

}  // namespace fp8ds
}  // namespace vt
