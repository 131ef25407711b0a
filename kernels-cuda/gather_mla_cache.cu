// GatherMlaCache: out[cu[b] + j] = cache[block_table[b, p / BS], p % BS, :] with
// p = seq_starts[b] + j. The grid covers every workspace row; a row's sequence is found by
// binary search in cu_seq_lens, so no length is read back on the host. Rows past cu[B],
// and rows whose start, block index or block id is out of range, are left untouched.
//
// Two kernels:
// - gather_mla_cache_v16: the fast path for rows that split into 16-byte vectors (D a
//   multiple of 16 bytes, row and block strides whole vectors, 16-byte aligned bases; the
//   host checks). Pointers and strides arrive in 16-byte units: one byte copy for every
//   dtype. One warp per row (a part of a warp for rows under 32 vectors): every lane of
//   the row does its lookup (same addresses, one broadcast load each), then issues up to
//   U independent 16-byte loads before storing.
//   Row and position math is 32-bit unsigned (the host checks rows < 2^31, so
//   p = start + j < 2^32); block and row offsets into the cache are 64-bit.
// - gather_mla_cache: the scalar fallback, one block per row, one element per thread.
#include "common.cuh"

namespace {

// U: 16-byte loads in flight per lane per pass. 3 covers a V3 row (72 vectors) in one pass
// of a warp and, with 8 blocks of 256 threads per SM (32 registers, no spills), lets a
// T = 8192 gather run in one wave on 132 SMs.
constexpr int kLoadsPerLane = 3;

__device__ void gather_v16(uint4* __restrict__ out, i64 o_s, unsigned rows, const uint4* __restrict__ cache,
                           i64 c_sb, i64 c_sr, unsigned nb, unsigned bs, int dv, const int* __restrict__ bt,
                           i64 bt_sb, i64 bt_sc, unsigned mb, const int* __restrict__ cu, i64 cu_s, int nseq,
                           const int* __restrict__ starts, i64 st_s, int lpr_log2) {
    constexpr int U = kLoadsPerLane;
    if (nseq <= 0) return;
    // lpr = 2^lpr_log2 lanes per row (32 for wide rows; fewer for narrow ones, so a warp
    // copies several rows at once instead of idling lanes).
    const unsigned lpr = 1u << lpr_log2;
    const unsigned lane = threadIdx.x & (lpr - 1u), rpb = blockDim.x >> lpr_log2;
    const unsigned step = gridDim.x * rpb;
    for (unsigned r = blockIdx.x * rpb + (threadIdx.x >> lpr_log2); r < rows; r += step) {
        // The last sequence b with cu[b] <= r (empty sequences before it are skipped); a
        // row before cu[0] lands on b = 0 and fails the range test below.
        int lo = 0, hi = nseq - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (__ldg(cu + mid * cu_s) <= (long long)r) lo = mid; else hi = mid - 1;
        }
        const int begin = __ldg(cu + lo * cu_s), end = __ldg(cu + (lo + 1) * cu_s);
        const int start = starts != nullptr ? __ldg(starts + lo * st_s) : 0;
        if ((long long)r < begin || (long long)r >= end || start < 0) continue;
        const unsigned p = (unsigned)start + (r - (unsigned)begin);
        const unsigned blk = p / bs;
        if (blk >= mb) continue;
        const int id = __ldg(bt + lo * bt_sb + (i64)blk * bt_sc);
        if (id < 0 || (unsigned)id >= nb) continue;
        const uint4* src = cache + (i64)id * c_sb + (i64)(p - blk * bs) * c_sr;
        uint4* dst = out + (i64)r * o_s;
        for (int c0 = 0; c0 < dv; c0 += (int)lpr * U) {
            uint4 v[U];
#pragma unroll
            for (int j = 0; j < U; ++j) {
                const int c = c0 + j * (int)lpr + (int)lane;
                if (c < dv) v[j] = __ldg(src + c);
            }
#pragma unroll
            for (int j = 0; j < U; ++j) {
                const int c = c0 + j * (int)lpr + (int)lane;
                if (c < dv) dst[c] = v[j];
            }
        }
    }
}

}  // namespace

// Workspace row r's cache row: block id and row within the block, or false when r belongs to no
// sequence or its position's block is past the table or holds an id outside the cache (the row
// is then skipped). The sequence is the last b with cu[b] <= r (empty ones before it skipped).
__device__ __forceinline__ bool cache_row_of(i64 r, const int* cu, i64 cu_s, int nseq, const int* starts, i64 st_s,
                                             const int* bt, i64 bt_sb, i64 bt_sc, i64 mb, i64 nb, i64 bs, i64& id,
                                             i64& pos) {
    if ((i64)cu[0] > r) return false;
    int lo = 0, hi = nseq - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if ((i64)cu[mid * cu_s] <= r) lo = mid; else hi = mid - 1;
    }
    const i64 begin = cu[lo * cu_s], end = cu[(lo + 1) * cu_s];
    if (r < begin || r >= end) return false;
    const i64 start = starts != nullptr ? (i64)starts[lo * st_s] : 0;
    if (start < 0) return false;
    const i64 p = start + (r - begin);
    const i64 blk = p / bs;
    if (blk >= mb) return false;
    id = bt[lo * bt_sb + blk * bt_sc];
    if (id < 0 || id >= nb) return false;
    pos = p % bs;
    return true;
}

template <typename T>
__device__ void gather_mla_cache(T* out, i64 o_s, i64 rows, const T* cache, i64 c_sb, i64 c_sr, i64 nb, i64 bs, int d,
                                 const int* bt, i64 bt_sb, i64 bt_sc, i64 mb, const int* cu, i64 cu_s, int nseq,
                                 const int* starts, i64 st_s) {
    if (nseq <= 0) return;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 id, pos;
        if (!cache_row_of(r, cu, cu_s, nseq, starts, st_s, bt, bt_sb, bt_sc, mb, nb, bs, id, pos)) continue;
        const T* src = cache + id * c_sb + pos * c_sr;
        T* dst = out + r * o_s;
        for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = src[i];
    }
}

#define VT_GATHER(S, T)                                                                                    \
    extern "C" __global__ void gather_mla_cache_##S(T* out, i64 o_s, i64 rows, const T* cache, i64 c_sb,   \
                                                    i64 c_sr, i64 nb, i64 bs, int d, const int* bt,         \
                                                    i64 bt_sb, i64 bt_sc, i64 mb, const int* cu, i64 cu_s,  \
                                                    int nseq, const int* starts, i64 st_s) {                \
        gather_mla_cache<T>(out, o_s, rows, cache, c_sb, c_sr, nb, bs, d, bt, bt_sb, bt_sc, mb, cu, cu_s,  \
                            nseq, starts, st_s);                                                           \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(256, 8)                                                     \
        gather_mla_cache_v16_##S(uint4* out, i64 o_s, unsigned rows, const uint4* cache, i64 c_sb,          \
                                 i64 c_sr, unsigned nb, unsigned bs, int dv, const int* bt, i64 bt_sb,      \
                                 i64 bt_sc, unsigned mb, const int* cu, i64 cu_s, int nseq,                 \
                                 const int* starts, i64 st_s, int lpr_log2) {                               \
        gather_v16(out, o_s, rows, cache, c_sb, c_sr, nb, bs, dv, bt, bt_sb, bt_sc, mb, cu, cu_s, nseq,    \
                   starts, st_s, lpr_log2);                                                                 \
    }
VT_FOR_EACH_FLOAT(VT_GATHER)

// The fp8_ds_mla cache (fp8_ds_mla.cuh): the scalar kernel's row lookup, one block per
// workspace row, each thread dequantizing values of the 576 (e4m3 * scale in f32, rope
// bf16) and rounding once to the workspace dtype: gather_mla_cache_fp8_{bf16,f16,f32}.
#include "fp8_ds_mla.cuh"

template <typename T>
__device__ void gather_mla_cache_fp8(T* out, i64 o_s, i64 rows, const unsigned char* cache, i64 c_sb, i64 c_sr,
                                     i64 nb, i64 bs, const int* bt, i64 bt_sb, i64 bt_sc, i64 mb, const int* cu,
                                     i64 cu_s, int nseq, const int* starts, i64 st_s) {
    if (nseq <= 0) return;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 id, pos;
        if (!cache_row_of(r, cu, cu_s, nseq, starts, st_s, bt, bt_sb, bt_sc, mb, nb, bs, id, pos)) continue;
        const unsigned char* src = cache + id * c_sb + pos * c_sr;
        T* dst = out + r * o_s;
        for (int i = threadIdx.x; i < vt::fp8ds::DECODED; i += blockDim.x) {
            dst[i] = vt::from_f32<T>(vt::fp8ds::value(src, i));
        }
    }
}

#define VT_GATHER_FP8(S, T)                                                                                 \
    extern "C" __global__ void gather_mla_cache_fp8_##S(T* out, i64 o_s, i64 rows, const unsigned char* cache, \
                                                        i64 c_sb, i64 c_sr, i64 nb, i64 bs, const int* bt,  \
                                                        i64 bt_sb, i64 bt_sc, i64 mb, const int* cu,        \
                                                        i64 cu_s, int nseq, const int* starts, i64 st_s) {  \
        gather_mla_cache_fp8<T>(out, o_s, rows, cache, c_sb, c_sr, nb, bs, bt, bt_sb, bt_sc, mb, cu, cu_s,  \
                                nseq, starts, st_s);                                                        \
    }
VT_FOR_EACH_FLOAT(VT_GATHER_FP8)
