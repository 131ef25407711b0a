// ConcatMlaNopeRope: out[t, n, :] = [nope[t, n, :] | rope[t, n or 0, :]]. One block per
// (t, n) row (grid-stride); a broadcast rope is passed with head stride 0.
#include "common.cuh"

template <typename T>
__device__ void concat_mla_nope_rope(T* out, i64 o_st, i64 o_sh, const T* nope, i64 n_st, i64 n_sh, const T* rope,
                                     i64 r_st, i64 r_sh, i64 tokens, int heads, int p, int r) {
    const i64 rows = tokens * heads;
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const i64 t = row / heads, h = row % heads;
        T* o = out + t * o_st + h * o_sh;
        const T* a = nope + t * n_st + h * n_sh;
        const T* b = rope + t * r_st + h * r_sh;
        for (int i = threadIdx.x; i < p + r; i += blockDim.x) o[i] = i < p ? a[i] : b[i - p];
    }
}

#define VT_CONCAT(S, T)                                                                                    \
    extern "C" __global__ void concat_mla_nope_rope_##S(T* out, i64 o_st, i64 o_sh, const T* nope,         \
                                                        i64 n_st, i64 n_sh, const T* rope, i64 r_st,       \
                                                        i64 r_sh, i64 tokens, int heads, int p, int r) {   \
        concat_mla_nope_rope<T>(out, o_st, o_sh, nope, n_st, n_sh, rope, r_st, r_sh, tokens, heads, p, r); \
    }
VT_FOR_EACH_FLOAT(VT_CONCAT)
