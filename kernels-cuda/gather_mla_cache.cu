// GatherMlaCache: out[cu[b] + j] = cache[block_table[b, p / BS], p % BS, :] with
// p = seq_starts[b] + j. One block per output row (grid-stride over the workspace rows);
// the row's sequence is found by binary search in cu_seq_lens, so no length is read back
// on the host. Rows past cu[B], and rows whose start, block index or block id is out of
// range, are left untouched.
#include "common.cuh"

template <typename T>
__device__ void gather_mla_cache(T* out, i64 o_s, i64 rows, const T* cache, i64 c_sb, i64 c_sr, i64 nb, i64 bs, int d,
                                 const int* bt, i64 bt_sb, i64 bt_sc, i64 mb, const int* cu, i64 cu_s, int nseq,
                                 const int* starts, i64 st_s) {
    if (nseq <= 0) return;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        if ((i64)cu[0] > r) continue;
        // The last sequence b with cu[b] <= r (empty sequences before it are skipped).
        int lo = 0, hi = nseq - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if ((i64)cu[mid * cu_s] <= r) lo = mid; else hi = mid - 1;
        }
        const i64 begin = cu[lo * cu_s], end = cu[(lo + 1) * cu_s];
        if (r < begin || r >= end) continue;
        const i64 start = starts != nullptr ? (i64)starts[lo * st_s] : 0;
        if (start < 0) continue;
        const i64 p = start + (r - begin);
        const i64 blk = p / bs;
        if (blk >= mb) continue;
        const i64 id = bt[lo * bt_sb + blk * bt_sc];
        if (id < 0 || id >= nb) continue;
        const T* src = cache + id * c_sb + (p % bs) * c_sr;
        T* dst = out + r * o_s;
        for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = src[i];
    }
}

#define VT_GATHER(S, T)                                                                                   \
    extern "C" __global__ void gather_mla_cache_##S(T* out, i64 o_s, i64 rows, const T* cache, i64 c_sb,  \
                                                    i64 c_sr, i64 nb, i64 bs, int d, const int* bt,        \
                                                    i64 bt_sb, i64 bt_sc, i64 mb, const int* cu, i64 cu_s, \
                                                    int nseq, const int* starts, i64 st_s) {               \
        gather_mla_cache<T>(out, o_s, rows, cache, c_sb, c_sr, nb, bs, d, bt, bt_sb, bt_sc, mb, cu, cu_s, \
                            nseq, starts, st_s);                                                          \
    }
VT_FOR_EACH_FLOAT(VT_GATHER)
