// FusedNormRope: for each row t of kv [T, L+R], latent_out[t] = RmsNorm(kv[t, :L], w) and
// rope_out[t] = RoPE(kv[t, L:], positions[t]) in one launch. Uses the same device
// functions and block size as rms_norm.cu and rope_from_cache.cu, so the result is
// bit-identical to RmsNorm followed by RopeFromCache on a copy of the rope part (a token
// whose position is outside the cache gets the unrotated copy).
//
// Optional, in the same launch (the MLA block's VT_FUSE_DECODE_QUERY / VT_FUSE_CACHE_WRITE):
// - the query: for t < q_tokens, q_out[t, h] = RoPE(q_in[t, h]) for q_heads heads (q_out is
//   q_in, in place, or a disjoint view: the decode attention's query); rope_pair as in
//   rope_from_cache.cu, so the same bits; an out-of-range position copies the input. Done by
//   the blocks after the kv rows' first kv_blocks (q_chunk heads of one token each).
// - the cache write: the values stored to latent_out / rope_out are also stored to
//   cache[s / bs, s % bs, :] for s = slots[t] (skipped when s < 0 or s / bs >= nb), as
//   ConcatAndCacheMla would copy them. kvc == nullptr: no cache write.
#include "norm_rope.cuh"

template <typename T>
__device__ void fused_norm_rope(T* latent, i64 lat_s, T* rope, i64 rope_s, const T* kv, i64 kv_s, const T* w, int l,
                                int r, const i64* pos, i64 pos_s, const float* cache, i64 max_pos, i64 tokens,
                                float eps, int neox, const T* q_in, i64 qi_st, i64 qi_sh, T* q_out, i64 qo_st,
                                i64 qo_sh, int q_heads, i64 q_tokens, int q_chunk, i64 q_blocks, i64 kv_blocks,
                                T* kvc, i64 c_sb, i64 c_sr, const i64* slots, i64 slot_s, i64 nb, i64 bs) {
    vt::grid_dep_launch();  // a dependent GEMM after this (VT_PDL) may prefetch its weights
    const int half = r / 2;
    if (blockIdx.x >= kv_blocks) {
        // The query: the blocks past the kv rows' take items (token, chunk of q_chunk heads),
        // q_blocks chunks per token, grid-stride; one pair per thread at q_chunk = 256 / (R/2),
        // so a decode step of few tokens spreads over N / q_chunk blocks instead of one.
        const i64 items = q_tokens * q_blocks, stride = (i64)gridDim.x - kv_blocks;
        for (i64 b = (i64)blockIdx.x - kv_blocks; b < items; b += stride) {
            const i64 t = b / q_blocks;
            const int h0 = (int)(b % q_blocks) * q_chunk;
            const int hn = min(q_chunk, q_heads - h0);
            const i64 p = pos[t * pos_s];
            const bool rotate = p >= 0 && p < max_pos;
            const float* cs = cache + (rotate ? p : 0) * r;
            const T* qi = q_in + t * qi_st;
            T* qo = q_out + t * qo_st;
            if (rotate) {
                for (int j = threadIdx.x; j < hn * half; j += blockDim.x) {
                    const i64 h = h0 + j / half;
                    vt::rope_pair<T>(qo + h * qo_sh, qi + h * qi_sh, cs, r, j % half, neox != 0);
                }
            } else if (qo != qi) {
                for (int j = threadIdx.x; j < hn * r; j += blockDim.x) {
                    const i64 h = h0 + j / r;
                    qo[h * qo_sh + j % r] = qi[h * qi_sh + j % r];
                }
            }
        }
        return;
    }
    // The kv rows: blocks 0..kv_blocks, one token at a time.
    for (i64 t = blockIdx.x; t < tokens; t += kv_blocks) {
        // The position and the slot first, and the position's cos / sin row into L1 while the
        // norm runs (at decode's few tokens each would otherwise be a DRAM round trip of its
        // own after the norm).
        const i64 p = pos[t * pos_s];
        const i64 s = kvc != nullptr ? slots[t * slot_s] : -1;
        if (p >= 0 && p < max_pos && threadIdx.x * 32 < r)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(cache + p * r + threadIdx.x * 32));
        T* crow = nullptr;
        if (s >= 0 && s / bs < nb) crow = kvc + (s / bs) * c_sb + (s % bs) * c_sr;
        const T* row = kv + t * kv_s;
        vt::rms_norm_row<T>(latent + t * lat_s, row, w, l, eps, crow);
        const T* in = row + l;
        T* out = rope + t * rope_s;
        T* out2 = crow != nullptr ? crow + l : nullptr;
        if (p < 0 || p >= max_pos) {
            for (int i = threadIdx.x; i < r; i += blockDim.x) {
                out[i] = in[i];
                if (out2 != nullptr) out2[i] = in[i];
            }
        } else {
            const float* cs = cache + p * r;
            for (int i = threadIdx.x; i < half; i += blockDim.x) vt::rope_pair<T>(out, in, cs, r, i, neox != 0, out2);
        }
    }
}

#define VT_FUSED(S, T)                                                                                        \
    extern "C" __global__ void __launch_bounds__(vt::NORM_THREADS)                                            \
        fused_norm_rope_##S(T* latent, i64 lat_s, T* rope, i64 rope_s, const T* kv, i64 kv_s, const T* w,     \
                            int l, int r, const i64* pos, i64 pos_s, const float* cache, i64 max_pos,         \
                            i64 tokens, float eps, int neox, const T* q_in, i64 qi_st, i64 qi_sh, T* q_out,   \
                            i64 qo_st, i64 qo_sh, int q_heads, i64 q_tokens, int q_chunk, i64 q_blocks,       \
                            i64 kv_blocks, T* kvc, i64 c_sb, i64 c_sr, const i64* slots, i64 slot_s, i64 nb,  \
                            i64 bs) {                                                                         \
        fused_norm_rope<T>(latent, lat_s, rope, rope_s, kv, kv_s, w, l, r, pos, pos_s, cache, max_pos, tokens, \
                           eps, neox, q_in, qi_st, qi_sh, q_out, qo_st, qo_sh, q_heads, q_tokens, q_chunk,    \
                           q_blocks, kv_blocks, kvc, c_sb, c_sr, slots, slot_s, nb, bs);                      \
    }
VT_FOR_EACH_FLOAT(VT_FUSED)
