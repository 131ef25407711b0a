// MlaDecodeAttention: the argument block every kernel takes, the tile geometry they share,
// and the fact tables the host's planning is tested against. Part of
// mla_decode_attention.cu (see its header for the map of these headers).
//
// The host side is crates/vt-cuda/src/mla_decode_attention/ (mod.rs: Params and the
// dispatch; one planning file per kernel family). What the host plans with (the size and
// field offsets of Params, threads, query rows per CTA, shared-memory bytes and KV ring
// slots of each entry point, the tile and head dims) is compared with these definitions
// by the test in crates/vt-cuda/src/mla_decode_attention/facts.rs: it compiles
// mla_decode_attention.cu with VT_MLA_DECODE_FACTS defined, which adds the constant tables
// of MLA_FACTS and the module's own table, and reads them back from the PTX. The kernels'
// own build has none of them.
#pragma once

#include "common.cuh"
#include "tensor_core.cuh"

// 2 (lab): the KV tiles' TMA loads carry an evict-first L2 policy (a tile is read once; the
// pair multicasts it) where the grid writes partials for the combine and they are a large share
// of its bytes: the grid cuts sequences (Part::q != 0) and a part holds at most MLA_KV_EF_TILES
// tiles; elsewhere the plain instruction. 1: every load; 0 (the default): none. Thirty-ninth
// session (docs/perf.md): under 1 the b32 shapes ran 4-6% faster and the whole-sequence b128
// ones at 16 and 64 heads 3-4% slower; under 2 with the policy's operand on every load (fraction
// 0 outside the bounded grids) the b32 shapes 2-4% faster and the others 0.5-1.6% slower. This
// form (the plain instruction outside) is not measured yet, so it is not the default.
#ifndef MLA_KV_EVICT_FIRST
#define MLA_KV_EVICT_FIRST 0
#endif
#ifndef MLA_KV_EF_TILES
#define MLA_KV_EF_TILES 64
#endif
// 1 (lab): a cut segment's normalized partial rows are stored in the output's 16-bit type
// instead of f32 (the lse stays f32), halving the partials' bytes: written by the main grid
// beside the KV stream, read back by the combine (fortieth session: at h64 b32 s4096 about
// 21 MB each way against 151 MB of KV, at h128 b32 twice that, at h128 b1 17 MB against 9 MB).
// The same rounding as vLLM's and FlashInfer's 16-bit merge states: one more rounding of each
// partial to the output type before the merge. 0 (the default): f32.
#ifndef MLA_PART16
#define MLA_PART16 0
#endif

namespace mla {

using namespace vt::tc;

constexpr int BN = 64;           // KV tokens per tile: the unit of the split
constexpr int THREADS = 256;     // main kernels: 8 warps
constexpr int GEN_THREADS = 128; // generic kernel: 4 warps, a key each
constexpr int FD = 576;          // fast-path head dim (kv_lora_rank 512 + rope 64)
constexpr int FDV = 512;         // fast-path value dim
constexpr int NSUB = FD / 64;    // 64-feature (128-byte) column blocks of a 16-bit row
constexpr int CHUNKS = FD / 8;   // 16-byte chunks of a row
constexpr int SUB_BYTES = BN * 128;          // one column block of a KV tile
constexpr int TILE_BYTES = NSUB * SUB_BYTES; // one KV tile in shared memory (73728)
constexpr int HALF = BN / 2;                 // mma kernels: tokens per half tile (load unit)
constexpr int HSUB_BYTES = HALF * 128;       // one column block of a half tile
constexpr int HALF_BYTES = NSUB * HSUB_BYTES; // one half tile in shared memory (36864)
constexpr float LN2 = 0.6931471805599453f;

// Must match `Params` in crates/vt-cuda/src/mla_decode_attention/mod.rs (repr(C)); checked
// field by field (offset and size) by facts.rs.
struct Params {
    const void* q;           // [B, s_q, N, D]
    void* out;               // [B, s_q, N, Dv]
    float* lse;              // [B, N, s_q] or null
    const void* cache;       // [NB, BS, D]
    const int* block_table;  // [B, MB]
    const int* seq_lens;     // [B]
    float* part_o;           // [slots, m_total, Dv]
    float* part_lse;         // [slots, m_total] (log2)
    int* seq_info;           // [B, 2]: first slot, number of slots
    i64 q_sb, q_ss, q_sh;
    i64 o_sb, o_ss, o_sh;
    i64 l_sb, l_sh, l_ss;
    i64 c_sblk, c_srow;
    i64 bt_sb, bt_sm;
    i64 sl_s;
    int B, s_q, N, d, dv, NB, BS, MB;
    int m_total;    // s_q * N query rows per sequence
    int num_parts;  // grid.x
    int min_tiles;  // fewest tiles per part (bounds the partial traffic)
    int combine_wpr;  // combine kernel: warps per query row, 1 or 8
    float scale_log2;
};

// The type a cut segment's normalized partial rows are stored in, for output type T.
template <typename T> struct PartOf { using type = float; };
#if MLA_PART16
template <> struct PartOf<bf16> { using type = bf16; };
template <> struct PartOf<f16> { using type = f16; };
#endif

// pack2's inverse: the two 16-bit values of w, low first, as f32 (exact).
template <typename T> __device__ __forceinline__ void unpack2(uint32_t w, float& x, float& y);
template <> __device__ __forceinline__ void unpack2<bf16>(uint32_t w, float& x, float& y) {
    x = __uint_as_float(w << 16);
    y = __uint_as_float(w & 0xffff0000u);
}
template <> __device__ __forceinline__ void unpack2<f16>(uint32_t w, float& x, float& y) {
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = w;
    const float2 f = __half22float2(h);
    x = f.x;
    y = f.y;
}

// Partial row `row` of slot `slot`, from column `col`, in its stored type.
template <typename T>
__device__ __forceinline__ typename PartOf<T>::type* part_row(const Params& p, int slot, int row, int col) {
    return (typename PartOf<T>::type*)p.part_o + ((i64)slot * p.m_total + row) * p.dv + col;
}

// Two / four adjacent partial values (col even / a multiple of 4: aligned, as Dv is even / a
// multiple of 4 where the callers store these).
template <typename T>
__device__ __forceinline__ void store_part2(const Params& p, int slot, int row, int col, float v0, float v1) {
    if constexpr (sizeof(typename PartOf<T>::type) == 4)
        *reinterpret_cast<float2*>(part_row<T>(p, slot, row, col)) = make_float2(v0, v1);
    else
        *reinterpret_cast<uint32_t*>(part_row<T>(p, slot, row, col)) = pack2<T>(v0, v1);
}
template <typename T>
__device__ __forceinline__ void store_part4(const Params& p, int slot, int row, int col, float v0, float v1,
                                            float v2, float v3) {
    if constexpr (sizeof(typename PartOf<T>::type) == 4)
        *reinterpret_cast<float4*>(part_row<T>(p, slot, row, col)) = make_float4(v0, v1, v2, v3);
    else
        *reinterpret_cast<uint2*>(part_row<T>(p, slot, row, col)) = make_uint2(pack2<T>(v0, v1), pack2<T>(v2, v3));
}

// Query row gr (s_q x heads order: token gr / N, head gr % N) of sequence b.
template <typename T> __device__ __forceinline__ const T* q_row(const Params& p, int b, int gr) {
    const int s = gr / p.N, h = gr - s * p.N;
    return (const T*)p.q + b * p.q_sb + s * p.q_ss + h * p.q_sh;
}

}  // namespace mla

// One entry point's facts as the host plans them: block threads, query rows per CTA,
// dynamic shared memory in bytes (the generic kernel's at D = 576, Dv = 512) and KV ring
// slots (half tiles for the mma.sync kernels, whole tiles for the wgmma kernel, 0 where
// there is no ring). Written beside each extern "C" kernel of mla_decode_attention.cu; a
// table ENTRY_facts only in the facts build (see above), nothing otherwise.
#if defined(VT_MLA_DECODE_FACTS)
#define MLA_FACTS(ENTRY, THREADS, ROWS, SMEM, SLOTS) \
    extern "C" __device__ const long long ENTRY##_facts[4] = {THREADS, ROWS, SMEM, SLOTS};
#else
#define MLA_FACTS(ENTRY, THREADS, ROWS, SMEM, SLOTS)
#endif
