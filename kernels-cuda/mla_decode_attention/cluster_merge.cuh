// MlaDecodeAttention: the cluster merge, the epilogue of the three-warpgroup kernel's cluster
// form (`mla_decode_wgmma_3wg_cm`, sm_90a; schedule.cuh's cluster_part says which CTAs hold
// which slice of which sequence). Part of mla_decode_attention.cu.
//
// Where a sequence's tiles are shared by n > 1 CTAs of one cluster, each CTA ends with a
// partial output of all 64 rows. Instead of writing it to global memory for the combine kernel
// (a second launch, which starts only as the main grid's CTAs leave their SMs: docs/perf.md,
// "Forty-first session"), each CTA stages its normalized partial (f32) and its rows' log2-sum-exp
// in its own ring, free once the last tile is read; after a cluster barrier, CTA j of the n
// merges rows [j m / n, (j + 1) m / n) from the n stages through distributed shared memory and
// writes out and lse; a second cluster barrier keeps every stage alive until all its readers are
// done. The merge is the combine's: weights 2^(lse_i - max), empty partials (lse = -inf)
// weigh 0, a row no key reaches gets out = 0 and lse = -inf.
#pragma once

#include "mla_decode_attention/schedule.cuh"

namespace mla {

// (Enumerators, not constexpr ints: see combine.cuh.)
enum : int {
    CM_LD = FDV + 8,                     // floats a staged row: the 8 more put a warp's float2 stores
                                         // of 8 rows (rows 8 apart in banks) two to a bank at most
    CM_LSE = WGMMA_ROWS * CM_LD * 4,     // byte offset of the rows' lse2 [64] in the stage
    CM_STAGE = CM_LSE + WGMMA_ROWS * 4,  // the stage's bytes (within the 16-bit ring's two slots)
};

__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ float4 ld_cluster_v4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

// Warpgroups 1 and 2 (w3_store's registers and arguments): rows r_lo, r_lo + 8 of the CTA's
// partial, columns col0 + 8 i + 2 qd (+1), scaled by 1 / l, into the stage at st; with_lse: the
// rows' lse2 (-inf where no key reached the row).
template <class Fin>
__device__ __forceinline__ void cm_stage(unsigned char* st, const float (&o)[128], Fin fin, int r_lo, int qd, int col0,
                                         bool with_lse) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const int r = r_lo + 8 * hi;
        const float l = fin(hi);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float* row = (float*)st + r * CM_LD + col0 + 2 * qd;
#pragma unroll
        for (int i = 0; i < 32; ++i)
            *reinterpret_cast<float2*>(row + 8 * i) = make_float2(o[4 * i + 2 * hi] * inv, o[4 * i + 2 * hi + 1] * inv);
        if (with_lse && qd == 0) ((float*)(st + CM_LSE))[r] = l > 0.0f ? fin(2 + hi) + log2f(l) : vt::neg_inf();
    }
}

// Every thread of the CTA, NT of them: this CTA's share of its sequence's rows merged from the
// stages at st (the same offset in each CTA) of cluster ranks [cs.r0, cs.r0 + cs.n), written to
// out (16-bit, four adjacent values a store: the tensor-core kernels run only where out's rows are
// 16-byte aligned) and lse.
template <typename T, int NT>
__device__ __forceinline__ void cm_merge(const Params& p, int b, uint32_t st, int row0, const ClusterSeg& cs) {
    constexpr int C4 = FDV / 4;  // runs of four columns a row
    const int rank = (int)cluster_ctarank(), j = rank - cs.r0;
    const int m_rows = min((int)WGMMA_ROWS, p.m_total - row0);
    const int lo = m_rows * j / cs.n, hi = m_rows * (j + 1) / cs.n;
    uint32_t src[CM_CTAS];
#pragma unroll
    for (int i = 0; i < CM_CTAS; ++i) src[i] = mapa_shared(st, (uint32_t)(cs.r0 + min(i, cs.n - 1)));
    for (int idx = threadIdx.x; idx < (hi - lo) * C4; idx += NT) {
        const int r = lo + idx / C4, c = 4 * (idx % C4);
        float lv[CM_CTAS], mx = vt::neg_inf();
#pragma unroll
        for (int i = 0; i < CM_CTAS; ++i) {
            lv[i] = i < cs.n ? ld_cluster_f32(src[i] + CM_LSE + 4 * r) : vt::neg_inf();
            mx = fmaxf(mx, lv[i]);
        }
        float sum = 0.0f, a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < CM_CTAS; ++i) {
            if (i >= cs.n) break;
            const float4 v = ld_cluster_v4(src[i] + 4 * (r * CM_LD + c));
            const float wgt = lv[i] == vt::neg_inf() ? 0.0f : exp2f(lv[i] - mx);
            sum += wgt;
            a[0] = fmaf(wgt, v.x, a[0]);
            a[1] = fmaf(wgt, v.y, a[1]);
            a[2] = fmaf(wgt, v.z, a[2]);
            a[3] = fmaf(wgt, v.w, a[3]);
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        const int row = row0 + r, s = row / p.N, h = row - s * p.N;
        T* o = (T*)p.out + b * p.o_sb + s * p.o_ss + h * p.o_sh + c;
        *reinterpret_cast<uint2*>(o) = make_uint2(pack2<T>(a[0] * inv, a[1] * inv), pack2<T>(a[2] * inv, a[3] * inv));
        if (c == 0 && p.lse != nullptr)
            p.lse[b * p.l_sb + h * p.l_sh + s * p.l_ss] = sum > 0.0f ? (mx + log2f(sum)) * LN2 : vt::neg_inf();
    }
}

// Every thread of every CTA of the cluster, once its stage (if any) is written: the merge between
// the two cluster barriers (idle CTAs and CTAs holding a whole sequence only take part in the
// barriers).
template <typename T, int NT>
__device__ __forceinline__ void cm_finish(const Params& p, int b, uint32_t st, int row0, const ClusterSeg& cs) {
    cluster_sync();  // every stage of the cluster is written (release / acquire at cluster scope)
    if (cs.n > 1) cm_merge<T, NT>(p, b, st, row0, cs);
    cluster_sync();  // every read of this CTA's stage is done before it exits
}

}  // namespace mla
