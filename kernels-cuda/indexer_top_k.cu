// IndexerTopK (DeepSeek-V3.2's lightning indexer) in two stages over a chunk of `rows`
// query tokens t = row0 + r:
//
// 1. Scores: ws[r, j] = key(scale * sum_h w[t, h] * relu(q[t, h] . k[j])) for the tokens
//    j < n(t) = positions[t] + 1 of sequence seq_ids[t], k[j] read from the paged cache by
//    the block table. `key` is the order-preserving map of the f32 bits to u32 (unsigned
//    order of keys = f32 total order, -0 made +0 first); key 0 marks a token that cannot be
//    chosen (its block id is outside the cache). NaN maps to at least 1. Kernels:
//    - indexer_scores_mma_{bf16,f16}: tensor cores (mma.sync m16n8k16, f32 accumulation).
//      One CTA = one query x nt tiles of 64 keys (nt from the host), 4 warps. The query's
//      heads (padded with zero rows to a multiple of 64) sit in shared memory; key tiles
//      stream in by cp.async, STAGES in flight. Warp (mw, nw) computes heads [mw*32, +32)
//      of each 64-head pass against keys [nw*32, +32) of the tile, applies relu and the
//      head weight, and sums its heads; the two head halves meet in shared memory. Needs
//      Di % 16 == 0 and 16-byte aligned rows (the host checks).
//    - indexer_scores_mma128_*: the same at H <= 64, Di = 128 with each warp's Q fragments
//      in registers; indexer_scores_pair_*: two queries a CTA (prefill), below.
//    - indexer_scores_{bf16,f16,f32}: any dims and strides, one thread per key, products and
//      sums in the CPU reference's order with round-to-nearest intrinsics (no FMA
//      contraction), so its scores equal the CPU's bit for bit.
// 2. Selection, indexer_select_f32 (dtype-independent; the suffix only names it): one CTA
//    of 1024 threads per row, two paths.
//    - Fast (topk <= SORT_CAP, and a row longer than SORT_CAP keys needs 3 topk <= 2
//      SORT_CAP): a lower bound L (1: every valid key, for rows of <= SORT_CAP keys; else
//      from a sample of 1024 chunks of 4 keys, L's sample rank chosen so that about
//      (topk + SORT_CAP) / 2 keys of the row are >= L) and one pass over the row from the
//      workspace that moves the keys >= L with their positions into shared memory in
//      position order (16 consecutive keys a thread, a one-barrier block scan a tile).
//      When topk <= count <= SORT_CAP (or L = 1 and count <= SORT_CAP) they hold the
//      answer: a stable LSD radix sort (8-bit digits, descending; equal keys keep position
//      order, the contract's tie rule; digits equal in every key skipped) and the first topk
//      are written. Otherwise L moves by the count's ratio to the target (up to 3 passes),
//      then the general path runs. No same-address atomics, no bitonic stages.
//    - General (the previous kernel, now for topk above SORT_CAP, ties straddling every
//      bound tried, or skewed samples): the row's keys copied to shared memory when they fit
//      (row_cap), a long row filtered into shared memory by a sampled lower bound, else read
//      from the workspace; 16 keys a thread at a time. A 4-pass radix select (8 bits a pass,
//      histograms in shared memory) finds the key K of the m-th best candidate,
//      m = min(SORT_CAP, topk still to write); every candidate above K is taken, and of
//      those equal to K the lowest positions (a block scan over runs of 16 consecutive
//      keys), which is the contract's tie rule. The m taken (key << 32 | ~j) are sorted
//      descending by a bitonic sort in shared memory and written as slots. A topk above
//      SORT_CAP repeats this below the last one written (candidates then compare below it
//      in (key desc, position asc) order). The rest of the row is -1.
//
// Every index read from memory (sequence id, position, block id) is range-checked: an
// out-of-range sequence or negative position gives an all -1 row, an out-of-range block
// id a token that is never chosen. Nothing is written outside ws rows < rows and out.
#include "common.cuh"
#include "tensor_core.cuh"

namespace {

using u32 = unsigned int;
using u64 = unsigned long long;

constexpr int KT = 64;        // keys per tile; a score CTA takes nt tiles (host-chosen)
constexpr int STAGES = 3;     // key tiles in flight (mma kernel)
constexpr int THREADS = 128;  // score kernels
constexpr int SEL_THREADS = 1024;
constexpr int SORT_CAP = 4096;  // items per select round (the host counts them in SELECT_STATIC_SMEM)
constexpr int PER_THREAD = 16;  // consecutive keys a select thread takes per tile
constexpr int FILTER_SAMPLE = 2048;  // sampled keys of a row too long for shared memory
constexpr int SEL_SHARED_BYTES = 36 * 1024;  // the select's bookkeeping (the host's SELECT_SHARED_BYTES)
constexpr int PAD = 8;          // elements of padding per shared row (conflict-free ldmatrix)
constexpr u32 ALL = 0xffffffffu;  // SelShared::kth when every candidate is taken
constexpr u32 FULL = 0xffffffffu;  // every lane (warp intrinsics)
constexpr int SEL_WARPS = SEL_THREADS / 32;
// The fast select's shared memory (FastShared; the host's FAST_SHARED_BYTES): the dynamic
// allocation is at least this, and at least the general path's bookkeeping plus row_cap keys.
constexpr int FAST_SHARED_BYTES = 97 * 1024;

__device__ __forceinline__ u32 score_key(float s) {
    const u32 b = __float_as_uint(s);
    const u32 k = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return k < 1u ? 1u : k;
}

__device__ __forceinline__ i64 load_pos(const void* pos, i64 s, int is64, i64 t) {
    return is64 ? static_cast<const long long*>(pos)[t * s] : (i64) static_cast<const int*>(pos)[t * s];
}

// The visible count n of query t (0: a padding row or an out-of-range sequence), and its
// sequence b.
__device__ __forceinline__ i64 visible(const int* seq_ids, i64 sid_s, const void* pos, i64 pos_s, int pos64,
                                       i64 t, int nseq, i64 cap, int* b_out) {
    const int b = seq_ids[t * sid_s];
    const i64 p = load_pos(pos, pos_s, pos64, t);
    *b_out = b;
    if (p < 0 || b < 0 || b >= nseq) return 0;
    return p + 1 < cap ? p + 1 : cap;
}

// Block id of token j of sequence b, or -1 when the table entry is outside the cache; `off`
// gets j's row in its block. 32-bit index math (the host checks MB * BS < 2^31): a 64-bit
// division per key row costs more than the row's mma work.
__device__ __forceinline__ int block_of(const int* bt, i64 bt_sb, i64 bt_sc, int b, i64 j, int bs, int nb,
                                        u32* off = nullptr) {
    const u32 jj = (u32)j, blk = jj / (u32)bs;
    if (off) *off = jj - blk * (u32)bs;
    const int id = bt[(i64)b * bt_sb + (i64)blk * bt_sc];
    return (id >= 0 && id < nb) ? id : -1;
}

// The cache slot of position jj (a selected key: its block id was in range when scored).
__device__ __forceinline__ int slot_of(const int* bt, i64 bt_sb, i64 bt_sc, int b, u32 jj, int bs) {
    const u32 blk = jj / (u32)bs;
    return bt[(i64)b * bt_sb + (i64)blk * bt_sc] * bs + (int)(jj - blk * (u32)bs);
}

template <typename T> __device__ __forceinline__ float load_w(const void* w, int wf32, i64 off) {
    return wf32 ? static_cast<const float*>(w)[off] : vt::to_f32(static_cast<const T*>(w)[off]);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Generic scores: one thread per key, the CPU reference's arithmetic order.
template <typename T>
__device__ void indexer_scores(u32* ws, i64 ws_ld, i64 row0, const T* q, i64 q_st, i64 q_sh,
                               const void* w, i64 w_st, i64 w_sh, int wf32, const T* cache, i64 c_sb, i64 c_sr,
                               int nb, int bs, const int* bt, i64 bt_sb, i64 bt_sc, int nseq, const int* seq_ids,
                               i64 sid_s, const void* pos, i64 pos_s, int pos64, i64 cap, int h, int di,
                               float scale, int nt) {
    const i64 r = blockIdx.y, t = row0 + r;
    int b;
    const i64 n = visible(seq_ids, sid_s, pos, pos_s, pos64, t, nseq, cap, &b);
    const i64 kpc = (i64)nt * KT;
    const i64 j0 = (i64)blockIdx.x * kpc;
    if (j0 >= n) return;
    const T* qt = q + t * q_st;
    for (i64 j = j0 + threadIdx.x; j < n && j < j0 + kpc; j += blockDim.x) {
        u32 off;
        const int id = block_of(bt, bt_sb, bt_sc, b, j, bs, nb, &off);
        u32 key = 0;
        if (id >= 0) {
            const T* k = cache + (i64)id * c_sb + (i64)off * c_sr;
            float sum = 0.f;
            for (int hi = 0; hi < h; ++hi) {
                const T* qh = qt + hi * q_sh;
                float dot = 0.f;
                for (int d = 0; d < di; ++d) dot = __fadd_rn(dot, __fmul_rn(vt::to_f32(qh[d]), vt::to_f32(k[d])));
                const float wh = load_w<T>(w, wf32, t * w_st + hi * w_sh);
                sum = __fadd_rn(sum, __fmul_rn(wh, fmaxf(dot, 0.f)));
            }
            key = score_key(__fadd_rn(__fmul_rn(scale, sum), 0.f));
        }
        ws[r * ws_ld + j] = key;
    }
}

#define VT_IDX_SCORES(S, T)                                                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS) indexer_scores_##S(                                  \
        u32* ws, i64 ws_ld, i64 row0, const T* q, i64 q_st, i64 q_sh, const void* w, i64 w_st, i64 w_sh,       \
        int wf32, const T* cache, i64 c_sb, i64 c_sr, int nb, int bs, const int* bt, i64 bt_sb,      \
        i64 bt_sc, int nseq, const int* seq_ids, i64 sid_s, const void* pos, i64 pos_s, int pos64, i64 cap,    \
        int h, int di, float scale, int nt) {                                                                  \
        indexer_scores<T>(ws, ws_ld, row0, q, q_st, q_sh, w, w_st, w_sh, wf32, cache, c_sb, c_sr, nb, bs, \
                          bt, bt_sb, bt_sc, nseq, seq_ids, sid_s, pos, pos_s, pos64, cap, h, di, scale, nt);   \
    }
VT_FOR_EACH_FLOAT(VT_IDX_SCORES)

// ---------------------------------------------------------------------------------------
// Pieces of the tensor-core score kernels (mma and pair), warp (mw, nw) of a 4-warp group.
namespace {

// Key tile [j0, j0 + KT) of sequence b into stage st of ks (row stride rs, cpr 16-byte chunks
// a row) by cp.async, threads tid, tid + nth, ...; rows at or past lim, or with a block id
// outside the cache, are zero-filled. valid[st * KT + row]: whether row's block id was in the
// cache (so the epilogue does not look it up again). (The stage's address is formed here: a
// pointer to it passed in compiled to other address arithmetic.)
template <typename T>
__device__ __forceinline__ void load_key_tile(T* ks, int st, unsigned char* valid, const T* cache, i64 c_sb,
                                              i64 c_sr, int nb, int bs, const int* bt, i64 bt_sb, i64 bt_sc, int b,
                                              i64 j0, i64 lim, int rs, int cpr, int tid, int nth) {
    using namespace vt::tc;
    T* dst = ks + st * KT * rs;
    // Tiles start at multiples of 64: with bs a multiple of 64 a tile is one block.
    u32 off0 = 0;
    const int id0 = bs % KT == 0 ? block_of(bt, bt_sb, bt_sc, b, j0, bs, nb, &off0) : -1;
    for (int c = tid; c < KT * cpr; c += nth) {
        const int row = c / cpr, ch = c % cpr;
        const i64 j = j0 + row;
        u32 off = off0 + (u32)row;
        const int id =
            j >= lim ? -1 : bs % KT == 0 ? id0 : block_of(bt, bt_sb, bt_sc, b, j, bs, nb, &off);
        const T* src = id >= 0 ? cache + (i64)id * c_sb + (i64)off * c_sr + ch * 8 : cache;
        cp_async16(smem_u32(dst + row * rs + ch * 8), src, id >= 0);
        if (ch == 0) valid[st * KT + row] = id >= 0;
    }
}

// B fragments of k-step k0 for this warp's 32 keys (2 x 16 keys) of the tile at kt.
template <typename T>
__device__ __forceinline__ void load_b(const T* kt, int rs, int k0, int nw, int lane, u32 (&bf)[2][4]) {
    using namespace vt::tc;
#pragma unroll
    for (int np = 0; np < 2; ++np) {
        const int key = nw * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
        ldsm_x4(smem_u32(kt + key * rs + k0 + ((lane >> 3) & 1) * 8), bf[np]);
    }
}

// acc += A B^T for one k-step: A the warp's 32 heads (a0: 16 heads, a1: the next 16), B its 32 keys.
template <typename T>
__device__ __forceinline__ void mma_step(float (&acc)[2][4][4], const u32 (&a0)[4], const u32 (&a1)[4],
                                         const u32 (&bf)[2][4]) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
        vt::tc::MmaSync<T>::run(acc[0][ni], a0, bf[ni >> 1][(ni & 1) * 2], bf[ni >> 1][(ni & 1) * 2 + 1]);
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
        vt::tc::MmaSync<T>::run(acc[1][ni], a1, bf[ni >> 1][(ni & 1) * 2], bf[ni >> 1][(ni & 1) * 2 + 1]);
}

// The warp's Q A fragments (rows hr0 + [0, 32), NK k-steps) from shared memory.
template <typename T, int NK>
__device__ __forceinline__ void load_q_frags(const T* qs, int rs, int hr0, int lane, u32 (&aq)[2][NK][4]) {
    using namespace vt::tc;
#pragma unroll
    for (int mg = 0; mg < 2; ++mg)
#pragma unroll
        for (int ks = 0; ks < NK; ++ks) {
            const int row = hr0 + mg * 16 + (lane & 15);
            ldsm_x4(smem_u32(qs + row * rs + ks * 16 + (lane >> 4) * 8), aq[mg][ks]);
        }
}

// acc += Q K^T of the warp's 32 heads (fragments in registers) and 32 keys of the tile at kt.
template <typename T, int NK>
__device__ __forceinline__ void scores_from_regs(float (&acc)[2][4][4], const u32 (&aq)[2][NK][4], const T* kt,
                                                 int rs, int nw, int lane) {
#pragma unroll
    for (int ks = 0; ks < NK; ++ks) {
        u32 bf[2][4];
        load_b(kt, rs, ks * 16, nw, lane, bf);
        mma_step<T>(acc, aq[0][ks], aq[1][ks], bf);
    }
}

// relu, head weight (wsm[hr0 + head]) and the sum over this thread's rows of the warp's 32 heads.
__device__ __forceinline__ void weigh(float (&part)[4][2], const float (&acc)[2][4][4], const float* wsm, int hr0,
                                      int lane) {
#pragma unroll
    for (int mg = 0; mg < 2; ++mg) {
        const int hr = hr0 + mg * 16 + (lane >> 2);
        const float w0 = wsm[hr], w1 = wsm[hr + 8];
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                part[ni][c] = fmaf(w0, fmaxf(acc[mg][ni][c], 0.f), part[ni][c]);
                part[ni][c] = fmaf(w1, fmaxf(acc[mg][ni][2 + c], 0.f), part[ni][c]);
            }
    }
}

// Sum over the warp's rows (lanes with equal lane % 4 hold the same keys) into red[r0 + key].
__device__ __forceinline__ void reduce_part(float (&part)[4][2], float* red, int r0, int nw, int lane) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            float v = part[ni][c];
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            part[ni][c] = v;
        }
    if (lane < 4) {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int c = 0; c < 2; ++c) red[r0 + nw * 32 + ni * 8 + lane * 2 + c] = part[ni][c];
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Tensor-core scores. Shared memory (dynamic): Q [hp][di + PAD] T, keys [STAGES][KT][di + PAD]
// T, weights [hp] f32, the head halves' partial sums [2][KT] f32. hp = h rounded up to 64.
// DQ = 0: any hp and di (Q's fragments loaded from shared memory for every tile); DQ = 128:
// hp = 64 and di = 128 (DeepSeek), each warp's Q fragments (32 heads x 128) held in registers
// for all its tiles, halving the shared-memory operand traffic per mma.
template <typename T, int DQ>
__device__ void indexer_scores_mma(u32* ws, i64 ws_ld, i64 row0, const T* q, i64 q_st, i64 q_sh, const void* w,
                                   i64 w_st, i64 w_sh, int wf32, const T* cache, i64 c_sb, i64 c_sr, int nb, int bs,
                                   const int* bt, i64 bt_sb, i64 bt_sc, int nseq, const int* seq_ids, i64 sid_s,
                                   const void* pos, i64 pos_s, int pos64, i64 cap, int h, int di, float scale,
                                   int nt) {
    using namespace vt::tc;
    extern __shared__ __align__(16) unsigned char smem[];
    const i64 r = blockIdx.y, t = row0 + r;
    int b;
    const i64 n = visible(seq_ids, sid_s, pos, pos_s, pos64, t, nseq, cap, &b);
    const i64 jc = (i64)blockIdx.x * nt * KT;
    if (jc >= n) return;
    const int hp = (h + 63) / 64 * 64;
    const int rs = di + PAD;  // shared row stride, elements
    T* qs = reinterpret_cast<T*>(smem);
    T* ks = qs + (i64)hp * rs;
    float* wsm = reinterpret_cast<float*>(ks + STAGES * KT * rs);
    float* red = wsm + hp;
    // Per stage and key row: whether its block id was in the cache (set when the row's load is
    // issued), so the epilogue does not look the block up again.
    unsigned char* valid = reinterpret_cast<unsigned char*>(red + 2 * KT);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int mw = warp & 1, nw = warp >> 1;
    const int cpr = DQ > 0 ? DQ / 8 : di / 8;  // 16-byte chunks per row (a constant at DQ > 0)

    // Query rows (zero rows past h) and weights (0 past h).
    const T* qt = q + t * q_st;
    for (int c = tid; c < hp * cpr; c += THREADS) {
        const int hi = c / cpr, ch = c % cpr;
        const bool ok = hi < h;
        cp_async16(smem_u32(qs + hi * rs + ch * 8), ok ? (const void*)(qt + hi * q_sh + ch * 8) : (const void*)qt, ok);
    }
    for (int hi = tid; hi < hp; hi += THREADS) wsm[hi] = hi < h ? load_w<T>(w, wf32, t * w_st + hi * w_sh) : 0.f;

    const int ntiles = (int)min((i64)nt, (n - jc + KT - 1) / KT);
    // Tile i goes to stage i % STAGES; one commit group per tile (an empty group past the
    // last), so "all but the newest STAGES - 1 groups done" means tile i has landed.
    auto load_tile = [&](int i) {
        if (i < ntiles)
            load_key_tile(ks, i % STAGES, valid, cache, c_sb, c_sr, nb, bs, bt, bt_sb, bt_sc, b, jc + (i64)i * KT, n,
                          rs, cpr, tid, THREADS);
        cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) load_tile(i);
    // Q's A fragments (DQ > 0): [32 heads / 16][DQ / 16] x4, loaded with the first tile.
    uint32_t aq[2][DQ > 0 ? DQ / 16 : 1][4];

    for (int i = 0; i < ntiles; ++i) {
        load_tile(i + STAGES - 1);
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        const T* kt = ks + (i % STAGES) * KT * rs;
        // part[ni][c]: this thread's share of the weighted sum over heads of key
        // nw*32 + ni*8 + 2*(lane%4) + c.
        float part[4][2] = {};
        if constexpr (DQ > 0) {
            if (i == 0) load_q_frags(qs, rs, mw * 32, lane, aq);
            float acc[2][4][4] = {};
            scores_from_regs<T>(acc, aq, kt, rs, nw, lane);
            weigh(part, acc, wsm, mw * 32, lane);
        } else {
            for (int h0 = 0; h0 < hp; h0 += 64) {
                float acc[2][4][4] = {};
                for (int k0 = 0; k0 < di; k0 += 16) {
                    uint32_t a[2][4], bf[2][4];
#pragma unroll
                    for (int mg = 0; mg < 2; ++mg) {
                        const int row = h0 + mw * 32 + mg * 16 + (lane & 15);
                        ldsm_x4(smem_u32(qs + row * rs + k0 + (lane >> 4) * 8), a[mg]);
                    }
                    load_b(kt, rs, k0, nw, lane, bf);
                    mma_step<T>(acc, a[0], a[1], bf);
                }
                weigh(part, acc, wsm, h0 + mw * 32, lane);
            }
        }
        reduce_part(part, red, mw * KT, nw, lane);
        __syncthreads();
        if (tid < KT) {
            const i64 j = jc + (i64)i * KT + tid;
            if (j < n) {
                const float s = __fadd_rn(red[tid], red[KT + tid]);
                ws[r * ws_ld + j] = valid[(i % STAGES) * KT + tid] ? score_key(__fadd_rn(__fmul_rn(scale, s), 0.f)) : 0u;
            }
        }
        // The next iteration's load overwrites the oldest stage, and `red`.
        __syncthreads();
    }
}

#define VT_IDX_SCORES_MMA(S, T)                                                                                 \
    extern "C" __global__ void __launch_bounds__(THREADS) indexer_scores_mma_##S(                               \
        u32* ws, i64 ws_ld, i64 row0, const T* q, i64 q_st, i64 q_sh, const void* w, i64 w_st, i64 w_sh,        \
        int wf32, const T* cache, i64 c_sb, i64 c_sr, int nb, int bs, const int* bt, i64 bt_sb, i64 bt_sc,      \
        int nseq, const int* seq_ids, i64 sid_s, const void* pos, i64 pos_s, int pos64, i64 cap, int h, int di, \
        float scale, int nt) {                                                                                  \
        indexer_scores_mma<T, 0>(ws, ws_ld, row0, q, q_st, q_sh, w, w_st, w_sh, wf32, cache, c_sb, c_sr, nb, bs, \
                                 bt, bt_sb, bt_sc, nseq, seq_ids, sid_s, pos, pos_s, pos64, cap, h, di, scale, nt); \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS) indexer_scores_mma128_##S(                            \
        u32* ws, i64 ws_ld, i64 row0, const T* q, i64 q_st, i64 q_sh, const void* w, i64 w_st, i64 w_sh,        \
        int wf32, const T* cache, i64 c_sb, i64 c_sr, int nb, int bs, const int* bt, i64 bt_sb, i64 bt_sc,      \
        int nseq, const int* seq_ids, i64 sid_s, const void* pos, i64 pos_s, int pos64, i64 cap, int h, int di, \
        float scale, int nt) {                                                                                  \
        indexer_scores_mma<T, 128>(ws, ws_ld, row0, q, q_st, q_sh, w, w_st, w_sh, wf32, cache, c_sb, c_sr, nb,  \
                                   bs, bt, bt_sb, bt_sc, nseq, seq_ids, sid_s, pos, pos_s, pos64, cap, h, di,   \
                                   scale, nt);                                                                  \
    }
VT_IDX_SCORES_MMA(bf16, bf16)
VT_IDX_SCORES_MMA(f16, f16)

// ---------------------------------------------------------------------------------------
// Tensor-core scores, two queries a CTA (H <= 64, Di = 128; the host takes it when the call
// has at least two queries per sequence on average, i.e. prefill): queries t0 = row0 + 2y and
// t1 = t0 + 1, warp group g (4 warps, mma128's mapping) computing query t_g. When both belong
// to one sequence every key tile is loaded once for both (half the L2 traffic of one query a
// CTA); otherwise the CTA walks query 0's tiles, then query 1's, the other group idle.
// Shared memory: Q [2][64][136], keys [STAGES][64][136], weights [2][64] f32, sums [2][2][64].
template <typename T>
__device__ void indexer_scores_pair(u32* ws, i64 ws_ld, i64 row0, int rows, const T* q, i64 q_st, i64 q_sh,
                                    const void* w, i64 w_st, i64 w_sh, int wf32, const T* cache, i64 c_sb, i64 c_sr,
                                    int nb, int bs, const int* bt, i64 bt_sb, i64 bt_sc, int nseq,
                                    const int* seq_ids, i64 sid_s, const void* pos, i64 pos_s, int pos64, i64 cap,
                                    int h, float scale, int nt) {
    using namespace vt::tc;
    constexpr int DI = 128, HP = 64, RS = DI + PAD, CPR = DI / 8, NTH = 2 * THREADS;
    extern __shared__ __align__(16) unsigned char smem[];
    T* qs = reinterpret_cast<T*>(smem);
    T* ks = qs + 2 * HP * RS;
    float* wsm = reinterpret_cast<float*>(ks + STAGES * KT * RS);
    float* red = wsm + 2 * HP;
    unsigned char* valid = reinterpret_cast<unsigned char*>(red + 4 * KT);  // as the mma kernel's
    const int tid = threadIdx.x, lane = tid & 31, g = tid / THREADS, gt = tid % THREADS;
    const int w4 = gt >> 5, mw = w4 & 1, nw = w4 >> 1;
    const i64 r0 = 2 * (i64)blockIdx.y;
    // (Scalars, not arrays: an array indexed by the group would live in local memory.)
    int b0 = -1, b1 = -1;
    const i64 n0 = visible(seq_ids, sid_s, pos, pos_s, pos64, row0 + r0, nseq, cap, &b0);
    const i64 n1 = r0 + 1 < rows ? visible(seq_ids, sid_s, pos, pos_s, pos64, row0 + r0 + 1, nseq, cap, &b1) : 0;
    const i64 ng = g ? n1 : n0;
    const i64 jc = (i64)blockIdx.x * nt * KT;
    auto tiles_of = [&](i64 lim) { return jc < lim ? (int)min((i64)nt, (lim - jc + KT - 1) / KT) : 0; };
    const bool shared = n0 == 0 || n1 == 0 || b0 == b1;
    const i64 nmax = max(n0, n1);
    const int nt0 = tiles_of(n0);
    const int ntiles = shared ? tiles_of(nmax) : nt0 + tiles_of(n1);
    if (ntiles == 0) return;
    // Tile v: its query (-1: both), sequence, first token and token limit.
    auto tile = [&](int v, int& who, int& b, i64& j0, i64& lim) {
        if (shared) {
            who = -1;
            b = n0 > 0 ? b0 : b1;
            j0 = jc + (i64)v * KT;
            lim = nmax;
        } else {
            who = v < nt0 ? 0 : 1;
            b = who ? b1 : b0;
            j0 = jc + (i64)(v < nt0 ? v : v - nt0) * KT;
            lim = who ? n1 : n0;
        }
    };

    // Both queries' heads (zero rows past h, or for a missing query) and weights.
    for (int c = tid; c < 2 * HP * CPR; c += NTH) {
        const int qi = c / (HP * CPR), hi = (c / CPR) % HP, ch = c % CPR;
        const bool ok = hi < h && (qi ? n1 : n0) > 0;
        const T* src = ok ? q + (row0 + r0 + qi) * q_st + hi * q_sh + ch * 8 : q;
        cp_async16(smem_u32(qs + (qi * HP + hi) * RS + ch * 8), src, ok);
    }
    for (int c = tid; c < 2 * HP; c += NTH) {
        const int qi = c / HP, hi = c % HP;
        wsm[c] = hi < h && (qi ? n1 : n0) > 0 ? load_w<T>(w, wf32, (row0 + r0 + qi) * w_st + hi * w_sh) : 0.f;
    }
    auto load_tile = [&](int v) {
        if (v < ntiles) {
            int who, b;
            i64 j0, lim;
            tile(v, who, b, j0, lim);
            load_key_tile(ks, v % STAGES, valid, cache, c_sb, c_sr, nb, bs, bt, bt_sb, bt_sc, b, j0, lim, RS, CPR,
                          tid, NTH);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) load_tile(i);
    uint32_t aq[2][DI / 16][4];

    for (int v = 0; v < ntiles; ++v) {
        load_tile(v + STAGES - 1);
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        if (v == 0) load_q_frags(qs, RS, g * HP + mw * 32, lane, aq);
        int who, b;
        i64 j0, lim;
        tile(v, who, b, j0, lim);
        const bool active = who < 0 || who == g;
        if (active) {
            const T* kt = ks + (v % STAGES) * KT * RS;
            float acc[2][4][4] = {};
            scores_from_regs<T>(acc, aq, kt, RS, nw, lane);
            float part[4][2] = {};
            weigh(part, acc, wsm, g * HP + mw * 32, lane);
            reduce_part(part, red, (g * 2 + mw) * KT, nw, lane);
        }
        __syncthreads();
        if (active && gt < KT) {
            const i64 j = j0 + gt;
            if (j < ng) {
                const float sc = __fadd_rn(red[(g * 2) * KT + gt], red[(g * 2 + 1) * KT + gt]);
                ws[(r0 + g) * ws_ld + j] =
                    valid[(v % STAGES) * KT + gt] ? score_key(__fadd_rn(__fmul_rn(scale, sc), 0.f)) : 0u;
            }
        }
        __syncthreads();
    }
}

#define VT_IDX_SCORES_PAIR(S, T)                                                                                \
    extern "C" __global__ void __launch_bounds__(2 * THREADS) indexer_scores_pair_##S(                          \
        u32* ws, i64 ws_ld, i64 row0, int rows, const T* q, i64 q_st, i64 q_sh, const void* w, i64 w_st,        \
        i64 w_sh, int wf32, const T* cache, i64 c_sb, i64 c_sr, int nb, int bs, const int* bt, i64 bt_sb,       \
        i64 bt_sc, int nseq, const int* seq_ids, i64 sid_s, const void* pos, i64 pos_s, int pos64, i64 cap,     \
        int h, int di, float scale, int nt) {                                                                   \
        indexer_scores_pair<T>(ws, ws_ld, row0, rows, q, q_st, q_sh, w, w_st, w_sh, wf32, cache, c_sb, c_sr, nb, \
                               bs, bt, bt_sb, bt_sc, nseq, seq_ids, sid_s, pos, pos_s, pos64, cap, h, scale, nt); \
    }
VT_IDX_SCORES_PAIR(bf16, bf16)
VT_IDX_SCORES_PAIR(f16, f16)

// ---------------------------------------------------------------------------------------
// Selection. The row's keys are read from shared memory when they fit (`row_cap` keys of
// dynamic shared memory; one global pass copies them), else from the workspace; both through
// a generic pointer, 16 bytes at a time.
namespace {

struct SelShared {
    u64 items[SORT_CAP];
    u32 hist[256];
    u32 scan[SEL_THREADS / 32];
    u32 count_gt;
    u32 eq_base;
    u32 prefix;
    u32 kth;
    u32 total;
};
static_assert(sizeof(SelShared) <= SEL_SHARED_BYTES, "the select's bookkeeping outgrew its shared memory");

// Candidate for this round: a valid key strictly below the last one written in
// (key desc, position asc) order; `first`: no bound yet.
__device__ __forceinline__ bool candidate(u32 key, i64 j, bool first, u32 bk, i64 bj) {
    return key != 0u && (first || key < bk || (key == bk && j > bj));
}

// Bitonic sort of items[0 .. m2) descending (m2 a power of two; entries past the
// selection are 0 and sink).
__device__ void sort_desc(u64* items, int m2) {
    for (int k = 2; k <= m2; k <<= 1) {
        for (int jj = k >> 1; jj > 0; jj >>= 1) {
            for (int i = threadIdx.x; i < m2; i += blockDim.x) {
                const int p = i ^ jj;
                if (p > i) {
                    const u64 x = items[i], y = items[p];
                    // Blocks with (i & k) == 0 sort descending, the others ascending.
                    const bool desc = (i & k) == 0;
                    if (desc ? x < y : x > y) {
                        items[i] = y;
                        items[p] = x;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// Keys jb .. jb + R of `keys` (0 past n): R / 4 16-byte loads when whole. (I: i64, or u32
// where the caller knows n < 2^31, which saves the 64-bit index math.)
template <int R, typename I>
__device__ __forceinline__ void load_run(const u32* keys, I jb, I n, u32 (&k)[R]) {
    if (jb + R <= n) {
        const uint4* v = reinterpret_cast<const uint4*>(keys + jb);
#pragma unroll
        for (int u = 0; u < R / 4; ++u) {
            const uint4 x = v[u];
            k[4 * u] = x.x;
            k[4 * u + 1] = x.y;
            k[4 * u + 2] = x.z;
            k[4 * u + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < R; ++e) k[e] = jb + e < n ? keys[jb + e] : 0u;
    }
}

// Exclusive scan of cnt over the block in thread order: this thread's offset; the block's
// total lands in s.total. Every thread calls it (two __syncthreads); the caller syncs before
// s.scan or s.total is written again.
__device__ __forceinline__ u32 block_scan(SelShared& s, u32 cnt) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 incl = cnt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == 31) s.scan[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const u32 wv = lane < SEL_THREADS / 32 ? s.scan[lane] : 0u;
        u32 wi = wv;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 v = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += v;
        }
        if (lane < SEL_THREADS / 32) s.scan[lane] = wi - wv;
        if (lane == 31) s.total = wi;
    }
    __syncthreads();
    return s.scan[warp] + incl - cnt;
}

// Radix select over the candidates among keys[0 .. n) (index = position order): leaves the
// want-th best candidate's key in s.prefix and its rank among equal keys in s.kth, or
// s.kth = ALL and their count in s.total when there are no more than want. Every thread
// calls it.
__device__ void radix_kth(SelShared& s, const u32* keys, i64 n, u32 want, bool first, u32 bk, i64 bj) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr i64 TILE = (i64)PER_THREAD * SEL_THREADS;
    if (tid == 0) {
        s.prefix = 0;
        s.kth = want;
    }
    u32 mask = 0;
    for (int d = 3; d >= 0; --d) {
        for (int i = tid; i < 256; i += SEL_THREADS) s.hist[i] = 0;
        __syncthreads();
        const u32 prefix = s.prefix;
        const int sh = d * 8;
        // Scores crowd into few bins (a pass's digit is often the same for most keys) and
        // same-address shared atomics serialize: a warp whose candidates share one bin adds
        // them with one atomic (vote), other warps per lane.
        for (i64 j0 = 0; j0 < n; j0 += TILE) {
            const i64 jb = j0 + (i64)tid * PER_THREAD;
            u32 k[PER_THREAD];
            load_run(keys, jb, n, k);
#pragma unroll
            for (int e = 0; e < PER_THREAD; ++e) {
                const bool c = candidate(k[e], jb + e, first, bk, bj) && (k[e] & mask) == prefix;
                const unsigned act = __ballot_sync(0xffffffffu, c);
                if (act == 0u) continue;
                const u32 bin = (k[e] >> sh) & 255u;
                const int leader = __ffs(act) - 1;
                const u32 lb = __shfl_sync(0xffffffffu, bin, leader);
                if (__all_sync(0xffffffffu, !c || bin == lb)) {
                    if (lane == leader) atomicAdd(&s.hist[lb], (u32)__popc(act));
                } else if (c) {
                    atomicAdd(&s.hist[bin], 1u);
                }
            }
        }
        __syncthreads();
        if (warp == 0) {
            // Digits from the top: the digit where the running count reaches kth.
            const u32 kth = s.kth;
            u32 c[8], sum = 0;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                c[i] = s.hist[255 - (lane * 8 + i)];
                sum += c[i];
            }
            u32 incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u32 v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const u32 total = __shfl_sync(0xffffffffu, incl, 31);
            if (d == 3 && total <= kth) {
                // No more candidates than wanted: take them all.
                if (lane == 0) {
                    s.total = total;
                    s.prefix = 1u;
                    s.kth = ALL;
                }
            } else {
                // Exactly one lane's digits span rank kth (total >= kth here).
                const u32 before = incl - sum;
                if (before < kth && kth <= incl) {
                    u32 run = before;
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        if (run < kth && kth <= run + c[i]) {
                            s.prefix = prefix | ((u32)(255 - (lane * 8 + i)) << sh);
                            s.kth = kth - run;
                        }
                        run += c[i];
                    }
                }
            }
        }
        __syncthreads();
        if (s.kth == ALL) break;
        mask |= 255u << sh;
    }
}

// ---------------------------------------------------------------------------------------
// Fast selection (file comment, 2.): a bound, one ordered pass, a stable sort.

// Counters of the stable sort: per warp, per digit (rows padded by one: the leaders of one
// warp's distinct digits, and the scan's threads, hit distinct banks).
constexpr int HIST_LD = 257;
constexpr int GATHER_RUN = 8;  // consecutive keys a thread takes per tile of the pass

struct FastShared {
    u32 key[2][SORT_CAP];  // candidates (keys, positions), and the sort's second buffer
    u32 pos[2][SORT_CAP];
    u32 hist[SEL_WARPS][HIST_LD];
    u32 wsum[2][SEL_WARPS];  // per-warp partials of the scans and sums, two alternating sets
    u32 kor, kand;           // OR and AND of the candidates' keys
};
static_assert(sizeof(FastShared) <= FAST_SHARED_BYTES, "the fast select outgrew its shared memory");
static_assert(SEL_WARPS == 32, "the block scans take one warp total a lane");
static_assert(SORT_CAP <= 4 * SEL_THREADS, "the sort holds at most 4 items a thread");

// Exclusive scan of v over the block in thread order; `total` gets the block's sum. One
// __syncthreads: the warp totals go to wsum[ph] and every warp scans all 32 of them, and
// consecutive calls alternate ph, so a call never overwrites totals another warp may still
// be reading (those of two calls back were read before the last barrier).
__device__ __forceinline__ u32 scan_excl(FastShared& f, int& ph, u32 v, u32& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 x = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl += x;
    }
    if (lane == 31) f.wsum[ph][warp] = incl;
    __syncthreads();
    const u32 w = f.wsum[ph][lane];
    u32 wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 x = __shfl_up_sync(FULL, wi, o);
        if (lane >= o) wi += x;
    }
    total = __shfl_sync(FULL, wi, 31);
    const u32 before = __shfl_sync(FULL, wi - w, warp);
    ph ^= 1;
    return before + incl - v;
}

// Sum of v over the block (one __syncthreads, wsum[ph] as scan_excl).
__device__ __forceinline__ u32 block_sum(FastShared& f, int& ph, u32 v) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = __reduce_add_sync(FULL, v);
    if (lane == 0) f.wsum[ph][warp] = v;
    __syncthreads();
    const u32 t = __reduce_add_sync(FULL, f.wsum[ph][lane]);
    ph ^= 1;
    return t;
}

// A key L with lo <= (sample keys >= L) <= hi, or exactly lo of them when ties leave no such
// L (the lo-th best sample key): the largest L with at least lo, bit by bit from the top,
// stopping at the first that also has at most hi. 0 when fewer than lo sample keys are valid.
__device__ u32 sample_bound(FastShared& f, int& ph, const u32 (&smp)[4], u32 lo, u32 hi) {
    u32 l = 0;
    for (int bit = 31; bit >= 0; --bit) {
        const u32 c = l | (1u << bit);
        const u32 cnt = block_sum(f, ph, (u32)(smp[0] >= c) + (smp[1] >= c) + (smp[2] >= c) + (smp[3] >= c));
        if (cnt >= lo) {
            l = c;
            if (cnt <= hi) break;
        }
    }
    return l;
}

// k[e] for a run-time e < 8 (indexing the array by e would put it in local memory).
__device__ __forceinline__ u32 pick8(const u32 (&k)[8], int e) {
    const bool b0 = e & 1, b1 = e & 2;
    const u32 a = b0 ? k[1] : k[0], b = b0 ? k[3] : k[2], c = b0 ? k[5] : k[4], d = b0 ? k[7] : k[6];
    return (e & 4) ? (b1 ? d : c) : (b1 ? b : a);
}

// One pass over keys[0 .. n), 0 < n < 2^31, for a bound lo >= 1 (key 0, no token, never
// passes): the keys above lo with their positions into key[0] / pos[0] and those equal to it
// into key[1] / pos[1], each in position order (the first SORT_CAP of each). Returns the two
// counts (also past SORT_CAP); `vary` gets the bits in which the stored keys above lo differ.
// One barrier a tile of GATHER_RUN keys a thread (a block scan of both counts, 16 bits each);
// the next tile's loads are in flight meanwhile (8 keys, not 16: 16 + 16 in registers spill).
// A thread visits only its passing keys (few, past the first tile of a long row).
__device__ void gather(FastShared& f, int& ph, const u32* keys, u32 n, u32 lo, u32& n_gt, u32& n_eq, u32& vary) {
    const int tid = threadIdx.x, lane = tid & 31;
    constexpr u32 TILE = (u32)GATHER_RUN * SEL_THREADS;
    static_assert(GATHER_RUN == 8 && TILE < 65536, "pick8; a tile's counts are packed in 16 bits");
    // (kor / kand of a previous call were read after its last barrier, before this one.)
    __syncthreads();
    if (tid == 0) {
        f.kor = 0;
        f.kand = FULL;
    }
    u32 kor = 0, kand = FULL, base_gt = 0, base_eq = 0;
    u32 k[GATHER_RUN];
    load_run(keys, (u32)tid * GATHER_RUN, n, k);
    for (u32 j0 = 0; j0 < n; j0 += TILE) {
        const u32 jb = j0 + (u32)tid * GATHER_RUN;
        u32 gt = 0, eq = 0;
#pragma unroll
        for (int e = 0; e < GATHER_RUN; ++e) {
            gt |= (u32)(k[e] > lo) << e;
            eq |= (u32)(k[e] == lo) << e;
        }
        u32 nk[GATHER_RUN];
        load_run(keys, jb + TILE, n, nk);
        u32 total;
        const u32 at = scan_excl(f, ph, (u32)__popc(gt) | (u32)__popc(eq) << 16, total);
        u32 at_gt = base_gt + (at & 0xffffu), at_eq = base_eq + (at >> 16);
        for (u32 sel = gt | eq; sel != 0u; sel &= sel - 1u) {
            const int e = __ffs(sel) - 1;
            if ((gt >> e) & 1u) {
                if (at_gt < (u32)SORT_CAP) {
                    const u32 key = pick8(k, e);
                    f.key[0][at_gt] = key;
                    f.pos[0][at_gt] = jb + (u32)e;
                    kor |= key;
                    kand &= key;
                }
                ++at_gt;
            } else {
                if (at_eq < (u32)SORT_CAP) {
                    f.key[1][at_eq] = lo;
                    f.pos[1][at_eq] = jb + (u32)e;
                }
                ++at_eq;
            }
        }
        base_gt += total & 0xffffu;
        base_eq += total >> 16;
#pragma unroll
        for (int e = 0; e < GATHER_RUN; ++e) k[e] = nk[e];
    }
    // (tid 0's initial values are ordered before these by the tile loop's barrier: n > 0.)
    kor = __reduce_or_sync(FULL, kor);
    kand = __reduce_and_sync(FULL, kand);
    if (lane == 0) {
        atomicOr(&f.kor, kor);
        atomicAnd(&f.kand, kand);
    }
    __syncthreads();
    n_gt = base_gt;
    n_eq = base_eq;
    vary = f.kor ^ f.kand;
}

// Stable LSD radix sort of the m <= SORT_CAP items key[0] / pos[0] by key, descending: equal
// keys keep their order (position order). 8-bit digits, those in which no two keys differ
// (`vary`) skipped. Returns the buffer holding the result. Warp w takes items
// [w ipt 32, (w + 1) ipt 32) (ipt = ceil(m / 1024) <= 4), slot by slot, lanes in order; an
// item's rank among its warp's equal digits comes from its peers (8 ballots, no
// same-address atomics: one counter update per distinct digit), the per-warp counts are
// scanned in (digit, warp) order, then the items scatter. 4 barriers a pass.
__device__ int sort_stable_desc(FastShared& f, int& ph, u32 m, u32 vary) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ipt = (int)((m + SEL_THREADS - 1) / SEL_THREADS);
    const u32 below = (1u << lane) - 1u;
    int src = 0;
    for (int sh = 0; sh < 32; sh += 8) {
        if (((vary >> sh) & 255u) == 0u) continue;
        u32* hist = f.hist[warp];
#pragma unroll
        for (int i = 0; i < 256; i += 32) hist[i + lane] = 0;
        __syncwarp();
        // Ranks (the items themselves are read again to scatter: fewer live registers).
        u32 rk[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (e < ipt) {
                const u32 idx = (u32)(warp * ipt + e) * 32u + (u32)lane;
                const bool v = idx < m;
                // Ascending digit order = descending key.
                const u32 d = 255u - (((v ? f.key[src][idx] : 0u) >> sh) & 255u);
                u32 peers = __ballot_sync(FULL, v);
#pragma unroll
                for (int bit = 0; bit < 8; ++bit) {
                    const bool p = d & (1u << bit);
                    // The lanes whose bit equals this lane's: the ballot, or its complement.
                    peers &= __ballot_sync(FULL, p) ^ (p ? 0u : FULL);
                }
                const int leader = v ? __ffs(peers) - 1 : lane;
                u32 old = 0;
                if (v && lane == leader) old = atomicAdd(&hist[d], (u32)__popc(peers));
                old = __shfl_sync(FULL, old, leader);
                rk[e] = old + (u32)__popc(peers & below);
                // (This slot's counter updates land before the next slot's reads them.)
                __syncwarp();
            }
        }
        __syncthreads();
        {
            // Thread t: digit t / 4, warps (t % 4) * 8 .. + 8; thread order = (digit, warp).
            const int d = tid >> 2, w0 = (tid & 3) * 8;
            u32 c[8], sum = 0;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                c[i] = f.hist[w0 + i][d];
                sum += c[i];
            }
            u32 total;
            u32 at = scan_excl(f, ph, sum, total);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                f.hist[w0 + i][d] = at;
                at += c[i];
            }
        }
        __syncthreads();
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const u32 idx = (u32)(warp * ipt + e) * 32u + (u32)lane;
            if (e < ipt && idx < m) {
                const u32 key = f.key[src][idx];
                const u32 dst = hist[255u - ((key >> sh) & 255u)] + rk[e];
                f.key[src ^ 1][dst] = key;
                f.pos[src ^ 1][dst] = f.pos[src][idx];
            }
        }
        __syncthreads();
        src ^= 1;
    }
    return src;
}

// The fast selection of one row of 0 < n < 2^31 keys (the host checks cap < 2^31), topk <=
// SORT_CAP: writes orow and returns
// true, or returns false having written nothing (the bound failed or does not apply; the
// general path then runs). Not inlined: inlined into the kernel beside the general path,
// ptxas spills registers at 1024 threads (64 a thread); as a call neither spills.
__device__ __noinline__ bool select_fast(FastShared& f, int* orow, i64 o_sk, int topk, const u32* keys, i64 n, const int* bt,
                            i64 bt_sb, i64 bt_sc, int b, int bs) {
    const int tid = threadIdx.x;
    int ph = 0;
    u32 vary = 0, n_gt = 0, n_eq = 0, lo = 1;
    // The bound holds when the keys above it fit and, with those equal to it, reach topk
    // (or it is 1: every valid key).
    auto holds = [&]() { return n_gt <= (u32)SORT_CAP && (n_gt + n_eq >= (u32)topk || lo == 1u); };
    if (n <= SORT_CAP) {
        gather(f, ph, keys, (u32)n, lo, n_gt, n_eq, vary);
    } else {
        // The bound needs room between topk and SORT_CAP for the sample's error.
        if (3 * topk > 2 * SORT_CAP) return false;
        constexpr i64 SAMPLE = 4 * SEL_THREADS;
        u32 smp[4];
        {
            // Chunk t of 4 consecutive keys, evenly spaced (16 bytes: one sector a thread).
            const i64 q = ((i64)tid * n / SEL_THREADS) & ~(i64)3;
#pragma unroll
            for (int e = 0; e < 4; ++e) smp[e] = q + e < n ? keys[q + e] : 0u;
        }
        const i64 target = ((i64)topk + SORT_CAP) / 2;
        // The sample rank whose key about `target` keys of the row reach.
        i64 rank = max((i64)1, target * SAMPLE / n);
        bool ok = false;
        for (int attempt = 0; attempt < 3 && !ok; ++attempt) {
            lo = 1;
            if (rank < SAMPLE) {
                const u32 r = (u32)rank, d = r / 16;
                lo = max(1u, sample_bound(f, ph, smp, r - d, r + d));
            }
            gather(f, ph, keys, (u32)n, lo, n_gt, n_eq, vary);
            ok = holds();
            if (!ok) {
                // Scale the rank by how far the count missed the target.
                const i64 c = n_gt > (u32)SORT_CAP ? (i64)n_gt : (i64)n_gt + n_eq;
                rank = min(SAMPLE, max((i64)1, rank * target / max(c, (i64)1)));
            }
        }
        if (!ok) {
            __syncthreads();  // (the general path reuses this shared memory)
            return false;
        }
    }
    // Too few above the bound: the first of those equal to it (position order) follow them;
    // they sort last, in that order.
    const u32 add = n_gt < (u32)topk ? min(n_eq, (u32)topk - n_gt) : 0u;
    for (u32 i = tid; i < add; i += SEL_THREADS) {
        f.key[0][n_gt + i] = f.key[1][i];
        f.pos[0][n_gt + i] = f.pos[1][i];
    }
    const u32 m = n_gt + add;
    if (add > 0) vary = n_gt > 0 ? vary | (f.key[0][0] ^ lo) : 0u;
    __syncthreads();
    const int src = m > 1 ? sort_stable_desc(f, ph, m, vary) : 0;
    const u32 written = min(m, (u32)topk);
    for (u32 i = tid; i < written; i += SEL_THREADS) {
        orow[(i64)i * o_sk] = slot_of(bt, bt_sb, bt_sc, b, f.pos[src][i], bs);
    }
    for (int i = (int)written + tid; i < topk; i += SEL_THREADS) orow[(i64)i * o_sk] = -1;
    return true;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(SEL_THREADS) indexer_select_f32(
    int* out, i64 o_st, i64 o_sk, int topk, const u32* ws, i64 ws_ld, i64 row0, int rows, const int* bt, i64 bt_sb,
    i64 bt_sc, int nseq, int bs, const int* seq_ids, i64 sid_s, const void* pos, i64 pos_s, int pos64, i64 cap,
    int row_cap) {
    // All dynamic (the bookkeeping, then row_cap keys): the launch then raises the block's
    // shared-memory limit whenever the total passes 48 KB.
    extern __shared__ __align__(16) unsigned char sel_smem[];
    SelShared& s = *reinterpret_cast<SelShared*>(sel_smem);
    u32* srow = reinterpret_cast<u32*>(sel_smem + SEL_SHARED_BYTES);
    const int tid = threadIdx.x;
    constexpr i64 TILE = (i64)PER_THREAD * SEL_THREADS;
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 t = row0 + r;
        int b;
        const i64 n = visible(seq_ids, sid_s, pos, pos_s, pos64, t, nseq, cap, &b);
        const u32* keys = ws + (i64)r * ws_ld;  // 16-byte aligned: ws_ld % 4 == 0
        int* orow = out + t * o_st;
        if (n > 0 && topk <= SORT_CAP &&
            select_fast(*reinterpret_cast<FastShared*>(sel_smem), orow, o_sk, topk, keys, n, bt, bt_sb, bt_sc, b, bs)) {
            __syncthreads();  // (the next row reuses the shared memory)
            continue;
        }
        // Entries of `keys` and their positions (nullptr: the index).
        i64 ne = n;
        const u32* jmap = nullptr;
        if (n > 0 && n <= row_cap) {
            const uint4* src = reinterpret_cast<const uint4*>(keys);
            uint4* dst = reinterpret_cast<uint4*>(srow);
            for (i64 v = tid; v < (n + 3) / 4; v += SEL_THREADS) dst[v] = src[v];
            __syncthreads();
            keys = srow;
        } else if (n > row_cap && topk <= SORT_CAP && row_cap >= 2 * FILTER_SAMPLE) {
            // A row too long for shared memory: a strided sample's r-th best key (r about
            // 1.5x the sample's share of topk) bounds the top-k from below in the common
            // case; the keys at or above it go to shared memory in position order (keys,
            // then positions) and the selection runs on them. When fewer than topk or more
            // than fit pass, the row is read from the workspace instead. Either way exact:
            // with at least topk keys >= K, every key the top-k holds (and every key equal
            // to its last) is >= K.
            const int capp = row_cap / 2;
            u32* ck = srow;
            u32* cj = srow + capp;
            for (int i = tid; i < FILTER_SAMPLE; i += SEL_THREADS) ck[i] = keys[(i64)i * n / FILTER_SAMPLE];
            __syncthreads();
            const i64 rr = (i64)topk * FILTER_SAMPLE * 3 / (2 * n) + 32;
            radix_kth(s, ck, FILTER_SAMPLE, (u32)min(rr, (i64)FILTER_SAMPLE), true, 0u, -1);
            const u32 klo = s.kth == ALL ? 1u : s.prefix;
            __syncthreads();
            if (tid == 0) s.eq_base = 0;
            __syncthreads();
            for (i64 j0 = 0; j0 < n; j0 += TILE) {
                const i64 jb = j0 + (i64)tid * PER_THREAD;
                u32 k[PER_THREAD];
                load_run(keys, jb, n, k);
                u32 msk = 0;
#pragma unroll
                for (int e = 0; e < PER_THREAD; ++e)
                    if (k[e] >= klo) msk |= 1u << e;  // klo >= 1: key 0 (no token) never passes
                u32 at = s.eq_base + block_scan(s, __popc(msk));
#pragma unroll
                for (int e = 0; e < PER_THREAD; ++e) {
                    if ((msk >> e) & 1u) {
                        if (at < (u32)capp) {
                            ck[at] = k[e];
                            cj[at] = (u32)(jb + e);
                        }
                        ++at;
                    }
                }
                __syncthreads();
                if (tid == 0) s.eq_base += s.total;
                __syncthreads();
            }
            const u32 c = s.eq_base;
            __syncthreads();
            if (c >= (u32)topk && c <= (u32)capp) {
                keys = ck;
                jmap = cj;
                ne = c;
            }
        }
        int written = 0;
        bool first = true;
        u32 bk = 0;
        i64 bj = -1;
        while (written < topk && ne > 0) {
            const int want = min(topk - written, SORT_CAP);
            // (With jmap, one round: topk <= SORT_CAP, so `first` holds and candidate()
            // never reads the index as a position.)
            radix_kth(s, keys, ne, (u32)want, first, bk, bj);
            const bool all = s.kth == ALL;
            const u32 kstar = s.prefix;
            const u32 total = s.total;
            const int m = all ? (int)total : want;
            const u32 need_eq = all ? 0u : s.kth;
            __syncthreads();
            if (tid == 0) {
                s.count_gt = 0;
                s.eq_base = 0;
            }
            __syncthreads();
            // Collect: everything above K* (any order), the first need_eq equal to K* in
            // position order (each thread a run of PER_THREAD consecutive entries, runs in
            // thread order, a block scan of their counts), packed as key << 32 | ~j
            // (descending = key desc, j asc).
            const u32 n_gt = (u32)m - need_eq;
            const int lane = tid & 31;
            for (i64 j0 = 0; j0 < ne; j0 += TILE) {
                const i64 jb = j0 + (i64)tid * PER_THREAD;
                u32 k[PER_THREAD];
                load_run(keys, jb, ne, k);
                u32 eqmask = 0;
#pragma unroll
                for (int e = 0; e < PER_THREAD; ++e) {
                    const bool c = candidate(k[e], jb + e, first, bk, bj);
                    const bool gt = c && (all ? k[e] >= kstar : k[e] > kstar);
                    if (c && !gt && k[e] == kstar) eqmask |= 1u << e;
                    // One counter update per warp (slots in lane order).
                    const unsigned bg = __ballot_sync(0xffffffffu, gt);
                    if (bg == 0u) continue;
                    const int leader = __ffs(bg) - 1;
                    u32 base = 0;
                    if (lane == leader) base = atomicAdd(&s.count_gt, (u32)__popc(bg));
                    base = __shfl_sync(0xffffffffu, base, leader);
                    const u32 at = base + (u32)__popc(bg & ((1u << lane) - 1u));
                    if (gt && at < SORT_CAP) {
                        const u32 j = jmap ? jmap[jb + e] : (u32)(jb + e);
                        s.items[at] = ((u64)k[e] << 32) | (u64)(~j);
                    }
                }
                if (all) continue;
                u32 before = s.eq_base + block_scan(s, __popc(eqmask));
                // (Unrolled with a bit test: k[] indexed by a run-time value would live in
                // local memory.)
#pragma unroll
                for (int e = 0; e < PER_THREAD; ++e) {
                    if ((eqmask >> e) & 1u) {
                        if (before < need_eq) {
                            const u32 j = jmap ? jmap[jb + e] : (u32)(jb + e);
                            s.items[n_gt + before] = ((u64)k[e] << 32) | (u64)(~j);
                        }
                        ++before;
                    }
                }
                __syncthreads();
                if (tid == 0) s.eq_base += s.total;
                __syncthreads();
                const bool done = s.eq_base >= need_eq && s.count_gt >= n_gt;
                __syncthreads();
                if (done) break;
            }
            __syncthreads();
            int m2 = 1;
            while (m2 < m) m2 <<= 1;
            for (int i = m + tid; i < m2; i += SEL_THREADS) s.items[i] = 0;
            __syncthreads();
            sort_desc(s.items, m2);
            for (int i = tid; i < m; i += SEL_THREADS) {
                const u64 it = s.items[i];
                orow[(i64)(written + i) * o_sk] = slot_of(bt, bt_sb, bt_sc, b, ~(u32)(it & 0xffffffffu), bs);
            }
            if (m > 0) {
                const u64 last = s.items[m - 1];
                bk = (u32)(last >> 32);
                bj = (i64)(~(u32)(last & 0xffffffffu));
            }
            written += m;
            first = false;
            __syncthreads();
            if (m < want) break;
        }
        for (int i = written + tid; i < topk; i += SEL_THREADS) orow[(i64)i * o_sk] = -1;
        __syncthreads();
    }
}
