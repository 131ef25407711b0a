// ConcatAndCacheMla: cache[s / BS, s % BS, :] = [kv_c[t] | k_pe[t]] for s = slots[t]. One
// block per token (grid-stride); a slot < 0 (padding) or >= NB * BS is skipped.
#include "common.cuh"

template <typename T>
__device__ void concat_and_cache_mla(const T* kv_c, i64 kvc_s, const T* k_pe, i64 kpe_s, T* cache, i64 c_sb, i64 c_sr,
                                     const i64* slots, i64 slot_s, i64 tokens, int l, int r, i64 nb, i64 bs) {
    for (i64 t = blockIdx.x; t < tokens; t += gridDim.x) {
        const i64 s = slots[t * slot_s];
        if (s < 0 || s / bs >= nb) continue;
        T* row = cache + (s / bs) * c_sb + (s % bs) * c_sr;
        const T* a = kv_c + t * kvc_s;
        const T* b = k_pe + t * kpe_s;
        for (int i = threadIdx.x; i < l + r; i += blockDim.x) row[i] = i < l ? a[i] : b[i - l];
    }
}

#define VT_CACHE(S, T)                                                                                     \
    extern "C" __global__ void concat_and_cache_mla_##S(const T* kv_c, i64 kvc_s, const T* k_pe, i64 kpe_s, \
                                                        T* cache, i64 c_sb, i64 c_sr, const i64* slots,    \
                                                        i64 slot_s, i64 tokens, int l, int r, i64 nb,      \
                                                        i64 bs) {                                          \
        concat_and_cache_mla<T>(kv_c, kvc_s, k_pe, kpe_s, cache, c_sb, c_sr, slots, slot_s, tokens, l, r,  \
                                nb, bs);                                                                   \
    }
VT_FOR_EACH_FLOAT(VT_CACHE)
