// MlaDecodeAttention, the generic kernel: any D and Dv, any float type, any strides, a
// float or fp8_ds_mla cache (key_row.cuh); a warp per key, f32 math, one query row per CTA.
// Simple and obviously right; used for f32, fp8_ds_mla caches and unusual shapes. Planned by
// crates/vt-cuda/src/mla_decode_attention/generic.rs. Part of mla_decode_attention.cu.
//
// grid (num_parts, m_total), GEN_THREADS (128) threads. Dynamic shared memory:
// generic_smem(D, Dv) bytes (the query row, then one Dv accumulator row per warp).
#pragma once

#include "mla_decode_attention/key_row.cuh"
#include "mla_decode_attention/schedule.cuh"

namespace mla {

// Bytes of dynamic shared memory decode_generic indexes for head dims D, Dv.
__host__ __device__ constexpr int generic_smem(int d, int dv) { return (d + (GEN_THREADS / 32) * dv) * (int)sizeof(float); }

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
                *part_row(p, sg.slot, row, i) = v;
            }
        }
        if (threadIdx.x == 0) store_lse<T>(p, sg, row, sum > 0.0f ? mx + log2f(sum) : vt::neg_inf());
        __syncthreads();
    }
}

}  // namespace mla
