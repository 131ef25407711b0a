// CacheIndexerKeys: cache[s / BS, s % BS, :] = k[t] for s = slots[t] (DeepSeek-V3.2's
// indexer key cache). One block per token (grid-stride), threads over the Di values; a slot
// < 0 (padding) or >= NB * BS is skipped, so nothing is written outside the cache. Two
// tokens with one slot race (the contract leaves that unspecified on GPUs).
#include "common.cuh"

template <typename T>
__device__ void cache_indexer_keys(const T* k, i64 k_s, T* cache, i64 c_sb, i64 c_sr, const i64* slots,
                                   i64 slot_s, i64 tokens, int di, i64 nb, i64 bs) {
    for (i64 t = blockIdx.x; t < tokens; t += gridDim.x) {
        const i64 s = slots[t * slot_s];
        if (s < 0 || s / bs >= nb) continue;
        T* row = cache + (s / bs) * c_sb + (s % bs) * c_sr;
        const T* src = k + t * k_s;
        for (int i = threadIdx.x; i < di; i += blockDim.x) row[i] = src[i];
    }
}

#define VT_INDEXER_CACHE(S, T)                                                                        \
    extern "C" __global__ void cache_indexer_keys_##S(const T* k, i64 k_s, T* cache, i64 c_sb, i64 c_sr, \
                                                      const i64* slots, i64 slot_s, i64 tokens, int di,  \
                                                      i64 nb, i64 bs) {                                  \
        cache_indexer_keys<T>(k, k_s, cache, c_sb, c_sr, slots, slot_s, tokens, di, nb, bs);             \
    }
VT_FOR_EACH_FLOAT(VT_INDEXER_CACHE)
