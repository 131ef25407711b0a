// MlaDecodeAttention: absorbed MQA decode attention over the paged latent cache.
//
// One KV head (the latent cache row, D = 576 in MLA) is shared by all N query heads, so each
// CTA handles a block of query rows (row = s * N + h over the s_q query tokens and N heads)
// and reads every KV row once for all of them. Work is split over CTAs by KV tiles of
// BN = 64 tokens (flash-decoding):
//
// - The grid is (num_parts, m_blocks). The tiles of all sequences, laid end to end, are cut
//   into num_parts equal ranges ("parts"), at least min_tiles long; part p covers tiles
//   [p*Q, (p+1)*Q). Each CTA computes this schedule itself from seq_lens (a block-wide
//   scan; one pass when B <= blockDim), so there is no host sync and no metadata kernel,
//   and mixed lengths balance.
// - A part that holds a whole sequence writes out and lse directly. A sequence cut over
//   several parts writes one normalized partial (O / l and its log2-sum-exp) per part into
//   slot p + b of the partial buffers (unique: p + b grows along the tile stream), and the
//   combine kernel merges them. The part that holds a sequence's first tile records
//   (first slot, number of slots) in seq_info for the combine kernel.
// - Empty sequences (and queries that see no key) get out = 0 and lse = -inf.
//
// Kernels (all take one Params struct):
// - mla_decode_generic_{bf16,f16,f32}: any D, Dv, strides; a warp per key, f32 math. One
//   query row per CTA. Simple and obviously right; used for f32 and unusual shapes.
//   mla_decode_generic_fp8_*: the same over an fp8_ds_mla cache, dequantized on load.
// - mla_decode_mma{16,32,64}_{bf16,f16}: D = 576, Dv = 512, 16/32/64 query rows per CTA,
//   mma.sync m16n8k16 tensor cores (sm_80+), KV tiles loaded with cp.async as 32-token
//   halves into a ring of five (four at 64 rows) 128-byte-swizzled half-tile slots,
//   ldmatrix fragments. mla_decode_mma{16,32,64}s_*: the same with a ring of three (two at
//   64 rows), for devices with less shared memory per block (an A100's 164 KB).
// - mla_decode_wgmma_{bf16,f16}: sm_90a only (compiled when __CUDA_ARCH_FEAT_SM90_ALL is
//   defined): 64 query rows, same loader and layout, Hopper wgmma from shared memory, a
//   consumer warpgroup (S = Q K^T, softmax, half of P V) and a producer warpgroup (loads,
//   other half of P V) synchronized by named barriers (see the section's comment).
// - mla_decode_combine_{bf16,f16,f32}: merges the partials of cut sequences and writes
//   empty sequences. Launched with programmatic dependent launch on sm_90 (the main
//   kernels trigger it early; it waits with griddepcontrol.wait).
//
// Measurements and the reasons behind these choices: docs/perf.md.
//
// Softmax runs in the log2 domain (scale_log2 = scale * log2(e)); partial lse are log2,
// the lse output is natural log.
#include "common.cuh"
#include "fp8_ds_mla.cuh"
#include "tensor_core.cuh"

namespace mla {

using namespace vt::tc;

constexpr int BN = 64;           // KV tokens per tile: the unit of the split
constexpr int THREADS = 256;     // main kernels: 8 warps
constexpr int GEN_THREADS = 128; // generic kernel: 4 warps, a key each
constexpr int FD = 576;          // fast-path head dim (kv_lora_rank 512 + rope 64)
constexpr int FDV = 512;         // fast-path value dim
constexpr int NSUB = FD / 64;    // 64-feature (128-byte) column blocks of a 16-bit row
constexpr int CHUNKS = FD / 8;   // 16-byte chunks of a row
constexpr int SUB_BYTES = BN * 128;          // one column block of a KV tile
constexpr int TILE_BYTES = NSUB * SUB_BYTES; // one KV tile in shared memory (73728)
constexpr int HALF = BN / 2;                 // mma kernels: tokens per half tile (load unit)
constexpr int HSUB_BYTES = HALF * 128;       // one column block of a half tile
constexpr int HALF_BYTES = NSUB * HSUB_BYTES; // one half tile in shared memory (36864)
constexpr float LN2 = 0.6931471805599453f;

// Must match `Params` in crates/vt-cuda/src/mla_decode_attention.rs (repr(C)).
struct Params {
    const void* q;           // [B, s_q, N, D]
    void* out;               // [B, s_q, N, Dv]
    float* lse;              // [B, N, s_q] or null
    const void* cache;       // [NB, BS, D]
    const int* block_table;  // [B, MB]
    const int* seq_lens;     // [B]
    float* part_o;           // [slots, m_total, Dv]
    float* part_lse;         // [slots, m_total] (log2)
    int* seq_info;           // [B, 2]: first slot, number of slots
    i64 q_sb, q_ss, q_sh;
    i64 o_sb, o_ss, o_sh;
    i64 l_sb, l_sh, l_ss;
    i64 c_sblk, c_srow;
    i64 bt_sb, bt_sm;
    i64 sl_s;
    int B, s_q, N, d, dv, NB, BS, MB;
    int m_total;    // s_q * N query rows per sequence
    int num_parts;  // grid.x
    int min_tiles;  // fewest tiles per part (bounds the partial traffic)
    int combine_wpr;  // combine kernel: warps per query row, 1 or 8
    float scale_log2;
};

// Programmatic dependent launch (sm_90): the main kernels let the combine kernel launch
// early; the combine waits for the main grid's completion (and memory) before reading.
// Both are no-ops without the launch attribute and on older architectures.
__device__ __forceinline__ void grid_dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------------------
// Schedule
// ---------------------------------------------------------------------------------------

// Tokens of sequence b that exist: seq_lens clamped to [0, MB * BS] (past the block table
// nothing can be read; the CPU reference rejects such input, the GPU skips it).
__device__ __forceinline__ int eff_len(const Params& p, int b) {
    const int len = __ldg(p.seq_lens + (i64)b * p.sl_s);
    const i64 cap = (i64)p.MB * p.BS;
    if (len <= 0) return 0;
    return (i64)len > cap ? (int)cap : len;
}

__device__ __forceinline__ int tiles_of(int len) { return (len + BN - 1) / BN; }

// Inclusive prefix sum over the block; `total` gets the block's sum. Uses s[0..32).
__device__ __forceinline__ int block_scan_incl(int v, int* s, int& total) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    if (lane == 31) s[w] = v;
    __syncthreads();
    if (w == 0) {
        int x = lane < nw ? s[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int n = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += n;
        }
        if (lane < nw) s[lane] = x;
    }
    __syncthreads();
    const int add = w > 0 ? s[w - 1] : 0;
    total = s[nw - 1];
    __syncthreads();
    return v + add;
}

struct Part {
    i64 begin, end;  // global tile range of this part
    i64 q;           // tiles per part
    int b;           // first sequence with a tile in the range (B if none)
    i64 pre;         // global index of that sequence's first tile
};

// This CTA's tile range [begin, end) of the `total` tiles of the batch: an even share of at
// least min_tiles; b and pre say "nothing found" (the caller fills them in).
__device__ __forceinline__ Part part_bounds(const Params& p, i64 total) {
    i64 q = (total + p.num_parts - 1) / p.num_parts;
    if (q < p.min_tiles) q = p.min_tiles;
    if (q < 1) q = 1;
    Part r;
    r.q = q;
    r.begin = (i64)blockIdx.x * q;
    r.end = r.begin + q < total ? r.begin + q : total;
    r.b = p.B;
    r.pre = total;
    return r;
}

// The part of this CTA (blockIdx.x). Called by the whole block; every thread gets the same
// result. `s` is 40 ints of shared memory.
__device__ Part find_part(const Params& p, int* s) {
    if (p.B <= (int)blockDim.x) {
        // One pass: thread b owns sequence b.
        const int b = threadIdx.x;
        const int t = b < p.B ? tiles_of(eff_len(p, b)) : 0;
        int t_total = 0;
        const int incl = block_scan_incl(t, s, t_total);
        const i64 total = t_total;
        Part r = part_bounds(p, total);
        if (r.begin >= total) return r;
        const i64 pre = incl - t;
        if (t > 0 && pre <= r.begin && r.begin < pre + t) {
            s[33] = b;
            s[34] = (int)pre;
        }
        __syncthreads();
        r.b = s[33];
        r.pre = s[34];
        __syncthreads();
        return r;
    }
    int t_total = 0, local = 0;
    for (int b = threadIdx.x; b < p.B; b += blockDim.x) local += tiles_of(eff_len(p, b));
    block_scan_incl(local, s, t_total);
    const i64 total = t_total;
    Part r = part_bounds(p, total);
    if (r.begin >= total) return r;
    if (threadIdx.x == 0) s[33] = -1;
    __syncthreads();
    i64 carry = 0;
    for (int base = 0; base < p.B; base += blockDim.x) {
        const int b = base + threadIdx.x;
        const int t = b < p.B ? tiles_of(eff_len(p, b)) : 0;
        int chunk = 0;
        const i64 pre = carry + block_scan_incl(t, s, chunk) - t;
        if (t > 0 && pre <= r.begin && r.begin < pre + t) {
            s[33] = b;
            s[34] = (int)pre;
        }
        __syncthreads();
        if (s[33] >= 0) break;
        carry += chunk;
    }
    r.b = s[33];
    r.pre = s[34];
    __syncthreads();
    return r;
}

// One sequence's share of a part: local tiles [t0, t1) of sequence b.
struct Segment {
    int b, len, t0, t1, slot;
    bool whole;  // the part holds all of b's tiles: write out/lse directly
};

// Walks the sequences of a part; returns false when done. `pre` and `b` carry the state.
__device__ __forceinline__ bool next_segment(const Params& p, const Part& part, int& b, i64& pre,
                                             Segment& sg) {
    while (b < p.B && pre < part.end) {
        const int len = eff_len(p, b);
        const int t = tiles_of(len);
        const i64 first = pre;
        pre += t;
        const int cur = b++;
        if (t == 0) continue;
        sg.b = cur;
        sg.len = len;
        sg.t0 = (int)((part.begin > first ? part.begin : first) - first);
        sg.t1 = (int)((part.end < pre ? part.end : pre) - first);
        sg.whole = first >= part.begin && pre <= part.end;
        sg.slot = (int)blockIdx.x + cur;
        if (first >= part.begin && blockIdx.y == 0 && threadIdx.x == 0) {
            const i64 last_part = (pre - 1) / part.q;
            p.seq_info[2 * cur] = sg.slot;
            p.seq_info[2 * cur + 1] = (int)(last_part - blockIdx.x + 1);
        }
        return true;
    }
    return false;
}

// Writes one query row's two adjacent output values (final or partial). 16-bit only: the
// tensor-core kernels run only where out is 16-byte aligned with strides multiple of 8.
template <typename T>
__device__ __forceinline__ void store_pair(const Params& p, const Segment& sg, int row, int col, float v0,
                                           float v1) {
    if (sg.whole) {
        const int s = row / p.N, h = row - s * p.N;
        T* o = (T*)p.out + sg.b * p.o_sb + s * p.o_ss + h * p.o_sh + col;
        *reinterpret_cast<uint32_t*>(o) = pack2<T>(v0, v1);
    } else {
        float2* o = (float2*)(p.part_o + ((i64)sg.slot * p.m_total + row) * p.dv + col);
        *o = make_float2(v0, v1);
    }
}

template <typename T>
__device__ __forceinline__ void store_lse(const Params& p, const Segment& sg, int row, float lse2) {
    if (sg.whole) {
        if (p.lse != nullptr) {
            const int s = row / p.N, h = row - s * p.N;
            p.lse[sg.b * p.l_sb + h * p.l_sh + s * p.l_ss] = lse2 * LN2;
        }
    } else {
        p.part_lse[(i64)sg.slot * p.m_total + row] = lse2;
    }
}

// ---------------------------------------------------------------------------------------
// Generic kernel: any D and Dv, any float type. grid (num_parts, m_total), 128 threads.
// Dynamic shared memory: D + 4 * Dv floats.
// ---------------------------------------------------------------------------------------
// Key value i of a cache row: a T element, or (FP8) value i of an fp8_ds_mla row
// dequantized on load (fp8_ds_mla.cuh), the same f32 the CPU reference attends over.
template <typename T, bool FP8> struct KeyRow;
template <typename T> struct KeyRow<T, false> {
    const T* k;
    __device__ KeyRow(const void* cache, i64 off) : k((const T*)cache + off) {}
    __device__ __forceinline__ float operator[](int i) const { return vt::to_f32(k[i]); }
};
template <typename T> struct KeyRow<T, true> {
    const unsigned char* k;
    __device__ KeyRow(const void* cache, i64 off) : k((const unsigned char*)cache + off) {}
    __device__ __forceinline__ float operator[](int i) const { return vt::fp8ds::value(k, i); }
};

template <typename T, bool FP8 = false>
__device__ void decode_generic(const Params& p) {
    __shared__ int sched[40];
    __shared__ float wm[4], wl[4];
    extern __shared__ float gdyn[];
    float* qrow = gdyn;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* ow = gdyn + p.d + warp * p.dv;
    const int row = blockIdx.y;
    const int s = row / p.N, h = row - s * p.N;
    grid_dep_launch();
    const Part part = find_part(p, sched);
    int b = part.b;
    i64 pre = part.pre;
    Segment sg;
    while (next_segment(p, part, b, pre, sg)) {
        const T* q = (const T*)p.q + sg.b * p.q_sb + s * p.q_ss + h * p.q_sh;
        for (int i = threadIdx.x; i < p.d; i += blockDim.x) qrow[i] = vt::to_f32(q[i]);
        for (int i = lane; i < p.dv; i += 32) ow[i] = 0.0f;
        __syncthreads();
        const int lim = sg.len - p.s_q + s + 1;  // keys this query sees (causal, bottom-right)
        const int j_end = min(sg.t1 * BN, lim);
        float m = vt::neg_inf(), l = 0.0f;
        for (int j = sg.t0 * BN + warp; j < j_end; j += 4) {
            const int bi = j / p.BS;
            const int blk = __ldg(p.block_table + sg.b * p.bt_sb + bi * p.bt_sm);
            if (blk < 0 || blk >= p.NB) continue;
            const KeyRow<T, FP8> k(p.cache, blk * p.c_sblk + (i64)(j - bi * p.BS) * p.c_srow);
            float dot = 0.0f;
            for (int i = lane; i < p.d; i += 32) dot = fmaf(qrow[i], k[i], dot);
            dot = vt::warp_sum(dot) * p.scale_log2;
            const float mn = fmaxf(m, dot);
            const float a = exp2f(m - mn);
            const float pj = exp2f(dot - mn);
            l = l * a + pj;
            m = mn;
            for (int i = lane; i < p.dv; i += 32) ow[i] = fmaf(pj, k[i], ow[i] * a);
        }
        if (lane == 0) {
            wm[warp] = m;
            wl[warp] = l;
        }
        __syncthreads();
        float mx = fmaxf(fmaxf(wm[0], wm[1]), fmaxf(wm[2], wm[3]));
        float f[4], sum = 0.0f;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            f[w] = wm[w] == vt::neg_inf() ? 0.0f : exp2f(wm[w] - mx);
            sum += f[w] * wl[w];
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int i = threadIdx.x; i < p.dv; i += blockDim.x) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < 4; ++w) v += f[w] * gdyn[p.d + w * p.dv + i];
            v *= inv;
            if (sg.whole) {
                T* o = (T*)p.out + sg.b * p.o_sb + s * p.o_ss + h * p.o_sh;
                o[i] = vt::from_f32<T>(v);
            } else {
                p.part_o[((i64)sg.slot * p.m_total + row) * p.dv + i] = v;
            }
        }
        if (threadIdx.x == 0) store_lse<T>(p, sg, row, sum > 0.0f ? mx + log2f(sum) : vt::neg_inf());
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------
// Combine: grid (B, ceil(m_total / (8 / W)), ceil(Dv / 128)), 256 threads, W = combine_wpr
// warps per query row (1 or 8), each taking every W-th partial of the row; lane l owns
// columns l + 32 k of the CTA's 128. With W = 8 a b = 1 call spreads its ~100 partials per
// row over 8 warps, so the read is not one long dependent chain.
// ---------------------------------------------------------------------------------------
template <typename T>
__device__ void combine(const Params& p) {
    __shared__ float red[8][128];
    grid_dep_wait();
    const int W = p.combine_wpr;
    const int b = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.y * (8 / W) + warp / W;
    const int sub = warp % W;
    const bool active = row < p.m_total;
    // Loaded together (one round trip); seq_info is stale for empty sequences and unused.
    const int len = eff_len(p, b);
    const int first = p.seq_info[2 * b], n_info = p.seq_info[2 * b + 1];
    const int n = len > 0 ? n_info : 0;
    if (len > 0 && n <= 1) return;  // written by the main kernel (uniform over the block)
    const int r = active ? row : 0;
    const float* plse = p.part_lse + (i64)first * p.m_total + r;
    // One pass over the partial lse: running max and a sum rescaled to it (log2 domain).
    float mx = vt::neg_inf(), sum = 0.0f;
    for (int c = lane; c < n; c += 32) {
        const float v = plse[(i64)c * p.m_total];
        if (v == vt::neg_inf()) continue;
        if (v > mx) {
            sum *= exp2f(mx - v);
            mx = v;
        }
        sum += exp2f(v - mx);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, mx, o);
        const float os = __shfl_xor_sync(0xffffffffu, sum, o);
        const float m2 = fmaxf(mx, om);
        sum = (mx == vt::neg_inf() ? 0.0f : sum * exp2f(mx - m2)) + (om == vt::neg_inf() ? 0.0f : os * exp2f(om - m2));
        mx = m2;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int c0 = blockIdx.z * 128 + lane;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (active && sum > 0.0f) {
        const float* po = p.part_o + ((i64)first * p.m_total + r) * p.dv;
        const i64 slot_stride = (i64)p.m_total * p.dv;
#pragma unroll 8
        for (int c = sub; c < n; c += W) {
            const float w = exp2f(plse[(i64)c * p.m_total] - mx) * inv;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int col = c0 + 32 * k;
                if (col < p.dv) acc[k] = fmaf(w, po[c * slot_stride + col], acc[k]);
            }
        }
    }
    if (W > 1) {
#pragma unroll
        for (int k = 0; k < 4; ++k) red[warp][lane + 32 * k] = acc[k];
        __syncthreads();
        if (sub == 0)
            for (int j = 1; j < W; ++j)
#pragma unroll
                for (int k = 0; k < 4; ++k) acc[k] += red[warp + j][lane + 32 * k];
    }
    if (!active || sub != 0) return;
    const int s = row / p.N, h = row - s * p.N;
    T* o = (T*)p.out + b * p.o_sb + s * p.o_ss + h * p.o_sh;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int col = c0 + 32 * k;
        if (col < p.dv) o[col] = vt::from_f32<T>(acc[k]);
    }
    if (p.lse != nullptr && blockIdx.z == 0 && lane == 0)
        p.lse[b * p.l_sb + h * p.l_sh + s * p.l_ss] = sum > 0.0f ? (mx + log2f(sum)) * LN2 : vt::neg_inf();
}

// ---------------------------------------------------------------------------------------
// Tensor-core kernels: shared memory helpers
// ---------------------------------------------------------------------------------------


// Shared-memory layout of the wgmma kernel (byte offsets from a 1024-aligned base).
// Q and every KV tile are NSUB column blocks of [rows x 128 B], swizzled (see swz).
template <int MT> struct Layout {
    static constexpr int STAGES = 2;
    static constexpr int Q_SUB = MT * 128;                     // one column block of Q
    static constexpr int OFF_Q = 0;
    static constexpr int OFF_KV = NSUB * Q_SUB;                 // 1024-aligned (MT % 8 == 0)
    static constexpr int OFF_P = OFF_KV + STAGES * TILE_BYTES;  // P [MT x 64 tokens] bf16/f16
    static constexpr int RED = 128;                             // floats: WC * MT = 8 / (MT / 16) * MT
    static constexpr int OFF_RED = OFF_P + MT * 128;            // float [2][RED]
    static constexpr int OFF_VALID = OFF_RED + 2 * RED * 4;     // u8 [STAGES][BN]: token row exists
    static constexpr int OFF_FLAGS = OFF_VALID + STAGES * BN;   // u8 [STAGES][8]: a warp saw a bad block
    static constexpr int OFF_SCHED = OFF_FLAGS + STAGES * 8;    // int [40]
    static constexpr int OFF_MBAR = OFF_SCHED + 40 * 4;         // u64 [STAGES]: TMA tile landed
    static constexpr int END = OFF_MBAR + STAGES * 8;
    static constexpr int SMEM = END + 1024;                     // slack to align the base
};

__device__ __forceinline__ unsigned char* align1024(unsigned char* ptr) {
    const uint32_t a = smem_u32(ptr);
    return ptr + ((1024 - (a & 1023)) & 1023);
}

// Issues the cp.async copies of one KV tile from NTHR threads (local ids 0..NTHR-1): thread
// i copies token i / TPT, 16-byte chunks (i % TPT) + TPT k. `off` is the element offset of
// that token's row, -1 when the token does not exist (past the part or the sequence), -2
// when its block id is outside the cache (zero-filled, masked, and flagged per warp so the
// softmax knows to mask).
template <typename T, int NTHR> struct Loader {
    static constexpr int TPT = NTHR / BN;
    static constexpr int PER = CHUNKS / TPT;
    const T* cache;
    int tok, sub, lane, warp;

    __device__ __forceinline__ Loader(const Params& p, int i) : cache((const T*)p.cache) {
        tok = i / TPT;
        sub = i % TPT;
        lane = i & 31;
        warp = i >> 5;
    }

    __device__ __forceinline__ i64 row_of(const Params& p, const Segment& sg, int tile) const {
        const int j = tile * BN + tok;
        if (tile >= sg.t1 || j >= sg.len) return -1;
        const int bi = j / p.BS;
        const int blk = __ldg(p.block_table + sg.b * p.bt_sb + bi * p.bt_sm);
        if (blk < 0 || blk >= p.NB) return -2;
        return blk * p.c_sblk + (i64)(j - bi * p.BS) * p.c_srow;
    }

    // All NTHR threads call this (warp-collective ballot).
    __device__ __forceinline__ void issue(uint32_t dst, unsigned char* valid, unsigned char* flags,
                                          i64 off) const {
        const bool ok = off >= 0;
        const T* src = cache + (ok ? off : 0);
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int c = sub + TPT * k;
            cp_async16(dst + (c >> 3) * SUB_BYTES + swz(tok, c & 7), src + c * 8, ok);
        }
        if (sub == 0) valid[tok] = ok ? 1 : 0;
        const unsigned bad = __ballot_sync(0xffffffffu, off == -2);
        if (lane == 0) flags[warp] = bad != 0u ? 1 : 0;
    }
};

// Copies the CTA's MT query rows of sequence b into Q (zero rows past m_total), from NTHR
// threads with local id i.
template <typename T, int MT, int NTHR>
__device__ __forceinline__ void load_q(const Params& p, int b, int row0, uint32_t sQ, int i) {
    for (int idx = i; idx < MT * CHUNKS; idx += NTHR) {
        const int r = idx / CHUNKS, c = idx - r * CHUNKS;
        const int gr = row0 + r;
        const bool ok = gr < p.m_total;
        const T* src = (const T*)p.q;
        if (ok) {
            const int s = gr / p.N, h = gr - s * p.N;
            src += b * p.q_sb + s * p.q_ss + h * p.q_sh + c * 8;
        }
        cp_async16(sQ + (c >> 3) * (MT * 128) + swz(r, c & 7), src, ok);
    }
}

// A tile needs no masking when every token exists and is visible to every query row.
__device__ __forceinline__ bool tile_is_full(int t, int lim_min, const unsigned char* flags_stage) {
    return t * BN + BN <= lim_min && *reinterpret_cast<const unsigned long long*>(flags_stage) == 0ull;
}

// Shared-memory layout of the mma.sync kernels. KV lives in a ring of HS half-tile slots
// (32 tokens, NSUB column blocks of [32 rows x 128 B], swizzled): five on the H200 where they
// fit beside Q (MT <= 32), so while tile t is computed tile t+1 and half of t+2 are in
// flight, else four (the same bytes as two whole stages); three / two where shared memory is
// smaller (the "s" kernels). Token flags are per tile, RING tiles live.
template <int MT, int HS_> struct MmaLayout {
    static constexpr int HS = HS_;                              // half-tile slots
    static_assert(HS >= 2, "the current tile's two halves need two slots");
    static constexpr int RING = (HS + 1) / 2;                   // tiles with live flags
    static constexpr int Q_SUB = MT * 128;
    static constexpr int OFF_Q = 0;
    static constexpr int OFF_KV = NSUB * Q_SUB;                 // 1024-aligned (MT % 8 == 0)
    static constexpr int OFF_P = OFF_KV + HS * HALF_BYTES;      // P [MT x 64 tokens]
    static constexpr int RED = 128;
    static constexpr int OFF_RED = OFF_P + MT * 128;            // float [2][RED]
    static constexpr int OFF_VALID = OFF_RED + 2 * RED * 4;     // u8 [RING][BN]
    static constexpr int OFF_FLAGS = OFF_VALID + RING * BN;     // u8 [RING][2 halves][8 warps]
    static constexpr int OFF_SCHED = OFF_FLAGS + RING * 16;     // int [40]
    static constexpr int END = OFF_SCHED + 40 * 4;
    static constexpr int SMEM = END + 1024;
};

// Issues the cp.async copies of one half tile (32 tokens) from 256 threads: thread i copies
// token i / 8 of the half, 16-byte chunk i % 8 of each column block (8 threads move a
// whole 128-byte row segment). Offsets as in Loader (-1 no token, -2 bad block id).
template <typename T> struct HalfLoader {
    const T* cache;
    int tok, sub, lane, warp;

    __device__ __forceinline__ HalfLoader(const Params& p, int i) : cache((const T*)p.cache) {
        tok = i >> 3;
        sub = i & 7;
        lane = i & 31;
        warp = i >> 5;
    }

    __device__ __forceinline__ i64 row_of(const Params& p, const Segment& sg, int tile, int h) const {
        const int j = tile * BN + h * HALF + tok;
        if (tile >= sg.t1 || j >= sg.len) return -1;
        const int bi = j / p.BS;
        const int blk = __ldg(p.block_table + sg.b * p.bt_sb + bi * p.bt_sm);
        if (blk < 0 || blk >= p.NB) return -2;
        return blk * p.c_sblk + (i64)(j - bi * p.BS) * p.c_srow;
    }

    // All 256 threads call this (warp-collective ballot). `valid` and `flags` are the tile's.
    __device__ __forceinline__ void issue(uint32_t dst, unsigned char* valid, unsigned char* flags, int h,
                                          i64 off) const {
        const bool ok = off >= 0;
        const T* src = cache + (ok ? off : 0) + sub * 8;
#pragma unroll
        for (int k = 0; k < NSUB; ++k) cp_async16(dst + k * HSUB_BYTES + swz(tok, sub), src + k * 64, ok);
        if (sub == 0) valid[h * HALF + tok] = ok ? 1 : 0;
        const unsigned bad = __ballot_sync(0xffffffffu, off == -2);
        if (lane == 0) flags[h * 8 + warp] = bad != 0u ? 1 : 0;
    }
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
template <typename T, int MR, int HS_>
__device__ void decode_mma(const Params& p) {
    constexpr int MT = 16 * MR;
    constexpr int WC = 8 / MR;
    constexpr int TN = BN / WC;  // tokens per warp (QK)
    constexpr int NTQ = TN / 8;
    constexpr int NCH = 1;  // independent QK chains (more did not pay: measured slower)
    constexpr int CV = FDV / WC;  // output columns per warp (PV)
    constexpr int NTV = CV / 8;
    using L = MmaLayout<MT, HS_>;
    constexpr int HS = L::HS, RING = L::RING;
    static_assert(WC * MT == L::RED, "row reductions fill the RED arrays");
    static_assert(L::SMEM <= 232448, "fits the 227 KB a block may have");
    static_assert(TN <= HALF && HALF % TN == 0, "a warp's QK tokens lie in one half tile");

    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = align1024(smem_raw);
    const uint32_t base = smem_u32(smem);
    const uint32_t sQ = base + L::OFF_Q, sKV = base + L::OFF_KV, sP = base + L::OFF_P;
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
    const HalfLoader<T> ld(p, threadIdx.x);

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
                ld.issue(sKV + j * HALF_BYTES, valid + (u % RING) * BN, flags + (u % RING) * 16, j & 1,
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
            const uint32_t kh0 = sKV + slot0 * HALF_BYTES, kh1 = sKV + slot1 * HALF_BYTES;
            const int ru = u % RING;
            const unsigned char* vst = valid + ru * BN;
            // Groups committed: HS + 2u; halves 2u and 2u + 1 must have landed.
            cp_async_wait<HS - 2>();
            __syncthreads();
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
                const float mn = fmaxf(m_run[hi], tm * c);
                muse[hi] = mn == vt::neg_inf() ? 0.0f : mn;
                alpha[hi] = exp2f(m_run[hi] - muse[hi]);
                m_run[hi] = mn;
                l_run[hi] *= alpha[hi];
            }
#pragma unroll
            for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
                for (int hi = 0; hi < 2; ++hi) {
                    const float p0 = exp2f(fmaf(sacc[nt][2 * hi], c, -muse[hi]));
                    const float p1 = exp2f(fmaf(sacc[nt][2 * hi + 1], c, -muse[hi]));
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
            // Refill the two freed slots: halves 2u + HS (into slot0) and 2u + HS + 1 (slot1).
            {
                const int ja = 2 * u + HS, jb = ja + 1;
                const int ua = ja >> 1, ub = jb >> 1;
                if (sg.t0 + ua < sg.t1)
                    ld.issue(kh0, valid + (ua % RING) * BN, flags + (ua % RING) * 16, ja & 1, off_a);
                cp_async_commit();
                if (sg.t0 + ub < sg.t1)
                    ld.issue(kh1, valid + (ub % RING) * BN, flags + (ub % RING) * 16, jb & 1, off_b);
                cp_async_commit();
                off_a = ld.row_of(p, sg, sg.t0 + ua + 1, ja & 1);
                off_b = ld.row_of(p, sg, sg.t0 + ub + 1, jb & 1);
            }
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

// ---------------------------------------------------------------------------------------
// wgmma kernel (sm_90a): 64 query rows per CTA, two warpgroups with separate roles.
//
// Warpgroup 0 (consumer): S = Q K^T with 36 wgmma m64n64k16 (Q and K from the swizzled
// tiles, K-major), the online softmax on its registers (a row lives in one quad), P
// (16-bit) and the row rescale factors into shared memory, then O[:, 0:256] += P V.
// Warpgroup 1 (producer): all cp.async loads (Q, KV tiles) and O[:, 256:512] += P V.
// Both halves: 4 wgmma m64n256k16, V read MN-major in place from the K tile.
//
// Named barriers (arrive by one side, sync by the other) let warpgroup 1's PV and loads
// run while warpgroup 0 computes the next S:
//   K_FULL[t&1]  tile t is in shared memory           WG1 arrives, WG0 syncs
//   P_FULL       P(t) and the rescale factors written  WG0 arrives, WG1 syncs
//   P_FREE       WG1 finished reading P(t)             WG1 arrives, WG0 syncs before P(t+1)
//   V_FREE[t&1]  WG0 finished with tile t's stage      WG0 arrives, WG1 syncs before reloading it
// Warpgroup 1 waits for tile t+1 only after its PV(t): with two 72 KB stages a tile is
// loaded into the stage freed by PV(t-1), and waiting earlier leaves the load no time
// (measured: signalling before PV(t) made every tile wait for a fresh load). Every arrival is
// matched by exactly one sync in each segment, and neither side can arrive on a barrier
// again before the other side synced the previous instance (K_FULL and V_FREE alternate
// by parity: the next arrival on the same id is ordered after a sync on a barrier the
// other side arrives only after consuming), so instances never mix.
// ---------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace mla {

// Warp 0 of warpgroup 1 loads KV tile `tile` of segment sg into the stage at dst through the
// TMA: every box of the tile is issued (pages past the sequence or with a bad block id read
// block NB, out of the map: zeros), so the stage's barrier always completes with TILE_BYTES.
// The token flags (valid, flags) are written first and published by the expect_tx arrival.
template <typename T>
__device__ __forceinline__ void tma_tile(const Params& p, const Segment& sg, int tile, uint32_t dst,
                                         unsigned char* valid, unsigned char* flags, uint32_t bar,
                                         const TmaMap* map, int lane) {
    const int R = p.BS < BN ? p.BS : BN;  // rows per box
    bool bad = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int tok = lane + 32 * h, j = tile * BN + tok;
        bool ok = false;
        if (tile < sg.t1 && j < sg.len) {
            const int blk = __ldg(p.block_table + sg.b * p.bt_sb + (j / p.BS) * p.bt_sm);
            ok = blk >= 0 && blk < p.NB;
            bad |= !ok;
        }
        valid[tok] = ok ? 1 : 0;
    }
    const unsigned any_bad = __ballot_sync(0xffffffffu, bad);
    if (lane == 0) *reinterpret_cast<unsigned long long*>(flags) = any_bad != 0u ? 1ull : 0ull;
    __syncwarp();
    if (lane == 0) mbar_expect_tx(bar, TILE_BYTES);
    __syncwarp();
    const int nbox = (BN / R) * NSUB;
    for (int idx = lane; idx < nbox; idx += 32) {
        const int pb = idx / NSUB, cb = idx - pb * NSUB;
        const int j = tile * BN + pb * R;  // first token of the box
        int blk = p.NB, row = 0;
        if (tile < sg.t1 && j < sg.len) {
            const int bi = j / p.BS;
            const int v = __ldg(p.block_table + sg.b * p.bt_sb + bi * p.bt_sm);
            if (v >= 0 && v < p.NB) {
                blk = v;
                row = j - bi * p.BS;
            }
        }
        tma_load_3d(dst + cb * SUB_BYTES + pb * R * 128, map, 64 * cb, row, blk, bar);
    }
}

// K_FULL and V_FREE alternate by tile parity (ids +0 / +1), see below.
constexpr int BAR_K_FULL = 1, BAR_V_FREE = 3, BAR_P_FULL = 5, BAR_P_FREE = 6, BAR_WG0 = 7;
// Epilogue (see decode_wgmma): WG1 / WG0 done with the KV stages (and WG0's row sums
// written), WG1's own staging barrier, WG0's copy-out done (the stages may be reloaded).
constexpr int BAR_WG0_DONE = 8, BAR_WG1_DONE = 9, BAR_WG1 = 10, BAR_OUT_READ = 11;

// The wgmma instructions used, one macro per shape (m64n64k16 for S = Q K^T, m64n256k16
// with B transposed for O += P V), instantiated per 16-bit type: TY is "bf16" or "f16".
// D is read and written in registers; scale_d = 0 starts a fresh accumulation.
#define VT_ACC8(i) \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define VT_ACC32(i) VT_ACC8(i), VT_ACC8(i + 8), VT_ACC8(i + 16), VT_ACC8(i + 24)

#define VT_WGMMA_M64N64K16(NAME, TY)                                                                    \
    __device__ __forceinline__ void NAME(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {      \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                    \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                        \
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                          \
                     : VT_ACC32(0)                                                                      \
                     : "l"(da), "l"(db), "r"(scale_d));                                                 \
    }
#define VT_WGMMA_M64N256K16_TB(NAME, TY)                                                                \
    __device__ __forceinline__ void NAME(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {     \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                   \
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " "                       \
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"                                       \
                     : VT_ACC32(0), VT_ACC32(32), VT_ACC32(64), VT_ACC32(96)                            \
                     : "l"(da), "l"(db), "r"(scale_d));                                                 \
    }
VT_WGMMA_M64N64K16(wgmma_m64n64k16_bf16, "bf16")
VT_WGMMA_M64N64K16(wgmma_m64n64k16_f16, "f16")
VT_WGMMA_M64N256K16_TB(wgmma_m64n256k16_bf16_tb, "bf16")
VT_WGMMA_M64N256K16_TB(wgmma_m64n256k16_f16_tb, "f16")

template <typename T> struct Wg;
template <> struct Wg<bf16> {
    static __device__ __forceinline__ void qk(float (&d)[32], uint64_t a, uint64_t b, int sc) {
        wgmma_m64n64k16_bf16(d, a, b, sc);
    }
    static __device__ __forceinline__ void pv(float (&d)[128], uint64_t a, uint64_t b) {
        wgmma_m64n256k16_bf16_tb(d, a, b, 1);
    }
};
template <> struct Wg<f16> {
    static __device__ __forceinline__ void qk(float (&d)[32], uint64_t a, uint64_t b, int sc) {
        wgmma_m64n64k16_f16(d, a, b, sc);
    }
    static __device__ __forceinline__ void pv(float (&d)[128], uint64_t a, uint64_t b) {
        wgmma_m64n256k16_f16_tb(d, a, b, 1);
    }
};

// O[:, cols] += P V[:, cols] for one tile: 4 wgmma (A = P, B = V MN-major, in place in the
// K tile starting at column block `v_base`). N = 128 accumulator registers (256 columns).
template <typename T, int N>
__device__ __forceinline__ void pv_tile(float (&o)[N], uint64_t dp, uint32_t v_base) {
    const uint64_t dv = gmma_desc(v_base, SUB_BYTES, 1024);
    pin(o);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) Wg<T>::pv(o, dp + 2 * ks, dv + 128 * ks);  // +32 B, +2048 B
    wgmma_commit();
    wgmma_wait<0>();
    pin(o);
}

template <int N> __device__ __forceinline__ void rescale(float (&o)[N], float a0, float a1) {
    if (a0 != 1.0f || a1 != 1.0f) {
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            o[4 * i + 0] *= a0;
            o[4 * i + 1] *= a0;
            o[4 * i + 2] *= a1;
            o[4 * i + 3] *= a1;
        }
    }
}

__device__ __forceinline__ void st_shared_f2(uint32_t addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// Row stride (floats) of O staged in shared memory: 512 + 8 keeps a warp's 8-byte stores to
// 8 rows on distinct banks.
constexpr int OSTR = FDV + 8;

// One warpgroup's epilogue, once both are done with the KV stages: stages its accumulators
// (rows r_lo, r_lo + 8; columns col0 + 8 i + 2 qd (+1)) in the freed KV stages (`stage` as a
// shared address, `so` as a pointer), then copies its 256 columns of the MT rows out with
// 16-byte loads and coalesced stores, scaled by 1 / l. `bar` is the warpgroup's own
// 128-thread barrier; warpgroup 0 (with_lse) also writes lse.
template <typename T, int MT>
__device__ __forceinline__ void stage_and_store(const Params& p, const Segment& sg, int row0, uint32_t stage,
                                                const float* so, const float (&o)[128], int r_lo, int qd, int col0,
                                                const float* s_fin, int wtid, int bar, bool with_lse) {
#pragma unroll
    for (int i = 0; i < 32; ++i)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi)
            st_shared_f2(stage + ((r_lo + 8 * hi) * OSTR + col0 + 8 * i + 2 * qd) * 4, o[4 * i + 2 * hi],
                         o[4 * i + 2 * hi + 1]);
    bar_sync(bar, 128);
    constexpr int C4 = 256 / 4;  // 16-byte chunks per row half
#pragma unroll 2
    for (int idx = wtid; idx < MT * C4; idx += 128) {
        const int r = idx / C4, c = col0 + (idx - r * C4) * 4;
        const int row = row0 + r;
        if (row >= p.m_total) continue;
        const float l = s_fin[r];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const float4 v = *reinterpret_cast<const float4*>(so + r * OSTR + c);
        if (sg.whole) {
            const int s = row / p.N, h = row - s * p.N;
            T* out = (T*)p.out + sg.b * p.o_sb + s * p.o_ss + h * p.o_sh + c;
            uint2 w;
            w.x = pack2<T>(v.x * inv, v.y * inv);
            w.y = pack2<T>(v.z * inv, v.w * inv);
            *reinterpret_cast<uint2*>(out) = w;
        } else {
            *reinterpret_cast<float4*>(p.part_o + ((i64)sg.slot * p.m_total + row) * p.dv + c) =
                make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
        }
    }
    if (with_lse && wtid < MT && row0 + wtid < p.m_total) {
        const float l = s_fin[wtid];
        store_lse<T>(p, sg, row0 + wtid, l > 0.0f ? s_fin[MT + wtid] + log2f(l) : vt::neg_inf());
    }
    // The stages are refilled next through the async proxy (TMA or wgmma reads after cp.async).
    fence_proxy_async();
}

template <typename T, bool TMA>
__device__ void decode_wgmma(const Params& p, const TmaMap* kv_map) {
    constexpr int MT = 64;
    using L = Layout<MT>;
    static_assert(L::SMEM <= 232448, "fits the 227 KB a block may have");
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = align1024(smem_raw);
    const uint32_t base = smem_u32(smem);
    const uint32_t sQ = base + L::OFF_Q, sKV = base + L::OFF_KV, sP = base + L::OFF_P;
    float* s_alpha = (float*)(smem + L::OFF_RED);  // [MT] rescale factors of the current tile
    float* s_fin = s_alpha + MT;                    // [2][MT] final row sums and maxima
    unsigned char* valid = smem + L::OFF_VALID;
    unsigned char* flags = smem + L::OFF_FLAGS;
    int* sched = (int*)(smem + L::OFF_SCHED);
    const float* so = reinterpret_cast<const float*>(smem + L::OFF_KV);  // O staged at the end
    if (threadIdx.x < L::STAGES * 8) flags[threadIdx.x] = 0;
    const uint32_t sBar = base + L::OFF_MBAR;
    if (TMA && threadIdx.x == 0) {
        for (int s = 0; s < L::STAGES; ++s) mbar_init(sBar + 8 * s, 1);
    }
    if (TMA) __syncthreads();
    uint32_t phases = 0;  // bit st: parity of the next completion of stage st's barrier
    auto tile_wait = [&](int st) {
        mbar_wait(sBar + 8 * st, (phases >> st) & 1);
        phases ^= 1u << st;
    };
    grid_dep_launch();

    const int wg = threadIdx.x >> 7, wtid = threadIdx.x & 127;
    const int wwarp = wtid >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, qd = lane & 3;
    const int row0 = blockIdx.y * MT;
    const int r_lo = wwarp * 16 + g;  // this thread's accumulator rows: r_lo, r_lo + 8
    const float c = p.scale_log2;
    const Loader<T, 128> ld(p, wtid);  // warpgroup 1 only
    const uint64_t dq = gmma_desc(sQ, 16, 1024);
    const uint64_t dp = gmma_desc(sP, 16, 1024);

    const Part part = find_part(p, sched);
    int nb = part.b;
    i64 pre = part.pre;
    Segment sg;
    while (next_segment(p, part, nb, pre, sg)) {
        const int t0 = sg.t0, t1 = sg.t1;
        // This warpgroup's output columns: 0..255 (warpgroup 0), 256..511 (warpgroup 1).
        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;

        if (wg == 1) {
            // Producer: Q and the first two tiles, then per tile: PV for columns 256..511,
            // signal, and the load two tiles ahead.
            load_q<T, MT, 128>(p, sg.b, row0, sQ, wtid);
            i64 off = 0;
            if (TMA) {
                if (wtid < 32) {
                    tma_tile<T>(p, sg, t0, sKV, valid, flags, sBar, kv_map, wtid);
                    if (t0 + 1 < t1) tma_tile<T>(p, sg, t0 + 1, sKV + TILE_BYTES, valid + BN, flags + 8, sBar + 8, kv_map, wtid);
                }
                cp_async_commit();
                cp_async_wait<0>();  // Q
                fence_proxy_async();
                bar_arrive(BAR_K_FULL, 256);  // Q is in shared memory (the tiles signal their mbarriers)
            } else {
                off = ld.row_of(p, sg, t0);
                ld.issue(sKV, valid, flags, off);
                cp_async_commit();
                off = ld.row_of(p, sg, t0 + 1);
                if (t0 + 1 < t1) ld.issue(sKV + TILE_BYTES, valid + BN, flags + 8, off);
                cp_async_commit();
                off = ld.row_of(p, sg, t0 + 2);
                cp_async_wait<1>();
                fence_proxy_async();
                bar_arrive(BAR_K_FULL, 256);  // tile t0 (parity 0)
            }
            bar_arrive(BAR_P_FREE, 256);
            for (int t = t0; t < t1; ++t) {
                const int st = (t - t0) & 1;
                const uint32_t kst = sKV + st * TILE_BYTES;
                bar_sync(BAR_P_FULL, 256);
                if (TMA) tile_wait(st);  // complete already (warpgroup 0 waited); for this warpgroup's view
                rescale(o, s_alpha[r_lo], s_alpha[r_lo + 8]);
                pv_tile<T, 128>(o, dp, kst + 4 * SUB_BYTES);
                if (t + 1 < t1) bar_arrive(BAR_P_FREE, 256);
                if (t + 2 < t1) bar_sync(BAR_V_FREE + st, 256);
                if (TMA) {
                    if (t + 2 < t1 && wtid < 32)
                        tma_tile<T>(p, sg, t + 2, kst, valid + st * BN, flags + st * 8, sBar + 8 * st, kv_map, wtid);
                    continue;
                }
                if (t + 1 < t1) {
                    cp_async_wait<0>();  // tile t + 1, the newest group
                    fence_proxy_async();
                    bar_arrive(BAR_K_FULL + (st ^ 1), 256);
                }
                if (t + 2 < t1) {
                    ld.issue(kst, valid + st * BN, flags + st * 8, off);
                    cp_async_commit();
                    off = ld.row_of(p, sg, t + 3);
                }
            }
            cp_async_wait<0>();
            bar_arrive(BAR_WG1_DONE, 256);  // this warpgroup's last reads of the KV stages are done
            bar_sync(BAR_WG0_DONE, 256);    // and warpgroup 0's (its row sums are in s_fin)
            stage_and_store<T, MT>(p, sg, row0, sKV, so, o, r_lo, qd, 256, s_fin, wtid, BAR_WG1, false);
            bar_sync(BAR_OUT_READ, 256);  // warpgroup 0 copied its half out: the stages may be reloaded
        } else {
            int lim[2];
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const int r = row0 + r_lo + 8 * hi;
                const int s = r < p.m_total ? r / p.N : p.s_q - 1;
                lim[hi] = sg.len - p.s_q + s + 1;
            }
            const int lim_min = sg.len - p.s_q + 1;
            float m_run[2] = {vt::neg_inf(), vt::neg_inf()}, l_run[2] = {0.0f, 0.0f};
            for (int t = t0; t < t1; ++t) {
                const int st = (t - t0) & 1;
                const uint32_t kst = sKV + st * TILE_BYTES;
                const unsigned char* vst = valid + st * BN;
                if (TMA) {
                    if (t == t0) bar_sync(BAR_K_FULL, 256);  // Q
                    tile_wait(st);
                } else {
                    bar_sync(BAR_K_FULL + st, 256);
                }

                // (Three independent accumulator chains with a 128/384 column split measured
                // slower than this: see docs/perf.md.)
                float s[32];
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
                if (TMA && t * BN + BN > sg.len) {
                    // Rows past the sequence's last token came from a real page (the TMA copies
                    // whole boxes) and may hold anything, NaN included: their weights are 0, but
                    // 0 x NaN is not, so zero their V part (columns 0..511) before either product.
                    const int first = sg.len - t * BN;
                    for (int idx = wtid; idx < (BN - first) * 64; idx += 128) {
                        const int r = first + (idx >> 6), c = idx & 63;  // c: 16-byte chunk of 64
                        st_shared_v4_zero(kst + (c >> 3) * SUB_BYTES + swz(r, c & 7));
                    }
                    fence_proxy_async();  // before the products read V (ordered by BAR_WG0 / P_FULL)
                }

                // s[4i + j]: row r_lo + 8 (j >> 1), token 8 i + 2 qd + (j & 1); raw scores.
                const bool full = tile_is_full(t, lim_min, flags + st * 8);
                float mx[2] = {vt::neg_inf(), vt::neg_inf()};
                if (full) {
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
                float alpha[2], muse[2];
#pragma unroll
                for (int hi = 0; hi < 2; ++hi) {
                    mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 1));
                    mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 2));
                    const float mn = fmaxf(m_run[hi], mx[hi] * c);
                    muse[hi] = mn == vt::neg_inf() ? 0.0f : mn;
                    alpha[hi] = exp2f(m_run[hi] - muse[hi]);
                    m_run[hi] = mn;
                    l_run[hi] *= alpha[hi];
                }
                uint32_t pk[16];
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int hi = 0; hi < 2; ++hi) {
                        const float p0 = exp2f(fmaf(s[4 * i + 2 * hi], c, -muse[hi]));
                        const float p1 = exp2f(fmaf(s[4 * i + 2 * hi + 1], c, -muse[hi]));
                        l_run[hi] += p0 + p1;
                        pk[2 * i + hi] = pack2<T>(p0, p1);
                    }
                bar_sync(BAR_P_FREE, 256);  // warpgroup 1 is done with P(t - 1)
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int hi = 0; hi < 2; ++hi) st_shared_u32(sP + swz(r_lo + 8 * hi, i) + qd * 4, pk[2 * i + hi]);
                if (qd == 0) {
                    s_alpha[r_lo] = alpha[0];
                    s_alpha[r_lo + 8] = alpha[1];
                }
                fence_proxy_async();      // P is read by wgmma (async proxy)
                bar_sync(BAR_WG0, 128);   // all of P written before this warpgroup's wgmma
                bar_arrive(BAR_P_FULL, 256);
                rescale(o, alpha[0], alpha[1]);
                pv_tile<T, 128>(o, dp, kst);
                if (t + 2 < t1) bar_arrive(BAR_V_FREE + st, 256);
            }
            // Row sums (a quad per row) and maxima for the copy-out.
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                float l = l_run[hi];
                l += __shfl_xor_sync(0xffffffffu, l, 1);
                l += __shfl_xor_sync(0xffffffffu, l, 2);
                if (qd == 0) {
                    s_fin[r_lo + 8 * hi] = l;
                    s_fin[MT + r_lo + 8 * hi] = m_run[hi];
                }
            }
            bar_arrive(BAR_WG0_DONE, 256);  // done with the KV stages; row sums in s_fin
            bar_sync(BAR_WG1_DONE, 256);
            // (s_fin, written by each quad's first lane, is ordered before the copy-out by the
            // warpgroup barrier inside.)
            stage_and_store<T, MT>(p, sg, row0, sKV, so, o, r_lo, qd, 0, s_fin, wtid, BAR_WG0, true);
            bar_arrive(BAR_OUT_READ, 256);
        }
    }
}

}  // namespace mla

#define MLA_WGMMA(S, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1)                             \
        mla_decode_wgmma_##S(const mla::Params p) {                                           \
        mla::decode_wgmma<T, false>(p, nullptr);                                              \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1) mla_decode_wgmma_tma_##S(    \
        const __grid_constant__ mla::Params p, const __grid_constant__ mla::TmaMap kv_map) {  \
        mla::decode_wgmma<T, true>(p, &kv_map);                                               \
    }
MLA_WGMMA(bf16, bf16)
MLA_WGMMA(f16, f16)
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ---------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------
#define MLA_GENERIC(S, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(mla::GEN_THREADS)                            \
        mla_decode_generic_##S(const mla::Params p) {                                         \
        mla::decode_generic<T>(p);                                                            \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(mla::THREADS)                                \
        mla_decode_combine_##S(const mla::Params p) {                                         \
        mla::combine<T>(p);                                                                   \
    }
VT_FOR_EACH_FLOAT(MLA_GENERIC)

// The generic kernel over an fp8_ds_mla cache (D = 576), per query dtype; its partials go
// through mla_decode_combine_* as the float cache's do.
#define MLA_GENERIC_FP8(S, T)                                                                 \
    extern "C" __global__ void __launch_bounds__(mla::GEN_THREADS)                            \
        mla_decode_generic_fp8_##S(const mla::Params p) {                                     \
        mla::decode_generic<T, true>(p);                                                      \
    }
VT_FOR_EACH_FLOAT(MLA_GENERIC_FP8)

#define MLA_MMA_KERNEL(NAME, S, T, MR, HS)                                                    \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1) NAME##_##S(const mla::Params p) { \
        mla::decode_mma<T, MR, HS>(p);                                                        \
    }
#define MLA_MMA(S, T)                                                                         \
    MLA_MMA_KERNEL(mla_decode_mma16, S, T, 1, 5)                                              \
    MLA_MMA_KERNEL(mla_decode_mma32, S, T, 2, 5)                                              \
    MLA_MMA_KERNEL(mla_decode_mma64, S, T, 4, 4)                                              \
    MLA_MMA_KERNEL(mla_decode_mma16s, S, T, 1, 3)                                             \
    MLA_MMA_KERNEL(mla_decode_mma32s, S, T, 2, 3)                                             \
    MLA_MMA_KERNEL(mla_decode_mma64s, S, T, 4, 2)
MLA_MMA(bf16, bf16)
MLA_MMA(f16, f16)
