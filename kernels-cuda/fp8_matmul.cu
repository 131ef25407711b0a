// The block-scaled fp8 ops (vt_core::fp8_block): QuantizeFp8, MatmulBTFp8 and
// BatchedMatmulFp8. Host side: crates/vt-cuda/src/fp8_matmul.rs.
//
// Every matmul kernel computes, per batch entry g,
//   out[m, n] = sum_kb s(m, n, kb) * sum_{k in group kb} A(m, k) q(n, k)
// with q the weight's e4m3 codes (read exactly), A the activations (16/32-bit, or e4m3 codes
// with per-token scales), and s(m, n, kb) = b_scale[g, kb, n / 128] (* a_scale[g, m, kb]):
// each 128-wide K group is summed in f32 and then scaled (the promotion of DeepGEMM).
//
// - quantize_fp8_{T}: a warp per (row, 128-group), up to 8 groups of a row a CTA; bit for bit
//   vt_core::fp8_block. quantize_fp8_wide_{T} (`VT_QUANT_WIDE`): a half-warp per (row, group),
//   16 bytes a lane, four rows a half-warp in flight; the same bytes.
// - fp8_matmul_generic_{T}: any strides, any dtype, both activation forms; a thread per
//   output element. The reference-shaped fallback.
// - fp8_gemv_t{1,2,4}_{bf16,f16}: the weight-only decode kernel (M small). A warp streams 16
//   weight rows with 16-byte loads, converts e4m3 to the activations' 16-bit type in
//   registers (exact), and multiplies with mma.sync m16n8k16: the weight rows are the MMA's
//   M side, 8 tokens its N side (t1: 8 tokens per CTA, t2: 16, t4: 32). K is permuted inside
//   each 64-wide chunk so that a lane's 16 consecutive weight bytes and 16 consecutive
//   activations are exactly its fragments. The warps of a CTA split K by 128-groups and add
//   their partial sums through shared memory.
// - fp8_gemm_mma_{T}: both operands e4m3, mma.sync m16n8k32 (sm_89+): 128 x 128 tiles, K
//   tiles of 128 (one scale group) through a 3-stage cp.async ring in 128-byte-swizzled
//   shared memory, each K tile's products summed in fresh accumulators, then scaled.
// - fp8_gemm_wgmma_{T}: both operands e4m3 on sm_90a: the same tiles and promotion with a
//   TMA producer warpgroup and two wgmma m64n128k32 consumer warpgroups (namespace wgm).
#include "common.cuh"
#include "e4m3.cuh"
#include "fp8_ds_mla.cuh"
#include "tensor_core.cuh"

namespace fp8mm {

using namespace vt::tc;
using vt::fp8ds::e4m3_to_f32;
using vt::fp8ds::f32_to_e4m3;

// ------------------------------------------------------------------------- QuantizeFp8

// Four consecutive elements of a row, loaded as one vector.
template <typename T> struct alignas(4 * sizeof(T)) Quad {
    T e[4];
};

// Four f32 as e4m3 codes (y[0] in the low byte): the hardware's round-to-nearest-even with
// saturation to +-448 (sm_89+), which is f32_to_e4m3 on every finite and infinite value; a
// NaN becomes 0x7f as there (the hardware would keep its sign).
__device__ __forceinline__ uint32_t e4m3x4(const float* y) {
#if __CUDA_ARCH__ >= 890
    uint32_t w = vt::e4m3x2_of(y[0], y[1]) | (vt::e4m3x2_of(y[2], y[3]) << 16);
#pragma unroll
    for (int j = 0; j < 4; ++j)
        if (y[j] != y[j]) w = (w & ~(0xffu << (8 * j))) | (0x7fu << (8 * j));
    return w;
#else
    return (uint32_t)f32_to_e4m3(y[0]) | ((uint32_t)f32_to_e4m3(y[1]) << 8) | ((uint32_t)f32_to_e4m3(y[2]) << 16) |
           ((uint32_t)f32_to_e4m3(y[3]) << 24);
#endif
}

// A lane's N values of a 128-group as codes (e4m3x4's word per four, y[0] in the low byte of
// the first) given the group's amax; returns the group's scale. vt_core::fp8_block's arithmetic:
// scale = amax / 448, code = e4m3(v / scale) by IEEE division, 0 where the scale is 0.
template <int N>
__device__ __forceinline__ float quantize_lane(const float (&v)[N], float amax, uint32_t (&word)[N / 4]) {
    const float s = __fdiv_rn(amax, 448.0f);
    float y[N];
#pragma unroll
    for (int j = 0; j < N; ++j) y[j] = s == 0.0f ? 0.0f : __fdiv_rn(v[j], s);
#pragma unroll
    for (int j = 0; j < N / 4; ++j) word[j] = e4m3x4(y + 4 * j);
    return s;
}

// A warp per (row, 128-group), 8 warps a CTA: 2^lw groups of a row (lw = quantize_lw: as many
// as the row has, up to 8) by 8 / 2^lw rows; grid x covers the groups, y the rows (looping
// past 65535 CTAs), so no index is divided by a runtime value. A lane's four elements are one
// vector load and its four codes one 32-bit store where the row is aligned for them (every
// lane's offset is a multiple of four elements), else element by element (the row's tail too).
__device__ __forceinline__ int quantize_lw(i64 groups) { return groups >= 8 ? 3 : groups >= 4 ? 2 : groups >= 2 ? 1 : 0; }
template <typename T>
__device__ void quantize(unsigned char* out, i64 o0, float* scale, i64 s0, i64 s1, const T* x, i64 x0, i64 m,
                         i64 k) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 groups = (k + 127) >> 7;
    const int lw = quantize_lw(groups), rows = (blockDim.x >> 5) >> lw;  // rows a CTA covers
    const i64 grp = ((i64)blockIdx.x << lw) + (w & ((1 << lw) - 1));
    if (grp >= groups) return;
    const i64 c0 = grp * 128 + 4 * lane;
    const bool whole = c0 + 4 <= k;
    for (i64 row = (i64)blockIdx.y * rows + (w >> lw); row < m; row += (i64)gridDim.y * rows) {
        const T* xr = x + row * x0 + c0;
        unsigned char* orow = out + row * o0 + c0;
        float v[4];
        if (whole && (reinterpret_cast<unsigned long long>(xr) & (4 * sizeof(T) - 1)) == 0) {
            const Quad<T> q = *reinterpret_cast<const Quad<T>*>(xr);
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = vt::to_f32(q.e[j]);
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = c0 + j < k ? vt::to_f32(xr[j]) : 0.0f;
        }
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(v[j]));
        amax = vt::warp_max(amax);
        uint32_t words[1];
        const float s = quantize_lane(v, amax, words);
        const uint32_t word = words[0];
        if (whole && (reinterpret_cast<unsigned long long>(orow) & 3) == 0) {
            *reinterpret_cast<uint32_t*>(orow) = word;
        } else {
            const unsigned char q[4] = {(unsigned char)word, (unsigned char)(word >> 8), (unsigned char)(word >> 16),
                                        (unsigned char)(word >> 24)};
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (c0 + j < k) orow[j] = q[j];
        }
        if (lane == 0) scale[row * s0 + grp * s1] = s;
    }
}

// The wide form (quantize_fp8_wide_*, `VT_QUANT_WIDE`). Rows a half-warp has in flight
// (QUANT_ROWS) and the elements a lane owns in a row (8: 16 bytes of a 16-bit row, one load).
// The form above (a warp per (row, group), 8 bytes a lane, one row at a time) keeps 16 KB of
// loads in flight an SM: 46-47% of the copy ceiling at M 4096 on an H100 (docs/perf.md,
// QuantizeFp8), where Little's law at ~1.5 us of DRAM latency asks for ~35 KB. This one keeps
// QUANT_ROWS x 16 bytes a lane in flight: 64 KB an SM at the 1024 threads its registers allow.
// (Enumerators: NVRTC would emit namespace-scope constants into the PTX as globals.)
enum : int { QUANT_ROWS = 4, QUANT_LANE = 8, QUANT_THREADS = 256 };
// CTAs an SM must hold (the registers' bound): 4 (64 registers, 1024 threads) for 16-bit inputs,
// 2 for f32, whose raw words are twice as many.
template <typename T> __device__ constexpr int quant_ctas() { return sizeof(T) == 4 ? 2 : 4; }

// 16-byte words holding a lane's QUANT_LANE elements of T: 1 for 16-bit T, 2 for f32.
template <typename T> struct QuantRaw {
    static constexpr int WORDS = QUANT_LANE * (int)sizeof(T) / 16;
    uint4 w[WORDS];
};

// A half-warp per (row, 128-group), a lane's QUANT_LANE elements one vector load where the
// row is whole and 16-byte aligned there, else element by element (the row's tail, odd
// strides). 16 half-warps a CTA: 2^lw groups of a row (lw = quantize_wide_lw: as many as the row
// has, up to 16) by 16 / 2^lw rows; grid x covers the groups, y the rows, and each half-warp
// takes QUANT_ROWS rows gridDim.y x (16 / 2^lw) apart at once, all their loads issued before
// the first is used, then loops (no index is divided by a runtime value). The group's amax is
// a max over its 16 lanes (xor shuffles within the half); both halves of a warp shuffle
// together, so a half with nothing to do runs the loop with its loads masked.
// Bit for bit vt_core::fp8_block: the same IEEE division per element, the max is order-free.
__device__ __forceinline__ int quantize_wide_lw(i64 groups) {
    return groups >= 16 ? 4 : groups >= 8 ? 3 : groups >= 4 ? 2 : groups >= 2 ? 1 : 0;
}
template <typename T>
__device__ void quantize_wide(unsigned char* out, i64 o0, float* scale, i64 s0, i64 s1, const T* x, i64 x0,
                              i64 m, i64 k) {
    const int lane = threadIdx.x & 31, half = threadIdx.x >> 4, sub = lane & 15;
    const i64 groups = (k + 127) >> 7;
    const int lw = quantize_wide_lw(groups), rows = 16 >> lw;  // rows a CTA covers per pass
    const i64 grp = ((i64)blockIdx.x << lw) + (half & ((1 << lw) - 1));
    const bool col_ok = grp < groups;
    const i64 c0 = grp * 128 + QUANT_LANE * sub;
    const bool whole = col_ok && c0 + QUANT_LANE <= k;
    const i64 stride = (i64)gridDim.y * rows;
    if (__all_sync(0xffffffffu, !col_ok)) return;  // a warp past the row's groups (no block barrier follows)
    // Both halves of a warp pass the loop's test together (their first rows differ by at most 1).
    for (i64 r0 = (i64)blockIdx.y * rows + (half >> lw); __any_sync(0xffffffffu, r0 < m);
         r0 += QUANT_ROWS * stride) {
        QuantRaw<T> raw[QUANT_ROWS];
        bool vec[QUANT_ROWS];
#pragma unroll
        for (int j = 0; j < QUANT_ROWS; ++j) {  // every load first
            const i64 row = r0 + j * stride;
            const T* xr = x + row * x0 + c0;
            vec[j] = whole && row < m && (reinterpret_cast<unsigned long long>(xr) & 15) == 0;
            if (vec[j]) raw[j] = *reinterpret_cast<const QuantRaw<T>*>(xr);
        }
#pragma unroll
        for (int j = 0; j < QUANT_ROWS; ++j) {
            const i64 row = r0 + j * stride;
            const bool ok = col_ok && row < m;
            const T* xr = x + row * x0 + c0;
            float v[QUANT_LANE];
            if (vec[j]) {
                const T* e = reinterpret_cast<const T*>(raw[j].w);
#pragma unroll
                for (int i = 0; i < QUANT_LANE; ++i) v[i] = vt::to_f32(e[i]);
            } else {
#pragma unroll
                for (int i = 0; i < QUANT_LANE; ++i) v[i] = ok && c0 + i < k ? vt::to_f32(xr[i]) : 0.0f;
            }
            float amax = 0.0f;
#pragma unroll
            for (int i = 0; i < QUANT_LANE; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            if (!ok) continue;
            uint32_t words[QUANT_LANE / 4];
            const float s = quantize_lane(v, amax, words);
            const uint2 word = make_uint2(words[0], words[1]);
            unsigned char* orow = out + row * o0 + c0;
            if (whole && (reinterpret_cast<unsigned long long>(orow) & 7) == 0) {
                *reinterpret_cast<uint2*>(orow) = word;
            } else {
#pragma unroll
                for (int i = 0; i < QUANT_LANE; ++i)
                    if (c0 + i < k) orow[i] = (unsigned char)((i < 4 ? word.x : word.y) >> (8 * (i & 3)));
            }
            if (sub == 0) scale[row * s0 + grp * s1] = s;
        }
    }
}

// ---------------------------------------------------------------------- generic matmul

// The logical operands: a[g, m, k] (T, or e4m3 codes when `as` is not null), b[g, k, n]
// (e4m3 codes), bs[g, kb, nb], as[g, m, kb], out[g, m, n]; strides in elements.
template <typename T>
__device__ void generic(T* out, i64 o0, i64 o1, i64 o2, const void* a, i64 a0, i64 a1, i64 a2, const float* as,
                        i64 as0, i64 as1, i64 as2, const unsigned char* b, i64 b0, i64 b1, i64 b2, const float* bs,
                        i64 bs0, i64 bs1, i64 bs2, i64 g, i64 m, i64 n, i64 k) {
    const i64 total = g * m * n;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        const i64 gi = e / (m * n), rem = e % (m * n), i = rem / n, j = rem % n;
        const unsigned char* pb = b + gi * b0 + j * b2;
        const float* ps = bs + gi * bs0 + (j / 128) * bs2;
        float acc = 0.0f;
        for (i64 kb = 0; kb * 128 < k; ++kb) {
            const i64 k1 = min(k, kb * 128 + 128);
            float part = 0.0f;
            float sc = ps[kb * bs1];
            if (as != nullptr) {
                const unsigned char* pa = (const unsigned char*)a + gi * a0 + i * a1;
                for (i64 kk = kb * 128; kk < k1; ++kk)
                    part = fmaf(e4m3_to_f32(pa[kk * a2]), e4m3_to_f32(pb[kk * b1]), part);
                sc *= as[gi * as0 + i * as1 + kb * as2];
            } else {
                const T* pa = (const T*)a + gi * a0 + i * a1;
                for (i64 kk = kb * 128; kk < k1; ++kk)
                    part = fmaf(vt::to_f32(pa[kk * a2]), e4m3_to_f32(pb[kk * b1]), part);
            }
            acc = fmaf(part, sc, acc);
        }
        out[gi * o0 + i * o1 + j * o2] = vt::from_f32<T>(acc);
    }
}

// ------------------------------------------------------------ the weight-only decode kernel

using vt::e4m3x2;  // e4m3.cuh
using vt::word;

// 16 weight bytes, read once: no L1 allocation.
__device__ __forceinline__ uint4 ld_stream(const unsigned char* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

constexpr int GEMV_WARPS = 8;

// CTA: GEMV_WARPS warps = (8 / wk) row tiles of 16 weight rows x wk K-slices; blockIdx.x the
// row-tile block, blockIdx.y the token block (8 TT tokens), blockIdx.z the batch entry times
// `splits` plus the K split: split s covers the 128-groups [s gps, (s + 1) gps). With
// splits > 1 the CTA writes f32 partial sums to `part` ([splits][G][M][N], split stride
// part_s) and fp8_split_combine adds them; else it writes `out`.
// Requirements (checked on the host): K % 16 == 0, b rows and a rows 16-byte aligned.
template <typename T, int TT>
__device__ void gemv(T* out, i64 o_b, i64 o_m, i64 o_n, const T* a, i64 a_b, i64 a_m, const unsigned char* b,
                     i64 b_b, i64 b_n, const float* bs, i64 bs_b, i64 bs_n, i64 bs_k, int m, int n, int k, int wk,
                     float* part, i64 part_s, int splits, int gps) {
    __shared__ float red[GEMV_WARPS][TT * 4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int ks = warp % wk, wn = GEMV_WARPS / wk;
    const i64 batch = blockIdx.z / splits;
    const int split = blockIdx.z % splits;
    const int n0 = (blockIdx.x * wn + warp / wk) * 16;
    const int m0 = blockIdx.y * (8 * TT);
    const int groups = min((k + 127) >> 7, (split + 1) * gps), g_lo = split * gps;
    float acc[TT][4];
#pragma unroll
    for (int tt = 0; tt < TT; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[tt][i] = 0.0f;

    if (n0 < n) {
        const bool r0ok = n0 + g < n, r1ok = n0 + g + 8 < n;
        const unsigned char* w0 = b + batch * b_b + (i64)min(n0 + g, n - 1) * b_n + 16 * t;
        const unsigned char* w1 = b + batch * b_b + (i64)min(n0 + g + 8, n - 1) * b_n + 16 * t;
        const float* sb = bs + batch * bs_b + (i64)(n0 >> 7) * bs_n;
        const T* arow[TT];
        bool aok[TT];
#pragma unroll
        for (int tt = 0; tt < TT; ++tt) {
            const int mi = m0 + tt * 8 + g;
            aok[tt] = mi < m;
            arow[tt] = a + batch * a_b + (i64)min(mi, m - 1) * a_m + 16 * t;
        }
        const uint4 zero = make_uint4(0, 0, 0, 0);
        // This group's weights (2 chunks of 64 x rows g, g + 8) and the next group's, in flight.
        auto load_w = [&](int gi, uint4 (&w)[2][2]) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int kc = gi * 128 + h * 64;
                const bool kok = gi < groups && kc + 16 * t < k;
                w[h][0] = r0ok && kok ? ld_stream(w0 + kc) : zero;
                w[h][1] = r1ok && kok ? ld_stream(w1 + kc) : zero;
            }
        };
        uint4 cw[2][2], nw[2][2];
        load_w(g_lo + ks, cw);
        for (int gi = g_lo + ks; gi < groups; gi += wk) {
            load_w(gi + wk, nw);
            float tmp[TT][4];
#pragma unroll
            for (int tt = 0; tt < TT; ++tt)
#pragma unroll
                for (int i = 0; i < 4; ++i) tmp[tt][i] = 0.0f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int kc = gi * 128 + h * 64;
                const bool kok = kc + 16 * t < k;
                uint4 av[TT][2];
#pragma unroll
                for (int tt = 0; tt < TT; ++tt) {
                    const bool ok = aok[tt] && kok;
                    av[tt][0] = ok ? __ldg(reinterpret_cast<const uint4*>(arow[tt] + kc)) : zero;
                    av[tt][1] = ok ? __ldg(reinterpret_cast<const uint4*>(arow[tt] + kc + 8)) : zero;
                }
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    const uint32_t r0 = word(cw[h][0], s), r1 = word(cw[h][1], s);
                    const uint32_t fa[4] = {e4m3x2<T>(r0, false), e4m3x2<T>(r1, false), e4m3x2<T>(r0, true),
                                            e4m3x2<T>(r1, true)};
#pragma unroll
                    for (int tt = 0; tt < TT; ++tt) {
                        const uint4& lo = s < 2 ? av[tt][0] : av[tt][1];
                        const int wd = 2 * (s & 1);
                        MmaSync<T>::run(tmp[tt], fa, word(lo, wd), word(lo, wd + 1));
                    }
                }
            }
            const float sc = sb[(i64)gi * bs_k];
#pragma unroll
            for (int tt = 0; tt < TT; ++tt)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[tt][i] = fmaf(tmp[tt][i], sc, acc[tt][i]);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                cw[h][0] = nw[h][0];
                cw[h][1] = nw[h][1];
            }
        }
    }
    // The K-slices of a row tile are consecutive warps: warp ks == 0 adds the others'.
#pragma unroll
    for (int tt = 0; tt < TT; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp][tt * 4 + i][lane] = acc[tt][i];
    __syncthreads();
    if (ks != 0 || n0 >= n) return;
#pragma unroll
    for (int tt = 0; tt < TT; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float sum = red[warp][tt * 4 + i][lane];
            for (int j = 1; j < wk; ++j) sum += red[warp + j][tt * 4 + i][lane];
            const int row = n0 + g + 8 * (i >> 1), tok = m0 + tt * 8 + 2 * t + (i & 1);
            if (row >= n || tok >= m) continue;
            if (part != nullptr)
                part[split * part_s + (batch * m + tok) * (i64)n + row] = sum;
            else
                out[batch * o_b + (i64)tok * o_m + (i64)row * o_n] = vt::from_f32<T>(sum);
        }
}

// out[g, m, n] = the sum over the K splits of their f32 partials (in split order).
template <typename T>
__device__ void split_combine(T* out, i64 o0, i64 o1, i64 o2, const float* part, i64 part_s, int splits, i64 g,
                              i64 m, i64 n) {
    const i64 total = g * m * n;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        const i64 gi = e / (m * n), rem = e % (m * n), i = rem / n, j = rem % n;
        float acc = 0.0f;
        for (int s = 0; s < splits; ++s) acc += part[s * part_s + e];
        out[gi * o0 + i * o1 + j * o2] = vt::from_f32<T>(acc);
    }
}

// -------------------------------------------------------------- both fp8: mma.sync m16n8k32

constexpr int MMA_BM = 128, MMA_BN = 128, MMA_BK = 128, MMA_STAGES = 3, MMA_THREADS = 256;
constexpr int MMA_TILE = MMA_BM * MMA_BK;            // bytes of one operand tile (A; B is the same)
// Dynamic shared memory: MMA_STAGES * 2 * MMA_TILE = 96 KB (the host's MMA_SMEM).

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
__device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// One operand tile: rows r0.. (up to 128, `rows` valid) x K bytes k0..k0+127 of a row-major
// byte matrix with row stride `ld`, into 128 rows of 128 swizzled bytes; past `rows` or `k`
// zero-filled. 256 threads, 4 chunks of 16 bytes each.
__device__ __forceinline__ void load_tile8(uint32_t dst, const unsigned char* src, i64 ld, int rows, int k0, int k,
                                           int tid) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int chunk = tid + i * MMA_THREADS, r = chunk >> 3, c = chunk & 7;
        const bool ok = r < rows && k0 + 16 * c < k;
        const unsigned char* p = ok ? src + (i64)r * ld + k0 + 16 * c : src;
        cp_async16(dst + swz(r, c), p, ok);
    }
}

// CTA: 8 warps, 2 (M) x 4 (N), a warp tile of 64 x 32; blockIdx = (N tile, M tile, batch).
// Requirements (host): K % 16 == 0, a and b rows 16-byte aligned, sm_89+.
template <typename T>
__device__ void gemm_mma(T* out, i64 o_b, i64 o_m, i64 o_n, const unsigned char* a, i64 a_b, i64 a_m,
                         const float* as, i64 as_b, i64 as_m, i64 as_k, const unsigned char* b, i64 b_b, i64 b_n,
                         const float* bs, i64 bs_b, i64 bs_n, i64 bs_k, int m, int n, int k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t base = smem_u32(smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;
    const i64 batch = blockIdx.z;
    const int n0 = blockIdx.x * MMA_BN, m0 = blockIdx.y * MMA_BM;
    const unsigned char* ga = a + batch * a_b + (i64)m0 * a_m;
    const unsigned char* gb = b + batch * b_b + (i64)n0 * b_n;
    const int rows_a = min(MMA_BM, m - m0), rows_b = min(MMA_BN, n - n0);
    const int kt_n = (k + MMA_BK - 1) / MMA_BK;
    auto stage_a = [&](int s) { return base + (uint32_t)(s * 2 * MMA_TILE); };
    auto stage_b = [&](int s) { return base + (uint32_t)(s * 2 * MMA_TILE + MMA_TILE); };
    auto load = [&](int kt) {
        const int s = kt % MMA_STAGES;
        load_tile8(stage_a(s), ga, a_m, rows_a, kt * MMA_BK, k, tid);
        load_tile8(stage_b(s), gb, b_n, rows_b, kt * MMA_BK, k, tid);
    };
#pragma unroll
    for (int s = 0; s < MMA_STAGES - 1; ++s) {
        if (s < kt_n) load(s);
        cp_async_commit();
    }
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    const float* sa = as + batch * as_b;
    const float* sb = bs + batch * bs_b + (i64)(n0 >> 7) * bs_n;
    for (int kt = 0; kt < kt_n; ++kt) {
        // Scales of this K tile for the thread's 8 rows (loaded early: used after the MMAs).
        float srow[4][2];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = m0 + wm * 64 + i * 16 + g + 8 * h;
                srow[i][h] = r < m ? sa[(i64)r * as_m + (i64)kt * as_k] : 0.0f;
            }
        const float scb = sb[(i64)kt * bs_k];
        cp_async_wait<MMA_STAGES - 2>();
        __syncthreads();
        if (kt + MMA_STAGES - 1 < kt_n) load(kt + MMA_STAGES - 1);
        cp_async_commit();
        const int s = kt % MMA_STAGES;
        const uint32_t sA = stage_a(s), sB = stage_b(s);
        float tmp[4][4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) tmp[i][j][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < MMA_BK / 32; ++kk) {
            // A: 4 m16 x k32 fragments; matrix j of ldmatrix.x4 = rows +8 (j & 1), bytes +16 (j >> 1).
            uint32_t fa[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = wm * 64 + i * 16 + (lane & 7) + 8 * ((lane >> 3) & 1);
                const int c = kk * 2 + (lane >> 4);
                ldsm_x4(sA + swz(r, c), fa[i]);
            }
            // B: 2 x (two n8 x k32 fragments); matrix j = n rows +8 (j >> 1), bytes +16 (j & 1).
            uint32_t fb[4][2];
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
                const int r = wn * 32 + jj * 16 + (lane & 7) + 8 * (lane >> 4);
                const int c = kk * 2 + ((lane >> 3) & 1);
                uint32_t q[4];
                ldsm_x4(sB + swz(r, c), q);
                fb[2 * jj][0] = q[0];
                fb[2 * jj][1] = q[1];
                fb[2 * jj + 1][0] = q[2];
                fb[2 * jj + 1][1] = q[3];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_e4m3(tmp[i][j], fa[i], fb[j][0], fb[j][1]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = fmaf(tmp[i][j][e], srow[i][e >> 1] * scb, acc[i][j][e]);
    }
    cp_async_wait<0>();
    T* o = out + batch * o_b;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = m0 + wm * 64 + i * 16 + g + 8 * (e >> 1);
                const int c = n0 + wn * 32 + j * 8 + 2 * t + (e & 1);
                if (r < m && c < n) o[(i64)r * o_m + (i64)c * o_n] = vt::from_f32<T>(acc[i][j][e]);
            }
#endif
}

}  // namespace fp8mm

// ------------------------------------------------------- both fp8: wgmma (sm_90a, DeepGEMM's scheme)

// CTA: 384 threads = a producer warpgroup (one thread drives the tensor memory accelerator)
// and two consumer warpgroups of 64 rows each; tiles of BM = 128 rows x BN = 128 columns
// (one weight scale block), K tiles of 128 (one scale group) through a STAGES-deep ring of
// 128-byte-swizzled shared memory filled by cp.async.bulk.tensor (3-D maps (k, row, batch)
// made on the host; rows past M / N and K past K arrive as zeros). Per K tile a consumer
// issues four wgmma m64n128k32 e4m3 into fresh accumulators, waits, frees the stage, and
// adds them into the f32 result times a_scale[row, kt] * b_scale[n0 / 128, kt].
// Shared memory (from a 1024-aligned base): A [STAGES][128 rows][128 B], B [STAGES][128][128 B],
// 2 * STAGES mbarriers. The host (fp8_matmul.rs, WGMMA_SMEM) reserves SMEM bytes.
namespace wgm {

using namespace vt::tc;

constexpr int BM = 128, BN = 128, BK = 128, STAGES = 5, THREADS = 384;
constexpr int TILE = 128 * 128;
constexpr int OFF_B = STAGES * TILE;
constexpr int OFF_BAR = 2 * STAGES * TILE;
// Dynamic shared memory: OFF_BAR + 16 * STAGES + 1024 alignment slack (the host's WGMMA_SMEM).

// The TMA maps of a ([K, M, G] bytes) and b ([K, N, G] bytes), boxes of 128 x 128 x 1.
struct Maps {
    TmaMap a, b;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mma_m64n128k32(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}
#endif

// blockIdx.z = batch entry * splits + K split (split s: K tiles [s kpt, (s + 1) kpt)); with
// splits > 1 the result is an f32 partial in `part` (as the Gemv kernel's).
template <typename T>
__device__ void gemm(const Maps& maps, T* out, i64 o_b, i64 o_m, i64 o_n, const float* as, i64 as_b, i64 as_m,
                     i64 as_k, const float* bs, i64 bs_b, i64 bs_n, i64 bs_k, int m, int n, int k, float* part,
                     i64 part_s, int splits, int kpt) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((unsigned long long)smem_raw + 1023) & ~1023ull);
    const uint32_t base = smem_u32(smem);
    const uint32_t sA = base, sB = base + OFF_B, sBar = base + OFF_BAR;
    auto full = [&](int s) { return sBar + 8 * s; };
    auto empty = [&](int s) { return sBar + 8 * (STAGES + s); };
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM, batch = blockIdx.z / splits, split = blockIdx.z % splits;
    const int kt_lo = split * kpt, kt_hi = min((k + BK - 1) / BK, kt_lo + kpt);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full(s), 1);     // the producer's expect_tx arrival, then the bytes
            mbar_init(empty(s), 256);  // every consumer thread
        }
    }
    __syncthreads();
    const int wg = threadIdx.x >> 7, wtid = threadIdx.x & 127;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (wtid != 0) return;
        prefetch_map(&maps.a);
        prefetch_map(&maps.b);
        for (int kt = kt_lo; kt < kt_hi; ++kt) {
            const int st = (kt - kt_lo) % STAGES, u = (kt - kt_lo) / STAGES;
            if (u > 0) mbar_wait(empty(st), (u - 1) & 1);
            mbar_expect_tx(full(st), 2 * TILE);
            tma_load_3d(sA + st * TILE, &maps.a, kt * BK, m0, batch, full(st));
            tma_load_3d(sB + st * TILE, &maps.b, kt * BK, n0, batch, full(st));
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int cw = wg - 1, warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t = lane & 3;
    const int r_lo = m0 + 64 * cw + 16 * warp + g, r_hi = r_lo + 8;
    const float* sa = as + (i64)batch * as_b;
    const float* sb = bs + (i64)batch * bs_b + (i64)(n0 >> 7) * bs_n;
    float acc[64], tmp[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int kt = kt_lo; kt < kt_hi; ++kt) {
        const int st = (kt - kt_lo) % STAGES, u = (kt - kt_lo) / STAGES;
        // The scales first: their loads overlap the wait and the products.
        const float scb = sb[(i64)kt * bs_k];
        const float s_lo = r_lo < m ? sa[(i64)r_lo * as_m + (i64)kt * as_k] : 0.0f;
        const float s_hi = r_hi < m ? sa[(i64)r_hi * as_m + (i64)kt * as_k] : 0.0f;
        mbar_wait(full(st), u & 1);
        const uint64_t da = gmma_desc(sA + st * TILE + cw * (64 * 128), 16, 1024);
        const uint64_t db = gmma_desc(sB + st * TILE, 16, 1024);
        pin(tmp);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 32; ++kk) mma_m64n128k32(tmp, da + 2 * kk, db + 2 * kk, kk > 0 ? 1 : 0);
        wgmma_commit();
        wgmma_wait<0>();
        pin(tmp);
        mbar_arrive(empty(st));
        const float c_lo = s_lo * scb, c_hi = s_hi * scb;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            acc[4 * j] = fmaf(tmp[4 * j], c_lo, acc[4 * j]);
            acc[4 * j + 1] = fmaf(tmp[4 * j + 1], c_lo, acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(tmp[4 * j + 2], c_hi, acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(tmp[4 * j + 3], c_hi, acc[4 * j + 3]);
        }
    }
    T* o = out + (i64)batch * o_b;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = e < 2 ? r_lo : r_hi, c = n0 + 8 * j + 2 * t + (e & 1);
            if (r >= m || c >= n) continue;
            if (part != nullptr)
                part[split * part_s + ((i64)batch * m + r) * n + c] = acc[4 * j + e];
            else
                o[(i64)r * o_m + (i64)c * o_n] = vt::from_f32<T>(acc[4 * j + e]);
        }
#endif
}

}  // namespace wgm

#define VT_FP8_ALL(S, T)                                                                                        \
    extern "C" __global__ void quantize_fp8_##S(unsigned char* out, i64 o0, float* scale, i64 s0, i64 s1,         \
                                                const T* x, i64 x0, i64 m, i64 k) {                              \
        fp8mm::quantize<T>(out, o0, scale, s0, s1, x, x0, m, k);                                                 \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(fp8mm::QUANT_THREADS, fp8mm::quant_ctas<T>())                  \
        quantize_fp8_wide_##S(unsigned char* out, i64 o0, float* scale, i64 s0, i64 s1, const T* x, i64 x0, i64 m, \
                              i64 k) {                                                                           \
        fp8mm::quantize_wide<T>(out, o0, scale, s0, s1, x, x0, m, k);                                            \
    }                                                                                                           \
    extern "C" __global__ void fp8_matmul_generic_##S(                                                          \
        T* out, i64 o0, i64 o1, i64 o2, const void* a, i64 a0, i64 a1, i64 a2, const float* as, i64 as0,           \
        i64 as1, i64 as2, const unsigned char* b, i64 b0, i64 b1, i64 b2, const float* bs, i64 bs0, i64 bs1,       \
        i64 bs2, i64 g, i64 m, i64 n, i64 k) {                                                                   \
        fp8mm::generic<T>(out, o0, o1, o2, a, a0, a1, a2, as, as0, as1, as2, b, b0, b1, b2, bs, bs0, bs1, bs2, g,  \
                          m, n, k);                                                                             \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(fp8mm::MMA_THREADS) fp8_gemm_mma_##S(                           \
        T* out, i64 o_b, i64 o_m, i64 o_n, const unsigned char* a, i64 a_b, i64 a_m, const float* as, i64 as_b,    \
        i64 as_m, i64 as_k, const unsigned char* b, i64 b_b, i64 b_n, const float* bs, i64 bs_b, i64 bs_n,          \
        i64 bs_k, int m, int n, int k) {                                                                         \
        fp8mm::gemm_mma<T>(out, o_b, o_m, o_n, a, a_b, a_m, as, as_b, as_m, as_k, b, b_b, b_n, bs, bs_b, bs_n,     \
                           bs_k, m, n, k);                                                                      \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(wgm::THREADS, 1) fp8_gemm_wgmma_##S(                          \
        const __grid_constant__ wgm::Maps maps, T* out, i64 o_b, i64 o_m, i64 o_n, const float* as, i64 as_b,    \
        i64 as_m, i64 as_k, const float* bs, i64 bs_b, i64 bs_n, i64 bs_k, int m, int n, int k, float* part,      \
        i64 part_s, int splits, int kpt) {                                                                        \
        wgm::gemm<T>(maps, out, o_b, o_m, o_n, as, as_b, as_m, as_k, bs, bs_b, bs_n, bs_k, m, n, k, part, part_s,  \
                     splits, kpt);                                                                                \
    }                                                                                                           \
    extern "C" __global__ void fp8_split_combine_##S(T* out, i64 o0, i64 o1, i64 o2, const float* part,           \
                                                     i64 part_s, int splits, i64 g, i64 m, i64 n) {               \
        fp8mm::split_combine<T>(out, o0, o1, o2, part, part_s, splits, g, m, n);                                  \
    }
VT_FOR_EACH_FLOAT(VT_FP8_ALL)

#define VT_FP8_GEMV(S, T, TT)                                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * fp8mm::GEMV_WARPS) fp8_gemv_t##TT##_##S(                    \
        T* out, i64 o_b, i64 o_m, i64 o_n, const T* a, i64 a_b, i64 a_m, const unsigned char* b, i64 b_b, i64 b_n,  \
        const float* bs, i64 bs_b, i64 bs_n, i64 bs_k, int m, int n, int k, int wk, float* part, i64 part_s,      \
        int splits, int gps) {                                                                                   \
        fp8mm::gemv<T, TT>(out, o_b, o_m, o_n, a, a_b, a_m, b, b_b, b_n, bs, bs_b, bs_n, bs_k, m, n, k, wk, part,  \
                           part_s, splits, gps);                                                                 \
    }
#define VT_FP8_GEMV_ALL(S, T) VT_FP8_GEMV(S, T, 1) VT_FP8_GEMV(S, T, 2) VT_FP8_GEMV(S, T, 4)
VT_FP8_GEMV_ALL(bf16, bf16)
VT_FP8_GEMV_ALL(f16, f16)
