// MlaDecodeAttention: shared-memory tiles of the tensor-core kernels (mma_sm80.cuh,
// wgmma_sm90.cuh). Q and every KV tile are NSUB column blocks of [rows x 128 B] with the
// 128-byte swizzle (vt::tc::swz): conflict-free for ldmatrix and exactly wgmma's and the
// TMA's SWIZZLE_128B layout, so one tile is both the K operand of S = Q K^T and the V
// operand (its first 512 features) of P V. Tokens past the sequence, past the part, or in
// blocks whose id is outside the cache are zero-filled and masked (a per-warp ballot flags
// bad block ids; interior tiles skip masking). Part of mla_decode_attention.cu.
#pragma once

#include "mla_decode_attention/schedule.cuh"

namespace mla {

// The first 1024-byte aligned address at or after ptr: the base of the kernels' layouts (the
// swizzle pattern repeats every 1024 bytes, and wgmma descriptors assume that phase).
__device__ __forceinline__ unsigned char* align1024(unsigned char* ptr) {
    const uint32_t a = smem_u32(ptr);
    return ptr + ((1024 - (a & 1023)) & 1023);
}

// token_row in two steps, for a loader that looks rows up ahead of their use: the block-table
// entry as loaded and the token's row in its block (-1 where the token does not exist), then
// the offset (row_offset), computed only where it is used so that the lookup does not wait
// for the load.
struct RowRef {
    int blk, in_blk;
};
__device__ __forceinline__ RowRef row_ref(const Params& p, const Segment& sg, int tile, int j) {
    if (tile >= sg.t1 || j >= sg.len) return {0, -1};
    const int bi = j / p.BS;
    return {__ldg(p.block_table + sg.b * p.bt_sb + bi * p.bt_sm), j - bi * p.BS};
}
__device__ __forceinline__ i64 row_offset(const Params& p, RowRef r) {
    if (r.in_blk < 0) return -1;
    if (r.blk < 0 || r.blk >= p.NB) return -2;
    return r.blk * p.c_sblk + (i64)r.in_blk * p.c_srow;
}

// The element offset of token j's row (j of sequence sg, in tile `tile` of the segment):
// -1 when the token does not exist (past the part or the sequence), -2 when its block id is
// outside the cache. Every loader of the tensor-core kernels looks rows up through this.
__device__ __forceinline__ i64 token_row(const Params& p, const Segment& sg, int tile, int j) {
    // (Not row_offset(row_ref(..)): the sentinel costs the kernels ~30 instructions.)
    if (tile >= sg.t1 || j >= sg.len) return -1;
    const int bi = j / p.BS;
    const int blk = __ldg(p.block_table + sg.b * p.bt_sb + bi * p.bt_sm);
    if (blk < 0 || blk >= p.NB) return -2;
    return blk * p.c_sblk + (i64)(j - bi * p.BS) * p.c_srow;
}

// Issues the cp.async copies of one KV tile from NTHR threads (local ids 0..NTHR-1): thread
// i copies token i / TPT, 16-byte chunks (i % TPT) + TPT k. `off` is the element offset of
// that token's row, -1 when the token does not exist (past the part or the sequence), -2
// when its block id is outside the cache (zero-filled, masked, and flagged per warp so the
// softmax knows to mask).
template <typename T, int NTHR> struct Loader {
    static constexpr int TPT = NTHR / BN;
    static constexpr int PER = CHUNKS / TPT;
    const T* cache;
    int tok, sub, lane, warp;

    __device__ __forceinline__ Loader(const Params& p, int i) : cache((const T*)p.cache) {
        tok = i / TPT;
        sub = i % TPT;
        lane = i & 31;
        warp = i >> 5;
    }

    __device__ __forceinline__ i64 row_of(const Params& p, const Segment& sg, int tile) const {
        return token_row(p, sg, tile, tile * BN + tok);
    }

    // All NTHR threads call this (warp-collective ballot).
    __device__ __forceinline__ void issue(uint32_t dst, unsigned char* valid, unsigned char* flags,
                                          i64 off) const {
        const bool ok = off >= 0;
        const T* src = cache + (ok ? off : 0);
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int c = sub + TPT * k;
            cp_async16(dst + (c >> 3) * SUB_BYTES + swz(tok, c & 7), src + c * 8, ok);
        }
        if (sub == 0) valid[tok] = ok ? 1 : 0;
        const unsigned bad = __ballot_sync(0xffffffffu, off == -2);
        if (lane == 0) flags[warp] = bad != 0u ? 1 : 0;
    }
};

// Copies the CTA's MT query rows of sequence b into Q (zero rows past m_total), from NTHR
// threads with local id i.
template <typename T, int MT, int NTHR>
__device__ __forceinline__ void load_q(const Params& p, int b, int row0, uint32_t sQ, int i) {
    for (int idx = i; idx < MT * CHUNKS; idx += NTHR) {
        const int r = idx / CHUNKS, c = idx - r * CHUNKS;
        const int gr = row0 + r;
        const bool ok = gr < p.m_total;
        const T* src = (const T*)p.q;
        if (ok) src = q_row<T>(p, b, gr) + c * 8;
        cp_async16(sQ + (c >> 3) * (MT * 128) + swz(r, c & 7), src, ok);
    }
}

// A tile needs no masking when every token exists and is visible to every query row.
__device__ __forceinline__ bool tile_is_full(int t, int lim_min, const unsigned char* flags_stage) {
    return t * BN + BN <= lim_min && *reinterpret_cast<const unsigned long long*>(flags_stage) == 0ull;
}

// Issues the cp.async copies of one half tile (32 tokens) from 256 threads: thread i copies
// token i / 8 of the half, 16-byte chunk i % 8 of each column block (8 threads move a
// whole 128-byte row segment). Offsets as in Loader (-1 no token, -2 bad block id). Used by
// the mma.sync kernels (mma_sm80.cuh; its fp8 twin in fp8_tiles.cuh).
template <typename T> struct HalfLoader {
    const T* cache;
    int tok, sub, lane, warp;

    __device__ __forceinline__ HalfLoader(const Params& p, int i) : cache((const T*)p.cache) {
        tok = i >> 3;
        sub = i & 7;
        lane = i & 31;
        warp = i >> 5;
    }

    __device__ __forceinline__ i64 row_of(const Params& p, const Segment& sg, int tile, int h) const {
        return token_row(p, sg, tile, tile * BN + h * HALF + tok);
    }

    // All 256 threads call this (warp-collective ballot). `valid` and `flags` are the tile's.
    __device__ __forceinline__ void issue(uint32_t dst, unsigned char* valid, unsigned char* flags, int h,
                                          i64 off) const {
        const bool ok = off >= 0;
        const T* src = cache + (ok ? off : 0) + sub * 8;
#pragma unroll
        for (int k = 0; k < NSUB; ++k) cp_async16(dst + k * HSUB_BYTES + swz(tok, sub), src + k * 64, ok);
        publish(valid, flags, h, off);
    }

    // The token's existence and its warp's bad-block flag for half h of the tile (every
    // thread of the warp calls this: a ballot).
    __device__ __forceinline__ void publish(unsigned char* valid, unsigned char* flags, int h, i64 off) const {
        if (sub == 0) valid[h * HALF + tok] = off >= 0 ? 1 : 0;
        const unsigned bad = __ballot_sync(0xffffffffu, off == -2);
        if (lane == 0) flags[h * 8 + warp] = bad != 0u ? 1 : 0;
    }
};

}  // namespace mla
