// MlaDecodeAttention: the split-KV schedule every main kernel follows, computed on the
// device, and the stores of a segment's output (final or partial). Part of
// mla_decode_attention.cu.
//
// Work is split over CTAs by KV tiles of BN = 64 tokens (flash-decoding):
// - The grid is (num_parts, m_blocks). The tiles of all sequences, laid end to end, are cut
//   into num_parts equal ranges ("parts"), at least min_tiles long; part p covers tiles
//   [p*Q, (p+1)*Q). Where B <= blockDim and min_tiles <= 1 the ranges are equal in a cost
//   stream that also counts SEG_COST tiles (SEG_COST_ONE_BLOCK where the grid has one row
//   block) for each sequence start (cost_cut, below), so a part holding two segments gets
//   fewer tiles. Each CTA computes this schedule itself from seq_lens (a block-wide scan; one
//   pass when B <= blockDim), so there is no host sync and no metadata kernel, and mixed
//   lengths balance.
// - Whole-sequence mode (find_part with a scratch array, one pass when B <= blockDim): when
//   the batch is balanced enough that giving every part whole sequences costs no more than
//   cutting (below), each sequence goes to the part holding its midpoint in the "cost
//   stream" (tiles + SPLIT_COST per sequence), so nothing is cut and the combine has
//   nothing to merge. A cut costs a segment start and epilogue (~17 us, ~7 tiles, measured
//   on the H200) plus its partials' round trip through the combine.
// - A part that holds a whole sequence writes out and lse directly. A sequence cut over
//   several parts writes one normalized partial (O / l and its log2-sum-exp) per part into
//   slot p + b of the partial buffers (unique: p + b grows along the tile stream), and the
//   combine kernel (combine.cuh) merges them. The part that holds a sequence's first tile
//   records (first slot, number of slots) in seq_info for the combine kernel.
// - Empty sequences (and queries that see no key) get out = 0 and lse = -inf.
//
// A main kernel calls find_part once, then walks its segments with next_segment (one per
// sequence with tiles in its part) and writes each with store_pair / store_lse.
#pragma once

#include "mla_decode_attention/params.cuh"

namespace mla {

// Lab builds (docs/perf.md, "Twentieth session"): with MLA_TIMELINE 1 (a VT_CUDA_KERNELS_DIR copy
// of this header with the define prepended; the kernels' own build has none of this) the
// three-warpgroup kernels write %globaltimer stamps and wait sums per CTA (the 16-bit narrow
// kernels the stamps, no wait sums; TL_Q0 is their first tile too) into the module table
// mla_timeline[cta][TL_EVENTS] (cta = blockIdx.y * gridDim.x + blockIdx.x, the first TL_CTAS),
// and the combine kernel its first start, first start past the main grid and last end into
// mla_timeline_combine; `xtask bench decode --timeline` clears, runs and reads them
// (vt_cuda::mla_decode_attention::timeline).
#ifndef MLA_TIMELINE
#define MLA_TIMELINE 0
#endif
#if MLA_TIMELINE
enum : int {
    TL_ENTRY,        // thread 0: the kernel's first instruction
    TL_PART,         // thread 0: find_part done
    TL_Q0,           // warpgroup 0: the first segment's Q ready
    TL_TILE0,        // warpgroup 0: the first tile's FULL passed
    TL_SEG0_END,     // warpgroup 0: the first segment's last tile done (FIN)
    TL_QLAST,        // warpgroup 0: the last segment's Q ready
    TL_END0,         // warpgroup 0: the last segment's FIN
    TL_END1,         // thread 128: its last segment's output stores issued
    TL_SEGS,         // value: segments of the CTA
    TL_TILES,        // value: tiles of the CTA
    TL_WAIT_FULL0,   // warpgroup 0, ns summed: FULL waits
    TL_WAIT_PFREE0,  // warpgroup 0, ns summed: P_FREE waits
    TL_WAIT_Q0,      // warpgroup 0, ns summed: Q_READY waits
    TL_WAIT_PFULL1,  // thread 128, ns summed: P_FULL waits
    TL_WAIT_FULL1,   // thread 128, ns summed: FULL waits
    TL_STORE1,       // thread 128, ns summed: the output stores
    TL_WAIT_S0,      // warpgroup 0, ns summed: waits for S's products (after their issue)
    TL_SOFTMAX0,     // warpgroup 0, ns summed: the softmax and P's store (P_FREE's wait left out)
    TL_LANDED0,      // warpgroup 0 (16-bit TMA form), count: tiles t whose tile t + 1 had landed
                     // when S(t) completed (what issuing S(t + 1) before t's softmax could use)
    TL_WAIT_FIN1,    // thread 128, ns summed: waits at FIN (its P V(last) done, warpgroup 0 not yet)
    TL_QLOAD1,       // thread 128, ns summed: Q's load at a segment's start, to its Q_READY arrival
    TL_PV1,          // thread 128, ns summed: the rescale and P V (issue to completion)
    TL_NEXT0,        // warpgroup 0, ns summed: from a segment's FIN to the next Q_READY wait
    TL_EVENTS
};
enum : int { TL_CTAS = 1024 };
extern "C" __device__ unsigned long long mla_timeline[TL_CTAS * TL_EVENTS];
// [0] first combine CTA's start, [1] first start past griddepcontrol.wait, [2] last end, [3]
// CTAs that merged partials.
extern "C" __device__ unsigned long long mla_timeline_combine[4];
__device__ __forceinline__ unsigned long long tl_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned long long* tl_row() {
    const int c = blockIdx.y * gridDim.x + blockIdx.x;
    return c < TL_CTAS ? mla_timeline + c * TL_EVENTS : nullptr;
}
#define MLA_TL_SET(ev, v)                                 \
    do {                                                   \
        if (unsigned long long* tl_r_ = mla::tl_row()) tl_r_[ev] = (v); \
    } while (0)
// (An atomic add without a return: a read-modify-write would stall the stamping thread on the
// load, ~1 us a stamp, and doubled the launches the thirty-first session's timeline read.)
#define MLA_TL_ADD(ev, v)                                  \
    do {                                                   \
        if (unsigned long long* tl_r_ = mla::tl_row()) atomicAdd(tl_r_ + (ev), (unsigned long long)(v)); \
    } while (0)
#define MLA_TL_NOW() mla::tl_now()
#else
#define MLA_TL_SET(ev, v) ((void)0)
#define MLA_TL_ADD(ev, v) ((void)0)
#define MLA_TL_NOW() 0ull
#endif

// Programmatic dependent launch: the main kernels let the combine kernel launch early; the
// combine waits for the main grid's completion (and memory) before reading (common.cuh).
using vt::grid_dep_launch;
using vt::grid_dep_wait;

// Tokens of sequence b that exist: seq_lens clamped to [0, MB * BS] (past the block table
// nothing can be read; the CPU reference rejects such input, the GPU skips it).
__device__ __forceinline__ int eff_len(const Params& p, int b) {
    const int len = __ldg(p.seq_lens + (i64)b * p.sl_s);
    const i64 cap = (i64)p.MB * p.BS;
    if (len <= 0) return 0;
    return (i64)len > cap ? (int)cap : len;
}

__device__ __forceinline__ int tiles_of(int len) { return (len + BN - 1) / BN; }

// Inclusive prefix sums over the block of v and, where TWO, of u with the same barriers: v's is
// returned, u's in u_incl, the block's sums in v_total and u_total. Uses s[0..32): TWO, at most
// 16 warps (every caller: 384 threads or fewer); one value, 32.
template <bool TWO>
__device__ __forceinline__ int block_scan(int v, int u, int* s, int& v_total, int& u_incl, int& u_total) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int nv = __shfl_up_sync(0xffffffffu, v, o), nu = TWO ? __shfl_up_sync(0xffffffffu, u, o) : 0;
        if (lane >= o) v += nv, u += nu;
    }
    if (lane == 31) s[w] = v;
    if (TWO && lane == 31) s[16 + w] = u;
    __syncthreads();
    if (w == 0) {
        int x = lane < nw ? s[lane] : 0, y = TWO && lane < nw ? s[16 + lane] : 0;
#pragma unroll
        for (int o = 1; o < (TWO ? 16 : 32); o <<= 1) {
            const int nx = __shfl_up_sync(0xffffffffu, x, o), ny = TWO ? __shfl_up_sync(0xffffffffu, y, o) : 0;
            if (lane >= o) x += nx, y += ny;
        }
        if (lane < nw) s[lane] = x;
        if (TWO && lane < nw) s[16 + lane] = y;
    }
    __syncthreads();
    const int add_v = w > 0 ? s[w - 1] : 0, add_u = TWO && w > 0 ? s[16 + w - 1] : 0;
    v_total = s[nw - 1];
    if (TWO) u_total = s[16 + nw - 1];
    __syncthreads();
    u_incl = u + add_u;
    return v + add_v;
}

// Inclusive prefix sum over the block; `total` gets the block's sum. Uses s[0..32).
__device__ __forceinline__ int block_scan_incl(int v, int* s, int& total) {
    int unused = 0;
    return block_scan<false>(v, 0, s, total, unused, unused);
}

struct Part {
    i64 begin, end;  // global tile range of this part
    i64 q;           // tiles per part; 0 in whole-sequence mode (no sequence is cut); -1 in
                     // the cost-stream cut (find_part wrote seq_info)
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

// What a cut costs in whole-sequence mode's choice, in tiles of KV: a segment's start and
// epilogue measured ~17 us on the H200 (the 64-row kernel, 2.6 us a tile), plus the
// partials' round trip through the combine. (A macro so that a lab build can change it:
// docs/perf.md, twentieth session.)
#ifndef MLA_SPLIT_COST
#define MLA_SPLIT_COST 8
#endif
constexpr int SPLIT_COST = MLA_SPLIT_COST;

// Whole-sequence mode for thread b's sequence (t tiles, the first `start` tiles and `n_pre`
// nonempty sequences of the batch before it, t_total tiles and `nonempty` nonempty sequences in
// all): returns whether every part gets whole sequences, and if so fills r. Every part's load
// (tiles + SPLIT_COST per sequence) must be at most what a cut schedule costs a part: the even
// share plus SPLIT_COST for its first segment, for the combine, and for each sequence boundary
// it crosses (nonempty / parts on average). loads: >= num_parts ints of shared memory; s: 40
// ints (s[33..37] used here).
__device__ __forceinline__ bool whole_sequences(const Params& p, int* s, int* loads, int b, int t, int start,
                                                int t_total, int n_pre, int nonempty, Part& r) {
    const int np = p.num_parts;
    const int c = t > 0 ? t + SPLIT_COST : 0;
    // The cost stream's prefix and total from the tiles' and the nonempty sequences' scans.
    const int c_total = t_total + SPLIT_COST * nonempty, c_start = start + SPLIT_COST * n_pre;
    const i64 bound = (i64)t_total + (i64)SPLIT_COST * (2 * (i64)np + nonempty);
    // At most min(np, nonempty) parts hold a load, so the largest is at least c_total over that:
    // where even that exceeds the bound (one sequence over many parts: b1), no barrier is spent.
    const i64 holders = np < nonempty ? np : nonempty;
    if (holders > 0 && (i64)c_total * np > bound * holders) return false;  // (uniform)
    for (int i = threadIdx.x; i < np; i += blockDim.x) loads[i] = 0;
    if (threadIdx.x == 0) {
        s[33] = p.B;
        s[34] = -1;
        s[37] = 0;
    }
    __syncthreads();
    // The part holding the sequence's midpoint (monotonic in b, < np).
    const int part = c > 0 ? (int)(((2 * (i64)c_start + c) * np) / (2 * (i64)c_total)) : -1;
    if (c > 0) atomicAdd(&loads[part], c);
    if (part == (int)blockIdx.x) {
        atomicMin(&s[33], b);
        atomicMax(&s[34], b);
    }
    __syncthreads();
    int mx = 0;
    for (int i = threadIdx.x; i < np; i += blockDim.x) mx = max(mx, loads[i]);
    if (mx > 0) atomicMax(&s[37], mx);
    __syncthreads();
    const bool whole = (i64)s[37] * np <= bound;
    const int first = s[33], last = s[34];
    if (b == first) s[35] = start;
    if (b == last) s[36] = start + t;
    __syncthreads();
    if (whole) {
        r.q = 0;
        if (last >= 0) {
            r.begin = s[35];
            r.end = s[36];
            r.b = first;
            r.pre = r.begin;
        } else {
            r.begin = r.end = t_total;
            r.b = p.B;
            r.pre = t_total;
        }
    }
    __syncthreads();
    return whole;
}

// What a segment start costs the cut schedule, in tiles of KV (0: the even cut by tiles). In
// the cut, a part that crosses a sequence boundary pays a second Q load, a second epilogue and
// the tensor cores' idle time between them: at h128 b32 s4096 the parts with two segments ended
// 15 us after those with one, at the same tile count (the timeline, twenty-ninth session), so
// the grid waited for them. With SEG_COST > 0 the cut is even over a cost stream in which
// sequence b weighs its tiles plus SEG_COST (FlashMLA's scheduler counts a fixed overhead per
// batch the same way), so a part that starts a sequence gets SEG_COST fewer tiles. Measured on
// an H100 beside FlashMLA (lab builds 4 / 6 / 8 against 0, docs/perf.md "Twenty-ninth
// session"): b32 s4096 at 128 heads 108.8 -> 104.3 us (4), at 64 heads 93.3 -> 89.4 (4) / 87.3
// (6), the other rows within 1%. A macro so that a lab build can change it (0: the even cut).
// Where the grid has one row block (64 query rows or fewer: a tile costs one CTA less time, so
// a segment start weighs more tiles) the cut takes SEG_COST_ONE_BLOCK instead: with the CTA pair
// at 128 heads, 8 took 2-3% off h64 b32 and added 2% at h128 b32, h16 and b1 within 1%, on an
// H100 (docs/perf.md, "Thirty-second session" and "Thirty-third session").
#ifndef MLA_SEG_COST
#define MLA_SEG_COST 4
#endif
#ifndef MLA_SEG_COST_ONE_BLOCK
#define MLA_SEG_COST_ONE_BLOCK 8
#endif
constexpr int SEG_COST = MLA_SEG_COST, SEG_COST_ONE_BLOCK = MLA_SEG_COST_ONE_BLOCK;
static_assert((SEG_COST > 0) == (SEG_COST_ONE_BLOCK > 0), "next_segment's seq_info rule holds for both");

// The cost-stream cut for thread b's sequence (t tiles, the first `pre` tiles of the batch
// before it, t_total in all): part x covers cost positions [x qc, (x + 1) qc), where the cost
// stream lays out each nonempty sequence as SEG positions (SEG_COST, or SEG_COST_ONE_BLOCK for a
// grid of one row block), then one per tile. A cost position maps to the tile it reaches in its
// sequence (its overhead positions map to the sequence's first tile), so the parts' tile ranges
// tile the batch in order. Returns false (r untouched) where a part could fall inside one
// sequence's overhead (qc <= SEG: a few tiles a part, where the even cut is as good). Writes
// seq_info for the sequences whose first tile is in this part (part.q = -1: next_segment does
// not), since the number of parts a sequence spans needs its cost position, which only the scan
// has.
__device__ __forceinline__ bool cost_cut(const Params& p, int* s, int b, int t, int pre, int t_total, int n_pre,
                                         int nonempty, Part& r) {
    const int SEG = gridDim.y > 1 ? SEG_COST : SEG_COST_ONE_BLOCK;  // (uniform over the grid)
    const int c = t > 0 ? t + SEG : 0;
    // The cost stream's prefix and total from the tiles' and the nonempty sequences' scans.
    const int c_total = t_total + SEG * nonempty, cpre = pre + SEG * n_pre;
    const int np = p.num_parts;
    const i64 qc = ((i64)c_total + np - 1) / np;
    if (qc <= SEG) return false;  // the same in every thread
    const i64 x0 = (i64)blockIdx.x * qc, x1 = x0 + qc < c_total ? x0 + qc : c_total;
    if (threadIdx.x == 0) {
        s[33] = p.B;
        s[34] = t_total;
        s[35] = t_total;
        s[36] = t_total;
    }
    __syncthreads();
    if (c > 0) {
        auto tile_at = [&](i64 x) {
            const i64 k = x - cpre - SEG;
            return pre + (int)(k < 0 ? 0 : k > t ? t : k);
        };
        if (cpre <= x0 && x0 < cpre + c) {
            s[33] = b;
            s[34] = pre;
            s[35] = tile_at(x0);
        }
        if (cpre <= x1 && x1 < cpre + c) s[36] = tile_at(x1);
        const int first = (int)((cpre + SEG) / qc), last = (int)((cpre + c - 1) / qc);
        if (first == (int)blockIdx.x && blockIdx.y == 0) {
            p.seq_info[2 * b] = first + b;  // the slot next_segment gives the part's segment
            p.seq_info[2 * b + 1] = last - first + 1;
        }
    }
    __syncthreads();
    r.q = -1;
    r.b = s[33];
    r.pre = s[34];
    r.begin = s[35];
    r.end = s[36];
    __syncthreads();
    return true;
}

// The part of this CTA (blockIdx.x). Called by the whole block; every thread gets the same
// result. `s` is 40 ints of shared memory; `loads` (nullptr: never) `cap` ints of shared
// memory for whole-sequence mode, which is tried when B <= blockDim and num_parts <= cap.
__device__ Part find_part(const Params& p, int* s, int* loads = nullptr, int cap = 0) {
    if (p.B <= (int)blockDim.x) {
        // One pass: thread b owns sequence b.
        const int b = threadIdx.x;
        const int t = b < p.B ? tiles_of(eff_len(p, b)) : 0, ne = t > 0 ? 1 : 0;
        // One scan for the tiles and the nonempty sequences: both cost streams' prefixes follow.
        int t_total = 0, n_incl = 0, nonempty = 0;
        const int incl = block_scan<true>(t, ne, s, t_total, n_incl, nonempty);
        const int n_pre = n_incl - ne;
        const i64 total = t_total;
        Part r = part_bounds(p, total);
        if (loads != nullptr && p.num_parts <= cap && p.min_tiles <= 1 &&
            whole_sequences(p, s, loads, b, t, incl - t, t_total, n_pre, nonempty, r))
            return r;
        if (SEG_COST > 0 && p.min_tiles <= 1 && cost_cut(p, s, b, t, incl - t, t_total, n_pre, nonempty, r)) return r;
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
        if ((SEG_COST == 0 || part.q >= 0) && first >= part.begin && blockIdx.y == 0 && threadIdx.x == 0) {
            const int n = part.q > 0 ? (int)((pre - 1) / part.q - blockIdx.x + 1) : 1;
            p.seq_info[2 * cur] = sg.slot;
            p.seq_info[2 * cur + 1] = n;
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
        store_part2(p, sg.slot, row, col, v0, v1);
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

}  // namespace mla
