// The skinny (decode-shaped) GEMM: out[g, m, n] = sum_k A[g, m, k] W[g, n, k] for few tokens
// M (1..128) and a weight streamed once, in the "swap AB" form: the weight's rows are the
// MMA's M side (16 rows a warp), the tokens its N side (8 a fragment). Host side:
// crates/vt-cuda/src/skinny_gemm.rs (planning), called by crates/vt-cuda/src/matmul.rs
// (MatmulBT / BatchedMatmul, 16-bit weights) and crates/vt-cuda/src/fp8_matmul.rs
// (MatmulBTFp8 / BatchedMatmulFp8 weight-only: e4m3 weights with 128 x 128 f32 block scales).
//
// - Weights: K-contiguous rows (16-byte aligned), 16-bit (`w16`) or e4m3 codes (`w8`).
// - A CTA is 4 warps = 64 weight rows x 8 NT tokens x a range of 128-wide K chunks (its K
//   split). Each chunk's weights (each lane copies, and later reads back, only its own
//   16-byte pieces) and the CTA's activations for the chunk go through a STAGES-deep cp.async
//   ring in shared memory (4; 3 at 64 tokens a CTA, 6 for fp8 at up to 16), so that
//   STAGES - 1 chunks of weights are in flight per warp.
//   A CTA of c < STAGES chunks touches only stages 0..c-1: the host allocates those only.
// - K is permuted inside each 32-element (w16) or 64-element (w8) step so that a lane's 16
//   consecutive weight bytes and its consecutive activations are exactly its mma.sync
//   m16n8k16 fragments (the same permutation on both operands leaves the sum unchanged).
// - w8: the codes are converted to the activations' 16-bit type in registers (exact: every
//   e4m3 value is a bf16 / f16 value), each 128-wide K group's products are summed in fresh
//   f32 accumulators and then multiplied by the group's scale (the promotion of
//   fp8_matmul.cu's kernels), so each output is sum_kb s(n, kb) * sum_{k in kb} q(n, k) a(m, k).
// - Split K: with splits > 1 every CTA of a tile writes its f32 sums to `part` (a slice per
//   split), then bumps the tile's counter; the last CTA to arrive adds the slices in split
//   order 0, 1, .. (deterministic: the result does not depend on which CTA is last), writes
//   `out` and resets the counter to 0 for the next launch. One launch, no second kernel.
// - Grid: x = token block (fastest, so the CTAs that share a weight tile run together and the
//   second one reads it from L2), y = 64-row block, z = batch entry * splits + split.
// - sm_90, fp8 weights at up to 32 tokens: `gemm_w8_tma` at the end of the file, the same tile
//   fed through the TMA by a producer warp (the host chooses: skinny_gemm.rs, `plan`).
#include "common.cuh"
#include "e4m3.cuh"
#include "tensor_core.cuh"

namespace skinny {

using namespace vt::tc;

constexpr int WARPS = 4, THREADS = 32 * WARPS, ROWS = 16 * WARPS, CHUNK = 128;
// What a ring stage load copies.
constexpr int LOAD_W = 1, LOAD_A = 2;
// Ring depth: 4 stages; 3 for 64 tokens (so that two CTAs fit an SM); 6 for fp8 weights at up
// to 16 tokens (their 2 KB a warp per stage would otherwise keep only 384 bytes of each
// weight row in flight).
template <int W8, int NT> __host__ __device__ constexpr int stages_of() {
    return NT >= 8 ? 3 : (W8 && NT <= 2) ? 6 : 4;
}

// Activation rows in shared memory: 128 elements (256 bytes) + padding chosen so that the
// 8-lane phases of the 16-byte loads hit distinct banks (w16: consecutive tokens 64 bytes
// apart mod 128; w8: an odd number of 16-byte units apart; w16n: 4 banks apart, for the
// 32-bit fragment reads and ldmatrix alike).
// Weight kinds: W16 K-contiguous 16-bit rows, W8 K-contiguous e4m3 rows, W16N 16-bit
// N-contiguous (w[g, k, n] with stride 1 along n: the absorbed W_UK_T / W_UV as the block
// keeps them in 16 bits).
constexpr int W16 = 0, W8 = 1, W16N = 2;
template <int KIND> struct Layout {
    static constexpr int ASTR = KIND == W16 ? 320 : 272;
    // 16-byte weight pieces per lane per chunk: w16 4 steps x 2 rows; w8 2 steps x 2 rows;
    // w16n 128 k-rows x 2 halves of 16 bytes per warp.
    static constexpr int PIECES = KIND == W8 ? 4 : 8;
    static constexpr int WBYTES = WARPS * PIECES * 32 * 16;
};

template <int KIND, int NT> __host__ __device__ constexpr int stage_bytes() {
    return Layout<KIND>::WBYTES + 8 * NT * Layout<KIND>::ASTR;
}

// A 16-byte weight piece global -> shared, asking the L2 for the whole 256-byte segment: a
// chunk reads 128 (fp8) or 256 (16-bit) bytes of each weight row, so the row's next bytes are
// in L2 when the next chunk asks (H200: 16-bit rows 5-11% faster at M <= 8, fp8 within 2%;
// docs/perf.md "Fourteenth session").
__device__ __forceinline__ void cp_async16_w(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

using vt::e4m3x2;  // the fp8 weight form (e4m3.cuh)
using vt::word;

// Zeroes a register array of sums (fully unrolled: the indices stay compile-time).
template <int A, int B> __device__ __forceinline__ void zero(float (&x)[A][B][4]) {
#pragma unroll
    for (int a = 0; a < A; ++a)
#pragma unroll
        for (int b = 0; b < B; ++b)
#pragma unroll
            for (int q = 0; q < 4; ++q) x[a][b][q] = 0.0f;
}

// One 64-code step of the fp8 weight form: the lane's 16 weight bytes of rows g (w0) and g + 8
// (w1) converted to T pairs (its A fragments) and multiplied by its activations of each token
// fragment j (x0: k 0..7 of its 16, x1: 8..15), into the RW sets of group sums round robin
// from set sb (consecutive MMAs to different sets: mma.sync issues in order).
template <typename T, int NT, int RW>
__device__ __forceinline__ void w8_step(float (&tmp)[RW][NT][4], const uint4& w0, const uint4& w1, const uint4 (&x0)[NT],
                                        const uint4 (&x1)[NT], int sb) {
    uint32_t fa[4][4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const uint32_t r0 = word(w0, q), r1 = word(w1, q);
        fa[q][0] = e4m3x2<T>(r0, false);
        fa[q][1] = e4m3x2<T>(r1, false);
        fa[q][2] = e4m3x2<T>(r0, true);
        fa[q][3] = e4m3x2<T>(r1, true);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) MmaSync<T>::run(tmp[sb % RW][j], fa[0], x0[j].x, x0[j].y);
#pragma unroll
    for (int j = 0; j < NT; ++j) MmaSync<T>::run(tmp[(sb + 1) % RW][j], fa[1], x0[j].z, x0[j].w);
#pragma unroll
    for (int j = 0; j < NT; ++j) MmaSync<T>::run(tmp[(sb + 2) % RW][j], fa[2], x1[j].x, x1[j].y);
#pragma unroll
    for (int j = 0; j < NT; ++j) MmaSync<T>::run(tmp[(sb + 3) % RW][j], fa[3], x1[j].z, x1[j].w);
}

// A 128-group's sums (the RW sets added in a fixed order) times its block scale, into acc.
template <int NT, int RW>
__device__ __forceinline__ void w8_scale_add(float (&acc)[NT][4], const float (&tmp)[RW][NT][4], float sc) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            float sum = tmp[0][j][q];
#pragma unroll
            for (int r = 1; r < RW; ++r) sum += tmp[r][j][q];
            acc[j][q] = fmaf(sum, sc, acc[j][q]);
        }
}

// The end of a CTA's tile, for the THREADS threads that hold its sums (acc: token fragment j,
// rows n0 + g (+ 8), tokens m0 + 8 j + 2 t (+ 1)). Split K: every CTA of the tile writes its f32
// sums to `part` (a slice per split), then bumps the tile's counter; the last CTA to arrive adds
// the slices in split order 0, 1, .. (deterministic: the result does not depend on which CTA is
// last), writes `out` and resets the counter to 0 for the next launch. Its barriers are named
// (1, THREADS): a kernel's other threads (a producer warp) need not be there.
template <typename T, int NT>
__device__ __forceinline__ void finish(float (&acc)[NT][4], T* out, i64 o_b, i64 o_m, i64 o_n, i64 batch, int n0,
                                       int m0, int n, int m, int split, int splits, float* part, unsigned* counters) {
    __shared__ int s_last;
    const int tid = threadIdx.x, g = (tid & 31) >> 2, t = tid & 3;
    if (splits > 1) {
        // This CTA's sums, a float4 per (thread, token group), a contiguous slice per split.
        const i64 tile = ((i64)batch * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
        float4* mine = reinterpret_cast<float4*>(part) + (tile * splits + split) * (THREADS * NT) + tid * NT;
#pragma unroll
        for (int j = 0; j < NT; ++j) mine[j] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        __threadfence();
        bar_sync(1, THREADS);
        if (tid == 0) {
            const unsigned old = atomicAdd(counters + tile, 1u);
            const int last = old == (unsigned)(splits - 1);
            if (last) counters[tile] = 0;  // every split has arrived: ready for the next launch
            s_last = last;
        }
        bar_sync(1, THREADS);
        if (!s_last) return;
        __threadfence();
        const float4* all = reinterpret_cast<const float4*>(part) + tile * splits * (THREADS * NT) + tid * NT;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int s = 0; s < splits; ++s) {
                const float4 v = s == split ? make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3])
                                            : __ldcg(all + (i64)s * (THREADS * NT) + j);
                sum.x += v.x;
                sum.y += v.y;
                sum.z += v.z;
                sum.w += v.w;
            }
            acc[j][0] = sum.x;
            acc[j][1] = sum.y;
            acc[j][2] = sum.z;
            acc[j][3] = sum.w;
        }
    }
    if (n0 >= n) return;
    T* ob = out + batch * o_b;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = n0 + g + 8 * (i >> 1), tok = m0 + 8 * j + 2 * t + (i & 1);
            if (row < n && tok < m) ob[(i64)tok * o_m + (i64)row * o_n] = vt::from_f32<T>(acc[j][i]);
        }
}

// Arguments: out[g, m, n] (strides o_b, o_m, o_n), a[g, m, k] (a_b, a_m; k stride 1),
// w (w_b; w_r the row stride: along n for W16 / W8 rows of K, along k for W16N rows of N;
// T or e4m3 bytes), ws[g, n / 128, k / 128] (W8 only), `cpb` 128-chunks of K per split,
// `part` / `counters` the split-K workspace (splits > 1).
// Requirements (host): K % 8 == 0 (W8: K % 16 == 0; W16N: N % 8 == 0 too); rows and bases
// 16-byte aligned.
template <typename T, int KIND, int NT>
__device__ void gemm(T* out, i64 o_b, i64 o_m, i64 o_n, const T* a, i64 a_b, i64 a_m, const void* wv, i64 w_b,
                     i64 w_r, const float* ws, i64 ws_b, i64 ws_n, i64 ws_k, int m, int n, int k, int cpb,
                     int splits, float* part, unsigned* counters) {
    using L = Layout<KIND>;
    constexpr bool W8K = KIND == W8;
    constexpr int TOK = 8 * NT, SB = stage_bytes<KIND, NT>(), STAGES = stages_of<KIND == W8, NT>();
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t base = smem_u32(smem);
    // The next kernel on the stream may launch (dependent) once this grid's last CTAs run:
    // it only prefetches its weights until this grid completes.
    vt::grid_dep_launch();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const i64 batch = blockIdx.z / splits;
    const int split = blockIdx.z % splits;
    const int m0 = blockIdx.x * TOK, n0 = blockIdx.y * ROWS + warp * 16;
    const int chunks = (k + CHUNK - 1) / CHUNK;
    const int c_lo = split * cpb, c_hi = min(chunks, c_lo + cpb), nck = max(0, c_hi - c_lo);
    const int es = W8K ? 1 : 2;
    const unsigned char* w = reinterpret_cast<const unsigned char*>(wv) + batch * w_b * es;
    const T* ab = a + batch * a_b;
    // This lane's two weight rows (clamped to a valid row: out-of-range rows copy zeros).
    const bool r0ok = n0 + g < n, r1ok = n0 + g + 8 < n;
    const unsigned char* wr0 = w + (i64)min(n0 + g, n - 1) * w_r * es;
    const unsigned char* wr1 = w + (i64)min(n0 + g + 8, n - 1) * w_r * es;
    // W16N: this warp's 16 columns n0.. (two halves of 8, each in or out: N % 8 == 0).
    const unsigned char* wcol = w + (i64)min(n0, n - 1) * 2;
    const uint32_t wbase = warp * L::PIECES * 32 * 16;

    // `what`: LOAD_W (the chunk's weights), LOAD_A (its activations) or both.
    auto load = [&](int c, int st, int what) {
        const uint32_t sw = base + st * SB, sa = sw + L::WBYTES + 0;
        const int kc = c * CHUNK;
        if (what & LOAD_W) {
#pragma unroll
            for (int p = 0; p < L::PIECES; ++p) {
                if constexpr (KIND == W16N) {
                    // Piece id = 32 p + lane: k-row id / 2 of the chunk, half id % 2 (8 columns),
                    // stored at row * 32 + (half ^ bit 2 of the row) * 16 (conflict-free ldmatrix).
                    const int id = 32 * p + lane, kr = id >> 1, hf = id & 1;
                    const bool ok = n0 + 8 * hf < n && kc + kr < k;
                    const unsigned char* src = wcol + (ok ? (i64)(kc + kr) * w_r * 2 + 16 * hf : 0);
                    cp_async16(sw + wbase + kr * 32 + ((hf ^ ((kr >> 2) & 1)) << 4), src, ok);
                } else {
                    // w16: piece p = 2 s + h: step s (32 elements), row g + 8 h, elements 32 s + 8 t.
                    // w8: piece p = 2 s + h: step s (64 codes), row g + 8 h, codes 64 s + 16 t.
                    const int s = p >> 1, h = p & 1;
                    const int kk = W8K ? kc + 64 * s + 16 * t : kc + 32 * s + 8 * t;
                    const bool ok = (h ? r1ok : r0ok) && kk < k;
                    const unsigned char* src = (h ? wr1 : wr0) + (ok ? (i64)kk * es : 0);
                    cp_async16_w(sw + wbase + (p * 32 + lane) * 16, src, ok);
                }
            }
        }
        // Activations: TOK rows x 16 pieces of 8 elements.
        if (what & LOAD_A) {
            for (int i = tid; i < TOK * 16; i += THREADS) {
                const int r = i >> 4, cc = i & 15, tok = m0 + r, kk = kc + 8 * cc;
                const bool ok = tok < m && kk < k;
                const T* src = ok ? ab + (i64)tok * a_m + kk : ab;
                cp_async16(sa + r * L::ASTR + cc * 16, src, ok);
            }
        }
    };

    // Chunks wholly inside K (all but a tail chunk) of K-contiguous weights take this path:
    // no bounds checks, pointers advanced by the chunk (its loads are most of the loop's
    // integer work otherwise). Weight rows past n read the clamped row n - 1 and token rows
    // past m are not loaded at all: either only feeds outputs that are never stored (an MMA
    // output (row, token) reads only that row's weights and that token's activations).
    // A tail chunk goes through `load`, which zero-fills past K (0 x garbage could be NaN).
    const int ar = tid >> 4, ac = tid & 15;  // activation piece u: token row ar + 8 u, piece ac
    const unsigned char* wl0 = wr0 + 16 * t;  // piece 2 s + h: row h, bytes 64 s + 16 t
    const unsigned char* wl1 = wr1 + 16 * t;
    const T* al = ab + (i64)min(m0 + ar, m - 1) * a_m + 8 * ac;
    const i64 a8 = 8 * a_m;
    unsigned aval = 0;  // bit u: token row ar + 8 u exists
#pragma unroll
    for (int u = 0; u < NT; ++u) aval |= (m0 + ar + 8 * u < m ? 1u : 0u) << u;
    auto load_full = [&](int c, int st, int what) {
        const uint32_t sw = base + st * SB + wbase + lane * 16;
        const uint32_t sa = base + st * SB + L::WBYTES + ar * L::ASTR + ac * 16;
        const i64 kb = (i64)c * CHUNK * es;
        const unsigned char* p0 = wl0 + kb;
        const unsigned char* p1 = wl1 + kb;
        if (what & LOAD_W) {
#pragma unroll
            for (int p = 0; p < L::PIECES; ++p)
                cp_async16_w(sw + p * 32 * 16, ((p & 1) ? p1 : p0) + 64 * (p >> 1), true);
        }
        const T* ap = al + (i64)c * CHUNK;
        if (what & LOAD_A) {
#pragma unroll
            for (int u = 0; u < NT; ++u)
                if ((aval >> u) & 1u) cp_async16(sa + u * 8 * L::ASTR, ap + u * a8, true);
        }
    };
    auto load_any = [&](int c, int st, int what) {
        if (KIND != W16N && (i64)(c + 1) * CHUNK <= k)
            load_full(c, st, what);
        else
            load(c, st, what);
    };

    // R independent accumulator sets (R x NT = 8 accumulators): consecutive MMAs go to
    // different accumulators, so the in-order issue never waits on the previous MMA's result
    // (mma.sync is volatile asm: it issues in program order). W16 / W16N add straight into
    // them; W8 sums each 128-group in fresh `tmp` sets and adds them, scaled, into acc[0].
    constexpr int R = NT >= 8 ? 1 : 8 / NT;
    float acc[R][NT][4];
    zero(acc);
    const float* wsr = W8K && n0 < n ? ws + batch * ws_b + (i64)(n0 >> 7) * ws_n : nullptr;
    // W8: the scale of the chunk computed next, loaded one iteration ahead (off the path).
    const float* wsp = wsr != nullptr ? wsr + (i64)c_lo * ws_k : nullptr;
    float sc_next = wsp != nullptr && nck > 0 ? *wsp : 0.0f;

    // Dependent launch (VT_PDL): the weights (and their scales, above) do not depend on the
    // previous kernel, so the first stages' weights are requested before waiting for it; the
    // activations, the partials and the output only after. The first group holds all those
    // weights and stage 0's activations (iteration 0 waits for them all: a small over-wait).
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i)
        if (i < nck) load_any(c_lo + i, i, LOAD_W);
    vt::grid_dep_wait();
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        if (i < nck) load_any(c_lo + i, i, LOAD_A);
        cp_async_commit();
    }
    for (int i = 0; i < nck; ++i) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        // The stage refilled here was read in iteration i - 1, which every warp has left.
        if (i + STAGES - 1 < nck) load_any(c_lo + i + STAGES - 1, (i + STAGES - 1) % STAGES, LOAD_W | LOAD_A);
        cp_async_commit();
        const int st = i % STAGES;
        const float sc = sc_next;  // W8 only
        (void)sc;
        if (W8K && wsp != nullptr && i + 1 < nck) {
            wsp += ws_k;
            sc_next = *wsp;
        }
        const uint32_t sw = base + st * SB + wbase + lane * 16;
        const uint32_t sa = base + st * SB + L::WBYTES + g * L::ASTR;
        // Each step's fragments are read (all of them, back to back) one step ahead of its
        // MMAs, so the shared-memory latency overlaps the previous step's MMAs (the loads and
        // MMAs are volatile asm: they issue in this order).
        if constexpr (KIND == W16N) {
            // A fragments by ldmatrix.trans from the [k][16 n] tile: matrix lane / 8 is
            // (k half lane / 16, n half (lane / 8) % 2); B fragments by ldmatrix from the
            // activation rows: matrix lane / 8 covers k 8 (lane / 8) .. of the 32-wide step.
            const uint32_t wt = base + st * SB + wbase;
            const uint32_t xa = base + st * SB + L::WBYTES + (lane & 7) * L::ASTR + 16 * (lane >> 3);
            uint32_t fa[2][2][4], fb[2][NT][4];
#pragma unroll
            for (int s = 0; s <= 4; ++s) {
                if (s < 4) {
                    const int bf = s & 1;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int kr = 32 * s + 16 * h + 8 * (lane >> 4) + (lane & 7), hf = (lane >> 3) & 1;
                        ldsm_x4_t(wt + kr * 32 + ((hf ^ ((kr >> 2) & 1)) << 4), fa[bf][h]);
                    }
#pragma unroll
                    for (int j = 0; j < NT; ++j) ldsm_x4(xa + j * 8 * L::ASTR + 64 * s, fb[bf][j]);
                }
                if (s > 0) {
                    const int bf = (s - 1) & 1;
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int j = 0; j < NT; ++j)
                            MmaSync<T>::run(acc[(2 * (s - 1) + h) % R][j], fa[bf][h], fb[bf][j][2 * h],
                                            fb[bf][j][2 * h + 1]);
                }
            }
        } else if constexpr (KIND == W16) {
            uint4 w0[2], w1[2], x[2][NT];
#pragma unroll
            for (int s = 0; s <= 4; ++s) {
                if (s < 4) {
                    const int bf = s & 1;
                    w0[bf] = lds128(sw + (2 * s) * 512);
                    w1[bf] = lds128(sw + (2 * s + 1) * 512);
#pragma unroll
                    for (int j = 0; j < NT; ++j) x[bf][j] = lds128(sa + j * 8 * L::ASTR + 64 * s + 16 * t);
                }
                if (s > 0) {
                    const int bf = (s - 1) & 1;
                    const uint32_t f0[4] = {w0[bf].x, w1[bf].x, w0[bf].y, w1[bf].y};
                    const uint32_t f1[4] = {w0[bf].z, w1[bf].z, w0[bf].w, w1[bf].w};
                    const int r0 = (2 * (s - 1)) % R, r1 = (2 * (s - 1) + 1) % R;
#pragma unroll
                    for (int j = 0; j < NT; ++j) MmaSync<T>::run(acc[r0][j], f0, x[bf][j].x, x[bf][j].y);
#pragma unroll
                    for (int j = 0; j < NT; ++j) MmaSync<T>::run(acc[r1][j], f1, x[bf][j].z, x[bf][j].w);
                }
            }
        } else {
            // RW sets of per-group sums (RW x NT = 4 chains of MMAs; ptxas starts each from
            // zero with RZ as the first MMA's addend, so the zeroing costs nothing).
            constexpr int RW = NT >= 4 ? 1 : 4 / NT;
            float tmp[RW][NT][4];
            zero(tmp);
            // Two steps of 64 codes; the fragments double-buffered up to 16 tokens (at 32 and 64
            // the second buffer would not fit the registers: each step's reads still go back
            // to back before its MMAs).
            constexpr int NB = NT <= 2 ? 2 : 1, PD = NB - 1;
            uint4 w0[NB], w1[NB], x0[NB][NT], x1[NB][NT];
#pragma unroll
            for (int s = 0; s < 2 + PD; ++s) {
                if (s < 2) {
                    const int bf = s % NB;
                    w0[bf] = lds128(sw + (2 * s) * 512);
                    w1[bf] = lds128(sw + (2 * s + 1) * 512);
#pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        const uint32_t xa = sa + j * 8 * L::ASTR + 128 * s + 32 * t;
                        x0[bf][j] = lds128(xa);
                        x1[bf][j] = lds128(xa + 16);
                    }
                }
                if (s >= PD) {
                    const int bf = (s - PD) % NB;
                    w8_step<T, NT, RW>(tmp, w0[bf], w1[bf], x0[bf], x1[bf], 4 * (s - PD));
                }
            }
            w8_scale_add<NT, RW>(acc[0], tmp, sc);
        }
    }
    cp_async_wait<0>();
    // The accumulator sets, added in a fixed order (W8 uses set 0 only).
#pragma unroll
    for (int r = 1; r < (W8K ? 1 : R); ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[0][j][i] += acc[r][j][i];

    finish<T, NT>(acc[0], out, o_b, o_m, o_n, batch, n0, m0, n, m, split, splits, part, counters);
}


// ------------------------------------------------------------ fp8 weights through the TMA (sm_90)
//
// The fp8 weight-only form at up to 32 tokens (NT 1, 2, 4) on sm_90, taken by the host where K
// has 8+ chunks (skinny_gemm.rs, `TMA_MIN_CHUNKS`): the same tile, fragments and epilogue as
// `gemm<T, W8, NT>`, but the chunks arrive by the TMA. A fifth warp (one lane) keeps a ring of
// chunks in flight (`tma_stages`: 7 / 6 / 4; the `_shallow_` kernels a shallower depth the host
// plans, so that more CTAs an SM hold a grid of more K splits in one wave): per chunk one
// 64-row x 128-byte box of the weight (rows past N and codes past K read as zeros) and two
// 64-element x 8 NT-token boxes of the activations (tokens past M zeros), all 128-byte
// swizzled, completing on the stage's `full` mbarrier; the four compute warps read their
// fragments, then arrive on the stage's `empty` mbarrier (every thread), which the producer
// waits for before refilling the stage. No block barrier and no per-lane copy address in the
// loop (the cp.async form waits on both each chunk).
// Dynamic shared memory (1024-aligned base): one stage of 8 KB of weights + 2 x 1 KB NT of
// activations per ring slot; a CTA of c chunks, fewer than its ring, touches only stages
// 0..c-1, and the host allocates min(ring, chunks a CTA) stages (`tma_smem`). The mbarriers are
// static, sized for the deepest ring.
struct Maps {
    TmaMap w;  // [G][N][K] bytes, boxes 128 x 64 x 1
    TmaMap a;  // [G][M][K] T, boxes 64 x 8 NT x 1
};

template <int NT> __host__ __device__ constexpr int tma_stages() { return NT == 1 ? 7 : NT == 2 ? 6 : 4; }
template <int NT> __host__ __device__ constexpr int tma_stage_bytes() { return ROWS * CHUNK + 2 * 8 * NT * 128; }
template <int NT> __host__ __device__ constexpr int tma_smem(int chunks) {
    return 1024 + (chunks < tma_stages<NT>() ? chunks : tma_stages<NT>()) * tma_stage_bytes<NT>();
}

template <typename T, int NT, bool SHALLOW>
__device__ void gemm_w8_tma(const Maps& maps, T* out, i64 o_b, i64 o_m, i64 o_n, const float* ws, i64 ws_b, i64 ws_n,
                            i64 ws_k, int m, int n, int k, int cpb, int splits, float* part, unsigned* counters,
                            int depth) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int MAX_STAGES = tma_stages<NT>(), SB = tma_stage_bytes<NT>(), ABOX = 8 * NT * 128;
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long tma_bars[2 * MAX_STAGES];
    // SHALLOW (`skinny_w8tma_shallow_*`, launched only where the host's ring wraps at fewer
    // stages than the deepest): the ring depth is the host's `depth` (its shared memory holds
    // that many stages; kept inside the barriers' array whatever it passes), stage and phase
    // run as counters. Else the deepest ring, a constant, stage and phase from the chunk index
    // (and `depth` unused): the counters cost registers (NT 4: 128 -> 134, a CTA an SM fewer,
    // q_b at 32 tokens 20% slower; NT 1: 62 -> 70, a_proj and q_b 2-4% slower; H100,
    // twenty-fifth session).
    constexpr bool FIXED = !SHALLOW;
    const int STAGES = FIXED ? MAX_STAGES : min(max(depth, 1), MAX_STAGES);
    const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
    const uint32_t bars = smem_u32(tma_bars);
    auto full = [&](int st) { return bars + 8 * st; };
    auto empty = [&](int st) { return bars + 8 * (MAX_STAGES + st); };
    vt::grid_dep_launch();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const i64 batch = blockIdx.z / splits;
    const int split = blockIdx.z % splits;
    const int m0 = blockIdx.x * 8 * NT, nb0 = blockIdx.y * ROWS, n0 = nb0 + warp * 16;
    const int chunks = (k + CHUNK - 1) / CHUNK;
    const int c_lo = split * cpb, nck = max(0, min(chunks, c_lo + cpb) - c_lo);
    if (tid == 0) {
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(full(st), 1);         // the producer's expect_tx arrival, then the bytes
            mbar_init(empty(st), THREADS);  // every compute thread
        }
    }
    __syncthreads();
    if (warp == WARPS) {
        if (lane != 0) return;
        prefetch_map(&maps.w);
        prefetch_map(&maps.a);
        auto issue = [&](int i, int st, bool w, bool a) {
            const int kc = (c_lo + i) * CHUNK;
            const uint32_t sw = base + st * SB;
            if (w) tma_load_3d(sw, &maps.w, kc, nb0, (int)batch, full(st));
            if (a) {
                tma_load_3d(sw + ROWS * CHUNK, &maps.a, kc, m0, (int)batch, full(st));
                tma_load_3d(sw + ROWS * CHUNK + ABOX, &maps.a, kc + 64, m0, (int)batch, full(st));
            }
        };
        // Dependent launch (VT_PDL): the first stages' weights before waiting for the previous
        // kernel, their activations after (each stage's barrier expects both from the start).
        const int first = min(STAGES, nck);
        for (int i = 0; i < first; ++i) {
            mbar_expect_tx(full(i), SB);
            issue(i, i, true, false);
        }
        vt::grid_dep_wait();
        for (int i = 0; i < first; ++i) issue(i, i, false, true);
        // Stage and phase as counters for a run-time depth (no division a chunk).
        for (int i = STAGES, st = 0, ph = 0; i < nck; ++i) {
            if (FIXED) st = i % MAX_STAGES, ph = (i / MAX_STAGES - 1) & 1;
            mbar_wait(empty(st), ph);
            mbar_expect_tx(full(st), SB);
            issue(i, st, true, true);
            if (!FIXED && ++st == STAGES) st = 0, ph ^= 1;
        }
        return;
    }
    // The compute warps write the output and the split-K workspace: after the previous kernel.
    vt::grid_dep_wait();
    const int g = lane >> 2, t = lane & 3;
    constexpr int RW = 4 / NT;
    float acc[1][NT][4];
    zero(acc);
    // This warp's rows' block scales (null past N; SHALLOW: advanced a chunk at a time, which
    // keeps its counters' registers down).
    const float* wsr = n0 < n ? ws + batch * ws_b + (i64)(n0 >> 7) * ws_n + (i64)c_lo * ws_k : nullptr;
    // Swizzled offsets (16-byte unit u of row r at r * 128 + (u ^ r % 8) * 16; here r % 8 == g):
    // weight piece 2 s + h is row 16 warp + g + 8 h, unit 4 s + t; activation half s of token
    // 8 j + g, units 2 t (k 0..7 of the lane's 16) and 2 t + 1.
    const uint32_t wrow = (warp * 16 + g) * 128, arow = g * 128;
    for (int i = 0, st = 0, ph = 0; i < nck; ++i) {
        if (FIXED) st = i % MAX_STAGES, ph = (i / MAX_STAGES) & 1;
        const float sc = wsr == nullptr ? 0.0f : FIXED ? wsr[(i64)i * ws_k] : *wsr;
        if (!FIXED && wsr != nullptr) wsr += ws_k;
        mbar_wait(full(st), ph);
        const uint32_t sw = base + st * SB, sa = sw + ROWS * CHUNK;
        uint4 w[2][2], x0[2][NT], x1[2][NT];
#pragma unroll
        for (int s = 0; s < 2; ++s) {
#pragma unroll
            for (int h = 0; h < 2; ++h) w[s][h] = lds128(sw + wrow + h * 8 * 128 + (((4 * s + t) ^ g) << 4));
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const uint32_t ra = sa + s * ABOX + j * 8 * 128 + arow;
                x0[s][j] = lds128(ra + (((2 * t) ^ g) << 4));
                x1[s][j] = lds128(ra + (((2 * t + 1) ^ g) << 4));
            }
        }
        mbar_arrive(empty(st));
        float tmp[RW][NT][4];
        zero(tmp);
#pragma unroll
        for (int s = 0; s < 2; ++s) w8_step<T, NT, RW>(tmp, w[s][0], w[s][1], x0[s], x1[s], 4 * s);
        w8_scale_add<NT, RW>(acc[0], tmp, sc);
        if (!FIXED && ++st == STAGES) st = 0, ph ^= 1;
    }
    finish<T, NT>(acc[0], out, o_b, o_m, o_n, batch, n0, m0, n, m, split, splits, part, counters);
#endif
}

}  // namespace skinny

#define VT_SKINNY(S, T, W, KIND, NT)                                                                             \
    extern "C" __global__ void __launch_bounds__(skinny::THREADS) skinny_##W##_t##NT##_##S(                      \
        T* out, i64 o_b, i64 o_m, i64 o_n, const T* a, i64 a_b, i64 a_m, const void* w, i64 w_b, i64 w_r,         \
        const float* ws, i64 ws_b, i64 ws_n, i64 ws_k, int m, int n, int k, int cpb, int splits, float* part,     \
        unsigned* counters) {                                                                                    \
        skinny::gemm<T, KIND, NT>(out, o_b, o_m, o_n, a, a_b, a_m, w, w_b, w_r, ws, ws_b, ws_n, ws_k, m, n, k,    \
                                  cpb, splits, part, counters);                                                  \
    }
#define VT_SKINNY_NT(S, T, W, KIND)                                                                 \
    VT_SKINNY(S, T, W, KIND, 1) VT_SKINNY(S, T, W, KIND, 2) VT_SKINNY(S, T, W, KIND, 4) VT_SKINNY(S, T, W, KIND, 8)
VT_SKINNY_NT(bf16, bf16, w16, skinny::W16)
VT_SKINNY_NT(f16, f16, w16, skinny::W16)
VT_SKINNY_NT(bf16, bf16, w8, skinny::W8)
VT_SKINNY_NT(f16, f16, w8, skinny::W8)
VT_SKINNY_NT(bf16, bf16, w16n, skinny::W16N)
VT_SKINNY_NT(f16, f16, w16n, skinny::W16N)

// The TMA form: THREADS compute threads + one producer warp; the deepest ring, and at NT 1 / 2
// the shallower planned ring (`_shallow_`).
#define VT_SKINNY_TMA_FORM(S, T, NT, NAME, SHALLOW)                                                            \
    extern "C" __global__ void __launch_bounds__(skinny::THREADS + 32) NAME##_t##NT##_##S(                      \
        const __grid_constant__ skinny::Maps maps, T* out, i64 o_b, i64 o_m, i64 o_n, const float* ws, i64 ws_b,  \
        i64 ws_n, i64 ws_k, int m, int n, int k, int cpb, int splits, float* part, unsigned* counters,            \
        int depth) {                                                                                              \
        skinny::gemm_w8_tma<T, NT, SHALLOW>(maps, out, o_b, o_m, o_n, ws, ws_b, ws_n, ws_k, m, n, k, cpb, splits, \
                                            part, counters, depth);                                              \
    }
#define VT_SKINNY_TMA(S, T, NT) VT_SKINNY_TMA_FORM(S, T, NT, skinny_w8tma, false)
#define VT_SKINNY_TMA_SHALLOW(S, T, NT) VT_SKINNY_TMA_FORM(S, T, NT, skinny_w8tma_shallow, true)
VT_SKINNY_TMA(bf16, bf16, 1)
VT_SKINNY_TMA(bf16, bf16, 2)
VT_SKINNY_TMA(f16, f16, 1)
VT_SKINNY_TMA(f16, f16, 2)
VT_SKINNY_TMA(bf16, bf16, 4)
VT_SKINNY_TMA(f16, f16, 4)
VT_SKINNY_TMA_SHALLOW(bf16, bf16, 1)
VT_SKINNY_TMA_SHALLOW(bf16, bf16, 2)
VT_SKINNY_TMA_SHALLOW(f16, f16, 1)
VT_SKINNY_TMA_SHALLOW(f16, f16, 2)
