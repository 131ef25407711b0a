// MlaDecodeAttention: absorbed MQA decode attention over the paged latent cache.
//
// One KV head (the latent cache row, D = 576 in MLA) is shared by all N query heads, so each
// CTA handles a block of query rows (row = s * N + h over the s_q query tokens and N heads)
// and reads every KV row once for all of them. Work is split over CTAs by KV tiles of
// BN = 64 tokens (flash-decoding):
//
// - The grid is (num_parts, m_blocks). The tiles of all sequences, laid end to end, are cut
//   into num_parts equal ranges ("parts"), at least min_tiles long; part p covers tiles
//   [p*Q, (p+1)*Q). Each CTA computes this schedule itself from seq_lens (two block-wide
//   passes), so there is no host sync and no metadata kernel, and mixed lengths balance.
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
// - mla_decode_mma{16,32,64}_{bf16,f16}: D = 576, Dv = 512, 16/32/64 query rows per CTA,
//   mma.sync m16n8k16 tensor cores (sm_80+), KV tiles double-buffered with cp.async into
//   128-byte-swizzled shared memory, ldmatrix fragments.
// - mla_decode_wgmma_{bf16,f16}: sm_90a only (compiled when __CUDA_ARCH_FEAT_SM90_ALL is
//   defined): 64 query rows, same loader and layout, Hopper wgmma from shared memory.
//   Warpgroup 0 computes S = Q K^T (m64n64k16) and the softmax; both warpgroups then
//   compute half of O += P V each (m64n256k16, V read in place from the K tile, MN-major).
// - mla_decode_combine_{bf16,f16,f32}: merges the partials of cut sequences and writes
//   empty sequences.
//
// Softmax runs in the log2 domain (scale_log2 = scale * log2(e)); partial lse are log2,
// the lse output is natural log.
#include "common.cuh"

namespace mla {

// NVRTC has no <cstdint>.
using uint32_t = unsigned int;
using uint64_t = unsigned long long;

constexpr int BN = 64;           // KV tokens per tile: the unit of the split
constexpr int THREADS = 256;     // main kernels: 8 warps
constexpr int GEN_THREADS = 128; // generic kernel: 4 warps, a key each
constexpr int FD = 576;          // fast-path head dim (kv_lora_rank 512 + rope 64)
constexpr int FDV = 512;         // fast-path value dim
constexpr int NSUB = FD / 64;    // 64-feature (128-byte) column blocks of a 16-bit row
constexpr int CHUNKS = FD / 8;   // 16-byte chunks of a row
constexpr int SUB_BYTES = BN * 128;          // one column block of a KV tile
constexpr int TILE_BYTES = NSUB * SUB_BYTES; // one KV tile in shared memory (73728)
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

// The part of this CTA (blockIdx.x). Called by the whole block; every thread gets the same
// result. `s` is 40 ints of shared memory.
__device__ Part find_part(const Params& p, int* s) {
    int t_total = 0, local = 0;
    for (int b = threadIdx.x; b < p.B; b += blockDim.x) local += tiles_of(eff_len(p, b));
    block_scan_incl(local, s, t_total);
    const i64 total = t_total;
    i64 q = (total + p.num_parts - 1) / p.num_parts;
    if (q < p.min_tiles) q = p.min_tiles;
    if (q < 1) q = 1;
    Part r;
    r.q = q;
    r.begin = (i64)blockIdx.x * q;
    r.end = r.begin + q < total ? r.begin + q : total;
    r.b = p.B;
    r.pre = total;
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

// Two values rounded to a 16-bit type, packed low-first into 32 bits.
template <typename T> __device__ __forceinline__ uint32_t pack2(float x, float y);
template <> __device__ __forceinline__ uint32_t pack2<bf16>(float x, float y) {
    __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<f16>(float x, float y) {
    __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&v);
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
template <typename T>
__device__ void decode_generic(const Params& p) {
    __shared__ int sched[40];
    __shared__ float wm[4], wl[4];
    extern __shared__ float gdyn[];
    float* qrow = gdyn;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* ow = gdyn + p.d + warp * p.dv;
    const int row = blockIdx.y;
    const int s = row / p.N, h = row - s * p.N;
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
            const T* k = (const T*)p.cache + blk * p.c_sblk + (i64)(j - bi * p.BS) * p.c_srow;
            float dot = 0.0f;
            for (int i = lane; i < p.d; i += 32) dot = fmaf(qrow[i], vt::to_f32(k[i]), dot);
            dot = vt::warp_sum(dot) * p.scale_log2;
            const float mn = fmaxf(m, dot);
            const float a = exp2f(m - mn);
            const float pj = exp2f(dot - mn);
            l = l * a + pj;
            m = mn;
            for (int i = lane; i < p.dv; i += 32) ow[i] = fmaf(pj, vt::to_f32(k[i]), ow[i] * a);
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
    const int W = p.combine_wpr;
    const int b = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.y * (8 / W) + warp / W;
    const int sub = warp % W;
    const bool active = row < p.m_total;
    const int len = eff_len(p, b);
    int first = 0, n = 0;
    if (len > 0) {
        first = p.seq_info[2 * b];
        n = p.seq_info[2 * b + 1];
        if (n <= 1) return;  // written by the main kernel (uniform over the block)
    }
    const int r = active ? row : 0;
    const float* plse = p.part_lse + (i64)first * p.m_total + r;
    float mx = vt::neg_inf();
    for (int c = lane; c < n; c += 32) mx = fmaxf(mx, plse[(i64)c * p.m_total]);
    mx = vt::warp_max(mx);
    float sum = 0.0f;
    if (mx != vt::neg_inf())
        for (int c = lane; c < n; c += 32) sum += exp2f(plse[(i64)c * p.m_total] - mx);
    sum = vt::warp_sum(sum);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int c0 = blockIdx.z * 128 + lane;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (active && sum > 0.0f) {
        const float* po = p.part_o + ((i64)first * p.m_total + r) * p.dv;
        const i64 slot_stride = (i64)p.m_total * p.dv;
#pragma unroll 4
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

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
    return (uint32_t)__cvta_generic_to_shared(ptr);
}

// Byte offset of 16-byte chunk `c` (0..7) of row `r` in a block of 128-byte rows, with the
// 128-byte swizzle (chunk ^= row % 8) that both ldmatrix (conflict-free) and wgmma's
// SWIZZLE_128B layout (block base 1024-byte aligned) use.
__device__ __forceinline__ uint32_t swz(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    // src-size 0 reads nothing and fills 16 zero bytes.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t (&r)[2]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

template <typename T> struct Mma;
template <> struct Mma<bf16> {
    static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct Mma<f16> {
    static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// Shared-memory layout of the tensor-core kernels (byte offsets from a 1024-aligned base).
// Q and every KV tile are NSUB column blocks of [rows x 128 B], swizzled (see swz).
template <int MT> struct Layout {
    static constexpr int STAGES = 2;
    static constexpr int Q_SUB = MT * 128;                     // one column block of Q
    static constexpr int OFF_Q = 0;
    static constexpr int OFF_KV = NSUB * Q_SUB;                 // 1024-aligned (MT % 8 == 0)
    static constexpr int OFF_P = OFF_KV + STAGES * TILE_BYTES;  // P [MT x 64 tokens] bf16/f16
    static constexpr int RED = 128;                             // floats: WC * MT = 8 / (MT / 16) * MT
    static constexpr int OFF_RED = OFF_P + MT * 128;            // float [2][RED]: row max, row sum
    static constexpr int OFF_VALID = OFF_RED + 2 * RED * 4;     // u8 [STAGES][BN]
    static constexpr int OFF_SCHED = OFF_VALID + STAGES * BN;   // int [40]
    static constexpr int END = OFF_SCHED + 40 * 4;
    static constexpr int SMEM = END + 1024;                     // slack to align the base
};

__device__ __forceinline__ unsigned char* align1024(unsigned char* ptr) {
    const uint32_t a = smem_u32(ptr);
    return ptr + ((1024 - (a & 1023)) & 1023);
}

// Issues the cp.async copies of one KV tile: thread tid copies token tid / 4, 16-byte chunks
// (tid % 4) + 4k. `off` is the element offset of that token's row (-1: zero-fill and mark
// invalid: past the sequence, past the part, or a block id outside the cache).
template <typename T> struct Loader {
    const T* cache;
    int tok, sub;

    __device__ __forceinline__ Loader(const Params& p) : cache((const T*)p.cache) {
        tok = threadIdx.x >> 2;
        sub = threadIdx.x & 3;
    }

    // Element offset of this thread's token in local tile `tile` of the segment, or -1.
    __device__ __forceinline__ i64 row_of(const Params& p, const Segment& sg, int tile) const {
        const int j = tile * BN + tok;
        if (tile >= sg.t1 || j >= sg.len) return -1;
        const int bi = j / p.BS;
        const int blk = __ldg(p.block_table + sg.b * p.bt_sb + bi * p.bt_sm);
        if (blk < 0 || blk >= p.NB) return -1;
        return blk * p.c_sblk + (i64)(j - bi * p.BS) * p.c_srow;
    }

    __device__ __forceinline__ void issue(uint32_t dst, unsigned char* valid, i64 off) const {
        const bool ok = off >= 0;
        const T* src = cache + (ok ? off : 0);
#pragma unroll
        for (int k = 0; k < CHUNKS / 4; ++k) {
            const int c = sub + 4 * k;
            cp_async16(dst + (c >> 3) * SUB_BYTES + swz(tok, c & 7), src + c * 8, ok);
        }
        if (sub == 0) valid[tok] = ok ? 1 : 0;
    }
};

// Copies the CTA's MT query rows of sequence b into Q (zero rows past m_total).
template <typename T, int MT>
__device__ __forceinline__ void load_q(const Params& p, int b, int row0, uint32_t sQ) {
    for (int idx = threadIdx.x; idx < MT * CHUNKS; idx += THREADS) {
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

// ---------------------------------------------------------------------------------------
// mma.sync kernel: MR row blocks of 16 (MT = 16 * MR query rows), 8 warps.
// QK: warp (wr, wc) computes rows 16 wr.. x tokens wc*TN..; PV: rows 16 wr.. x columns
// wc*CV... Row maxima and sums are combined across the WC warps of a row block through
// shared memory; P goes through shared memory (bf16/f16) as the A operand of PV.
// ---------------------------------------------------------------------------------------
template <typename T, int MR>
__device__ void decode_mma(const Params& p) {
    constexpr int MT = 16 * MR;
    constexpr int WC = 8 / MR;
    constexpr int TN = BN / WC;  // tokens per warp (QK)
    constexpr int NTQ = TN / 8;
    constexpr int CV = FDV / WC;  // output columns per warp (PV)
    constexpr int NTV = CV / 8;
    using L = Layout<MT>;
    static_assert(WC * MT == L::RED, "row reductions fill the RED arrays");

    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = align1024(smem_raw);
    const uint32_t base = smem_u32(smem);
    const uint32_t sQ = base + L::OFF_Q, sKV = base + L::OFF_KV, sP = base + L::OFF_P;
    float* red_max = (float*)(smem + L::OFF_RED);  // [WC][MT]
    float* red_l = red_max + L::RED;               // [WC][MT]
    unsigned char* valid = smem + L::OFF_VALID;    // [STAGES][BN]
    int* sched = (int*)(smem + L::OFF_SCHED);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wr = warp % MR, wc = warp / MR;
    const int g = lane >> 2, qd = lane & 3;
    const int row0 = blockIdx.y * MT;
    const Loader<T> ld(p);

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
        load_q<T, MT>(p, sg.b, row0, sQ);
        i64 off = ld.row_of(p, sg, sg.t0);
        ld.issue(sKV, valid, off);
        cp_async_commit();
        off = ld.row_of(p, sg, sg.t0 + 1);
        if (sg.t0 + 1 < sg.t1) ld.issue(sKV + TILE_BYTES, valid + BN, off);
        cp_async_commit();
        off = ld.row_of(p, sg, sg.t0 + 2);

        float o[NTV][4];
#pragma unroll
        for (int i = 0; i < NTV; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
        float m_run[2] = {vt::neg_inf(), vt::neg_inf()}, l_run[2] = {0.0f, 0.0f};

        for (int t = sg.t0; t < sg.t1; ++t) {
            const int st = (t - sg.t0) & 1;
            const uint32_t kst = sKV + st * TILE_BYTES;
            const unsigned char* vst = valid + st * BN;
            cp_async_wait<1>();
            __syncthreads();

            // S = Q K^T for rows 16 wr.. and tokens wc*TN..
            float sacc[NTQ][4];
#pragma unroll
            for (int i = 0; i < NTQ; ++i) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.0f;
            const int a_row = wr * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int ks = 0; ks < FD / 16; ++ks) {
                uint32_t a[4];
                const int akc = ks * 2 + (lane >> 4);
                ldsm_x4(sQ + (akc >> 3) * (MT * 128) + swz(a_row, akc & 7), a);
                if constexpr (NTQ == 1) {
                    uint32_t bb[2];
                    const int n = wc * TN + (lane & 7);
                    const int kc = ks * 2 + ((lane >> 3) & 1);
                    ldsm_x2(kst + (kc >> 3) * SUB_BYTES + swz(n, kc & 7), bb);
                    Mma<T>::run(sacc[0], a, bb[0], bb[1]);
                } else {
#pragma unroll
                    for (int np = 0; np < NTQ / 2; ++np) {
                        uint32_t bb[4];
                        const int n = wc * TN + np * 16 + (lane & 7) + (lane >> 4) * 8;
                        const int kc = ks * 2 + ((lane >> 3) & 1);
                        ldsm_x4(kst + (kc >> 3) * SUB_BYTES + swz(n, kc & 7), bb);
                        Mma<T>::run(sacc[2 * np], a, bb[0], bb[1]);
                        Mma<T>::run(sacc[2 * np + 1], a, bb[2], bb[3]);
                    }
                }
            }

            // Mask (invalid tokens, causal limit), scale, row maxima.
            const int tok0 = t * BN;
            float mx[2] = {vt::neg_inf(), vt::neg_inf()};
#pragma unroll
            for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int col = wc * TN + nt * 8 + 2 * qd + (i & 1);
                    const int hi = i >> 1;
                    const bool ok = vst[col] != 0 && tok0 + col < lim[hi];
                    const float v = ok ? sacc[nt][i] * p.scale_log2 : vt::neg_inf();
                    sacc[nt][i] = v;
                    mx[hi] = fmaxf(mx[hi], v);
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
                const float mn = fmaxf(m_run[hi], tm);
                muse[hi] = mn == vt::neg_inf() ? 0.0f : mn;
                alpha[hi] = exp2f(m_run[hi] - muse[hi]);
                m_run[hi] = mn;
                l_run[hi] *= alpha[hi];
            }
#pragma unroll
            for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
                for (int hi = 0; hi < 2; ++hi) {
                    const float p0 = exp2f(sacc[nt][2 * hi] - muse[hi]);
                    const float p1 = exp2f(sacc[nt][2 * hi + 1] - muse[hi]);
                    l_run[hi] += p0 + p1;
                    const int r = wr * 16 + g + 8 * hi;
                    const int col = wc * TN + nt * 8 + 2 * qd;
                    st_shared_u32(sP + swz(r, col >> 3) + (col & 7) * 2, pack2<T>(p0, p1));
                }
#pragma unroll
            for (int i = 0; i < NTV; ++i) {
                o[i][0] *= alpha[0];
                o[i][1] *= alpha[0];
                o[i][2] *= alpha[1];
                o[i][3] *= alpha[1];
            }
            __syncthreads();

            // O += P V for rows 16 wr.. and columns wc*CV..; V = the tile's first 512 features.
#pragma unroll
            for (int ks = 0; ks < BN / 16; ++ks) {
                uint32_t a[4];
                const int akc = ks * 2 + (lane >> 4);
                ldsm_x4(sP + swz(a_row, akc), a);
                const int tok = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
                for (int np = 0; np < NTV / 2; ++np) {
                    uint32_t bb[4];
                    const int fc = (wc * CV + np * 16) / 8 + (lane >> 4);
                    ldsm_x4_t(kst + (fc >> 3) * SUB_BYTES + swz(tok, fc & 7), bb);
                    Mma<T>::run(o[2 * np], a, bb[0], bb[1]);
                    Mma<T>::run(o[2 * np + 1], a, bb[2], bb[3]);
                }
            }
            __syncthreads();
            if (t + 2 < sg.t1) ld.issue(kst, valid + st * BN, off);
            cp_async_commit();
            off = ld.row_of(p, sg, t + 3);
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
// wgmma kernel (sm_90a): 64 query rows per CTA, two warpgroups.
// Per tile: warpgroup 0 computes S = Q K^T with 36 wgmma m64n64k16 (A = Q, B = K, both
// K-major from the swizzled tiles), masks, scales, runs the online softmax on its
// registers (a row lives in one quad), writes P (16-bit, swizzled) and the row rescale
// factors to shared memory; then each warpgroup rescales its half of O (64 x 256 f32 in
// registers) and adds P V with 4 wgmma m64n256k16 (A = P K-major, B = V read MN-major in
// place from the K tile's first 512 features).
// ---------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace mla {

// Shared-memory matrix descriptor, 128-byte swizzle. `lbo`/`sbo` in bytes.
__device__ __forceinline__ uint64_t gmma_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    uint64_t d = (uint64_t)((saddr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo >> 4) & 0x3FFF) << 16;
    d |= (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
    d |= (uint64_t)1 << 62;
    return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator accesses across wgmma issue/wait.
template <int N> __device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_m64n256k16_bf16_tb(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_m64n64k16_f16(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_m64n256k16_f16_tb(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(scale_d));
}

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

template <typename T>
__device__ void decode_wgmma(const Params& p) {
    constexpr int MT = 64;
    using L = Layout<MT>;
    static_assert(L::SMEM <= 232448, "fits the 227 KB a block may have");
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = align1024(smem_raw);
    const uint32_t base = smem_u32(smem);
    const uint32_t sQ = base + L::OFF_Q, sKV = base + L::OFF_KV, sP = base + L::OFF_P;
    float* s_alpha = (float*)(smem + L::OFF_RED);  // [MT] rescale factors, then [2][MT] l, m
    unsigned char* valid = smem + L::OFF_VALID;    // [STAGES][BN]
    int* sched = (int*)(smem + L::OFF_SCHED);

    const int wg = threadIdx.x >> 7;
    const int wwarp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, qd = lane & 3;
    const int row0 = blockIdx.y * MT;
    const int r_lo = wwarp * 16 + g;  // this thread's rows: r_lo, r_lo + 8
    const Loader<T> ld(p);

    const Part part = find_part(p, sched);
    int nb = part.b;
    i64 pre = part.pre;
    Segment sg;
    while (next_segment(p, part, nb, pre, sg)) {
        int lim[2];
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int r = row0 + r_lo + 8 * hi;
            const int s = r < p.m_total ? r / p.N : p.s_q - 1;
            lim[hi] = sg.len - p.s_q + s + 1;
        }
        load_q<T, MT>(p, sg.b, row0, sQ);
        i64 off = ld.row_of(p, sg, sg.t0);
        ld.issue(sKV, valid, off);
        cp_async_commit();
        off = ld.row_of(p, sg, sg.t0 + 1);
        if (sg.t0 + 1 < sg.t1) ld.issue(sKV + TILE_BYTES, valid + BN, off);
        cp_async_commit();
        off = ld.row_of(p, sg, sg.t0 + 2);

        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        float m_run[2] = {vt::neg_inf(), vt::neg_inf()}, l_run[2] = {0.0f, 0.0f};
        float alpha[2] = {1.0f, 1.0f};

        for (int t = sg.t0; t < sg.t1; ++t) {
            const int st = (t - sg.t0) & 1;
            const uint32_t kst = sKV + st * TILE_BYTES;
            const unsigned char* vst = valid + st * BN;
            cp_async_wait<1>();
            fence_proxy_async();  // cp.async wrote Q/K through the generic proxy; wgmma reads async
            __syncthreads();

            if (wg == 0) {
                float s[32];
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < FD / 16; ++ks) {
                    const uint32_t koff = (ks >> 2) * SUB_BYTES + (ks & 3) * 32;
                    const uint64_t da = gmma_desc(sQ + (ks >> 2) * (MT * 128) + (ks & 3) * 32, 16, 1024);
                    const uint64_t db = gmma_desc(kst + koff, 16, 1024);
                    Wg<T>::qk(s, da, db, ks > 0 ? 1 : 0);
                }
                wgmma_commit();
                wgmma_wait0();
                pin(s);

                // s[4i + j]: row r_lo + 8 (j >> 1), token 8 i + 2 qd + (j & 1).
                const int tok0 = t * BN;
                float mx[2] = {vt::neg_inf(), vt::neg_inf()};
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const int col = 8 * i + 2 * qd + (j & 1);
                        const int hi = j >> 1;
                        const bool ok = vst[col] != 0 && tok0 + col < lim[hi];
                        const float v = ok ? s[4 * i + j] * p.scale_log2 : vt::neg_inf();
                        s[4 * i + j] = v;
                        mx[hi] = fmaxf(mx[hi], v);
                    }
                float muse[2];
#pragma unroll
                for (int hi = 0; hi < 2; ++hi) {
                    mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 1));
                    mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 2));
                    const float mn = fmaxf(m_run[hi], mx[hi]);
                    muse[hi] = mn == vt::neg_inf() ? 0.0f : mn;
                    alpha[hi] = exp2f(m_run[hi] - muse[hi]);
                    m_run[hi] = mn;
                    l_run[hi] *= alpha[hi];
                    if (qd == 0) s_alpha[r_lo + 8 * hi] = alpha[hi];
                }
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int hi = 0; hi < 2; ++hi) {
                        const float p0 = exp2f(s[4 * i + 2 * hi] - muse[hi]);
                        const float p1 = exp2f(s[4 * i + 2 * hi + 1] - muse[hi]);
                        l_run[hi] += p0 + p1;
                        const int r = r_lo + 8 * hi;
                        st_shared_u32(sP + swz(r, i) + qd * 4, pack2<T>(p0, p1));
                    }
                fence_proxy_async();  // P is read by wgmma (async proxy)
            }
            __syncthreads();

            if (wg == 1) {
                alpha[0] = s_alpha[r_lo];
                alpha[1] = s_alpha[r_lo + 8];
            }
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                o[4 * i + 0] *= alpha[0];
                o[4 * i + 1] *= alpha[0];
                o[4 * i + 2] *= alpha[1];
                o[4 * i + 3] *= alpha[1];
            }
            pin(o);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < BN / 16; ++ks) {
                const uint64_t da = gmma_desc(sP + ks * 32, 16, 1024);
                const uint64_t db = gmma_desc(kst + (4 * wg) * SUB_BYTES + ks * 2048, SUB_BYTES, 1024);
                Wg<T>::pv(o, da, db);
            }
            wgmma_commit();
            wgmma_wait0();
            pin(o);
            __syncthreads();
            if (t + 2 < sg.t1) ld.issue(kst, valid + st * BN, off);
            cp_async_commit();
            off = ld.row_of(p, sg, t + 3);
        }
        cp_async_wait<0>();

        // Row sums: warpgroup 0 holds them (a quad per row); share through shared memory.
        if (wg == 0) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                float l = l_run[hi];
                l += __shfl_xor_sync(0xffffffffu, l, 1);
                l += __shfl_xor_sync(0xffffffffu, l, 2);
                if (qd == 0) {
                    s_alpha[r_lo + 8 * hi] = l;
                    s_alpha[MT + r_lo + 8 * hi] = m_run[hi];
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int r = row0 + r_lo + 8 * hi;
            if (r >= p.m_total) continue;
            const float l = s_alpha[r_lo + 8 * hi];
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
            for (int i = 0; i < 32; ++i)
                store_pair<T>(p, sg, r, 256 * wg + 8 * i + 2 * qd, o[4 * i + 2 * hi] * inv,
                              o[4 * i + 2 * hi + 1] * inv);
            if (wg == 0 && qd == 0)
                store_lse<T>(p, sg, r, l > 0.0f ? s_alpha[MT + r_lo + 8 * hi] + log2f(l) : vt::neg_inf());
        }
        __syncthreads();
    }
}

}  // namespace mla

#define MLA_WGMMA(S, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1)                             \
        mla_decode_wgmma_##S(const mla::Params p) {                                           \
        mla::decode_wgmma<T>(p);                                                              \
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

#define MLA_MMA(S, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1)                             \
        mla_decode_mma16_##S(const mla::Params p) {                                           \
        mla::decode_mma<T, 1>(p);                                                             \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1)                             \
        mla_decode_mma32_##S(const mla::Params p) {                                           \
        mla::decode_mma<T, 2>(p);                                                             \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1)                             \
        mla_decode_mma64_##S(const mla::Params p) {                                           \
        mla::decode_mma<T, 4>(p);                                                             \
    }
MLA_MMA(bf16, bf16)
MLA_MMA(f16, f16)
