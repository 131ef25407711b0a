// MlaDecodeAttention, the fp8_ds_mla kernel as a CTA pair (sm_90a only):
// mla_decode_wgmma_fp8x2_{bf16,f16}, launched in clusters of two CTAs along grid.y (the row
// blocks: 128 heads, or 64 heads x 2 query tokens). Planned by
// crates/vt-cuda/src/mla_decode_attention/wgmma_sm90.rs (`fp8_pair`). Part of
// mla_decode_attention.cu. Design: docs/sparse-design.md, step D3.
//
// The two CTAs of a cluster differ only in their query rows, so they walk the same segments
// (the schedule cuts by blockIdx.x) and read the same cache rows. decode_wgmma_fp8 has every
// CTA gather and dequantize all 64 rows of each tile; here CTA rank r does rows 32 r .. 32 r + 31
// only and stores each 16-byte chunk twice: into its own stage and, by st.async, into the same
// offset of the peer's stage. The producer's work and the rows' L2 -> SM traffic halve;
// warpgroups 0 and 1 are decode_wgmma_fp8's (consumer_tiles with PairStages).
//
// Warpgroup 2 holds one round (32 tokens) per tile, so its two register rounds are two tiles:
// tile t + 2 is loaded while tile t + 1's loads fly, and the block-table entries (a sparse
// call's indices) are looked up one tile earlier still (RowRef), so no row load waits on its
// index load.
//
// Hand-overs (the mbarriers at Layout's OFF_MBAR: epi_done, k_remote[2], v_free[2]):
//   K_FULL[st]    named, as in decode_wgmma_fp8: this CTA's half of the tile (and, for a
//                 segment's first tile, Q) is stored               WG2 arrives, WG0 syncs
//   k_remote[st]  the peer's half has landed: 1 arrival (this CTA's warpgroup 2, arming it
//                 for the 36,864 bytes) + the peer's st.async bytes   WG0 waits
//   v_free[st]    both CTAs' warpgroups 0 and 1 are done with the stage: 16 arrivals, one a
//                 warp, each warp arriving on its own CTA's barrier and the peer's (the peer's
//                 producer writes into this stage too)                 WG2 waits
//   epi_done      both CTAs' copy-outs are done (they overlay the stages, which both
//                 producers write next): 512 arrivals, every thread of both CTAs' warpgroups
//                 0 and 1                                              WG2 waits
// A phase of k_remote[st] is armed only after its previous phase completed (after the v_free
// wait of the same stage, or after epi_done for a segment's first two tiles), and the peer's
// bytes for a phase are sent only after its own v_free / epi_done wait, which includes this
// CTA's consumers' release of the previous one: bytes that land before the arming leave the
// transaction count negative with the arrival pending, which the phase allows.
// The peer's arrivals and the waits take the mbarrier defaults, as CUTLASS's cluster pipelines
// do (acquire or release at cluster scope compiled to an L1 invalidation or a MEMBAR.GPU per
// tile): what they order is shared memory whose reads had completed, and st.async bytes that
// the phase completion itself publishes. The cluster meets at a cluster barrier after
// initializing the barriers (before any remote access) and at the end (no CTA exits while its
// peer may still reach its shared memory).
#pragma once

#include "mla_decode_attention/wgmma_fp8_sm90.cuh"

// Lab switch (tools/device/labs.sh overlays): 1 makes the k_remote wait acquire at cluster
// scope, for a first run whose peer rows read stale (see above; the default is the CTA scope
// CUTLASS's multicast pipelines wait with).
#ifndef MLA_PAIR_ACQUIRE_CLUSTER
#define MLA_PAIR_ACQUIRE_CLUSTER 0
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace mla {

constexpr int PAIR_CTAS = 2;                          // CTAs per cluster, along grid.y
constexpr int PAIR_HALF_BYTES = 32 * (TILE_BYTES / BN);  // one CTA's 32 rows of a 16-bit tile
constexpr int PAIR_RELEASES = 2 * 8;                  // v_free arrivals: 8 warps x 2 CTAs
constexpr int PAIR_EPI = 2 * 256;                     // epi_done arrivals: 256 threads x 2 CTAs

// One warp's release of stage st after its P V (wgmma_wait done): its lane 0 arrives on both
// CTAs' v_free[st] (local: this CTA's address, peer: the peer's through mapa).
__device__ __forceinline__ void pair_release(uint32_t local, uint32_t peer, int st, bool lead) {
    __syncwarp();
    if (lead) {
        mbar_arrive(local + 8 * st);
        mbar_arrive_cluster(peer + 8 * st);
    }
}

// consumer_tiles' hand-overs in the pair (see the header): the local half by K_FULL, the
// peer's by k_remote (this warpgroup's parity of each stage's next completion in `phases`,
// carried across segments), and the release to both CTAs.
struct PairStages {
    uint32_t k_remote, v_free, v_free_peer;
    uint32_t phases;
    bool lead;  // lane 0 of its warp
    __device__ __forceinline__ void full(int st) {
        bar_sync(BAR_K_FULL + st, 256);
        mbar_wait<MLA_PAIR_ACQUIRE_CLUSTER != 0>(k_remote + 8 * st, (phases >> st) & 1);
        phases ^= 1u << st;
        fence_proxy_async();  // the peer's st.async bytes, read by wgmma (async proxy)
    }
    __device__ __forceinline__ void release(int st) { pair_release(v_free, v_free_peer, st, lead); }
};

// Warpgroup 2 of CTA `rank` over one segment: Q, then per tile its own round (rows 32 rank ..)
// into both CTAs' stage, and the other round's token flags from the block table alone.
// Registers: round a holds the even tiles of the segment, b the odd ones; `ahead` is the own
// row of the tile after the next one to load, looked up a step before its load is issued.
template <typename T>
__device__ __forceinline__ void pair_producer_tiles(const Params& p, const Segment& sg, int row0, uint32_t sQ,
                                                    uint32_t sKV, uint32_t peer_sKV, uint32_t k_remote,
                                                    uint32_t peer_k_remote, uint32_t v_free, uint32_t& vphases,
                                                    unsigned char* valid, unsigned char* flags, const Fp8RegLoader& ld,
                                                    int own, int wtid) {
    const int t0 = sg.t0, t1 = sg.t1, oth = own ^ 1;
    load_q<T, WGMMA_ROWS, 128>(p, sg.b, row0, sQ, wtid);
    cp_async_commit();
    Fp8Raw a, b;
    i64 oa = ld.row_of(p, sg, t0, own);
    ld.load(oa, a);
    i64 ob = ld.row_of(p, sg, t0 + 1, own);
    ld.load(ob, b);
    RowRef ahead = ld.ref_of(p, sg, t0 + 2, own);
    // Tile t from the registers `cur` (its own round's offset oc), then tile t + 2's loads
    // into them.
    auto step = [&](int t, Fp8Raw& cur, i64& oc) {
        const int st = (t - t0) & 1;
        const RowRef other = ld.ref_of(p, sg, t, oth);  // only its flags: used after the stores
        if (t >= t0 + 2) {  // both CTAs' P V(t - 2) are done with the stage
            mbar_wait(v_free + 8 * st, (vphases >> st) & 1);
            vphases ^= 1u << st;
        }
        if (wtid == 0) mbar_expect_tx(k_remote + 8 * st, PAIR_HALF_BYTES);  // the peer's half of tile t
        const uint32_t dst = sKV + st * TILE_BYTES, rdst = peer_sKV + st * TILE_BYTES, rbar = peer_k_remote + 8 * st;
        ld.store_rows<T>(
            [&](uint32_t o, const uint32_t (&v)[4]) {
                st_shared_v4(dst + o, v);
                st_async_v4(rdst + o, v, rbar);
            },
            own, cur);
        ld.publish(own, oc, valid + st * BN, flags + st * 8);
        ld.publish(oth, row_offset(p, other), valid + st * BN, flags + st * 8);
        if (t == t0) cp_async_wait<0>();  // Q
        // Read by wgmma (async proxy). The fence (MEMBAR.ALL.CTA) and the hand-over come before
        // tile t + 2's loads are issued: issued first, the loads made the hand-over 3-4% slower
        // (docs/perf.md, "Twenty-eighth session").
        fence_proxy_async();
        bar_arrive(BAR_K_FULL + st, 256);
        oc = row_offset(p, ahead);
        if (t + 2 < t1) ld.load(oc, cur);      // tile t + 2, in flight behind tile t + 1's stores
        ahead = ld.ref_of(p, sg, t + 3, own);  // its load is issued a step from now
    };
    for (int t = t0; t < t1; t += 2) {
        step(t, a, oa);
        if (t + 1 < t1) step(t + 1, b, ob);
    }
}

template <typename T> __device__ void decode_wgmma_fp8_pair(const Params& p) {
    using L = Layout<WGMMA_ROWS>;
    static_assert(L::MBARS >= 5, "epi_done, k_remote[2], v_free[2]");
    extern __shared__ unsigned char smem_raw[];
    const Fp8Cta c(align1024(smem_raw));
    grid_dep_launch();
    // The layout is the same in both CTAs (one kernel, one dynamic size), so the peer's
    // barriers and stages are at this CTA's offsets: mapa maps them.
    const uint32_t rank = cluster_ctarank(), peer = rank ^ 1u;
    const uint32_t epi_done = c.base + L::OFF_MBAR, k_remote = epi_done + 8, v_free = epi_done + 24;

    if (threadIdx.x == 0) {
        mbar_init(epi_done, PAIR_EPI);
#pragma unroll
        for (int st = 0; st < 2; ++st) {
            mbar_init(k_remote + 8 * st, 1);
            mbar_init(v_free + 8 * st, PAIR_RELEASES);
        }
        fence_mbar_init_cluster();
    }
    cluster_sync();  // both CTAs' barriers are initialized before any remote arrival or store
    const Part part = c.part(p);
    int nb = part.b;
    i64 pre = part.pre;
    Segment sg;
    if (c.wg == 2) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FP8_REGS[2]) : "memory");
        const Fp8RegLoader ld(p, c.wtid);
        const uint32_t peer_sKV = mapa_shared(c.sKV, peer), peer_k_remote = mapa_shared(k_remote, peer);
        uint32_t vphases = 0;
        int phase = 0;
        while (next_segment(p, part, nb, pre, sg)) {
            pair_producer_tiles<T>(p, sg, c.row0, c.sQ, c.sKV, peer_sKV, k_remote, peer_k_remote, v_free, vphases,
                                   c.valid, c.flags, ld, (int)rank, c.wtid);
            mbar_wait(epi_done, phase);  // both CTAs' stages are free for the next segment
            phase ^= 1;
        }
        cluster_sync();
        return;
    }
    const uint32_t v_free_peer = mapa_shared(v_free, peer), epi_peer = mapa_shared(epi_done, peer);
    if (c.wg == 1) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FP8_REGS[1]) : "memory");
        const bool lead = c.lane == 0;
        while (next_segment(p, part, nb, pre, sg)) {
            fp8_pv_segment<T>(p, sg, c, [&](int st) { pair_release(v_free, v_free_peer, st, lead); });
            mbar_arrive(epi_done);
            mbar_arrive_cluster(epi_peer);
        }
        cluster_sync();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(FP8_REGS[0]) : "memory");
    StageBarriers<L::STAGES, false> bars(c.base + L::OFF_MBAR);  // never waited on (no TMA stages)
    PairStages stages{k_remote, v_free, v_free_peer, 0u, c.lane == 0};
    while (next_segment(p, part, nb, pre, sg)) {
        fp8_s_segment<T>(p, sg, c, bars, stages);
        mbar_arrive(epi_done);
        mbar_arrive_cluster(epi_peer);
    }
    cluster_sync();
}

}  // namespace mla
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
