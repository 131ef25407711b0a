// SparseMlaAttention, the sm_90a prefill kernel: sparse_mla_prefill_{bf16,f16}. Planned by
// crates/vt-cuda/src/sparse_mla_attention.rs (`prefill_plan`). Part of sparse_mla_attention.cu.
// Design: docs/sparse-design.md, step P1 (FlashMLA's sparse prefill, csrc/sm90/prefill/sparse,
// read for its ideas; the code is this project's, its consumers those of the decode seesaw
// kernel, mla_decode_attention/wgmma_seesaw_sm90.cuh).
//
// One CTA per (query token t, group of 64 heads): the whole of t's topk, no split over the
// keys and no partials; out and lse written directly. A 16-bit cache [slots, 576] read by slot
// (the op's block-size-1 view), D = 576, Dv = 512. 384 threads, three warpgroups:
// - warpgroups 0 and 1 (consumers, 216 registers): FlashMLA's seesaw over pairs of 64-key
//   tiles, as decode_wgmma_seesaw runs it: warpgroup 0 computes S for the even tile A (buffer
//   0), warpgroup 1 for the odd tile B (buffer 1); O is split by columns (warpgroup 0 holds
//   O[:, 0:256], warpgroup 1 O[:, 256:512]); each multiplies its own P from registers and the
//   other's through shared memory, so one warpgroup's softmax runs under the other's products.
// - warpgroup 2 (producer, 72 registers): Q, then every tile's rows by cp.async (16 groups of 8
//   threads, 4 rows a group, a 16-byte chunk a thread per 128-byte column block; an index
//   outside 0..slots reads nothing and fills zeros), in half-tiles: L = column blocks 0-3 (dims
//   0-255), R = blocks 4-8 (dims 256-575). Per pair the order is A.L, B.R, A.R, B.L: warpgroup 0
//   computes S(A) from L first, warpgroup 1 S(B) from R first.
//
// Shared memory: Q (9 blocks of 64 x 128 B), two 72 KB buffers, P1 (8 KB), the maxima, the row
// sums, the tiles' token flags, the mbarriers. P0 lies over buffer 0's rope block (block 8),
// which is dead once S(A) is computed and is refilled only after warpgroup 1's product on P0.
//
// Hand-overs:
//   q_full            Q landed                       128 producer arrivals (cp.async, noinc)
//   full[b][h]        half h of buffer b landed      128 producer arrivals (cp.async, noinc)
//   free[b][h]        its readers are done with it   128 arrivals, the last reader's warpgroup:
//                     A.L warpgroup 0 (its P V), A.R warpgroup 1 (P0 V[:, 256:512]), B.L
//                     warpgroup 0 (P1 V[:, 0:256]), B.R warpgroup 1 (its P V); S read every half
//                     earlier (ordered through the exchanges below)
//   vfull[b]          buffer b's token flags written  16 arrivals, the producer groups' leads
//                     (written once the buffer's first half is free: the softmax that reads
//                     the flags comes before its warpgroup's release of that half)
//   SCALE0 / SCALE1 / P0_READY / RO1 / LSUM / FIN: named barriers between the two consumers,
//                     as in the decode seesaw kernel (one side arrives, the other syncs).
// Every mbarrier completes once per pair (free: from the second pair on); each side keeps its
// parity as the pair index. cp.async writes through the generic proxy and wgmma reads through
// the async one: every consumer fences (fence.proxy.async) after its wait on q_full or full, as
// the decode kernels' gather forms do.
#pragma once

#include "mla_decode_attention/wgmma_seesaw_sm90.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace sparse_mla {

using namespace mla;

// The prefill kernel's arguments (one by-value parameter; crates/vt-cuda/src/
// sparse_mla_attention.rs `PrefillParams` has the same layout). Strides in elements.
struct PrefillParams {
    const void* q;        // [T, N, 576]
    void* out;            // [T, N, 512]
    float* lse;           // [N, T] (nullptr: none)
    const void* kv;       // slot s's row at kv + s * kv_row
    const int* indices;   // [T, topk]
    i64 q_st, q_sh, o_st, o_sh, l_sh, l_st, kv_row, i_st, i_sk;
    int t0;               // the first token of this launch (grid.y counts from it)
    int topk;
    int slots;            // valid slots: 0 .. slots - 1
    float scale_log2;
};

constexpr int PF_THREADS = 384;
constexpr int PF_ROWS = 64;  // heads a CTA
// Registers per thread after setmaxnreg: the two consumers, the producer (3 x 168 in all).
constexpr int PF_REGS_CONSUMER = 216, PF_REGS_PRODUCER = 72;
static_assert(2 * PF_REGS_CONSUMER + PF_REGS_PRODUCER <= 3 * 168, "setmaxnreg moves, never adds, registers");

// Named barriers (1..15; SS_* of the seesaw header are 1..6, BAR_WG0 / BAR_WG1 7 / 10).
constexpr int PF_FIN = 8;

// Shared-memory layout (byte offsets from a 1024-aligned base).
struct PrefillLayout {
    static constexpr int OFF_Q = 0;
    static constexpr int OFF_K = NSUB * SUB_BYTES;                // two buffers of TILE_BYTES
    static constexpr int OFF_P1 = OFF_K + 2 * TILE_BYTES;          // [64 x 64] 16-bit, swizzled
    static constexpr int OFF_M = OFF_P1 + PF_ROWS * 128;           // float [2][64]: m_A, m_B
    static constexpr int OFF_L = OFF_M + 2 * PF_ROWS * 4;          // float [2][64]: row sums, final maxima
    static constexpr int OFF_VALID = OFF_L + 2 * PF_ROWS * 4;      // u8 [2][64]
    static constexpr int OFF_MBAR = OFF_VALID + 2 * BN;            // q_full, full[2][2], free[2][2], vfull[2]
    static constexpr int MBARS = 1 + 4 + 4 + 2;
    static constexpr int END = OFF_MBAR + MBARS * 8;
    static constexpr int SMEM = END + 1024;                        // slack to align the base
    // O staged as 16-bit rows at the end, over buffer 0.
    static constexpr int OSTR16 = FDV + 8;                         // elements a staged row
};
static_assert(PrefillLayout::SMEM <= 232448, "fits the 227 KB a block may have");
static_assert(PF_ROWS * PrefillLayout::OSTR16 * 2 <= TILE_BYTES, "O staged in buffer 0");

struct PrefillBars {
    uint32_t base;
    __device__ __forceinline__ uint32_t q_full() const { return base; }
    __device__ __forceinline__ uint32_t full(int b, int h) const { return base + 8 * (1 + 2 * b + h); }
    __device__ __forceinline__ uint32_t free_(int b, int h) const { return base + 8 * (5 + 2 * b + h); }
    __device__ __forceinline__ uint32_t vfull(int b) const { return base + 8 * (9 + b); }
};

// 16 bytes global -> shared as cp_async16, with an L2 policy (createpolicy: the gathered kv
// kept in L2, where a prefill's tokens re-read it) and a 256-byte L2 prefetch.
__device__ __forceinline__ void cp_async16_hint(uint32_t dst, const void* src, bool valid, uint64_t policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0), "l"(policy)
                 : "memory");
}
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}

// Arrives on `bar` once all of this thread's earlier cp.async copies have landed, without
// counting as a pending arrival of its own (the barrier's count holds these arrivals).
__device__ __forceinline__ void mbar_arrive_cp_async_noinc(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// The producer warpgroup: thread (group g, lane8) copies rows 4 g .. 4 g + 3 of each tile,
// 16-byte chunk lane8 of each 128-byte column block.
template <typename T> struct PrefillGather {
    const T* kv;
    const int* idx;  // this token's indices row
    i64 kv_row, i_sk;
    int topk, slots, g, lane8;
    uint64_t policy;  // L2 evict_last

    // The four indices of tile `tile` for this group's rows as loaded (-1 past topk), requested
    // a pair ahead of their use; `usable` checks them there, so the request waits on nothing.
    __device__ __forceinline__ void request(int tile, int (&raw)[4]) const {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int k = tile * BN + 4 * g + i;
            raw[i] = k < topk ? __ldg(idx + (i64)k * i_sk) : -1;
        }
    }
    // The slots of `raw` that exist (-1 for none: negative, or outside the cache).
    __device__ __forceinline__ void usable(int (&raw)[4]) const {
#pragma unroll
        for (int i = 0; i < 4; ++i) raw[i] = raw[i] >= 0 && raw[i] < slots ? raw[i] : -1;
    }
    // Column blocks [CB0, CB1) of the four rows (slots sl) into the buffer at dst.
    template <int CB0, int CB1>
    __device__ __forceinline__ void copy(uint32_t dst, const int (&sl)[4]) const {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = 4 * g + i;
            const bool ok = sl[i] >= 0;
            const T* src = kv + (ok ? (i64)sl[i] * kv_row : 0) + 8 * lane8;
#pragma unroll
            for (int cb = CB0; cb < CB1; ++cb)
                cp_async16_hint(dst + cb * SUB_BYTES + swz(r, lane8), src + 64 * cb, ok, policy);
        }
    }
    // The group's four token flags for a buffer (its lead only), then the lead's arrival.
    __device__ __forceinline__ void publish(unsigned char* valid, const int (&sl)[4], uint32_t vbar) const {
        if (lane8 == 0) {
#pragma unroll
            for (int i = 0; i < 4; ++i) valid[4 * g + i] = sl[i] >= 0 ? 1 : 0;
            mbar_arrive(vbar);
        }
    }
};

// S = Q K^T over column blocks [CB0, CB1) of the buffer at kst (all from shared memory), one
// commit group after waiting `bar`; the first k step overwrites S when fresh.
template <typename T, int CB0, int CB1>
__device__ __forceinline__ void pf_qk(float (&s)[32], const GmmaDesc& dq, uint32_t kst, bool fresh, uint32_t bar,
                                      int parity) {
    mbar_wait(bar, parity);
    fence_proxy_async();  // written by cp.async (generic proxy), read by wgmma (async proxy)
    const GmmaDesc dk(kst, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int cb = CB0; cb < CB1; ++cb)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const uint32_t o16 = (uint32_t)((cb * SUB_BYTES + kk * 32) >> 4);
            Wg<T>::qk(s, dq.at(o16), dk.at(o16), (fresh && cb == CB0 && kk == 0) ? 0 : 1);
        }
    wgmma_commit();
}

// Masks S's columns whose token flag is 0 (-inf) and returns the raw row maxima of this
// thread's two rows (quad-reduced).
__device__ __forceinline__ void pf_mask_max(float (&s)[32], float (&mx)[2], const unsigned char* vst, int qd) {
    const int lim[2] = {2147483647, 2147483647};
    mask_row_max(s, mx, false, 0, lim, [&](int col) { return vst[col] != 0; }, qd);
}

// Each consumer's epilogue: O[:, col0 .. col0 + 255] / l (16-bit) staged in buffer 0 as rows of
// OSTR16 elements, then copied out in 16-byte chunks; warpgroup 0 also writes lse.
template <typename T>
__device__ __forceinline__ void pf_store(const PrefillParams& p, int t, int h0, uint32_t stage, const T* so,
                                         const float (&o)[128], const float* l_tot, const float* m_fin, int r_lo,
                                         int qd, int col0, int wtid, int bar, bool with_lse) {
    constexpr int S = PrefillLayout::OSTR16;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const int r = r_lo + 8 * hi;
        const float l = l_tot[r];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int i = 0; i < 32; ++i)
            st_shared_u32(stage + (r * S + col0 + 8 * i + 2 * qd) * 2,
                          pack2<T>(o[4 * i + 2 * hi] * inv, o[4 * i + 2 * hi + 1] * inv));
    }
    bar_sync(bar, 128);
    T* out = (T*)p.out + (i64)t * p.o_st + (i64)h0 * p.o_sh;
    for (int idx = wtid; idx < PF_ROWS * 32; idx += 128) {
        const int r = idx >> 5, c = col0 + 8 * (idx & 31);
        *reinterpret_cast<uint4*>(out + r * p.o_sh + c) = *reinterpret_cast<const uint4*>(so + r * S + c);
    }
    if (with_lse && p.lse != nullptr && wtid < PF_ROWS) {
        const float l = l_tot[wtid];
        p.lse[(i64)(h0 + wtid) * p.l_sh + (i64)t * p.l_st] = l > 0.0f ? (m_fin[wtid] + log2f(l)) * LN2 : vt::neg_inf();
    }
}

template <typename T> __device__ void prefill_sm90(const PrefillParams& p) {
    using L = PrefillLayout;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = align1024(smem_raw);
    const uint32_t base = smem_u32(smem);
    const uint32_t sQ = base + L::OFF_Q, st0 = base + L::OFF_K, st1 = st0 + TILE_BYTES;
    const uint32_t sP0 = st0 + (NSUB - 1) * SUB_BYTES, sP1 = base + L::OFF_P1;
    float* s_m = (float*)(smem + L::OFF_M);  // [0][r] m_A, [1][r] m_B of the current pair
    float* s_l = (float*)(smem + L::OFF_L);  // ss_row_sums: [0][r] the totals, [1][r] the final maxima
    unsigned char* valid = smem + L::OFF_VALID;
    const PrefillBars bars{base + L::OFF_MBAR};
    if (threadIdx.x == 0) {
        mbar_init(bars.q_full(), 128);
#pragma unroll
        for (int b = 0; b < 2; ++b) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mbar_init(bars.full(b, h), 128);
                mbar_init(bars.free_(b, h), 128);
            }
            mbar_init(bars.vfull(b), 16);
        }
    }
    __syncthreads();  // initialized before any arrival

    const int wg = threadIdx.x >> 7, wtid = threadIdx.x & 127;
    const int wwarp = wtid >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, qd = lane & 3;
    const int r_lo = wwarp * 16 + g;
    const int t = p.t0 + (int)blockIdx.y, h0 = (int)blockIdx.x * PF_ROWS;
    const int tiles = (p.topk + BN - 1) / BN;
    const int pairs = (tiles + 1) / 2;

    if (wg == 2) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PF_REGS_PRODUCER) : "memory");
        // Q: 64 rows x 72 chunks.
        const T* q = (const T*)p.q + (i64)t * p.q_st + (i64)h0 * p.q_sh;
        for (int idx = wtid; idx < PF_ROWS * CHUNKS; idx += 128) {
            const int r = idx / CHUNKS, c = idx - r * CHUNKS;
            cp_async16(sQ + (c >> 3) * SUB_BYTES + swz(r, c & 7), q + r * p.q_sh + 8 * c, true);
        }
        mbar_arrive_cp_async_noinc(bars.q_full());
        const PrefillGather<T> ga{(const T*)p.kv, p.indices + (i64)t * p.i_st, p.kv_row, p.i_sk, p.topk,
                                  p.slots,    wtid >> 3,  wtid & 7, l2_evict_last_policy()};
        int sa[4], sb[4];
        ga.request(0, sa);
        ga.request(1, sb);
        for (int k = 0; k < pairs; ++k) {
            const bool has_b = 2 * k + 1 < tiles;
            const int par = (k - 1) & 1;  // the previous pair's release
            ga.usable(sa);
            ga.usable(sb);
            // A.L (and A's flags), B.R (and B's flags), A.R, B.L.
            if (k > 0) mbar_wait(bars.free_(0, 0), par);
            ga.publish(valid, sa, bars.vfull(0));
            ga.template copy<0, 4>(st0, sa);
            mbar_arrive_cp_async_noinc(bars.full(0, 0));
            if (has_b) {
                if (k > 0) mbar_wait(bars.free_(1, 1), par);
                ga.publish(valid + BN, sb, bars.vfull(1));
                ga.template copy<4, NSUB>(st1, sb);
                mbar_arrive_cp_async_noinc(bars.full(1, 1));
            }
            if (k > 0) mbar_wait(bars.free_(0, 1), par);
            ga.template copy<4, NSUB>(st0, sa);
            mbar_arrive_cp_async_noinc(bars.full(0, 1));
            if (has_b) {
                if (k > 0) mbar_wait(bars.free_(1, 0), par);
                ga.template copy<0, 4>(st1, sb);
                mbar_arrive_cp_async_noinc(bars.full(1, 0));
            }
            if (k + 1 < pairs) {  // the next pair's indices, in flight behind this pair's waits
                ga.request(2 * k + 2, sa);
                ga.request(2 * k + 3, sb);
            }
        }
        // Waits for the committed groups (Q's) only; the gathers are uncommitted (noinc mbarrier
        // arrivals) and complete before the consumers' waits on them end.
        cp_async_wait<0>();
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(PF_REGS_CONSUMER) : "memory");
    const GmmaDesc dq(sQ, 16, 1024);
    const float c = p.scale_log2;
    constexpr uint32_t v_half = 4 * SUB_BYTES;  // warpgroup 1's V columns in a buffer
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    float l[2] = {0.0f, 0.0f}, m_run[2] = {vt::neg_inf(), vt::neg_inf()};
    float s[32];
    uint32_t pk[16];
    mbar_wait(bars.q_full(), 0);
    fence_proxy_async();  // Q: written by cp.async, read by wgmma

    if (wg == 0) {
        pf_qk<T, 0, 4>(s, dq, st0, true, bars.full(0, 0), 0);
        pf_qk<T, 4, NSUB>(s, dq, st0, false, bars.full(0, 1), 0);
        wgmma_wait<0>();
        pin(s);
        for (int k = 0; k < pairs; ++k) {
            const int par = k & 1;
            const bool has_b = 2 * k + 1 < tiles, has_a2 = k + 1 < pairs;
            // Softmax of A against the running maximum; O_L rescaled; m_A published.
            mbar_wait(bars.vfull(0), par);
            float mx[2], bs[2];
            pf_mask_max(s, mx, valid, qd);
            ss_softmax_a<T>(s, pk, o, mx, bs, m_run, l, c, s_m, r_lo, qd);
            pv_local<T>(o, pk, st0);
            wgmma_wait<0>();
            pin(o);
            pin(pk);
            mbar_arrive(bars.free_(0, 0));  // A.L: S(A) and P_A V done
            // m_B from warpgroup 1: P_A rescaled to it for warpgroup 1's half (P0).
            bar_sync(SS_SCALE1, 256);
            float a1[2];  // P0 over A's rope block: S(A) is done with it
            ss_hand_p0<T, PF_ROWS>(s, pk, o, m_run, l, a1, s_m, sP0, r_lo, wwarp, lane);
            if (has_b) {
                mbar_wait(bars.full(1, 0), par);  // B's V columns 0..255 (landed: S(B) read them)
                fence_proxy_async();
                bar_sync(SS_RO1, 256);            // P1 written; warpgroup 1 is done with S(B)
                pv_remote<T>(o, sP1, st1);
            }
            if (has_a2) pf_qk<T, 0, 4>(s, dq, st0, true, bars.full(0, 0), par ^ 1);
            if (has_b) {
                if (has_a2) {
                    wgmma_wait<1>();
                } else {
                    wgmma_wait<0>();
                }
                pin(o);
                mbar_arrive(bars.free_(1, 0));  // B.L: P1 V[:, 0:256] done
            }
            if (has_a2) pf_qk<T, 4, NSUB>(s, dq, st0, false, bars.full(0, 1), par ^ 1);
            wgmma_wait<0>();
            pin(s);
            pin(o);
        }
    } else {
        if (tiles > 1) {
            pf_qk<T, 4, NSUB>(s, dq, st1, true, bars.full(1, 1), 0);
            pf_qk<T, 0, 4>(s, dq, st1, false, bars.full(1, 0), 0);
            wgmma_wait<0>();
            pin(s);
        }
        for (int k = 0; k < pairs; ++k) {
            const int par = k & 1;
            const bool has_b = 2 * k + 1 < tiles, has_b2 = 2 * k + 3 < tiles;
            float mx[2] = {vt::neg_inf(), vt::neg_inf()};
            if (has_b) {
                mbar_wait(bars.vfull(1), par);
                pf_mask_max(s, mx, valid + BN, qd);
            }
            float bs[2], a[2];
            ss_softmax_b<T, PF_ROWS>(s, pk, o, mx, bs, a, m_run, l, c, s_m, sP1, has_b, r_lo, wwarp, lane, qd);
            if (has_b) pv_local<T>(o, pk, st1 + v_half);
            ss_pv_p0<T>(
                o, sP0, st0 + v_half, has_b,
                [](uint32_t full01, int par) {
                    mbar_wait(full01, par);  // A's V columns 256..511 (landed: S(A) read them)
                    fence_proxy_async();
                },
                bars.full(0, 1), par);
            if (has_b) {
                wgmma_wait<1>();
                pin(o);
                pin(pk);
                mbar_arrive(bars.free_(1, 1));  // B.R: S(B) and P_B V done
            }
            wgmma_wait<0>();
            pin(o);
            pin(pk);
            mbar_arrive(bars.free_(0, 1));  // A.R (and P0): P0 V[:, 256:512] done
            if (has_b2) {
                pf_qk<T, 4, NSUB>(s, dq, st1, true, bars.full(1, 1), par ^ 1);
                pf_qk<T, 0, 4>(s, dq, st1, false, bars.full(1, 0), par ^ 1);
                wgmma_wait<0>();
                pin(s);
            }
        }
    }

    // Row sums (ss_row_sums over s_l: totals in s_l[r], the final maxima in s_l[64 + r]); both
    // warpgroups then normalize and store their columns from buffer 0 (every product is
    // complete: each warpgroup waited for its last group before the exchange, and every copy
    // was consumed). Warpgroup 0's quad leaders wrote the totals: warpgroup 0 syncs before
    // reading them, warpgroup 1 waits for PF_FIN.
    ss_row_sums<PF_ROWS>(l, m_run, s_l, wg, r_lo, qd);
    if (wg == 1) {
        bar_sync(PF_FIN, 256);
    } else {
        bar_arrive(PF_FIN, 256);
        bar_sync(BAR_WG0, 128);
    }
    pf_store<T>(p, t, h0, st0, reinterpret_cast<const T*>(smem + L::OFF_K), o, s_l, s_l + PF_ROWS, r_lo, qd,
                256 * wg, wtid, wg ? BAR_WG1 : BAR_WG0, wg == 0);
}

}  // namespace sparse_mla
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
