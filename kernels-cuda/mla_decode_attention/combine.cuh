// MlaDecodeAttention, the combine kernel: merges the normalized partials of sequences cut
// over several parts (schedule.cuh) by their log-sum-exp and writes empty sequences
// (out = 0, lse = -inf). Launched after every main kernel, with programmatic dependent
// launch on sm_90 (the main kernels trigger it early; it waits with griddepcontrol.wait).
// Planned by crates/vt-cuda/src/mla_decode_attention/combine.rs. Part of
// mla_decode_attention.cu.
//
// grid (B, ceil(m_total / (COMBINE_WARPS / W)), ceil(Dv / COMBINE_COLS)), THREADS (256)
// threads, W = combine_wpr warps per query row (1 or COMBINE_WARPS), each taking every W-th
// partial of the row. A warp holds a whole 512-column row: lane l owns the runs of 4 columns at
// 4 l + 128 k (k < 4), read as float4 when Dv is a multiple of 4, so a warp's partial is four
// 512-byte loads. The merge is online (running max, sum and output rescaled as a larger lse
// comes), so a partial's lse and row load together and the unrolled loop keeps several
// partials' loads in flight: two dependent round trips a row (seq_info, then the partials).
// The first form (a warp per 128 columns, the lse pass before the rows) made four and 4x the
// CTAs: at h128 b32 (2048 CTAs) ncu measured 18 us, 1.43 TB/s, 52% occupancy, its warps stalled
// on L1TEX (docs/perf.md, "Twenty-fourth session").
#pragma once

#include "mla_decode_attention/schedule.cuh"

namespace mla {

// Partials a warp loads at once, and the CTAs an SM its registers must allow: 2 and 3 (78
// registers, 24 warps an SM) took the combine 4-10% below 4 and the compiler's choice (114
// registers, 2 CTAs) on an H100 under ncu, same call; 2 with 4 CTAs and 4 with 3 CTAs spill and
// were not faster (docs/perf.md, "Twenty-fourth session", call 6). Lab builds may set others.
#ifndef MLA_COMBINE_BATCH
#define MLA_COMBINE_BATCH 2
#endif
#ifndef MLA_COMBINE_MIN_CTAS
#define MLA_COMBINE_MIN_CTAS 3
#endif
#define MLA_COMBINE_BOUNDS __launch_bounds__(mla::THREADS, MLA_COMBINE_MIN_CTAS)

// (Enumerators, not constexpr ints: NVRTC emits every namespace-scope constant into the PTX
// as a .global, and these keep the module's PTX what it was before they were named.)
enum : int {
    COMBINE_WARPS = THREADS / 32,  // 8: query rows per CTA at one warp per row
    COMBINE_COLS = 512,            // output columns per CTA: 16 per lane
    COMBINE_RUNS = 4,              // runs of 4 adjacent columns per lane, 128 apart
    COMBINE_BATCH = MLA_COMBINE_BATCH,  // partials a warp loads before it merges them
    COMBINE_MIN_CTAS = MLA_COMBINE_MIN_CTAS,  // CTAs an SM holds (the strided form's wave)
};
static_assert(COMBINE_COLS == 32 * 4 * COMBINE_RUNS, "a lane owns COMBINE_RUNS runs of 4 columns");

// Lane `lane`'s 16 values of one partial row `po` (its columns from c0); zeros past Dv or
// where !ok. VEC (Dv % 4 == 0): a run is in range whole or not at all, 16-byte aligned.
template <bool VEC>
__device__ __forceinline__ void combine_load(const float* po, int c0, int lane, int dv, bool ok, float (&x)[16]) {
#pragma unroll
    for (int k = 0; k < COMBINE_RUNS; ++k) {
        const int col = c0 + 128 * k + 4 * lane;
        if constexpr (VEC) {
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (ok && col < dv) v = *reinterpret_cast<const float4*>(po + col);
            x[4 * k] = v.x;
            x[4 * k + 1] = v.y;
            x[4 * k + 2] = v.z;
            x[4 * k + 3] = v.w;
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) x[4 * k + j] = ok && col + j < dv ? po[col + j] : 0.0f;
        }
    }
}

// One warp's share of a row: partials sub, sub + W, ... of n, merged online in the log2
// domain (mx the largest lse so far, sum and acc scaled to it), COMBINE_BATCH at a time with
// all their loads issued before any is used.
template <bool VEC>
__device__ __forceinline__ void combine_rows(const float* plse, const float* po, i64 lse_stride, i64 slot_stride,
                                             int sub, int W, int n, int c0, int lane, int dv, float& mx, float& sum,
                                             float (&acc)[16]) {
    for (int c = sub; c < n; c += COMBINE_BATCH * W) {
        float v[COMBINE_BATCH], x[COMBINE_BATCH][16];
#pragma unroll
        for (int u = 0; u < COMBINE_BATCH; ++u) {
            const int cu = c + u * W;
            const bool ok = cu < n;
            v[u] = ok ? plse[(i64)cu * lse_stride] : vt::neg_inf();
            combine_load<VEC>(po + (ok ? cu : 0) * slot_stride, c0, lane, dv, ok, x[u]);
        }
#pragma unroll
        for (int u = 0; u < COMBINE_BATCH; ++u) {
            // An empty partial (lse = -inf) weighs 0; the factors avoid -inf - -inf.
            const float m2 = fmaxf(mx, v[u]);
            const float f = mx == vt::neg_inf() ? 0.0f : exp2f(mx - m2);
            const float w = v[u] == vt::neg_inf() ? 0.0f : exp2f(v[u] - m2);
            sum = fmaf(sum, f, w);
#pragma unroll
            for (int j = 0; j < 16; ++j) acc[j] = fmaf(acc[j], f, w * x[u][j]);
            mx = m2;
        }
    }
}

// One CTA's row group of sequence b (first slot `first`, n partials): this warp's row `row`
// (active: a row of the sequence), its W warps (this one the sub-th) merging the row's partials
// (red, red_m, red_s: the W > 1 reduction's shared memory) and writing out and lse.
template <typename T>
__device__ __forceinline__ void combine_group(const Params& p, int b, int row, int sub, bool active, int first, int n,
                                              int W, float4 (*red)[COMBINE_COLS / 4], float* red_m, float* red_s) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c0 = blockIdx.z * COMBINE_COLS;
    float mx = vt::neg_inf(), sum = 0.0f, acc[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) acc[j] = 0.0f;
    if (active) {
        const float* plse = p.part_lse + (i64)first * p.m_total + row;
        const float* po = part_row(p, first, row, 0);
        const i64 slot_stride = (i64)p.m_total * p.dv;
        // part_o is 256-byte aligned and its rows Dv floats apart: 16-byte runs when 4 | Dv.
        if ((p.dv & 3) == 0)
            combine_rows<true>(plse, po, p.m_total, slot_stride, sub, W, n, c0, lane, p.dv, mx, sum, acc);
        else
            combine_rows<false>(plse, po, p.m_total, slot_stride, sub, W, n, c0, lane, p.dv, mx, sum, acc);
    }
    if (W > 1) {  // the row's W warps merge into its first (uniform over the block)
#pragma unroll
        for (int k = 0; k < COMBINE_RUNS; ++k)
            red[warp][32 * k + lane] = make_float4(acc[4 * k], acc[4 * k + 1], acc[4 * k + 2], acc[4 * k + 3]);
        if (lane == 0) {
            red_m[warp] = mx;
            red_s[warp] = sum;
        }
        __syncthreads();
        if (sub == 0) {
            float m_all = vt::neg_inf();
            for (int j = 0; j < W; ++j) m_all = fmaxf(m_all, red_m[warp + j]);
            sum = 0.0f;
#pragma unroll
            for (int j = 0; j < 16; ++j) acc[j] = 0.0f;
            for (int j = 0; j < W; ++j) {
                const float mj = red_m[warp + j];
                const float f = mj == vt::neg_inf() ? 0.0f : exp2f(mj - m_all);
                sum = fmaf(red_s[warp + j], f, sum);
#pragma unroll
                for (int k = 0; k < COMBINE_RUNS; ++k) {
                    const float4 v = red[warp + j][32 * k + lane];
                    acc[4 * k] = fmaf(v.x, f, acc[4 * k]);
                    acc[4 * k + 1] = fmaf(v.y, f, acc[4 * k + 1]);
                    acc[4 * k + 2] = fmaf(v.z, f, acc[4 * k + 2]);
                    acc[4 * k + 3] = fmaf(v.w, f, acc[4 * k + 3]);
                }
            }
            mx = m_all;
        }
    }
    if (!active || sub != 0) return;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int s = row / p.N, h = row - s * p.N;
    T* o = (T*)p.out + b * p.o_sb + s * p.o_ss + h * p.o_sh;
#pragma unroll
    for (int k = 0; k < COMBINE_RUNS; ++k)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = c0 + 128 * k + 4 * lane + j;
            if (col < p.dv) o[col] = vt::from_f32<T>(acc[4 * k + j] * inv);
        }
    if (p.lse != nullptr && blockIdx.z == 0 && lane == 0)
        p.lse[b * p.l_sb + h * p.l_sh + s * p.l_ss] = sum > 0.0f ? (mx + log2f(sum)) * LN2 : vt::neg_inf();
#if MLA_TIMELINE
    if (lane == 0) {
        atomicMax(&mla_timeline_combine[2], tl_now());
        if (warp == 0) atomicAdd(&mla_timeline_combine[3], 1ull);
    }
#endif
}

// STRIDE (`mla_decode_combine_strided_*`, `VT_MLA_COMBINE_STRIDE`): grid.y may be fewer than the
// sequence's row groups, each CTA taking row groups blockIdx.y, + gridDim.y, ...; a sequence with
// nothing to merge then costs B x gridDim.y CTAs that read its record and leave instead of one
// CTA a row group (docs/perf.md, "Forty-second session": 4.0 / 5.2 us alone at b128 where nothing
// is cut, h64 / h128).
template <typename T, bool STRIDE = false>
__device__ void combine(const Params& p) {
    // W > 1: each warp's (max, sum, 512 columns) for the row's merge.
    __shared__ float4 red[COMBINE_WARPS][COMBINE_COLS / 4];
    __shared__ float red_m[COMBINE_WARPS], red_s[COMBINE_WARPS];
    grid_dep_launch();  // a dependent GEMM after this (VT_PDL) may prefetch its weights
#if MLA_TIMELINE
    if (threadIdx.x == 0) atomicMin(&mla_timeline_combine[0], tl_now());
#endif
    grid_dep_wait();
#if MLA_TIMELINE
    if (threadIdx.x == 0) atomicMin(&mla_timeline_combine[1], tl_now());
#endif
    const int W = p.combine_wpr;
    const int b = blockIdx.x, warp = threadIdx.x >> 5;
    // The plain form's row, before the loads as it always was (its SASS stays what was measured);
    // the strided form computes each group's row in its loop.
    const int rows_per_cta = COMBINE_WARPS / W;
    const int row = blockIdx.y * rows_per_cta + warp / W;
    const int sub = warp % W;
    const bool active = row < p.m_total;
    // Loaded together (one round trip); seq_info is stale for empty sequences and unused.
    const int len = eff_len(p, b);
    const int first = p.seq_info[2 * b], n_info = p.seq_info[2 * b + 1];
    const int n = len > 0 ? n_info : 0;
    if (len > 0 && n <= 1) {  // written by the main kernel (uniform over the block)
#if MLA_TIMELINE
        if (threadIdx.x == 0) atomicMax(&mla_timeline_combine[2], tl_now());
#endif
        return;
    }
    if constexpr (!STRIDE) {
        combine_group<T>(p, b, row, sub, active, first, n, W, red, red_m, red_s);
    } else {
        const int groups = (p.m_total + rows_per_cta - 1) / rows_per_cta;
        for (int g = blockIdx.y; g < groups; g += gridDim.y) {
            if (W > 1 && g != (int)blockIdx.y) __syncthreads();  // the last group's red is read
            const int r = g * rows_per_cta + warp / W;
            combine_group<T>(p, b, r, sub, r < p.m_total, first, n, W, red, red_m, red_s);
        }
    }
}

}  // namespace mla
