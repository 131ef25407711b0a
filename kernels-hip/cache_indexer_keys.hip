// CacheIndexerKeys: cache[s / BS, s % BS, :] = k[t] for s = slot_mapping[t] (DeepSeek-V3.2's
// indexer key cache). One block per token (grid-stride), threads over the Di values. A slot
// < 0 (padding) or >= NB * BS is skipped, so a bad slot never writes outside the cache; two
// tokens with one slot race (the contract leaves that unspecified on GPUs).
// kernels-cuda/cache_indexer_keys.cu's HIP twin.
#include "common.h"

template <typename T>
__device__ void cache_indexer_keys(T* cache, i64 c_s0, i64 c_s1, i64 num_blocks, i64 block_size, const T* k,
                                   i64 k_s0, const i64* slots, i64 slot_stride, i64 tokens, i64 di) {
  VT_FOR_BLOCKS(t, tokens) {
    const i64 s = slots[t * slot_stride];
    if (s < 0 || s / block_size >= num_blocks) continue;
    T* dst = cache + (s / block_size) * c_s0 + (s % block_size) * c_s1;
    const T* src = k + t * k_s0;
    for (i64 i = threadIdx.x; i < di; i += blockDim.x) dst[i] = src[i];
  }
}

#define VT_CACHE_INDEXER_KEYS(NAME, T)                                                                  \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) cache_indexer_keys_##NAME(                     \
      T* cache, i64 c_s0, i64 c_s1, i64 num_blocks, i64 block_size, const T* k, i64 k_s0, const i64* slots, \
      i64 slot_stride, i64 tokens, i64 di) {                                                            \
    cache_indexer_keys<T>(cache, c_s0, c_s1, num_blocks, block_size, k, k_s0, slots, slot_stride, tokens,  \
                          di);                                                                          \
  }
VT_FOR_EACH_FLOAT(VT_CACHE_INDEXER_KEYS)
