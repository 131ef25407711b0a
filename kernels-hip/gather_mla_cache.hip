// GatherMlaCache: out[cu[b] + j] = cache[block_table[b, p / BS], p % BS, :] with
// p = seq_starts[b] + j. One block per output row (grid-stride); the row's sequence is
// found by binary search in cu_seq_lens. Rows past cu[B], rows of a negative start, a
// position past the block table or a block id outside 0..NB are skipped (left untouched).
#include "common.h"

template <typename T>
__device__ void gather_mla_cache(T* out, i64 out_s0, i64 out_rows, const T* cache, i64 c_s0, i64 c_s1,
                                 i64 num_blocks, i64 block_size, i64 d, const int* block_table, i64 bt_s0,
                                 i64 bt_s1, i64 max_blocks, const int* cu, i64 cu_stride, i64 batch,
                                 const int* seq_starts, i64 ss_stride) {
  VT_FOR_BLOCKS(row, out_rows) {
    // The last b with cu[b] <= row; cu is nondecreasing (checked on the CPU; re-checked below).
    i64 lo = 0, hi = batch;  // answer in [lo, hi]
    while (lo < hi) {
      const i64 mid = (lo + hi + 1) / 2;
      if ((i64)cu[mid * cu_stride] <= row) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const i64 b = lo;
    if (b >= batch) continue;
    const i64 first = cu[b * cu_stride];
    if (row < first || row >= (i64)cu[(b + 1) * cu_stride]) continue;
    const i64 start = seq_starts ? (i64)seq_starts[b * ss_stride] : 0;
    if (start < 0) continue;
    const i64 p = start + row - first;
    const i64 blk = p / block_size;
    if (blk >= max_blocks) continue;
    const i64 id = block_table[b * bt_s0 + blk * bt_s1];
    if (id < 0 || id >= num_blocks) continue;
    const T* src = cache + id * c_s0 + (p % block_size) * c_s1;
    T* dst = out + row * out_s0;
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) dst[i] = src[i];
  }
}

#define VT_GATHER_MLA_CACHE(NAME, T)                                                                     \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) gather_mla_cache_##NAME(                        \
      T* out, i64 out_s0, i64 out_rows, const T* cache, i64 c_s0, i64 c_s1, i64 num_blocks, i64 block_size, \
      i64 d, const int* block_table, i64 bt_s0, i64 bt_s1, i64 max_blocks, const int* cu, i64 cu_stride,   \
      i64 batch, const int* seq_starts, i64 ss_stride) {                                                 \
    gather_mla_cache<T>(out, out_s0, out_rows, cache, c_s0, c_s1, num_blocks, block_size, d, block_table,  \
                        bt_s0, bt_s1, max_blocks, cu, cu_stride, batch, seq_starts, ss_stride);          \
  }
VT_FOR_EACH_FLOAT(VT_GATHER_MLA_CACHE)

// The fp8_ds_mla cache (fp8_ds_mla.h): the same row lookup, each thread dequantizing
// values of the 576 (e4m3 * scale in f32, rope bf16) and rounding once to the workspace
// dtype: gather_mla_cache_fp8_{bf16,f16,f32} (named by the workspace's dtype; the cache's
// strides are in bytes).
#include "fp8_ds_mla.h"

template <typename T>
__device__ void gather_mla_cache_fp8(T* out, i64 out_s0, i64 out_rows, const unsigned char* cache, i64 c_s0,
                                     i64 c_s1, i64 num_blocks, i64 block_size, const int* block_table,
                                     i64 bt_s0, i64 bt_s1, i64 max_blocks, const int* cu, i64 cu_stride,
                                     i64 batch, const int* seq_starts, i64 ss_stride) {
  VT_FOR_BLOCKS(row, out_rows) {
    i64 lo = 0, hi = batch;  // the last b with cu[b] <= row, in [lo, hi]
    while (lo < hi) {
      const i64 mid = (lo + hi + 1) / 2;
      if ((i64)cu[mid * cu_stride] <= row) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const i64 b = lo;
    if (b >= batch) continue;
    const i64 first = cu[b * cu_stride];
    if (row < first || row >= (i64)cu[(b + 1) * cu_stride]) continue;
    const i64 start = seq_starts ? (i64)seq_starts[b * ss_stride] : 0;
    if (start < 0) continue;
    const i64 p = start + row - first;
    const i64 blk = p / block_size;
    if (blk >= max_blocks) continue;
    const i64 id = block_table[b * bt_s0 + blk * bt_s1];
    if (id < 0 || id >= num_blocks) continue;
    const unsigned char* src = cache + id * c_s0 + (p % block_size) * c_s1;
    T* dst = out + row * out_s0;
    for (i64 i = threadIdx.x; i < vt::fp8ds::DECODED; i += blockDim.x) {
      dst[i] = vt::from_f32<T>(vt::fp8ds::value(src, i));
    }
  }
}

#define VT_GATHER_MLA_CACHE_FP8(NAME, T)                                                                 \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) gather_mla_cache_fp8_##NAME(                    \
      T* out, i64 out_s0, i64 out_rows, const unsigned char* cache, i64 c_s0, i64 c_s1, i64 num_blocks,    \
      i64 block_size, const int* block_table, i64 bt_s0, i64 bt_s1, i64 max_blocks, const int* cu,        \
      i64 cu_stride, i64 batch, const int* seq_starts, i64 ss_stride) {                                  \
    gather_mla_cache_fp8<T>(out, out_s0, out_rows, cache, c_s0, c_s1, num_blocks, block_size, block_table, \
                            bt_s0, bt_s1, max_blocks, cu, cu_stride, batch, seq_starts, ss_stride);      \
  }
VT_FOR_EACH_FLOAT(VT_GATHER_MLA_CACHE_FP8)
