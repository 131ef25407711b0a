// SparseMlaAttention: absorbed MQA attention of each query token over the cache slots its
// indices row lists (DeepSeek-V3.2's sparse MLA).
//
// The fast path has no kernel of its own here: crates/vt-cuda/src/sparse_mla_attention.rs
// runs MlaDecodeAttention's kernels (mla_decode_attention.cu: cp.async gathers, mma.sync /
// wgmma tensor cores, online softmax, split over the keys with a combine) on the sparse
// problem read as a decode: query token t is sequence t with one query row per head, its
// indices row is its block table, and the cache is viewed with block size 1 (a slot is a
// block id), which those kernels gather row by row. A -1 entry or a slot past the cache is
// a block id outside the cache, which they zero-fill and mask; a repeated slot is a
// repeated block, attended twice. That view needs the cache's slots one stride apart
// (block stride = BS * row stride), true of any cache that is a whole [NB, BS, D] tensor
// or a layer of a [layers, NB, BS, D] pool.
//
// sparse_mla_attention/prefill_sm90.cuh: sparse_mla_prefill_{bf16,f16}, a kernel of its own for
// prefill-shaped calls over a 16-bit cache on sm_90a (64 heads a CTA, a whole topk per CTA,
// seesaw consumers and a gathering producer warpgroup; docs/sparse-design.md, P1).
//
// This file is also the generic kernel for everything else: any head count, D, Dv, strides,
// float dtype, a float or fp8_ds_mla cache (dequantized on load by key_row.cuh, the f32
// values the CPU reference attends over), caches whose blocks are not BS rows apart (a
// layer of a [NB, layers, BS, D] pool). One CTA of 4 warps per query row (token t, head
// h; grid-stride), a warp per listed index, f32 math, online softmax in the log2 domain;
// no split. Dynamic shared memory: (D + 4 Dv) floats (the query row, one accumulator row
// per warp). An index < 0 or >= NB * BS is skipped; a row with none valid gets out = 0 and
// lse = -inf.
#include "common.cuh"
#include "fp8_ds_mla.cuh"
#include "tensor_core.cuh"
#include "mla_decode_attention/params.cuh"
#include "mla_decode_attention/key_row.cuh"
#include "sparse_mla_attention/prefill_sm90.cuh"

namespace sparse_mla {

constexpr int WARPS = 4;
constexpr float LN2 = 0.6931471805599453f;

template <typename T, bool FP8>
__device__ void generic(const T* q, i64 q_st, i64 q_sh, T* out, i64 o_st, i64 o_sh, float* lse, i64 l_sh,
                        i64 l_st, const void* cache, i64 c_sb, i64 c_sr, const int* idx, i64 i_st, i64 i_sk,
                        i64 rows, int n, int d, int dv, int topk, i64 nb, i64 bs, float scale_log2) {
    extern __shared__ float sdyn[];
    __shared__ float wm[WARPS], wl[WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* qrow = sdyn;
    float* ow = sdyn + d + warp * dv;
    const i64 slots = nb * bs;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 t = r / n;
        const int h = (int)(r - t * n);
        const T* qp = q + t * q_st + h * q_sh;
        for (int i = threadIdx.x; i < d; i += blockDim.x) qrow[i] = vt::to_f32(qp[i]);
        for (int i = lane; i < dv; i += 32) ow[i] = 0.0f;
        __syncthreads();
        const int* ip = idx + t * i_st;
        float m = vt::neg_inf(), l = 0.0f;
        for (int j = warp; j < topk; j += WARPS) {
            const i64 s = __ldg(ip + j * i_sk);
            if (s < 0 || s >= slots) continue;
            const i64 blk = s / bs;
            const mla::KeyRow<T, FP8> k(cache, blk * c_sb + (s - blk * bs) * c_sr);
            float dot = 0.0f;
            for (int i = lane; i < d; i += 32) dot = fmaf(qrow[i], k[i], dot);
            dot = vt::warp_sum(dot) * scale_log2;
            const float mn = fmaxf(m, dot);
            const float a = exp2f(m - mn);
            const float pj = exp2f(dot - mn);
            l = l * a + pj;
            m = mn;
            for (int i = lane; i < dv; i += 32) ow[i] = fmaf(pj, k[i], ow[i] * a);
        }
        if (lane == 0) {
            wm[warp] = m;
            wl[warp] = l;
        }
        __syncthreads();
        float mx = vt::neg_inf();
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, wm[w]);
        float f[WARPS], sum = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            f[w] = wm[w] == vt::neg_inf() ? 0.0f : exp2f(wm[w] - mx);
            sum += f[w] * wl[w];
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        T* op = out + t * o_st + h * o_sh;
        for (int i = threadIdx.x; i < dv; i += blockDim.x) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) v += f[w] * sdyn[d + w * dv + i];
            op[i] = vt::from_f32<T>(v * inv);
        }
        if (lse != nullptr && threadIdx.x == 0)
            lse[h * l_sh + t * l_st] = sum > 0.0f ? (mx + log2f(sum)) * LN2 : vt::neg_inf();
        __syncthreads();  // qrow, ow, wm, wl are rewritten by the next row
    }
}

}  // namespace sparse_mla

#define VT_SPARSE_GENERIC(NAME, S, T, FP8)                                                                \
    extern "C" __global__ void __launch_bounds__(sparse_mla::WARPS * 32)                                  \
        NAME##_##S(const T* q, i64 q_st, i64 q_sh, T* out, i64 o_st, i64 o_sh, float* lse, i64 l_sh,       \
                   i64 l_st, const void* cache, i64 c_sb, i64 c_sr, const int* idx, i64 i_st, i64 i_sk,   \
                   i64 rows, int n, int d, int dv, int topk, i64 nb, i64 bs, float scale_log2) {          \
        sparse_mla::generic<T, FP8>(q, q_st, q_sh, out, o_st, o_sh, lse, l_sh, l_st, cache, c_sb, c_sr,   \
                                    idx, i_st, i_sk, rows, n, d, dv, topk, nb, bs, scale_log2);           \
    }
#define VT_SPARSE_FLOAT(S, T) VT_SPARSE_GENERIC(sparse_mla_generic, S, T, false)
#define VT_SPARSE_FP8(S, T) VT_SPARSE_GENERIC(sparse_mla_generic_fp8, S, T, true)
VT_FOR_EACH_FLOAT(VT_SPARSE_FLOAT)
VT_FOR_EACH_FLOAT(VT_SPARSE_FP8)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SPARSE_PREFILL(S, T)                                                                  \
    extern "C" __global__ void __launch_bounds__(sparse_mla::PF_THREADS, 1)                    \
        sparse_mla_prefill_##S(const __grid_constant__ sparse_mla::PrefillParams p) {         \
        sparse_mla::prefill_sm90<T>(p);                                                       \
    }
SPARSE_PREFILL(bf16, bf16)
SPARSE_PREFILL(f16, f16)
#endif
