// PrefillAttention, sm_90a wgmma kernel (FlashAttention-3 style). Included by
// prefill_attention.cu after common.cuh and params.cuh; compiled only for sm_90a
// (__CUDA_ARCH_FEAT_SM90_ALL), where crates/vt-cuda/src/prefill_attention/sm90.rs launches it.
//
// One CTA: 128 query rows (BM) of one head of one sequence, 384 threads in three warpgroups.
// - Warpgroup 0 (producer, 24 registers after setmaxnreg; one thread works): streams the K
//   and V tiles of BN = 128 keys through a two-stage ring with the tensor memory accelerator
//   (cp.async.bulk.tensor, 3-D maps over (dim, head, token) made on the host, 128-byte
//   swizzle), each tile completing on its "full" mbarrier by bytes. Rows past Tk arrive as
//   zeros; rows of the next sequence inside Tk are masked out of S, so their weights are 0
//   (inputs are assumed finite: 0 x inf would be NaN).
// - Warpgroups 1 and 2 (consumers, 240 registers): 64 query rows each, Q loaded by each with
//   cp.async (zero-filled past the sequence). Per key tile:
//   S = Q K^T with wgmma m64n128k16 (Q and K from 128-byte-swizzled shared memory),
//   the online softmax on the accumulators (exp2 domain, a row lives in one quad), P
//   converted in registers to the A operand of O += P V (wgmma m64n{Dv}k16, A from
//   registers, V read MN-major from shared memory). The softmax of tile t runs while the
//   P V product of tile t - 1 is in flight (issued asynchronously just before), so the
//   tensor cores and the exp units overlap inside each warpgroup; the two consumer
//   warpgroups interleave on top of that.
// Causal tiles are scheduled longest first (blockIdx.x reversed). Rows past the sequence's
// last query are computed on zero queries and never stored.
//
// Shared memory (bytes from a 1024-aligned base): Q [2 warpgroups][D/64][64 rows][128 B],
// K [2 stages][D/64][128 rows][128 B], V [2 stages][Dv/64][128 rows][128 B], 8 mbarriers.
// The host (sm90.rs) computes the same size. Each consumer stages its output through its
// own Q region at the end (Dv <= D).
#pragma once

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace pf {
namespace sm90 {

using namespace vt::tc;

constexpr int BM = 128, BN = 128, STAGES = 2, THREADS = 384;

// The tensor maps of K and V: 3-D (dim, head, token), boxes of 64 columns x 1 head x BN
// tokens, 128-byte swizzle; tokens past Tk are zero-filled by the copy engine.
struct Maps {
    TmaMap k, v;
};

// Named barriers: 1 + cw a consumer warpgroup's own (128 threads); TURN + cw its GEMM turn;
// BAR_TAIL both consumers (256).
constexpr int TURN = 3;
// Both consumers: the last V tile's rows past the sequence are zeroed.
constexpr int BAR_TAIL = 5;
#ifndef PF_PINGPONG
#define PF_PINGPONG 1
#endif

// The wgmma shapes used: S = Q K^T (m64n128k16, A and B K-major in shared memory) and
// O += P V (m64n{128,64}k16, A = P in registers, B = V transposed, MN-major).
#define PF_WGMMA_SS_N128(NAME, TY)                                                                 \
    __device__ __forceinline__ void NAME(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {       \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                      \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " "                          \
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                     \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                                                                          \
                     : "l"(da), "l"(db), "r"(scale_d));                                                    \
    }
#define PF_WGMMA_RS_N128(NAME, TY)                                                                  \
    __device__ __forceinline__ void NAME(float (&d)[64], const uint32_t* a, uint64_t db) {              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                   \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " "                          \
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"     \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                                                                          \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));                       \
    }
#define PF_WGMMA_RS_N64(NAME, TY)                                                                  \
    __device__ __forceinline__ void NAME(float (&d)[32], const uint32_t* a, uint64_t db) {              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                   \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                          \
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"     \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                                                          \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));                       \
    }

PF_WGMMA_SS_N128(ss_n128_bf16, "bf16")
PF_WGMMA_SS_N128(ss_n128_f16, "f16")
PF_WGMMA_RS_N128(rs_n128_bf16, "bf16")
PF_WGMMA_RS_N128(rs_n128_f16, "f16")
PF_WGMMA_RS_N64(rs_n64_bf16, "bf16")
PF_WGMMA_RS_N64(rs_n64_f16, "f16")

template <typename T> struct Mma;
template <> struct Mma<bf16> {
    static __device__ __forceinline__ void qk(float (&d)[64], uint64_t a, uint64_t b, int sc) { ss_n128_bf16(d, a, b, sc); }
    static __device__ __forceinline__ void pv(float (&d)[64], const uint32_t* a, uint64_t b) { rs_n128_bf16(d, a, b); }
    static __device__ __forceinline__ void pv(float (&d)[32], const uint32_t* a, uint64_t b) { rs_n64_bf16(d, a, b); }
};
template <> struct Mma<f16> {
    static __device__ __forceinline__ void qk(float (&d)[64], uint64_t a, uint64_t b, int sc) { ss_n128_f16(d, a, b, sc); }
    static __device__ __forceinline__ void pv(float (&d)[64], const uint32_t* a, uint64_t b) { rs_n128_f16(d, a, b); }
    static __device__ __forceinline__ void pv(float (&d)[32], const uint32_t* a, uint64_t b) { rs_n64_f16(d, a, b); }
};

template <int D, int DV> struct Layout {
    static constexpr int Q_WG = D * 128;        // one consumer's 64 rows: D/64 blocks of 8 KB
    static constexpr int K_STAGE = BN * D * 2;  // D/64 blocks of 16 KB
    static constexpr int V_STAGE = BN * DV * 2;
    static constexpr int OFF_Q = 0;
    static constexpr int OFF_K = 2 * Q_WG;
    static constexpr int OFF_V = OFF_K + STAGES * K_STAGE;
    static constexpr int OFF_BAR = OFF_V + STAGES * V_STAGE;
    static constexpr int SMEM = OFF_BAR + 8 * STAGES * 4 + 1024;  // + alignment slack
};

// Copies `rows` rows of `cpr` 16-byte chunks (row i from src + i * stride elements) into
// [cpr / 8][rows_total][128 B] swizzled blocks at dst; rows >= valid_rows are zero-filled.
template <typename T, int ROWS, int CPR, int NT>
__device__ __forceinline__ void load_tile(uint32_t dst, const T* src, i64 stride, int valid_rows, int tid) {
#pragma unroll 4
    for (int idx = tid; idx < ROWS * CPR; idx += NT) {
        const int r = idx / CPR, c = idx - r * CPR;
        const bool ok = r < valid_rows;
        const T* g = ok ? src + (i64)r * stride + c * 8 : src;
        cp_async16(dst + (c >> 3) * (ROWS * 128) + swz(r, c & 7), g, ok);
    }
}

// The rescale of O by a tile's correction factors (rows g and g + 8 of the thread).
template <int N> __device__ __forceinline__ void rescale(float (&o)[N], float a0, float a1) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
        o[4 * i + 0] *= a0;
        o[4 * i + 1] *= a0;
        o[4 * i + 2] *= a1;
        o[4 * i + 3] *= a1;
    }
}

// Online softmax of one S tile: masks (MASK: keys at or past lim[row] get weight 0),
// updates the running max and sum, leaves the weights P in x (f32) and the factors by which O
// must be rescaled in alpha. Maxima are kept on raw scores times c (log2 domain), so each
// weight is one FFMA and one EX2. s[4i + j]: row g + 8 (j >> 1), key 8 i + 2 qd + (j & 1) of
// the tile. S is only read: this runs while the previous tile's P V product is in flight, and
// writing a wgmma accumulator there makes ptxas serialize the wgmma pipeline (warning C7513).
template <bool MASK>
__device__ __forceinline__ void softmax_tile(const float (&s)[64], float (&x)[64], float (&m_run)[2],
                                             float (&l_run)[2], float (&alpha)[2], int k0, const int (&lim)[2],
                                             int qd, float c) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int key = k0 + 8 * i + 2 * qd + (j & 1);
            x[4 * i + j] = !MASK || key < lim[j >> 1] ? s[4 * i + j] : vt::neg_inf();
        }
    float mx[2] = {vt::neg_inf(), vt::neg_inf()};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        mx[0] = fmaxf(mx[0], fmaxf(x[4 * i], x[4 * i + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(x[4 * i + 2], x[4 * i + 3]));
    }
    float muse[2];
    quad_max_step(mx, c, m_run, l_run, alpha, muse);
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            x[4 * i + j] = ex2(fmaf(x[4 * i + j], c, -muse[j >> 1]));
            l_run[j >> 1] += x[4 * i + j];
        }
}

// P (f32 weights) as the 16-bit A fragments of the P V product: k-step kk holds keys
// 16 kk .. 16 kk + 15 as {row g, keys 0-7}, {row g + 8, keys 0-7}, {row g, 8-15}, {row g + 8, 8-15}.
template <typename T> __device__ __forceinline__ void to_a_frags(const float (&x)[64], uint32_t (&pk)[32]) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) pk[4 * (i >> 1) + 2 * (i & 1) + hi] = pack2<T>(x[4 * i + 2 * hi], x[4 * i + 2 * hi + 1]);
}

template <typename T, int D, int DV>
__device__ void prefill_wgmma(const Params& p, const Maps& maps) {
    using L = Layout<D, DV>;
    static_assert(L::SMEM <= 232448, "fits the 227 KB a block may have");
    static_assert(DV <= D && D % 64 == 0 && DV % 64 == 0, "head dims of the fast path");
    constexpr int CPR_K = D / 8;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t base = smem_u32(smem);
    const uint32_t sK = base + L::OFF_K, sV = base + L::OFF_V, sBar = base + L::OFF_BAR;
    // mbarriers (8 bytes each): full_k[s], full_v[s], empty_k[s], empty_v[s].
    auto full_k = [&](int s) { return sBar + 8 * s; };
    auto full_v = [&](int s) { return sBar + 8 * (STAGES + s); };
    auto empty_k = [&](int s) { return sBar + 8 * (2 * STAGES + s); };
    auto empty_v = [&](int s) { return sBar + 8 * (3 * STAGES + s); };

    // Order 0: a head's query tiles run together (they share its K/V in L2). Order 1 (small
    // K/V, chosen on the host): every head's tile i runs before any head's tile i - 1, so the
    // longest causal tiles start first across the whole grid and the tail is short ones.
    const int h = p.order ? (int)blockIdx.x : (int)blockIdx.y, b = blockIdx.z;
    const int qt = p.order ? (int)blockIdx.y : (int)blockIdx.x;
    const int tile = p.causal ? p.q_tiles - 1 - qt : qt;
    const Seq sq = load_seq(p, b);
    const int m0 = tile * BM;
    if (!sq.ok || m0 >= sq.lq) return;  // uniform over the CTA
    const int rows = min(BM, sq.lq - m0);
    const int kend = key_end(p, sq, m0 + rows);
    const int n_tiles = (kend + BN - 1) / BN;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full_k(s), 1);  // the producer's expect_tx arrival, then the bytes
            mbar_init(full_v(s), 1);
            mbar_init(empty_k(s), 256);
            mbar_init(empty_v(s), 256);
        }
    }
    __syncthreads();

    const int wg = threadIdx.x >> 7, wtid = threadIdx.x & 127;
    if (wg == 0) {
        // Producer: one thread drives the copy engine; the other 127 leave.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (wtid != 0) return;
        prefetch_map(&maps.k);
        prefetch_map(&maps.v);
        const int row0 = (int)sq.kb;  // < Tk <= 2^31 - 1 (checked on the host)
        for (int t = 0; t < n_tiles; ++t) {
            const int st = t % STAGES, u = t / STAGES;
            const int row = row0 + t * BN;
            if (u > 0) mbar_wait(empty_k(st), (u - 1) & 1);
            mbar_expect_tx(full_k(st), L::K_STAGE);
#pragma unroll
            for (int cb = 0; cb < D / 64; ++cb)
                tma_load_3d(sK + st * L::K_STAGE + cb * (BN * 128), &maps.k, 64 * cb, h, row, full_k(st));
            if (u > 0) mbar_wait(empty_v(st), (u - 1) & 1);
            mbar_expect_tx(full_v(st), L::V_STAGE);
#pragma unroll
            for (int cb = 0; cb < DV / 64; ++cb)
                tma_load_3d(sV + st * L::V_STAGE + cb * (BN * 128), &maps.v, 64 * cb, h, row, full_v(st));
        }
        return;
    }

    // Consumers.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int cw = wg - 1;                      // rows 64 cw .. 64 cw + 63 of the tile
    const int warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, qd = lane & 3;
    const uint32_t sQ = base + L::OFF_Q + cw * L::Q_WG;
    unsigned char* sQp = smem + L::OFF_Q + cw * L::Q_WG;
    const int r0 = m0 + 64 * cw;                // first row (of the sequence) of this warpgroup
    {
        const T* qsrc = (const T*)p.q + (sq.qb + r0) * p.q_st + h * p.q_sh;
        load_tile<T, 64, CPR_K, 128>(sQ, qsrc, p.q_st, max(0, min(64, sq.lq - r0)), wtid);
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();
        bar_sync(1 + cw, 128);
    }
    const float c = p.scale_log2;
    // Keys visible to this thread's rows r_lo, r_lo + 8: [0, lim).
    int lim[2];
    const int r_lo = r0 + 16 * warp + g;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const int r = r_lo + 8 * hi;
        lim[hi] = p.causal ? max(0, min(sq.lk, sq.lk - sq.lq + r + 1)) : sq.lk;
    }
    // A tile needs no mask when every row of the warpgroup sees all of its keys.
    const int lim_wg = p.causal ? max(0, min(sq.lk, sq.lk - sq.lq + r0 + 1)) : sq.lk;

    constexpr int NO = DV / 2;
    float o[NO];
#pragma unroll
    for (int i = 0; i < NO; ++i) o[i] = 0.0f;
    float m_run[2] = {vt::neg_inf(), vt::neg_inf()}, l_run[2] = {0.0f, 0.0f};
    const uint64_t dq = gmma_desc(sQ, 16, 1024);
    uint32_t pk[32];
    float s[64];
    float alpha[2];

    auto qk = [&](int st) {
        const uint64_t dk = gmma_desc(sK + st * L::K_STAGE, 16, 1024);
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            // Column block ks / 4 (8 KB apart in Q, 16 KB in K), 32 bytes per k step inside it.
            const uint64_t oq = (uint64_t)(((ks >> 2) * (64 * 128) + (ks & 3) * 32) >> 4);
            const uint64_t ok = (uint64_t)(((ks >> 2) * (BN * 128) + (ks & 3) * 32) >> 4);
            Mma<T>::qk(s, dq + oq, dk + ok, ks > 0 ? 1 : 0);
        }
    };
    auto pv = [&](int st) {
        // V MN-major: 64-column blocks BN * 128 bytes apart (LBO), 8-key groups 1 KB apart (SBO);
        // k step kk covers keys 16 kk .. 16 kk + 15 (+2 KB).
        const uint64_t dv = gmma_desc(sV + st * L::V_STAGE, BN * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) Mma<T>::pv(o, pk + 4 * kk, dv + (uint64_t)(kk * 128));
    };

    // Ping-pong (FA3): the two consumer warpgroups take turns issuing their GEMMs, so one's
    // softmax runs while the other's products occupy the tensor cores. Warpgroup cw waits on
    // barrier TURN + cw before issuing and arrives on the other's after. Warpgroup 1 opens
    // (warpgroup 2 arrives once up front) and absorbs the last arrival at the end, so every
    // arrival is matched by a sync (both run the same n_tiles + 1 issue groups).
    auto turn_wait = [&]() {
        if (PF_PINGPONG) bar_sync(TURN + cw, 256);
    };
    auto turn_pass = [&]() {
        if (PF_PINGPONG) bar_arrive(TURN + (cw ^ 1), 256);
    };
    if (PF_PINGPONG && n_tiles > 0 && cw == 1) bar_arrive(TURN, 256);

    if (n_tiles > 0) {
        mbar_wait(full_k(0), 0);
        turn_wait();
        pin(s);
        wgmma_fence();
        qk(0);
        wgmma_commit();
        turn_pass();
        wgmma_wait<0>();
        pin(s);
        mbar_arrive(empty_k(0));
        float x[64];
        if (BN <= lim_wg)
            softmax_tile<false>(s, x, m_run, l_run, alpha, 0, lim, qd, c);
        else
            softmax_tile<true>(s, x, m_run, l_run, alpha, 0, lim, qd, c);
        to_a_frags<T>(x, pk);
    }
    for (int t = 1; t < n_tiles; ++t) {
        const int st = t % STAGES, pst = (t - 1) % STAGES;
        mbar_wait(full_k(st), (t / STAGES) & 1);
        mbar_wait(full_v(pst), ((t - 1) / STAGES) & 1);
        turn_wait();
        pin(s);
        pin(o);
        pin(pk);
        wgmma_fence();
        qk(st);
        wgmma_commit();
        pv(pst);
        wgmma_commit();
        turn_pass();
        wgmma_wait<1>();  // S(t) is ready; P(t-1) V(t-1) may still run
        pin(s);
        mbar_arrive(empty_k(st));
        float x[64];
        const int k0 = t * BN;
        if (k0 + BN <= lim_wg)
            softmax_tile<false>(s, x, m_run, l_run, alpha, k0, lim, qd, c);
        else
            softmax_tile<true>(s, x, m_run, l_run, alpha, k0, lim, qd, c);
        wgmma_wait<0>();
        pin(o);
        pin(pk);  // the in-flight product read pk: keep it live until here
        mbar_arrive(empty_v(pst));
        rescale(o, alpha[0], alpha[1]);
        to_a_frags<T>(x, pk);
    }
    if (n_tiles > 0) {
        const int pst = (n_tiles - 1) % STAGES;
        mbar_wait(full_v(pst), ((n_tiles - 1) / STAGES) & 1);
        // Only the last tile can hold rows past lk (the next sequence's, or zeros past Tk).
        // Their weights are 0, but 0 x NaN is NaN: warpgroup 1 zeroes them (the contract
        // promises nothing about rows outside the sequences) before either reads the stage.
        const int tail = (n_tiles - 1) * BN;
        if (tail + BN > sq.lk) {
            if (cw == 0) {
                unsigned char* vst = smem + L::OFF_V + pst * L::V_STAGE;
                const int r_first = sq.lk - tail;
                constexpr int CH = DV / 8;
                for (int idx = wtid; idx < (BN - r_first) * CH; idx += 128) {
                    const int r = r_first + idx / CH, ch = idx % CH;
                    *reinterpret_cast<uint4*>(vst + (ch >> 3) * (BN * 128) + swz(r, ch & 7)) = make_uint4(0, 0, 0, 0);
                }
                fence_proxy_async();  // the products read the stage through the async proxy
            }
            bar_sync(BAR_TAIL, 256);
        }
        turn_wait();
        pin(o);
        pin(pk);
        wgmma_fence();
        pv(pst);
        wgmma_commit();
        turn_pass();
        wgmma_wait<0>();
        pin(o);
        pin(pk);
        mbar_arrive(empty_v(pst));
        if (PF_PINGPONG && cw == 0) bar_sync(TURN, 256);
    }

    // Epilogue: normalise, stage 16-bit rows in this warpgroup's Q region (swizzled by
    // 16-byte chunk so the fragment stores hit distinct banks), copy out with 16-byte stores.
    float inv[2];
    quad_row_sums(l_run, inv);
    constexpr int CH = DV / 8;  // 16-byte chunks per output row
#pragma unroll
    for (int i = 0; i < DV / 8; ++i)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int r = 16 * warp + g + 8 * hi;
            const uint32_t off = (uint32_t)(r * (DV * 2) + ((i ^ (r & 7)) << 4) + qd * 4);
            *reinterpret_cast<uint32_t*>(sQp + off) =
                pack2<T>(o[4 * i + 2 * hi] * inv[hi], o[4 * i + 2 * hi + 1] * inv[hi]);
        }
    bar_sync(1 + cw, 128);
#pragma unroll 4
    for (int idx = wtid; idx < 64 * CH; idx += 128) {
        const int r = idx / CH, ch = idx - r * CH;
        if (r0 + r >= sq.lq) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(sQp + r * (DV * 2) + ((ch ^ (r & 7)) << 4));
        T* dst = (T*)p.out + (sq.qb + r0 + r) * p.o_st + h * p.o_sh + ch * 8;
        *reinterpret_cast<uint4*>(dst) = v;
    }
    if (p.lse != nullptr && qd == 0) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int r = r_lo + 8 * hi;
            if (r < sq.lq) {
                const float l = l_run[hi];
                p.lse[h * p.l_sh + (sq.qb + r) * p.l_st] =
                    l > 0.0f ? (m_run[hi] + log2f(l)) * 0.69314718055994531f : vt::neg_inf();
            }
        }
    }
}

}  // namespace sm90
}  // namespace pf

#define PF_WGMMA(S, T, D, DV)                                                                      \
    extern "C" __global__ void __launch_bounds__(pf::sm90::THREADS, 1)                             \
        prefill_attention_wgmma_##D##x##DV##_##S(const __grid_constant__ pf::Params p,             \
                                                 const __grid_constant__ pf::sm90::Maps maps) {    \
        pf::sm90::prefill_wgmma<T, D, DV>(p, maps);                                                \
    }
#define PF_WGMMA_DIMS(S, T) PF_WGMMA(S, T, 192, 128) PF_WGMMA(S, T, 128, 128) PF_WGMMA(S, T, 64, 64)
PF_WGMMA_DIMS(bf16, bf16)
PF_WGMMA_DIMS(f16, f16)
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
