// IndexerTopK (DeepSeek-V3.2's lightning indexer) in two kernels over a chunk of `rows`
// query tokens t = row0 + r, through a workspace the host allocates per call:
//
// 1. indexer_scores_{bf16,f16,f32}: one block per query row (grid-stride), one thread per
//    visible token j < n(t) = min(positions[t] + 1, MB * BS) of sequence seq_ids[t]:
//    score = scale * sum_h w[t, h] * relu(q[t, h] . k[j]), k[j] read from the paged cache by
//    the block table, products and sums in the CPU reference's order (f32, every operation
//    rounded on its own under -ffp-contract=off), so the scores equal the CPU's bit for bit.
//    Stored as ws[r, j] = key(score): the order-preserving map of the f32 bits to u32
//    (unsigned order = f32 total order, -0 made +0 first, so a NaN score ranks above every
//    number as Rust's total_cmp puts it); key 0 marks a token that cannot be chosen (its
//    block id is outside the cache), and a real score maps to at least 1.
// 2. indexer_select_f32 (dtype-independent; the suffix only names it): one block per row.
//    Every token is the distinct 64-bit item key << 32 | ~j, whose unsigned order is the
//    contract's (score descending, equal scores in increasing position). A radix select, 8
//    bits a pass from the top (histograms in shared memory), finds the m-th largest item,
//    m = min(topk, valid tokens), stopping early once a bin holds exactly the rest; the m
//    items at or above it are collected (any order) into the row's item workspace, sorted
//    descending by a bitonic sort there (in global memory: any topk; the block's barriers
//    order its own global accesses), and written as slots; out[t, m ..] = -1. Exact: the
//    items are distinct, so the selected set and its order are the CPU reference's.
//
// Every index read from memory (sequence id, position, block id) is range-checked: an
// out-of-range sequence or a negative position gives an all -1 row, an out-of-range block id
// a token that is never chosen. Nothing is written outside the workspace rows < rows and
// out. kernels-cuda/indexer_top_k.cu's generic score kernel and its select's tie rule, in
// a simpler form (nothing on AMD hardware can be timed here). No wave-size assumption.
#include "common.h"

typedef unsigned int u32;
typedef unsigned long long u64;

namespace indexer {

__device__ __forceinline__ u32 score_key(float s) {
  const u32 b = __float_as_uint(s);
  const u32 k = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return k < 1u ? 1u : k;
}

__device__ __forceinline__ i64 load_pos(const void* pos, i64 s, int is64, i64 t) {
  return is64 ? ((const long long*)pos)[t * s] : (i64)((const int*)pos)[t * s];
}

// The visible count n of query t (0: a padding row or an out-of-range sequence), and its
// sequence b.
__device__ __forceinline__ i64 visible(const int* seq_ids, i64 sid_s, const void* pos, i64 pos_s, int pos64,
                                       i64 t, i64 nseq, i64 cap, i64* b_out) {
  const i64 b = seq_ids[t * sid_s];
  const i64 p = load_pos(pos, pos_s, pos64, t);
  *b_out = b;
  if (p < 0 || b < 0 || b >= nseq) return 0;
  return p + 1 < cap ? p + 1 : cap;
}

template <typename T>
__device__ __forceinline__ float load_w(const void* w, int wf32, i64 off) {
  return wf32 ? ((const float*)w)[off] : vt::to_f32(((const T*)w)[off]);
}

}  // namespace indexer

template <typename T>
__device__ void indexer_scores(u32* ws, i64 ws_ld, i64 row0, i64 rows, const T* q, i64 q_s0, i64 q_s1,
                               const void* w, i64 w_s0, i64 w_s1, int wf32, const T* cache, i64 c_s0, i64 c_s1,
                               i64 num_blocks, i64 block_size, const int* bt, i64 bt_s0, i64 bt_s1, i64 nseq,
                               const int* seq_ids, i64 sid_s, const void* pos, i64 pos_s, int pos64, i64 cap,
                               i64 heads, i64 di, float scale) {
  VT_FOR_BLOCKS(r, rows) {
    const i64 t = row0 + r;
    i64 b;
    const i64 n = indexer::visible(seq_ids, sid_s, pos, pos_s, pos64, t, nseq, cap, &b);
    const T* qt = q + t * q_s0;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
      // j < n <= cap = MB * BS: the block-table column is in range.
      const i64 id = bt[b * bt_s0 + (j / block_size) * bt_s1];
      u32 key = 0;
      if (id >= 0 && id < num_blocks) {
        const T* k = cache + id * c_s0 + (j % block_size) * c_s1;
        float sum = 0.0f;
        for (i64 h = 0; h < heads; ++h) {
          const T* qh = qt + h * q_s1;
          float dot = 0.0f;
          for (i64 i = 0; i < di; ++i) dot += vt::to_f32(qh[i]) * vt::to_f32(k[i]);
          sum += indexer::load_w<T>(w, wf32, t * w_s0 + h * w_s1) * fmaxf(dot, 0.0f);
        }
        key = indexer::score_key(scale * sum + 0.0f);
      }
      ws[r * ws_ld + j] = key;
    }
  }
}

#define VT_INDEXER_SCORES(NAME, T)                                                                          \
  extern "C" __global__ void __launch_bounds__(VT_BLOCK) indexer_scores_##NAME(                            \
      u32* ws, i64 ws_ld, i64 row0, i64 rows, const T* q, i64 q_s0, i64 q_s1, const void* w, i64 w_s0,     \
      i64 w_s1, int wf32, const T* cache, i64 c_s0, i64 c_s1, i64 num_blocks, i64 block_size, const int* bt, \
      i64 bt_s0, i64 bt_s1, i64 nseq, const int* seq_ids, i64 sid_s, const void* pos, i64 pos_s, int pos64,  \
      i64 cap, i64 heads, i64 di, float scale) {                                                           \
    indexer_scores<T>(ws, ws_ld, row0, rows, q, q_s0, q_s1, w, w_s0, w_s1, wf32, cache, c_s0, c_s1,          \
                      num_blocks, block_size, bt, bt_s0, bt_s1, nseq, seq_ids, sid_s, pos, pos_s, pos64, cap, \
                      heads, di, scale);                                                                   \
  }
VT_FOR_EACH_FLOAT(VT_INDEXER_SCORES)

namespace indexer {

// Token j's item: key << 32 | ~j (0 for key 0, so an unchoosable token is below every
// valid one). j < 2^31 (the host checks MB * BS).
__device__ __forceinline__ u64 item(const u32* keys, i64 j) {
  const u32 k = keys[j];
  return k == 0u ? 0ull : (((u64)k << 32) | (u64)(~(u32)j));
}

// Bitonic sort of items[0 .. m2) descending (m2 a power of two; every thread of the block
// calls it). Blocks of the network with (i & k) == 0 sort descending, the others ascending.
__device__ void sort_desc(u64* items, i64 m2) {
  for (i64 k = 2; k <= m2; k <<= 1) {
    for (i64 jj = k >> 1; jj > 0; jj >>= 1) {
      for (i64 i = threadIdx.x; i < m2; i += blockDim.x) {
        const i64 p = i ^ jj;
        if (p > i) {
          const u64 x = items[i], y = items[p];
          const bool desc = (i & k) == 0;
          if (desc ? x < y : x > y) {
            items[i] = y;
            items[p] = x;
          }
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace indexer

extern "C" __global__ void __launch_bounds__(VT_BLOCK) indexer_select_f32(
    int* out, i64 o_s0, i64 o_s1, i64 topk, const u32* ws, i64 ws_ld, u64* items, i64 items_ld, i64 row0,
    i64 rows, const int* bt, i64 bt_s0, i64 bt_s1, i64 nseq, i64 block_size, const int* seq_ids, i64 sid_s,
    const void* pos, i64 pos_s, int pos64, i64 cap) {
  __shared__ u32 hist[256];
  __shared__ u64 prefix;
  __shared__ u64 kth;  // rank still wanted among the items matching `prefix`
  __shared__ int done;
  __shared__ u32 counter;
  VT_FOR_BLOCKS(r, rows) {
    const i64 t = row0 + r;
    i64 b;
    const i64 n = indexer::visible(seq_ids, sid_s, pos, pos_s, pos64, t, nseq, cap, &b);
    const u32* keys = ws + r * ws_ld;
    u64* it = items + r * items_ld;
    int* orow = out + t * o_s0;
    // Valid tokens.
    if (threadIdx.x == 0) counter = 0;
    __syncthreads();
    {
      u32 c = 0;
      for (i64 j = threadIdx.x; j < n; j += blockDim.x) c += keys[j] != 0u ? 1u : 0u;
      if (c) atomicAdd(&counter, c);
    }
    __syncthreads();
    const i64 valid = (i64)counter;
    const i64 m = valid < topk ? valid : topk;
    __syncthreads();  // every thread has read counter before it is reset below
    // The smallest item taken: every valid one (key >= 1) when no more than topk exist.
    u64 threshold = 1ull << 32;
    if (valid > m) {
      if (threadIdx.x == 0) {
        prefix = 0;
        kth = (u64)m;
        done = 0;
      }
      u64 mask = 0;
      for (int d = 7; d >= 0; --d) {
        const int sh = d * 8;
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        const u64 pre = prefix;
        for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
          const u64 x = indexer::item(keys, j);
          if (x != 0ull && (x & mask) == pre) atomicAdd(&hist[(x >> sh) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
          // Digits from the top: the one whose bin holds rank kth. Exactly the rest in it:
          // every item at or above prefix | digit << sh (lower bits 0) is taken.
          u64 want = kth, above = 0;
          for (int dg = 255; dg >= 0; --dg) {
            const u64 c = hist[dg];
            if (above + c >= want) {
              prefix = pre | ((u64)dg << sh);
              kth = want - above;
              done = (c == want - above) ? 1 : 0;
              break;
            }
            above += c;
          }
        }
        __syncthreads();
        if (done) break;
        mask |= 255ull << sh;
      }
      threshold = prefix;
      __syncthreads();  // everyone has read prefix before the next row resets it
    }
    // Collect the m items >= threshold (distinct items: exactly m), in any order.
    if (threadIdx.x == 0) counter = 0;
    __syncthreads();
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
      const u64 x = indexer::item(keys, j);
      if (x != 0ull && x >= threshold) {
        const i64 at = (i64)atomicAdd(&counter, 1u);
        if (at < m) it[at] = x;
      }
    }
    i64 m2 = 1;
    while (m2 < m) m2 <<= 1;
    __syncthreads();
    for (i64 i = m + threadIdx.x; i < m2; i += blockDim.x) it[i] = 0ull;  // sinks below every item
    __syncthreads();
    if (m > 1) indexer::sort_desc(it, m2);
    for (i64 i = threadIdx.x; i < topk; i += blockDim.x) {
      int slot = -1;
      if (i < m) {
        const i64 j = (i64)(~(u32)(it[i] & 0xffffffffull));
        const i64 id = bt[b * bt_s0 + (j / block_size) * bt_s1];
        slot = (int)(id * block_size + j % block_size);
      }
      orow[i * o_s1] = slot;
    }
    __syncthreads();  // the next row reuses counter, hist and the workspace row
  }
}
