// MlaDecodeAttention, the narrow wgmma kernel (sm_90a only): mla_decode_wgmma_n{16,32}[_tma]_
// {bf16,f16} for at most 16 / 32 query rows per sequence (s_q x N: 16 or 32 heads after
// tensor parallelism, or 16 heads with s_q = 2). D = 576, Dv = 512, KV tiles by cp.async or
// the TMA exactly as in wgmma_sm90.cuh (same stages, barriers and roles). Planned by
// crates/vt-cuda/src/mla_decode_attention/wgmma_sm90.rs (`narrow`). Part of
// mla_decode_attention.cu.
//
// Both products run transposed ("swap A and B"), so the tile's 64 tokens sit on wgmma's M
// and the few query rows on N, and nothing is padded to 64 rows:
//   S^T = K Q^T    36 wgmma m64nMTk16, A = the K tile (K-major), B = Q (K-major)
//   O^T += V^T P^T  per 64 output features 4 wgmma m64nMTk16, A = V read MN-major in place
//                  from the K tile (transposed A), B = P^T in shared memory (K-major)
// The softmax runs down S^T's columns: a query row's 64 scores are spread over the 4 warps
// of warpgroup 0 (16 tokens each), so the tile maximum is combined across warps through
// shared memory (one 128-thread barrier). Warpgroup 0 computes S, the softmax and
// O^T[0:256]; warpgroup 1 loads and computes O^T[256:512], with the barriers of
// wgmma_sm90.cuh (K_FULL, P_FULL, P_FREE, V_FREE and the epilogue's).
// The fp8_ds_mla form of this kernel (wgmma_narrow_fp8_sm90.cuh) shares the softmax
// (narrow_p), the row state and the row sums defined here.
#pragma once

#include "mla_decode_attention/wgmma_sm90.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace mla {

// Shared-memory layout of the narrow kernel (byte offsets from a 1024-aligned base): as
// Layout<MT> with MT query rows, plus the cross-warp column reductions.
template <int MT> struct NarrowLayout {
    static constexpr int STAGES = 2;
    static constexpr int Q_SUB = MT * 128;                     // one column block of Q
    static constexpr int OFF_Q = 0;
    static constexpr int OFF_KV = NSUB * Q_SUB;                 // 1024-aligned (MT % 8 == 0)
    static constexpr int OFF_P = OFF_KV + STAGES * TILE_BYTES;  // P^T [MT rows x 64 tokens] 16-bit
    // floats: tile maxima [2 parities][4 warps][MT], rescale factors [MT], final sums and
    // maxima [2][MT], per-warp row sums [4][MT] (and one spare MT).
    static constexpr int OFF_RED = OFF_P + MT * 128;
    static constexpr int OFF_VALID = OFF_RED + 16 * MT * 4;     // u8 [STAGES][BN]: token row exists
    static constexpr int OFF_FLAGS = OFF_VALID + STAGES * BN;   // u8 [STAGES][8]: a warp saw a bad block
    static constexpr int OFF_SCHED = OFF_FLAGS + STAGES * 8;    // int [40]
    static constexpr int OFF_MBAR = OFF_SCHED + 40 * 4;         // u64 [STAGES]: TMA tile landed
    static constexpr int END = OFF_MBAR + STAGES * 8;
    static constexpr int SMEM = END + 1024;                     // slack to align the base
};

// wgmma m64n16k16 / m64n32k16 with both operands in shared memory; TA = 1 reads A MN-major.
#define VT_WGMMA_N16(NAME, TY, TA)                                                                        \
    __device__ __forceinline__ void NAME(float (&d)[8], uint64_t da, uint64_t db, int scale_d) {         \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"                                       \
                     "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY " "                           \
                     "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, " #TA ", 0;\n}\n"               \
                     : VT_ACC8(0)                                                                         \
                     : "l"(da), "l"(db), "r"(scale_d));                                                   \
    }
#define VT_WGMMA_N32(NAME, TY, TA)                                                                        \
    __device__ __forceinline__ void NAME(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {        \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                       \
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " "                           \
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, " #TA ", 0;\n}\n" \
                     : VT_ACC8(0), VT_ACC8(8)                                                             \
                     : "l"(da), "l"(db), "r"(scale_d));                                                   \
    }
VT_WGMMA_N16(wgmma_m64n16k16_bf16, "bf16", 0)
VT_WGMMA_N16(wgmma_m64n16k16_f16, "f16", 0)
VT_WGMMA_N16(wgmma_m64n16k16_bf16_ta, "bf16", 1)
VT_WGMMA_N16(wgmma_m64n16k16_f16_ta, "f16", 1)
VT_WGMMA_N32(wgmma_m64n32k16_bf16, "bf16", 0)
VT_WGMMA_N32(wgmma_m64n32k16_f16, "f16", 0)
VT_WGMMA_N32(wgmma_m64n32k16_bf16_ta, "bf16", 1)
VT_WGMMA_N32(wgmma_m64n32k16_f16_ta, "f16", 1)

// The narrow products per 16-bit type, overloaded on the accumulator (N = 16: 8 registers,
// N = 32: 16). qk: S^T (+)= K Q^T; pv: O^T += V^T P^T (A transposed).
template <typename T> struct WgNarrow;
template <> struct WgNarrow<bf16> {
    static __device__ __forceinline__ void qk(float (&d)[8], uint64_t a, uint64_t b, int sc) { wgmma_m64n16k16_bf16(d, a, b, sc); }
    static __device__ __forceinline__ void qk(float (&d)[16], uint64_t a, uint64_t b, int sc) { wgmma_m64n32k16_bf16(d, a, b, sc); }
    static __device__ __forceinline__ void pv(float (&d)[8], uint64_t a, uint64_t b) { wgmma_m64n16k16_bf16_ta(d, a, b, 1); }
    static __device__ __forceinline__ void pv(float (&d)[16], uint64_t a, uint64_t b) { wgmma_m64n32k16_bf16_ta(d, a, b, 1); }
};
template <> struct WgNarrow<f16> {
    static __device__ __forceinline__ void qk(float (&d)[8], uint64_t a, uint64_t b, int sc) { wgmma_m64n16k16_f16(d, a, b, sc); }
    static __device__ __forceinline__ void qk(float (&d)[16], uint64_t a, uint64_t b, int sc) { wgmma_m64n32k16_f16(d, a, b, sc); }
    static __device__ __forceinline__ void pv(float (&d)[8], uint64_t a, uint64_t b) { wgmma_m64n16k16_f16_ta(d, a, b, 1); }
    static __device__ __forceinline__ void pv(float (&d)[16], uint64_t a, uint64_t b) { wgmma_m64n32k16_f16_ta(d, a, b, 1); }
};

__device__ __forceinline__ void st_shared_f1(uint32_t addr, float x) {
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(x) : "memory");
}

// O^T[mb * 64 .. +64, :] += V^T P^T for the four 64-feature blocks from `mb0` of the tile at
// kst (4 k steps of 16 tokens each: +2048 B in V, +32 B in P^T).
template <typename T, int R>
__device__ __forceinline__ void pv_narrow(float (&o)[4][R], uint64_t dp, uint32_t kst, int mb0) {
#pragma unroll
    for (int mb = 0; mb < 4; ++mb) pin(o[mb]);
    wgmma_fence();
#pragma unroll
    for (int mb = 0; mb < 4; ++mb) {
        const uint64_t dv = gmma_desc(kst + (mb0 + mb) * SUB_BYTES, SUB_BYTES, 1024);
#pragma unroll
        for (int ks = 0; ks < BN / 16; ++ks) WgNarrow<T>::pv(o[mb], dv + 128 * ks, dp + 2 * ks);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < 4; ++mb) pin(o[mb]);
}

// o[mb][4 i + j] holds column (query row) 8 i + 2 qd + (j & 1): scaled by a[2 i + (j & 1)].
template <int NB, int R> __device__ __forceinline__ void rescale_cols(float (&o)[NB][R], const float (&a)[R / 2]) {
#pragma unroll
    for (int mb = 0; mb < NB; ++mb)
#pragma unroll
        for (int i = 0; i < R / 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) o[mb][4 * i + j] *= a[2 * i + (j & 1)];
}

// Stages a warpgroup's O^T accumulators (features mb0 * 64 + 16 warp + g (+8), rows
// 8 i + 2 qd (+1)) as f32 rows of OSTR in the freed KV stages.
template <int R>
__device__ __forceinline__ void stage_narrow(uint32_t stage, const float (&o)[4][R], int mb0, int wwarp, int g,
                                             int qd) {
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
        for (int i = 0; i < R / 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int f = (mb0 + mb) * 64 + wwarp * 16 + g + 8 * (j >> 1);
                const int r = 8 * i + 2 * qd + (j & 1);
                st_shared_f1(stage + (r * OSTR + f) * 4, o[mb][4 * i + j]);
            }
}

// The query rows (columns of S^T) a thread of warpgroup 0 holds, with their running
// softmax state: column k is query row 8 (k / 2) + 2 qd + (k % 2) of the CTA.
template <int MT> struct NarrowRows {
    static constexpr int NC = MT / 4;
    int lim[NC];  // tokens visible to the row: sg.len - s_q + s + 1
    float m_run[NC], l_run[NC];

    __device__ __forceinline__ static int col(int k, int qd) { return 8 * (k >> 1) + 2 * qd + (k & 1); }

    __device__ __forceinline__ NarrowRows(const Params& p, const Segment& sg, int row0, int qd) {
#pragma unroll
        for (int k = 0; k < NC; ++k) {
            const int r = row0 + col(k, qd);
            const int s = r < p.m_total ? r / p.N : p.s_q - 1;
            lim[k] = sg.len - p.s_q + s + 1;
            m_run[k] = vt::neg_inf();
            l_run[k] = 0.0f;
        }
    }
};

// P^T (MT query rows x 64 tokens, 16-bit, swizzled) from warpgroup 0's probabilities pv
// (S^T's layout), token 16 wwarp + g scaled by fa and token + 8 by fb: per 16 columns one
// stmatrix .x4 .trans (matrix m = 2 n-block + half: this warp's tokens 16 wwarp + 8 half ..
// + 7 of columns 8 n-block .. + 7; memory row j of matrix m is P^T row 8 n-block + j, chunk
// 2 wwarp + half of it).
template <typename T, int MT>
__device__ __forceinline__ void narrow_store_p(uint32_t sP, const float (&pv)[MT / 2], int wtid, float fa, float fb) {
    const int wwarp = wtid >> 5, lane = wtid & 31, lm = lane >> 3, lj = lane & 7;
#pragma unroll
    for (int x = 0; x < MT / 16; ++x) {
        uint32_t r[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const int i = 2 * x + (m >> 1), h = m & 1;
            const float f = h ? fb : fa;
            r[m] = pack2<T>(pv[4 * i + 2 * h] * f, pv[4 * i + 2 * h + 1] * f);
        }
        stsm_x4_t(sP + swz(8 * (2 * x + (lm >> 1)) + lj, 2 * wwarp + (lm & 1)), r);
    }
}

// Warpgroup 0's softmax of tile t from its scores s (S^T, s[4 i + j]: token 16 wwarp + g +
// 8 (j >> 1), column 2 i + (j & 1)): the mask (only boundary tiles: token flags vst / fl), column
// maxima over the 4 warps (rm: a [4][MT] buffer alternating by tile parity), the rescale
// factors (alpha, and s_alpha for the warpgroup that holds O) and P^T (through write_p).
// wait_free() runs before write_p(P) stores P^T (narrow_store_p) and the factors are written
// (the other warpgroup may still read the previous ones).
template <typename T, int MT, class WaitFree, class WriteP>
__device__ __forceinline__ void narrow_p(const Params& p, const Segment& sg, int t, float (&s)[MT / 2],
                                         const unsigned char* vst, const unsigned char* fl, float* rm, float* s_alpha,
                                         NarrowRows<MT>& rows, float (&alpha)[MT / 4], int wtid, WaitFree wait_free,
                                         WriteP write_p) {
    constexpr int R = MT / 2, NC = MT / 4;
    const int wwarp = wtid >> 5, lane = wtid & 31, g = lane >> 2, qd = lane & 3;
    const float c = p.scale_log2;
    if (!tile_is_full(t, sg.len - p.s_q + 1, fl)) {
        const int tok0 = t * BN;
#pragma unroll
        for (int i = 0; i < R / 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int tk = wwarp * 16 + g + 8 * (j >> 1);
                const bool okk = vst[tk] != 0 && tok0 + tk < rows.lim[2 * i + (j & 1)];
                s[4 * i + j] = okk ? s[4 * i + j] : vt::neg_inf();
            }
    }
    // Column maxima over this warp's 16 tokens (the 8 lanes of a quad position), then over
    // the 4 warps.
#pragma unroll
    for (int k = 0; k < NC; ++k) {
        const int i = k >> 1, b = k & 1;
        float m = fmaxf(s[4 * i + b], s[4 * i + 2 + b]);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
        if (g == 0) rm[wwarp * MT + NarrowRows<MT>::col(k, qd)] = m;
    }
    bar_sync(BAR_WG0, 128);
    float muse[NC];
#pragma unroll
    for (int k = 0; k < NC; ++k) {
        const int col = NarrowRows<MT>::col(k, qd);
        const float tm = fmaxf(fmaxf(rm[col], rm[MT + col]), fmaxf(rm[2 * MT + col], rm[3 * MT + col]));
        muse[k] = online_max_step(tm, c, rows.m_run[k], rows.l_run[k], alpha[k]);
    }
    float pv[R];
#pragma unroll
    for (int i = 0; i < R / 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int k = 2 * i + (j & 1);
            pv[4 * i + j] = ex2(fmaf(s[4 * i + j], c, -muse[k]));
            rows.l_run[k] += pv[4 * i + j];
        }
    wait_free();  // the other warpgroup is done with the previous P^T
    write_p(pv);
    if (wwarp == 0 && g == 0) {
#pragma unroll
        for (int k = 0; k < NC; ++k) s_alpha[NarrowRows<MT>::col(k, qd)] = alpha[k];
    }
    fence_proxy_async();     // P^T is read by wgmma (async proxy)
    bar_sync(BAR_WG0, 128);  // all of P^T written before this warpgroup's wgmma
}

// Warpgroup 0's part of tile t before the products of the 16-bit kernel: S^T = K Q^T over
// the tile at kst, then narrow_p. With TMA, rows past the sequence are zeroed in the tile
// before the products (they came from a real page).
template <typename T, int MT, bool TMA>
__device__ __forceinline__ void narrow_softmax(const Params& p, const Segment& sg, int t, uint32_t kst,
                                               uint64_t dq, uint32_t sP, const unsigned char* vst,
                                               const unsigned char* fl, float* rm, float* s_alpha,
                                               NarrowRows<MT>& rows, float (&alpha)[MT / 4], int wtid) {
    constexpr int R = MT / 2, Q_SUB = MT * 128;
    float s[R];
    const uint64_t dk = gmma_desc(kst, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < FD / 16; ++ks) {
        // Column block ks / 4, 32 bytes per k step inside it.
        const uint64_t ok = (uint64_t)(((ks >> 2) * SUB_BYTES + (ks & 3) * 32) >> 4);
        const uint64_t oq = (uint64_t)(((ks >> 2) * Q_SUB + (ks & 3) * 32) >> 4);
        WgNarrow<T>::qk(s, dk + ok, dq + oq, ks > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    pin(s);
    if (TMA && t * BN + BN > sg.len) {
        // As decode_wgmma: rows past the sequence's last token came from a real page and may
        // hold NaN; zero their V part before either product reads it.
        const int first = sg.len - t * BN;
        for (int idx = wtid; idx < (BN - first) * 64; idx += 128) {
            const int r = first + (idx >> 6), cc = idx & 63;
            st_shared_v4_zero(kst + (cc >> 3) * SUB_BYTES + swz(r, cc & 7));
        }
        fence_proxy_async();
    }
    narrow_p<T, MT>(p, sg, t, s, vst, fl, rm, s_alpha, rows, alpha, wtid, [] { bar_sync(BAR_P_FREE, 256); },
                    [&](const float(&pv)[R]) { narrow_store_p<T, MT>(sP, pv, wtid, 1.0f, 1.0f); });
}

// Warpgroup 0's row sums (over the 8 lanes of a quad position and the 4 warps, through
// red_l [4][MT]) and maxima into s_fin [2][MT], after the last tile of a segment.
template <int MT>
__device__ __forceinline__ void narrow_row_sums(const NarrowRows<MT>& rows, float* red_l, float* s_fin, int wtid) {
    const int wwarp = wtid >> 5, g = (wtid & 31) >> 2, qd = wtid & 3;
#pragma unroll
    for (int k = 0; k < MT / 4; ++k) {
        float l = rows.l_run[k];
        l += __shfl_xor_sync(0xffffffffu, l, 4);
        l += __shfl_xor_sync(0xffffffffu, l, 8);
        l += __shfl_xor_sync(0xffffffffu, l, 16);
        if (g == 0) red_l[wwarp * MT + NarrowRows<MT>::col(k, qd)] = l;
        if (wwarp == 0 && g == 0) s_fin[MT + NarrowRows<MT>::col(k, qd)] = rows.m_run[k];
    }
    bar_sync(BAR_WG0, 128);
    if (wtid < MT) s_fin[wtid] = red_l[wtid] + red_l[MT + wtid] + red_l[2 * MT + wtid] + red_l[3 * MT + wtid];
}

// Warpgroup 1's rescale of its O^T by the factors warpgroup 0 published for this tile.
template <int MT, int NB> __device__ __forceinline__ void rescale_from(float (&o)[NB][MT / 2], const float* s_alpha, int qd) {
    float a[MT / 4];
#pragma unroll
    for (int k = 0; k < MT / 4; ++k) a[k] = s_alpha[NarrowRows<MT>::col(k, qd)];
    rescale_cols(o, a);
}

template <typename T, int MT, bool TMA>
__device__ void decode_wgmma_narrow(const Params& p, const TmaMap* kv_map) {
    using L = NarrowLayout<MT>;
    constexpr int R = MT / 2;   // accumulator registers of one m64nMTk16
    static_assert(MT == 16 || MT == 32, "wgmma N = 16 or 32");
    static_assert(L::SMEM <= 232448, "fits the 227 KB a block may have");
    static_assert(MT * OSTR * 4 <= L::STAGES * TILE_BYTES, "O is staged in the KV stages");
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = align1024(smem_raw);
    const uint32_t base = smem_u32(smem);
    const uint32_t sQ = base + L::OFF_Q, sKV = base + L::OFF_KV, sP = base + L::OFF_P;
    float* red_max = (float*)(smem + L::OFF_RED);  // [2][4][MT]
    float* s_alpha = red_max + 8 * MT;              // [MT] rescale factors of the current tile
    float* s_fin = s_alpha + MT;                    // [2][MT] final row sums and maxima
    float* red_l = s_fin + 2 * MT;                  // [4][MT]
    unsigned char* valid = smem + L::OFF_VALID;
    unsigned char* flags = smem + L::OFF_FLAGS;
    int* sched = (int*)(smem + L::OFF_SCHED);
    const float* so = reinterpret_cast<const float*>(smem + L::OFF_KV);  // O staged at the end
    const bool tl0 = MLA_TIMELINE && threadIdx.x == 0;  // lab stamps (schedule.cuh)
    if (tl0) MLA_TL_SET(TL_ENTRY, MLA_TL_NOW());
    if (threadIdx.x < L::STAGES * 8) flags[threadIdx.x] = 0;
    StageBarriers<L::STAGES, TMA> bars(base + L::OFF_MBAR);
    grid_dep_launch();

    const int wg = threadIdx.x >> 7, wtid = threadIdx.x & 127;
    const int wwarp = wtid >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, qd = lane & 3;
    const int row0 = blockIdx.y * MT;
    const Loader<T, 128> ld(p, wtid);  // warpgroup 1 only
    const uint64_t dq = gmma_desc(sQ, 16, 1024);
    const uint64_t dp = gmma_desc(sP, 16, 1024);

    const Part part = find_part(p, sched, (int*)(smem + L::OFF_P), MT * 128 / 4);  // P: free until the first tile
    if (tl0) MLA_TL_SET(TL_PART, MLA_TL_NOW());
    int nb = part.b;
    i64 pre = part.pre;
    Segment sg;
    int tl_segs = 0, tl_tiles = 0;
    while (next_segment(p, part, nb, pre, sg)) {
        const int t0 = sg.t0, t1 = sg.t1;
        float o[4][R];  // O^T for features (wg * 4 + mb) * 64 ..
#pragma unroll
        for (int mb = 0; mb < 4; ++mb)
#pragma unroll
            for (int i = 0; i < R; ++i) o[mb][i] = 0.0f;

        if (wg == 1) {
            // Producer: Q and the first two tiles, then per tile: PV for features 256..511,
            // signal, and the load two tiles ahead (as decode_wgmma).
            producer_tiles<T, MT, TMA>(p, sg, row0, sQ, sKV, valid, flags, bars, kv_map, ld, wtid,
                                       [&](uint32_t kst) {
                                           rescale_from<MT>(o, s_alpha, qd);
                                           pv_narrow<T, R>(o, dp, kst, 4);
                                       });
        } else {
            NarrowRows<MT> rows(p, sg, row0, qd);
            for (int t = t0; t < t1; ++t) {
                const int st = (t - t0) & 1;
                const uint32_t kst = sKV + st * TILE_BYTES;
                if (TMA) {
                    if (t == t0) bar_sync(BAR_K_FULL, 256);  // Q
                    bars.wait(st);
                } else {
                    bar_sync(BAR_K_FULL + st, 256);
                }
                if (tl0) {
                    const unsigned long long now = MLA_TL_NOW();
                    if (t == t0) {
                        if (tl_segs == 0) MLA_TL_SET(TL_Q0, now);  // (Q and the first tile: one stamp)
                        MLA_TL_SET(TL_QLAST, now);
                    }
                    if (tl_tiles == 0) MLA_TL_SET(TL_TILE0, now);
                    MLA_TL_SET(TL_TILES, ++tl_tiles);
                }
                float alpha[MT / 4];
                narrow_softmax<T, MT, TMA>(p, sg, t, kst, dq, sP, valid + st * BN, flags + st * 8,
                                                 red_max + ((t - t0) & 1) * 4 * MT, s_alpha, rows, alpha, wtid);
                bar_arrive(BAR_P_FULL, 256);
                rescale_cols(o, alpha);
                pv_narrow<T, R>(o, dp, kst, 0);
                if (t + 2 < t1) bar_arrive(BAR_V_FREE + st, 256);
            }
            narrow_row_sums<MT>(rows, red_l, s_fin, wtid);
        }
        // The epilogue between two block barriers, as in decode_wgmma.
        __syncthreads();
        stage_narrow(sKV, o, 4 * wg, wwarp, g, qd);
        bar_sync(wg ? BAR_WG1 : BAR_WG0, 128);
        copy_out<T, MT>(p, sg, row0, so, 256 * wg, s_fin, wtid, wg == 0);
        __syncthreads();
        if (tl0) {
            const unsigned long long now = MLA_TL_NOW();
            if (tl_segs == 0) MLA_TL_SET(TL_SEG0_END, now);
            MLA_TL_SET(TL_SEGS, ++tl_segs);
            MLA_TL_SET(TL_END0, now);
        }
    }
}

}  // namespace mla
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
