// ConcatAndCacheMla: cache[s / BS, s % BS, :] = [kv_c[t] | k_pe[t]] for s = slot_mapping[t].
// One block per token (grid-stride). A slot < 0 (padding) or >= NB*BS is skipped, so a bad
// slot never writes outside the cache.
#include "common.h"

template <typename T>
__device__ void concat_and_cache_mla(T* cache, i64 c_s0, i64 c_s1, i64 num_blocks, i64 block_size,
                                     const T* kv_c, i64 kv_s0, const T* k_pe, i64 pe_s0, const i64* slots,
                                     i64 slot_stride, i64 tokens, i64 l, i64 r) {
  VT_FOR_BLOCKS(t, tokens) {
    const i64 s = slots[t * slot_stride];
    if (s < 0 || s >= num_blocks * block_size) continue;
    T* dst = cache + (s / block_size) * c_s0 + (s % block_size) * c_s1;
    const T* src_c = kv_c + t * kv_s0;
    const T* src_pe = k_pe + t * pe_s0;
    for (i64 i = threadIdx.x; i < l; i += blockDim.x) dst[i] = src_c[i];
    for (i64 i = threadIdx.x; i < r; i += blockDim.x) dst[l + i] = src_pe[i];
  }
}

#define VT_CONCAT_AND_CACHE_MLA(NAME, T)                                                                \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) concat_and_cache_mla_##NAME(                   \
      T* cache, i64 c_s0, i64 c_s1, i64 num_blocks, i64 block_size, const T* kv_c, i64 kv_s0, const T* k_pe, \
      i64 pe_s0, const i64* slots, i64 slot_stride, i64 tokens, i64 l, i64 r) {                         \
    concat_and_cache_mla<T>(cache, c_s0, c_s1, num_blocks, block_size, kv_c, kv_s0, k_pe, pe_s0, slots,   \
                            slot_stride, tokens, l, r);                                                 \
  }
VT_FOR_EACH_FLOAT(VT_CONCAT_AND_CACHE_MLA)
