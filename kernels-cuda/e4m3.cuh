// e4m3 (float8 e4m3fn) codes in registers: the exact conversion the fp8 kernels share
// (fp8_matmul.cu's weight-only Gemv, skinny_gemm.cu's fp8 weight form, the 64-row decode
// kernel over an fp8_ds_mla cache in mla_decode_attention/wgmma_fp8_sm90.cuh). Integer ops
// and one fma instead of cvt: the f32 -> 16-bit conversions run at a quarter of the integer
// rate on Hopper.
#pragma once

#include "common.cuh"

namespace vt {

// Two codes (bytes 0, 1 of `w`, or 2, 3 with `hi`) as a packed pair of T holding value x
// 2^-(T's exponent bias - 7): the code's sign, exponent and mantissa bits placed in T's
// fields (the exponent in the low four bits of T's). Exact for every code, subnormal codes
// included (they land on T's subnormals or small normals at the same scale); NaN codes
// (0x7f, 0xff) come out finite (+-480 once scaled).
template <typename T> __device__ __forceinline__ unsigned e4m3x2_bits(unsigned w, bool hi);
// How: one prmt puts each code in the low byte of its 16-bit half with the code's sign
// replicated over the high byte (selector nibbles 8-15: "copy the sign"), so that one shift
// lands the sign on bit 15 and the exponent and mantissa bits on T's fields, and one mask
// clears the rest (prmt, shift, and: three integer ops a pair; the earlier form spent four).
__device__ __forceinline__ unsigned e4m3x2_sext(unsigned w, bool hi) {
    unsigned x;
    asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(x) : "r"(w), "r"(hi ? 0xb3a2u : 0x9180u));
    return x;
}
template <> __device__ __forceinline__ unsigned e4m3x2_bits<bf16>(unsigned w, bool hi) {
    return (e4m3x2_sext(w, hi) << 4) & 0x87f087f0u;  // s at 15, eeee mmm at 10..4
}
template <> __device__ __forceinline__ unsigned e4m3x2_bits<f16>(unsigned w, bool hi) {
    return (e4m3x2_sext(w, hi) << 7) & 0xbf80bf80u;  // s at 15, eeee mmm at 13..7
}
// a x b + c on bf16 pairs, rounded once.
__device__ __forceinline__ unsigned bf16x2_fma(unsigned a, unsigned b, unsigned c) {
    unsigned r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// Two codes as a packed pair of T, exactly: e4m3x2_bits times 2^(bias - 7) (bf16 2^120, f16
// 2^8), plus -0 (the fma keeps subnormals and the sign of zero).
template <typename T> __device__ __forceinline__ unsigned e4m3x2(unsigned w, bool hi);
template <> __device__ __forceinline__ unsigned e4m3x2<bf16>(unsigned w, bool hi) {
    return bf16x2_fma(e4m3x2_bits<bf16>(w, hi), 0x7b807b80u, 0x80008000u);
}
template <> __device__ __forceinline__ unsigned e4m3x2<f16>(unsigned w, bool hi) {
    unsigned r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n"
        : "=r"(r)
        : "r"(e4m3x2_bits<f16>(w, hi)), "r"(0x5c005c00u), "r"(0x80008000u));
    return r;
}

// Word i (0..3) of a 16-byte load.
__device__ __forceinline__ unsigned word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
// The other way: two f32 as an e4m3 pair (x0 in the low byte), the hardware's round to
// nearest even, saturating to +-448 (sm_89+; a NaN keeps its sign: 0x7f or 0xff).
__device__ __forceinline__ unsigned e4m3x2_of(float x0, float x1) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(x1), "f"(x0));
    return r;
}
#endif

}  // namespace vt
