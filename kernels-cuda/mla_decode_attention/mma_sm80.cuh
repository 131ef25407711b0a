// MlaDecodeAttention, the mma.sync kernels (sm_80+): mla_decode_mma{16,32,64}[s]_{bf16,f16}.
// D = 576, Dv = 512, 16/32/64 query rows per CTA (MR = 1, 2, 4 row blocks of 16), 8 warps,
// mma.sync m16n8k16 tensor cores with ldmatrix fragments. KV tiles are loaded with cp.async
// as 32-token halves into a ring of HS half-tile slots: five (four at 64 rows), or three (two
// at 64 rows) in the "s" kernels for devices with less shared memory per block (an A100's
// 163 KB). Used for s_q x h_q <= 16 on sm_90 and for every 16-bit shape on other
// architectures. Planned by crates/vt-cuda/src/mla_decode_attention/mma_sm80.rs. Part of
// mla_decode_attention.cu.
#pragma once

#include "mla_decode_attention/fp8_tiles.cuh"
#include "mla_decode_attention/tiles.cuh"

namespace mla {

// Shared-memory layout of the mma.sync kernels. KV lives in a ring of HS half-tile slots
// (32 tokens, NSUB column blocks of [32 rows x 128 B], swizzled): five on the H200 where they
// fit beside Q (MT <= 32), so while tile t is computed tile t+1 and half of t+2 are in
// flight, else four (the same bytes as two whole stages); three / two where shared memory is
// smaller (the "s" kernels). Token flags are per tile, RING tiles live.
// With an fp8_ds_mla cache (FP8) the ring holds raw rows (FP8_HALF_BYTES a slot) and two
// 16-bit half-tile slots hold the current tile, dequantized.
template <int MT, int HS_, bool FP8 = false> struct MmaLayout {
    static constexpr int HS = HS_;                              // half-tile slots of the ring
    static_assert(HS >= 2, "the current tile's two halves need two slots");
    // Tiles with live flags: the current one and those in flight. FP8 refills the ring
    // before the current tile's products (its raw slots are free once dequantized), so one
    // more tile is live then.
    static constexpr int RING = (HS + 1) / 2 + (FP8 ? 1 : 0);
    static constexpr int Q_SUB = MT * 128;
    static constexpr int OFF_Q = 0;
    static constexpr int OFF_KV = NSUB * Q_SUB;                 // 1024-aligned (MT % 8 == 0)
    static constexpr int OFF_STG = OFF_KV + (FP8 ? 2 : HS) * HALF_BYTES;     // FP8: the ring of raw rows
    static constexpr int OFF_P = OFF_STG + (FP8 ? HS * FP8_HALF_BYTES : 0);  // P [MT x 64 tokens]
    static constexpr int RED = 128;
    static constexpr int OFF_RED = OFF_P + MT * 128;            // float [2][RED]
    static constexpr int OFF_VALID = OFF_RED + 2 * RED * 4;     // u8 [RING][BN]
    static constexpr int OFF_FLAGS = OFF_VALID + RING * BN;     // u8 [RING][2 halves][8 warps]
    static constexpr int OFF_SCHED = OFF_FLAGS + RING * 16;     // int [40]
    static constexpr int END = OFF_SCHED + 40 * 4;
    static constexpr int SMEM = END + 1024;
};

// As tile_is_full, with the 16 per-half warp flags of the mma kernels.
__device__ __forceinline__ bool tile_is_full16(int t, int lim_min, const unsigned char* f) {
    const unsigned long long* w = reinterpret_cast<const unsigned long long*>(f);
    return t * BN + BN <= lim_min && (w[0] | w[1]) == 0ull;
}

// ---------------------------------------------------------------------------------------
// mma.sync kernel: MR row blocks of 16 (MT = 16 * MR query rows), 8 warps.
// QK: warp (wr, wc) computes rows 16 wr.. x tokens wc*TN.., the k loop split over NCH
// independent accumulators (a single 36-long HMMA chain is latency-bound); PV: rows
// 16 wr.. x columns wc*CV... Row maxima and sums are combined across the WC warps of a
// row block through shared memory; P goes through shared memory as the A operand of PV.
// ---------------------------------------------------------------------------------------
template <typename T, int MR, int HS_, bool FP8 = false>
__device__ void decode_mma(const Params& p) {
    constexpr int MT = 16 * MR;
    constexpr int WC = 8 / MR;
    constexpr int TN = BN / WC;  // tokens per warp (QK)
    constexpr int NTQ = TN / 8;
    constexpr int NCH = 1;  // independent QK chains (more did not pay: measured slower)
    constexpr int CV = FDV / WC;  // output columns per warp (PV)
    constexpr int NTV = CV / 8;
    using L = MmaLayout<MT, HS_, FP8>;
    constexpr int HS = L::HS, RING = L::RING;
    static_assert(WC * MT == L::RED, "row reductions fill the RED arrays");
    static_assert(L::SMEM <= 232448, "fits the 227 KB a block may have");
    static_assert(TN <= HALF && HALF % TN == 0, "a warp's QK tokens lie in one half tile");

    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = align1024(smem_raw);
    const uint32_t base = smem_u32(smem);
    const uint32_t sQ = base + L::OFF_Q, sKV = base + L::OFF_KV, sP = base + L::OFF_P;
    // The ring: 16-bit half tiles, or (FP8) raw rows dequantized into the two slots at sKV.
    const uint32_t sRing = FP8 ? base + L::OFF_STG : sKV;
    constexpr uint32_t SLOT = FP8 ? FP8_HALF_BYTES : HALF_BYTES;
    float* red_max = (float*)(smem + L::OFF_RED);  // [WC][MT]
    float* red_l = red_max + L::RED;               // [WC][MT]
    unsigned char* valid = smem + L::OFF_VALID;    // [RING][BN]
    unsigned char* flags = smem + L::OFF_FLAGS;    // [RING][16]
    int* sched = (int*)(smem + L::OFF_SCHED);
    if (threadIdx.x < RING * 16) flags[threadIdx.x] = 0;
    grid_dep_launch();

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wr = warp % MR, wc = warp / MR;
    const int g = lane >> 2, qd = lane & 3;
    const int row0 = blockIdx.y * MT;
    const float c = p.scale_log2;
    using Ld = typename Cond<FP8, Fp8HalfLoader, HalfLoader<T>>::type;
    const Ld ld(p, threadIdx.x);

    const Part part = find_part(p, sched);
    int nb = part.b;
    i64 pre = part.pre;
    Segment sg;
    while (next_segment(p, part, nb, pre, sg)) {
        int lim[2];
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int r = row0 + wr * 16 + g + 8 * hi;
            const int s = r < p.m_total ? r / p.N : p.s_q - 1;
            lim[hi] = sg.len - p.s_q + s + 1;
        }
        const int lim_min = sg.len - p.s_q + 1;
        load_q<T, MT, THREADS>(p, sg.b, row0, sQ, threadIdx.x);
        // Half tiles 0 .. HS-1 of the segment into slots 0 .. HS-1, one cp.async group each
        // (Q joins the first). Half j of the segment always lives in slot j % HS, the flags
        // of local tile u in ring entry u % RING.
#pragma unroll
        for (int j = 0; j < HS; ++j) {
            const int u = j >> 1;
            if (sg.t0 + u < sg.t1)
                ld.issue(sRing + j * SLOT, valid + (u % RING) * BN, flags + (u % RING) * 16, j & 1,
                         ld.row_of(p, sg, sg.t0 + u, j & 1));
            cp_async_commit();
        }
        // Row offsets of the two halves the first iteration loads (HS and HS + 1).
        i64 off_a = ld.row_of(p, sg, sg.t0 + HS / 2, HS & 1);
        i64 off_b = ld.row_of(p, sg, sg.t0 + (HS + 1) / 2, (HS + 1) & 1);
        int slot0 = 0;  // slot of the current tile's first half: 2u % HS

        float o[NTV][4];
#pragma unroll
        for (int i = 0; i < NTV; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
        float m_run[2] = {vt::neg_inf(), vt::neg_inf()}, l_run[2] = {0.0f, 0.0f};
        const int a_row = wr * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;

        for (int t = sg.t0; t < sg.t1; ++t) {
            const int u = t - sg.t0;
            const int slot1 = slot0 + 1 == HS ? 0 : slot0 + 1;
            const uint32_t kh0 = FP8 ? sKV : sKV + slot0 * HALF_BYTES;
            const uint32_t kh1 = FP8 ? sKV + HALF_BYTES : sKV + slot1 * HALF_BYTES;
            const int ru = u % RING;
            const unsigned char* vst = valid + ru * BN;
            // Refills the two ring slots of the current tile: halves 2u + HS (into slot0) and
            // 2u + HS + 1 (slot1).
            auto refill = [&]() {
                const int ja = 2 * u + HS, jb = ja + 1;
                const int ua = ja >> 1, ub = jb >> 1;
                if (sg.t0 + ua < sg.t1)
                    ld.issue(sRing + slot0 * SLOT, valid + (ua % RING) * BN, flags + (ua % RING) * 16, ja & 1, off_a);
                cp_async_commit();
                if (sg.t0 + ub < sg.t1)
                    ld.issue(sRing + slot1 * SLOT, valid + (ub % RING) * BN, flags + (ub % RING) * 16, jb & 1, off_b);
                cp_async_commit();
                off_a = ld.row_of(p, sg, sg.t0 + ua + 1, ja & 1);
                off_b = ld.row_of(p, sg, sg.t0 + ub + 1, jb & 1);
            };
            // Groups committed: HS + 2u; halves 2u and 2u + 1 must have landed.
            cp_async_wait<HS - 2>();
            __syncthreads();
            if constexpr (FP8) {
                // Dequantize the tile into the 16-bit slots (free: the last PV is behind the
                // barrier above), then its raw slots take the next loads at once.
                dequant_half<T>(sRing + slot0 * SLOT, kh0, threadIdx.x);
                dequant_half<T>(sRing + slot1 * SLOT, kh1, threadIdx.x);
                __syncthreads();
                refill();
            }
            // This warp's QK tokens lie in one half.
            const uint32_t kq = wc * TN >= HALF ? kh1 : kh0;

            // S = Q K^T for rows 16 wr.. and tokens wc*TN.. (raw, unscaled).
            float acc[NCH][NTQ][4];
#pragma unroll
            for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
                for (int i = 0; i < NTQ; ++i) acc[ch][i][0] = acc[ch][i][1] = acc[ch][i][2] = acc[ch][i][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < FD / 16; ++ks) {
                const int ch = ks % NCH;
                uint32_t a[4];
                const int akc = ks * 2 + (lane >> 4);
                ldsm_x4(sQ + (akc >> 3) * (MT * 128) + swz(a_row, akc & 7), a);
                if constexpr (NTQ == 1) {
                    uint32_t bb[2];
                    const int n = (wc * TN + (lane & 7)) & (HALF - 1);
                    const int kc = ks * 2 + ((lane >> 3) & 1);
                    ldsm_x2(kq + (kc >> 3) * HSUB_BYTES + swz(n, kc & 7), bb);
                    MmaSync<T>::run(acc[ch][0], a, bb[0], bb[1]);
                } else {
#pragma unroll
                    for (int np = 0; np < NTQ / 2; ++np) {
                        uint32_t bb[4];
                        const int n = (wc * TN + np * 16 + (lane & 7) + (lane >> 4) * 8) & (HALF - 1);
                        const int kc = ks * 2 + ((lane >> 3) & 1);
                        ldsm_x4(kq + (kc >> 3) * HSUB_BYTES + swz(n, kc & 7), bb);
                        MmaSync<T>::run(acc[ch][2 * np], a, bb[0], bb[1]);
                        MmaSync<T>::run(acc[ch][2 * np + 1], a, bb[2], bb[3]);
                    }
                }
            }
            float sacc[NTQ][4];
#pragma unroll
            for (int i = 0; i < NTQ; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float v = acc[0][i][e];
#pragma unroll
                    for (int ch = 1; ch < NCH; ++ch) v += acc[ch][i][e];
                    sacc[i][e] = v;
                }

            // Mask only boundary tiles (sequence end, causal limit, bad block ids); maxima.
            const int tok0 = t * BN;
            // (64-row blocks always mask: the unmasked copy of this code spills there.)
            const bool full = MR < 4 && tile_is_full16(t, lim_min, flags + ru * 16);
            float mx[2] = {vt::neg_inf(), vt::neg_inf()};
#pragma unroll
            for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int hi = i >> 1;
                    if (!full) {
                        const int col = wc * TN + nt * 8 + 2 * qd + (i & 1);
                        const bool ok = vst[col] != 0 && tok0 + col < lim[hi];
                        sacc[nt][i] = ok ? sacc[nt][i] : vt::neg_inf();
                    }
                    mx[hi] = fmaxf(mx[hi], sacc[nt][i]);
                }
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 1));
                mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 2));
                if (qd == 0) red_max[wc * MT + wr * 16 + g + 8 * hi] = mx[hi];
            }
            __syncthreads();

            float alpha[2], muse[2];
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                float tm = vt::neg_inf();
#pragma unroll
                for (int w = 0; w < WC; ++w) tm = fmaxf(tm, red_max[w * MT + wr * 16 + g + 8 * hi]);
                muse[hi] = online_max_step(tm, c, m_run[hi], l_run[hi], alpha[hi]);
            }
#pragma unroll
            for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
                for (int hi = 0; hi < 2; ++hi) {
                    const float p0 = ex2(fmaf(sacc[nt][2 * hi], c, -muse[hi]));
                    const float p1 = ex2(fmaf(sacc[nt][2 * hi + 1], c, -muse[hi]));
                    l_run[hi] += p0 + p1;
                    const int r = wr * 16 + g + 8 * hi;
                    const int col = wc * TN + nt * 8 + 2 * qd;
                    st_shared_u32(sP + swz(r, col >> 3) + (col & 7) * 2, pack2<T>(p0, p1));
                }
            if (alpha[0] != 1.0f || alpha[1] != 1.0f) {
#pragma unroll
                for (int i = 0; i < NTV; ++i) {
                    o[i][0] *= alpha[0];
                    o[i][1] *= alpha[0];
                    o[i][2] *= alpha[1];
                    o[i][3] *= alpha[1];
                }
            }
            __syncthreads();

            // O += P V for rows 16 wr.. and columns wc*CV..; V = the tile's first 512 features.
#pragma unroll
            for (int ks = 0; ks < BN / 16; ++ks) {
                uint32_t a[4];
                const int akc = ks * 2 + (lane >> 4);
                ldsm_x4(sP + swz(a_row, akc), a);
                const int tok = (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) & (HALF - 1);
                const uint32_t vh = ks * 16 < HALF ? kh0 : kh1;
#pragma unroll
                for (int np = 0; np < NTV / 2; ++np) {
                    uint32_t bb[4];
                    const int fc = (wc * CV + np * 16) / 8 + (lane >> 4);
                    ldsm_x4_t(vh + (fc >> 3) * HSUB_BYTES + swz(tok, fc & 7), bb);
                    MmaSync<T>::run(o[2 * np], a, bb[0], bb[1]);
                    MmaSync<T>::run(o[2 * np + 1], a, bb[2], bb[3]);
                }
            }
            __syncthreads();
            if constexpr (!FP8) refill();  // the two freed slots
            slot0 = slot0 + 2 >= HS ? slot0 + 2 - HS : slot0 + 2;
        }
        cp_async_wait<0>();

        // Row sums across the quad and the WC warps of the row block, then the outputs.
        float lsum[2];
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            float l = l_run[hi];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if (qd == 0) red_l[wc * MT + wr * 16 + g + 8 * hi] = l;
        }
        __syncthreads();
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            float l = 0.0f;
#pragma unroll
            for (int w = 0; w < WC; ++w) l += red_l[w * MT + wr * 16 + g + 8 * hi];
            lsum[hi] = l;
        }
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int r = row0 + wr * 16 + g + 8 * hi;
            if (r >= p.m_total) continue;
            const float inv = lsum[hi] > 0.0f ? 1.0f / lsum[hi] : 0.0f;
#pragma unroll
            for (int nt = 0; nt < NTV; ++nt)
                store_pair<T>(p, sg, r, wc * CV + nt * 8 + 2 * qd, o[nt][2 * hi] * inv, o[nt][2 * hi + 1] * inv);
            if (wc == 0 && qd == 0)
                store_lse<T>(p, sg, r, lsum[hi] > 0.0f ? m_run[hi] + log2f(lsum[hi]) : vt::neg_inf());
        }
        __syncthreads();
    }
}

}  // namespace mla
