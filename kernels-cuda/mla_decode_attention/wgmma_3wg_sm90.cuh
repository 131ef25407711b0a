// MlaDecodeAttention, the 64-row wgmma kernels with three warpgroups (sm_90a only): one computes
// S and the softmax, the other two one half of P V each. Two forms, planned by
// crates/vt-cuda/src/mla_decode_attention/wgmma_sm90.rs (`three_wg`, `fp8_raw`); Auto's choice
// above 32 query rows through the TMA (Kernel::Wgmma3, Kernel::WgmmaFp8Raw forced; `xtask bench
// decode --alt wgmma_3wg,wgmma_fp8r`). Part of mla_decode_attention.cu.
// - mla_decode_wgmma_3wg_{bf16,f16}: a 16-bit cache read through the TMA (64 divides the block
//   size), two 72 KB stages, V read in place from the stage as in the two-warpgroup kernel.
// - mla_decode_wgmma_3wg_x2_{bf16,f16}: the TMA form as CTA pairs (PAIR, Kernel::Wgmma3Pair,
//   `VT_MLA_3WG_PAIR`): the two row blocks of a part as a cluster reading each tile once, each
//   CTA issuing every other column block multicast to both (decode_wgmma_3wg's comment).
// - mla_decode_wgmma_3wg_cp_{bf16,f16}: the same over any block size (the gather form, CP): the
//   tiles' rows looked up token by token and copied by cp.async (what block sizes 1 and 16 and
//   the sparse op's gathered rows need, where a 64-token box of one page does not exist).
//   Warpgroups 1 and 2 copy tile u + 2 into tile u's slot as soon as their own P V(u) is done
//   with it (below), so no warp waits for a copy to land: the slot's FULL barrier does.
// - mla_decode_wgmma_fp8r_bf16: an fp8_ds_mla cache, S taken straight from the raw codes;
//   mla_decode_wgmma_fp8r_cp_bf16: its gather form (any block size, as above).
//
// Why (docs/perf.md, "Eighteenth session"): in the two-warpgroup 64-row kernel (wgmma_sm90.cuh)
// warpgroup 0 runs S, the softmax and half of P V in sequence (~4800 cycles a tile against 2176 of
// tensor work, sixteenth session); here warpgroup 0 does no P V, so S(u + 1) runs under P V(u)
// (H200: 5-13% faster at 64 and 128 heads; the fp8 form 19-23% faster than wgmma_fp8_sm90.cuh's,
// bound by its V dequantization: perf.md's labs).
// The first 64-row fp8 kernel (wgmma_fp8_sm90.cuh) keeps two 72 KB 16-bit stages, so no raw rows
// fit beside them and one warpgroup holds them in registers: its loads wait on their own latency,
// then on the dequantization (h64 b128 s4096: 340 us against 195 for the 16-bit cache). In the
// fp8 form here K needs no 16-bit copy: S's latent part is an e4m3 product of the codes AS THE TMA
// DELIVERS THEM (each 128-value scale group of a row is one 128-byte box row, 128-byte swizzle =
// wgmma's K-major operand layout) against the query split into two e4m3 parts (hi + lo, the
// narrow fp8 kernel's exact-for-bf16 split, nf8_split4), folded per group by the tokens' scales
// in f32. That frees the room for a two-slot ring of raw tiles beside a single 64 KB V stage.
//
// Shared memory (W3Layout):
//   16-bit: ring 2 x 72 KB (9 column blocks [64 tokens x 128 B], swizzled) | Q 72 KB | P 8 KB | ...
//   fp8:    ring 3 x 41 KB [code group 0..3 boxes, rope box: 64 tokens x 128 B, swizzled]
//           [scales 64 x 16 B] (F8R_RING) | the factor tables, 1 KB a slot | Q 64 KB [group][hi,
//           lo] e4m3 | P 8 KB | ...  (the F8R_VT=0 lab and the gather form: ring 2 x 41 KB | V
//           64 KB, 8 column blocks of bf16 | ...)
//   then the reductions, the slots' token counts, the schedule, the mbarriers.
//
// 384 threads, three warpgroups, 168 registers each (the fp8 TMA form: setmaxnreg 152 / 176 / 176,
// F8R_REGS):
// - Warpgroup 0: per tile, S = Q K^T (16-bit: 36 HGMMA m64n64k16; fp8: 32 QGMMA m64n64k32, four
//   groups x four k steps x hi / lo, two accumulator sets so group g is folded while group g + 1
//   runs, then the rope's four HGMMA with Q's rope in registers), the online softmax, P and the
//   rescale factors.
// - Warpgroups 1 and 2: warpgroup w owns O[:, 256 (w - 1) ..] (128 accumulators a thread) and the
//   V columns 256 (w - 1) .. + 255. fp8 (F8R_VT, the default): O^T = V^T P^T, V^T built in
//   registers from the raw codes of the ring (no V stage is written or read; f8r_vt_loop); the
//   lab build F8R_VT=0 first dequantizes one 128-value group of one token a thread into its
//   warpgroup's half of the V stage (code x scale rounded once, dequant8). 16-bit: V is read in
//   the slot; the rows past the sequence in its last tile are zeroed first (the TMA copies whole
//   boxes of a real page: 0 x NaN is not 0). Then O += P V on that half (4 HGMMA m64n256k16).
//   At a segment's start they write Q (16-bit: cp.async; fp8: split into hi / lo parts, a thread
//   per row and group, and 2^-e per row). Lane 0 of warp 4 issues the TMA: the CTA's first
//   SLOTS tiles up front (two; the fp8 form three), then tile u + SLOTS into tile u's slot once
//   every thread is done with it. It
//   walks the CTA's tiles on its own, so the next segment's first tiles load while this one ends.
//
// Hand-overs (u: the CTA's running tile count, slot u % SLOTS, W3Layout::slot):
//   FULL[slot]   mbarrier, 1 arrival + the TMA bytes            issuer -> all
//                gather form: 256 arrivals (warpgroups 1 and 2, each once its own copies
//                of the tile have landed, cp.async.wait_group, one tile later: W3_CP_DEFER)
//   EMPTY[slot]  mbarrier, 384 arrivals (each thread done with it: after its reads of the slot;
//                16-bit: warpgroups 1 and 2 after their P V, which reads V there)  all -> issuer
//                (gather form: unused; warpgroup w refills its half of the slot after its own P V
//                and a barrier of its 128 threads, and warpgroup 0's S read the slot before
//                P_FULL, which that P V waited for)
//   P_FREE       mbarrier, 256 arrivals per tile (P V(u) done)   WG1, WG2 -> WG0 before P(u + 1),
//                                                                 and (fp8) -> WG1, WG2 before V(u + 1)
//   P_FULL       named, 384 (P(u) and its factors written)        WG0 arrives, WG1 / WG2 sync
//   Q_READY      named, 384 (Q of the segment written)            WG1 / WG2 arrive, WG0 syncs
//   FIN          named, 384 (s_fin of the segment written)        WG0 arrives, WG1 / WG2 sync
//   WG1 / WG2    named, 128 (the warpgroup's V half written; gather form: its P V is done
//                with the slot)                                    inside each warpgroup
// Before each named arrival the arriving side also syncs among itself (BAR_WG0, or PV_PAIR for
// warpgroups 1 and 2 together): racecheck takes a shared-memory access as ordered only by a
// barrier its thread syncs, not by an arrive (the first GPU run reported s_alpha and s_pinv).
// Each named barrier's next arrival comes only after the other side passed its sync (Q_READY
// and FIN alternate around a segment; P_FULL(u + 1) needs P_FREE(u)), so no two generations
// mix; P_FREE and EMPTY phases are waited on at most one phase ahead (the phase after needs the
// waiter's own next step). tools/models/fp8raw_protocol.py checks the fp8 form's hand-overs over
// random interleavings. The epilogue writes O from registers (no staging), so the ring never
// waits for it. Tokens past the sequence in a real page may hold anything: S masks them, and V's
// rows of them are zeroed (16-bit) or dequantized as zeros (fp8).
#pragma once

#include "mla_decode_attention/wgmma_fp8_sm90.cuh"
#include "mla_decode_attention/wgmma_narrow_fp8_sm90.cuh"
#include "mla_decode_attention/wgmma_seesaw_sm90.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Lab builds for docs/perf.md (wrong results; a copy of this file with F8R_LAB defined, through
// VT_CUDA_KERNELS_DIR): 1 no dequantization (V stage left as it is), 2 no S products (S = 0),
// 3 no P V products, 4 no loads (the TMA is not issued; FULL completes on the arrival alone);
// the 16-bit TMA form's segment change: 5 no output stores (warpgroups 1 and 2 skip w3_store),
// 6 Q loaded for the CTA's first segment only (the later ones reuse it).
#ifndef F8R_LAB
#define F8R_LAB 0
#endif
// 1: f8r_dequant_v loads each unit of codes one unit ahead (lab build for the A/B).
#ifndef F8R_AHEAD
#define F8R_AHEAD 0
#endif
// 1 (the default since the twenty-fourth session): warpgroups 1 and 2 compute O^T = V^T P^T
// with V^T in registers (f8r_vt_loop): 5-6% faster at 64 / 128 heads on an H100, tests,
// memcheck, synccheck and racecheck clean (docs/perf.md, "Twenty-third session" and
// "Twenty-fourth session"). 0 (lab build): the V stage, dequantized by warpgroups 1 and 2.
#ifndef F8R_VT
#define F8R_VT 1
#endif
// 1: warpgroups 1 and 2 (fp8 form, the default loop) stop waiting for each other: each waits for
// its own P V(u) before dequantizing V(u + 1) into its half (a 128-thread barrier after P V)
// instead of P_FREE, which counts both (lab build, docs/perf.md "Twentieth session"; the
// gather-form model finds the order clean: tools/models/gather3wg_protocol.py --form fp8).
#ifndef F8R_OWNV
#define F8R_OWNV 0
#endif
// 1 (the default since the twenty-fourth session): the gather forms' copying threads arrive on
// FULL without cp.async.mbarrier.arrive: each commits its copies of tile u + 2 as a group, then
// at tile u + 1, before P_FULL (where it waits for warpgroup 0's S anyway), waits for that group
// and arrives. Tests, synccheck, memcheck and racecheck clean on an H100; 0-5% slower than the
// tracked arrival (0, lab build), which synccheck reports ("Missing wait" at the arrival after
// cp.async.mbarrier.arrive; docs/perf.md, "Twenty-third session" and "Twenty-fourth session").
#ifndef W3_CP_DEFER
#define W3_CP_DEFER 1
#endif
// Raw tiles in the fp8 TMA form's ring (F8R_VT only: the V stage it no longer writes leaves room
// for a third 41 KB slot). 3 (the default since the thirty-fifth session): tile u + 3 is issued
// once tile u is read, so two tiles' loads cover a tile's latency instead of one (warpgroup 0's
// FULL wait 0.9 -> 0.1 us a tile; H100 -3% at 64 heads, -5% at 128: docs/perf.md "Thirty-fifth
// session"); 2: the two-slot ring (lab build).
#ifndef F8R_RING
#define F8R_RING 3
#endif
// 1: f8r_vt_loop loads the next pair of steps' code words and factors right after issuing the
// current pair's second product, before its wgmma wait (lab build, docs/perf.md "Thirty-fifth
// session": the loads otherwise start only after the wait, their latency exposed once a pair).
#ifndef F8R_VT_AHEAD
#define F8R_VT_AHEAD 0
#endif
// 1 (the default since the thirty-sixth session): setmaxnreg gives warpgroups 1 and 2 176
// registers and warpgroup 0 152, so the V^T loop refills 1 spilled value a tile instead of 10
// (H100 -6% at 64 and 128 heads: docs/perf.md "Thirty-sixth session"); 2: 184 / 136 (lab build,
// spills in warpgroup 0's tile loop); 0: 168 each.
#ifndef F8R_REGS
#define F8R_REGS 1
#endif
namespace mla {

constexpr int W3_THREADS = 384;
constexpr int W3_SLOTS = 2;                         // tiles in the ring
constexpr int F8R_BOX = BN * 128;                   // one [64 tokens x 128 B] box (8192)
constexpr int F8R_SCALES = 5 * F8R_BOX;             // the scale box's offset in a raw slot
constexpr int F8R_SLOT = F8R_SCALES + BN * 16;      // 41984 = 41 x 1024
// The rows map's 4-byte words: code group g at 32 g, the scales at 128, the rope at 132.
constexpr int F8R_SCALE_WORD = vt::fp8ds::SCALE_OFFSET / 4, F8R_ROPE_WORD = vt::fp8ds::ROPE_OFFSET / 4;

// RAW: the fp8_ds_mla form; CP: the gather form, which adds the slots' token flags.
template <bool RAW, bool CP = false> struct W3Layout {
    // Tiles in the ring: slot u % SLOTS holds the CTA's tile u, in its fill u / SLOTS.
    static constexpr int SLOTS = (RAW && !CP && F8R_VT) ? F8R_RING : W3_SLOTS;
    // SLOTS 2 keeps its mask and shift only so the two-slot forms' SASS stays byte-identical.
    __device__ static __forceinline__ int slot(int u) { return SLOTS == 2 ? u & 1 : (int)((unsigned)u % SLOTS); }
    __device__ static __forceinline__ int phase(int u) { return SLOTS == 2 ? (u >> 1) & 1 : (int)((unsigned)u / SLOTS) & 1; }
    static constexpr int SLOT = RAW ? F8R_SLOT : TILE_BYTES;
    static constexpr int OFF_RING = 0;
    static constexpr int OFF_V = SLOTS * SLOT;                             // 1024-aligned
    // fp8: V's 8 latent blocks; with a deeper ring (F8R_VT) only the factor tables, 1 KB a slot.
    static constexpr int V_BYTES = !RAW ? 0 : SLOTS > W3_SLOTS ? SLOTS * 1024 : (NSUB - 1) * SUB_BYTES;
    static constexpr int OFF_Q = OFF_V + V_BYTES;
    static constexpr int OFF_P = OFF_Q + (RAW ? 8 * F8R_BOX : NSUB * SUB_BYTES);  // fp8 Q: [4 groups][hi, lo]
    static constexpr int OFF_RED = OFF_P + WGMMA_ROWS * 128;      // float s_alpha[64], s_fin[128], s_pinv[64]
    // FULL barriers a slot: the 16-bit TMA form's one per column block (nine, as FlashMLA's
    // per-box barriers: warpgroup 0 starts S's k steps over block cb once that box has landed,
    // warpgroups 1 and 2 wait for their own four V blocks; docs/perf.md, "Thirtieth session":
    // ncu had put 25% of warpgroup 0's stall samples on the whole tile's wait; H100, -3.5 to -7%
    // at 128 heads s8192 / s16384), in the words of s_pinv, which only the fp8 form uses:
    // [SLOTS][NSUB] u64. The fp8 and gather forms: one a slot.
    static constexpr int NFULL = (!RAW && !CP) ? NSUB : 1;
    static constexpr int FULL_STRIDE = 8 * NFULL;  // bytes from one slot's FULL barriers to the next's
    static constexpr int OFF_NVALID = OFF_RED + 256 * 4;          // int [SLOTS]: tokens of the slot's tile that exist
    static constexpr int OFF_SCHED = OFF_NVALID + (SLOTS * 4 + 7) / 8 * 8;   // int [40]
    static constexpr int OFF_MBAR = OFF_SCHED + 40 * 4;           // u64 FULL [SLOTS] (see OFF_FULL), EMPTY [SLOTS], P_FREE
    // Gather form: per slot 64 token flags (the token exists) and 8 bad-block flags (a block
    // id outside the cache among rows 8 k .. 8 k + 7), read as one u64.
    static constexpr int OFF_VALID = OFF_MBAR + (2 * SLOTS + 1) * 8;
    static constexpr int OFF_FULL = NFULL > 1 ? OFF_RED + 192 * 4 : OFF_MBAR;  // (at OFF_MBAR unused then)
    static constexpr int VALID_BYTES = BN + 8;
    static constexpr int END = OFF_VALID + (CP ? SLOTS * VALID_BYTES : 0);
    static constexpr int SMEM = END + 1024;                       // slack to align the base
    static_assert(OFF_V % 1024 == 0 && OFF_Q % 1024 == 0 && OFF_P % 1024 == 0 && OFF_MBAR % 8 == 0 &&
                      OFF_VALID % 8 == 0 && VALID_BYTES % 8 == 0,
                  "alignment");
    static_assert(SMEM <= 232448, "fits the 227 KB a block may have");
    static_assert(NFULL == 1 || OFF_FULL + SLOTS * FULL_STRIDE <= OFF_RED + 256 * 4, "FULL fits s_pinv's words");
};

// The two maps of an fp8_ds_mla cache's rows (4-byte words, dims (164, BS, NB)): `rows` with
// boxes of 32 words x 64 rows and the 128-byte swizzle (a code group or the rope), `scales` with
// boxes of 4 words x 64 rows, no swizzle. One kernel parameter (the host passes them as one
// vector). The 16-bit form takes the two-warpgroup kernel's map (64-feature boxes) alone.
struct RawMaps {
    TmaMap rows, scales;
};
template <bool RAW> using W3Maps = typename Cond<RAW, RawMaps, TmaMap>::type;

// Named barriers (0: __syncthreads; BAR_WG0 = 7, warpgroup 0's own, is wgmma_sm90.cuh's).
constexpr int W3_P_FULL = 1, W3_Q_READY = 2, W3_FIN = 3, W3_WG1 = 4;  // W3_WG1 + 1: warpgroup 2's
constexpr int W3_PV_PAIR = 6;  // warpgroups 1 and 2 together (256)

// S's latent part: D (m64n64, f32) += A (Q's e4m3 part, shared) x B (the codes, shared), k = 32.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
                 : VT_ACC32(0)
                 : "l"(da), "l"(db), "r"(scale_d));
}

// The pair form: one box of `map` into shared memory at dst of every CTA of `mask` (same
// offset), its bytes completing on each one's mbarrier at bar's offset.
__device__ __forceinline__ void tma_load_3d_mc(uint32_t dst, const TmaMap* map, int c0, int c1, int c2, uint32_t bar,
                                               unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
        "[%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
        : "memory");
}

// Lane 0 of warp 4: the CTA's tiles in the consumers' order, segment by segment.
struct TileWalk {
    int nb;
    i64 pre;
    Segment sg;
    int t;
    __device__ __forceinline__ explicit TileWalk(const Part& part) : nb(part.b), pre(part.pre), t(0) { sg.t1 = 0; }
    __device__ __forceinline__ bool next(const Params& p, const Part& part) {
        if (t + 1 < sg.t1) {
            ++t;
            return true;
        }
        if (!next_segment(p, part, nb, pre, sg)) return false;
        t = sg.t0;
        return true;
    }
};

// Where tile w.t lies in the cache, looked up apart from its loads (the issuing lane does it
// before it waits for the slot, so the round trip passes under that wait). blk[k]: the block of
// the tile's k-th page (PG: pages of BS rows; else blk[0], the one block holding the tile, from
// row `row`); `word`: the tile's *nvalid.
// PG (16-bit TMA form over pages of BS = 16 or 32 rows, the map's boxes BS rows): tile w.t is
// BN / BS pages, each column block BN / BS boxes, one per page (at byte BS x 128 x page of the
// column block: the 128-byte swizzle repeats every 8 rows, so the boxes tile it as one 64-row
// box would). Its word: bits 0-7 how many of its tokens the sequence has (as the 64-row form's
// count), bit 8 + g set where 16-token group g lies in a page whose block id is outside the
// cache (its boxes read block NB: zeros; the softmax masks it). Pages past the sequence are not
// looked up (the block table may end there) and read zeros. Every id is loaded before any is
// tested: tested one by one they were four dependent round trips a tile, 10-11% of block size
// 16's time at h128 b32 (fortieth session).
constexpr int W3_PG_COUNT = 0xff;
struct W3Blocks {
    int blk[BN / 16], row, word;
};
template <bool PG>
__device__ __forceinline__ W3Blocks w3_lookup(const Params& p, const TileWalk& w) {
    W3Blocks b;
    if constexpr (PG) {
        const int R = p.BS, j = w.t * BN, len = w.sg.len, jb = j / R;
        const int* bt = p.block_table + w.sg.b * p.bt_sb + jb * p.bt_sm;
        bool looked[BN / 16];
        int v[BN / 16];
#pragma unroll
        for (int pb = 0; pb < BN / 16; ++pb) {
            looked[pb] = pb * R < BN && j + pb * R < len;
            v[pb] = looked[pb] ? __ldg(bt + pb * p.bt_sm) : p.NB;
        }
        int bad = 0;
#pragma unroll
        for (int pb = 0; pb < BN / 16; ++pb) {
            const bool ok = v[pb] >= 0 && v[pb] < p.NB;
            b.blk[pb] = ok ? v[pb] : p.NB;
            if (looked[pb] && !ok) bad |= ((1 << (R / 16)) - 1) << (pb * R / 16);
        }
        b.row = 0;
        b.word = min(BN, len - j) | bad << 8;
    } else {
        // 64 divides BS: the tile is 64 rows of one block.
        const int j = w.t * BN, bi = j / p.BS;
        const int v = __ldg(p.block_table + w.sg.b * p.bt_sb + bi * p.bt_sm);
        const bool ok = v >= 0 && v < p.NB;
        b.blk[0] = ok ? v : p.NB;
        b.row = ok ? j - bi * p.BS : 0;
        b.word = ok ? min(BN, w.sg.len - j) : 0;
    }
    return b;
}

// Issues the tile whose blocks w3_lookup found (b) into the slot at dst (its boxes
// completing on `full`) and records its word (0 tokens for a block id outside the cache, whose
// boxes read block NB: out of the map, zeros). fp8: the four code groups, the rope and the
// scales; 16-bit: the nine 64-feature column blocks, each on its own barrier (each arrival
// publishes nvalid). PAIR: this CTA's column blocks (cb % 2 = its rank) go to both CTAs of the
// cluster; its barriers still expect all nine (the peer's bytes complete on them).
template <bool RAW, bool PAIR = false, bool PG = false>
__device__ __forceinline__ void w3_issue(const Params& p, const W3Blocks& b, uint32_t dst, int* nvalid, uint32_t full,
                                         const W3Maps<RAW>* maps) {
    *nvalid = b.word;
    if constexpr (PG) {
        const int R = p.BS;
        const uint32_t rank = PAIR ? cluster_ctarank() : 0u;
#pragma unroll
        for (int cb = 0; cb < NSUB; ++cb) {
            mbar_expect_tx(full + 8 * cb, (uint32_t)SUB_BYTES);
            if (PAIR && (uint32_t)(cb & 1) != rank) continue;
#pragma unroll
            for (int pb = 0; pb < BN / 16; ++pb) {
                if (pb * R >= BN) break;
                const uint32_t d = dst + cb * SUB_BYTES + pb * R * 128;
                if constexpr (PAIR) tma_load_3d_mc(d, maps, 64 * cb, 0, b.blk[pb], full + 8 * cb, (unsigned short)3);
                else tma_load_3d(d, maps, 64 * cb, 0, b.blk[pb], full + 8 * cb);
            }
        }
    } else if constexpr (!RAW) {
        const uint32_t rank = PAIR ? cluster_ctarank() : 0u;
#pragma unroll
        for (int cb = 0; cb < NSUB; ++cb) {
            mbar_expect_tx(full + 8 * cb, F8R_LAB == 4 ? 0u : (uint32_t)SUB_BYTES);
            if (F8R_LAB == 4) continue;
            if (!PAIR) {
                tma_load_3d(dst + cb * SUB_BYTES, maps, 64 * cb, b.row, b.blk[0], full + 8 * cb);
            } else if ((uint32_t)(cb & 1) == rank) {
                tma_load_3d_mc(dst + cb * SUB_BYTES, maps, 64 * cb, b.row, b.blk[0], full + 8 * cb, (unsigned short)3);
            }
        }
    } else {
        mbar_expect_tx(full, F8R_LAB == 4 ? 0u : (uint32_t)W3Layout<RAW>::SLOT);  // publishes nvalid
        if (F8R_LAB == 4) return;
#pragma unroll
        for (int g = 0; g < 4; ++g) tma_load_3d(dst + g * F8R_BOX, &maps->rows, 32 * g, b.row, b.blk[0], full);
        tma_load_3d(dst + 4 * F8R_BOX, &maps->rows, F8R_ROPE_WORD, b.row, b.blk[0], full);
        tma_load_3d(dst + F8R_SCALES, &maps->scales, F8R_SCALE_WORD, b.row, b.blk[0], full);
    }
}

// The issuing lane (thread 128): tile u + SLOTS into tile u's slot (at dst) once every thread is
// done with tile u (its EMPTY phase), its block ids looked up before that wait (on an H100 that
// took block size 16 at h128 b32 from 133 to 119 us and the 64-row forms 0-1% faster:
// docs/perf.md, "Fortieth session"); then the warp reconverges.
template <bool RAW, bool PAIR = false, bool PG = false>
__device__ __forceinline__ void w3_refill(bool issuer, TileWalk& walk, const Params& p, const Part& part, int u,
                                          uint32_t dst, uint32_t empty, uint32_t full, int* nvalid,
                                          const W3Maps<RAW>* maps) {
    using L = W3Layout<RAW>;
    const int slot = L::slot(u);
    if (issuer && walk.next(p, part)) {
        const W3Blocks b = w3_lookup<PG>(p, walk);  // under the wait
        mbar_wait(empty + 8 * slot, L::phase(u));
        w3_issue<RAW, PAIR, PG>(p, b, dst, nvalid + slot, full + L::FULL_STRIDE * slot, maps);
    }
    __syncwarp();
}

// Gather form: the rows a thread of warpgroups 1 and 2 copies of tile wk.t (rows wtid / 4 and
// + 32), looked up a tile ahead of the copies: the block ids are loaded here and first used by
// the copies (GatherRows::off), so their latency passes under the tile in between. rin < 0: the
// token does not exist (past the sequence).
struct GatherRows {
    int blk[2], rin[2];
    // The element offset of row h in the cache; -1: no token, -2: a block id outside the cache.
    __device__ __forceinline__ i64 off(const Params& p, int h) const {
        if (rin[h] < 0) return -1;
        if (blk[h] < 0 || blk[h] >= p.NB) return -2;
        return blk[h] * p.c_sblk + (i64)rin[h] * p.c_srow;
    }
};
__device__ __forceinline__ GatherRows gather_rows(const Params& p, const TileWalk& wk, int wtid) {
    GatherRows g;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int j = wk.t * BN + (wtid >> 2) + 32 * h;
        const bool live = j < wk.sg.len;
        const int bi = live ? j / p.BS : 0;
        g.blk[h] = live ? __ldg(p.block_table + wk.sg.b * p.bt_sb + bi * p.bt_sm) : 0;
        g.rin[h] = live ? j - bi * p.BS : -1;
    }
    return g;
}

// What the gather forms' copies share: for each of the thread's two rows of the tile (rows wtid
// / 4 and + 32), the row's cache offset (0 where it does not exist: the copies zero-fill then)
// and the swizzled offsets of its 16-byte chunks sub and sub + 4 within a 128-byte row; `copy`
// issues the row's copies; warpgroup 1 writes the tile's flags (flags[r]: token r exists;
// flags[64 + k]: a bad block id among rows 8 k .. 8 k + 7, as a warp's ballot). Then the
// thread's arrival on `full`, whose phase also waits for its copies to land.
template <class Copy>
__device__ __forceinline__ void w3_gather_rows(const Params& p, const GatherRows& rows, unsigned char* flags,
                                               uint32_t full, int w, int wtid, Copy&& copy) {
    const int sub = wtid & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = (wtid >> 2) + 32 * h;
        const i64 off = rows.off(p, h);
        const bool ok = off >= 0;
        const uint32_t x0 = (uint32_t)((sub ^ (r & 7)) << 4), x1 = (uint32_t)(((sub | 4) ^ (r & 7)) << 4);
        copy(r, sub, ok ? off : 0, ok, x0, x1);
        if (w == 0) {  // (uniform over the warp)
            const unsigned bad = __ballot_sync(0xffffffffu, off == -2);
            if (sub == 0) flags[r] = ok ? 1 : 0;
            if ((wtid & 31) == 0) flags[BN + 4 * h + (wtid >> 5)] = bad != 0u ? 1 : 0;
        }
    }
#if W3_CP_DEFER
    (void)full;
    cp_async_commit();  // the caller arrives once the group has landed (w3_cp_arrive)
#else
    mbar_track_cp_async(full);
    mbar_arrive(full);  // publishes the flags with the phase
#endif
}

// W3_CP_DEFER: this thread's arrival for its copies committed one tile earlier (pending >= 0:
// their slot), once its cp.async groups have landed; the arrival publishes them and the flags.
__device__ __forceinline__ void w3_cp_arrive(uint32_t full, int& pending) {
#if W3_CP_DEFER
    if (pending >= 0) {
        cp_async_wait<0>();
        mbar_arrive(full + 8 * pending);
        pending = -1;
    }
#else
    (void)full;
    (void)pending;
#endif
}

// Gather form: warpgroup w's copies of the tile whose rows are `rows` into the slot at dst, the
// rows' V columns 256 w .. + 255 and rope columns 512 + 32 w .. + 31 (36 16-byte chunks a row:
// what this warpgroup's P V and nothing else of the next tile reads, beside warpgroup 0's S).
// Chunk c = sub + 4 j: V features 256 w + 8 c for j < 8 (column block 4 w + j / 2, chunk sub + 4
// (j & 1) of its row), the rope's features 512 + 32 w + 8 sub for j = 8 (column block 8, chunk
// 4 w + sub): a row's four threads move 64 contiguous bytes a step.
template <typename T>
__device__ __forceinline__ void w3_gather(const Params& p, const GatherRows& rows, uint32_t dst,
                                          unsigned char* flags, uint32_t full, int w, int wtid) {
    w3_gather_rows(p, rows, flags, full, w, wtid, [&](int r, int sub, i64 off, bool ok, uint32_t x0, uint32_t x1) {
        const T* src = (const T*)p.cache + off + 256 * w + 8 * sub;
        const uint32_t srow = dst + 4 * w * SUB_BYTES + r * 128;
#pragma unroll
        for (int j = 0; j < 8; ++j) cp_async16(srow + (j >> 1) * SUB_BYTES + ((j & 1) ? x1 : x0), src + 32 * j, ok);
        cp_async16(dst + 8 * SUB_BYTES + swz(r, 4 * w + sub), src + FDV - 224 * w, ok);
    });
}

// Gather form over an fp8_ds_mla cache: warpgroup w's copies of the tile of `rows` into the raw
// slot at dst, what its dequantization and nothing else of the next tile reads beside warpgroup
// 0's S: the code groups 2 w and 2 w + 1 (boxes 2 w, 2 w + 1), the rope's bytes 64 w .. + 63
// (rope box chunks 4 w ..) and the scales of its two groups (8 bytes of the row's scale box
// entry): 20 16-byte chunks and one 8-byte copy a row; chunks sub + 4 j (j < 4: codes, group
// 2 w + j / 2; j = 4: the rope), the row's first thread also copying the scales. Rows that do
// not exist get codes and scales 0: a zero V row and a zero S the flags mask.
__device__ __forceinline__ void w3_gather_raw(const Params& p, const GatherRows& rows, uint32_t dst,
                                              unsigned char* flags, uint32_t full, int w, int wtid) {
    w3_gather_rows(p, rows, flags, full, w, wtid, [&](int r, int sub, i64 off, bool ok, uint32_t x0, uint32_t x1) {
        const unsigned char* row = (const unsigned char*)p.cache + off;
        const uint32_t box = dst + 2 * w * F8R_BOX + r * 128;
#pragma unroll
        for (int j = 0; j < 4; ++j)  // group 2 w + j / 2, chunk sub + 4 (j & 1) of its 128 bytes
            cp_async16(box + (j >> 1) * F8R_BOX + ((j & 1) ? x1 : x0), row + 256 * w + 64 * j + 16 * sub, ok);
        cp_async16(dst + 4 * F8R_BOX + swz(r, 4 * w + sub), row + vt::fp8ds::ROPE_OFFSET + 64 * w + 16 * sub, ok);
        if (sub == 0) cp_async8(dst + F8R_SCALES + r * 16 + 8 * w, row + vt::fp8ds::SCALE_OFFSET + 8 * w, ok);
    });
}

// Gather form: the CTA's 64 query rows of sequence b into Q from warpgroups 1 and 2 (qi =
// thread - 128, 18 chunks each) by plain loads: a cp.async commit group would also take in the
// ring's copies, which land on the slots' barriers, and the wait would wait for those. Rows past
// m_total get zeros.
template <typename T>
__device__ __forceinline__ void w3_load_q_regs(const Params& p, int b, int row0, uint32_t sQ, int qi) {
    constexpr int PER = WGMMA_ROWS * CHUNKS / 256, HALF_PER = PER / 2;  // two rounds of 9 loads
    static_assert(PER * 256 == WGMMA_ROWS * CHUNKS && HALF_PER * 2 == PER, "whole chunks a thread");
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        uint4 v[HALF_PER];
#pragma unroll
        for (int k = 0; k < HALF_PER; ++k) {
            const int idx = qi + 256 * (half * HALF_PER + k), r = idx / CHUNKS, c = idx - r * CHUNKS, gr = row0 + r;
            v[k] = make_uint4(0u, 0u, 0u, 0u);
            if (gr < p.m_total) v[k] = __ldg(reinterpret_cast<const uint4*>(q_row<T>(p, b, gr) + c * 8));
        }
#pragma unroll
        for (int k = 0; k < HALF_PER; ++k) {
            const int idx = qi + 256 * (half * HALF_PER + k), r = idx / CHUNKS, c = idx - r * CHUNKS;
            const uint32_t w4[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
            st_shared_v4(sQ + (c >> 3) * (WGMMA_ROWS * 128) + swz(r, c & 7), w4);
        }
    }
}

// Warpgroup 0's A fragments of Q's rope (bf16, the four k steps of 16), from global memory:
// rq[k][hi + 2 h] = row r_lo + 8 hi, rope values 16 k + 8 h + 2 qd (+1). Rows past m_total: 0.
__device__ __forceinline__ void f8r_load_rope(const Params& p, int b, int row0, int r_lo, int qd,
                                              uint32_t (&rq)[4][4]) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const int row = row0 + r_lo + 8 * hi;
        const bool ok = row < p.m_total;
        const int s = ok ? row / p.N : 0, h = ok ? row - s * p.N : 0;
        const bf16* src = (const bf16*)p.q + b * p.q_sb + s * p.q_ss + h * p.q_sh + vt::fp8ds::LATENT + 2 * qd;
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                rq[k][hi + 2 * hh] = ok ? __ldg(reinterpret_cast<const unsigned int*>(src + 16 * k + 8 * hh)) : 0u;
    }
}

// Warpgroups 1 and 2 (qi = thread - 128: row qi / 4, group qi % 4): the row's 128 latent values
// of the group as hi / lo e4m3 parts (x 2^e, e putting the row's largest value in [128, 256):
// nf8_qexp, as the narrow fp8 kernel) into Q's blocks, and s_pinv[row] = 2^-e. The four threads
// of a row are adjacent lanes (the row maximum by two shuffles). Rows past m_total: zeros.
__device__ __forceinline__ void f8r_split_q(const Params& p, int b, int row0, uint32_t sQ, float* s_pinv, int qi) {
    const int r = qi >> 2, grp = qi & 3, row = row0 + r;
    const bool ok = row < p.m_total;
    const int s = ok ? row / p.N : 0, h = ok ? row - s * p.N : 0;
    const uint4* src = reinterpret_cast<const uint4*>((const bf16*)p.q + b * p.q_sb + s * p.q_ss + h * p.q_sh + 128 * grp);
    uint4 v[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = ok ? __ldg(src + i) : make_uint4(0u, 0u, 0u, 0u);
    // |x| as bits orders like |x|, and a NaN's bits exceed every finite value's and infinity's.
    uint32_t mx = 0u;
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const uint32_t w = vt::word(v[i], q);
            mx = max(mx, max((w & 0x7fffu) << 16, w & 0x7fff0000u));
        }
    mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const int e = nf8_qexp(mx);
    const float sc = __uint_as_float((uint32_t)(127 + e) << 23);  // 2^e
    const uint32_t bhi = sQ + 2 * grp * F8R_BOX, blo = bhi + F8R_BOX;
#pragma unroll
    for (int c = 0; c < 8; ++c) {  // 16 values: 16-byte chunk c of the row's 128 bytes
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const uint32_t w0 = vt::word(v[2 * c + (q >> 1)], 2 * (q & 1)), w1 = vt::word(v[2 * c + (q >> 1)], 2 * (q & 1) + 1);
            const float x[4] = {__uint_as_float(w0 << 16) * sc, __uint_as_float(w0 & 0xffff0000u) * sc,
                                __uint_as_float(w1 << 16) * sc, __uint_as_float(w1 & 0xffff0000u) * sc};
            nf8_split4(x, hi[q], lo[q]);
        }
        st_shared_v4(bhi + swz(r, c), hi);
        st_shared_v4(blo + swz(r, c), lo);
    }
    if (grp == 0) s_pinv[r] = __uint_as_float((uint32_t)(127 - e) << 23);
}

// Warpgroup 0: S = Q K^T over the raw tile at `raw` (scales: its scale box, as a pointer),
// s[4 i + j]: row r_lo + 8 (j >> 1), token 8 i + 2 qd + (j & 1). Five chunks, each one commit
// group: the four code groups (8 QGMMA: each k step against Q's hi, then lo part, into the
// same accumulators) and the rope (4 HGMMA, A = rq). Group g is folded into s (x its tokens'
// scales) once group g + 1 is issued, so the fold runs under the next products. Finally
// s = s x 2^-e (pinv, per row) + the rope part. Returns with every product complete.
__device__ __forceinline__ void f8r_qk(float (&s)[32], const GmmaDesc& dq, uint32_t raw, const float* scales,
                                       const uint32_t (&rq)[4][4], const float (&pinv)[2], int qd) {
    const GmmaDesc dk(raw, 16, 1024);
    float acc[2][32];
    auto fold = [&](int grp) {
        float(&ac)[32] = acc[grp & 1];
        pin(ac);
        float sc[8][2];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) sc[i][e] = scales[(8 * i + 2 * qd + e) * 4 + grp];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) s[4 * i + j] = grp == 0 ? ac[4 * i + j] * sc[i][j & 1] : fmaf(ac[4 * i + j], sc[i][j & 1], s[4 * i + j]);
    };
    if (F8R_LAB == 2) {
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.0f;
        return;
    }
#pragma unroll
    for (int c = 0; c < 5; ++c) {
        if (c >= 2) {
            wgmma_wait<1>();  // chunk c - 2 is done
            fold(c - 2);
        }
        wgmma_fence();
        if (c < 4) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                // Group c: Q's hi block 2c, lo block 2c + 1; the codes' box c; 32 bytes a k step.
                const uint32_t o_k = (uint32_t)((c * F8R_BOX + 32 * k) >> 4);
                const uint32_t o_q = (uint32_t)((2 * c * F8R_BOX + 32 * k) >> 4);
                wgmma_m64n64k32_e4m3(acc[c & 1], dq.at(o_q), dk.at(o_k), k > 0 ? 1 : 0);
                wgmma_m64n64k32_e4m3(acc[c & 1], dq.at(o_q + (F8R_BOX >> 4)), dk.at(o_k), 1);
            }
        } else {
#pragma unroll
            for (int k = 0; k < 4; ++k)
                SsRs<bf16>::qk(acc[0], rq[k], dk.at((uint32_t)((4 * F8R_BOX + 32 * k) >> 4)), k > 0 ? 1 : 0);
        }
        wgmma_commit();
    }
    wgmma_wait<1>();
    fold(3);
    wgmma_wait<0>();
    pin(acc[0]);
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = fmaf(s[i], pinv[(i >> 1) & 1], acc[0][i]);
}

// Warpgroups 1 and 2: one thread's share of the tile's V: token tok, the group `grp` (its
// warpgroup's half holds groups 2 (w - 1), + 1 as column blocks 0..3 at sVh), 128 values as
// 16-bit chunks (code x scale, dequant8). Tokens that do not exist (tok >= nv) get zeros.
// Chunk order c = cc ^ 6 h (h: the group's parity) keeps each quarter warp's eight 16-byte
// loads and stores on distinct banks (4 tokens x 2 groups).
__device__ __forceinline__ void f8r_dequant_v(uint32_t raw, const float* scales, uint32_t sVh, int nv, int tok,
                                              int grp) {
    const int h = grp & 1;
    const uint32_t dst = sVh + 2 * h * SUB_BYTES, src = raw + grp * F8R_BOX + tok * 128;
    const bool live = tok < nv;
#if F8R_AHEAD
    // Each unit's codes are loaded one unit ahead (the first before the scale's arithmetic): the
    // nineteenth session's ncu run put 22% of warpgroups 1 and 2's stall samples on the first
    // use of each lds128 here (short scoreboard), with 4 registers free for anything more.
    auto unit_addr = [&](int cc) { return src + (((cc ^ (6 * h)) ^ (tok & 7)) << 4); };
    uint4 cur = live ? lds128(unit_addr(0)) : make_uint4(0u, 0u, 0u, 0u);
#endif
    const float sc = live ? scales[tok * 4 + grp] : 0.0f;
    // Warp-uniform: the one-multiply form unless a lane's scale is >= 2^7 (or NaN).
    const bool one = __all_sync(0xffffffffu, sc < 0x1p7f);
    if (F8R_LAB == 1) return;
    const Bf16Factor f = bf16_factor(sc, one);
#if F8R_AHEAD
    if (!live) {
#pragma unroll
        for (int cc = 0; cc < 8; ++cc) {
            const int c = cc ^ (6 * h);
            const uint32_t o = dst + (c >> 2) * SUB_BYTES;
            st_shared_v4_zero(o + swz(tok, 2 * (c & 3)));
            st_shared_v4_zero(o + swz(tok, 2 * (c & 3) + 1));
        }
        return;
    }
    // The warp-uniform `one` is taken once, outside the loop (it was a branch per dequant8).
    auto units = [&](bool one_c) {
#pragma unroll
        for (int cc = 0; cc < 8; ++cc) {
            const int c = cc ^ (6 * h);  // codes 16 c .. 16 c + 15 of the group
            const uint32_t o = dst + (c >> 2) * SUB_BYTES;
            const uint4 w = cur;
            if (cc + 1 < 8) cur = lds128(unit_addr(cc + 1));
            uint32_t out[4];
            dequant8<bf16>(w.x, w.y, sc, f, one_c, out);
            st_shared_v4(o + swz(tok, 2 * (c & 3)), out);
            dequant8<bf16>(w.z, w.w, sc, f, one_c, out);
            st_shared_v4(o + swz(tok, 2 * (c & 3) + 1), out);
        }
    };
    if (one) {
        units(true);
    } else {
        units(false);
    }
    return;
#endif
#pragma unroll
    for (int cc = 0; cc < 8; ++cc) {
        const int c = cc ^ (6 * h);  // codes 16 c .. 16 c + 15 of the group
        const uint32_t o = dst + (c >> 2) * SUB_BYTES;
        if (!live) {
            st_shared_v4_zero(o + swz(tok, 2 * (c & 3)));
            st_shared_v4_zero(o + swz(tok, 2 * (c & 3) + 1));
            continue;
        }
        const uint4 w = lds128(src + ((c ^ (tok & 7)) << 4));
        uint32_t out[4];
        dequant8<bf16>(w.x, w.y, sc, f, one, out);
        st_shared_v4(o + swz(tok, 2 * (c & 3)), out);
        dequant8<bf16>(w.z, w.w, sc, f, one, out);
        st_shared_v4(o + swz(tok, 2 * (c & 3) + 1), out);
    }
}

// F8R_VT: warpgroups 1 and 2 compute O^T = V^T P^T with A = V^T built in registers from
// the raw codes, so no V stage is written or read (docs/perf.md, nineteenth session: the single
// V stage chains P V(u) -> dequantization(u + 1) -> P V(u + 1)). Warpgroup w owns the features
// of scale groups 2w, 2w + 1 as four m-blocks of 64 (m-block 2j + e: group 2w + j). The thread of
// warp wq, lane (g, qd) takes code word k = 8 wq + g of a group (features 4k .. 4k + 3) as its
// rows 16 wq + g + 8 hh of the group's two m-blocks: feature 128 G + 4k + 2e + hh. The
// accumulators o[m][4i + jj]: row (feature) as above with hh = jj >> 1, column (query row of the
// CTA) 8i + 2qd + (jj & 1).
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}
// Feature byte b of two tokens' code words as a bf16 pair (value x 2^-120, e4m3x2_bits's form):
// one prmt takes byte b of wa and of wb, each with its sign replicated over the byte above.
__device__ __forceinline__ uint32_t vt_pair_bits(uint32_t wa, uint32_t wb, int b) {
    const uint32_t sel = (uint32_t)b | (uint32_t)(8 | b) << 4 | (uint32_t)(4 + b) << 8 | (uint32_t)(12 + b) << 12;
    uint32_t x;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(x) : "r"(wa), "r"(wb), "r"(sel));
    return (x << 4) & 0x87f087f0u;
}
// The tile's scale factors as a table in shared memory (at tab: [group][hi, lo][64 tokens] of
// bf16, 1 KB; dequant8's split of scale x 2^120, or x 2^60 when `one` is false), one (token,
// group) a thread of warpgroups 1 and 2 (idx 0..255); tokens past nv get 0. Returns `one`:
// every scale of the tile < 2^7 (a barrier of the 256 threads).
__device__ __forceinline__ bool vt_factors(const float* scales, int nv, uint32_t tab, int idx) {
    const int tok = idx & 63, G = idx >> 6;
    const float sc = tok < nv ? scales[tok * 4 + G] : 0.0f;
    uint32_t all;  // scale < 2^7 (0f43000000 = 128) in all 256 threads (a NaN scale compares false)
    asm volatile("{\n.reg .pred p, q;\nsetp.lt.f32 p, %1, 0f43000000;\nbar.red.and.pred q, %2, 256, p;\nselp.u32 %0, 1, 0, q;\n}\n"
                 : "=r"(all)
                 : "f"(sc), "n"(W3_PV_PAIR)
                 : "memory");
    const bool one = all != 0;
    const Bf16Factor f = bf16_factor(sc, one);
    const uint32_t at = tab + ((2 * G) * 64 + tok) * 2;
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(at), "h"((unsigned short)(f.hi & 0xffffu)) : "memory");
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(at + 128), "h"((unsigned short)(f.lo & 0xffffu)) : "memory");
    return one;
}
// One k step of group G: the four tokens' code words (tokens 16 ks + 2 qd, + 1, + 8, + 9 of the
// raw tile; a token past the sequence has factor 0) and the factor pairs (t, t + 1), (t + 8,
// t + 9) from the table.
struct VtStep {
    uint32_t wd[4], hi01, lo01, hi89, lo89;
};
__device__ __forceinline__ VtStep vt_step(uint32_t raw, uint32_t tab, int G, int ks, int kw, int qd) {
    const uint32_t gb = raw + G * F8R_BOX;
    VtStep st;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int t = 16 * ks + 2 * qd + (i & 1) + 8 * (i >> 1);
        st.wd[i] = lds32(gb + t * 128 + (((kw >> 2) ^ (t & 7)) << 4) + (kw & 3) * 4);
    }
    const uint32_t ft = tab + ((2 * G) * 64 + 16 * ks + 2 * qd) * 2;
    st.hi01 = lds32(ft);
    st.hi89 = lds32(ft + 16);
    st.lo01 = lds32(ft + 128);
    st.lo89 = lds32(ft + 128 + 16);
    return st;
}
// The A fragment of m-block e of the step's group: a[r] = rows + 8 (r & 1), tokens + 8 (r >> 1),
// each value code x scale rounded once (dequant8's product).
__device__ __forceinline__ void vt_frag(const VtStep& st, bool one, int e, uint32_t (&a)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int hh = r & 1, ht = r >> 1;
        uint32_t v = vt_pair_bits(st.wd[2 * ht], st.wd[2 * ht + 1], 2 * e + hh);
        if (!one) v = bf16x2_mul(v, 0x5d805d80u);  // x 2^60, exact
        a[r] = vt::bf16x2_fma(v, ht ? st.hi89 : st.hi01, bf16x2_mul(v, ht ? st.lo89 : st.lo01));
    }
}

// Warpgroups 1 and 2 of the raw-ring kernel with F8R_VT: the segment loop (CP: the gather form).
template <bool CP>
__device__ __forceinline__ void f8r_vt_loop(const Params& p, const Part& part, const RawMaps* maps, TileWalk& walk,
                                            unsigned char* smem, int w, bool issuer) {
    using L = W3Layout<true, CP>;
    const uint32_t base = smem_u32(smem);
    const uint32_t sRing = base + L::OFF_RING, sQ = base + L::OFF_Q;
    const float* s_alpha = (const float*)(smem + L::OFF_RED);
    const float* s_fin = s_alpha + WGMMA_ROWS;
    float* s_pinv = (float*)(smem + L::OFF_RED) + 3 * WGMMA_ROWS;
    int* nvalid = (int*)(smem + L::OFF_NVALID);
    const uint32_t full = base + L::OFF_MBAR, empty = full + 8 * L::SLOTS, pfree = empty + 8 * L::SLOTS;
    const GmmaDesc dp(base + L::OFF_P, 16, 1024);
    const int wtid = threadIdx.x & 127, lane = threadIdx.x & 31, qd = lane & 3, wq = wtid >> 5;
    const int kw = 8 * wq + (lane >> 2);  // this thread's code word of a group
    const int row0 = blockIdx.y * WGMMA_ROWS;
    int nb = part.b;
    i64 pre = part.pre;
    Segment sg;
    int u = 0;
    int pending = -1;  // W3_CP_DEFER: the slot whose copies this thread has yet to arrive for
    while (next_segment(p, part, nb, pre, sg)) {
        f8r_split_q(p, sg.b, row0, sQ, s_pinv, threadIdx.x - 128);
        fence_proxy_async();         // Q is read by wgmma (async proxy)
        bar_sync(W3_PV_PAIR, 256);  // racecheck: Q, s_pinv and the last segment's s_fin reads
        bar_arrive(W3_Q_READY, W3_THREADS);
        float o[4][32];
#pragma unroll
        for (int m = 0; m < 4; ++m)
#pragma unroll
            for (int i = 0; i < 32; ++i) o[m][i] = 0.0f;
        for (int t = sg.t0; t < sg.t1; ++t, ++u) {
            const int slot = L::slot(u);
            const uint32_t raw = sRing + slot * F8R_SLOT;
            const float* scales = (const float*)(smem + L::OFF_RING + slot * F8R_SLOT + F8R_SCALES);
            mbar_wait(full + 8 * slot, L::phase(u));
            // Gather form: tile u + 2's rows, looked up now, copied once this tile is done.
            const bool more = CP && walk.next(p, part);
            GatherRows ahead;
            if (more) ahead = gather_rows(p, walk, threadIdx.x & 127);
            const uint32_t tab = base + L::OFF_V + slot * 1024;  // the V region is free in this form
            // Gather form: rows that do not exist were zero-filled (scale 0: factor 0).
            const bool one = vt_factors(scales, CP ? BN : nvalid[slot], tab, threadIdx.x - 128);
            if constexpr (CP) w3_cp_arrive(full, pending);  // tile u + 1's copies (W3_CP_DEFER)
            bar_sync(W3_P_FULL, W3_THREADS);  // P(u) and its rescale factors; the factor table
            {
                float al[8][2];
                bool any = false;
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        al[i][c] = s_alpha[8 * i + 2 * qd + c];
                        any |= al[i][c] != 1.0f;
                    }
                if (any) {
#pragma unroll
                    for (int m = 0; m < 4; ++m)
#pragma unroll
                        for (int i = 0; i < 8; ++i)
#pragma unroll
                            for (int jj = 0; jj < 4; ++jj) o[m][4 * i + jj] *= al[i][jj & 1];
                }
            }
            // 16 products a tile (k step ks, m-block m), each on its own A fragment: two register
            // sets, step n on a[n & 1], free again once step n - 1 is waited for.
            uint32_t a[2][4];
            VtStep st;
            if (F8R_VT_AHEAD) st = vt_step(raw, tab, 2 * w, 0, kw, qd);
#pragma unroll
            for (int ks = 0; ks < BN / 16; ++ks)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    if (!F8R_VT_AHEAD) st = vt_step(raw, tab, 2 * w + j, ks, kw, qd);
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int n = 4 * ks + 2 * j + e;
                        vt_frag(st, one, e, a[n & 1]);
                        wgmma_fence();
                        if (F8R_LAB != 3) SsRs<bf16>::qk(o[2 * j + e], a[n & 1], dp.at(2 * ks), 1);
                        wgmma_commit();
                        // F8R_VT_AHEAD: the next pair's words load under this product, before the wait.
                        if (F8R_VT_AHEAD && e == 1 && n + 1 < BN / 4)
                            st = vt_step(raw, tab, 2 * w + (j ^ 1), ks + j, kw, qd);
                        wgmma_wait<1>();
                    }
                }
            if constexpr (!CP) mbar_arrive(empty + 8 * slot);  // this thread's reads of the slot are done
            wgmma_wait<0>();
#pragma unroll
            for (int m = 0; m < 4; ++m) pin(o[m]);
            mbar_arrive(pfree);  // P(u) and its factors are read
            if constexpr (CP) {
                bar_sync(W3_WG1 + w, 128);  // every warp of the warpgroup is done with its part of the slot
                if (more) {
                    w3_gather_raw(p, ahead, raw, smem + L::OFF_VALID + slot * L::VALID_BYTES, full + 8 * slot, w,
                                  threadIdx.x & 127);
                    pending = slot;
                }
            } else {
                w3_refill<true>(issuer, walk, p, part, u, raw, empty, full, nvalid, maps);
            }
        }
        bar_sync(W3_FIN, W3_THREADS);
        // O[row][feature]: the four features 4 kw .. + 3 of group G are adjacent.
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int r = 8 * i + 2 * qd + c, row = row0 + r;
                if (row >= p.m_total) continue;
                const float l = s_fin[r];
                const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int col = 128 * (2 * w + j) + 4 * kw;
                    const float v0 = o[2 * j][4 * i + c] * inv, v1 = o[2 * j][4 * i + 2 + c] * inv;
                    const float v2 = o[2 * j + 1][4 * i + c] * inv, v3 = o[2 * j + 1][4 * i + 2 + c] * inv;
                    if (sg.whole) {
                        const int s = row / p.N, h = row - s * p.N;
                        bf16* out = (bf16*)p.out + sg.b * p.o_sb + s * p.o_ss + h * p.o_sh + col;
                        reinterpret_cast<uint32_t*>(out)[0] = pack2<bf16>(v0, v1);
                        reinterpret_cast<uint32_t*>(out + 2)[0] = pack2<bf16>(v2, v3);
                    } else {
                        store_part2(p, sg.slot, row, col, v0, v1);
                        store_part2(p, sg.slot, row, col + 2, v2, v3);
                    }
                }
            }
        if (w == 0 && wtid < WGMMA_ROWS && row0 + wtid < p.m_total) {
            const float l = s_fin[wtid];
            store_lse<bf16>(p, sg, row0 + wtid, l > 0.0f ? s_fin[WGMMA_ROWS + wtid] + log2f(l) : vt::neg_inf());
        }
    }
}

// Warpgroup 0, 16-bit form: S = Q K^T over the stage at kst (wgmma_sm90.cuh's qk_tile).
template <typename T>
__device__ __forceinline__ void w3_qk16(float (&s)[32], const GmmaDesc& dq, uint32_t kst) {
    if (F8R_LAB == 2) {
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.0f;
        return;
    }
    qk_tile<T>(s, dq, kst);
}

// The 16-bit TMA form: qk_tile with column block cb's four k steps issued once its own FULL barrier
// (at bars + 8 cb) has completed phase `parity`, so S runs while the tile's later boxes land.
// The products stay in flight across the waits and after the return (one commit; then
// w3_qk16_wait).
template <typename T>
__device__ __forceinline__ void w3_qk16_issue(float (&s)[32], const GmmaDesc& dq, uint32_t kst, uint32_t bars,
                                              int parity) {
    const GmmaDesc dk(kst, 16, 1024);
#pragma unroll
    for (int cb = 0; cb < NSUB; ++cb) {
        mbar_wait(bars + 8 * cb, parity);
        wgmma_fence();
        if (F8R_LAB != 2) qk_block<T>(s, dq, dk, cb);
    }
    wgmma_commit();
}
// S complete in s (after w3_qk16_issue; lab 2: zeroed).
__device__ __forceinline__ void w3_qk16_wait(float (&s)[32]) {
    wgmma_wait<0>();
    pin(s);
    if (F8R_LAB == 2) {
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.0f;
    }
}

// Warpgroups 1 and 2, 16-bit form: zeroes rows [nv, 64) of the warpgroup's V columns (column
// blocks 4 w' .. 4 w' + 3 of the stage at kst) and publishes them to its wgmma.
__device__ __forceinline__ void w3_zero_tail(uint32_t kst, int nv, int w, int wtid) {
    for (int idx = wtid; idx < (BN - nv) * 32; idx += 128) {
        const int r = nv + (idx >> 5), c = idx & 31;  // c: 16-byte chunk of the half's 32
        st_shared_v4_zero(kst + (4 * w + (c >> 3)) * SUB_BYTES + swz(r, c & 7));
    }
}

// Warpgroups 1 and 2's epilogue from registers: rows r_lo, r_lo + 8 of the CTA, columns col0 +
// 8 i + 2 qd (+1), scaled by 1 / l; with_lse: also lse. fin(k): the segment's row sum (k = hi) or
// maximum (k = 2 + hi) of row r_lo + 8 hi (s_fin's: row sums [64], then maxima [64]).
// (The row's base address is computed once: with store_pair in the loop ptxas did not unroll
// it and put o in local memory.)
template <typename T, class Fin>
__device__ __forceinline__ void w3_store(const Params& p, const Segment& sg, int row0, const float (&o)[128],
                                          Fin fin, int r_lo, int qd, int col0, bool with_lse) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const int r = r_lo + 8 * hi, row = row0 + r;
        if (row >= p.m_total) continue;
        const float l = fin(hi);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const int col = col0 + 2 * qd;
        if (sg.whole) {
            const int s = row / p.N, h = row - s * p.N;
            T* out = (T*)p.out + sg.b * p.o_sb + s * p.o_ss + h * p.o_sh + col;
#pragma unroll
            for (int i = 0; i < 32; ++i)
                *reinterpret_cast<uint32_t*>(out + 8 * i) = pack2<T>(o[4 * i + 2 * hi] * inv, o[4 * i + 2 * hi + 1] * inv);
        } else {
            float* out = part_row(p, sg.slot, row, col);
#pragma unroll
            for (int i = 0; i < 32; ++i)
                *reinterpret_cast<float2*>(out + 8 * i) = make_float2(o[4 * i + 2 * hi] * inv, o[4 * i + 2 * hi + 1] * inv);
        }
        if (with_lse && qd == 0) store_lse<T>(p, sg, row, l > 0.0f ? fin(2 + hi) + log2f(l) : vt::neg_inf());
    }
}

// CP: the gather form (maps unused: null). PAIR: the 16-bit TMA form as CTA pairs (the entry
// point's __cluster_dims__(1, 2, 1)): the two row blocks of a part read each tile once, each
// CTA's issuer taking every other column block, multicast to both; EMPTY then counts both
// CTAs' warps (one arrival a warp, local and remote), so neither CTA refills a slot the other
// still reads, and the CTAs leave together (cluster barriers at the start and the end).
template <typename T, bool RAW, bool CP = false, bool PAIR = false, bool PG = false>
__device__ void decode_wgmma_3wg(const Params& p, const W3Maps<RAW>* maps) {
    static_assert(!RAW || Same<T, bf16>::value, "fp8: bf16 queries (the rope product takes the cache's bf16 rope)");
    using L = W3Layout<RAW, CP>;
    constexpr int MT = WGMMA_ROWS;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = align1024(smem_raw);
    const uint32_t base = smem_u32(smem);
    const uint32_t sRing = base + L::OFF_RING, sV = base + L::OFF_V, sQ = base + L::OFF_Q, sP = base + L::OFF_P;
    float* s_alpha = (float*)(smem + L::OFF_RED);  // [64] rescale factors of the current tile
    float* s_fin = s_alpha + MT;                    // [2][64] row sums and maxima of the segment
    float* s_pinv = s_fin + 2 * MT;                 // [64] fp8: 2^-e of each query row
    int* nvalid = (int*)(smem + L::OFF_NVALID);
    int* sched = (int*)(smem + L::OFF_SCHED);
    // FULL: slot s's barrier (or its first column block's) at full + L::FULL_STRIDE * s.
    const uint32_t full = base + L::OFF_FULL, empty = base + L::OFF_MBAR + 8 * L::SLOTS, pfree = empty + 8 * L::SLOTS;
    auto scales_of = [&](int slot) { return (const float*)(smem + L::OFF_RING + slot * L::SLOT + F8R_SCALES); };
    auto flags_of = [&](int slot) { return smem + L::OFF_VALID + slot * L::VALID_BYTES; };  // gather form
    const bool tl0 = MLA_TIMELINE && threadIdx.x == 0, tl1 = MLA_TIMELINE && threadIdx.x == 128;  // lab stamps
    if (tl0) MLA_TL_SET(TL_ENTRY, MLA_TL_NOW());
    static_assert(!PAIR || (!RAW && !CP), "the pair form: 16-bit TMA tiles");
    static_assert(!PG || (!RAW && !CP), "pages of 16 or 32 rows: the 16-bit TMA forms");
    const uint32_t peer = PAIR ? cluster_ctarank() ^ 1u : 0u;
    if (threadIdx.x == 0) {
        for (int s = 0; s < L::SLOTS; ++s) {
            for (int cb = 0; cb < L::NFULL; ++cb) mbar_init(full + L::FULL_STRIDE * s + 8 * cb, CP ? 256 : 1);
            mbar_init(empty + 8 * s, PAIR ? 2 * W3_THREADS / 32 : W3_THREADS);
        }
        mbar_init(pfree, 256);
        if (PAIR) fence_mbar_init_cluster();
    }
    if constexpr (PAIR) cluster_sync();  // both CTAs' barriers exist before any remote arrival or multicast
    // A thread's release of a slot: PAIR, one arrival a warp on both CTAs' EMPTY.
    auto release = [&](uint32_t bar) {
        if constexpr (PAIR) {
            __syncwarp();
            if ((threadIdx.x & 31) == 0) {
                mbar_arrive(bar);
                mbar_arrive_cluster(mapa_shared(bar, peer));
            }
        } else {
            mbar_arrive(bar);
        }
    };
    grid_dep_launch();
    // find_part's block barriers also publish the mbarriers' initialization.
    const Part part = find_part(p, sched, (int*)(smem + L::OFF_P), MT * 128 / 4);  // P: free until the first tile
    if (tl0) MLA_TL_SET(TL_PART, MLA_TL_NOW());
    const int wg = threadIdx.x >> 7, wtid = threadIdx.x & 127, wwarp = wtid >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, qd = lane & 3, r_lo = wwarp * 16 + g;
    const int row0 = blockIdx.y * MT;
    int nb = part.b;
    i64 pre = part.pre;
    Segment sg;
    int u = 0;  // the CTA's running tile count: slot L::slot(u), fill L::phase(u)

    // F8R_REGS (fp8 form, on by default): registers moved from warpgroup 0 to warpgroups 1 and 2,
    // whose V^T loop spills at 168 (ptxas allocates per region after setmaxnreg).
    constexpr bool MOVE_REGS = RAW && !CP && F8R_REGS != 0;
    constexpr int REGS0 = F8R_REGS == 2 ? 136 : 152, REGS12 = F8R_REGS == 2 ? 184 : 176;
    static_assert(REGS0 + 2 * REGS12 <= 3 * 168, "setmaxnreg moves, never adds, registers");
    if (wg == 0) {
        if constexpr (MOVE_REGS) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS0) : "memory");
        const GmmaDesc dq(sQ, 16, 1024);
        int tl_segs = 0;
        unsigned long long tl_fin = 0;  // (lab stamps) the last FIN's time
        while (next_segment(p, part, nb, pre, sg)) {
            uint32_t rq[4][4];
            if constexpr (RAW) f8r_load_rope(p, sg.b, row0, r_lo, qd, rq);
            const RowLimits rl(p, sg, row0, r_lo);
            const float c = p.scale_log2;
            float m_run[2] = {vt::neg_inf(), vt::neg_inf()}, l_run[2] = {0.0f, 0.0f};
            const unsigned long long tq = MLA_TL_NOW();
            if (tl0 && tl_fin != 0) MLA_TL_ADD(TL_NEXT0, tq - tl_fin);
            bar_sync(W3_Q_READY, W3_THREADS);  // Q (fp8: its parts and 2^-e) of this segment
            if (tl0) {
                const unsigned long long now = MLA_TL_NOW();
                MLA_TL_ADD(TL_WAIT_Q0, now - tq);
                if (tl_segs == 0) MLA_TL_SET(TL_Q0, now);
                MLA_TL_SET(TL_QLAST, now);
                MLA_TL_SET(TL_SEGS, ++tl_segs);
            }
            float pinv[2] = {1.0f, 1.0f};
            if constexpr (RAW) pinv[0] = s_pinv[r_lo], pinv[1] = s_pinv[r_lo + 8];
            for (int t = sg.t0; t < sg.t1; ++t, ++u) {
                const int slot = L::slot(u);
                float s[32];
                if constexpr (L::NFULL > 1) {
                    // The 16-bit TMA form: S's products issued as each column block lands.
                    const unsigned long long tf = MLA_TL_NOW();
                    w3_qk16_issue<T>(s, dq, sRing + slot * L::SLOT, full + L::FULL_STRIDE * slot, L::phase(u));
                    const unsigned long long tw = MLA_TL_NOW();
                    w3_qk16_wait(s);
                    if (tl0) {
                        const unsigned long long now = MLA_TL_NOW();
                        MLA_TL_ADD(TL_WAIT_FULL0, tw - tf);
                        MLA_TL_ADD(TL_WAIT_S0, now - tw);
                        if (u == 0) MLA_TL_SET(TL_TILE0, now);
                        const int un = u + 1;  // has tile t + 1 landed already?
                        if (t + 1 < sg.t1 && mbar_test(full + L::FULL_STRIDE * L::slot(un) + 8 * (NSUB - 1), L::phase(un)))
                            MLA_TL_ADD(TL_LANDED0, 1);
                    }
                } else {
                    const unsigned long long tf = MLA_TL_NOW();
                    mbar_wait(full + L::FULL_STRIDE * slot, L::phase(u));
                    if (tl0) {
                        const unsigned long long now = MLA_TL_NOW();
                        MLA_TL_ADD(TL_WAIT_FULL0, now - tf);
                        if (u == 0) MLA_TL_SET(TL_TILE0, now);
                    }
                    // Gather form: the tile was written by cp.async (the generic proxy), S
                    // reads it as wgmma operands (the async proxy).
                    if constexpr (CP) fence_proxy_async();
                    if constexpr (RAW) {
                        f8r_qk(s, dq, sRing + slot * F8R_SLOT, scales_of(slot), rq, pinv, qd);
                    } else {
                        w3_qk16<T>(s, dq, sRing + slot * L::SLOT);
                    }
                }
                float alpha[2];
                uint32_t pk[16];
                const unsigned long long tsm = MLA_TL_NOW();
                if constexpr (CP) {
                    const unsigned char* fl = flags_of(slot);
                    const bool whole =
                        t * BN + BN <= rl.lim_min && *reinterpret_cast<const unsigned long long*>(fl + BN) == 0ull;
                    softmax_tile<T>(s, whole, t * BN, rl, [&](int col) { return fl[col] != 0; }, qd, c, m_run,
                                    l_run, alpha, pk);
                } else if constexpr (PG) {
                    const int nw = nvalid[slot], nv = nw & W3_PG_COUNT;  // bad groups make nw != BN
                    release(empty + 8 * slot);  // this thread's reads of the slot are done
                    softmax_tile<T>(s, t * BN + BN <= rl.lim_min && nw == BN, t * BN, rl,
                                    [&](int col) { return col < nv && ((nw >> (8 + (col >> 4))) & 1) == 0; }, qd,
                                    c, m_run, l_run, alpha, pk);
                } else {
                    const int nv = nvalid[slot];
                    release(empty + 8 * slot);  // this thread's reads of the slot are done
                    softmax_tile<T>(s, t * BN + BN <= rl.lim_min && nv == BN, t * BN, rl,
                                    [&](int col) { return col < nv; }, qd, c, m_run, l_run, alpha, pk);
                }
                const unsigned long long tp = MLA_TL_NOW();
                if (u >= 1) mbar_wait(pfree, (u - 1) & 1);  // warpgroups 1 and 2 are done with P(u - 1)
                const unsigned long long ts = MLA_TL_NOW();
                store_p_rows(sP, pk, wwarp, lane);
                if (qd == 0) {
                    s_alpha[r_lo] = alpha[0];
                    s_alpha[r_lo + 8] = alpha[1];
                }
                fence_proxy_async();     // P is read by wgmma (async proxy)
                bar_sync(BAR_WG0, 128);  // racecheck takes a write as published at a barrier it syncs
                bar_arrive(W3_P_FULL, W3_THREADS);
                if (tl0) {
                    MLA_TL_ADD(TL_SOFTMAX0, (tp - tsm) + (MLA_TL_NOW() - ts));
                    MLA_TL_ADD(TL_WAIT_PFREE0, ts - tp);
                }
            }
            store_fin(s_fin, l_run, m_run, r_lo, qd);
            bar_sync(BAR_WG0, 128);  // (racecheck, as above; it also orders this segment's s_pinv reads)
            bar_arrive(W3_FIN, W3_THREADS);
            if (tl0) {
                const unsigned long long now = MLA_TL_NOW();
                if (tl_segs == 1) MLA_TL_SET(TL_SEG0_END, now);
                MLA_TL_SET(TL_END0, now);
                tl_fin = now;
            }
        }
        if (tl0) MLA_TL_SET(TL_TILES, u);
        if constexpr (PAIR) cluster_sync();  // the peer may still arrive here or multicast into this CTA
        return;
    }

    // Warpgroups 1 and 2: V columns 256 w .. 256 w + 255.
    if constexpr (MOVE_REGS) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS12) : "memory");
    const int w = wg - 1;
    const uint32_t sVh = sV + 4 * w * SUB_BYTES;  // fp8: the warpgroup's half of the V stage
    const GmmaDesc dp(sP, 16, 1024), dv(sVh, SUB_BYTES, 1024);
    const int tok = wtid >> 1, grp = 2 * w + (wtid & 1);
    const bool issuer = threadIdx.x == 128;
    TileWalk walk(part);  // gather form: every thread of warpgroups 1 and 2 walks the tiles
    if constexpr (CP) {
        int filled = 0;
        for (int v = 0; v < L::SLOTS && walk.next(p, part); ++v, ++filled) {
            const GatherRows rows = gather_rows(p, walk, wtid);
            if constexpr (RAW) {
                w3_gather_raw(p, rows, sRing + v * L::SLOT, flags_of(v), full + 8 * v, w, wtid);
            } else {
                w3_gather<T>(p, rows, sRing + v * L::SLOT, flags_of(v), full + 8 * v, w, wtid);
            }
        }
        static_assert(L::SLOTS == 2, "the deferred arrivals below count two groups");
        if (W3_CP_DEFER && filled == 2) {  // slot 0's group first, while slot 1's may still fly
            cp_async_wait<1>();
            mbar_arrive(full);
            cp_async_wait<0>();
            mbar_arrive(full + 8);
        } else if (W3_CP_DEFER && filled == 1) {
            cp_async_wait<0>();
            mbar_arrive(full);
        }
    } else if (issuer) {
        if constexpr (RAW) {
            prefetch_map(&maps->rows);
            prefetch_map(&maps->scales);
        } else {
            prefetch_map(maps);
        }
        for (int v = 0; v < L::SLOTS && walk.next(p, part); ++v) {
            w3_issue<RAW, PAIR, PG>(p, w3_lookup<PG>(p, walk), sRing + v * L::SLOT, nvalid + v,
                                    full + L::FULL_STRIDE * v, maps);
        }
    }
    __syncwarp();
    constexpr bool VT = RAW && F8R_VT;
    if constexpr (VT) f8r_vt_loop<CP>(p, part, maps, walk, smem, w, issuer);
    bool q_loaded = false;  // (lab 6)
    int pending = -1;  // W3_CP_DEFER: the slot whose copies this thread has yet to arrive for
    while (!VT && next_segment(p, part, nb, pre, sg)) {
        const unsigned long long tql = MLA_TL_NOW();
        if constexpr (RAW) {
            f8r_split_q(p, sg.b, row0, sQ, s_pinv, threadIdx.x - 128);
        } else if constexpr (CP) {
            w3_load_q_regs<T>(p, sg.b, row0, sQ, threadIdx.x - 128);
        } else if (F8R_LAB != 6 || !q_loaded) {
            load_q<T, MT, 256>(p, sg.b, row0, sQ, threadIdx.x - 128);
            cp_async_commit();
            cp_async_wait<0>();
            q_loaded = true;
        }
        fence_proxy_async();         // Q is read by wgmma (async proxy)
        bar_sync(W3_PV_PAIR, 256);  // racecheck: Q, s_pinv and the last segment's s_fin reads
        bar_arrive(W3_Q_READY, W3_THREADS);
        if (tl1) MLA_TL_ADD(TL_QLOAD1, MLA_TL_NOW() - tql);
        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        for (int t = sg.t0; t < sg.t1; ++t, ++u) {
            const int slot = L::slot(u);
            const uint32_t kst = sRing + slot * L::SLOT;
            const unsigned long long tf = MLA_TL_NOW();
            if constexpr (L::NFULL > 1) {
                // The 16-bit TMA form: the warpgroup's own V blocks 4 w .. + 3 (each publishes nvalid).
#pragma unroll
                for (int cb = 4 * w; cb < 4 * w + 4; ++cb) mbar_wait(full + L::FULL_STRIDE * slot + 8 * cb, L::phase(u));
            } else {
                mbar_wait(full + L::FULL_STRIDE * slot, L::phase(u));
            }
            if (tl1) MLA_TL_ADD(TL_WAIT_FULL1, MLA_TL_NOW() - tf);
            // Gather form: tile u + 2's rows are looked up below, after this tile's proxy fence
            // (a fence would wait for their loads), and copied once this tile is done with the slot.
            bool more = false;
            GatherRows ahead;
            if constexpr (RAW) {
                // Every thread's P V(u - 1) is done with the V half (a warp's wgmma wait covers its
                // own rows only; P_FREE counts all 256 threads; F8R_OWNV: the barrier after P V).
                if (!F8R_OWNV && u >= 1) mbar_wait(pfree, (u - 1) & 1);
                // Gather form: rows that do not exist were zero-filled (codes and scale 0).
                f8r_dequant_v(sRing + slot * F8R_SLOT, scales_of(slot), sVh, CP ? BN : nvalid[slot], tok, grp);
                if constexpr (!CP) mbar_arrive(empty + 8 * slot);  // this thread's reads of the slot are done
                fence_proxy_async();            // V is read by wgmma (async proxy)
                bar_sync(W3_WG1 + w, 128);      // the warpgroup's V half is written (gather form: and
                                                // its part of the slot read)
                if constexpr (CP) {
                    more = walk.next(p, part);
                    if (more) ahead = gather_rows(p, walk, wtid);
                } else {
                    w3_refill<RAW>(issuer, walk, p, part, u, sRing + slot * F8R_SLOT, empty, full, nvalid, maps);
                }
            } else if constexpr (CP) {
                fence_proxy_async();  // the tile was written by cp.async; P V reads V as wgmma operands
                more = walk.next(p, part);
                if (more) ahead = gather_rows(p, walk, wtid);
            } else {
                // The same in every thread: the branch is uniform. PG: bad pages read zeros already.
                const int nv = PG ? nvalid[slot] & W3_PG_COUNT : nvalid[slot];
                if (nv < BN) {
                    w3_zero_tail(kst, nv, w, wtid);
                    fence_proxy_async();        // V is read by wgmma (async proxy)
                    bar_sync(W3_WG1 + w, 128);  // the warpgroup's rows are zeroed
                }
            }
            if constexpr (CP) w3_cp_arrive(full, pending);  // tile u + 1's copies (W3_CP_DEFER)
            const unsigned long long tp = MLA_TL_NOW();
            bar_sync(W3_P_FULL, W3_THREADS);  // P(u) and its rescale factors
            if (tl1) MLA_TL_ADD(TL_WAIT_PFULL1, MLA_TL_NOW() - tp);
            const unsigned long long tpv = MLA_TL_NOW();
            rescale(o, s_alpha[r_lo], s_alpha[r_lo + 8]);
            if (F8R_LAB != 3) pv_tile<T, 128>(o, dp, RAW ? dv : GmmaDesc(kst + 4 * w * SUB_BYTES, SUB_BYTES, 1024));
            if (tl1) MLA_TL_ADD(TL_PV1, MLA_TL_NOW() - tpv);
            if constexpr (RAW) {
                mbar_arrive(pfree);  // P(u), its factors and the V half are read
                if (F8R_OWNV) bar_sync(W3_WG1 + w, 128);  // this warpgroup's P V(u) is done with its V half
                // Gather form: warpgroup 0's S(u) was done before P_FULL(u), this warpgroup's
                // dequantization before its barrier above: its part of the slot is free.
                if constexpr (CP)
                    if (more) {
                        w3_gather_raw(p, ahead, kst, flags_of(slot), full + 8 * slot, w, wtid);
                        pending = slot;
                    }
            } else if constexpr (CP) {
                mbar_arrive(pfree);         // P(u) and its factors are read
                bar_sync(W3_WG1 + w, 128);  // every warp of the warpgroup is done with its V half
                if (more) {
                    w3_gather<T>(p, ahead, kst, flags_of(slot), full + 8 * slot, w, wtid);
                    pending = slot;
                }
            } else {
                release(empty + 8 * slot);  // this thread's P V has read V in the slot
                mbar_arrive(pfree);             // P(u) and its factors are read
                w3_refill<RAW, PAIR, PG>(issuer, walk, p, part, u, kst, empty, full, nvalid, maps);
            }
        }
        const unsigned long long tfin = MLA_TL_NOW();
        bar_sync(W3_FIN, W3_THREADS);
        const unsigned long long ts = MLA_TL_NOW();
        if (tl1) MLA_TL_ADD(TL_WAIT_FIN1, ts - tfin);
        // The segment's row sums (k = 0, 1) and maxima (k = 2, 3) of rows r_lo, r_lo + 8 (s_fin: sums
        // [64], then maxima [64]).
        auto fin = [&](int k) { return s_fin[(k >> 1) * MT + r_lo + 8 * (k & 1)]; };
        if (F8R_LAB != 5 || p.m_total < 0) {
            // (Lab 5: a condition the compiler cannot decide, so O and its products stay.)
            w3_store<T>(p, sg, row0, o, fin, r_lo, qd, 256 * w, w == 0);
        }
        if (tl1) {
            const unsigned long long now = MLA_TL_NOW();
            MLA_TL_ADD(TL_STORE1, now - ts);
            MLA_TL_SET(TL_END1, now);
        }
    }
    if constexpr (PAIR) cluster_sync();  // (as warpgroup 0's)
}

}  // namespace mla
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
