//! The one place where the `VT_*` on/off flags are read (the paths and lab variables,
//! `VT_CACHE_DIR`, `VT_CUDA_INCLUDE`, `VT_CUDA_KERNELS_DIR`, `VT_LAB_PREFILL_ORDER`, are read
//! where they are used: docs/architecture.md lists them).
//!
//! | flag | default | effect |
//! |---|---|---|
//! | `VT_MLA_FUSED_NORM_ROPE` | on | MLA block: one merged kv A-projection GEMM and one `FusedNormRope` launch instead of two GEMMs + `RmsNorm` + `RopeFromCache` (taken only where `FusedNormRope` is registered) |
//! | `VT_MLA_DECODE_TMA` | on | CUDA MlaDecodeAttention, wgmma and narrow wgmma kernels (over a 16-bit cache Auto takes the narrow one only with it on): the paged cache is loaded through the tensor memory accelerator (fp8_ds_mla, narrow kernel: one box a tile instead of a bulk copy per row); `0` restores the cp.async loads (per-row bulk copies for fp8_ds_mla) |
//! | `VT_MLA_SEESAW` | off | CUDA MlaDecodeAttention (sm_90) over a 16-bit cache, more than 64 query rows, 64+ sequences, TMA loads (block sizes that are multiples of 64, `VT_MLA_DECODE_TMA` on): with `1` Auto takes the 64-row kernel with FlashMLA's seesaw schedule (`mla_decode_wgmma_ss`: both warpgroups compute S for alternate tiles, O split by columns) instead of the one-consumer kernel (`mla_decode_wgmma_tma`). Off: racecheck reports its arrive / sync hand-overs of the row maxima (docs/perf.md, "Fifteenth session") |
//! | `VT_MLA_3WG` | on | CUDA MlaDecodeAttention (sm_90), more than 32 query rows, TMA loads (block sizes that are multiples of 64, `VT_MLA_DECODE_TMA` on): Auto takes the 64-row kernel with three warpgroups (`mla_decode_wgmma_3wg`: S and the softmax in one, P V split over two; over an fp8_ds_mla cache with bf16 queries its raw-ring form `mla_decode_wgmma_fp8r`); `0` restores the two-warpgroup kernels (`mla_decode_wgmma_tma`, `mla_decode_wgmma_fp8`) |
//! | `VT_MLA_GATHER` | off | CUDA MlaDecodeAttention (sm_90), more than 32 query rows, a cache the TMA does not read (block sizes that 64 does not divide, `VT_MLA_DECODE_TMA` off; the sparse op's view of block size 1): with `1` Auto takes the three-warpgroup kernels' gather forms (`mla_decode_wgmma_3wg_cp`, over an fp8_ds_mla cache with bf16 queries `mla_decode_wgmma_fp8r_cp`: rows copied by cp.async) instead of the two-warpgroup and mma.sync kernels, and SparseMlaAttention leaves its kernel to that choice. Off until they have run on a GPU (docs/perf.md, "Twentieth session") |
//! | `VT_MLA_FP8_PAIR` | on | CUDA MlaDecodeAttention (sm_90) over an fp8_ds_mla cache where Auto takes the 64-row dequantizing kernel (`mla_decode_wgmma_fp8`: block sizes the TMA does not read, the sparse op's view), an even number of 64-row blocks (128 heads, or 64 heads x 2 query tokens): Auto takes its CTA-pair form (`mla_decode_wgmma_fp8x2`: clusters of two CTAs, each dequantizing half of every tile into both; docs/sparse-design.md, D3; H100, twenty-seventh session, one call with FlashMLA: SparseMlaAttention's fp8 decode at 128 heads 0.80-0.84x the single-CTA kernel's time at b 64-148, 1.03x at b 2). `0` restores the single-CTA kernel |
//! | `VT_MLA_3WG_PAIR` | on | CUDA MlaDecodeAttention (sm_90) over a 16-bit cache read through the TMA (block size a multiple of 64) with an even number of 64-row blocks (128 heads, or 64 heads x 2 query tokens) and at least 32 sequences, where Auto takes the three-warpgroup kernel: its CTA-pair form (`mla_decode_wgmma_3wg_x2`: clusters of two CTAs, each issuing every other column block of a tile multicast to both, so the pair reads each tile once). Thirtieth session, same calls as FlashMLA: on an H100 0.92-0.95x the single-CTA kernel's time at 128 heads b128 s8192 and b64 s16384, 0.95-0.99x at b128 s4096 and b32; on an H200 (interleaved A/B) 0.98-1.00x at b >= 32. Its tests, memcheck, racecheck and synccheck are clean on an H200. Thirty-first session, an H100: the block's CUDA tests (graphs, goldens, fusions, both caches) pass with it, and the V3 step's attention (graph replay) takes 100.9 / 306.4 us with it against 113.7 / 346.7 without at B 32 / 128 (docs/perf.md, "Thirty-first session") |
//! | `VT_MLA_COMBINE_STRIDE` | on | CUDA MlaDecodeAttention: the combine kernel that follows every main kernel takes its strided form (`mla_decode_combine_strided_*`) where it strides: grid.y = the row groups that fill one wave of combine CTAs with the B sequences (`strided_groups` in crates/vt-cuda/src/mla_decode_attention/combine.rs), when that is fewer than the row groups, each CTA looping over row groups, so a batch with nothing to merge (whole-sequence mode) launches B x that many CTAs instead of B x every row group. H100, forty-fourth session: h128 b128 s4096 3-7% faster, h64 b128 1%, its test, memcheck and racecheck clean; where it would launch the plain grid (h64 b32) the plain kernel runs. `0` restores the plain form everywhere (docs/perf.md, "Forty-fourth session") |
//! | `VT_QUANT_WIDE` | on | CUDA QuantizeFp8: from 8 MiB of input (`vt_cuda::fp8_matmul::QUANT_WIDE_MIN_BYTES`) the wide kernel (`quantize_fp8_wide_*`: a half-warp per (row, 128-group), 16 bytes a lane, four rows a half-warp in flight, at most 32 CTAs an SM looping over the rows); below that, and with `0` everywhere, a warp per (row, group) with 8 bytes a lane; the same bytes. H100, forty-fourth session: byte-exact on every test case, memcheck clean; M 4096 a_proj 63.6 -> 44.1 us, o_proj 150.6 -> 94.4, q_b 17.7 -> 15.8 (67-71% of the copy floor at the large ones, against 80-90% predicted), but 0.4-2.2 us slower at 4 MB and under (kv_b M 4096, every M 1 and 128 call): docs/perf.md, "Forty-fourth session" |
//! | `VT_SPARSE_PREFILL` | on | CUDA SparseMlaAttention (sm_90) over a 16-bit cache where the op would take the three-warpgroup gather form (64+ heads, slots listed 4+ times: a prefill): it takes its own prefill kernel (`sparse_mla_prefill`: a CTA per token and 64 heads over the whole topk, seesaw consumers, a gathering producer warpgroup; docs/sparse-design.md, P1; H100, twenty-seventh session, one call with FlashMLA: 0.61-0.68x the gather form's time at 128 heads, s_q 4096, topk 2048, s_kv 8192-131072, 0.93-1.00x FlashMLA's). `0` restores the gather form |
//! | `VT_FP8_LT` | on | CUDA MatmulBTFp8 with both operands fp8: Auto takes cuBLASLt's block-scaled fp8 GEMM (`vt_cuda::fp8_matmul::Kernel::Lt`) where its layout rules hold (on the H200 at M 4096 1.9-3.5x faster than the Wgmma kernel and 1.25-1.59x cuBLAS bf16 at a_proj, q_b, kv_b, o_proj; its graph-replay test passes; racecheck reports hazards inside cuBLASLt's own kernels, none in ours: docs/perf.md, "Nineteenth session"); `0` restores the Wgmma kernel |
//! | `VT_LT_TUNE` | off | CUDA MatmulBTFp8 on cuBLASLt (`Kernel::Lt`, forced or Auto's choice under `VT_FP8_LT`): the first call per shape outside a CUDA graph capture times up to 8 of the heuristic's algorithms (one warm-up and 3 timed runs each, on the call's own operands) and keeps the fastest for that shape instead of the heuristic's first choice. The first call per shape synchronizes its queue and runs the GEMM ~30 times; warm up before capturing a graph (a shape first met inside a capture keeps the heuristic's first until its next call outside one). Off: no gain at the V3 M 4096 shapes on an H100 (docs/perf.md, twenty-fifth session) |
//! | `VT_FUSE_DECODE_QUERY` | on | MLA block, fused kv path, dense block: the decode tokens' q rope rides in the `FusedNormRope` launch, written straight into the decode attention's query, and the absorbed q_nope BMM writes the query's latent columns directly (a decode-only step runs no `RopeFromCache` and no query `ConcatMlaNopeRope`) |
//! | `VT_FUSE_CACHE_WRITE` | on | MLA block, fused kv path, float (not fp8_ds_mla) cache: the cache write rides in the `FusedNormRope` launch (no `ConcatAndCacheMla`) |
//! | `VT_SKINNY_GEMM16` | off | CUDA MatmulBT / BatchedMatmul with 16-bit weights: Auto takes the skinny kernel up to M 128 too (A/B against cuBLAS in a decode step; with it off they stay on cuBLAS, which was ahead or tied at every measured shape alone) |
//! | `VT_PDL` | off | CUDA skinny GEMM: launched as a programmatic dependent launch on sm_90, so it may start while the previous kernel on the stream runs, requesting its first weight chunks before it waits for that kernel (`griddepcontrol.wait`); the step's small kernels let it start early (`griddepcontrol.launch_dependents`). Needs weights that the kernel right before the GEMM does not write (true of a model's weights in a step) |
//! | `VT_SKINNY_TMA` | on | CUDA (sm_90) skinny GEMM with fp8 weights at up to 32 tokens and K of 8+ chunks: the weight and activation chunks arrive by the TMA into a 4-7 deep ring fed by a producer warp (`skinny_w8tma_*`); `0` restores the cp.async ring (`skinny_w8_*`) |
//! | `VT_SKINNY_GEMM` | on | CUDA MatmulBT / BatchedMatmul (bf16, f16) and the fp8 weight-only matmuls: decode-shaped calls (M up to a per-shape limit, `vt_cuda::skinny_gemm::auto_max_m`: 128 for fp8 weights, 0 for 16-bit ones) take the skinny swap-AB kernel (`kernels-cuda/skinny_gemm.cu`); `0` keeps cuBLAS and the fp8 Gemv kernel |
//! | `VT_FP8_ABSORBED` | on | MLA block with fp8 weights (`mla_block::fp8`): the absorbed decode weights `W_UK_T` / `W_UV` stay fp8 (views and a transposed copy of `kv_b_proj`'s codes; the weight-only fp8 BMM); `0` keeps them dequantized in the compute dtype (as vLLM does: twice their bytes, cuBLAS's batched GEMM, which at 64 and 128 tokens a step is 1.7-2x faster than the best fp8 kernel on these shapes (`xtask bench gemm`, H100): docs/perf.md, "Twenty-ninth session"). Read when the weights are loaded |
//! | `VT_FP8_ABSORBED_BY_STEP` | on | MLA block with fp8 weights and `VT_FP8_ABSORBED` on: the load also keeps the absorbed weights dequantized (33.5 MB more a V3 layer at TP 1), and each step picks: the fp8 BMM below `mla_block::fp8::ABSORBED_FLOAT_MIN_TOKENS` (32) tokens, the float one from there (`VT_FP8_ABSORBED`'s A/B: fp8 4 us faster at B 1, float 1.5-3% faster at B 32 and 7% at B 128; docs/perf.md, "Twenty-ninth session"). Measured on an H100: the V3 fp8 step at 137.5 / 227.8 / 453.2 us at B 1 / 32 / 128 against the fp8 form's 138.0 / 229.3 / 486.2 (docs/perf.md, "Thirtieth session"); off saves the memory. Read when the weights are loaded |
//!
//! Values: `1/0`, `true/false`, `on/off`, `yes/no` (case-insensitive). Anything else prints
//! a warning to stderr (with or without a log subscriber) and keeps the default. The environment is read once, at first use; a code
//! override ([`set_override`]) wins over it so one process can A/B both paths.

use std::sync::atomic::{AtomicU8, Ordering};

/// A boolean `VT_*` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flag {
    MlaFusedNormRope,
    MlaDecodeTma,
    SkinnyGemm,
    Fp8Lt,
    FuseDecodeQuery,
    FuseCacheWrite,
    SkinnyGemm16,
    Pdl,
    SkinnyTma,
    MlaSeesaw,
    Mla3wg,
    MlaGather,
    LtTune,
    MlaFp8Pair,
    SparsePrefill,
    Fp8Absorbed,
    Fp8AbsorbedByStep,
    Mla3wgPair,
    MlaCombineStride,
    QuantWide,
}

impl Flag {
    pub const ALL: [Flag; 20] = [
        Flag::MlaFusedNormRope,
        Flag::MlaDecodeTma,
        Flag::SkinnyGemm,
        Flag::Fp8Lt,
        Flag::FuseDecodeQuery,
        Flag::FuseCacheWrite,
        Flag::SkinnyGemm16,
        Flag::Pdl,
        Flag::SkinnyTma,
        Flag::MlaSeesaw,
        Flag::Mla3wg,
        Flag::MlaGather,
        Flag::LtTune,
        Flag::MlaFp8Pair,
        Flag::SparsePrefill,
        Flag::Fp8Absorbed,
        Flag::Fp8AbsorbedByStep,
        Flag::Mla3wgPair,
        Flag::MlaCombineStride,
        Flag::QuantWide,
    ];

    pub const fn env_name(self) -> &'static str {
        match self {
            Flag::MlaFusedNormRope => "VT_MLA_FUSED_NORM_ROPE",
            Flag::MlaDecodeTma => "VT_MLA_DECODE_TMA",
            Flag::SkinnyGemm => "VT_SKINNY_GEMM",
            Flag::Fp8Lt => "VT_FP8_LT",
            Flag::FuseDecodeQuery => "VT_FUSE_DECODE_QUERY",
            Flag::FuseCacheWrite => "VT_FUSE_CACHE_WRITE",
            Flag::SkinnyGemm16 => "VT_SKINNY_GEMM16",
            Flag::Pdl => "VT_PDL",
            Flag::SkinnyTma => "VT_SKINNY_TMA",
            Flag::MlaSeesaw => "VT_MLA_SEESAW",
            Flag::Mla3wg => "VT_MLA_3WG",
            Flag::MlaGather => "VT_MLA_GATHER",
            Flag::LtTune => "VT_LT_TUNE",
            Flag::MlaFp8Pair => "VT_MLA_FP8_PAIR",
            Flag::SparsePrefill => "VT_SPARSE_PREFILL",
            Flag::Fp8Absorbed => "VT_FP8_ABSORBED",
            Flag::Fp8AbsorbedByStep => "VT_FP8_ABSORBED_BY_STEP",
            Flag::Mla3wgPair => "VT_MLA_3WG_PAIR",
            Flag::MlaCombineStride => "VT_MLA_COMBINE_STRIDE",
            Flag::QuantWide => "VT_QUANT_WIDE",
        }
    }

    pub const fn default_value(self) -> bool {
        match self {
            Flag::MlaFusedNormRope => true,
            Flag::MlaDecodeTma => true,
            Flag::SkinnyGemm => true,
            // Measured faster than Wgmma and bf16 cuBLAS at every large-M projection; racecheck's
            // reports are inside cuBLASLt's own kernels (docs/perf.md, "Nineteenth session").
            Flag::Fp8Lt => true,
            // Measured faster on the H200 at every decode shape (docs/perf.md, "Decode-step fusions").
            Flag::FuseDecodeQuery => true,
            Flag::FuseCacheWrite => true,
            // Off until a decode step measures them ahead (docs/perf.md, "Dependent launches").
            Flag::SkinnyGemm16 => false,
            Flag::Pdl => false,
            // Measured on the H200 (docs/perf.md, "Fourteenth session").
            Flag::SkinnyTma => true,
            // Off until racecheck is clean over it (docs/perf.md, "Fifteenth session").
            Flag::MlaSeesaw => false,
            // Measured faster at every 64 / 128-head shape (docs/perf.md, "Eighteenth session").
            Flag::Mla3wg => true,
            // Off until the gather forms have run on a GPU (docs/perf.md, "Twentieth session").
            Flag::MlaGather => false,
            // Off until a GPU call has measured tuned against untuned (`xtask bench gemm`).
            Flag::LtTune => false,
            // Measured faster where it applies (docs/perf.md, "Twenty-seventh session").
            Flag::MlaFp8Pair => true,
            // Measured faster (docs/perf.md, "Twenty-seventh session").
            Flag::SparsePrefill => true,
            // On (the absorbed weights stay fp8, half the bytes) until a decode step measures
            // the dequantized form ahead (docs/perf.md, "Twenty-ninth session").
            Flag::Fp8Absorbed => true,
            // Measured: the V3 fp8 step as fast as the fp8 form at B 1 and 7% faster at B 128
            // (docs/perf.md, "Thirtieth session"), for 33.5 MB more a layer at TP 1.
            Flag::Fp8AbsorbedByStep => true,
            // Measured as fast or faster from 32 sequences on an H100 and an H200, its tests and
            // the three sanitizers clean; the block's CUDA tests (graphs, goldens) pass with it
            // and the V3 step's attention is 11-12% faster with it on an H100 (docs/perf.md,
            // "Thirty-first session").
            Flag::Mla3wgPair => true,
            // Measured on an H100: 3-7% off h128 b128, nothing slower where it strides; memcheck
            // and racecheck clean over its test (docs/perf.md, "Forty-fourth session").
            Flag::MlaCombineStride => true,
            // Measured on an H100: 1.1-1.6x faster from 12.6 MB of input, byte-exact, memcheck
            // clean; Auto takes it from 8 MiB (docs/perf.md, "Forty-fourth session").
            Flag::QuantWide => true,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Parses a flag value; `None` for anything unrecognized.
pub fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    }
}

fn from_env(flag: Flag) -> bool {
    match std::env::var(flag.env_name()) {
        Err(_) => flag.default_value(),
        Ok(v) => parse_bool(&v).unwrap_or_else(|| {
            // Straight to stderr (once per process: the environment is read once): a
            // mistyped flag must be seen without a log subscriber or RUST_LOG.
            eprintln!("vt: warning: {}", invalid_value_message(flag, &v));
            flag.default_value()
        }),
    }
}

/// The warning for an unrecognized value `v` of `flag`.
pub fn invalid_value_message(flag: Flag, v: &str) -> String {
    format!(
        "{}={v:?} is not one of 1/0, true/false, on/off, yes/no; keeping the default ({})",
        flag.env_name(),
        if flag.default_value() { "on" } else { "off" }
    )
}

static ENV: std::sync::LazyLock<[bool; Flag::ALL.len()]> =
    std::sync::LazyLock::new(|| Flag::ALL.map(from_env));

// 0 = no override, 1 = forced off, 2 = forced on.
static OVERRIDES: [AtomicU8; Flag::ALL.len()] = [const { AtomicU8::new(0) }; Flag::ALL.len()];

/// The flag's value: the code override if set, else the environment, else the default.
pub fn get(flag: Flag) -> bool {
    match OVERRIDES[flag.index()].load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => ENV[flag.index()],
    }
}

/// Overrides a flag for the whole process (`None` returns to the environment's value).
pub fn set_override(flag: Flag, value: Option<bool>) {
    let v = match value {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    };
    OVERRIDES[flag.index()].store(v, Ordering::Relaxed);
}

/// `VT_MLA_FUSED_NORM_ROPE`.
pub fn mla_fused_norm_rope() -> bool {
    get(Flag::MlaFusedNormRope)
}

/// `VT_MLA_DECODE_TMA`.
pub fn mla_decode_tma() -> bool {
    get(Flag::MlaDecodeTma)
}

/// `VT_SKINNY_GEMM`.
pub fn skinny_gemm() -> bool {
    get(Flag::SkinnyGemm)
}

/// `VT_FP8_LT`.
pub fn fp8_lt() -> bool {
    get(Flag::Fp8Lt)
}

/// `VT_FUSE_DECODE_QUERY`.
pub fn fuse_decode_query() -> bool {
    get(Flag::FuseDecodeQuery)
}

/// `VT_FUSE_CACHE_WRITE`.
pub fn fuse_cache_write() -> bool {
    get(Flag::FuseCacheWrite)
}

/// `VT_SKINNY_GEMM16`.
pub fn skinny_gemm16() -> bool {
    get(Flag::SkinnyGemm16)
}

/// `VT_SKINNY_TMA`.
pub fn skinny_tma() -> bool {
    get(Flag::SkinnyTma)
}

/// `VT_MLA_SEESAW`.
pub fn mla_seesaw() -> bool {
    get(Flag::MlaSeesaw)
}

/// `VT_MLA_3WG`.
pub fn mla_three_wg() -> bool {
    get(Flag::Mla3wg)
}

/// `VT_MLA_FP8_PAIR`.
pub fn mla_fp8_pair() -> bool {
    get(Flag::MlaFp8Pair)
}

/// `VT_MLA_3WG_PAIR`.
pub fn mla_3wg_pair() -> bool {
    get(Flag::Mla3wgPair)
}

/// `VT_MLA_COMBINE_STRIDE`.
pub fn mla_combine_stride() -> bool {
    get(Flag::MlaCombineStride)
}

/// `VT_QUANT_WIDE`.
pub fn quant_wide() -> bool {
    get(Flag::QuantWide)
}

/// `VT_SPARSE_PREFILL`.
pub fn sparse_prefill() -> bool {
    get(Flag::SparsePrefill)
}

/// `VT_FP8_ABSORBED`.
pub fn fp8_absorbed() -> bool {
    get(Flag::Fp8Absorbed)
}

/// `VT_FP8_ABSORBED_BY_STEP`.
pub fn fp8_absorbed_by_step() -> bool {
    get(Flag::Fp8AbsorbedByStep)
}

/// `VT_MLA_GATHER`.
pub fn mla_gather() -> bool {
    get(Flag::MlaGather)
}

/// `VT_PDL`.
pub fn pdl() -> bool {
    get(Flag::Pdl)
}

/// `VT_LT_TUNE`: time the heuristic's cuBLASLt candidates at a shape's first call outside a
/// graph capture and keep the fastest. That call synchronizes its queue and runs the GEMM ~30
/// times; warm up before capturing a graph.
pub fn lt_tune() -> bool {
    get(Flag::LtTune)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_the_documented_spellings_only() {
        for v in ["1", "true", "ON", "yes", " on "] {
            assert_eq!(parse_bool(v), Some(true), "{v}");
        }
        for v in ["0", "false", "Off", "no"] {
            assert_eq!(parse_bool(v), Some(false), "{v}");
        }
        for v in ["", "2", "maybe", "o"] {
            assert_eq!(parse_bool(v), None, "{v}");
        }
    }

    #[test]
    fn override_wins_and_can_be_cleared() {
        let env = get(Flag::MlaFusedNormRope);
        set_override(Flag::MlaFusedNormRope, Some(!env));
        assert_eq!(get(Flag::MlaFusedNormRope), !env);
        set_override(Flag::MlaFusedNormRope, None);
        assert_eq!(get(Flag::MlaFusedNormRope), env);
    }

    #[test]
    fn fp8_lt_is_on_by_default() {
        assert!(Flag::Fp8Lt.default_value());
        assert!(invalid_value_message(Flag::Fp8Lt, "2").ends_with("keeping the default (on)"));
    }

    #[test]
    fn lt_tune_is_off_by_default() {
        assert!(!Flag::LtTune.default_value());
        assert_eq!(Flag::LtTune.env_name(), "VT_LT_TUNE");
        assert!(Flag::ALL.contains(&Flag::LtTune));
    }
}
