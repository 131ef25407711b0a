// MlaDecodeAttention, the combine kernel: merges the normalized partials of sequences cut
// over several parts (schedule.cuh) by their log-sum-exp and writes empty sequences
// (out = 0, lse = -inf). Launched after every main kernel, with programmatic dependent
// launch on sm_90 (the main kernels trigger it early; it waits with griddepcontrol.wait).
// Planned by crates/vt-cuda/src/mla_decode_attention/combine.rs. Part of
// mla_decode_attention.cu.
//
// grid (B, ceil(m_total / (COMBINE_WARPS / W)), ceil(Dv / COMBINE_COLS)), THREADS (256)
// threads, W = combine_wpr warps per query row (1 or COMBINE_WARPS), each taking every
// W-th partial of the row; lane l owns columns l + 32 k of the CTA's COMBINE_COLS. With
// W = 8 a b = 1 call spreads its ~100 partials per row over 8 warps, so the read is not
// one long dependent chain.
#pragma once

#include "mla_decode_attention/schedule.cuh"

namespace mla {

// (Enumerators, not constexpr ints: NVRTC emits every namespace-scope constant into the PTX
// as a .global, and these keep the module's PTX what it was before they were named.)
enum : int {
    COMBINE_WARPS = THREADS / 32,  // 8: query rows per CTA at one warp per row
    COMBINE_COLS = 128,            // output columns per CTA: 4 per lane
};
static_assert(COMBINE_COLS == 32 * 4, "a lane accumulates 4 columns");

template <typename T>
__device__ void combine(const Params& p) {
    __shared__ float red[COMBINE_WARPS][COMBINE_COLS];
    grid_dep_launch();  // a dependent GEMM after this (VT_PDL) may prefetch its weights
#if MLA_TIMELINE
    if (threadIdx.x == 0) atomicMin(&mla_timeline_combine[0], tl_now());
#endif
    grid_dep_wait();
#if MLA_TIMELINE
    if (threadIdx.x == 0) atomicMin(&mla_timeline_combine[1], tl_now());
#endif
    const int W = p.combine_wpr;
    const int b = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.y * (COMBINE_WARPS / W) + warp / W;
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
    const int c0 = blockIdx.z * COMBINE_COLS + lane;
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
#if MLA_TIMELINE
    if (lane == 0) {
        atomicMax(&mla_timeline_combine[2], tl_now());
        if (warp == 0) atomicAdd(&mla_timeline_combine[3], 1ull);
    }
#endif
}

}  // namespace mla
