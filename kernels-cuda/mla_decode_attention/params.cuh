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

// Partial row `row` of slot `slot` (f32), from column `col`.
__device__ __forceinline__ float* part_row(const Params& p, int slot, int row, int col) {
    return p.part_o + ((i64)slot * p.m_total + row) * p.dv + col;
}

// Two / four adjacent partial values (col even / a multiple of 4: aligned, as Dv is even / a
// multiple of 4 where the callers store these).
__device__ __forceinline__ void store_part2(const Params& p, int slot, int row, int col, float v0, float v1) {
    *reinterpret_cast<float2*>(part_row(p, slot, row, col)) = make_float2(v0, v1);
}
__device__ __forceinline__ void store_part4(const Params& p, int slot, int row, int col, float v0, float v1, float v2,
                                            float v3) {
    *reinterpret_cast<float4*>(part_row(p, slot, row, col)) = make_float4(v0, v1, v2, v3);
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
