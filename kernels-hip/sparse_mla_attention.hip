// SparseMlaAttention: absorbed MQA attention of each query token over the cache slots its
// indices row lists (DeepSeek-V3.2's sparse MLA). Query row (t, h) of q[T, N, D] attends to
// the slots s of indices[t, 0 .. topk] with 0 <= s < NB * BS (a negative entry or one past
// the cache is skipped; a repeated slot counts twice), key s = cache[s / BS, s % BS, :D],
// value its first Dv elements; out[t, h] = softmax . V, lse[h, t] = ln(sum exp(scores)). A
// row with no valid slot gets out = 0 and lse = -inf.
//
// One block per query row (grid-stride over T x N), the generic form of
// kernels-cuda/sparse_mla_attention.cu: f32 math, the online softmax of attention.h over
// tiles of VT_KEY_TILE listed entries. A tile's entries are first read into shared memory
// and compacted to its valid slots (in list order), then each wave takes whole dot products
// (lanes stride over D, a wave sum: no wave-size assumption), the tile's exponentials go to
// shared memory, and each thread owns accumulator elements, as in attend_row. Dynamic
// shared memory: VT_ATTN_SMEM_FLOATS(D, Dv) floats (q, acc, the tile's scores), as the
// decode kernel's. Written to be right, not fast: the gathered rows are re-read per head.
#include "attention.h"
#include "fp8_ds_mla.h"

// Float cache rows by slot.
template <typename T>
struct slot_rows {
  const T* cache;
  i64 c_s0, c_s1, block_size;
  __device__ const T* row(i64 s) const { return cache + (s / block_size) * c_s0 + (s % block_size) * c_s1; }
};

// fp8_ds_mla cache rows by slot (strides in bytes), dequantized on load.
struct slot_fp8_rows {
  const unsigned char* cache;
  i64 c_s0, c_s1, block_size;
  __device__ vt::fp8ds::row_ref row(i64 s) const {
    return {cache + (s / block_size) * c_s0 + (s % block_size) * c_s1};
  }
};

template <typename T, typename Rows>
__device__ void sparse_mla_attention(T* out, i64 o_s0, i64 o_s1, float* lse, i64 l_s0, i64 l_s1, const T* q,
                                     i64 q_s0, i64 q_s1, const Rows& rows, i64 slots, const int* idx, i64 i_s0,
                                     i64 i_s1, i64 tokens, i64 heads, i64 d, i64 dv, i64 topk, float scale) {
  extern __shared__ float smem[];
  __shared__ i64 slot[VT_KEY_TILE];
  __shared__ int listed[VT_KEY_TILE];
  __shared__ int count;
  float* qs = smem;
  float* acc = smem + d;
  float* p = smem + d + dv;
  const int lane = threadIdx.x % warpSize;
  const int wave = threadIdx.x / warpSize;
  const int waves = (blockDim.x + warpSize - 1) / warpSize;
  VT_FOR_BLOCKS(row, tokens * heads) {
    const i64 t = row / heads;
    const i64 h = row % heads;
    const T* qr = q + t * q_s0 + h * q_s1;
    const int* ir = idx + t * i_s0;
    for (i64 i = threadIdx.x; i < d; i += blockDim.x) qs[i] = vt::to_f32(qr[i]);
    for (i64 i = threadIdx.x; i < dv; i += blockDim.x) acc[i] = 0.0f;
    float m = vt::neg_inf(), l = 0.0f;
    i64 total = 0;  // valid entries so far (every thread holds the same count)
    for (i64 j0 = 0; j0 < topk; j0 += VT_KEY_TILE) {
      const int nl = (int)((topk - j0) < VT_KEY_TILE ? (topk - j0) : VT_KEY_TILE);
      for (int jj = threadIdx.x; jj < nl; jj += blockDim.x) listed[jj] = ir[(j0 + jj) * i_s1];
      __syncthreads();  // also orders the q / acc stores above before their first reads
      if (threadIdx.x == 0) {
        int c = 0;
        for (int jj = 0; jj < nl; ++jj) {
          const i64 s = listed[jj];
          if (s >= 0 && s < slots) slot[c++] = s;
        }
        count = c;
      }
      __syncthreads();
      const int nk = count;
      total += nk;
      if (nk > 0) {
        for (int jj = wave; jj < nk; jj += waves) {
          const auto k = rows.row(slot[jj]);
          float s = 0.0f;
          for (i64 i = lane; i < d; i += warpSize) s += qs[i] * vt::to_f32(k[i]);
          s = vt::wave_sum(s);
          if (lane == 0) p[jj] = s * scale;
        }
        __syncthreads();
        float tile_max = vt::neg_inf();
        for (int jj = 0; jj < nk; ++jj) tile_max = fmaxf(tile_max, p[jj]);
        const float m_new = fmaxf(m, tile_max);
        const float corr = (m == vt::neg_inf()) ? 0.0f : expf(m - m_new);
        __syncthreads();  // every thread has read the raw scores
        for (int jj = threadIdx.x; jj < nk; jj += blockDim.x) p[jj] = expf(p[jj] - m_new);
        __syncthreads();
        float tile_sum = 0.0f;
        for (int jj = 0; jj < nk; ++jj) tile_sum += p[jj];
        l = l * corr + tile_sum;
        m = m_new;
        for (i64 i = threadIdx.x; i < dv; i += blockDim.x) {
          float a = acc[i] * corr;
          for (int jj = 0; jj < nk; ++jj) a += p[jj] * vt::to_f32(rows.row(slot[jj])[i]);
          acc[i] = a;
        }
      }
      __syncthreads();  // the next tile overwrites listed, slot, count and p
    }
    T* orow = out + t * o_s0 + h * o_s1;
    float* lp = lse ? lse + h * l_s0 + t * l_s1 : (float*)0;
    if (total == 0) {
      for (i64 i = threadIdx.x; i < dv; i += blockDim.x) orow[i] = vt::from_f32<T>(0.0f);
      if (lp && threadIdx.x == 0) *lp = vt::neg_inf();
    } else {
      for (i64 i = threadIdx.x; i < dv; i += blockDim.x) orow[i] = vt::from_f32<T>(acc[i] / l);
      if (lp && threadIdx.x == 0) *lp = m + logf(l);
    }
    __syncthreads();  // qs and acc are rewritten by the next row
  }
}

#define VT_SPARSE_MLA_ATTENTION(NAME, T)                                                                    \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) sparse_mla_attention_##NAME(                       \
      T* out, i64 o_s0, i64 o_s1, float* lse, i64 l_s0, i64 l_s1, const T* q, i64 q_s0, i64 q_s1,            \
      const T* cache, i64 c_s0, i64 c_s1, i64 block_size, i64 slots, const int* idx, i64 i_s0, i64 i_s1,     \
      i64 tokens, i64 heads, i64 d, i64 dv, i64 topk, float scale) {                                        \
    const slot_rows<T> rows = {cache, c_s0, c_s1, block_size};                                              \
    sparse_mla_attention<T>(out, o_s0, o_s1, lse, l_s0, l_s1, q, q_s0, q_s1, rows, slots, idx, i_s0, i_s1,   \
                            tokens, heads, d, dv, topk, scale);                                             \
  }
VT_FOR_EACH_FLOAT(VT_SPARSE_MLA_ATTENTION)

// The fp8_ds_mla cache (656-byte rows, strides in bytes; D = 576 decoded values, V their
// first Dv): sparse_mla_attention_fp8_{bf16,f16,f32}, named by the query's dtype. The keys
// are the f32 values fp8_ds_mla.h decodes, not rounded to the query's dtype (the contract).
#define VT_SPARSE_MLA_ATTENTION_FP8(NAME, T)                                                                \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) sparse_mla_attention_fp8_##NAME(                   \
      T* out, i64 o_s0, i64 o_s1, float* lse, i64 l_s0, i64 l_s1, const T* q, i64 q_s0, i64 q_s1,            \
      const unsigned char* cache, i64 c_s0, i64 c_s1, i64 block_size, i64 slots, const int* idx, i64 i_s0,   \
      i64 i_s1, i64 tokens, i64 heads, i64 d, i64 dv, i64 topk, float scale) {                              \
    const slot_fp8_rows rows = {cache, c_s0, c_s1, block_size};                                             \
    sparse_mla_attention<T>(out, o_s0, o_s1, lse, l_s0, l_s1, q, q_s0, q_s1, rows, slots, idx, i_s0, i_s1,   \
                            tokens, heads, d, dv, topk, scale);                                             \
  }
VT_FOR_EACH_FLOAT(VT_SPARSE_MLA_ATTENTION_FP8)
