// MlaDecodeAttention, the 64-row wgmma kernel with FlashMLA's "seesaw" schedule (sm_90a):
// mla_decode_wgmma_ss_{bf16,f16}, KV tiles through the TMA (block sizes that are multiples of
// 64). D = 576, Dv = 512, 64 query rows per CTA, Layout<64> (two 72 KB stages), 256 threads.
// Planned by crates/vt-cuda/src/mla_decode_attention/wgmma_sm90.rs (VT_MLA_SEESAW). Part of
// mla_decode_attention.cu. The schedule is FlashMLA's (docs/20250422-new-kernel-deep-dive.md
// there); the code is this project's.
//
// Why: in decode_wgmma (wgmma_sm90.cuh) warpgroup 0 runs every S = Q K^T and the softmax and
// warpgroup 1 only half of P V, so the tensor pipe idles while the softmax runs (docs/perf.md,
// "What limits it"). Here both warpgroups compute S: warpgroup 0 for the even tiles of a
// segment (stage 0), warpgroup 1 for the odd ones (stage 1); O is split by columns (warpgroup
// 0 holds O[:, 0:256], warpgroup 1 O[:, 256:512]) and each warpgroup multiplies both tiles' P
// into its half, so one's softmax runs under the other's products. Per pair of tiles (A even,
// B odd), with m the running row maximum (log2 domain):
//   WG0: m_A = max(m, max S_A); P_A = exp2(S_A - m_A); O_L *= exp2(m - m_A);
//        O_L += P_A V_A[:, 0:256] (P_A from registers)                       -> SCALE0 (m_A)
//   WG1: m_B = max(m_A, max S_B); P_B = exp2(S_B - m_B); O_R *= exp2(m - m_B);  -> SCALE1 (m_B)
//        P_B -> sP1; O_R += P_B V_B[:, 256:512] (registers)
//   WG0: P_A exp2(m_A - m_B) -> sP0                                           -> P0_READY
//   WG1: O_R += sP0 V_A[:, 256:512]                                           -> RO1
//   WG0: O_L *= exp2(m_A - m_B); O_L += sP1 V_B[:, 0:256]
// then WG0 computes S of the next even tile and WG1 of the next odd one.
//
// Loads: each of a tile's nine 64-column boxes has its own mbarrier, and S runs box by box
// as they land (the next tile's loads are issued only once the products free its stage, so
// S must start on the first 8 KB). A tile's boxes come in two halves (lo: boxes 0..3, the V
// columns warpgroup 0 reads; hi: boxes 4..8), each reloaded by the warpgroup that reads it
// last as soon as its product on it is complete: WG0 reloads lo halves, WG1 hi halves. Each
// warpgroup waits for exactly the completions of the boxes it reads (its own stage's nine for
// S, and the other stage's four it multiplies), each of which it sees at most one phase
// ahead (the next completion of a box is issued by the waiter itself or ordered after its
// wait by a named barrier), so the parities never alias.
//
// Shared memory (Layout<64>): sP0 is the layout's P; sP1 overlays Q's rope box (columns
// 512..575), whose values both warpgroups keep in registers (the A operand of the last four
// k steps of S) from the start of each segment. The running maxima go through s_m (m_A, m_B);
// every exchange is a named barrier, arrived by one warpgroup and synced by the other (SCALE0,
// SCALE1, P0_READY, RO1), never twice before the other side synced (the next arrival on an id
// is ordered after a sync on a barrier the other side arrives only after consuming).
//
// Sanitizers (H200, docs/perf.md "Fifteenth session"): memcheck and synccheck 0; racecheck
// reports hazards whose only order is an arrive / sync pair of named barriers (it does not take
// bar.arrive as ordering the arriving side's reads, nor a barrier that one side only arrives
// at as ordering the syncing threads among themselves): the maxima through s_m, the rope box's
// register load against the first P_B stored over it, the row sums, and stage 1's token flags.
// Forms ordered in ways racecheck accepts were measured slower than this one: the maxima
// through mbarriers (5-8%), a two-sided P0_READY (4-5%, and synccheck rejects one id synced
// from two code sites), and a block barrier after the rope load, the row sums over a block
// barrier and the flags from the block id in registers (2-5%). Hence VT_MLA_SEESAW is off by
// default.
#pragma once

#include "mla_decode_attention/wgmma_sm90.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace mla {

// SsRs: the wgmma with A from registers, now overloads of Wg (wgmma_sm90.cuh); the name
// stays for wgmma_3wg_sm90.cuh.
template <typename T> using SsRs = Wg<T>;

// Named barriers of the seesaw kernel (BAR_WG0 / BAR_WG1 as in wgmma_sm90.cuh).
constexpr int SS_SCALE0 = 1, SS_SCALE1 = 2, SS_P0_READY = 3, SS_RO1 = 4, SS_Q = 5, SS_LSUM = 6;
constexpr int SS_LO_BYTES = 4 * SUB_BYTES, SS_HI_BYTES = (NSUB - 4) * SUB_BYTES;

// The box mbarriers ([stage][box] at 8-byte steps from bar) and this thread's parity of
// each one's next completion.
struct BoxBarriers {
    uint32_t bar;
    uint32_t phases = 0;
    __device__ __forceinline__ uint32_t of(int st, int cb) const { return bar + 8 * (NSUB * st + cb); }
    __device__ __forceinline__ void wait(int st, int cb) {
        const int i = NSUB * st + cb;
        mbar_wait(of(st, cb), (phases >> i) & 1);
        phases ^= 1u << i;
    }
};

// One warp issues boxes [cb0, cb1) of KV tile `tile` of segment sg into stage st at dst, each
// completing on its own barrier. With `valid` (the half whose first box the stage's S owner
// waits for first), also writes the tile's token flags, published by that box's expect_tx
// arrival. Pages past the sequence or with a bad block id read block NB (zeros), as in
// tma_tile.
__device__ __forceinline__ void tma_half(const Params& p, const Segment& sg, int tile, uint32_t dst,
                                         unsigned char* valid, unsigned char* flags, const BoxBarriers& bb,
                                         int st, const TmaMap* map, int lane, int cb0, int cb1) {
    const int j = tile * BN;  // every box holds the tile's 64 rows of one block (64 | BS)
    const BoxBlock bk = box_block(p, sg, tile, 0);
    const int blk = bk.blk, row = bk.row;
    if (valid != nullptr) {
        const bool bad_blk = tile < sg.t1 && j < sg.len && blk == p.NB;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int tok = lane + 32 * h;
            valid[tok] = (!bad_blk && tile < sg.t1 && j + tok < sg.len) ? 1 : 0;
        }
        if (lane == 0) *reinterpret_cast<unsigned long long*>(flags) = bad_blk ? 1ull : 0ull;
        __syncwarp();
    }
    if (lane < cb1 - cb0) {
        const int cb = cb0 + lane;
        const uint32_t bar = bb.of(st, cb);
        mbar_expect_tx(bar, SUB_BYTES);
        tma_load_3d(dst + cb * SUB_BYTES, map, 64 * cb, row, blk, bar);
    }
}

// S += Q K^T over column blocks [CB0, CB1) of stage st at kst, each box once it landed (box 8
// takes Q's rope part from registers, rq8), one commit group; the first k step overwrites S
// when fresh. (A wgmma.fence after each wait: without it ptxas serializes the wgmma, C7520.)
template <typename T, int CB0, int CB1>
__device__ __forceinline__ void qk_boxes(float (&s)[32], const GmmaDesc& dq, uint32_t kst, const uint32_t (&rq8)[4][4],
                                         bool fresh, BoxBarriers& bb, int st) {
    const GmmaDesc dk(kst, 16, 1024);
#pragma unroll
    for (int cb = CB0; cb < CB1; ++cb) {
        bb.wait(st, cb);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const uint32_t o16 = (uint32_t)((cb * SUB_BYTES + kk * 32) >> 4);
            const int sc = (fresh && cb == CB0 && kk == 0) ? 0 : 1;
            if (cb == NSUB - 1) {
                Wg<T>::qk(s, rq8[kk], dk.at(o16), sc);
            } else {
                Wg<T>::qk(s, dq.at(o16), dk.at(o16), sc);
            }
        }
    }
    wgmma_commit();
}

// Waits for boxes [CB0, CB1) of stage st: the other stage's V columns this warpgroup
// multiplies (their loads are complete: the stage's S owner waited for them), for its view.
template <int CB0, int CB1> __device__ __forceinline__ void ss_wait_boxes(BoxBarriers& bb, int st) {
#pragma unroll
    for (int cb = CB0; cb < CB1; ++cb) bb.wait(st, cb);
}

// O[:, half] += P V over the tile at v_base (the first of the half's four column blocks), P
// from registers (pk[2 i + hi]: row r_lo + 8 hi, tokens 8 i + 2 q (+1)); one commit group.
template <typename T>
__device__ __forceinline__ void pv_local(float (&o)[128], const uint32_t (&pk)[16], uint32_t v_base) {
    const GmmaDesc dv(v_base, SUB_BYTES, 1024);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) {
        const uint32_t a[4] = {pk[4 * ks], pk[4 * ks + 1], pk[4 * ks + 2], pk[4 * ks + 3]};
        Wg<T>::pv(o, a, dv.at(128 * ks));
    }
    wgmma_commit();
}

// O[:, half] += P V with P from shared memory (sp: its 64 x 64 swizzled tile); one commit group.
template <typename T>
__device__ __forceinline__ void pv_remote(float (&o)[128], uint32_t sp, uint32_t v_base) {
    const GmmaDesc dp(sp, 16, 1024), dv(v_base, SUB_BYTES, 1024);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) Wg<T>::pv(o, dp.at(2 * ks), dv.at(128 * ks));
    wgmma_commit();
}

// Masks S (tokens that do not exist or are not visible to the row: -inf) unless the tile is
// full, and returns the raw row maxima of this thread's two rows (quad-reduced): mask_row_max
// with the tile's token flags.
__device__ __forceinline__ void ss_mask_max(float (&s)[32], float (&mx)[2], int t, int lim_min, const int (&lim)[2],
                                            const unsigned char* vst, const unsigned char* fst, int qd) {
    mask_row_max(s, mx, tile_is_full(t, lim_min, fst), t * BN, lim, [&](int col) { return vst[col] != 0; }, qd);
}

// The exponent base of a running maximum: an all-masked row (-inf) uses 0 (its P are 0).
__device__ __forceinline__ float ss_base(float m) { return m == vt::neg_inf() ? 0.0f : m; }

// P = exp2(S c - base) in place, the row sums added to l, packed to 16 bits into pk.
template <typename T>
__device__ __forceinline__ void ss_exp(float (&s)[32], uint32_t (&pk)[16], float (&l)[2], const float (&base)[2],
                                       float c) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const float p0 = ex2(fmaf(s[4 * i + 2 * hi], c, -base[hi]));
            const float p1 = ex2(fmaf(s[4 * i + 2 * hi + 1], c, -base[hi]));
            s[4 * i + 2 * hi] = p0;
            s[4 * i + 2 * hi + 1] = p1;
            l[hi] += p0 + p1;
            pk[2 * i + hi] = pack2<T>(p0, p1);
        }
}

// Rows of tile t past the sequence's last token came from a real page (the TMA copies whole
// boxes) and may hold anything, NaN included: their weights are 0, but 0 x NaN is not, so
// the warpgroup zeroes its four V column blocks (from v_base) of those rows before its
// product, then syncs its 128 threads on `bar`.
__device__ __forceinline__ void ss_zero_tail(const Segment& sg, int t, uint32_t v_base, int wtid, int bar) {
    if (t * BN + BN <= sg.len) return;
    const int first = sg.len - t * BN;
    for (int idx = wtid; idx < (BN - first) * 32; idx += 128) {
        const int r = first + (idx >> 5), c = idx & 31;  // c: 16-byte chunk of the half's 32
        st_shared_v4_zero(v_base + (c >> 3) * SUB_BYTES + swz(r, c & 7));
    }
    fence_proxy_async();
    bar_sync(bar, 128);
}

// The seesaw's consumer steps, shared with the sparse prefill kernel
// (sparse_mla_attention/prefill_sm90.cuh), whose warpgroups 0 and 1 run the same exchanges and
// differ only in how a tile's columns land and are freed (TMA boxes here; cp.async halves and
// mbarriers there). MT = 64 rows; s_m[r] holds m_A, s_m[MT + r] m_B. The scratch arrays (bs, a,
// a1) are the caller's and land() gets its state as arguments, not captures: a helper-local array
// or a capturing lambda moves ptxas's register assignment off the SASS the kernels were measured
// with.
//
// Warpgroup 0, tile A (S in s, masked, its raw row maxima mx): the running maximum moves to m_A
// (published in s_m for warpgroup 1: SS_SCALE0), O_L and l are rescaled, P_A = exp2(S c - m_A)
// goes to pk (and s); returns the exponent bases in bs.
template <typename T>
__device__ __forceinline__ void ss_softmax_a(float (&s)[32], uint32_t (&pk)[16], float (&o)[128], float (&mx)[2],
                                             float (&bs)[2], float (&m_run)[2], float (&l)[2], float c, float* s_m,
                                             int r_lo, int qd) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        float a;
        bs[hi] = online_max_step(mx[hi], c, m_run[hi], l[hi], a);
        if (qd == 0) s_m[r_lo + 8 * hi] = m_run[hi];
        mx[hi] = a;
    }
    rescale(o, mx[0], mx[1]);
    ss_exp<T>(s, pk, l, bs, c);
    bar_arrive(SS_SCALE0, 256);
}

// Warpgroup 0, after warpgroup 1 published m_B (SS_SCALE1 synced): P_A (in s) rescaled to m_B
// into pk and handed to warpgroup 1 at sP0 (SS_P0_READY); the running maximum moves to m_B and
// O_L and l take the same factor (a1).
template <typename T, int MT>
__device__ __forceinline__ void ss_hand_p0(const float (&s)[32], uint32_t (&pk)[16], float (&o)[128],
                                           float (&m_run)[2], float (&l)[2], float (&a1)[2], const float* s_m,
                                           uint32_t sP0, int r_lo, int wwarp, int lane) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const float mb = s_m[MT + r_lo + 8 * hi];
        // From m_A itself, not its base: with no valid column yet (m_A = -inf, base 0) a1 must
        // be 0, and exp2(0 - m_B) overflows to inf (0 x inf = NaN) once m_B <= -128.
        a1[hi] = ex2(m_run[hi] - ss_base(mb));
        m_run[hi] = mb;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi)
            pk[2 * i + hi] = pack2<T>(s[4 * i + 2 * hi] * a1[hi], s[4 * i + 2 * hi + 1] * a1[hi]);
    store_p_rows(sP0, pk, wwarp, lane);
    fence_proxy_async();
    bar_arrive(SS_P0_READY, 256);
    rescale(o, a1[0], a1[1]);
    l[0] *= a1[0];
    l[1] *= a1[1];
}

// Warpgroup 1, tile B's raw row maxima mx (-inf without a tile B), once warpgroup 0 published
// m_A (SS_SCALE0): the running maximum moves to m_B = max(m_A, max S_B c) (published: SS_SCALE1),
// O_R and l are rescaled (by a); with a tile B, P_B = exp2(S_B c - m_B) (bases bs) goes to pk
// (and s) and to warpgroup 0 at sP1 (handed over later, on SS_RO1).
template <typename T, int MT>
__device__ __forceinline__ void ss_softmax_b(float (&s)[32], uint32_t (&pk)[16], float (&o)[128], const float (&mx)[2],
                                             float (&bs)[2], float (&a)[2], float (&m_run)[2], float (&l)[2], float c,
                                             float* s_m, uint32_t sP1, bool has_b, int r_lo, int wwarp, int lane,
                                             int qd) {
    bar_sync(SS_SCALE0, 256);
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const float ma = s_m[r_lo + 8 * hi];
        const float mn = fmaxf(ma, mx[hi] * c);
        bs[hi] = ss_base(mn);
        a[hi] = ex2(m_run[hi] - bs[hi]);
        m_run[hi] = mn;
        l[hi] *= a[hi];
        if (qd == 0) s_m[MT + r_lo + 8 * hi] = mn;
    }
    bar_arrive(SS_SCALE1, 256);
    rescale(o, a[0], a[1]);
    if (has_b) {
        ss_exp<T>(s, pk, l, bs, c);
        store_p_rows(sP1, pk, wwarp, lane);
        fence_proxy_async();
    }
}

// Warpgroup 1's P0 product: once warpgroup 0 handed P0 over (SS_P0_READY) and land(args...) made
// A's V columns 256..511 (at v) readable, O_R += P0 V_A[:, 256:512] (one commit group); with a
// tile B, then hands sP1 to warpgroup 0 (SS_RO1).
template <typename T, typename Land, typename... Args>
__device__ __forceinline__ void ss_pv_p0(float (&o)[128], uint32_t sP0, uint32_t v, bool has_b, Land land,
                                         Args&&... args) {
    bar_sync(SS_P0_READY, 256);
    land(args...);
    pv_remote<T>(o, sP0, v);
    if (has_b) bar_arrive(SS_RO1, 256);
}

// The row sums of both warpgroups, in the same base: warpgroup 1 puts its quad-reduced sums in
// s_fin[MT + r] and arrives on SS_LSUM; warpgroup 0 syncs there and writes the totals to
// s_fin[r] and its running maxima (the final ones) to s_fin[MT + r].
template <int MT>
__device__ __forceinline__ void ss_row_sums(float (&l)[2], const float (&m_run)[2], float* s_fin, int wg, int r_lo,
                                            int qd) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        l[hi] += __shfl_xor_sync(0xffffffffu, l[hi], 1);
        l[hi] += __shfl_xor_sync(0xffffffffu, l[hi], 2);
    }
    if (wg == 1) {
        if (qd == 0) {
            s_fin[MT + r_lo] = l[0];
            s_fin[MT + r_lo + 8] = l[1];
        }
        bar_arrive(SS_LSUM, 256);
    } else {
        bar_sync(SS_LSUM, 256);
        if (qd == 0) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const int r = r_lo + 8 * hi;
                s_fin[r] = l[hi] + s_fin[MT + r];
                s_fin[MT + r] = m_run[hi];
            }
        }
    }
}

template <typename T>
__device__ void decode_wgmma_seesaw(const Params& p, const TmaMap* kv_map) {
    constexpr int MT = WGMMA_ROWS;
    using L = Layout<MT>;
    static_assert(L::MBARS >= 2 * NSUB, "a barrier per box and stage");
    static_assert(L::RED * 2 >= 4 * MT, "s_fin (2 MT) and s_m (2 MT) fit the reduction area");
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = align1024(smem_raw);
    const uint32_t base = smem_u32(smem);
    const uint32_t sQ = base + L::OFF_Q, sKV = base + L::OFF_KV;
    const uint32_t sP0 = base + L::OFF_P, sP1 = sQ + (NSUB - 1) * SUB_BYTES;  // sP1: Q's rope box
    float* s_fin = (float*)(smem + L::OFF_RED);  // [2][MT]: final row sums and maxima
    float* s_m = s_fin + 2 * MT;                  // [2][MT]: m_A, m_B of the current pair
    unsigned char* valid = smem + L::OFF_VALID;
    unsigned char* flags = smem + L::OFF_FLAGS;
    int* sched = (int*)(smem + L::OFF_SCHED);
    const float* so = reinterpret_cast<const float*>(smem + L::OFF_KV);  // O staged at the end
    if (threadIdx.x < L::STAGES * 8) flags[threadIdx.x] = 0;
    BoxBarriers hb{base + L::OFF_MBAR};
    if (threadIdx.x == 0) {
        for (int i = 0; i < 2 * NSUB; ++i) mbar_init(hb.bar + 8 * i, 1);
        prefetch_map(kv_map);
    }
    __syncthreads();
    grid_dep_launch();

    const int wg = threadIdx.x >> 7, wtid = threadIdx.x & 127;
    const int wwarp = wtid >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, qd = lane & 3;
    const int row0 = blockIdx.y * MT;
    const int r_lo = wwarp * 16 + g;  // this thread's accumulator rows: r_lo, r_lo + 8
    const bool issuer = wwarp == 0;   // warp 0 of each warpgroup issues its TMA halves
    const GmmaDesc dq(sQ, 16, 1024);
    const float c = p.scale_log2;
    const uint32_t st0 = sKV, st1 = sKV + TILE_BYTES;
    // Warpgroup 1's V columns in a stage (a constant: an offset derived from the thread index
    // would keep the descriptors built from it out of uniform registers).
    constexpr uint32_t v_half = 4 * SUB_BYTES;

    const Part part = find_part(p, sched, (int*)(smem + L::OFF_P), MT * 128 / 4);  // P: free until the first tile
    int nb = part.b;
    i64 pre = part.pre;
    // Q of a segment is loaded by warpgroup 1 (cp.async) before the previous segment's
    // epilogue, so it lands while O is written out (Q is free once both warpgroups' products
    // of that segment are complete).
    Segment sg;
    bool have = next_segment(p, part, nb, pre, sg);
    if (have && wg == 1) {
        load_q<T, MT, 128>(p, sg.b, row0, sQ, wtid);
        cp_async_commit();
    }
    while (have) {
        const int t0 = sg.t0, t1 = sg.t1;
        int lim[2];
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int r = row0 + r_lo + 8 * hi;
            const int s = r < p.m_total ? r / p.N : p.s_q - 1;
            lim[hi] = sg.len - p.s_q + s + 1;
        }
        const int lim_min = sg.len - p.s_q + 1;

        // The first two tiles (warp 0 of warpgroup 0), Q (warpgroup 1, cp.async).
        if (wg == 0 && issuer) {
            tma_half(p, sg, t0, st0, valid, flags, hb, 0, kv_map, lane, 0, 4);
            tma_half(p, sg, t0, st0, nullptr, nullptr, hb, 0, kv_map, lane, 4, NSUB);
            if (t0 + 1 < t1) {
                tma_half(p, sg, t0 + 1, st1, valid + BN, flags + 8, hb, 1, kv_map, lane, 4, NSUB);
                tma_half(p, sg, t0 + 1, st1, nullptr, nullptr, hb, 1, kv_map, lane, 0, 4);
            }
        }
        if (wg == 1) {
            cp_async_wait<0>();  // this segment's Q, issued before the previous epilogue
            fence_proxy_async();
        }
        bar_sync(SS_Q, 256);
        // Q's rope box into registers (the A fragments of S's last four k steps).
        uint32_t rq8[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const int j = lane >> 3;
            const int row = wwarp * 16 + (lane & 7) + 8 * (j & 1);
            ldsm_x4(sP1 + swz(row, 2 * kk + (j >> 1)), rq8[kk]);
        }

        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        float l[2] = {0.0f, 0.0f}, m_run[2] = {vt::neg_inf(), vt::neg_inf()};
        float s[32];
        uint32_t pk[16];

        if (wg == 0) {
            qk_boxes<T, 0, 4>(s, dq, st0, rq8, true, hb, 0);
            qk_boxes<T, 4, NSUB>(s, dq, st0, rq8, false, hb, 0);
            wgmma_wait<0>();
            pin(s);
            for (int t = t0; t < t1; t += 2) {
                const bool has_b = t + 1 < t1, has_a2 = t + 2 < t1, has_b2 = t + 3 < t1;
                // Softmax of A against the running maximum; O_L rescaled; m_A published.
                float mx[2], bs[2];
                ss_mask_max(s, mx, t, lim_min, lim, valid, flags, qd);
                ss_softmax_a<T>(s, pk, o, mx, bs, m_run, l, c, s_m, r_lo, qd);
                ss_zero_tail(sg, t, st0, wtid, BAR_WG0);
                pv_local<T>(o, pk, st0);
                wgmma_wait<0>();
                pin(o);
                pin(pk);
                // m_B from warpgroup 1: P_A rescaled to it for warpgroup 1's half.
                bar_sync(SS_SCALE1, 256);
                if (has_a2 && issuer) tma_half(p, sg, t + 2, st0, valid, flags, hb, 0, kv_map, lane, 0, 4);
                float a1[2];
                ss_hand_p0<T, MT>(s, pk, o, m_run, l, a1, s_m, sP0, r_lo, wwarp, lane);
                if (has_b) {
                    ss_wait_boxes<0, 4>(hb, 1);  // B's V columns 0..255
                    bar_sync(SS_RO1, 256);  // sP1 written; warpgroup 1 is done with S_B
                    ss_zero_tail(sg, t + 1, st1, wtid, BAR_WG0);
                    pv_remote<T>(o, sP1, st1);
                }
                if (has_a2) qk_boxes<T, 0, 4>(s, dq, st0, rq8, true, hb, 0);
                if (has_b) {
                    if (has_a2) {
                        wgmma_wait<1>();
                    } else {
                        wgmma_wait<0>();
                    }
                    pin(o);
                    if (has_b2 && issuer) tma_half(p, sg, t + 3, st1, nullptr, nullptr, hb, 1, kv_map, lane, 0, 4);
                }
                if (has_a2) qk_boxes<T, 4, NSUB>(s, dq, st0, rq8, false, hb, 0);
                wgmma_wait<0>();
                pin(s);
                pin(o);
            }
        } else {
            if (t0 + 1 < t1) {
                qk_boxes<T, 4, NSUB>(s, dq, st1, rq8, true, hb, 1);
                qk_boxes<T, 0, 4>(s, dq, st1, rq8, false, hb, 1);
                wgmma_wait<0>();
                pin(s);
            }
            for (int t = t0; t < t1; t += 2) {
                const bool has_b = t + 1 < t1, has_a2 = t + 2 < t1, has_b2 = t + 3 < t1;
                float mx[2] = {vt::neg_inf(), vt::neg_inf()};
                if (has_b) ss_mask_max(s, mx, t + 1, lim_min, lim, valid + BN, flags + 8, qd);
                float bs[2], a[2];
                ss_softmax_b<T, MT>(s, pk, o, mx, bs, a, m_run, l, c, s_m, sP1, has_b, r_lo, wwarp, lane, qd);
                if (has_b) {
                    ss_zero_tail(sg, t + 1, st1 + v_half, wtid, BAR_WG1);
                    pv_local<T>(o, pk, st1 + v_half);
                }
                ss_pv_p0<T>(
                    o, sP0, st0 + v_half, has_b,
                    [](BoxBarriers& hb, const Segment& sg, int t, uint32_t v, int wtid) {
                        ss_wait_boxes<4, 8>(hb, 0);  // A's V columns 256..511
                        ss_zero_tail(sg, t, v, wtid, BAR_WG1);
                    },
                    hb, sg, t, st0 + v_half, wtid);
                if (has_b2) {
                    wgmma_wait<1>();  // P_B V_B done: B's hi half is free
                    pin(o);
                    pin(pk);
                    if (issuer) tma_half(p, sg, t + 3, st1, valid + BN, flags + 8, hb, 1, kv_map, lane, 4, NSUB);
                }
                wgmma_wait<0>();
                pin(o);
                pin(pk);
                if (has_a2 && issuer) tma_half(p, sg, t + 2, st0, nullptr, nullptr, hb, 0, kv_map, lane, 4, NSUB);
                if (has_b2) {
                    qk_boxes<T, 4, NSUB>(s, dq, st1, rq8, true, hb, 1);
                    qk_boxes<T, 0, 4>(s, dq, st1, rq8, false, hb, 1);
                    wgmma_wait<0>();
                    pin(s);
                }
            }
        }

        // Row sums: warpgroup 1 hands its half over; warpgroup 0 writes the totals and the
        // final maxima for the copy-out.
        ss_row_sums<MT>(l, m_run, s_fin, wg, r_lo, qd);
        // As in decode_wgmma: the epilogue between two block barriers (both warpgroups done
        // with the stages, no load in flight: every issued tile was consumed).
        __syncthreads();
        Segment next;
        have = next_segment(p, part, nb, pre, next);
        if (have && wg == 1) {
            load_q<T, MT, 128>(p, next.b, row0, sQ, wtid);
            cp_async_commit();
        }
        stage_and_store<T, MT>(p, sg, row0, sKV, so, o, r_lo, qd, 256 * wg, s_fin, wtid, wg ? BAR_WG1 : BAR_WG0,
                               wg == 0);
        __syncthreads();
        sg = next;
    }
}

}  // namespace mla
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
