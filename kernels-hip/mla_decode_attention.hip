// MlaDecodeAttention: absorbed MQA over the paged latent cache. Query row (b, s, n) of
// q[B, s_q, N, D] sees keys 0 .. seq_lens[b] - s_q + s + 1 of its sequence; key j is
// cache[block_table[b, j / BS], j % BS, :D] and its value the first Dv elements of it.
// One block per query row (grid-stride), any head count N and any block size (page size 1
// included). A sequence whose length is negative or past its block table, or whose keys
// touch a block id outside 0..NB, leaves its rows unwritten (the CPU reports these as
// errors). Dynamic shared memory: VT_ATTN_SMEM_FLOATS(D, Dv) floats.
#include "attention.h"

template <typename T>
struct paged_rows {
  const T* cache;
  i64 c_s0, c_s1, block_size;
  const int* table;  // block_table row of this sequence
  i64 t_s1;
  __device__ const T* row(i64 j) const {
    return cache + (i64)table[(j / block_size) * t_s1] * c_s0 + (j % block_size) * c_s1;
  }
};

template <typename T>
__device__ void mla_decode_attention(T* out, i64 o_s0, i64 o_s1, i64 o_s2, float* lse, i64 l_s0, i64 l_s1,
                                     i64 l_s2, const T* q, i64 q_s0, i64 q_s1, i64 q_s2, const T* cache,
                                     i64 c_s0, i64 c_s1, i64 num_blocks, i64 block_size,
                                     const int* block_table, i64 bt_s0, i64 bt_s1, i64 max_blocks,
                                     const int* seq_lens, i64 sl_stride, i64 batch, i64 s_q, i64 heads, i64 d,
                                     i64 dv, float scale) {
  extern __shared__ float smem[];
  __shared__ int bad;
  VT_FOR_BLOCKS(row, batch * s_q * heads) {
    const i64 n = row % heads;
    const i64 s = (row / heads) % s_q;
    const i64 b = row / (heads * s_q);
    const i64 len = seq_lens[b * sl_stride];
    if (len < 0 || len > max_blocks * block_size) continue;
    i64 n_keys = len - s_q + s + 1;
    if (n_keys < 0) n_keys = 0;
    const int* table = block_table + b * bt_s0;
    // Every block this query reads must exist; otherwise the row is left unwritten.
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    for (i64 blk = threadIdx.x; blk * block_size < n_keys; blk += blockDim.x) {
      const i64 id = table[blk * bt_s1];
      if (id < 0 || id >= num_blocks) bad = 1;
    }
    __syncthreads();
    const int skip = bad;
    __syncthreads();  // `bad` is reset by the next row
    if (skip) continue;
    const paged_rows<T> rows = {cache, c_s0, c_s1, block_size, table, bt_s1};
    float* l = lse ? lse + b * l_s0 + n * l_s1 + s * l_s2 : (float*)0;
    vt::attend_row(q + b * q_s0 + s * q_s1 + n * q_s2, d, dv, n_keys, scale, rows, rows, smem,
                  out + b * o_s0 + s * o_s1 + n * o_s2, l);
  }
}

#define VT_MLA_DECODE_ATTENTION(NAME, T)                                                                   \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) mla_decode_attention_##NAME(                      \
      T* out, i64 o_s0, i64 o_s1, i64 o_s2, float* lse, i64 l_s0, i64 l_s1, i64 l_s2, const T* q, i64 q_s0,  \
      i64 q_s1, i64 q_s2, const T* cache, i64 c_s0, i64 c_s1, i64 num_blocks, i64 block_size,              \
      const int* block_table, i64 bt_s0, i64 bt_s1, i64 max_blocks, const int* seq_lens, i64 sl_stride,     \
      i64 batch, i64 s_q, i64 heads, i64 d, i64 dv, float scale) {                                         \
    mla_decode_attention<T>(out, o_s0, o_s1, o_s2, lse, l_s0, l_s1, l_s2, q, q_s0, q_s1, q_s2, cache, c_s0, \
                            c_s1, num_blocks, block_size, block_table, bt_s0, bt_s1, max_blocks, seq_lens,  \
                            sl_stride, batch, s_q, heads, d, dv, scale);                                   \
  }
VT_FOR_EACH_FLOAT(VT_MLA_DECODE_ATTENTION)

// The fp8_ds_mla cache (fp8_ds_mla.h): the same kernel with keys and values dequantized on
// load (D = 576 decoded values per row, V = the first Dv of them; the cache's strides are
// in bytes): mla_decode_attention_fp8_{bf16,f16,f32}, named by the query's dtype.
#include "fp8_ds_mla.h"

struct paged_fp8_rows {
  const unsigned char* cache;
  i64 c_s0, c_s1, block_size;
  const int* table;
  i64 t_s1;
  __device__ vt::fp8ds::row_ref row(i64 j) const {
    return {cache + (i64)table[(j / block_size) * t_s1] * c_s0 + (j % block_size) * c_s1};
  }
};

template <typename T>
__device__ void mla_decode_attention_fp8(T* out, i64 o_s0, i64 o_s1, i64 o_s2, float* lse, i64 l_s0, i64 l_s1,
                                         i64 l_s2, const T* q, i64 q_s0, i64 q_s1, i64 q_s2,
                                         const unsigned char* cache, i64 c_s0, i64 c_s1, i64 num_blocks,
                                         i64 block_size, const int* block_table, i64 bt_s0, i64 bt_s1,
                                         i64 max_blocks, const int* seq_lens, i64 sl_stride, i64 batch, i64 s_q,
                                         i64 heads, i64 d, i64 dv, float scale) {
  extern __shared__ float smem[];
  __shared__ int bad;
  VT_FOR_BLOCKS(row, batch * s_q * heads) {
    const i64 n = row % heads;
    const i64 s = (row / heads) % s_q;
    const i64 b = row / (heads * s_q);
    const i64 len = seq_lens[b * sl_stride];
    if (len < 0 || len > max_blocks * block_size) continue;
    i64 n_keys = len - s_q + s + 1;
    if (n_keys < 0) n_keys = 0;
    const int* table = block_table + b * bt_s0;
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    for (i64 blk = threadIdx.x; blk * block_size < n_keys; blk += blockDim.x) {
      const i64 id = table[blk * bt_s1];
      if (id < 0 || id >= num_blocks) bad = 1;
    }
    __syncthreads();
    const int skip = bad;
    __syncthreads();
    if (skip) continue;
    const paged_fp8_rows rows = {cache, c_s0, c_s1, block_size, table, bt_s1};
    float* l = lse ? lse + b * l_s0 + n * l_s1 + s * l_s2 : (float*)0;
    vt::attend_row(q + b * q_s0 + s * q_s1 + n * q_s2, d, dv, n_keys, scale, rows, rows, smem,
                  out + b * o_s0 + s * o_s1 + n * o_s2, l);
  }
}

#define VT_MLA_DECODE_ATTENTION_FP8(NAME, T)                                                               \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) mla_decode_attention_fp8_##NAME(                  \
      T* out, i64 o_s0, i64 o_s1, i64 o_s2, float* lse, i64 l_s0, i64 l_s1, i64 l_s2, const T* q, i64 q_s0,  \
      i64 q_s1, i64 q_s2, const unsigned char* cache, i64 c_s0, i64 c_s1, i64 num_blocks, i64 block_size,  \
      const int* block_table, i64 bt_s0, i64 bt_s1, i64 max_blocks, const int* seq_lens, i64 sl_stride,     \
      i64 batch, i64 s_q, i64 heads, i64 d, i64 dv, float scale) {                                         \
    mla_decode_attention_fp8<T>(out, o_s0, o_s1, o_s2, lse, l_s0, l_s1, l_s2, q, q_s0, q_s1, q_s2, cache,   \
                                c_s0, c_s1, num_blocks, block_size, block_table, bt_s0, bt_s1, max_blocks, \
                                seq_lens, sl_stride, batch, s_q, heads, d, dv, scale);                     \
  }
VT_FOR_EACH_FLOAT(VT_MLA_DECODE_ATTENTION_FP8)
