// MlaDecodeAttention, the 64-row wgmma kernel over an fp8_ds_mla cache (sm_90a only):
// mla_decode_wgmma_fp8_{bf16,f16}. Planned by crates/vt-cuda/src/mla_decode_attention/
// wgmma_sm90.rs (`fp8`). Part of mla_decode_attention.cu.
//
// The 16-bit kernel's layout (wgmma_sm90.cuh: Q, two 72 KB 16-bit KV stages, P) and its two
// compute warpgroups, plus a third that feeds the stages: 384 threads.
// - Warpgroup 0: consumer_tiles (S = Q K^T, the online softmax, P, O[:, 0:256] += P V).
// - Warpgroup 1: O[:, 256:512] += P V only.
// - Warpgroup 2 (dequantizer): Q by cp.async, then per tile the 656-byte rows straight from
//   global memory into registers (16-byte ld.global.nc, pipelined by 32-token rounds: one
//   round's loads fly while the other is dequantized or the stage is awaited), dequantized
//   and stored as the 16-bit swizzled tile the 16-bit kernel would have loaded. No room for a
//   raw ring in shared memory beside Q and two 16-bit stages, so the registers are the ring.
// setmaxnreg moves registers from warpgroups 1 and 2 to warpgroup 0 (FP8_REGS).
//
// Named barriers: K_FULL[st] (warpgroup 2 arrives once the tile and, for the first, Q are
// stored; warpgroup 0 syncs), P_FULL / P_FREE as in the 16-bit kernel (warpgroups 0 and 1),
// V_FREE[st] with 384 threads (warpgroups 0 and 1 arrive after their P V of the tile in that
// stage, warpgroup 2 syncs before it overwrites it). The epilogue (both compute warpgroups
// stage O in the KV stages) follows a hand-over between them, and warpgroup 2 refills the
// stages once both copy-outs are done (BAR_EPI_*).
//
// Dequantization (bf16 queries): a code's bits moved into a bf16 pattern by integer ops
// (vt::e4m3x2_bits: value x 2^-120, exact for every code, subnormals included; the
// conversion of the fp8 matmul kernels without its x 2^120), then one bf16x2 multiply and
// one fma by the group's scale x 2^120 split into two bf16 parts (through 2^60 for a scale
// >= 2^7), so the value is e4m3 x scale rounded once, as the CPU reference has it, but for
// the low part's own rounding (2^-18 relative). (One multiply by the scale rounded to bf16
// scaled each 128-value group by a common error of up to 2^-9: in the eighth session the
// sparse tests' lse came out 0.3% off.) This avoids the f32 -> bf16 conversions, which run
// at a quarter of the integer rate (FlashMLA's analysis,
// docs/20250929-hopper-fp8-sparse-deep-dive.md there). Codes 0x7f / 0xff (e4m3
// NaN, which the encoder writes only for a NaN input) decode finite here. f16 queries use the
// exact f32 path of fp8_tiles.cuh (codes8).
#pragma once

#include "e4m3.cuh"
#include "mla_decode_attention/fp8_tiles.cuh"
#include "mla_decode_attention/wgmma_sm90.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace mla {

constexpr int FP8_WG_THREADS = 384;  // three warpgroups
// The epilogue's hand-overs, each with one waiting side (each warpgroup runs its own loop,
// and a named barrier synced from several code sites is divergent to synccheck):
//   BAR_EPI_WG1  warpgroup 1 is done with the stages      WG1 arrives, WG0 syncs (256)
//   BAR_EPI_WG0  warpgroup 0 too, and s_fin is written     WG0 arrives, WG1 syncs (256)
//   epi_done     both copy-outs are done                   an mbarrier of 256 arrivals (the
//                16-bit layout's first TMA stage barrier, unused here) that warpgroup 2
//                waits on: its arrive releases the copy-outs' reads to warpgroup 2's next
//                stores (with a named barrier arrived there, racecheck reported them).
// A barrier's next arrival comes only after the other side has passed its wait (the next
// segment's tiles need it), so no two generations mix.
constexpr int BAR_EPI_WG1 = 11, BAR_EPI_WG0 = 12;
// Registers per thread after setmaxnreg, warpgroups 0, 1, 2. The block holds what it was
// launched with (65536 / 384 rounded down to 8: 168 a thread) and setmaxnreg only moves
// them: a larger sum leaves warpgroup 0's increase waiting forever (it hung at 512).
// ptxas -v: warpgroup 1 spills at 152 (o[128] lives there), warpgroup 0 does not at 192;
// 152 for warpgroup 2 (was 136) measured 4% faster with its scales loaded first (perf.md).
constexpr int FP8_REGS[3] = {192, 160, 152};
static_assert(FP8_REGS[0] + FP8_REGS[1] + FP8_REGS[2] <= 3 * 168, "setmaxnreg moves, never adds, registers");

// One thread's share of one round (32 tokens) of a tile's raw rows: 16 codes of each of the
// 8 64-feature blocks, 2 of the 8 rope chunks, the row's 4 scales.
struct Fp8Raw {
    uint4 code[8];
    uint4 rope[2];
    float4 sc;
};

// The rows allocate in L1 (evict_last), not bypass it: a 656-byte row is not 32-byte aligned,
// so a row's 64-byte lane groups straddle sectors that the next group reads again, and from L1
// the second read is a hit (with the next tile's offsets loaded a tile ahead, below: sparse
// decode 0.79-0.85x its time at 64 heads, 0.91-0.92x at 128 on the CTA pair, which shares this
// loader; docs/perf.md, "Twenty-eighth session").
__device__ __forceinline__ uint4 ld_nc_v4(const unsigned char* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::evict_last.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// The factor f that takes value x 2^-120 to value x scale s (one: f = s x 2^120, finite for
// s < 2^7, every sane cache; else the value is first taken x 2^60, exactly, and f = s x
// 2^60), as a bf16 pair hi + lo: hi = f rounded to bf16, lo = the remainder rounded. A
// product by hi alone would scale all 128 values of a group by the same rounding error (up
// to 2^-9: a bias, not noise, which moved the sparse tests' lse by 0.3%).
struct Bf16Factor {
    uint32_t hi, lo;  // bf16x2 (both halves equal)
};
__device__ __forceinline__ Bf16Factor bf16_factor(float s, bool one) {
    const float f = one ? s * 0x1p120f : s * 0x1p60f;
    const uint32_t hi = pack2<bf16>(f, f);
    const float rest = f - __uint_as_float(hi << 16);  // exact (Sterbenz)
    return {hi, pack2<bf16>(rest, rest)};
}

// Eight codes (words lo, hi) x the scale as the four words of one 16-byte chunk of a 16-bit
// tile row. f: bf16_factor(s, one); one (warp-uniform): no pre-multiply by 2^60. bf16:
// value x 2^-120 by integer ops, then v x hi + (v x lo) in one fma: the product rounded
// once but for the tiny (2^-9 relative) v x lo term, as the CPU reference rounds it.
template <typename T>
__device__ __forceinline__ void dequant8(uint32_t lo, uint32_t hi, float s, const Bf16Factor& f, bool one,
                                         uint32_t (&out)[4]) {
    if constexpr (Same<T, bf16>::value) {
        // value x 2^-120 (e4m3.cuh), codes 0-1, 2-3, 4-5, 6-7.
        out[0] = vt::e4m3x2_bits<bf16>(lo, false);
        out[1] = vt::e4m3x2_bits<bf16>(lo, true);
        out[2] = vt::e4m3x2_bits<bf16>(hi, false);
        out[3] = vt::e4m3x2_bits<bf16>(hi, true);
        if (!one) {
#pragma unroll
            for (int q = 0; q < 4; ++q) out[q] = bf16x2_mul(out[q], 0x5d805d80u);  // x 2^60, exact
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) out[q] = vt::bf16x2_fma(out[q], f.hi, bf16x2_mul(out[q], f.lo));
    } else {
        codes8<T>(lo, hi, s, out);
    }
}

// Warpgroup 2's rows: lane (tok, q) of warp w holds token w * 8 + (lane & 7) + 32 round of a
// tile and its 16-byte column chunks q + 4 k: four lanes read 64 contiguous bytes of a row
// per load (whole sectors), and the 8 tokens of a store hit 8 distinct swizzled chunks.
struct Fp8RegLoader {
    const unsigned char* cache;
    int warp, lane, q, tok0;

    __device__ __forceinline__ Fp8RegLoader(const Params& p, int wtid)
        : cache((const unsigned char*)p.cache), warp(wtid >> 5), lane(wtid & 31), q((wtid & 31) >> 3),
          tok0((wtid >> 5) * 8 + (wtid & 7)) {}

    // The byte offset of this lane's token row of round r of `tile`; -1: no token, -2: its
    // block id is outside the cache.
    __device__ __forceinline__ i64 row_of(const Params& p, const Segment& sg, int tile, int r) const {
        return token_row(p, sg, tile, tile * BN + tok0 + 32 * r);
    }
    // The same row looked up only (row_offset finishes it where it is used).
    __device__ __forceinline__ RowRef ref_of(const Params& p, const Segment& sg, int tile, int r) const {
        return row_ref(p, sg, tile, tile * BN + tok0 + 32 * r);
    }

    // Missing rows read as zeros (codes and scales 0 decode to 0).
    __device__ __forceinline__ void load(i64 off, Fp8Raw& r) const {
        if (off < 0) {
#pragma unroll
            for (int k = 0; k < 8; ++k) r.code[k] = make_uint4(0, 0, 0, 0);
            r.rope[0] = r.rope[1] = make_uint4(0, 0, 0, 0);
            r.sc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            return;
        }
        const unsigned char* row = cache + off;
        // The scales first: store() uses them first (ncu, eighth session: the first use of
        // the scales, loaded last, was warpgroup 2's largest stall).
        const uint4 s = ld_nc_v4(row + vt::fp8ds::SCALE_OFFSET);
#pragma unroll
        for (int k = 0; k < 8; ++k) r.code[k] = ld_nc_v4(row + 64 * k + 16 * q);
        r.sc = make_float4(__uint_as_float(s.x), __uint_as_float(s.y), __uint_as_float(s.z), __uint_as_float(s.w));
#pragma unroll
        for (int h = 0; h < 2; ++h) r.rope[h] = ld_nc_v4(row + vt::fp8ds::ROPE_OFFSET + 16 * (q + 4 * h));
    }

    // The latent codes of one round as 16-bit chunks (chunks 2q, 2q + 1 of every column
    // block); one: warp-uniform, every lane's scales take the one-multiply form. put(o, v)
    // stores the 16 bytes v at byte offset o of the stage.
    template <typename T, typename Put>
    __device__ __forceinline__ void store_codes(const Put& put, int tok, const Fp8Raw& raw, const float (&scs)[4],
                                                bool one) const {
        // A scale group's factor once, not per 64-value block (twenty-ninth session).
        Bf16Factor fs[4];
#pragma unroll
        for (int g = 0; g < 4; ++g) fs[g] = bf16_factor(scs[g], one);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint4 c = raw.code[k];
            const float sc = scs[k >> 1];
            const Bf16Factor f = fs[k >> 1];
            uint32_t out[4];
            dequant8<T>(c.x, c.y, sc, f, one, out);  // features 64 k + 16 q ..
            put(k * SUB_BYTES + swz(tok, 2 * q), out);
            dequant8<T>(c.z, c.w, sc, f, one, out);
            put(k * SUB_BYTES + swz(tok, 2 * q + 1), out);
        }
    }

    // Stores round r's rows as 16-bit rows through put (swizzled column blocks, the 16-bit
    // kernel's layout: see store_codes).
    template <typename T, typename Put>
    __device__ __forceinline__ void store_rows(const Put& put, int r, const Fp8Raw& raw) const {
        const int tok = tok0 + 32 * r;
        const float scs[4] = {raw.sc.x, raw.sc.y, raw.sc.z, raw.sc.w};
        // Warp-uniform: the one-multiply form unless a lane holds a scale >= 2^7 (a NaN scale
        // gives NaN either way).
        const bool one = fmaxf(fmaxf(scs[0], scs[1]), fmaxf(scs[2], scs[3])) < 0x1p7f;
        // Taken once a round: as an argument, each bf16 dequant8 branched on it (16 branches a
        // round, each a scheduling barrier between chunks; 1-1.5% of sparse decode, twenty-ninth
        // session). f16 does not use it: one copy.
        const bool all_one = __all_sync(0xffffffffu, one);
        if (Same<T, bf16>::value && all_one) {
            store_codes<T>(put, tok, raw, scs, true);
        } else {
            store_codes<T>(put, tok, raw, scs, Same<T, bf16>::value ? false : all_one);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            uint32_t rp[4] = {raw.rope[h].x, raw.rope[h].y, raw.rope[h].z, raw.rope[h].w};
            bf16x8_as<T>(rp);
            put((NSUB - 1) * SUB_BYTES + swz(tok, q + 4 * h), rp);
        }
    }

    // Publishes round r's tokens: whether each row exists, and per warp whether a block id
    // was outside the cache (every lane calls this: a ballot).
    __device__ __forceinline__ void publish(int r, i64 off, unsigned char* valid, unsigned char* flags) const {
        if (q == 0) valid[tok0 + 32 * r] = off >= 0 ? 1 : 0;
        const unsigned bad = __ballot_sync(0xffffffffu, off == -2);
        if (lane == 0) flags[2 * warp + r] = bad != 0u ? 1 : 0;
    }

    // Stores round r of the tile as 16-bit rows into the stage at dst and publishes its tokens.
    template <typename T>
    __device__ __forceinline__ void store(uint32_t dst, int r, const Fp8Raw& raw, i64 off, unsigned char* valid,
                                          unsigned char* flags) const {
        store_rows<T>([dst](uint32_t o, const uint32_t (&v)[4]) { st_shared_v4(dst + o, v); }, r, raw);
        publish(r, off, valid, flags);
    }
};

// Warpgroup 2 over one segment: Q, then the tiles in order, each into the stage its
// predecessor-but-one frees. Software-pipelined by rounds (32 tokens, 44 registers each):
// round 0 of the next tile is loaded while round 1 of this one is dequantized, and round 1
// of the next while this warpgroup waits for the stage and dequantizes round 0, so a round's
// load latency hides behind the other round's dequantization (two rounds in registers at
// any time, as before, where the unpipelined loop waited for both loads of a tile before
// dequantizing it).
//
// The row offsets of tile t + 1 (their block-table entries: a sparse call's indices) are
// loaded a tile ahead, so a tile's row loads wait on no index load of their own.
template <typename T>
__device__ __forceinline__ void fp8_producer_tiles(const Params& p, const Segment& sg, int row0, uint32_t sQ,
                                                   uint32_t sKV, unsigned char* valid, unsigned char* flags,
                                                   const Fp8RegLoader& ld, int wtid) {
    const int t0 = sg.t0, t1 = sg.t1;
    load_q<T, WGMMA_ROWS, 128>(p, sg.b, row0, sQ, wtid);
    cp_async_commit();
    Fp8Raw a, b;
    i64 oa = ld.row_of(p, sg, t0, 0), ob = ld.row_of(p, sg, t0, 1);
    ld.load(oa, a);
    ld.load(ob, b);
    // Tile t + 1's offsets (-1 past the segment), loaded while tile t is stored.
    i64 na_ahead = ld.row_of(p, sg, t0 + 1, 0), nb_ahead = ld.row_of(p, sg, t0 + 1, 1);
    for (int t = t0; t < t1; ++t) {
        const int st = (t - t0) & 1;
        // The first two tiles fill empty stages; later ones wait until both halves of
        // P V(t - 2) are done with the stage.
        if (t >= t0 + 2) bar_sync(BAR_V_FREE + st, FP8_WG_THREADS);
        const uint32_t dst = sKV + st * TILE_BYTES;
        ld.store<T>(dst, 0, a, oa, valid + st * BN, flags + st * 8);
        const bool more = t + 1 < t1;
        const i64 na = na_ahead;
        if (more) ld.load(na, a);  // round 0 of the next tile in flight ...
        ld.store<T>(dst, 1, b, ob, valid + st * BN, flags + st * 8);  // ... while round 1 is stored
        if (t == t0) cp_async_wait<0>();  // Q
        fence_proxy_async();  // read by wgmma (async proxy)
        bar_arrive(BAR_K_FULL + st, 256);
        oa = na;
        if (more) {
            ob = nb_ahead;
            ld.load(ob, b);
            na_ahead = ld.row_of(p, sg, t + 2, 0);  // used a tile from now
            nb_ahead = ld.row_of(p, sg, t + 2, 1);
        }
    }
}

// The 64-row fp8 kernels' shared memory (Layout<64>) and thread roles: what decode_wgmma_fp8
// and its CTA pairs (wgmma_fp8_pair_sm90.cuh) both set up.
struct Fp8Cta {
    using L = Layout<WGMMA_ROWS>;
    unsigned char* smem;
    uint32_t base, sQ, sKV, sP;
    float *s_alpha, *s_fin;  // [MT] rescale factors of the current tile; [2][MT] final row sums, maxima
    unsigned char *valid, *flags;
    int* sched;
    const float* so;  // O staged at the end, over the KV stages
    int wg, wtid, lane, qd, row0, r_lo;
    GmmaDesc dq, dp;

    __device__ __forceinline__ explicit Fp8Cta(unsigned char* sm)
        : smem(sm), base(smem_u32(sm)), sQ(base + L::OFF_Q), sKV(base + L::OFF_KV), sP(base + L::OFF_P),
          s_alpha((float*)(sm + L::OFF_RED)), s_fin((float*)(sm + L::OFF_RED) + WGMMA_ROWS),
          valid(sm + L::OFF_VALID), flags(sm + L::OFF_FLAGS), sched((int*)(sm + L::OFF_SCHED)),
          so(reinterpret_cast<const float*>(sm + L::OFF_KV)), wg(threadIdx.x >> 7), wtid(threadIdx.x & 127),
          lane(threadIdx.x & 31), qd(threadIdx.x & 3), row0(blockIdx.y * WGMMA_ROWS),
          r_lo(((threadIdx.x & 127) >> 5) * 16 + ((threadIdx.x & 31) >> 2)), dq(sQ, 16, 1024), dp(sP, 16, 1024) {}
    // The schedule (every thread; the P buffer as scratch, free until the first tile).
    __device__ __forceinline__ Part part(const Params& p) const {
        return find_part(p, sched, (int*)(smem + L::OFF_P), WGMMA_ROWS * 128 / 4);
    }
};

// Warpgroup 0 of the fp8 kernels over one segment: consumer_tiles (stages: the hand-over with
// whoever fills the stages), then its half of the epilogue after warpgroup 1 is done with the
// stages (BAR_EPI_*); returns once its copy-out has read the staged O.
template <typename T, typename Stages>
__device__ __forceinline__ void fp8_s_segment(const Params& p, const Segment& sg, const Fp8Cta& c,
                                              StageBarriers<2, false>& bars, Stages& stages) {
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    consumer_tiles<T, false>(p, sg, c.row0, c.sKV, c.valid, c.flags, bars, stages, o, c.s_alpha, c.s_fin, c.dq, c.sP,
                             c.dp, c.wtid, c.r_lo, c.qd);
    bar_arrive(BAR_EPI_WG0, 256);
    bar_sync(BAR_EPI_WG1, 256);
    stage_and_store<T, WGMMA_ROWS>(p, sg, c.row0, c.sKV, c.so, o, c.r_lo, c.qd, 0, c.s_fin, c.wtid, BAR_WG0, true);
}

// Warpgroup 1 of the fp8 kernels over one segment: per tile, after warpgroup 0's P and rescale
// factors (P_FULL), O[:, 256:512] += P V, then release(st) once done with the stage (not after
// the segment's last two tiles: the epilogue hands the stages over); then its half of the
// epilogue; returns once its copy-out has read the staged O.
template <typename T, typename Release>
__device__ __forceinline__ void fp8_pv_segment(const Params& p, const Segment& sg, const Fp8Cta& c, Release&& release) {
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    bar_arrive(BAR_P_FREE, 256);
    for (int t = sg.t0; t < sg.t1; ++t) {
        const int st = (t - sg.t0) & 1;
        bar_sync(BAR_P_FULL, 256);  // after warpgroup 0 saw the whole tile
        rescale(o, c.s_alpha[c.r_lo], c.s_alpha[c.r_lo + 8]);
        pv_tile<T, 128>(o, c.dp, GmmaDesc(c.sKV + st * TILE_BYTES + 4 * SUB_BYTES, SUB_BYTES, 1024));
        if (t + 1 < sg.t1) bar_arrive(BAR_P_FREE, 256);
        if (t + 2 < sg.t1) release(st);
    }
    bar_arrive(BAR_EPI_WG1, 256);
    bar_sync(BAR_EPI_WG0, 256);
    stage_and_store<T, WGMMA_ROWS>(p, sg, c.row0, c.sKV, c.so, o, c.r_lo, c.qd, 256, c.s_fin, c.wtid, BAR_WG1, false);
}

template <typename T> __device__ void decode_wgmma_fp8(const Params& p) {
    using L = Layout<WGMMA_ROWS>;
    extern __shared__ unsigned char smem_raw[];
    const Fp8Cta c(align1024(smem_raw));
    grid_dep_launch();

    const uint32_t epi_done = c.base + L::OFF_MBAR;
    if (threadIdx.x == 0) mbar_init(epi_done, 256);
    __syncthreads();  // initialized before any arrival
    const Part part = c.part(p);
    int nb = part.b;
    i64 pre = part.pre;
    Segment sg;
    // One loop per warpgroup, each after its setmaxnreg (ptxas allocates per region).
    if (c.wg == 2) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FP8_REGS[2]) : "memory");
        const Fp8RegLoader ld(p, c.wtid);
        int phase = 0;
        while (next_segment(p, part, nb, pre, sg)) {
            fp8_producer_tiles<T>(p, sg, c.row0, c.sQ, c.sKV, c.valid, c.flags, ld, c.wtid);
            mbar_wait(epi_done, phase);  // the stages are free for the next segment
            phase ^= 1;
        }
        return;
    }
    if (c.wg == 1) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FP8_REGS[1]) : "memory");
        while (next_segment(p, part, nb, pre, sg)) {
            fp8_pv_segment<T>(p, sg, c, [](int st) { bar_arrive(BAR_V_FREE + st, FP8_WG_THREADS); });
            mbar_arrive(epi_done);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(FP8_REGS[0]) : "memory");
    StageBarriers<L::STAGES, false> bars(c.base + L::OFF_MBAR);  // never waited on (no TMA stages); slot 0 is epi_done
    NamedStages<FP8_WG_THREADS> stages;
    while (next_segment(p, part, nb, pre, sg)) {
        fp8_s_segment<T>(p, sg, c, bars, stages);
        mbar_arrive(epi_done);
    }
}

}  // namespace mla
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
