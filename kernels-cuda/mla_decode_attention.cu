// MlaDecodeAttention: absorbed MQA decode attention over the paged latent cache.
//
// One KV head (the latent cache row, D = 576 in MLA) is shared by all N query heads, so each
// CTA handles a block of query rows (row = s * N + h over the s_q query tokens and N heads)
// and reads every KV row once for all of them. Work is split over CTAs by KV tiles of
// BN = 64 tokens (flash-decoding), scheduled on the device (schedule.cuh); cut sequences are
// merged by a second kernel (combine.cuh).
//
// This file holds the extern "C" entry points only; the kernels live in
// mla_decode_attention/, one header per role (as FlashMLA's csrc/sm90/decode and
// FlashInfer's include/flashinfer/attention), each planned on the host by the file of the
// same family in crates/vt-cuda/src/mla_decode_attention/:
// - params.cuh: Params (the argument block, one struct for every kernel), the tile
//   geometry, MLA_FACTS (the host's planning facts, tested by facts.rs).
// - schedule.cuh: the split-KV schedule (parts, the scan over seq_lens, segments) and the
//   output stores; programmatic dependent launch.
// - key_row.cuh: key values of a float or fp8_ds_mla cache row (dequantized on load).
// - generic.cuh: mla_decode_generic_{bf16,f16,f32} and mla_decode_generic_fp8_*: any D,
//   Dv, strides; a warp per key, f32 math. Used for f32, fp8_ds_mla caches and unusual
//   shapes.
// - combine.cuh: mla_decode_combine[_strided]_{bf16,f16,f32}: merges the partials of cut
//   sequences and writes empty sequences (the strided form: CTAs that take several row groups).
// - tiles.cuh: the swizzled shared-memory tiles and cp.async loaders of the tensor-core
//   kernels.
// - mma_sm80.cuh: mla_decode_mma{16,32,64}[s]_{bf16,f16}: mma.sync (sm_80+), 16/32/64
//   query rows per CTA, a ring of half tiles (the "s" kernels: a smaller ring).
// - wgmma_sm90.cuh: mla_decode_wgmma[_tma]_{bf16,f16}: sm_90a wgmma, 64 query rows per
//   CTA, a consumer and a producer warpgroup; cp.async or TMA loads.
// - wgmma_seesaw_sm90.cuh: mla_decode_wgmma_ss_{bf16,f16}: the same 64 rows and layout with
//   FlashMLA's seesaw schedule (both warpgroups compute S for alternate tiles, O split by
//   columns), TMA loads only.
// - wgmma_fp8_sm90.cuh: mla_decode_wgmma_fp8_{bf16,f16}: the 64-row kernel over an
//   fp8_ds_mla cache, a third warpgroup dequantizing rows into the 16-bit stages.
// - wgmma_fp8_pair_sm90.cuh: mla_decode_wgmma_fp8x2_{bf16,f16}: the same kernel over CTA
//   pairs (clusters of two along the row blocks), each CTA dequantizing half of every tile
//   into both CTAs' stages.
// - wgmma_narrow_sm90.cuh: mla_decode_wgmma_n{16,32}[_tma]_{bf16,f16}: the same roles with
//   both products transposed (tokens on wgmma's M), for at most 16 / 32 query rows.
// - wgmma_narrow_fp8_sm90.cuh: mla_decode_wgmma_n{16,32}_fp8_{bf16,f16}: the narrow
//   products over an fp8_ds_mla cache, the cache operand dequantized into registers from a
//   ring of raw rows that a producer warp fills by bulk copies.
// - wgmma_3wg_sm90.cuh: mla_decode_wgmma_3wg[_cp]_{bf16,f16} and mla_decode_wgmma_fp8r[_cp]_bf16: 64
//   query rows, three warpgroups (S and the softmax; two halves of P V), a two-slot TMA ring
//   (the _cp gather form: any block size, the rows copied by cp.async);
//   over a 16-bit cache, and over an fp8_ds_mla cache with S as an e4m3 product on the raw codes
//   and V dequantized by the warpgroups that multiply it (Auto's choice above 32 rows via TMA).
// A new kernel family is one header here (included below, its entry points instantiated
// with their MLA_FACTS), one planning file and one dispatch arm on the host.
//
// Measurements and the reasons behind these choices: docs/perf.md.
//
// Softmax runs in the log2 domain (scale_log2 = scale * log2(e)); partial lse are log2,
// the lse output is natural log.
#include "common.cuh"
#include "fp8_ds_mla.cuh"
#include "tensor_core.cuh"
#include "mla_decode_attention/params.cuh"
#include "mla_decode_attention/schedule.cuh"
#include "mla_decode_attention/key_row.cuh"
#include "mla_decode_attention/generic.cuh"
#include "mla_decode_attention/combine.cuh"
#include "mla_decode_attention/tiles.cuh"
#include "mla_decode_attention/mma_sm80.cuh"
#include "mla_decode_attention/wgmma_sm90.cuh"
#include "mla_decode_attention/wgmma_seesaw_sm90.cuh"
#include "mla_decode_attention/wgmma_narrow_sm90.cuh"
#include "mla_decode_attention/wgmma_fp8_sm90.cuh"
#include "mla_decode_attention/wgmma_fp8_pair_sm90.cuh"
#include "mla_decode_attention/wgmma_narrow_fp8_sm90.cuh"
#include "mla_decode_attention/wgmma_3wg_sm90.cuh"

#if defined(VT_MLA_DECODE_FACTS)
// The module's facts (params.cuh): sizeof and alignof Params, BN, D and Dv of the tensor-core
// kernels, the generic kernel's shared bytes per unit of D and of Dv, combine columns per CTA,
// combine CTAs an SM holds (its launch bounds: the strided form's wave).
extern "C" __device__ const long long mla_decode_facts[9] = {
    sizeof(mla::Params), alignof(mla::Params),   mla::BN, mla::FD, mla::FDV, mla::generic_smem(1, 0),
    mla::generic_smem(0, 1), mla::COMBINE_COLS, mla::COMBINE_MIN_CTAS};
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLA_WGMMA(S, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1)                             \
        mla_decode_wgmma_##S(const mla::Params p) {                                           \
        mla::decode_wgmma<T, false>(p, nullptr);                                              \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1) mla_decode_wgmma_tma_##S(    \
        const __grid_constant__ mla::Params p, const __grid_constant__ mla::TmaMap kv_map) {  \
        mla::decode_wgmma<T, true>(p, &kv_map);                                               \
    }                                                                                         \
    MLA_FACTS(mla_decode_wgmma_##S, mla::THREADS, mla::WGMMA_ROWS, mla::Layout<mla::WGMMA_ROWS>::SMEM, \
              mla::Layout<mla::WGMMA_ROWS>::STAGES)                                           \
    MLA_FACTS(mla_decode_wgmma_tma_##S, mla::THREADS, mla::WGMMA_ROWS, mla::Layout<mla::WGMMA_ROWS>::SMEM, \
              mla::Layout<mla::WGMMA_ROWS>::STAGES)
MLA_WGMMA(bf16, bf16)
MLA_WGMMA(f16, f16)
#define MLA_WGMMA_SS(S, T)                                                                    \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1) mla_decode_wgmma_ss_##S(     \
        const __grid_constant__ mla::Params p, const __grid_constant__ mla::TmaMap kv_map) {  \
        mla::decode_wgmma_seesaw<T>(p, &kv_map);                                              \
    }                                                                                         \
    MLA_FACTS(mla_decode_wgmma_ss_##S, mla::THREADS, mla::WGMMA_ROWS, mla::Layout<mla::WGMMA_ROWS>::SMEM, \
              mla::Layout<mla::WGMMA_ROWS>::STAGES)
MLA_WGMMA_SS(bf16, bf16)
MLA_WGMMA_SS(f16, f16)
// The 64-row kernel over an fp8_ds_mla cache: a third warpgroup dequantizes into the 16-bit
// stages (384 threads, the 16-bit kernel's layout).
#define MLA_WGMMA_FP8(S, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(mla::FP8_WG_THREADS, 1)                      \
        mla_decode_wgmma_fp8_##S(const mla::Params p) {                                       \
        mla::decode_wgmma_fp8<T>(p);                                                          \
    }                                                                                         \
    MLA_FACTS(mla_decode_wgmma_fp8_##S, mla::FP8_WG_THREADS, mla::WGMMA_ROWS,                  \
              mla::Layout<mla::WGMMA_ROWS>::SMEM, mla::Layout<mla::WGMMA_ROWS>::STAGES)
MLA_WGMMA_FP8(bf16, bf16)
MLA_WGMMA_FP8(f16, f16)
// The same over CTA pairs (clusters of two along grid.y, which the host keeps even): each CTA
// dequantizes half of every tile into both CTAs' stages.
#define MLA_WGMMA_FP8_PAIR(S, T)                                                              \
    extern "C" __global__ void __cluster_dims__(1, mla::PAIR_CTAS, 1) __launch_bounds__(mla::FP8_WG_THREADS, 1) \
        mla_decode_wgmma_fp8x2_##S(const mla::Params p) {                                     \
        mla::decode_wgmma_fp8_pair<T>(p);                                                     \
    }                                                                                         \
    MLA_FACTS(mla_decode_wgmma_fp8x2_##S, mla::FP8_WG_THREADS, mla::WGMMA_ROWS,                \
              mla::Layout<mla::WGMMA_ROWS>::SMEM, mla::Layout<mla::WGMMA_ROWS>::STAGES)
MLA_WGMMA_FP8_PAIR(bf16, bf16)
MLA_WGMMA_FP8_PAIR(f16, f16)

// The narrow kernels: MT = 16 or 32 query rows per CTA.
#define MLA_WGMMA_NARROW(S, T, MT)                                                            \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1)                             \
        mla_decode_wgmma_n##MT##_##S(const mla::Params p) {                                   \
        mla::decode_wgmma_narrow<T, MT, false>(p, nullptr);                                   \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1) mla_decode_wgmma_n##MT##_tma_##S( \
        const __grid_constant__ mla::Params p, const __grid_constant__ mla::TmaMap kv_map) {  \
        mla::decode_wgmma_narrow<T, MT, true>(p, &kv_map);                                    \
    }                                                                                         \
    MLA_FACTS(mla_decode_wgmma_n##MT##_##S, mla::THREADS, MT, mla::NarrowLayout<MT>::SMEM,     \
              mla::NarrowLayout<MT>::STAGES)                                                  \
    MLA_FACTS(mla_decode_wgmma_n##MT##_tma_##S, mla::THREADS, MT, mla::NarrowLayout<MT>::SMEM, \
              mla::NarrowLayout<MT>::STAGES)
MLA_WGMMA_NARROW(bf16, bf16, 16)
MLA_WGMMA_NARROW(f16, f16, 16)
MLA_WGMMA_NARROW(bf16, bf16, 32)
MLA_WGMMA_NARROW(f16, f16, 32)
// The narrow kernel over an fp8_ds_mla cache (16 or 32 query rows per CTA, a producer warp:
// bulk copies per row, or one TMA box per tile in the _tma form).
#define MLA_WGMMA_NARROW_FP8(S, T, MT)                                                        \
    extern "C" __global__ void __launch_bounds__(mla::NF8_THREADS, 1)                         \
        mla_decode_wgmma_n##MT##_fp8_##S(const mla::Params p) {                               \
        mla::decode_wgmma_narrow_fp8<T, MT, false>(p, nullptr);                               \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(mla::NF8_THREADS, 1) mla_decode_wgmma_n##MT##_fp8_tma_##S( \
        const __grid_constant__ mla::Params p, const __grid_constant__ mla::TmaMap kv_map) {  \
        mla::decode_wgmma_narrow_fp8<T, MT, true>(p, &kv_map);                               \
    }                                                                                         \
    MLA_FACTS(mla_decode_wgmma_n##MT##_fp8_##S, mla::NF8_THREADS, MT, mla::NarrowFp8Layout<MT>::SMEM, \
              mla::NarrowFp8Layout<MT>::RAWS)                                                 \
    MLA_FACTS(mla_decode_wgmma_n##MT##_fp8_tma_##S, mla::NF8_THREADS, MT, mla::NarrowFp8Layout<MT>::SMEM, \
              mla::NarrowFp8Layout<MT>::RAWS)
MLA_WGMMA_NARROW_FP8(bf16, bf16, 16)
MLA_WGMMA_NARROW_FP8(f16, f16, 16)
MLA_WGMMA_NARROW_FP8(bf16, bf16, 32)
MLA_WGMMA_NARROW_FP8(f16, f16, 32)
// The three-warpgroup 64-row kernels: over a 16-bit cache (the cache's tensor map), and over an
// fp8_ds_mla cache with S on the raw codes (bf16 queries only: the rope product takes the
// cache's bf16 rope as it lies; the rows' two maps as one parameter).
#define MLA_WGMMA_3WG(S, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(mla::W3_THREADS, 1) mla_decode_wgmma_3wg_##S(  \
        const __grid_constant__ mla::Params p, const __grid_constant__ mla::TmaMap kv_map) {  \
        mla::decode_wgmma_3wg<T, false>(p, &kv_map);                                          \
    }                                                                                         \
    MLA_FACTS(mla_decode_wgmma_3wg_##S, mla::W3_THREADS, mla::WGMMA_ROWS, mla::W3Layout<false>::SMEM, \
              mla::W3_SLOTS)
MLA_WGMMA_3WG(bf16, bf16)
MLA_WGMMA_3WG(f16, f16)
// Their CTA-pair form: clusters of two consecutive row blocks reading each tile once.
#define MLA_WGMMA_3WG_X2(S, T)                                                                \
    extern "C" __global__ void __cluster_dims__(1, mla::PAIR_CTAS, 1) __launch_bounds__(mla::W3_THREADS, 1) \
        mla_decode_wgmma_3wg_x2_##S(const __grid_constant__ mla::Params p,                    \
                                    const __grid_constant__ mla::TmaMap kv_map) {             \
        mla::decode_wgmma_3wg<T, false, false, true>(p, &kv_map);                             \
    }                                                                                         \
    MLA_FACTS(mla_decode_wgmma_3wg_x2_##S, mla::W3_THREADS, mla::WGMMA_ROWS, mla::W3Layout<false>::SMEM, \
              mla::W3_SLOTS)
MLA_WGMMA_3WG_X2(bf16, bf16)
MLA_WGMMA_3WG_X2(f16, f16)
// Both over pages of 16 or 32 rows (`_pg`): a tile is 2-4 pages, each column block one TMA box
// a page (the cache's map has boxes of BS rows).
#define MLA_WGMMA_3WG_PG(S, T)                                                                \
    extern "C" __global__ void __launch_bounds__(mla::W3_THREADS, 1) mla_decode_wgmma_3wg_pg_##S( \
        const __grid_constant__ mla::Params p, const __grid_constant__ mla::TmaMap kv_map) {  \
        mla::decode_wgmma_3wg<T, false, false, false, true>(p, &kv_map);                     \
    }                                                                                         \
    extern "C" __global__ void __cluster_dims__(1, mla::PAIR_CTAS, 1) __launch_bounds__(mla::W3_THREADS, 1) \
        mla_decode_wgmma_3wg_x2_pg_##S(const __grid_constant__ mla::Params p,                 \
                                       const __grid_constant__ mla::TmaMap kv_map) {          \
        mla::decode_wgmma_3wg<T, false, false, true, true>(p, &kv_map);                      \
    }                                                                                         \
    MLA_FACTS(mla_decode_wgmma_3wg_pg_##S, mla::W3_THREADS, mla::WGMMA_ROWS, mla::W3Layout<false>::SMEM, \
              mla::W3_SLOTS)                                                                  \
    MLA_FACTS(mla_decode_wgmma_3wg_x2_pg_##S, mla::W3_THREADS, mla::WGMMA_ROWS, mla::W3Layout<false>::SMEM, \
              mla::W3_SLOTS)
MLA_WGMMA_3WG_PG(bf16, bf16)
MLA_WGMMA_3WG_PG(f16, f16)
// Their gather form over any block size (the rows copied by cp.async, no tensor map).
#define MLA_WGMMA_3WG_CP(S, T)                                                                \
    extern "C" __global__ void __launch_bounds__(mla::W3_THREADS, 1)                          \
        mla_decode_wgmma_3wg_cp_##S(const __grid_constant__ mla::Params p) {                  \
        mla::decode_wgmma_3wg<T, false, true>(p, nullptr);                                    \
    }                                                                                         \
    MLA_FACTS(mla_decode_wgmma_3wg_cp_##S, mla::W3_THREADS, mla::WGMMA_ROWS,                  \
              (mla::W3Layout<false, true>::SMEM), mla::W3_SLOTS)
MLA_WGMMA_3WG_CP(bf16, bf16)
MLA_WGMMA_3WG_CP(f16, f16)
extern "C" __global__ void __launch_bounds__(mla::W3_THREADS, 1)
    mla_decode_wgmma_fp8r_bf16(const __grid_constant__ mla::Params p, const __grid_constant__ mla::RawMaps maps) {
    mla::decode_wgmma_3wg<bf16, true>(p, &maps);
}
MLA_FACTS(mla_decode_wgmma_fp8r_bf16, mla::W3_THREADS, mla::WGMMA_ROWS, mla::W3Layout<true>::SMEM,
          mla::W3Layout<true>::SLOTS)
// Its gather form over any block size.
extern "C" __global__ void __launch_bounds__(mla::W3_THREADS, 1)
    mla_decode_wgmma_fp8r_cp_bf16(const __grid_constant__ mla::Params p) {
    mla::decode_wgmma_3wg<bf16, true, true>(p, nullptr);
}
MLA_FACTS(mla_decode_wgmma_fp8r_cp_bf16, mla::W3_THREADS, mla::WGMMA_ROWS, (mla::W3Layout<true, true>::SMEM),
          mla::W3_SLOTS)
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

#define MLA_GENERIC(S, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(mla::GEN_THREADS)                            \
        mla_decode_generic_##S(const mla::Params p) {                                         \
        mla::decode_generic<T>(p);                                                            \
    }                                                                                         \
    extern "C" __global__ void MLA_COMBINE_BOUNDS                                             \
        mla_decode_combine_##S(const mla::Params p) {                                         \
        mla::combine<T>(p);                                                                   \
    }                                                                                         \
    extern "C" __global__ void MLA_COMBINE_BOUNDS                                             \
        mla_decode_combine_strided_##S(const mla::Params p) {                                 \
        mla::combine<T, true>(p);                                                             \
    }                                                                                         \
    MLA_FACTS(mla_decode_generic_##S, mla::GEN_THREADS, 1, mla::generic_smem(mla::FD, mla::FDV), 0) \
    MLA_FACTS(mla_decode_combine_##S, mla::THREADS, mla::COMBINE_WARPS, 0, 0)                  \
    MLA_FACTS(mla_decode_combine_strided_##S, mla::THREADS, mla::COMBINE_WARPS, 0, 0)
VT_FOR_EACH_FLOAT(MLA_GENERIC)

// The generic kernel over an fp8_ds_mla cache (D = 576), per query dtype; its partials go
// through mla_decode_combine_* as the float cache's do.
#define MLA_GENERIC_FP8(S, T)                                                                 \
    extern "C" __global__ void __launch_bounds__(mla::GEN_THREADS)                            \
        mla_decode_generic_fp8_##S(const mla::Params p) {                                     \
        mla::decode_generic<T, true>(p);                                                      \
    }                                                                                         \
    MLA_FACTS(mla_decode_generic_fp8_##S, mla::GEN_THREADS, 1, mla::generic_smem(mla::FD, mla::FDV), 0)
VT_FOR_EACH_FLOAT(MLA_GENERIC_FP8)

// NAME: MR row blocks of 16 query rows, a ring of HS half tiles.
#define MLA_MMA_KERNEL(NAME, S, T, MR, HS)                                                    \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1) NAME##_##S(const mla::Params p) { \
        mla::decode_mma<T, MR, HS>(p);                                                        \
    }                                                                                         \
    MLA_FACTS(NAME##_##S, mla::THREADS, 16 * MR, (mla::MmaLayout<16 * MR, HS>::SMEM), HS)
#define MLA_MMA(S, T)                                                                         \
    MLA_MMA_KERNEL(mla_decode_mma16, S, T, 1, 5)                                              \
    MLA_MMA_KERNEL(mla_decode_mma32, S, T, 2, 5)                                              \
    MLA_MMA_KERNEL(mla_decode_mma64, S, T, 4, 4)                                              \
    MLA_MMA_KERNEL(mla_decode_mma16s, S, T, 1, 3)                                             \
    MLA_MMA_KERNEL(mla_decode_mma32s, S, T, 2, 3)                                             \
    MLA_MMA_KERNEL(mla_decode_mma64s, S, T, 4, 2)
MLA_MMA(bf16, bf16)
MLA_MMA(f16, f16)

// The mma.sync kernels over an fp8_ds_mla cache, per query dtype: the ring holds raw rows
// (6 / 5 / 3 half tiles at 16 / 32 / 64 rows; 3 / 2 in the small-ring variants).
#define MLA_MMA_FP8_KERNEL(NAME, S, T, MR, HS)                                                \
    extern "C" __global__ void __launch_bounds__(mla::THREADS, 1) NAME##_fp8_##S(const mla::Params p) { \
        mla::decode_mma<T, MR, HS, true>(p);                                                  \
    }                                                                                         \
    MLA_FACTS(NAME##_fp8_##S, mla::THREADS, 16 * MR, (mla::MmaLayout<16 * MR, HS, true>::SMEM), HS)
#define MLA_MMA_FP8(S, T)                                                                     \
    MLA_MMA_FP8_KERNEL(mla_decode_mma16, S, T, 1, 6)                                          \
    MLA_MMA_FP8_KERNEL(mla_decode_mma32, S, T, 2, 5)                                          \
    MLA_MMA_FP8_KERNEL(mla_decode_mma64, S, T, 4, 3)                                          \
    MLA_MMA_FP8_KERNEL(mla_decode_mma16s, S, T, 1, 3)                                         \
    MLA_MMA_FP8_KERNEL(mla_decode_mma32s, S, T, 2, 2)
MLA_MMA_FP8(bf16, bf16)
MLA_MMA_FP8(f16, f16)
