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

// The fp8_ds_mla cache (fp8_ds_mla.cuh): one block of 128 threads per token (grid-stride),
// warp g quantizes latent group g (4 values per lane): amax by warp_max (exact, any order),
// scale = amax / 448, codes e4m3(v / scale); threads 0..63 store the rope values as bf16.
// The kernel is instantiated per kv dtype: concat_and_cache_mla_fp8_{bf16,f16,f32}.
#include "fp8_ds_mla.cuh"

template <typename T>
__device__ void concat_and_cache_fp8(const T* kv_c, i64 kvc_s, const T* k_pe, i64 kpe_s, unsigned char* cache,
                                     i64 c_sb, i64 c_sr, const i64* slots, i64 slot_s, i64 tokens, i64 nb,
                                     i64 bs) {
    namespace f = vt::fp8ds;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (i64 t = blockIdx.x; t < tokens; t += gridDim.x) {
        const i64 s = slots[t * slot_s];
        if (s < 0 || s / bs >= nb) continue;
        unsigned char* row = cache + (s / bs) * c_sb + (s % bs) * c_sr;
        const T* a = kv_c + t * kvc_s + warp * f::GROUP;
        float v[f::GROUP / 32];
        float amax = 0.0f;
#pragma unroll
        for (int k = 0; k < f::GROUP / 32; ++k) {
            v[k] = vt::to_f32(a[lane + 32 * k]);
            amax = fmaxf(amax, fabsf(v[k]));
        }
        amax = vt::warp_max(amax);
        const float scale = __fdiv_rn(amax, 448.0f);
#pragma unroll
        for (int k = 0; k < f::GROUP / 32; ++k) {
            const int i = warp * f::GROUP + lane + 32 * k;
            row[i] = scale == 0.0f ? (unsigned char)0 : f::f32_to_e4m3(__fdiv_rn(v[k], scale));
        }
        if (lane == 0) f::store_f32(row + f::SCALE_OFFSET + 4 * warp, scale);
        if (threadIdx.x < f::ROPE) {
            // bf16 bits by integer round-to-nearest-even (NaN kept quiet), stored byte by byte:
            // the row may start at any byte.
            const unsigned u = __float_as_uint(vt::to_f32(k_pe[t * kpe_s + threadIdx.x]));
            const unsigned bits =
                (u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            volatile unsigned char* dst = row + f::ROPE_OFFSET + 2 * threadIdx.x;
            dst[0] = (unsigned char)(bits & 0xffu);
            dst[1] = (unsigned char)((bits >> 8) & 0xffu);
        }
    }
}

#define VT_CACHE_FP8(S, T)                                                                                  \
    extern "C" __global__ void __launch_bounds__(128)                                                       \
        concat_and_cache_mla_fp8_##S(const T* kv_c, i64 kvc_s, const T* k_pe, i64 kpe_s, unsigned char* cache, \
                                     i64 c_sb, i64 c_sr, const i64* slots, i64 slot_s, i64 tokens, i64 nb,  \
                                     i64 bs) {                                                              \
        concat_and_cache_fp8<T>(kv_c, kvc_s, k_pe, kpe_s, cache, c_sb, c_sr, slots, slot_s, tokens, nb, bs); \
    }
VT_FOR_EACH_FLOAT(VT_CACHE_FP8)
