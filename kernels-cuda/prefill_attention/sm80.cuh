// PrefillAttention, sm_80+ mma.sync kernel (FlashAttention-2 class): see
// crates/vt-cuda/src/prefill_attention/sm80.rs. Included by prefill_attention.cu after
// common.cuh and params.cuh.
//
// One CTA = ROWS (128) query rows of one head of one sequence, 8 warps of 16 rows each.
// - Q is copied once (cp.async) into a swizzled tile and each warp keeps its 16 x D A
//   fragments in registers for the whole key loop.
// - K and V tiles of BN (64) keys stream through a ring of STAGES slots (2 at D = 192, 4 at
//   D = 128, 3 at D = 64: at most 160 KB, so an A100's 163 KB fits). K and V of a tile are
//   separate cp.async groups, committed in the order K0 V0 K1 V1 ...: K(t + STAGES) is issued as soon
//   as every warp finished S(t) = Q K(t)^T, V(t + STAGES - 1) as soon as every warp finished
//   O += P V(t - 1), so every copy has about STAGES - 1 iterations to land.
// - S = Q K^T on mma.sync m16n8k16 (f32 accumulate), online softmax in registers in the
//   exp2 domain (a row lives in one quad of lanes), P rounded to 16 bits straight from the
//   S accumulators into A fragments (the m16n8 accumulator pair of keys 16kk.. is exactly
//   the A fragment of k-step kk), O += P V with V read by ldmatrix.trans.
// - Epilogue: O / l into the warp's own rows of the Q tile, then 16-byte coalesced stores.
//
// Every 16-bit row is kept as column blocks of 64 elements ([rows x 128 B], 16-byte chunk
// c of row r at chunk c ^ (r % 8)), so ldmatrix reads 8 rows of one column from 8 distinct
// bank groups.
//
// Keys past the sequence's lk are zero-filled (cp.async src-size 0) and their scores
// masked: rows of other sequences never enter, and 0 * NaN cannot reach O. Query rows past
// lq are zero-filled, computed and never stored.
#pragma once

namespace pf {
namespace sm80 {

// NVRTC has no <cstdint>.
using u32 = unsigned int;
using namespace vt::tc;

constexpr int ROWS = 128;     // query rows per CTA (TILE_ROWS in sm80.rs)
constexpr int BN = 64;        // keys per tile
constexpr int WARPS = ROWS / 16;
constexpr int THREADS = WARPS * 32;
constexpr float LN2 = 0.6931471805599453f;

// Ring depth: about as deep as an A100's 163 KB allows beside Q.
template <int D> struct Stages {
    static constexpr int value = D == 192 ? 2 : D == 128 ? 4 : 3;
};

// Shared-memory layout (bytes from a 128-aligned base); the host adds 128 bytes of slack
// (sm80.rs computes the same sizes).
template <int D, int DV> struct Layout {
    static constexpr int STAGES = Stages<D>::value;
    static constexpr int Q_BYTES = ROWS * D * 2;
    static constexpr int K_BYTES = BN * D * 2;
    static constexpr int V_BYTES = BN * DV * 2;
    static constexpr int OFF_K = Q_BYTES;
    static constexpr int OFF_V = OFF_K + STAGES * K_BYTES;
    static constexpr int END = OFF_V + STAGES * V_BYTES;
    static constexpr int SMEM = END + 128;
    static_assert(SMEM <= 166912, "fits an A100's 163 KB per block");
    static_assert(DV <= D, "the O staging tile fits in the Q tile");
};

// Element chunk c (8 elements) of row r in a swizzled tile of `rows` rows.
__device__ __forceinline__ u32 chunk_off(int rows, int r, int c) {
    return (u32)((c >> 3) * (rows * 128)) + swz(r, c & 7);
}

__device__ __forceinline__ uint4 ld_shared_v4(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}
__device__ __forceinline__ u32 dynamic_smem_size() {
    u32 n;
    asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(n));
    return n;
}


// Copies `rows` rows of W 16-bit elements (row j at src + j * st, present when j < n,
// zero-filled otherwise) into a swizzled tile, from all THREADS threads.
template <typename T, int W, int R>
__device__ __forceinline__ void load_rows(u32 dst, const T* src, i64 st, int n, int tid) {
    constexpr int CH = W / 8;  // 16-byte chunks per row
    static_assert((R * CH) % THREADS == 0, "every thread copies the same number of chunks");
#pragma unroll
    for (int i = 0; i < R * CH / THREADS; ++i) {
        const int idx = i * THREADS + tid;
        const int r = idx / CH, c = idx - r * CH;
        const bool ok = r < n;
        // A clamped address for absent rows: nothing is read from it.
        const T* s = src + (ok ? (i64)r * st : 0) + c * 8;
        cp_async16(dst + chunk_off(R, r, c), s, ok);
    }
}

template <typename T, int D, int DV>
__device__ __forceinline__ void attention(const Params& p) {
    using L = Layout<D, DV>;
    constexpr int S = L::STAGES;
    constexpr int KS = D / 16;   // k-steps of Q K^T
    constexpr int NTV = DV / 8;  // n-tiles of O per warp

    extern __shared__ unsigned char smem_raw[];
    const u32 raw = smem_u32(smem_raw);
    const u32 base = (raw + 127u) & ~127u;
    const u32 sQ = base, sK = base + L::OFF_K, sV = base + L::OFF_V;

    const int b = blockIdx.z, h = blockIdx.y;
    const Seq s = load_seq(p, b);
    const int q0 = blockIdx.x * ROWS;
    if (!s.ok || q0 >= s.lq) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, qd = lane & 3;
    const int nq = min(ROWS, s.lq - q0);
    const int kend = key_end(p, s, q0 + nq);
    const int n_tiles = (kend + BN - 1) / BN;

    const T* qp = (const T*)p.q + (s.qb + q0) * p.q_st + (i64)h * p.q_sh;
    const T* kp = (const T*)p.k + s.kb * p.k_st + (i64)h * p.k_sh;
    const T* vp = (const T*)p.v + s.kb * p.v_st + (i64)h * p.v_sh;

    // Keys of tile j: rows j*BN .. of the sequence, present below lk.
    auto load_k = [&](int j) {
        if (j < n_tiles)
            load_rows<T, D, BN>(sK + (j % S) * L::K_BYTES, kp + (i64)j * BN * p.k_st, p.k_st, s.lk - j * BN, tid);
        cp_async_commit();
    };
    auto load_v = [&](int j) {
        if (j < n_tiles)
            load_rows<T, DV, BN>(sV + (j % S) * L::V_BYTES, vp + (i64)j * BN * p.v_st, p.v_st, s.lk - j * BN, tid);
        cp_async_commit();
    };

    // Groups: Q with K0, then V0 K1 V1 ... K(S-1); V(S-1) is issued in iteration 0. K(j) is
    // group 2j, V(j) group 2j + 1, so both waits below allow 2S - 2 newer groups.
    load_rows<T, D, ROWS>(sQ, qp, p.q_st, nq, tid);
    load_k(0);
#pragma unroll
    for (int j = 0; j < S - 1; ++j) {
        load_v(j);
        load_k(j + 1);
    }
    cp_async_wait<2 * S - 2>();
    __syncthreads();

    // This warp's Q fragments (rows 16 warp.., all of D).
    u32 qf[KS][4];
    {
        const int r = warp * 16 + (lane & 15);
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) ldsm_x4(sQ + chunk_off(ROWS, r, ks * 2 + (lane >> 4)), qf[ks]);
    }

    // Keys visible to this warp's rows (rows past lq do not count: they are not stored), and
    // the smallest row limit (tiles below it need no mask).
    const int r0 = q0 + warp * 16;  // first row of the warp, in the sequence
    const int warp_kend = r0 < s.lq ? key_end(p, s, min(r0 + 16, s.lq)) : 0;
    const int shift = s.lk - s.lq;
    int lim[2];
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const int r = r0 + g + 8 * hi;
        lim[hi] = p.causal ? max(0, min(s.lk, shift + r + 1)) : s.lk;
    }
    const int lim_min = p.causal ? max(0, min(s.lk, shift + r0 + 1)) : s.lk;
    const float c = p.scale_log2;

    float o[NTV][4];
#pragma unroll
    for (int i = 0; i < NTV; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m_run[2] = {vt::neg_inf(), vt::neg_inf()}, l_run[2] = {0.0f, 0.0f};

    for (int t = 0; t < n_tiles; ++t) {
        const u32 kt = sK + (t % S) * L::K_BYTES, vt_ = sV + (t % S) * L::V_BYTES;
        cp_async_wait<2 * S - 2>();  // K(t) landed (this thread's copies)
        __syncthreads();             // everyone's K(t); every warp is past P V(t - 1)
        load_v(t + S - 1);
        const bool active = t * BN < warp_kend;  // warp-uniform: some key of the tile is visible

        float sc[BN / 8][4];
        if (active) {
#pragma unroll
            for (int i = 0; i < BN / 8; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
                for (int np = 0; np < BN / 16; ++np) {
                    u32 bb[4];
                    const int n = np * 16 + (lane & 7) + (lane >> 4) * 8;
                    ldsm_x4(kt + chunk_off(BN, n, ks * 2 + ((lane >> 3) & 1)), bb);
                    MmaSync<T>::run(sc[2 * np], qf[ks], bb[0], bb[1]);
                    MmaSync<T>::run(sc[2 * np + 1], qf[ks], bb[2], bb[3]);
                }
            }
            // Mask keys past each row's limit (sequence end, causal diagonal) on boundary tiles.
            if (t * BN + BN > lim_min) {
#pragma unroll
                for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int key = t * BN + nt * 8 + 2 * qd + (i & 1);
                        if (key >= lim[i >> 1]) sc[nt][i] = vt::neg_inf();
                    }
            }
            float mx[2] = {vt::neg_inf(), vt::neg_inf()};
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) mx[i >> 1] = fmaxf(mx[i >> 1], sc[nt][i]);
            float muse[2], alpha[2];
            quad_max_step(mx, c, m_run, l_run, alpha, muse);
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float e = ex2(fmaf(sc[nt][i], c, -muse[i >> 1]));
                    sc[nt][i] = e;
                    l_run[i >> 1] += e;
                }
#pragma unroll
            for (int i = 0; i < NTV; ++i) {
                o[i][0] *= alpha[0];
                o[i][1] *= alpha[0];
                o[i][2] *= alpha[1];
                o[i][3] *= alpha[1];
            }
        }

        cp_async_wait<2 * S - 2>();  // V(t) landed
        __syncthreads();             // everyone's V(t); every warp is past S(t)
        load_k(t + S);

        if (active) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                u32 a[4];
                a[0] = pack2<T>(sc[2 * kk][0], sc[2 * kk][1]);
                a[1] = pack2<T>(sc[2 * kk][2], sc[2 * kk][3]);
                a[2] = pack2<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
                a[3] = pack2<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
                const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
                for (int np = 0; np < DV / 16; ++np) {
                    u32 bb[4];
                    ldsm_x4_t(vt_ + chunk_off(BN, key, np * 2 + (lane >> 4)), bb);
                    MmaSync<T>::run(o[2 * np], a, bb[0], bb[1]);
                    MmaSync<T>::run(o[2 * np + 1], a, bb[2], bb[3]);
                }
            }
        }
    }
    cp_async_wait<0>();  // only empty groups remain; leave none behind

    // Epilogue: the warp's rows of O / l into its own rows of the Q tile (read only by this
    // warp, and only before the loop), then 16-byte stores of the rows inside the sequence.
    float inv[2];
    quad_row_sums(l_run, inv);
#pragma unroll
    for (int nt = 0; nt < NTV; ++nt)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int r = warp * 16 + g + 8 * hi, col = nt * 8 + 2 * qd;
            st_shared_u32(sQ + chunk_off(ROWS, r, col >> 3) + (col & 7) * 2,
                          pack2<T>(o[nt][2 * hi] * inv[hi], o[nt][2 * hi + 1] * inv[hi]));
        }
    __syncwarp();
    constexpr int OCH = DV / 8;
    T* op = (T*)p.out + (s.qb + q0) * p.o_st + (i64)h * p.o_sh;
#pragma unroll
    for (int i = lane; i < 16 * OCH; i += 32) {
        const int rr = i / OCH, cc = i - rr * OCH;
        const int r = warp * 16 + rr;
        if (r < nq) {
            const uint4 v = ld_shared_v4(sQ + chunk_off(ROWS, r, cc));
            *reinterpret_cast<uint4*>(op + (i64)r * p.o_st + cc * 8) = v;
        }
    }
    if (p.lse != nullptr && qd == 0) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int r = warp * 16 + g + 8 * hi;
            if (r < nq)
                p.lse[(i64)h * p.l_sh + (s.qb + q0 + r) * p.l_st] =
                    l_run[hi] > 0.0f ? (m_run[hi] + log2f(l_run[hi])) * LN2 : vt::neg_inf();
        }
    }
}

template <typename T, int D, int DV> __device__ __forceinline__ void run(const Params& p) {
    // The host sizes shared memory from the same layout (sm80.rs); anything less is a host
    // bug: trap rather than write past it or leave the output unwritten.
    if (dynamic_smem_size() < (u32)Layout<D, DV>::SMEM) __trap();
    attention<T, D, DV>(p);
}

// The head-dim pairs of FAST_DIMS; the host never launches others.
template <typename T> __device__ __forceinline__ void dispatch(const Params& p) {
    if (p.d == 192 && p.dv == 128) run<T, 192, 128>(p);
    else if (p.d == 128 && p.dv == 128) run<T, 128, 128>(p);
    else if (p.d == 64 && p.dv == 64) run<T, 64, 64>(p);
    else __trap();
}

}  // namespace sm80
}  // namespace pf

#define VT_PREFILL_MMA(S, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(pf::sm80::THREADS, 1) prefill_attention_mma_##S(     \
        const pf::Params p) {                                                                        \
        pf::sm80::dispatch<T>(p);                                                                    \
    }
VT_PREFILL_MMA(bf16, bf16)
VT_PREFILL_MMA(f16, f16)
#undef VT_PREFILL_MMA
