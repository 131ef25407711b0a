// MlaDecodeAttention, the wgmma kernel (sm_90a only: compiled when __CUDA_ARCH_FEAT_SM90_ALL
// is defined): mla_decode_wgmma_{bf16,f16} (KV tiles by cp.async) and
// mla_decode_wgmma_tma_{bf16,f16} (KV tiles by the tensor memory accelerator, block sizes
// that are multiples of 64). D = 576, Dv = 512, WGMMA_ROWS (64) query rows per CTA, two
// 72 KB KV stages, two warpgroups with separate roles. Planned by
// crates/vt-cuda/src/mla_decode_attention/wgmma_sm90.rs. Part of mla_decode_attention.cu.
//
// Warpgroup 0 (consumer): S = Q K^T with 36 wgmma m64n64k16 (Q and K from the swizzled
// tiles, K-major), the online softmax on its registers (a row lives in one quad), P
// (16-bit) and the row rescale factors into shared memory, then O[:, 0:256] += P V.
// Warpgroup 1 (producer): all cp.async loads (Q, KV tiles) and O[:, 256:512] += P V.
// Both halves: 4 wgmma m64n256k16, V read MN-major in place from the K tile.
//
// Named barriers (arrive by one side, sync by the other) let warpgroup 1's PV and loads
// run while warpgroup 0 computes the next S:
//   K_FULL[t&1]  tile t is in shared memory           WG1 arrives, WG0 syncs
//   P_FULL       P(t) and the rescale factors written  WG0 arrives, WG1 syncs
//   P_FREE       WG1 finished reading P(t)             WG1 arrives, WG0 syncs before P(t+1)
//   V_FREE[t&1]  WG0 finished with tile t's stage      WG0 arrives, WG1 syncs before reloading it
// Warpgroup 1 waits for tile t+1 only after its PV(t): with two 72 KB stages a tile is
// loaded into the stage freed by PV(t-1), and waiting earlier leaves the load no time
// (measured: signalling before PV(t) made every tile wait for a fresh load). Every arrival is
// matched by exactly one sync in each segment, and neither side can arrive on a barrier
// again before the other side synced the previous instance (K_FULL and V_FREE alternate
// by parity: the next arrival on the same id is ordered after a sync on a barrier the
// other side arrives only after consuming), so instances never mix.
#pragma once

#include "mla_decode_attention/tiles.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace mla {

enum : int { WGMMA_ROWS = 64 };  // query rows per CTA (an enumerator: see COMBINE_WARPS)

// Shared-memory layout of the wgmma kernel (byte offsets from a 1024-aligned base).
// Q and every KV tile are NSUB column blocks of [rows x 128 B], swizzled (see swz).
template <int MT> struct Layout {
    static constexpr int STAGES = 2;
    static constexpr int Q_SUB = MT * 128;                     // one column block of Q
    static constexpr int OFF_Q = 0;
    static constexpr int OFF_KV = NSUB * Q_SUB;                 // 1024-aligned (MT % 8 == 0)
    static constexpr int OFF_P = OFF_KV + STAGES * TILE_BYTES;  // P [MT x 64 tokens] bf16/f16
    static constexpr int RED = 128;                             // floats: WC * MT = 8 / (MT / 16) * MT
    static constexpr int OFF_RED = OFF_P + MT * 128;            // float [2][RED]
    static constexpr int OFF_VALID = OFF_RED + 2 * RED * 4;     // u8 [STAGES][BN]: token row exists
    static constexpr int OFF_FLAGS = OFF_VALID + STAGES * BN;   // u8 [STAGES][8]: a warp saw a bad block
    static constexpr int OFF_SCHED = OFF_FLAGS + STAGES * 8;    // int [40]
    static constexpr int OFF_MBAR = OFF_SCHED + 40 * 4;         // u64 [MBARS]: TMA tile landed
    // decode_wgmma uses one a stage, the seesaw kernel one per box (NSUB) and stage.
    static constexpr int MBARS = 2 * NSUB;
    static constexpr int END = OFF_MBAR + MBARS * 8;
    static constexpr int SMEM = END + 1024;                     // slack to align the base
};

// The block holding token tok of KV tile `tile` of segment sg (the first token of a TMA box)
// and the token's row in it: block NB (out of the map: the box reads zeros) past the sequence
// or for a bad block id. (Token and result as here: a token index passed in, or results
// through references, compiled to other code.)
struct BoxBlock {
    int blk, row;
};
__device__ __forceinline__ BoxBlock box_block(const Params& p, const Segment& sg, int tile, int tok) {
    const int j = tile * BN + tok;
    int blk = p.NB, row = 0;
    if (tile < sg.t1 && j < sg.len) {
        const int bi = j / p.BS;
        const int v = __ldg(p.block_table + sg.b * p.bt_sb + bi * p.bt_sm);
        if (v >= 0 && v < p.NB) {
            blk = v;
            row = j - bi * p.BS;
        }
    }
    return {blk, row};
}

// Warp 0 of warpgroup 1 loads KV tile `tile` of segment sg into the stage at dst through the
// TMA: every box of the tile is issued (pages past the sequence or with a bad block id read
// block NB, out of the map: zeros), so the stage's barrier always completes with TILE_BYTES.
// The token flags (valid, flags) are written first and published by the expect_tx arrival.
template <typename T>
__device__ __forceinline__ void tma_tile(const Params& p, const Segment& sg, int tile, uint32_t dst,
                                         unsigned char* valid, unsigned char* flags, uint32_t bar,
                                         const TmaMap* map, int lane) {
    const int R = p.BS < BN ? p.BS : BN;  // rows per box
    bool bad = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int tok = lane + 32 * h, j = tile * BN + tok;
        bool ok = false;
        if (tile < sg.t1 && j < sg.len) {
            const int blk = __ldg(p.block_table + sg.b * p.bt_sb + (j / p.BS) * p.bt_sm);
            ok = blk >= 0 && blk < p.NB;
            bad |= !ok;
        }
        valid[tok] = ok ? 1 : 0;
    }
    const unsigned any_bad = __ballot_sync(0xffffffffu, bad);
    if (lane == 0) *reinterpret_cast<unsigned long long*>(flags) = any_bad != 0u ? 1ull : 0ull;
    __syncwarp();
    if (lane == 0) mbar_expect_tx(bar, TILE_BYTES);
    __syncwarp();
    const int nbox = (BN / R) * NSUB;
    for (int idx = lane; idx < nbox; idx += 32) {
        const int pb = idx / NSUB, cb = idx - pb * NSUB;
        const int j = tile * BN + pb * R;  // first token of the box
        const BoxBlock bb = box_block(p, sg, tile, pb * R);
        const int blk = bb.blk, row = bb.row;
        tma_load_3d(dst + cb * SUB_BYTES + pb * R * 128, map, 64 * cb, row, blk, bar);
    }
}

// K_FULL and V_FREE alternate by tile parity (ids +0 / +1), see below.
constexpr int BAR_K_FULL = 1, BAR_V_FREE = 3, BAR_P_FULL = 5, BAR_P_FREE = 6, BAR_WG0 = 7;
// Warpgroup 1's own barrier (staging its half of O in the epilogue, which starts and ends
// with a block barrier: see decode_wgmma).
constexpr int BAR_WG1 = 10;

// The wgmma instructions used, one macro per shape (m64n64k16 for S = Q K^T, m64n256k16
// with B transposed for O += P V), instantiated per 16-bit type: TY is "bf16" or "f16".
// D is read and written in registers; scale_d = 0 starts a fresh accumulation.
#define VT_ACC8(i) \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define VT_ACC32(i) VT_ACC8(i), VT_ACC8(i + 8), VT_ACC8(i + 16), VT_ACC8(i + 24)

#define VT_WGMMA_M64N64K16(NAME, TY)                                                                    \
    __device__ __forceinline__ void NAME(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {      \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                    \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                        \
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                          \
                     : VT_ACC32(0)                                                                      \
                     : "l"(da), "l"(db), "r"(scale_d));                                                 \
    }
#define VT_WGMMA_M64N256K16_TB(NAME, TY)                                                                \
    __device__ __forceinline__ void NAME(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {     \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                   \
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " "                       \
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"                                       \
                     : VT_ACC32(0), VT_ACC32(32), VT_ACC32(64), VT_ACC32(96)                            \
                     : "l"(da), "l"(db), "r"(scale_d));                                                 \
    }
VT_WGMMA_M64N64K16(wgmma_m64n64k16_bf16, "bf16")
VT_WGMMA_M64N64K16(wgmma_m64n64k16_f16, "f16")
VT_WGMMA_M64N256K16_TB(wgmma_m64n256k16_bf16_tb, "bf16")
VT_WGMMA_M64N256K16_TB(wgmma_m64n256k16_f16_tb, "f16")

// wgmma with A from registers (four 32-bit registers: rows g and g + 8, columns 2 q (+1) and
// 8 + 2 q (+1) of the 64 x 16 A tile, lane = 4 g + q, as an accumulator row pair packs them).
#define VT_WGMMA_M64N64K16_RS(NAME, TY)                                                                 \
    __device__ __forceinline__ void NAME(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int scale_d) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                    \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                        \
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                                                                   \
                     : VT_ACC32(0)                                                                      \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));             \
    }
#define VT_WGMMA_M64N256K16_RS_TB(NAME, TY)                                                             \
    __device__ __forceinline__ void NAME(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {       \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                   \
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " "                       \
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                                                                  \
                     : VT_ACC32(0), VT_ACC32(32), VT_ACC32(64), VT_ACC32(96)                            \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));                  \
    }
VT_WGMMA_M64N64K16_RS(wgmma_m64n64k16_rs_bf16, "bf16")
VT_WGMMA_M64N64K16_RS(wgmma_m64n64k16_rs_f16, "f16")
VT_WGMMA_M64N256K16_RS_TB(wgmma_m64n256k16_rs_bf16_tb, "bf16")
VT_WGMMA_M64N256K16_RS_TB(wgmma_m64n256k16_rs_f16_tb, "f16")

// Wg<T>: the wgmma of one 16-bit type (T is bf16 or f16, the functions' suffix), A from shared
// memory (a descriptor) or from registers (four 32-bit registers, see VT_WGMMA_M64N64K16_RS).
template <typename T> struct Wg;
#define VT_WG(T)                                                                                       \
    template <> struct Wg<T> {                                                                         \
        static __device__ __forceinline__ void qk(float (&d)[32], uint64_t a, uint64_t b, int sc) {    \
            wgmma_m64n64k16_##T(d, a, b, sc);                                                          \
        }                                                                                              \
        static __device__ __forceinline__ void pv(float (&d)[128], uint64_t a, uint64_t b) {           \
            wgmma_m64n256k16_##T##_tb(d, a, b, 1);                                                     \
        }                                                                                              \
        static __device__ __forceinline__ void qk(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int sc) { \
            wgmma_m64n64k16_rs_##T(d, a, b, sc);                                                       \
        }                                                                                              \
        static __device__ __forceinline__ void pv(float (&d)[128], const uint32_t (&a)[4], uint64_t b) { \
            wgmma_m64n256k16_rs_##T##_tb(d, a, b);                                                     \
        }                                                                                              \
    };
VT_WG(bf16)
VT_WG(f16)
#undef VT_WG

// O[:, cols] += P V[:, cols] for one tile: 4 wgmma (A = P, B = V MN-major, in place in the
// K tile; dv: GmmaDesc(first column block, SUB_BYTES, 1024)). N = 128 accumulator registers
// (256 columns).
template <typename T, int N>
__device__ __forceinline__ void pv_tile(float (&o)[N], const GmmaDesc& dp, const GmmaDesc& dv) {
    pin(o);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) Wg<T>::pv(o, dp.at(2 * ks), dv.at(128 * ks));  // +32 B, +2048 B
    wgmma_commit();
    wgmma_wait<0>();
    pin(o);
}

template <int N> __device__ __forceinline__ void rescale(float (&o)[N], float a0, float a1) {
    if (a0 != 1.0f || a1 != 1.0f) {
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            o[4 * i + 0] *= a0;
            o[4 * i + 1] *= a0;
            o[4 * i + 2] *= a1;
            o[4 * i + 3] *= a1;
        }
    }
}

__device__ __forceinline__ void st_shared_f2(uint32_t addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// Row stride (floats) of O staged in shared memory: 512 + 8 keeps a warp's 8-byte stores to
// 8 rows on distinct banks.
constexpr int OSTR = FDV + 8;

// Copies columns col0 .. col0 + 255 of the MT output rows staged in shared memory (f32,
// row stride OSTR) out with 16-byte loads and coalesced stores, scaled by 1 / l (s_fin[r]);
// wtid: the thread's id in its warpgroup. with_lse: also writes lse (from s_fin: row sums,
// then row maxima). Shared by the wgmma kernels' epilogues (this header and
// wgmma_narrow_sm90.cuh).
template <typename T, int MT>
__device__ __forceinline__ void copy_out(const Params& p, const Segment& sg, int row0, const float* so, int col0,
                                         const float* s_fin, int wtid, bool with_lse) {
    constexpr int C4 = 256 / 4;  // 16-byte chunks per row half
#pragma unroll 2
    for (int idx = wtid; idx < MT * C4; idx += 128) {
        const int r = idx / C4, c = col0 + (idx - r * C4) * 4;
        const int row = row0 + r;
        if (row >= p.m_total) continue;
        const float l = s_fin[r];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const float4 v = *reinterpret_cast<const float4*>(so + r * OSTR + c);
        if (sg.whole) {
            const int s = row / p.N, h = row - s * p.N;
            T* out = (T*)p.out + sg.b * p.o_sb + s * p.o_ss + h * p.o_sh + c;
            uint2 w;
            w.x = pack2<T>(v.x * inv, v.y * inv);
            w.y = pack2<T>(v.z * inv, v.w * inv);
            *reinterpret_cast<uint2*>(out) = w;
        } else {
            store_part4(p, sg.slot, row, c, v.x * inv, v.y * inv, v.z * inv, v.w * inv);
        }
    }
    if (with_lse && wtid < MT && row0 + wtid < p.m_total) {
        const float l = s_fin[wtid];
        store_lse<T>(p, sg, row0 + wtid, l > 0.0f ? s_fin[MT + wtid] + log2f(l) : vt::neg_inf());
    }
    // The stages are refilled next through the async proxy (TMA or wgmma reads after cp.async).
    fence_proxy_async();
}

// One warpgroup's epilogue, once both are done with the KV stages: stages its accumulators
// (rows r_lo, r_lo + 8; columns col0 + 8 i + 2 qd (+1)) in the freed KV stages (`stage` as a
// shared address, `so` as a pointer), then copies its 256 columns out (copy_out). `bar` is
// the warpgroup's own 128-thread barrier; warpgroup 0 (with_lse) also writes lse.
template <typename T, int MT>
__device__ __forceinline__ void stage_and_store(const Params& p, const Segment& sg, int row0, uint32_t stage,
                                                const float* so, const float (&o)[128], int r_lo, int qd, int col0,
                                                const float* s_fin, int wtid, int bar, bool with_lse) {
#pragma unroll
    for (int i = 0; i < 32; ++i)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi)
            st_shared_f2(stage + ((r_lo + 8 * hi) * OSTR + col0 + 8 * i + 2 * qd) * 4, o[4 * i + 2 * hi],
                         o[4 * i + 2 * hi + 1]);
    bar_sync(bar, 128);
    copy_out<T, MT>(p, sg, row0, so, col0, s_fin, wtid, with_lse);
}

// The TMA stages' mbarriers (arrival count 1 each, 8 bytes apart from `bar`), initialized
// by thread 0 when TMA, and this thread's parity of each stage's next completion (bit st).
// Shared by the wgmma kernels (decode_wgmma, decode_wgmma_narrow).
template <int STAGES, bool TMA> struct StageBarriers {
    uint32_t bar;
    uint32_t phases = 0;

    // Every thread of the block calls this (a block barrier when TMA).
    __device__ __forceinline__ explicit StageBarriers(uint32_t b) : bar(b) {
        if (TMA && threadIdx.x == 0) {
            for (int s = 0; s < STAGES; ++s) mbar_init(bar + 8 * s, 1);
        }
        if (TMA) __syncthreads();
    }
    __device__ __forceinline__ uint32_t of(int st) const { return bar + 8 * st; }
    // Waits for stage st's next completion.
    __device__ __forceinline__ void wait(int st) {
        mbar_wait(of(st), (phases >> st) & 1);
        phases ^= 1u << st;
    }
};

// Warpgroup 1 of the wgmma kernels (decode_wgmma, decode_wgmma_narrow) over one segment:
// Q (MT rows) and the first two tiles, then per tile: wait for P(t), `products(kst)` (its
// rescale and its half of the PV products on the stage at kst), signal, and the load two
// tiles ahead into the stage just freed (TMA: one warp issues the boxes, the tile's mbarrier
// completes it; cp.async: K_FULL is arrived once the group landed). Returns once this
// warpgroup's cp.async groups are drained. `bars`: the TMA stages' barriers.
template <typename T, int MT, bool TMA, class Products>
__device__ __forceinline__ void producer_tiles(const Params& p, const Segment& sg, int row0, uint32_t sQ,
                                               uint32_t sKV, unsigned char* valid, unsigned char* flags,
                                               StageBarriers<2, TMA>& bars, const TmaMap* kv_map,
                                               const Loader<T, 128>& ld, int wtid, Products&& products) {
    const int t0 = sg.t0, t1 = sg.t1;
    load_q<T, MT, 128>(p, sg.b, row0, sQ, wtid);
    i64 off = 0;
    if (TMA) {
        if (wtid < 32) {
            tma_tile<T>(p, sg, t0, sKV, valid, flags, bars.of(0), kv_map, wtid);
            if (t0 + 1 < t1) tma_tile<T>(p, sg, t0 + 1, sKV + TILE_BYTES, valid + BN, flags + 8, bars.of(1), kv_map, wtid);
        }
        cp_async_commit();
        cp_async_wait<0>();  // Q
        fence_proxy_async();
        bar_arrive(BAR_K_FULL, 256);  // Q is in shared memory (the tiles signal their mbarriers)
    } else {
        off = ld.row_of(p, sg, t0);
        ld.issue(sKV, valid, flags, off);
        cp_async_commit();
        off = ld.row_of(p, sg, t0 + 1);
        if (t0 + 1 < t1) ld.issue(sKV + TILE_BYTES, valid + BN, flags + 8, off);
        cp_async_commit();
        off = ld.row_of(p, sg, t0 + 2);
        cp_async_wait<1>();
        fence_proxy_async();
        bar_arrive(BAR_K_FULL, 256);  // tile t0 (parity 0)
    }
    bar_arrive(BAR_P_FREE, 256);
    for (int t = t0; t < t1; ++t) {
        const int st = (t - t0) & 1;
        const uint32_t kst = sKV + st * TILE_BYTES;
        bar_sync(BAR_P_FULL, 256);
        if (TMA) bars.wait(st);  // complete already (warpgroup 0 waited); for this warpgroup's view
        products(kst);
        if (t + 1 < t1) bar_arrive(BAR_P_FREE, 256);
        if (t + 2 < t1) bar_sync(BAR_V_FREE + st, 256);
        if (TMA) {
            if (t + 2 < t1 && wtid < 32)
                tma_tile<T>(p, sg, t + 2, kst, valid + st * BN, flags + st * 8, bars.of(st), kv_map, wtid);
            continue;
        }
        if (t + 1 < t1) {
            cp_async_wait<0>();  // tile t + 1, the newest group
            fence_proxy_async();
            bar_arrive(BAR_K_FULL + (st ^ 1), 256);
        }
        if (t + 2 < t1) {
            ld.issue(kst, valid + st * BN, flags + st * 8, off);
            cp_async_commit();
            off = ld.row_of(p, sg, t + 3);
        }
    }
    cp_async_wait<0>();
}

// Writes this warp's 16 rows of P into the swizzled [64 x 64] tile at sp (the A operand of
// the P V products) with four stmatrix. pk[2 i + hi] holds rows 8 hi + lane / 4 (of the warp's
// 16), tokens 8 i + 2 (lane % 4) (+1), as the accumulator holds them: so register m of store j
// is the 8 x 8 matrix of rows 8 (m % 2) and tokens 8 (2 j + m / 2), and lane l gives the
// address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void store_p_rows(uint32_t sp, const uint32_t (&pk)[16], int wwarp, int lane) {
    const int row = 16 * wwarp + 8 * ((lane >> 3) & 1) + (lane & 7), cb1 = lane >> 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint32_t r[4] = {pk[4 * j], pk[4 * j + 1], pk[4 * j + 2], pk[4 * j + 3]};
        stsm_x4(sp + swz(row, 2 * j + cb1), r);
    }
}

// The four k steps of S = Q K^T over column block cb (8 KB apart in Q and K, 32 bytes per k
// step inside it), issued; the first of the tile (cb 0) overwrites s.
template <typename T>
__device__ __forceinline__ void qk_block(float (&s)[32], const GmmaDesc& dq, const GmmaDesc& dk, int cb) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const uint32_t o16 = (uint32_t)((cb * SUB_BYTES + k * 32) >> 4);
        Wg<T>::qk(s, dq.at(o16), dk.at(o16), cb > 0 || k > 0 ? 1 : 0);
    }
}

// S = Q K^T for one 64-token tile of a 64-row kernel: 36 wgmma m64n64k16, Q and the tile at kst
// in their 9 K-major column blocks; returns with the products complete. Shared by consumer_tiles
// and the three-warpgroup kernel's 16-bit form.
template <typename T> __device__ __forceinline__ void qk_tile(float (&s)[32], const GmmaDesc& dq, uint32_t kst) {
    const GmmaDesc dk(kst, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int cb = 0; cb < NSUB; ++cb) qk_block<T>(s, dq, dk, cb);
    wgmma_commit();
    wgmma_wait<0>();
    pin(s);
}

// The causal limits of the two query rows a thread holds in a 64-row kernel (rows row0 + r_lo
// and + 8 of the CTA): row s of the s_q query tokens sees the sequence's first len - s_q + s + 1
// tokens; rows past m_total take the last token's limit. lim_min: the first row's.
struct RowLimits {
    int lim[2];
    int lim_min;
    __device__ __forceinline__ RowLimits(const Params& p, const Segment& sg, int row0, int r_lo) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const int r = row0 + r_lo + 8 * hi;
            const int s = r < p.m_total ? r / p.N : p.s_q - 1;
            lim[hi] = sg.len - p.s_q + s + 1;
        }
        lim_min = sg.len - p.s_q + 1;
    }
};

// A 64-token tile's raw row maxima over a thread's two rows (s[4 i + j]: row r_lo + 8 (j >> 1),
// token 8 i + 2 qd + (j & 1)), quad-reduced: unless `full`, tokens that do not exist
// (exists(col) false) or that a row may not see (tok0 + col >= lim[row]) are first masked to
// -inf. Shared by softmax_tile and the seesaw kernel's ss_mask_max.
template <class Exists>
__device__ __forceinline__ void mask_row_max(float (&s)[32], float (&mx)[2], bool full, int tok0, const int (&lim)[2],
                                             Exists&& exists, int qd) {
    mx[0] = mx[1] = vt::neg_inf();
    if (full) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            mx[0] = fmaxf(mx[0], fmaxf(s[4 * i], s[4 * i + 1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[4 * i + 2], s[4 * i + 3]));
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int col = 8 * i + 2 * qd + (j & 1);
                const int hi = j >> 1;
                const bool ok = exists(col) && tok0 + col < lim[hi];
                s[4 * i + j] = ok ? s[4 * i + j] : vt::neg_inf();
                mx[hi] = fmaxf(mx[hi], s[4 * i + j]);
            }
    }
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 1));
        mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 2));
    }
}

// The online softmax of one 64-token tile over a thread's two rows (s[4 i + j]: row r_lo + 8 (j
// >> 1), token 8 i + 2 qd + (j & 1), raw scores): unless `full`, tokens that do not exist
// (exists(col) false) or that a row may not see (tok0 + col >= its limit) are masked; m_run and
// l_run are updated (log2 domain, c = scale x log2 e), alpha gets the rows' rescale factors and
// pk P as T pairs (pk[2 i + hi]: row hi, tokens 8 i + 2 qd, + 1). Shared by the 64-row kernels'
// softmax warpgroups (consumer_tiles, decode_wgmma_fp8r).
template <typename T, class Exists>
__device__ __forceinline__ void softmax_tile(float (&s)[32], bool full, int tok0, const RowLimits& rl,
                                             Exists&& exists, int qd, float c, float (&m_run)[2],
                                             float (&l_run)[2], float (&alpha)[2], uint32_t (&pk)[16]) {
    float mx[2];
    mask_row_max(s, mx, full, tok0, rl.lim, exists, qd);
    float muse[2];
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) muse[hi] = online_max_step(mx[hi], c, m_run[hi], l_run[hi], alpha[hi]);
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const float p0 = ex2(fmaf(s[4 * i + 2 * hi], c, -muse[hi]));
            const float p1 = ex2(fmaf(s[4 * i + 2 * hi + 1], c, -muse[hi]));
            l_run[hi] += p0 + p1;
            pk[2 * i + hi] = pack2<T>(p0, p1);
        }
}

// The rows' sums (a quad per row) and maxima into s_fin ([64] sums, then [64] maxima) for the
// copy-out, from the softmax warpgroup of a 64-row kernel.
__device__ __forceinline__ void store_fin(float* s_fin, const float (&l_run)[2], const float (&m_run)[2], int r_lo,
                                          int qd) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        float l = l_run[hi];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (qd == 0) {
            s_fin[r_lo + 8 * hi] = l;
            s_fin[WGMMA_ROWS + r_lo + 8 * hi] = m_run[hi];
        }
    }
}

// The hand-overs of a stage loaded without the TMA, between warpgroup 0 and whoever loads
// it: K_FULL (the loader arrives once the tile is stored) and V_FREE (VFREE_N threads: 256
// when warpgroup 1 reloads the stage, 384 when warpgroup 2 does after both halves of P V).
// The CTA pair of wgmma_fp8_pair_sm90.cuh has its own (PairStages).
template <int VFREE_N> struct NamedStages {
    __device__ __forceinline__ void full(int st) { bar_sync(BAR_K_FULL + st, 256); }
    __device__ __forceinline__ void release(int st) { bar_arrive(BAR_V_FREE + st, VFREE_N); }
};

// Warpgroup 0 of the 64-row wgmma kernels (decode_wgmma, decode_wgmma_fp8, decode_wgmma_fp8_pair)
// over one segment: per tile, wait for it (TMA: its mbarrier; else stages.full), S = Q K^T,
// the online softmax, P and the rescale factors for warpgroup 1, O[:, 0:256] += P V, and
// stages.release once this warpgroup is done with the stage (not after a segment's last two
// tiles: the epilogue hands the stages over). Ends with the row sums and maxima in s_fin.
template <typename T, bool TMA, typename Stages>
__device__ __forceinline__ void consumer_tiles(const Params& p, const Segment& sg, int row0, uint32_t sKV,
                                               const unsigned char* valid, const unsigned char* flags,
                                               StageBarriers<2, TMA>& bars, Stages& stages, float (&o)[128],
                                               float* s_alpha, float* s_fin, const GmmaDesc& dq, uint32_t sP,
                                               const GmmaDesc& dp, int wtid, int r_lo, int qd) {
    const float c = p.scale_log2;
    const int t0 = sg.t0, t1 = sg.t1;
    const RowLimits rl(p, sg, row0, r_lo);
    float m_run[2] = {vt::neg_inf(), vt::neg_inf()}, l_run[2] = {0.0f, 0.0f};
    for (int t = t0; t < t1; ++t) {
        const int st = (t - t0) & 1;
        const uint32_t kst = sKV + st * TILE_BYTES;
        const unsigned char* vst = valid + st * BN;
        if (TMA) {
            if (t == t0) bar_sync(BAR_K_FULL, 256);  // Q
            bars.wait(st);
        } else {
            stages.full(st);
        }

        // (Three independent accumulator chains with a 128/384 column split measured
        // slower than this: see docs/perf.md.)
        float s[32];
        qk_tile<T>(s, dq, kst);
        if (TMA && t * BN + BN > sg.len) {
            // Rows past the sequence's last token came from a real page (the TMA copies
            // whole boxes) and may hold anything, NaN included: their weights are 0, but
            // 0 x NaN is not, so zero their V part (columns 0..511) before either product.
            const int first = sg.len - t * BN;
            for (int idx = wtid; idx < (BN - first) * 64; idx += 128) {
                const int r = first + (idx >> 6), c = idx & 63;  // c: 16-byte chunk of 64
                st_shared_v4_zero(kst + (c >> 3) * SUB_BYTES + swz(r, c & 7));
            }
            fence_proxy_async();  // before the products read V (ordered by BAR_WG0 / P_FULL)
        }

        float alpha[2];
        uint32_t pk[16];
        softmax_tile<T>(s, tile_is_full(t, rl.lim_min, flags + st * 8), t * BN, rl,
                        [&](int col) { return vst[col] != 0; }, qd, c, m_run, l_run, alpha, pk);
        bar_sync(BAR_P_FREE, 256);  // warpgroup 1 is done with P(t - 1)
        store_p_rows(sP, pk, r_lo >> 4, threadIdx.x & 31);
        if (qd == 0) {
            s_alpha[r_lo] = alpha[0];
            s_alpha[r_lo + 8] = alpha[1];
        }
        fence_proxy_async();      // P is read by wgmma (async proxy)
        bar_sync(BAR_WG0, 128);   // all of P written before this warpgroup's wgmma
        bar_arrive(BAR_P_FULL, 256);
        rescale(o, alpha[0], alpha[1]);
        pv_tile<T, 128>(o, dp, GmmaDesc(kst, SUB_BYTES, 1024));
        if (t + 2 < t1) stages.release(st);
    }
    store_fin(s_fin, l_run, m_run, r_lo, qd);
}

template <typename T, bool TMA>
__device__ void decode_wgmma(const Params& p, const TmaMap* kv_map) {
    constexpr int MT = WGMMA_ROWS;
    using L = Layout<MT>;
    static_assert(L::SMEM <= 232448, "fits the 227 KB a block may have");
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = align1024(smem_raw);
    const uint32_t base = smem_u32(smem);
    const uint32_t sQ = base + L::OFF_Q, sKV = base + L::OFF_KV, sP = base + L::OFF_P;
    float* s_alpha = (float*)(smem + L::OFF_RED);  // [MT] rescale factors of the current tile
    float* s_fin = s_alpha + MT;                    // [2][MT] final row sums and maxima
    unsigned char* valid = smem + L::OFF_VALID;
    unsigned char* flags = smem + L::OFF_FLAGS;
    int* sched = (int*)(smem + L::OFF_SCHED);
    const float* so = reinterpret_cast<const float*>(smem + L::OFF_KV);  // O staged at the end
    if (threadIdx.x < L::STAGES * 8) flags[threadIdx.x] = 0;
    StageBarriers<L::STAGES, TMA> bars(base + L::OFF_MBAR);
    grid_dep_launch();

    const int wg = threadIdx.x >> 7, wtid = threadIdx.x & 127;
    const int wwarp = wtid >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, qd = lane & 3;
    const int row0 = blockIdx.y * MT;
    const int r_lo = wwarp * 16 + g;  // this thread's accumulator rows: r_lo, r_lo + 8
    const Loader<T, 128> ld(p, wtid);  // warpgroup 1 only
    const GmmaDesc dq(sQ, 16, 1024), dp(sP, 16, 1024);

    const Part part = find_part(p, sched, (int*)(smem + L::OFF_P), MT * 128 / 4);  // P: free until the first tile
    int nb = part.b;
    i64 pre = part.pre;
    Segment sg;
    while (next_segment(p, part, nb, pre, sg)) {
        // This warpgroup's output columns: 0..255 (warpgroup 0), 256..511 (warpgroup 1).
        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;

        if (wg == 1) {
            // Producer: Q and the first two tiles, then per tile: PV for columns 256..511,
            // signal, and the load two tiles ahead.
            producer_tiles<T, MT, TMA>(p, sg, row0, sQ, sKV, valid, flags, bars, kv_map, ld, wtid,
                                       [&](uint32_t kst) {
                                           rescale(o, s_alpha[r_lo], s_alpha[r_lo + 8]);
                                           pv_tile<T, 128>(o, dp, GmmaDesc(kst + 4 * SUB_BYTES, SUB_BYTES, 1024));
                                       });
        } else {
            NamedStages<256> stages;
            consumer_tiles<T, TMA>(p, sg, row0, sKV, valid, flags, bars, stages, o, s_alpha, s_fin, dq, sP, dp, wtid,
                                   r_lo, qd);
        }
        // The epilogue sits between two block barriers: both warpgroups are done with the KV
        // stages (warpgroup 1's cp.async groups drained) and the row sums are in s_fin before
        // either stages its O there; both copy-outs are done before warpgroup 1 refills the
        // stages. (Arrive/sync hand-overs here made racecheck report the copy-out's reads
        // against the next segment's cp.async writes.)
        __syncthreads();
        stage_and_store<T, MT>(p, sg, row0, sKV, so, o, r_lo, qd, 256 * wg, s_fin, wtid, wg ? BAR_WG1 : BAR_WG0,
                               wg == 0);
        __syncthreads();
    }
}

}  // namespace mla
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
