// MlaDecodeAttention over an fp8_ds_mla cache, the pieces the mma.sync kernels add for it
// (mma_sm80.cuh with FP8 = true): the loader of raw 656-byte rows into the ring, and the
// dequantization of a staged half tile into a 16-bit half-tile slot (code x its group's
// scale, rounded once to the query dtype). Part of mla_decode_attention.cu.
#pragma once

#include "fp8_ds_mla.cuh"
#include "mla_decode_attention/tiles.cuh"

namespace mla {

// fp8_ds_mla cache (FP8): the ring holds the raw 656-byte rows of HS half tiles (the loads
// in flight), and two 16-bit half-tile slots hold the current tile, dequantized.
constexpr int FP8_ROW = vt::fp8ds::ROW_BYTES;            // 656
constexpr int FP8_CHUNKS = FP8_ROW / 16;                 // 41 16-byte chunks per row
constexpr int FP8_HALF_BYTES = HALF * FP8_ROW;           // 20992: one staged half tile
// The fp8_ds_mla loader: HalfLoader's threads, tokens and row lookup (8 threads per token),
// copying a token's 656-byte row as 41 16-byte chunks into the staging slot (rows 656 bytes
// apart). Offsets are bytes (the cache's element is a byte).
struct Fp8HalfLoader : HalfLoader<unsigned char> {
    __device__ __forceinline__ Fp8HalfLoader(const Params& p, int i) : HalfLoader<unsigned char>(p, i) {}

    // All 256 threads call this (warp-collective ballot). Missing rows are zero-filled:
    // codes and scales 0 decode to 0.
    __device__ __forceinline__ void issue(uint32_t dst, unsigned char* valid, unsigned char* flags, int h,
                                          i64 off) const {
        const bool ok = off >= 0;
        const unsigned char* src = cache + (ok ? off : 0);
        const uint32_t d = dst + tok * FP8_ROW;
#pragma unroll
        for (int k = 0; k < (FP8_CHUNKS + 7) / 8; ++k) {
            const int c = sub + 8 * k;
            if (c < FP8_CHUNKS) cp_async16(d + c * 16, src + c * 16, ok);
        }
        publish(valid, flags, h, off);
    }
};

template <class A, class B> struct Same { static constexpr bool value = false; };
template <class A> struct Same<A, A> { static constexpr bool value = true; };
template <bool C, class X, class Y> struct Cond { using type = X; };
template <class X, class Y> struct Cond<false, X, Y> { using type = Y; };

// Two e4m3 codes (low byte first) as floats: exact.
__device__ __forceinline__ float2 e4m3x2_to_f2(uint32_t two) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint32_t h2;
    asm("{\n.reg .b16 t;\ncvt.u16.u32 t, %1;\ncvt.rn.f16x2.e4m3x2 %0, t;\n}\n" : "=r"(h2) : "r"(two));
    float lo, hi;
    asm("{\n.reg .b16 a, b;\nmov.b32 {a, b}, %2;\ncvt.f32.f16 %0, a;\ncvt.f32.f16 %1, b;\n}\n"
        : "=f"(lo), "=f"(hi)
        : "r"(h2));
    return make_float2(lo, hi);
#else
    return make_float2(vt::fp8ds::e4m3_to_f32(two & 0xff), vt::fp8ds::e4m3_to_f32((two >> 8) & 0xff));
#endif
}

// The four group scales of a staged raw row (at shared address row).
__device__ __forceinline__ void row_scales(uint32_t row, float (&sc)[vt::fp8ds::GROUPS]) {
    uint32_t w[4];
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "r"(row + vt::fp8ds::SCALE_OFFSET));
#pragma unroll
    for (int g = 0; g < vt::fp8ds::GROUPS; ++g) sc[g] = __uint_as_float(w[g]);
}

// Eight codes (lo, hi: low byte first) times their scale s, rounded once to T, as the four
// 32-bit words of one 16-byte chunk of a 16-bit tile row.
template <typename T>
__device__ __forceinline__ void codes8(uint32_t lo, uint32_t hi, float s, uint32_t (&out)[4]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const uint32_t two = ((q < 2 ? lo : hi) >> (16 * (q & 1))) & 0xffffu;
        const float2 v = e4m3x2_to_f2(two);
        out[q] = pack2<T>(__fmul_rn(v.x, s), __fmul_rn(v.y, s));
    }
}

// Four words of bf16 pairs (8 rope values, as the row stores them) converted in place to
// pairs of T (nothing to do for bf16).
template <typename T> __device__ __forceinline__ void bf16x8_as(uint32_t (&r)[4]) {
    if constexpr (!Same<T, bf16>::value) {
#pragma unroll
        for (int q = 0; q < 4; ++q) r[q] = pack2<T>(__uint_as_float(r[q] << 16), __uint_as_float(r[q] & 0xffff0000u));
    }
}

// Rope chunk c (8 bf16 values) of a staged raw row, as T.
template <typename T> __device__ __forceinline__ void rope8(uint32_t row, int c, uint32_t (&r)[4]) {
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row + vt::fp8ds::ROPE_OFFSET + 16 * c));
    bf16x8_as<T>(r);
}

__device__ __forceinline__ void st_shared_v4(uint32_t addr, const uint32_t (&v)[4]) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                 : "memory");
}

// Dequantizes one staged half tile (32 raw rows at stg) into the 16-bit half-tile slot dst
// (the layout HalfLoader writes): thread (tok, sub) writes chunk sub of every column block
// of token tok: 8 latent values (code x its group's scale, rounded once to T), or in the
// last block 8 rope values. All 256 threads call this.
template <typename T>
__device__ __forceinline__ void dequant_half(uint32_t stg, uint32_t dst, int i) {
    const int tok = i >> 3, sub = i & 7;
    const uint32_t row = stg + tok * FP8_ROW;
    float sc[vt::fp8ds::GROUPS];
    row_scales(row, sc);
#pragma unroll
    for (int k = 0; k < NSUB - 1; ++k) {
        uint32_t lo, hi;  // 8 codes: features 64 k + 8 sub ..
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(lo), "=r"(hi) : "r"(row + 64 * k + 8 * sub));
        uint32_t out[4];
        codes8<T>(lo, hi, sc[k >> 1], out);  // 128 values per scale: two column blocks
        st_shared_v4(dst + k * HSUB_BYTES + swz(tok, sub), out);
    }
    uint32_t r[4];
    rope8<T>(row, sub, r);
    st_shared_v4(dst + (NSUB - 1) * HSUB_BYTES + swz(tok, sub), r);
}

}  // namespace mla
