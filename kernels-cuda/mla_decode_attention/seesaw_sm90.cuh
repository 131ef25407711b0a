// MlaDecodeAttention, sm_90a "seesaw" kernel: both warpgroups compute scores, on
// alternating KV tiles, and each owns half of the output columns.
//
// Planned by crates/vt-cuda/src/mla_decode_attention/seesaw_sm90.rs; part of
// mla_decode_attention.cu, after wgmma_sm90.cuh (it reuses its TMA tile loader, wgmma
// wrappers and epilogue). Not chosen by Auto: it measured slower than wgmma_sm90.cuh's kernel
// (docs/perf.md, decode v12); kept as the base of the per-box pipeline that comes next. 64 query rows per CTA, 256 threads = two warpgroups, the
// cache loaded through the TMA (block sizes that are multiples of 64), two KV stages.
//
// KV tiles come in pairs (a = even, stage 0; b = odd, stage 1). Warpgroup 0 owns tile a and
// O[:, 0:256]; warpgroup 1 owns tile b and O[:, 256:512]. Per pair:
//
//   WG0: S_a = Q K_a^T | softmax (running max m -> m_a) | P_a -> smem, m_a, alpha_a -> smem
//        | O_L = O_L alpha_a + P_a V_a[:, L] (P_a from registers) | wait for P_b
//        | O_L = O_L alpha_b + P_b V_b[:, L] (P_b from smem)
//   WG1: S_b = Q K_b^T, masked row max | wait for P_a | O_R = O_R alpha_a + P_a V_a[:, R]
//        (issued, runs under:) softmax of S_b against m_a -> P_b, m_b, alpha_b -> smem
//        | reload stage 0 | O_R = O_R alpha_b + P_b V_b[:, R] (registers) | reload stage 1
//
// so each warpgroup's softmax runs while the other's (or its own) products are on the
// tensor cores, and both score chains are in flight at the start of a pair. The running
// max travels WG0 -> WG1 (m_a) -> WG0 (m_b); each warpgroup rescales its own half of O and
// its own partial row sums with the same factors, so at the end both halves are relative
// to the same max and the row sum is the sum of the two partial sums.
//
// P of a tile is stored in that tile's own rope column block (features 512..575, 64 tokens
// x 128 bytes, the layout of a 64 x 64 16-bit operand): once the owner's S is computed the
// rope part of K is dead and V never reads it, so no shared memory is spent on P. A stage
// is reloaded (tile + 2) as soon as both warpgroups' products with it are done, which for
// stage 0 is in the middle of the pair.
//
// Named barriers (bar.arrive by the producer warpgroup, bar.sync by the consumer, 256
// threads): P0 (P_a, m_a, alpha_a written), P1 (P_b, m_b, alpha_b written), FREE0 / FREE1
// (warpgroup 0 done with stage 0 / 1; warpgroup 1 then issues the reload), per-warpgroup
// 128-thread barriers, and EPI (both done with the stages, partial row sums written).
// Every barrier's next use is ordered after its previous completion by the pair's chain
// (see the comments at each), so no ids alternate.

#pragma once

#include "mla_decode_attention/wgmma_sm90.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace mla {
namespace seesaw {

constexpr int MT = 64;

// Byte offsets from a 1024-aligned base. Q and the two KV stages as in the wgmma kernel;
// X: the per-row floats the warpgroups exchange.
struct Layout {
    static constexpr int OFF_Q = 0;
    static constexpr int OFF_KV = NSUB * MT * 128;
    static constexpr int OFF_X = OFF_KV + 2 * TILE_BYTES;
    static constexpr int X_FLOATS = 10 * MT;
    static constexpr int OFF_VALID = OFF_X + X_FLOATS * 4;     // u8 [2][BN]: token row exists
    static constexpr int OFF_FLAGS = OFF_VALID + 2 * BN;       // u8 [2][8]: a bad block was seen
    static constexpr int OFF_SCHED = OFF_FLAGS + 2 * 8;        // int [40]
    static constexpr int OFF_MBAR = OFF_SCHED + 40 * 4;        // u64 [2]: the stage's tile landed
    static constexpr int END = OFF_MBAR + 2 * 8;
    static constexpr int SMEM = END + 1024;                     // slack to align the base
};
static_assert(Layout::SMEM <= 232448, "fits the 227 KB a block may have");
static_assert(Layout::OFF_MBAR % 8 == 0, "mbarriers are 8-byte aligned");
static_assert(MT * OSTR * 4 <= 2 * TILE_BYTES, "O is staged in the two KV stages");

// Float offsets in X: m_a, alpha_a, m_b, alpha_b, the two warpgroups' row sums, and each
// warpgroup's copy of (row sum, max) for its epilogue.
constexpr int X_MA = 0, X_AA = MT, X_MB = 2 * MT, X_AB = 3 * MT, X_L0 = 4 * MT, X_L1 = 5 * MT;
constexpr int X_FIN0 = 6 * MT, X_FIN1 = 8 * MT;

constexpr int BAR_P0 = 1, BAR_P1 = 2, BAR_FREE0 = 3, BAR_FREE1 = 4, BAR_WG = 5 /* + wg */, BAR_EPI = 7;

// O[:, 256 columns] += P V with P from registers (the A fragments of m64n256k16, k-step ks
// = pk[4 ks .. 4 ks + 3]) and V transposed from shared memory.
#define VT_WGMMA_M64N256K16_RS_TB(NAME, TY)                                                             \
    __device__ __forceinline__ void NAME(float (&d)[128], const uint32_t* a, uint64_t db) {            \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                   \
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " "                       \
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n" \
                     : VT_ACC32(0), VT_ACC32(32), VT_ACC32(64), VT_ACC32(96)                            \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));                   \
    }
VT_WGMMA_M64N256K16_RS_TB(wgmma_m64n256k16_rs_bf16_tb, "bf16")
VT_WGMMA_M64N256K16_RS_TB(wgmma_m64n256k16_rs_f16_tb, "f16")

template <typename T> struct Rs;
template <> struct Rs<bf16> {
    static __device__ __forceinline__ void pv(float (&d)[128], const uint32_t* a, uint64_t b) {
        wgmma_m64n256k16_rs_bf16_tb(d, a, b);
    }
};
template <> struct Rs<f16> {
    static __device__ __forceinline__ void pv(float (&d)[128], const uint32_t* a, uint64_t b) {
        wgmma_m64n256k16_rs_f16_tb(d, a, b);
    }
};

// S = Q K^T for one tile (36 m64n64k16 from shared memory), waited.
template <typename T>
__device__ __forceinline__ void scores(float (&s)[32], uint64_t dq, uint32_t kst) {
    const uint64_t dk = gmma_desc(kst, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < FD / 16; ++ks) {
        // Column block ks / 4 (8 KB apart in Q and K), 32 bytes per k step inside it.
        const uint64_t o16 = (uint64_t)(((ks >> 2) * SUB_BYTES + (ks & 3) * 32) >> 4);
        Wg<T>::qk(s, dq + o16, dk + o16, ks > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    pin(s);
}

// Issues O += P V with P in registers (not waited: the caller waits before touching o or pk).
template <typename T>
__device__ __forceinline__ void pv_regs_issue(float (&o)[128], uint32_t (&pk)[16], uint32_t v_base) {
    const uint64_t dv = gmma_desc(v_base, SUB_BYTES, 1024);
    pin(o);
    pin(pk);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) Rs<T>::pv(o, pk + 4 * ks, dv + 128 * ks);  // +2048 B per k step
    wgmma_commit();
}

// Issues O += P V with P in shared memory at sp (64 rows x 128 B, swizzled; not waited).
template <typename T>
__device__ __forceinline__ void pv_smem_issue(float (&o)[128], uint32_t sp, uint32_t v_base) {
    const uint64_t dp = gmma_desc(sp, 16, 1024);
    const uint64_t dv = gmma_desc(v_base, SUB_BYTES, 1024);
    pin(o);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) Wg<T>::pv(o, dp + 2 * ks, dv + 128 * ks);  // +32 B, +2048 B
    wgmma_commit();
}

template <int N> __device__ __forceinline__ void pv_wait(float (&o)[N]) {
    wgmma_wait<0>();
    pin(o);
}

// Masks the scores of tile t in place (tokens that do not exist or that a row may not see
// get -inf) and returns this thread's raw row maxima, reduced over the quad.
__device__ __forceinline__ void mask_max(float (&s)[32], int t, const int (&lim)[2], int lim_min,
                                         const unsigned char* vst, const unsigned char* fst, int qd,
                                         float (&mx)[2]) {
    mx[0] = mx[1] = vt::neg_inf();
    if (tile_is_full(t, lim_min, fst)) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            mx[0] = fmaxf(mx[0], fmaxf(s[4 * i], s[4 * i + 1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[4 * i + 2], s[4 * i + 3]));
        }
    } else {
        const int tok0 = t * BN;
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int col = 8 * i + 2 * qd + (j & 1);
                const int hi = j >> 1;
                const bool ok = vst[col] != 0 && tok0 + col < lim[hi];
                s[4 * i + j] = ok ? s[4 * i + j] : vt::neg_inf();
                mx[hi] = fmaxf(mx[hi], s[4 * i + j]);
            }
    }
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 1));
        mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 2));
    }
}

// Softmax of one masked tile against the running max m (log2 domain, raw scores times c):
// m becomes the new max, alpha the factor for what was accumulated at the old one; P
// packed as A fragments; sum: this thread's share of the tile's row sums.
template <typename T>
__device__ __forceinline__ void softmax(const float (&s)[32], const float (&mx)[2], float c, float (&m)[2],
                                        float (&alpha)[2], uint32_t (&pk)[16], float (&sum)[2]) {
    float muse[2];
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const float mn = fmaxf(m[hi], mx[hi] * c);
        muse[hi] = mn == vt::neg_inf() ? 0.0f : mn;
        alpha[hi] = exp2f(m[hi] - muse[hi]);
        m[hi] = mn;
        sum[hi] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const float p0 = exp2f(fmaf(s[4 * i + 2 * hi], c, -muse[hi]));
            const float p1 = exp2f(fmaf(s[4 * i + 2 * hi + 1], c, -muse[hi]));
            sum[hi] += p0 + p1;
            pk[2 * i + hi] = pack2<T>(p0, p1);
        }
}

// Stores P (the A fragments) as a 64 x 64 16-bit operand at sp (64 rows x 128 B, swizzled).
__device__ __forceinline__ void store_p(uint32_t sp, const uint32_t (&pk)[16], int r_lo, int qd) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) st_shared_u32(sp + swz(r_lo + 8 * hi, i) + qd * 4, pk[2 * i + hi]);
}

// Rows of tile t past the sequence's last token came from a real page (the TMA copies whole
// boxes) and may hold anything, NaN included: their weights are 0, but 0 x NaN is not, so
// their V part (columns 0..511) is zeroed before either product. Returns whether it did.
__device__ __forceinline__ bool zero_tail(const Segment& sg, int t, uint32_t kst, int wtid) {
    if (t * BN + BN <= sg.len) return false;
    const int first = sg.len - t * BN;
    for (int idx = wtid; idx < (BN - first) * 64; idx += 128) {
        const int r = first + (idx >> 6), c = idx & 63;  // c: 16-byte chunk of 64
        st_shared_v4_zero(kst + (c >> 3) * SUB_BYTES + swz(r, c & 7));
    }
    return true;
}

template <typename T>
__device__ void decode_seesaw(const Params& p, const TmaMap* kv_map) {
    using L = Layout;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = align1024(smem_raw);
    const uint32_t base = smem_u32(smem);
    const uint32_t sQ = base + L::OFF_Q;
    const uint32_t sK[2] = {base + L::OFF_KV, base + L::OFF_KV + TILE_BYTES};
    float* x = (float*)(smem + L::OFF_X);
    unsigned char* valid = smem + L::OFF_VALID;
    unsigned char* flags = smem + L::OFF_FLAGS;
    int* sched = (int*)(smem + L::OFF_SCHED);
    const float* so = reinterpret_cast<const float*>(smem + L::OFF_KV);  // O staged at the end
    const uint32_t sBar = base + L::OFF_MBAR;
    if (threadIdx.x == 0) {
        mbar_init(sBar, 1);
        mbar_init(sBar + 8, 1);
    }
    __syncthreads();
    // Every thread waits on every tile loaded into either stage exactly once (its own tiles
    // before S, the other warpgroup's before its product with their V), so one parity bit
    // per stage tracks the phases.
    uint32_t phases = 0;
    auto tile_wait = [&](int st) {
        mbar_wait(sBar + 8 * st, (phases >> st) & 1);
        phases ^= 1u << st;
    };
    grid_dep_launch();

    const int wg = threadIdx.x >> 7, wtid = threadIdx.x & 127;
    const int wwarp = wtid >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, qd = lane & 3;
    const int row0 = blockIdx.y * MT;
    const int r_lo = wwarp * 16 + g;  // this thread's rows: r_lo, r_lo + 8 (the same in both warpgroups)
    const float c = p.scale_log2;
    const uint64_t dq = gmma_desc(sQ, 16, 1024);
    // Warp 0 of warpgroup 1 issues every TMA load.
    const bool loader = wg == 1 && wwarp == 0;
    auto load = [&](const Segment& sg, int t, int st) {
        tma_tile<T>(p, sg, t, sK[st], valid + st * BN, flags + st * 8, sBar + 8 * st, kv_map, lane);
    };

    const Part part = find_part(p, sched);
    int nb = part.b;
    i64 pre = part.pre;
    Segment sg;
    while (next_segment(p, part, nb, pre, sg)) {
        const int t0 = sg.t0, t1 = sg.t1;
        if (loader) {
            load(sg, t0, 0);
            if (t0 + 1 < t1) load(sg, t0 + 1, 1);
        }
        load_q<T, MT, 256>(p, sg.b, row0, sQ, threadIdx.x);
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();  // Q is read by wgmma (async proxy)
        __syncthreads();

        int lim[2];
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int r = row0 + r_lo + 8 * hi;
            const int s = r < p.m_total ? r / p.N : p.s_q - 1;
            lim[hi] = sg.len - p.s_q + s + 1;
        }
        const int lim_min = sg.len - p.s_q + 1;
        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        // m: warpgroup 0's running max (after each pair); warpgroup 1's max of the pair.
        float m[2] = {vt::neg_inf(), vt::neg_inf()}, l[2] = {0.0f, 0.0f};

        for (int ta = t0; ta < t1; ta += 2) {
            const int tb = ta + 1;
            const bool has_b = tb < t1;
            if (wg == 0) {
                tile_wait(0);
                float s[32];
                scores<T>(s, dq, sK[0]);
                bar_sync(BAR_WG, 128);  // every warp's S is done: K_a's rope block may take P_a
                float mx[2], alpha[2], sum[2];
                mask_max(s, ta, lim, lim_min, valid, flags, qd, mx);
                uint32_t pk[16];
                softmax<T>(s, mx, c, m, alpha, pk, sum);
                const bool zeroed = zero_tail(sg, ta, sK[0], wtid);
                store_p(sK[0] + 8 * SUB_BYTES, pk, r_lo, qd);
                if (qd == 0) {
                    x[X_MA + r_lo] = m[0];
                    x[X_MA + r_lo + 8] = m[1];
                    x[X_AA + r_lo] = alpha[0];
                    x[X_AA + r_lo + 8] = alpha[1];
                }
                fence_proxy_async();  // P_a and the zeroed rows are read by wgmma
                if (zeroed) bar_sync(BAR_WG, 128);  // this warpgroup's product reads every warp's zeros
                // (Next use: after warpgroup 1 passed this one, see FREE0.)
                bar_arrive(BAR_P0, 256);
#pragma unroll
                for (int hi = 0; hi < 2; ++hi) l[hi] = l[hi] * alpha[hi] + sum[hi];
                rescale(o, alpha[0], alpha[1]);
                pv_regs_issue<T>(o, pk, sK[0]);
                pv_wait(o);
                // Warpgroup 1 reloads stage 0 once its own product with V_a is done too.
                if (ta + 2 < t1) bar_arrive(BAR_FREE0, 256);
                if (has_b) {
                    tile_wait(1);
                    bar_sync(BAR_P1, 256);
                    const float ab[2] = {x[X_AB + r_lo], x[X_AB + r_lo + 8]};
                    m[0] = x[X_MB + r_lo];
                    m[1] = x[X_MB + r_lo + 8];
#pragma unroll
                    for (int hi = 0; hi < 2; ++hi) l[hi] *= ab[hi];
                    rescale(o, ab[0], ab[1]);
                    pv_smem_issue<T>(o, sK[1] + 8 * SUB_BYTES, sK[1]);
                    pv_wait(o);
                    if (tb + 2 < t1) bar_arrive(BAR_FREE1, 256);
                }
            } else {
                float s[32], mx[2] = {vt::neg_inf(), vt::neg_inf()};
                if (has_b) {
                    tile_wait(1);
                    scores<T>(s, dq, sK[1]);
                    bar_sync(BAR_WG + 1, 128);  // every warp's S is done: K_b's rope block may take P_b
                    mask_max(s, tb, lim, lim_min, valid + BN, flags + 8, qd, mx);
                }
                tile_wait(0);
                bar_sync(BAR_P0, 256);
                m[0] = x[X_MA + r_lo];
                m[1] = x[X_MA + r_lo + 8];
                const float aa[2] = {x[X_AA + r_lo], x[X_AA + r_lo + 8]};
#pragma unroll
                for (int hi = 0; hi < 2; ++hi) l[hi] *= aa[hi];
                rescale(o, aa[0], aa[1]);
                pv_smem_issue<T>(o, sK[0] + 8 * SUB_BYTES, sK[0] + 4 * SUB_BYTES);
                uint32_t pk[16];
                float ab[2] = {1.0f, 1.0f}, sum[2] = {0.0f, 0.0f};
                if (has_b) {
                    // Under the product above: the softmax of S_b against m_a.
                    softmax<T>(s, mx, c, m, ab, pk, sum);
                    const bool zeroed = zero_tail(sg, tb, sK[1], wtid);
                    store_p(sK[1] + 8 * SUB_BYTES, pk, r_lo, qd);
                    if (qd == 0) {
                        x[X_MB + r_lo] = m[0];
                        x[X_MB + r_lo + 8] = m[1];
                        x[X_AB + r_lo] = ab[0];
                        x[X_AB + r_lo + 8] = ab[1];
                    }
                    fence_proxy_async();
                    if (zeroed) bar_sync(BAR_WG + 1, 128);
                    // (Next use: after warpgroup 0 passed P0 of the next pair, which follows
                    // its sync here.)
                    bar_arrive(BAR_P1, 256);
                }
                pv_wait(o);
                if (ta + 2 < t1) {
                    // (Next use of FREE0: warpgroup 0's S of tile a + 2, loaded only now.)
                    bar_sync(BAR_FREE0, 256);
                    if (loader) load(sg, ta + 2, 0);
                }
                if (has_b) {
#pragma unroll
                    for (int hi = 0; hi < 2; ++hi) l[hi] = l[hi] * ab[hi] + sum[hi];
                    rescale(o, ab[0], ab[1]);
                    pv_regs_issue<T>(o, pk, sK[1] + 4 * SUB_BYTES);
                    pv_wait(o);
                    if (tb + 2 < t1) {
                        bar_sync(BAR_FREE1, 256);
                        if (loader) load(sg, tb + 2, 1);
                    }
                }
            }
        }

        // Both halves are relative to the same max m; the row sum is l0 + l1.
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            float v = l[hi];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            if (qd == 0) x[(wg == 0 ? X_L0 : X_L1) + r_lo + 8 * hi] = v;
        }
        bar_sync(BAR_EPI, 256);  // both done with the stages (every product waited); sums written
        float* fin = x + (wg == 0 ? X_FIN0 : X_FIN1);
        if (qd == 0) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const int r = r_lo + 8 * hi;
                fin[r] = x[X_L0 + r] + x[X_L1 + r];
                fin[MT + r] = m[hi];
            }
        }
        // (fin is ordered before the copy-out by the warpgroup barrier inside.)
        stage_and_store<T, MT>(p, sg, row0, sK[0], so, o, r_lo, qd, 256 * wg, fin, wtid, BAR_WG + wg, wg == 0);
        __syncthreads();  // both halves copied out: the stages, Q and X may be reused
    }
}

}  // namespace seesaw
}  // namespace mla

#endif  // __CUDA_ARCH_FEAT_SM90_ALL
