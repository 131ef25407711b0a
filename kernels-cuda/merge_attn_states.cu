// MergeAttnStates: merges two partial attention results over disjoint key sets by their
// lse. One block per (t, n) row (grid-stride). An lse of +-inf marks an empty side (weight
// 0); both empty gives out = 0 and out_lse = -inf.
#include "common.cuh"

template <typename T>
__device__ void merge_attn_states(T* out, i64 o_st, i64 o_sh, float* out_lse, i64 ol_sh, i64 ol_st, const T* pre,
                                  i64 p_st, i64 p_sh, const float* plse, i64 pl_sh, i64 pl_st, const T* suf, i64 s_st,
                                  i64 s_sh, const float* slse, i64 sl_sh, i64 sl_st, i64 tokens, int heads, int v) {
    const i64 rows = tokens * heads;
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const i64 t = row / heads, h = row % heads;
        float lp = plse[h * pl_sh + t * pl_st];
        float ls = slse[h * sl_sh + t * sl_st];
        if (isinf(lp)) lp = vt::neg_inf();
        if (isinf(ls)) ls = vt::neg_inf();
        const float m = fmaxf(lp, ls);
        T* o = out + t * o_st + h * o_sh;
        const T* a = pre + t * p_st + h * p_sh;
        const T* b = suf + t * s_st + h * s_sh;
        if (m == vt::neg_inf()) {
            for (int i = threadIdx.x; i < v; i += blockDim.x) o[i] = vt::from_f32<T>(0.0f);
            if (out_lse != nullptr && threadIdx.x == 0) out_lse[h * ol_sh + t * ol_st] = vt::neg_inf();
            continue;
        }
        const float wp = expf(lp - m), ws = expf(ls - m), sum = wp + ws;
        // An empty side is not read at all: its rows may hold anything (even NaN).
        const bool use_p = lp != vt::neg_inf(), use_s = ls != vt::neg_inf();
        for (int i = threadIdx.x; i < v; i += blockDim.x) {
            float acc = 0.0f;
            if (use_p) acc += wp * vt::to_f32(a[i]);
            if (use_s) acc += ws * vt::to_f32(b[i]);
            o[i] = vt::from_f32<T>(acc / sum);
        }
        if (out_lse != nullptr && threadIdx.x == 0) out_lse[h * ol_sh + t * ol_st] = m + logf(sum);
    }
}

#define VT_MERGE(S, T)                                                                                      \
    extern "C" __global__ void merge_attn_states_##S(                                                       \
        T* out, i64 o_st, i64 o_sh, float* out_lse, i64 ol_sh, i64 ol_st, const T* pre, i64 p_st, i64 p_sh, \
        const float* plse, i64 pl_sh, i64 pl_st, const T* suf, i64 s_st, i64 s_sh, const float* slse,       \
        i64 sl_sh, i64 sl_st, i64 tokens, int heads, int v) {                                               \
        merge_attn_states<T>(out, o_st, o_sh, out_lse, ol_sh, ol_st, pre, p_st, p_sh, plse, pl_sh, pl_st,   \
                             suf, s_st, s_sh, slse, sl_sh, sl_st, tokens, heads, v);                        \
    }
VT_FOR_EACH_FLOAT(VT_MERGE)
