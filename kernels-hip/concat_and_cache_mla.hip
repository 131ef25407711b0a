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

// The fp8_ds_mla cache (fp8_ds_mla.h): one block per token (grid-stride). The token's 512
// latent values go to shared memory as f32; thread g < 4 takes group g's amax (a max is
// exact in any order), scale = amax / 448; then every thread encodes codes
// e4m3(v / scale), and threads 0..63 store the rope values as bf16, byte by byte (a row
// may start at any byte). No wave-size assumption. Instantiated per kv dtype:
// concat_and_cache_mla_fp8_{bf16,f16,f32}; the cache's strides are in bytes.
#include "fp8_ds_mla.h"

template <typename T>
__device__ void concat_and_cache_fp8(unsigned char* cache, i64 c_s0, i64 c_s1, i64 num_blocks, i64 block_size,
                                     const T* kv_c, i64 kv_s0, const T* k_pe, i64 pe_s0, const i64* slots,
                                     i64 slot_stride, i64 tokens) {
  namespace f = vt::fp8ds;
  __shared__ float vals[f::LATENT];
  __shared__ float scales[f::GROUPS];
  VT_FOR_BLOCKS(t, tokens) {
    const i64 s = slots[t * slot_stride];
    if (s < 0 || s >= num_blocks * block_size) continue;
    unsigned char* row = cache + (s / block_size) * c_s0 + (s % block_size) * c_s1;
    const T* src_c = kv_c + t * kv_s0;
    for (int i = threadIdx.x; i < f::LATENT; i += blockDim.x) vals[i] = vt::to_f32(src_c[i]);
    __syncthreads();
    if (threadIdx.x < f::GROUPS) {
      float amax = 0.0f;
      for (int i = 0; i < f::GROUP; ++i) amax = fmaxf(amax, fabsf(vals[threadIdx.x * f::GROUP + i]));
      const float scale = amax / 448.0f;
      scales[threadIdx.x] = scale;
      f::store_f32(row + f::SCALE_OFFSET + 4 * threadIdx.x, scale);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < f::LATENT; i += blockDim.x) {
      const float scale = scales[i / f::GROUP];
      row[i] = scale == 0.0f ? (unsigned char)0 : f::f32_to_e4m3(vals[i] / scale);
    }
    for (int i = threadIdx.x; i < f::ROPE; i += blockDim.x) {
      const unsigned short bits = vt::from_f32<bf16>(vt::to_f32(k_pe[t * pe_s0 + i])).bits;
      row[f::ROPE_OFFSET + 2 * i] = (unsigned char)(bits & 0xffu);
      row[f::ROPE_OFFSET + 2 * i + 1] = (unsigned char)(bits >> 8);
    }
    __syncthreads();  // `vals` and `scales` are rewritten for the next token
  }
}

#define VT_CONCAT_AND_CACHE_MLA_FP8(NAME, T)                                                            \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) concat_and_cache_mla_fp8_##NAME(               \
      unsigned char* cache, i64 c_s0, i64 c_s1, i64 num_blocks, i64 block_size, const T* kv_c, i64 kv_s0, \
      const T* k_pe, i64 pe_s0, const i64* slots, i64 slot_stride, i64 tokens) {                       \
    concat_and_cache_fp8<T>(cache, c_s0, c_s1, num_blocks, block_size, kv_c, kv_s0, k_pe, pe_s0, slots,  \
                            slot_stride, tokens);                                                      \
  }
VT_FOR_EACH_FLOAT(VT_CONCAT_AND_CACHE_MLA_FP8)
