// MlaDecodeAttention, the narrow wgmma kernel over an fp8_ds_mla cache (sm_90a only):
// mla_decode_wgmma_n{16,32}_fp8_{bf16,f16} for at most 16 / 32 query rows per sequence.
// Planned by crates/vt-cuda/src/mla_decode_attention/wgmma_sm90.rs (`narrow`). Part of
// mla_decode_attention.cu.
//
// The products of the 16-bit narrow kernel (wgmma_narrow_sm90.cuh), S^T = K Q^T and
// O^T += V^T P^T, with the A operand (the cache tile) in REGISTERS, read by each thread
// straight from the raw 656-byte rows, so nothing 16-bit is ever staged and the raw rows need
// only one shared-memory ring (4 tiles deep at 16 rows, 3 at 32: 168 / 126 KB). S^T's latent
// part is an fp8 product: the codes as loaded are A, each query row split into two e4m3 parts
// is B (nf8_load_q); O^T converts its codes to 16-bit patterns.
// 384 threads, three roles (setmaxnreg moves registers to the compute warpgroups: a block of
// 288 threads is given registers as one of 384, 168 a thread, and O^T alone is 128 at 32 rows):
// - Warp 8 of warpgroup 2 (producer; warps 9-11 only give up their registers): per tile, one
//   cp.async.bulk of 656 bytes per existing token row into the ring slot, completing on the
//   slot's FULL mbarrier (32 arrivals with expect_tx); it waits on the slot's EMPTY mbarrier
//   (the 256 consumer threads arrive) first. It walks the same segments as the consumers and
//   runs ahead across segment boundaries.
// - Warpgroup 0: Q per segment (hi / lo e4m3 parts and the rope, permuted, below), per tile
//   S^T (32 wgmma m64nMTk32 e4m3 and 4 m64nMTk16 for the rope, A from registers), the
//   online softmax (narrow_p) and P^T (bf16: four, one per scale group) into one of two buffers.
// - Warpgroup 1: O^T for all 512 features (8 m-blocks of 64), per tile 32 wgmma with A = V^T
//   from registers, B = P^T; the epilogue from registers (no staging).
// Hand-overs: P_FULL[u & 1] (named; WG0 arrives, WG1 syncs), P_FREE[u & 1] (an mbarrier of
// WG1's 128 threads, arrived after the products of tile u; WG0 waits before writing P^T(u + 2)),
// FIN[k & 1] (named; WG0 arrives with segment k's row sums and maxima in s_fin[k & 1], WG1
// syncs). WG1 arrives P_FREE for a segment's last tile only after it read s_fin, so WG0 never
// runs two segments ahead of it. Where the arriving side's READS must precede the waiting
// side's writes (P_FREE, EMPTY), every thread arrives on an mbarrier: racecheck does not take
// a named barrier's arrive, nor one lane's arrive after __syncwarp, as ordering them.
//
// Fragments (wgmma's A layout: warp w of the warpgroup holds rows 16 w + g, + 8 and k pairs
// 2 qd, 2 qd + 8 of each 16-deep k step; for e4m3, k quadruples 4 qd, 4 qd + 16 of each
// 32-deep step). A k permutation applied to both operands leaves a product unchanged, so:
// - S^T: rows are the tile's tokens in order; k is permuted so that a thread reads 32
//   contiguous code bytes per token and 128-feature group: physical feature 128 G + 32 qd +
//   8 k' + j (j < 8) is e4m3 k step 4 G + k', in-step index 4 qd + j (j < 4) or 12 + 4 qd + j
//   (nf8_qbyte); rope feature 512 + 16 qd + 4 k + j is 16-bit k step k of the rope, in-step
//   index 2 qd + (j & 1) + 8 (j >> 1) (nf8_rope_pos). Q is written in that order.
// - O^T: k (tokens) is in order, so P^T has the 16-bit kernel's layout; rows (features) are
//   permuted so that every m-block lies in one 128-feature scale group: m-block 2 G + h, row
//   16 w + g + 8 e is feature 128 G + 32 w + 4 g + 2 h + e (a thread reads 4 code bytes per
//   token and group). A register packs one feature of two tokens (prmt).
// Row offsets are 656 = 16 (mod 128) bytes apart, so both read patterns are free of bank
// conflicts. S^T is summed per scale group and scaled in f32 (both query dtypes). In O^T bf16
// queries take the scales out of the product (Nf8Fold, below: exact code patterns as
// operands, P V against P x scale per group); f16 queries dequantize every value of V (code
// x scale rounded once, in f32). Tokens that
// do not exist get scale 0 (their V reads 0 whatever the slot holds) and are masked in S, so
// the ring is never zero-filled. Measured and explained in docs/perf.md ("The narrow fp8
// kernel with register operands", "Thirteenth session").
#pragma once

#include "mla_decode_attention/wgmma_fp8_sm90.cuh"
#include "mla_decode_attention/wgmma_narrow_sm90.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Lab builds for docs/perf.md (wrong results; a copy of this file with NF8_LAB defined, through
// VT_CUDA_KERNELS_DIR): 1 the producer copies nothing, 2 no products (S = 0, no P V), 3 and 5
// no dequantization in O^T (the raw words as fragments; S^T has none since its fp8 form, 4 was
// S^T's before it), 6 no O^T products, 7 no S^T products.
#ifndef NF8_LAB
#define NF8_LAB 0
#endif
namespace mla {

constexpr int NF8_THREADS = 384;  // two compute warpgroups and the producer's
constexpr int NF8_PRODUCER = 8;   // the producer's warp index
// Registers per thread after setmaxnreg, warpgroups 0, 1, 2 (moved, never added: the sum is
// at most 3 x 168).
constexpr int NF8_REGS[3] = {200, 232, 72};
static_assert(NF8_REGS[0] + NF8_REGS[1] + NF8_REGS[2] <= 3 * 168, "setmaxnreg moves, never adds, registers");
// Named barriers (0: __syncthreads; BAR_WG0 = 7 inside narrow_p / narrow_row_sums).
constexpr int NF8_P_FULL = 1, NF8_FIN = 5;

// Shared-memory layout (byte offsets from a 1024-aligned base): Q (permuted k), the ring of
// raw tiles, two P buffers (each four P'_G^T for bf16, one P^T for f16), the reductions, token
// flags per slot, schedule, mbarriers.
template <int MT> struct NarrowFp8Layout {
    static constexpr int RAWS = MT == 16 ? 4 : 3;  // what fits beside Q and the P buffers
    static constexpr int RAW_BYTES = BN * FP8_ROW;              // 41984 = 41 x 1024
    static constexpr int Q_SUB = MT * 128;
    static constexpr int OFF_Q = 0;
    static constexpr int OFF_RAW = NSUB * Q_SUB;
    static constexpr int P_BYTES = 4 * Q_SUB;                   // one P buffer: P'_G^T [4][MT x 64] 16-bit
    static constexpr int OFF_P = OFF_RAW + RAWS * RAW_BYTES;     // 1024-aligned: [2] P buffers
    // floats: tile maxima [2][4][MT], rescale factors [2][MT], row sums and maxima [2][2][MT],
    // per-warp row sums [4][MT], Q's row maxima (u32) [MT] and powers of two 2^-e [MT].
    static constexpr int OFF_RED = OFF_P + 2 * P_BYTES;
    static constexpr int OFF_VALID = OFF_RED + 20 * MT * 4;     // u8 [RAWS][BN]: token row exists
    static constexpr int OFF_FLAGS = OFF_VALID + RAWS * BN;     // u8 [RAWS][8]: bad block ids seen
    static constexpr int OFF_SCHED = OFF_FLAGS + RAWS * 8;      // int [40]
    static constexpr int OFF_MBAR = OFF_SCHED + 40 * 4;         // u64 FULL [RAWS], EMPTY [RAWS], P_FREE [2]
    static constexpr int END = OFF_MBAR + (2 * RAWS + 2) * 8;
    static constexpr int SMEM = END + 1024;                     // slack to align the base
    static_assert(OFF_RAW % 1024 == 0 && OFF_P % 1024 == 0 && OFF_FLAGS % 8 == 0 && OFF_MBAR % 8 == 0, "alignment");
};

// wgmma m64n16 / m64n32 with A from four registers and B (K-major) in shared memory: SHAPE is
// the instruction's shape and types, TAIL its immediates after scale-d (16-bit types: scale a,
// scale b, transpose b; e4m3: no transpose).
#define VT_WGMMA_RS_N16(NAME, SHAPE, TAIL)                                                                \
    __device__ __forceinline__ void NAME(float (&d)[8], const uint32_t (&a)[4], uint64_t db, int scale_d) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"                                       \
                     "wgmma.mma_async.sync.aligned." SHAPE " "                                            \
                     "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, " TAIL ";\n}\n"       \
                     : VT_ACC8(0)                                                                         \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));                 \
    }
#define VT_WGMMA_RS_N32(NAME, SHAPE, TAIL)                                                                 \
    __device__ __forceinline__ void NAME(float (&d)[16], const uint32_t (&a)[4], uint64_t db, int scale_d) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                        \
                     "wgmma.mma_async.sync.aligned." SHAPE " "                                             \
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "           \
                     "{%16, %17, %18, %19}, %20, p, " TAIL ";\n}\n"                                      \
                     : VT_ACC8(0), VT_ACC8(8)                                                              \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));                  \
    }
VT_WGMMA_RS_N16(wgmma_rs_m64n16k16_bf16, "m64n16k16.f32.bf16.bf16", "1, 1, 0")
VT_WGMMA_RS_N16(wgmma_rs_m64n16k16_f16, "m64n16k16.f32.f16.f16", "1, 1, 0")
VT_WGMMA_RS_N32(wgmma_rs_m64n32k16_bf16, "m64n32k16.f32.bf16.bf16", "1, 1, 0")
VT_WGMMA_RS_N32(wgmma_rs_m64n32k16_f16, "m64n32k16.f32.f16.f16", "1, 1, 0")
// S^T's latent part (below): e4m3 x e4m3, 32-deep k steps, 4 codes a register.
VT_WGMMA_RS_N16(wgmma_rs_e4m3, "m64n16k32.f32.e4m3.e4m3", "1, 1")
VT_WGMMA_RS_N32(wgmma_rs_e4m3, "m64n32k32.f32.e4m3.e4m3", "1, 1")

template <typename T> struct WgRs;
template <> struct WgRs<bf16> {
    static __device__ __forceinline__ void mma(float (&d)[8], const uint32_t (&a)[4], uint64_t b, int sc) { wgmma_rs_m64n16k16_bf16(d, a, b, sc); }
    static __device__ __forceinline__ void mma(float (&d)[16], const uint32_t (&a)[4], uint64_t b, int sc) { wgmma_rs_m64n32k16_bf16(d, a, b, sc); }
};
template <> struct WgRs<f16> {
    static __device__ __forceinline__ void mma(float (&d)[8], const uint32_t (&a)[4], uint64_t b, int sc) { wgmma_rs_m64n16k16_f16(d, a, b, sc); }
    static __device__ __forceinline__ void mma(float (&d)[16], const uint32_t (&a)[4], uint64_t b, int sc) { wgmma_rs_m64n32k16_f16(d, a, b, sc); }
};

// f16 queries (no fold, below): codes (bytes 0, 1 of w, or 2, 3 with `high`) times their
// scales s0 (low half) and s1, each product rounded once to f16. The codes convert exactly by
// integer ops (NaN codes, in unowned rows, come out finite: x 0 is 0).
__device__ __forceinline__ uint32_t dq2_f16(uint32_t w, bool high, float s0, float s1) {
    const uint32_t h = vt::e4m3x2<f16>(w, high);
    const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&h));
    return pack2<f16>(__fmul_rn(v.x, s0), __fmul_rn(v.y, s1));
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
// A pair of rope values (bf16, as the row stores them) as a pair of T.
template <typename T> __device__ __forceinline__ uint32_t rope2(uint32_t w) {
    if constexpr (Same<T, bf16>::value) {
        return w;
    } else {
        return pack2<T>(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    }
}

// S^T's latent part runs on fp8 wgmma (m64nMTk32 e4m3): A is the tile's codes AS LOADED
// (no conversion at all), B is each query row in two e4m3 parts, hi = e4m3(q x 2^e) and lo =
// e4m3(q x 2^e - hi), each k step issued against hi, then lo, into the same accumulators (the
// A registers read twice), so S = (S_hi + S_lo) x 2^-e is q . code with q carried EXACTLY
// for bf16 values within 2^-9 of the row's largest (8 significant bits = hi's 4 + lo's 4),
// to 2^-10 x 2^-e absolute below; f16 values to 2^-8 relative: a row's power of two e puts its
// largest latent value in [128, 256) (host check: mla_decode_fp8.rs, query_split_*).
// The rope part (bf16 in the row) runs on 16-bit wgmma with the row's values as A.
// Byte x of k step 4 G + k' (x < 32) of the latent part: physical feature 128 G + 32 qd + 8 k'
// + j with x = 4 qd + j for j < 4, 16 + 4 qd + j - 4 else, so that each thread's A fragments of
// a 128-feature group are 32 contiguous code bytes of each of its two tokens.
__device__ __forceinline__ int nf8_qbyte(int local) {  // local: feature within its group, 4-aligned
    const int qd = local >> 5, kp = (local >> 3) & 3, j = local & 7;
    return 32 * kp + (j < 4 ? 4 * qd + j : 12 + 4 * qd + j);
}
// Rope feature 512 + i: 16-bit k step (i & 15) >> 2 of the rope's block, in-step index
// 2 (i >> 4) + (j & 1) + 8 (j >> 1), j = i & 3.
__device__ __forceinline__ int nf8_rope_pos(int i) {
    const int j = i & 3;
    return 16 * ((i & 15) >> 2) + 2 * (i >> 4) + (j & 1) + 8 * (j >> 1);
}
// The row's power of two: 2^e x amax in [128, 256) (e clamped to +-120; zero, inf and NaN rows
// take e = 0, so NaN stays NaN).
__device__ __forceinline__ int nf8_qexp(uint32_t amax_bits) {
    if (amax_bits == 0u || amax_bits >= 0x7f800000u) return 0;
    const int e = 7 - ((int)((amax_bits >> 23) & 0xff) - 127);
    return e < -120 ? -120 : (e > 120 ? 120 : e);
}
using vt::e4m3x2_of;  // (e4m3.cuh)
// Four values as their hi and lo e4m3 parts (4 bytes each). An infinite value becomes the NaN
// code (satfinite would make it +-448, a finite and wrong score; the reference's is not finite).
__device__ __forceinline__ void nf8_split4(const float (&xin)[4], uint32_t& hi, uint32_t& lo) {
    float x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = fabsf(xin[i]) == __int_as_float(0x7f800000) ? __int_as_float(0x7fc00000) : xin[i];
    const uint32_t h01 = e4m3x2_of(x[0], x[1]), h23 = e4m3x2_of(x[2], x[3]);
    const float2 b01 = e4m3x2_to_f2(h01), b23 = e4m3x2_to_f2(h23);  // fp8_tiles.cuh
    hi = h01 | (h23 << 16);
    lo = e4m3x2_of(x[0] - b01.x, x[1] - b01.y) | (e4m3x2_of(x[2] - b23.x, x[3] - b23.y) << 16);
}
template <typename T> __device__ __forceinline__ float2 f2_of(uint32_t w) {
    if constexpr (Same<T, bf16>::value) {
        return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    } else {
        return __half22float2(*reinterpret_cast<const __half2*>(&w));
    }
}

// Warpgroup 0 writes the CTA's MT query rows of sequence b into Q (zero rows past m_total):
// the latent part as hi / lo e4m3 in four [2 MT x 128 B] column blocks (hi rows 0..MT-1, lo
// rows MT..2 MT-1), the rope part as T in the ninth block, and s_qinv[r] = 2^-e. Every load
// is issued first (MT x 9 / 8 units of 4 values a thread, held in registers), then the rows'
// maxima (s_qmax, scratch), then the parts. Called between two barriers of warpgroup 0.
template <typename T, int MT>
__device__ __forceinline__ void nf8_load_q(const Params& p, int b, int row0, uint32_t sQ, uint32_t* s_qmax,
                                           float* s_qinv, int wtid) {
    constexpr int UNITS = FD / 4, NU = MT * UNITS / 128;
    static_assert(MT * UNITS % 128 == 0, "whole units a thread");
    uint2 v[NU];
#pragma unroll
    for (int u = 0; u < NU; ++u) {
        const int idx = wtid + 128 * u, r = idx / UNITS, f = (idx - r * UNITS) * 4;
        const int gr = row0 + r;
        v[u] = make_uint2(0u, 0u);
        if (gr < p.m_total) v[u] = *reinterpret_cast<const uint2*>(q_row<T>(p, b, gr) + f);
    }
    if (wtid < MT) s_qmax[wtid] = 0u;
    bar_sync(BAR_WG0, 128);
#pragma unroll
    for (int u = 0; u < NU; ++u) {
        const int idx = wtid + 128 * u, r = idx / UNITS, f = (idx - r * UNITS) * 4;
        if (f >= 512) continue;
        const float2 a = f2_of<T>(v[u].x), c = f2_of<T>(v[u].y);
        const float m = fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(c.x), fabsf(c.y)));
        // A NaN anywhere makes the row's maximum NaN (fmaxf drops NaN operands, so test it).
        const bool nan = a.x != a.x || a.y != a.y || c.x != c.x || c.y != c.y;
        atomicMax(s_qmax + r, nan ? 0x7fc00000u : __float_as_uint(m));
    }
    bar_sync(BAR_WG0, 128);
#pragma unroll
    for (int u = 0; u < NU; ++u) {
        const int idx = wtid + 128 * u, r = idx / UNITS, f = (idx - r * UNITS) * 4;
        if (f < 512) {
            const int e = nf8_qexp(s_qmax[r]);
            const float sc = __uint_as_float((uint32_t)(127 + e) << 23);  // 2^e
            const float2 a = f2_of<T>(v[u].x), c = f2_of<T>(v[u].y);
            const float x[4] = {a.x * sc, a.y * sc, c.x * sc, c.y * sc};
            uint32_t hi, lo;
            nf8_split4(x, hi, lo);
            const int grp = f >> 7, byte = nf8_qbyte(f & 127);
            const uint32_t blk = sQ + grp * (2 * MT * 128);
            st_shared_u32(blk + swz(r, byte >> 4) + (byte & 15), hi);
            st_shared_u32(blk + swz(MT + r, byte >> 4) + (byte & 15), lo);
            if (f == 0) s_qinv[r] = __uint_as_float((uint32_t)(127 - e) << 23);
        } else {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int L = nf8_rope_pos(f - 512 + 2 * half);  // features + 0, + 1: adjacent positions
                const int blk = 8 + (L >> 6), e = L & 63;
                st_shared_u32(sQ + blk * (MT * 128) + swz(r, e >> 3) + (e & 7) * 2, half ? v[u].y : v[u].x);
            }
        }
    }
}

// bf16 queries fold the scales out of P V (FOLD): P V reads P'_G = P x scale(token, G) x
// 2^100 per group G (P V's m-blocks are group-major) against the codes' exact bf16 patterns
// (value x 2^-120, three integer ops a pair, vt::e4m3x2_bits), O coming out x 2^-20. f16
// queries dequantize each value of V (dq2_f16: code x scale rounded once) and use one P^T.
// S^T folds the scales for both (per group, in f32).
template <typename T> struct Nf8Fold { static constexpr bool value = Same<T, bf16>::value; };
constexpr float NF8_P_SCALE = 0x1p100f;  // P'_G = P x scale x 2^100 (bf16 range for any scale < 2^27)
constexpr float NF8_O_SCALE = 0x1p20f;   // 2^120 / 2^100: what the folded O is short of

// Warpgroup 0: S^T = K Q^T over the raw tile at `raw` (token flags vst) for tokens 16 wwarp + g
// and + 8, in 5 chunks (one per 128-feature group, 4 fp8 k steps, then the rope's 4 16-bit k
// steps), fragments in two register sets (a chunk's are loaded while the previous chunk's
// wgmma run) and group sums in two accumulator sets (group G is folded into s, x its tokens'
// scales, once group G + 1 has been issued; 8 wgmma a group: each k step against Q's hi, then
// its lo part). qv[k]: 2^-e of column NarrowRows::col(k, qd).
// sa / sb: the two tokens' group scales (0 for tokens that do not exist).
template <typename T, int MT>
__device__ __forceinline__ void nf8_qk(float (&s)[MT / 2], float (&sa)[4], float (&sb)[4], uint32_t raw,
                                       const unsigned char* vst, uint64_t dq, const float (&qv)[MT / 4], int wwarp,
                                       int g, int qd) {
    constexpr int Q_SUB = MT * 128, R = MT / 2;
    const int ta = 16 * wwarp + g, tb = ta + 8;
    const uint32_t ra = raw + ta * FP8_ROW, rb = raw + tb * FP8_ROW;
    const uint4 sa4 = lds128(ra + vt::fp8ds::SCALE_OFFSET), sb4 = lds128(rb + vt::fp8ds::SCALE_OFFSET);
    const bool va = vst[ta] != 0, vb = vst[tb] != 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        sa[k] = va ? __uint_as_float(vt::word(sa4, k)) : 0.0f;
        sb[k] = vb ? __uint_as_float(vt::word(sb4, k)) : 0.0f;
    }
    uint32_t a[2][4][4];
    float acc[2][R];  // group sums (hi + lo)
    float rope[R];
    auto fold = [&](int grp) {
        float(&ac)[R] = acc[grp & 1];
        pin(ac);
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const float sc = (i & 2) ? sb[grp] : sa[grp];  // token ta for (i & 3) < 2, tb else
            s[i] = grp == 0 ? ac[i] * sc : fmaf(ac[i], sc, s[i]);
        }
    };
#pragma unroll
    for (int c = 0; c < 5; ++c) {
        uint32_t(&fr)[4][4] = a[c & 1];
        if (c >= 2) {
            wgmma_wait<1>();  // chunk c - 2 is done: its register set and its group sums
            fold(c - 2);
        }
        if (c < 4) {
            const uint32_t off = 128 * c + 32 * qd;
            const uint4 xa0 = lds128(ra + off), xa1 = lds128(ra + off + 16);
            const uint4 xb0 = lds128(rb + off), xb1 = lds128(rb + off + 16);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const uint4& xa = k < 2 ? xa0 : xa1;
                const uint4& xb = k < 2 ? xb0 : xb1;
                fr[k][0] = vt::word(xa, 2 * (k & 1)), fr[k][1] = vt::word(xb, 2 * (k & 1));
                fr[k][2] = vt::word(xa, 2 * (k & 1) + 1), fr[k][3] = vt::word(xb, 2 * (k & 1) + 1);
            }
        } else {
            const uint32_t off = vt::fp8ds::ROPE_OFFSET + 32 * qd;
            const uint4 ya0 = lds128(ra + off), ya1 = lds128(ra + off + 16);
            const uint4 yb0 = lds128(rb + off), yb1 = lds128(rb + off + 16);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const uint4& ya = k < 2 ? ya0 : ya1;
                const uint4& yb = k < 2 ? yb0 : yb1;
                fr[k][0] = rope2<T>(vt::word(ya, 2 * (k & 1)));
                fr[k][1] = rope2<T>(vt::word(yb, 2 * (k & 1)));
                fr[k][2] = rope2<T>(vt::word(ya, 2 * (k & 1) + 1));
                fr[k][3] = rope2<T>(vt::word(yb, 2 * (k & 1) + 1));
            }
        }
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (c < 4) {
                // Column block c: Q_hi's MT rows of 128 bytes, then Q_lo's; 32 bytes a k step.
                const uint64_t oq = (uint64_t)((c * 2 * Q_SUB + k * 32) >> 4);
                wgmma_rs_e4m3(acc[c & 1], fr[k], dq + oq, k == 0 ? 0 : 1);
                wgmma_rs_e4m3(acc[c & 1], fr[k], dq + oq + (Q_SUB >> 4), 1);
            } else {
                const uint64_t oq = (uint64_t)((8 * Q_SUB + k * 32) >> 4);
                WgRs<T>::mma(rope, fr[k], dq + oq, k == 0 ? 0 : 1);
            }
        }
        wgmma_commit();
    }
    wgmma_wait<0>();
    fold(3);
    pin(rope);
#pragma unroll
    for (int i = 0; i < R; ++i) s[i] = fmaf(s[i], qv[2 * (i >> 2) + (i & 1)], rope[i]);
}

// Warpgroup 1: O^T += V^T P^T over the raw tile at `raw` for all 8 m-blocks, B = P^T at sPb
// (FOLD: P'_G at sPb + G x MT x 128 for m-blocks 2 G, 2 G + 1). M-block 2 G + h, row
// 16 wwarp + g + 8 e is feature 128 G + 32 wwarp + 4 g + 2 h + e: thread (wwarp, g) reads 4
// bytes per group of each of the 4 tokens 16 ks + 2 qd (+1, +8, +9) of a k step; chunks of 4
// m-blocks (two register sets, as nf8_qk). Arrives on `empty` once its last read of the slot
// is done; returns with the products complete.
template <typename T, int MT>
__device__ __forceinline__ void nf8_pv(float (&o)[8][MT / 2], uint32_t raw, const unsigned char* vst, uint32_t sPb,
                                       uint32_t empty, int wwarp, int g, int qd) {
    constexpr bool FOLD = Nf8Fold<T>::value;
    const uint32_t col = 32 * wwarp + 4 * g;
    float sc[16][4];  // f16: token 16 ks + 2 qd + (i & 1) + 8 (i >> 1) at sc[4 ks + i], its group scales
    if constexpr (!FOLD) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int tk = 16 * ks + 2 * qd + (i & 1) + 8 * (i >> 1);
                const uint4 v = lds128(raw + tk * FP8_ROW + vt::fp8ds::SCALE_OFFSET);
                const bool ok = vst[tk] != 0;
#pragma unroll
                for (int grp = 0; grp < 4; ++grp) sc[4 * ks + i][grp] = ok ? __uint_as_float(vt::word(v, grp)) : 0.0f;
            }
    }
    uint32_t a[2][4][4];
    uint32_t x[4][2];  // this chunk's two groups, 4 tokens
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        const int ks = c >> 1, half = c & 1;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int gg = 0; gg < 2; ++gg) {
                uint32_t w;
                asm volatile("ld.shared.u32 %0, [%1];\n"
                             : "=r"(w)
                             : "r"(raw + (16 * ks + 2 * qd + (i & 1) + 8 * (i >> 1)) * FP8_ROW + 128 * (2 * half + gg) + col));
                x[i][gg] = w;
            }
        if (c == 7) mbar_arrive(empty);  // this thread's reads of the slot are done
        uint32_t(&fr)[4][4] = a[c & 1];
        if (c >= 2) wgmma_wait<1>();
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const int mb = 4 * half + m, gg = m >> 1, h = m & 1;
            // Features 2 h, 2 h + 1 of the group's 4 bytes: one feature of two tokens per half.
            const uint32_t sel = h ? 0x7362u : 0x5140u;
            const uint32_t w01 = prmt(x[0][gg], x[1][gg], sel), w23 = prmt(x[2][gg], x[3][gg], sel);
            if (NF8_LAB == 3 || NF8_LAB == 5) {  // lab: no dequantization
                fr[m][0] = w01, fr[m][1] = w01 >> 16, fr[m][2] = w23, fr[m][3] = w23 >> 16;
            } else if (FOLD) {
                fr[m][0] = vt::e4m3x2_bits<bf16>(w01, false);  // feature 2 h, tokens +0, +1
                fr[m][1] = vt::e4m3x2_bits<bf16>(w01, true);   // feature 2 h + 1
                fr[m][2] = vt::e4m3x2_bits<bf16>(w23, false);  // tokens +8, +9
                fr[m][3] = vt::e4m3x2_bits<bf16>(w23, true);
            } else {
                const int grp = mb >> 1;
                const float s0 = sc[4 * ks][grp], s1 = sc[4 * ks + 1][grp];
                const float s2 = sc[4 * ks + 2][grp], s3 = sc[4 * ks + 3][grp];
                fr[m][0] = dq2_f16(w01, false, s0, s1);
                fr[m][1] = dq2_f16(w01, true, s0, s1);
                fr[m][2] = dq2_f16(w23, false, s2, s3);
                fr[m][3] = dq2_f16(w23, true, s2, s3);
            }
        }
        wgmma_fence();
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const int mb = 4 * half + m;
            const uint32_t pt = FOLD ? sPb + (mb >> 1) * (MT * 128) : sPb;
            WgRs<T>::mma(o[mb], fr[m], gmma_desc(pt, 16, 1024) + 2 * ks, 1);
        }
        wgmma_commit();
    }
    wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) pin(o[mb]);
}

// Warpgroup 1's epilogue from registers: query row 8 i + 2 qd + b of the CTA holds feature
// 128 G + 32 wwarp + 4 g + 2 h + e in o[2 G + h][4 i + 2 e + b]; 4 contiguous features a thread,
// group and row, scaled by 1 / l (s_fin: sums [MT], then maxima [MT]; FOLD: x 2^20). Lanes g = 0
// of warp 0 write lse.
template <typename T, int MT>
__device__ __forceinline__ void nf8_store(const Params& p, const Segment& sg, int row0, const float (&o)[8][MT / 2],
                                          const float* s_fin, int wwarp, int g, int qd) {
    const int col = 32 * wwarp + 4 * g;
#pragma unroll
    for (int i = 0; i < MT / 8; ++i)
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            const int r = 8 * i + 2 * qd + b, row = row0 + r;
            if (row >= p.m_total) continue;
            const float l = s_fin[r];
            const float inv = l > 0.0f ? (Nf8Fold<T>::value ? NF8_O_SCALE : 1.0f) / l : 0.0f;
            float v[4][4];  // [group][feature]
#pragma unroll
            for (int mb = 0; mb < 8; ++mb)
#pragma unroll
                for (int e = 0; e < 2; ++e) v[mb >> 1][2 * (mb & 1) + e] = o[mb][4 * i + 2 * e + b] * inv;
            const int s = row / p.N, hd = row - s * p.N;
#pragma unroll
            for (int grp = 0; grp < 4; ++grp) {
                const int f = 128 * grp + col;
                if (sg.whole) {
                    T* out = (T*)p.out + sg.b * p.o_sb + s * p.o_ss + hd * p.o_sh + f;
                    *reinterpret_cast<uint2*>(out) = make_uint2(pack2<T>(v[grp][0], v[grp][1]), pack2<T>(v[grp][2], v[grp][3]));
                } else {
                    store_part4(p, sg.slot, row, f, v[grp][0], v[grp][1], v[grp][2], v[grp][3]);
                }
            }
            if (wwarp == 0 && g == 0) store_lse<T>(p, sg, row, l > 0.0f ? s_fin[MT + r] + log2f(l) : vt::neg_inf());
        }
}

// The producer warp: walks the part's segments and loads every tile's existing rows into
// the ring (slot u % RAWS of the CTA's u-th tile), each lane two tokens. The rows' offsets
// (a block-table read each) are looked up two tiles ahead, so that read's latency overlaps
// the wait for a free slot instead of preceding each tile's copies. TMA (64 divides BS, so a
// tile is 64 rows of one block): lane 0 loads the tile as one box of kv_map (a bad block id
// reads the block one past the last: zeros), else every lane bulk-copies its rows.
template <int RAWS, bool TMA>
__device__ __forceinline__ void nf8_produce(const Params& p, const Part& part, uint32_t sRaw, unsigned char* valid,
                                            unsigned char* flags, uint32_t full, uint32_t empty, int lane,
                                            const TmaMap* kv_map) {
    const unsigned char* cache = (const unsigned char*)p.cache;
    int nb = part.b;
    i64 pre = part.pre;
    Segment sg;
    int u = 0;
    auto rows_of = [&](int t, i64& a, i64& b) {
        a = token_row(p, sg, t, t * BN + lane);
        b = token_row(p, sg, t, t * BN + 32 + lane);
    };
    while (next_segment(p, part, nb, pre, sg)) {
        i64 n0, n1, m0, m1;  // offsets of tiles t + 1 and t + 2 (-1 past the segment)
        i64 o0, o1;
        rows_of(sg.t0, o0, o1);
        rows_of(sg.t0 + 1, n0, n1);
        for (int t = sg.t0; t < sg.t1; ++t, ++u) {
            rows_of(t + 2, m0, m1);
            const int slot = u % RAWS;
            if (u >= RAWS) mbar_wait(empty + 8 * slot, ((u / RAWS) - 1) & 1);
            unsigned char* v = valid + slot * BN;
            v[lane] = o0 >= 0 ? 1 : 0;
            v[32 + lane] = o1 >= 0 ? 1 : 0;
            const unsigned bad0 = __ballot_sync(0xffffffffu, o0 == -2), bad1 = __ballot_sync(0xffffffffu, o1 == -2);
            if (lane == 0)
                *reinterpret_cast<unsigned long long*>(flags + slot * 8) =
                    (bad0 != 0u ? 1ull : 0ull) | (bad1 != 0u ? 0x100ull : 0ull);
            const uint32_t bar = full + 8 * slot, dst = sRaw + slot * (BN * FP8_ROW);
            if constexpr (TMA) {
                // Every lane arrives (its flag stores released), lane 0 expecting the box.
                if (lane == 0) {
                    const int bi = t * BN / p.BS;
                    int blk = __ldg(p.block_table + sg.b * p.bt_sb + bi * p.bt_sm);
                    if (blk < 0 || blk >= p.NB) blk = p.NB;
                    mbar_expect_tx(bar, NF8_LAB == 1 ? 0u : (uint32_t)(BN * FP8_ROW));
                    if (NF8_LAB != 1) tma_load_3d(dst, kv_map, 0, t * BN - bi * p.BS, blk, bar);
                } else {
                    mbar_arrive(bar);
                }
                o0 = n0, o1 = n1, n0 = m0, n1 = m1;
                continue;
            }
            // Every lane's expectation (and its flag stores, released by the arrival) before
            // any copy can complete on the barrier.
            mbar_expect_tx(bar, NF8_LAB == 1 ? 0u : (uint32_t)((o0 >= 0) + (o1 >= 0)) * FP8_ROW);
            __syncwarp();
            if (NF8_LAB != 1) {
                if (o0 >= 0) bulk_load(dst + lane * FP8_ROW, cache + o0, FP8_ROW, bar);
                if (o1 >= 0) bulk_load(dst + (32 + lane) * FP8_ROW, cache + o1, FP8_ROW, bar);
            }
            o0 = n0, o1 = n1, n0 = m0, n1 = m1;
        }
    }
}

template <typename T, int MT, bool TMA>
__device__ void decode_wgmma_narrow_fp8(const Params& p, const TmaMap* kv_map) {
    using L = NarrowFp8Layout<MT>;
    constexpr int R = MT / 2, RAWS = L::RAWS;
    static_assert(MT == 16 || MT == 32, "wgmma N = 16 or 32");
    static_assert(L::SMEM <= 232448, "fits the 227 KB a block may have");
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = align1024(smem_raw);
    const uint32_t base = smem_u32(smem);
    const uint32_t sQ = base + L::OFF_Q, sRaw = base + L::OFF_RAW, sP = base + L::OFF_P;
    float* red_max = (float*)(smem + L::OFF_RED);  // [2][4][MT]
    float* s_alpha = red_max + 8 * MT;              // [2][MT]
    float* s_fin = s_alpha + 2 * MT;                // [2][2][MT]
    float* red_l = s_fin + 4 * MT;                  // [4][MT]
    uint32_t* s_qmax = (uint32_t*)(red_l + 4 * MT);  // [MT]
    float* s_qinv = (float*)(s_qmax + MT);          // [MT]
    unsigned char* valid = smem + L::OFF_VALID;
    unsigned char* flags = smem + L::OFF_FLAGS;
    int* sched = (int*)(smem + L::OFF_SCHED);
    const uint32_t full = base + L::OFF_MBAR, empty = full + 8 * RAWS, pfree = empty + 8 * RAWS;
    if (threadIdx.x == 0) {
        for (int s = 0; s < RAWS; ++s) {
            mbar_init(full + 8 * s, 32);
            mbar_init(empty + 8 * s, 256);
        }
        mbar_init(pfree, 128);
        mbar_init(pfree + 8, 128);
    }
    grid_dep_launch();
    // find_part's block barriers also publish the mbarriers' initialization.
    const Part part = find_part(p, sched, (int*)(smem + L::OFF_P), MT * 128 / 4);  // P: free until the first tile
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp >> 2;
    // One loop per warpgroup, each after its setmaxnreg (ptxas allocates per region).
    if (wg == 2) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(NF8_REGS[2]) : "memory");
        if (warp == NF8_PRODUCER) {
            if (TMA && lane == 0) prefetch_map(kv_map);
            nf8_produce<RAWS, TMA>(p, part, sRaw, valid, flags, full, empty, lane, kv_map);
        }
        return;
    }
    const int wwarp = warp & 3, wtid = threadIdx.x & 127;
    const int g = lane >> 2, qd = lane & 3;
    const int row0 = blockIdx.y * MT;
    const uint64_t dq = gmma_desc(sQ, 16, 1024);
    int nb = part.b;
    i64 pre = part.pre;
    Segment sg;
    int u = 0, seg = 0;
    if (wg == 0) {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(NF8_REGS[0]) : "memory");
        while (next_segment(p, part, nb, pre, sg)) {
            bar_sync(BAR_WG0, 128);  // the previous segment's products (all read Q) are done
            nf8_load_q<T, MT>(p, sg.b, row0, sQ, s_qmax, s_qinv, wtid);
            fence_proxy_async();  // Q is read by wgmma (async proxy)
            bar_sync(BAR_WG0, 128);
            NarrowRows<MT> rows(p, sg, row0, qd);
            float qv[MT / 4];
#pragma unroll
            for (int k = 0; k < MT / 4; ++k) qv[k] = s_qinv[NarrowRows<MT>::col(k, qd)];
            for (int t = sg.t0; t < sg.t1; ++t, ++u) {
                const int slot = u % RAWS, pb = u & 1;
                mbar_wait(full + 8 * slot, (u / RAWS) & 1);
                float s[R], sa[4], sb[4];
                if (NF8_LAB == 2 || NF8_LAB == 7) {
#pragma unroll
                    for (int i = 0; i < R; ++i) s[i] = 0.0f;
#pragma unroll
                    for (int k = 0; k < 4; ++k) sa[k] = sb[k] = 0.0f;
                } else {
                    nf8_qk<T, MT>(s, sa, sb, sRaw + slot * L::RAW_BYTES, valid + slot * BN, dq, qv, wwarp, g, qd);
                }
                float alpha[MT / 4];
                const uint32_t sPb = sP + pb * L::P_BYTES;
                narrow_p<T, MT>(
                    p, sg, t, s, valid + slot * BN, flags + slot * 8, red_max + pb * 4 * MT, s_alpha + pb * MT, rows,
                    alpha, wtid,
                    [&] {
                        // WG1 is done with tile u - 2 (phase (u - 2) / 2 of P_FREE[pb])
                        if (u >= 2) mbar_wait(pfree + 8 * pb, ((u >> 1) - 1) & 1);
                    },
                    [&](const float(&pv)[R]) {
                        if constexpr (Nf8Fold<T>::value) {
#pragma unroll
                            for (int grp = 0; grp < 4; ++grp)
                                narrow_store_p<T, MT>(sPb + grp * L::Q_SUB, pv, wtid, sa[grp] * NF8_P_SCALE,
                                                      sb[grp] * NF8_P_SCALE);
                        } else {
                            narrow_store_p<T, MT>(sPb, pv, wtid, 1.0f, 1.0f);
                        }
                    });
                mbar_arrive(empty + 8 * slot);  // S and the mask have read the slot
                bar_arrive(NF8_P_FULL + pb, 256);
            }
            narrow_row_sums<MT>(rows, red_l, s_fin + (seg & 1) * 2 * MT, wtid);
            bar_sync(BAR_WG0, 128);  // (racecheck takes a write as published at a barrier it syncs)
            bar_arrive(NF8_FIN + (seg & 1), 256);
            ++seg;
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(NF8_REGS[1]) : "memory");
        while (next_segment(p, part, nb, pre, sg)) {
            float o[8][R];
#pragma unroll
            for (int mb = 0; mb < 8; ++mb)
#pragma unroll
                for (int i = 0; i < R; ++i) o[mb][i] = 0.0f;
            for (int t = sg.t0; t < sg.t1; ++t, ++u) {
                const int slot = u % RAWS, pb = u & 1;
                mbar_wait(full + 8 * slot, (u / RAWS) & 1);
                bar_sync(NF8_P_FULL + pb, 256);  // P^T(u) and its factors
                if (t > sg.t0) rescale_from<MT>(o, s_alpha + pb * MT, qd);
                if (NF8_LAB == 2 || NF8_LAB == 6)
                    mbar_arrive(empty + 8 * slot);
                else
                    nf8_pv<T, MT>(o, sRaw + slot * L::RAW_BYTES, valid + slot * BN, sP + pb * L::P_BYTES,
                                  empty + 8 * slot, wwarp, g, qd);
                if (t + 1 < sg.t1) mbar_arrive(pfree + 8 * pb);
            }
            bar_sync(NF8_FIN + (seg & 1), 256);
            nf8_store<T, MT>(p, sg, row0, o, s_fin + (seg & 1) * 2 * MT, wwarp, g, qd);
            mbar_arrive(pfree + 8 * ((u - 1) & 1));  // the segment's last tile, u - 1: s_fin is read
            ++seg;
        }
    }
}

}  // namespace mla
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
