// PrefillAttention: variable-length multi-head attention (flash-attn's varlen form),
// causal bottom-right or not, optional lse. Three kernels (crates/vt-cuda/src/prefill_attention/
// says which runs when):
// - prefill_attention_wgmma_{bf16,f16}: sm_90a, prefill_attention/sm90.cuh.
// - prefill_attention_mma_{bf16,f16}: sm_80+, prefill_attention/sm80.cuh.
// - prefill_attention_generic_*: below, every dtype and head dims.
//
// The generic kernel: a straightforward tiled kernel with an online
// softmax, everything in f32: block (x, y, z) = (query tile, head, sequence) handles
// PF_BQ query rows and walks the keys in tiles of PF_BK through shared memory.
//
// Shared memory (floats): q [BQ][D], k [BK][D], v [BK][Dv], acc [BQ][Dv], p [BQ][BK],
// then m, l, corr [BQ] each; the host computes the same size (prefill_attention.rs).
//
// cu_seqlens are read on the device and checked: a sequence whose bounds are negative,
// decreasing or past Tq / Tk is skipped, and query rows past max_seqlen_q (which sizes the
// grid) are never reached, so no write leaves `out` or `lse`.
#include "common.cuh"
#include "tensor_core.cuh"
#include "prefill_attention/params.cuh"
#include "prefill_attention/sm80.cuh"
#include "prefill_attention/sm90.cuh"

#define PF_BQ 16
#define PF_BK 16
#define PF_THREADS 128

template <typename T>
__device__ void prefill_attention(T* out, i64 o_st, i64 o_sh, float* lse, i64 l_sh, i64 l_st, const T* q, i64 q_st,
                                  i64 q_sh, const T* k, i64 k_st, i64 k_sh, const T* v, i64 v_st, i64 v_sh,
                                  const int* cuq, i64 cuq_s, const int* cuk, i64 cuk_s, i64 tq_total, i64 tk_total,
                                  int d, int dv, float scale, int causal) {
    extern __shared__ float smem[];
    float* qs = smem;
    float* ks = qs + PF_BQ * d;
    float* vs = ks + PF_BK * d;
    float* acc = vs + PF_BK * dv;
    float* ps = acc + PF_BQ * dv;
    float* m = ps + PF_BQ * PF_BK;
    float* l = m + PF_BQ;
    float* corr = l + PF_BQ;

    const int tid = threadIdx.x;
    const i64 h = blockIdx.y, b = blockIdx.z;
    const i64 q0 = (i64)blockIdx.x * PF_BQ;
    const i64 qb = cuq[b * cuq_s], qe = cuq[(b + 1) * cuq_s];
    const i64 kb = cuk[b * cuk_s], ke = cuk[(b + 1) * cuk_s];
    if (qb < 0 || qe < qb || qe > tq_total || kb < 0 || ke < kb || ke > tk_total) return;
    const i64 lq = qe - qb, lk = ke - kb;
    if (q0 >= lq) return;
    const int nq = (int)min((i64)PF_BQ, lq - q0);

    for (int e = tid; e < PF_BQ * d; e += PF_THREADS) {
        const int i = e / d, c = e % d;
        qs[e] = i < nq ? vt::to_f32(q[(qb + q0 + i) * q_st + h * q_sh + c]) : 0.0f;
    }
    for (int e = tid; e < PF_BQ * dv; e += PF_THREADS) acc[e] = 0.0f;
    if (tid < PF_BQ) {
        m[tid] = vt::neg_inf();
        l[tid] = 0.0f;
    }
    // Query row i (of the sequence) sees keys 0 ..= lk - lq + i when causal.
    const i64 shift = lk - lq;
    i64 kend = causal ? min(lk, shift + q0 + nq) : lk;
    if (kend < 0) kend = 0;

    for (i64 k0 = 0; k0 < kend; k0 += PF_BK) {
        const int nk = (int)min((i64)PF_BK, kend - k0);
        __syncthreads();  // the previous tile is no longer read
        for (int e = tid; e < PF_BK * d; e += PF_THREADS) {
            const int j = e / d, c = e % d;
            ks[e] = j < nk ? vt::to_f32(k[(kb + k0 + j) * k_st + h * k_sh + c]) : 0.0f;
        }
        for (int e = tid; e < PF_BK * dv; e += PF_THREADS) {
            const int j = e / dv, c = e % dv;
            vs[e] = j < nk ? vt::to_f32(v[(kb + k0 + j) * v_st + h * v_sh + c]) : 0.0f;
        }
        __syncthreads();
        for (int e = tid; e < PF_BQ * PF_BK; e += PF_THREADS) {
            const int i = e / PF_BK, j = e % PF_BK;
            float s = vt::neg_inf();
            if (i < nq && j < nk && (!causal || k0 + j <= shift + q0 + i)) {
                float dot = 0.0f;
                for (int c = 0; c < d; ++c) dot = fmaf(qs[i * d + c], ks[j * d + c], dot);
                s = dot * scale;
            }
            ps[e] = s;
        }
        __syncthreads();
        if (tid < PF_BQ) {
            const int i = tid;
            float mx = m[i];
            for (int j = 0; j < PF_BK; ++j) mx = fmaxf(mx, ps[i * PF_BK + j]);
            // Rows with no visible key yet keep m = -inf and weights 0.
            const float c = mx == vt::neg_inf() ? 1.0f : expf(m[i] - mx);
            float sum = 0.0f;
            for (int j = 0; j < PF_BK; ++j) {
                const float s = ps[i * PF_BK + j];
                const float p = s == vt::neg_inf() ? 0.0f : expf(s - mx);
                ps[i * PF_BK + j] = p;
                sum += p;
            }
            l[i] = l[i] * c + sum;
            m[i] = mx;
            corr[i] = c;
        }
        __syncthreads();
        for (int e = tid; e < PF_BQ * dv; e += PF_THREADS) {
            const int i = e / dv, c = e % dv;
            float a = acc[e] * corr[i];
            for (int j = 0; j < nk; ++j) a = fmaf(ps[i * PF_BK + j], vs[j * dv + c], a);
            acc[e] = a;
        }
    }
    __syncthreads();
    for (int e = tid; e < nq * dv; e += PF_THREADS) {
        const int i = e / dv, c = e % dv;
        const float li = l[i];
        out[(qb + q0 + i) * o_st + h * o_sh + c] = vt::from_f32<T>(li > 0.0f ? acc[e] / li : 0.0f);
    }
    if (lse != nullptr && tid < nq) {
        const float li = l[tid];
        lse[h * l_sh + (qb + q0 + tid) * l_st] = li > 0.0f ? m[tid] + logf(li) : vt::neg_inf();
    }
}

#define VT_PREFILL(S, T)                                                                                      \
    extern "C" __global__ void __launch_bounds__(PF_THREADS) prefill_attention_generic_##S(                          \
        T* out, i64 o_st, i64 o_sh, float* lse, i64 l_sh, i64 l_st, const T* q, i64 q_st, i64 q_sh,           \
        const T* k, i64 k_st, i64 k_sh, const T* v, i64 v_st, i64 v_sh, const int* cuq, i64 cuq_s,            \
        const int* cuk, i64 cuk_s, i64 tq_total, i64 tk_total, int d, int dv, float scale, int causal) {      \
        prefill_attention<T>(out, o_st, o_sh, lse, l_sh, l_st, q, q_st, q_sh, k, k_st, k_sh, v, v_st, v_sh,   \
                             cuq, cuq_s, cuk, cuk_s, tq_total, tk_total, d, dv, scale, causal);               \
    }
VT_FOR_EACH_FLOAT(VT_PREFILL)
