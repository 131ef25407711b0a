// MlaDecodeAttention: reading the keys of one cache row, for the generic kernel: a float
// cache's elements, or an fp8_ds_mla cache's values dequantized on load (the 656-byte row of
// fp8_ds_mla.cuh). Part of mla_decode_attention.cu.
#pragma once

#include "fp8_ds_mla.cuh"
#include "mla_decode_attention/params.cuh"

namespace mla {

// Key value i of a cache row: a T element, or (FP8) value i of an fp8_ds_mla row
// dequantized on load (fp8_ds_mla.cuh), the same f32 the CPU reference attends over.
template <typename T, bool FP8> struct KeyRow;
template <typename T> struct KeyRow<T, false> {
    const T* k;
    __device__ KeyRow(const void* cache, i64 off) : k((const T*)cache + off) {}
    __device__ __forceinline__ float operator[](int i) const { return vt::to_f32(k[i]); }
};
template <typename T> struct KeyRow<T, true> {
    const unsigned char* k;
    __device__ KeyRow(const void* cache, i64 off) : k((const unsigned char*)cache + off) {}
    __device__ __forceinline__ float operator[](int i) const { return vt::fp8ds::value(k, i); }
};

}  // namespace mla
