// ConcatMlaNopeRope: out[t, n, :] = [nope[t, n, :] | rope[t, n or 0, :]].
//
// Two kernels:
// - concat_mla_nope_rope_v16: the fast path for views whose rows split into 16-byte
//   vectors (P and R multiples of 16 bytes, every stride a multiple, 16-byte aligned bases;
//   the host checks). Pointers and strides arrive in 16-byte units, so the kernel is the
//   same byte copy for every dtype. A block owns one token and a chunk of heads; thread
//   (hy, c) owns vector column c of heads hy, hy + hg, ... (U of them): its U loads are
//   independent and in flight together. A broadcast rope (head stride 0) is loaded once
//   per thread and stored U times, so it is read hg times per token chunk, not per head.
//   In-token offsets are 32-bit (the host checks they fit); token offsets 64-bit.
// - concat_mla_nope_rope: the scalar fallback for any other view, one block per
//   (t, n) row (grid-stride); a broadcast rope is passed with head stride 0.
#include "common.cuh"

namespace {

constexpr int kHeadsPerThread = 8;  // U: independent 16-byte loads in flight per thread

__device__ __forceinline__ uint4 load16(const uint4* p) { return __ldg(p); }

// `hg` heads in parallel per block (blockDim.x = cw * hg, cw = min(w, blockDim) vector
// columns), `chunks` head chunks of hg * U heads per token; nblk = tokens * chunks blocks
// of work over a grid-stride loop.
__device__ void concat_v16(uint4* __restrict__ out, i64 o_st, int o_sh, const uint4* __restrict__ nope, i64 n_st,
                           int n_sh, const uint4* __restrict__ rope, i64 r_st, int r_sh, unsigned nblk, int heads,
                           int pv, int rv, int hg, int chunks) {
    constexpr int U = kHeadsPerThread;
    const int w = pv + rv;
    const int cw = blockDim.x / hg;
    const int cx = threadIdx.x % cw, hy = threadIdx.x / cw;
    if (hy >= hg) return;  // blockDim.x is exactly cw * hg; kept for safety
    const int hpc = hg * U;
    for (unsigned b = blockIdx.x; b < nblk; b += gridDim.x) {
        const unsigned t = b / (unsigned)chunks;
        const int h0 = (int)(b - t * (unsigned)chunks) * hpc + hy;
        uint4* o = out + (i64)t * o_st;
        const uint4* a = nope + (i64)t * n_st;
        const uint4* rr = rope + (i64)t * r_st;
        for (int c = cx; c < w; c += cw) {
            uint4 v[U];
            if (c < pv) {
#pragma unroll
                for (int j = 0; j < U; ++j) {
                    const int h = h0 + j * hg;
                    if (h < heads) v[j] = load16(a + h * n_sh + c);
                }
            } else if (r_sh == 0) {
                const uint4 x = load16(rr + (c - pv));
#pragma unroll
                for (int j = 0; j < U; ++j) v[j] = x;
            } else {
#pragma unroll
                for (int j = 0; j < U; ++j) {
                    const int h = h0 + j * hg;
                    if (h < heads) v[j] = load16(rr + h * r_sh + (c - pv));
                }
            }
#pragma unroll
            for (int j = 0; j < U; ++j) {
                const int h = h0 + j * hg;
                if (h < heads) o[h * o_sh + c] = v[j];
            }
        }
    }
}

}  // namespace

template <typename T>
__device__ void concat_mla_nope_rope(T* out, i64 o_st, i64 o_sh, const T* nope, i64 n_st, i64 n_sh, const T* rope,
                                     i64 r_st, i64 r_sh, i64 tokens, int heads, int p, int r) {
    const i64 rows = tokens * heads;
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const i64 t = row / heads, h = row % heads;
        T* o = out + t * o_st + h * o_sh;
        const T* a = nope + t * n_st + h * n_sh;
        const T* b = rope + t * r_st + h * r_sh;
        for (int i = threadIdx.x; i < p + r; i += blockDim.x) o[i] = i < p ? a[i] : b[i - p];
    }
}

#define VT_CONCAT(S, T)                                                                                    \
    extern "C" __global__ void concat_mla_nope_rope_##S(T* out, i64 o_st, i64 o_sh, const T* nope,         \
                                                        i64 n_st, i64 n_sh, const T* rope, i64 r_st,       \
                                                        i64 r_sh, i64 tokens, int heads, int p, int r) {   \
        concat_mla_nope_rope<T>(out, o_st, o_sh, nope, n_st, n_sh, rope, r_st, r_sh, tokens, heads, p, r); \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                                      \
        concat_mla_nope_rope_v16_##S(uint4* out, i64 o_st, int o_sh, const uint4* nope, i64 n_st,          \
                                     int n_sh, const uint4* rope, i64 r_st, int r_sh, unsigned nblk,       \
                                     int heads, int pv, int rv, int hg, int chunks) {                      \
        concat_v16(out, o_st, o_sh, nope, n_st, n_sh, rope, r_st, r_sh, nblk, heads, pv, rv, hg, chunks);  \
    }
VT_FOR_EACH_FLOAT(VT_CONCAT)
