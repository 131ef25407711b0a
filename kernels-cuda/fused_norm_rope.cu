// FusedNormRope: for each row t of kv [T, L+R], latent_out[t] = RmsNorm(kv[t, :L], w) and
// rope_out[t] = RoPE(kv[t, L:], positions[t]) in one launch. Uses the same device
// functions and block size as rms_norm.cu and rope_from_cache.cu, so the result is
// bit-identical to RmsNorm followed by RopeFromCache on a copy of the rope part (a token
// whose position is outside the cache gets the unrotated copy).
#include "norm_rope.cuh"

template <typename T>
__device__ void fused_norm_rope(T* latent, i64 lat_s, T* rope, i64 rope_s, const T* kv, i64 kv_s, const T* w, int l,
                                int r, const i64* pos, i64 pos_s, const float* cache, i64 max_pos, i64 tokens,
                                float eps, int neox) {
    for (i64 t = blockIdx.x; t < tokens; t += gridDim.x) {
        const T* row = kv + t * kv_s;
        vt::rms_norm_row<T>(latent + t * lat_s, row, w, l, eps);
        const T* in = row + l;
        T* out = rope + t * rope_s;
        const i64 p = pos[t * pos_s];
        if (p < 0 || p >= max_pos) {
            for (int i = threadIdx.x; i < r; i += blockDim.x) out[i] = in[i];
        } else {
            const float* cs = cache + p * r;
            for (int i = threadIdx.x; i < r / 2; i += blockDim.x) vt::rope_pair<T>(out, in, cs, r, i, neox != 0);
        }
    }
}

#define VT_FUSED(S, T)                                                                                     \
    extern "C" __global__ void __launch_bounds__(vt::NORM_THREADS)                                         \
        fused_norm_rope_##S(T* latent, i64 lat_s, T* rope, i64 rope_s, const T* kv, i64 kv_s, const T* w,  \
                            int l, int r, const i64* pos, i64 pos_s, const float* cache, i64 max_pos,      \
                            i64 tokens, float eps, int neox) {                                             \
        fused_norm_rope<T>(latent, lat_s, rope, rope_s, kv, kv_s, w, l, r, pos, pos_s, cache, max_pos,     \
                           tokens, eps, neox);                                                             \
    }
VT_FOR_EACH_FLOAT(VT_FUSED)
