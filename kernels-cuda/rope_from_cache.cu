// RopeFromCache: rotates q [T, Hq, R] (and k [T, Hk, R]) in place from the cos/sin cache
// [max_pos, R] (f32, row = [cos(R/2) | sin(R/2)]) at positions[t]. One block per token
// (grid-stride); a token whose position is outside the cache is left unrotated.
#include "norm_rope.cuh"

template <typename T>
__device__ __forceinline__ void rope_heads(T* x, i64 s_head, int heads, const float* cs, int r, bool neox) {
    const int half = r / 2;
    for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
        T* row = x + (i64)(j / half) * s_head;
        vt::rope_pair<T>(row, row, cs, r, j % half, neox);
    }
}

template <typename T>
__device__ void rope_from_cache(T* q, i64 q_st, i64 q_sh, int hq, T* k, i64 k_st, i64 k_sh, int hk, const i64* pos,
                                i64 pos_s, const float* cache, i64 max_pos, i64 tokens, int r, int neox) {
    for (i64 t = blockIdx.x; t < tokens; t += gridDim.x) {
        const i64 p = pos[t * pos_s];
        if (p < 0 || p >= max_pos) continue;
        const float* cs = cache + p * r;
        rope_heads<T>(q + t * q_st, q_sh, hq, cs, r, neox != 0);
        if (k != nullptr) rope_heads<T>(k + t * k_st, k_sh, hk, cs, r, neox != 0);
    }
}

#define VT_ROPE(S, T)                                                                                     \
    extern "C" __global__ void rope_from_cache_##S(T* q, i64 q_st, i64 q_sh, int hq, T* k, i64 k_st,     \
                                                   i64 k_sh, int hk, const i64* pos, i64 pos_s,           \
                                                   const float* cache, i64 max_pos, i64 tokens, int r,    \
                                                   int neox) {                                            \
        rope_from_cache<T>(q, q_st, q_sh, hq, k, k_st, k_sh, hk, pos, pos_s, cache, max_pos, tokens, r,   \
                           neox);                                                                         \
    }
VT_FOR_EACH_FLOAT(VT_ROPE)
