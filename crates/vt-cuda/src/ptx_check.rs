//! Checks, without a GPU, that the host side and the kernels agree: every op's planned
//! launches for sample arguments (every float dtype, optional tensors absent and present,
//! fast and fallback paths, every MlaDecodeAttention kernel) are compared with the `.entry`
//! parameter lists of the kernel files compiled to PTX by NVRTC (for `compute_90a`, so the
//! sm_90a kernels are included): the kernel exists, the host passes as many arguments as it
//! declares, each of the same kind and size (a 64-bit integer or address, a 32-bit integer,
//! an f32, or a by-value struct of the declared size and alignment). Every entry of a
//! compiled file must be launched by some sample.
//!
//! Needs libnvrtc and the CUDA headers (`.ci/kernels-cuda-deps` installs both from PyPI);
//! skipped with a note otherwise. What this cannot check: that the kernels compute the
//! right thing (the parity tests on a GPU do).

use std::collections::{BTreeMap, BTreeSet};

use vt_core::*;

use crate::launch::{Arg, Launch, TensorMapSpec};
use crate::mla_decode_attention::{self as decode, ChoiceFlags, DecodeOptions, DeviceInfo, Kernel};
use crate::nvrtc::{self, Target};

/// One `.param` of a PTX entry.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Param {
    /// `.u64`, `.s64`, `.b64` (addresses and 64-bit integers).
    B64,
    /// `.u32`, `.s32`, `.b32`.
    B32,
    F32,
    /// `.align A .b8 name[SIZE]`.
    Struct {
        align: usize,
        size: usize,
    },
    Other(String),
}

fn parse_param(decl: &str) -> Param {
    let words: Vec<&str> = decl.split_whitespace().collect();
    // `.param .align 8 .b8 name[240]` or `.param .u64 [.ptr .global .align 1] name`
    match words.get(1).copied() {
        Some(".align") => {
            let align = words.get(2).and_then(|a| a.parse().ok()).unwrap_or(0);
            let size = words
                .last()
                .and_then(|w| w.split_once('['))
                .and_then(|(_, n)| n.trim_end_matches(']').parse().ok())
                .unwrap_or(0);
            Param::Struct { align, size }
        }
        Some(".u64" | ".s64" | ".b64") => Param::B64,
        Some(".u32" | ".s32" | ".b32") => Param::B32,
        Some(".f32") => Param::F32,
        _ => Param::Other(decl.to_string()),
    }
}

/// The `.entry` parameter lists of a PTX text, by kernel name.
fn entries(ptx: &str) -> BTreeMap<String, Vec<Param>> {
    let mut out = BTreeMap::new();
    let mut lines = ptx.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim().strip_prefix(".visible .entry ") else { continue };
        let (name, no_params) = match rest.strip_suffix("()") {
            Some(name) => (name, true),
            None => (rest.trim_end_matches('('), false),
        };
        let name = name.trim().to_string();
        let mut params = Vec::new();
        if !no_params {
            for p in lines.by_ref() {
                let p = p.trim();
                if p.starts_with(')') {
                    break;
                }
                params.push(parse_param(p.trim_end_matches(',')));
            }
        }
        out.insert(name, params);
    }
    out
}

fn matches(p: &Param, a: &Arg) -> bool {
    match (p, a) {
        (Param::B64, Arg::Ptr(_) | Arg::I64(_)) | (Param::B32, Arg::I32(_)) | (Param::F32, Arg::F32(_)) => {
            true
        }
        (Param::Struct { align, size }, Arg::Struct(s)) => *align == s.align && *size == s.size,
        (Param::Struct { align, size }, Arg::TensorMaps(m)) => {
            *align == TensorMapSpec::ALIGN && *size == m.len() * TensorMapSpec::BYTES
        }
        _ => false,
    }
}

/// Views over made-up, 4 GiB-spaced (so 16-byte aligned) CUDA addresses: plans read only
/// their metadata, never their memory.
struct Fake {
    next: u64,
}

impl Fake {
    fn t(&mut self, dt: DType, shape: &[i64], strides: &[i64]) -> Tensor<'static> {
        self.next += 1 << 32;
        // SAFETY: these views are only handed to `plan` functions, which read their shape,
        // strides and addresses and never dereference them (nothing is launched).
        unsafe {
            Tensor::from_raw_parts(
                self.next,
                1 << 30,
                dt,
                Device::new(DeviceType::Cuda, 0),
                shape,
                strides,
                0,
            )
        }
        .expect("a valid fake view")
    }
    fn c(&mut self, dt: DType, shape: &[i64]) -> Tensor<'static> {
        let s = contiguous_strides(shape);
        self.t(dt, shape, &s[..shape.len()])
    }
}

type Samples = Vec<(String, Launch)>;

/// Every op's planned launches for sample arguments in `dt`.
fn samples(dt: DType) -> Result<Samples> {
    let mut f = Fake { next: 0 };
    let mut out: Samples = Vec::new();
    let mut add =
        |what: String, launches: Vec<Launch>| out.extend(launches.into_iter().map(|l| (what.clone(), l)));
    let (t, n, l, r, nb) = (3i64, 2i64, 8i64, 8i64, 16i64);

    let (a, b) = (f.t(dt, &[n, t, 6], &[6, 12, 2]), f.t(dt, &[n, 6, 5], &[1, 2, 12]));
    add(
        "BatchedMatmul (kernel)".into(),
        vec![crate::matmul::kernel_sample(&BatchedMatmulArgs { out: f.c(dt, &[n, t, 5]), a, b })],
    );
    let x = f.t(dt, &[t, l], &[l + r, 1]);
    add(
        "RmsNorm".into(),
        crate::rms_norm::plan(&RmsNormArgs { out: x, x, weight: f.c(dt, &[l]), eps: 1e-6 })?,
    );
    add(
        "LayerNorm".into(),
        crate::layer_norm::plan(&LayerNormArgs {
            out: x,
            x,
            weight: f.c(dt, &[l]),
            bias: f.c(dt, &[l]),
            eps: 1e-6,
        })?,
    );
    let (positions, cos_sin) = (f.c(DType::I64, &[t]), f.c(DType::F32, &[32, r]));
    for k in [None, Some(f.t(dt, &[t, 1, r], &[l + r, l + r, 1]))] {
        let q = f.t(dt, &[t, n, r], &[n * (l + r), l + r, 1]);
        let a =
            RopeFromCacheArgs { query: q, key: k, positions, cos_sin_cache: cos_sin, is_neox: k.is_some() };
        add("RopeFromCache".into(), crate::rope_from_cache::plan(&a)?);
    }
    let a = FusedNormRopeArgs {
        latent_out: f.c(dt, &[t, l]),
        rope_out: f.c(dt, &[t, r]),
        kv: f.t(dt, &[t, l + r], &[2 * (l + r), 1]),
        weight: f.c(dt, &[l]),
        positions,
        cos_sin_cache: cos_sin,
        eps: 1e-6,
        is_neox: false,
        query: None,
        cache_write: None,
    };
    add("FusedNormRope".into(), crate::fused_norm_rope::plan(&a)?);
    // With the query rope and the cache write (the block's fused decode step).
    let qv = f.t(dt, &[t, n, r], &[n * (l + r), l + r, 1]);
    let a = FusedNormRopeArgs {
        query: Some(vt_core::NormRopeQuery { input: qv, out: qv }),
        cache_write: Some(vt_core::NormRopeCacheWrite {
            cache: f.c(dt, &[nb, 4, l + r]),
            slot_mapping: f.c(DType::I64, &[t]),
        }),
        ..a
    };
    add("FusedNormRope".into(), crate::fused_norm_rope::plan(&a)?);
    let a = ConcatAndCacheMlaArgs {
        kv_c: f.c(dt, &[t, l]),
        k_pe: f.t(dt, &[t, r], &[l + r, 1]),
        cache: f.c(dt, &[nb, 4, l + r]),
        slot_mapping: f.c(DType::I64, &[t]),
    };
    add("ConcatAndCacheMla".into(), crate::concat_and_cache_mla::plan(&a)?);
    // The fp8_ds_mla cache (656-byte rows of L = 512, R = 64) and its gather.
    let a = ConcatAndCacheMlaArgs {
        kv_c: f.c(dt, &[t, 512]),
        k_pe: f.t(dt, &[t, 64], &[576, 1]),
        cache: f.c(DType::Fp8DsMla, &[nb, 4, 656]),
        slot_mapping: f.c(DType::I64, &[t]),
    };
    add("ConcatAndCacheMla (fp8_ds_mla)".into(), crate::concat_and_cache_mla::plan(&a)?);
    let a = GatherMlaCacheArgs {
        out: f.c(dt, &[7, 576]),
        cache: f.c(DType::Fp8DsMla, &[nb, 4, 656]),
        block_table: f.c(DType::I32, &[2, 8]),
        cu_seq_lens: f.c(DType::I32, &[3]),
        seq_starts: Some(f.c(DType::I32, &[2])),
    };
    add("GatherMlaCache (fp8_ds_mla)".into(), crate::gather_mla_cache::plan(&a)?);
    // Rows of whole 16-byte vectors (the vector kernel) and rows of 3 elements (the scalar one).
    for (d, starts) in [(64, None), (3, Some(f.c(DType::I32, &[2])))] {
        let a = GatherMlaCacheArgs {
            out: f.c(dt, &[7, d]),
            cache: f.c(dt, &[nb, 4, d]),
            block_table: f.c(DType::I32, &[2, 8]),
            cu_seq_lens: f.c(DType::I32, &[3]),
            seq_starts: starts,
        };
        add(format!("GatherMlaCache (D {d})"), crate::gather_mla_cache::plan(&a)?);
    }
    for (p, rope_heads) in [(64, 1), (3, n)] {
        let a = ConcatMlaNopeRopeArgs {
            out: f.c(dt, &[t, n, p + 64]),
            nope: f.c(dt, &[t, n, p]),
            rope: f.c(dt, &[t, rope_heads, 64]),
        };
        add(format!("ConcatMlaNopeRope (P {p})"), crate::concat_mla_nope_rope::plan(&a)?);
    }
    for out_lse in [None, Some(f.c(DType::F32, &[n, t]))] {
        let a = MergeAttnStatesArgs {
            out: f.c(dt, &[t, n, l]),
            out_lse,
            prefix: f.c(dt, &[t, n, l]),
            prefix_lse: f.c(DType::F32, &[n, t]),
            suffix: f.c(dt, &[t, n, l]),
            suffix_lse: f.t(DType::F32, &[n, t], &[1, n]),
        };
        add("MergeAttnStates".into(), crate::merge_attn_states::plan(&a)?);
    }
    // MlaDecodeAttention: the generic kernel (any dtype), and on 16-bit dtypes every
    // tensor-core kernel at 16, 32 and 64 query rows per CTA (the narrow wgmma kernel at 16
    // and 32).
    let info = DeviceInfo { sm: 90, sms: 132, wgmma: true, smem_optin: 232_448, pair_clusters: 66 };
    let (d, dv, bs) = (576, 512, 64);
    let mut kernels = vec![(Kernel::Generic, 2, false)];
    if dt != DType::F32 {
        for heads in [8, 32, 64] {
            kernels.extend([(Kernel::Mma, heads, false), (Kernel::MmaSmall, heads, false)]);
        }
        kernels.extend([
            (Kernel::Wgmma, 64, false),
            (Kernel::Wgmma, 64, true),
            (Kernel::WgmmaSeesaw, 64, true),
            (Kernel::Wgmma3, 64, true),
            // Without the TMA: the three-warpgroup kernel's gather form.
            (Kernel::Wgmma3, 64, false),
            // Its CTA pairs (two row blocks).
            (Kernel::Wgmma3Pair, 128, true),
        ]);
        for heads in [8, 32] {
            kernels.extend([(Kernel::WgmmaNarrow, heads, false), (Kernel::WgmmaNarrow, heads, true)]);
        }
    }
    // The generic kernel over an fp8_ds_mla cache (the `generic_fp8` base).
    let mut kernels: Vec<(Kernel, i64, bool, DType)> =
        kernels.into_iter().map(|(k, h, t)| (k, h, t, dt)).collect();
    kernels.push((Kernel::Generic, 16, false, DType::Fp8DsMla));
    if dt != DType::F32 {
        // The mma.sync kernels over an fp8_ds_mla cache (`mma{16,32,64}[s]_fp8`).
        for heads in [8, 32, 64] {
            kernels.push((Kernel::Mma, heads, false, DType::Fp8DsMla));
            if heads <= 32 {
                kernels.push((Kernel::MmaSmall, heads, false, DType::Fp8DsMla));
            }
            kernels.push((Kernel::WgmmaNarrow, heads, false, DType::Fp8DsMla));
            kernels.push((Kernel::WgmmaNarrow, heads, true, DType::Fp8DsMla));
        }
        kernels.push((Kernel::Wgmma, 64, false, DType::Fp8DsMla));
        // Its CTA pairs (two row blocks).
        kernels.push((Kernel::WgmmaFp8Pair, 128, false, DType::Fp8DsMla));
        // The raw-ring kernel (bf16 queries only; two maps in one parameter).
        if dt == DType::BF16 {
            kernels.push((Kernel::WgmmaFp8Raw, 64, true, DType::Fp8DsMla));
            // Without the TMA: its gather form (no tensor-map parameter).
            kernels.push((Kernel::WgmmaFp8Raw, 64, false, DType::Fp8DsMla));
        }
    }
    // The paged TMA forms of the three-warpgroup kernel and its pairs: 16-row pages.
    let paged: Vec<(Kernel, i64, bool, DType, i64)> = if dt == DType::F32 {
        Vec::new()
    } else {
        vec![(Kernel::Wgmma3Paged, 64, true, dt, 16), (Kernel::Wgmma3Pair, 128, true, dt, 16)]
    };
    let all = kernels.into_iter().map(|(k, h, t, c)| (k, h, t, c, bs)).chain(paged);
    // Every other plan with the combine's strided form (VT_MLA_COMBINE_STRIDE).
    for (i, (kernel, heads, tma, cache_dt, bs)) in all.enumerate() {
        let cache_w = if cache_dt == DType::Fp8DsMla { 656 } else { d };
        let a = MlaDecodeAttentionArgs {
            out: f.c(dt, &[2, 1, heads, dv]),
            lse: Some(f.c(DType::F32, &[2, heads, 1])),
            query: f.c(dt, &[2, 1, heads, d]),
            cache: f.c(cache_dt, &[nb, bs, cache_w]),
            block_table: f.c(DType::I32, &[2, 8]),
            seq_lens: f.c(DType::I32, &[2]),
            scale: 0.5,
        };
        let opts = DecodeOptions { kernel, ..DecodeOptions::default() };
        let stride = i % 2 == 1;
        let flags = ChoiceFlags { combine_stride: stride, ..ChoiceFlags::new(tma, true) };
        let c = decode::choose(&a, &info, &opts, flags)?;
        // The strided plans' combine on one SM (a wave of 3 CTAs), so that it strides over two
        // sequences of 2+ row groups (it takes the plain form where it would launch every group).
        let linfo = if stride { DeviceInfo { sms: 1, ..info } } else { info };
        add(
            format!("MlaDecodeAttention ({})", c.plan.kernel),
            decode::launches(&a, &c, &linfo, (1 << 40, 2 << 40, 3 << 40))?,
        );
    }
    // SparseMlaAttention: the generic kernel over float and fp8_ds_mla caches (a cache whose
    // blocks are not BS rows apart: a layer of a [NB, 2, BS, D] pool), and the decode kernels
    // over the block-size-1 view of a whole cache (the launches of the view `decode_args` makes).
    {
        use crate::sparse_mla_attention::{decode_args, generic_plan, slot_stride};
        for (cache_dt, w) in [(dt, d), (DType::Fp8DsMla, 656)] {
            let pooled = f.t(cache_dt, &[nb, 4, w], &[2 * 4 * w, w, 1]);
            assert_eq!(slot_stride(&pooled), None);
            for lse in [None, Some(f.t(DType::F32, &[16, 3], &[1, 16]))] {
                let a = SparseMlaAttentionArgs {
                    out: f.c(dt, &[3, 16, dv]),
                    lse,
                    query: f.c(dt, &[3, 16, d]),
                    cache: pooled,
                    indices: f.c(DType::I32, &[3, 64]),
                    scale: 0.5,
                };
                add("SparseMlaAttention (generic)".into(), generic_plan(&a)?);
            }
            let kernel = if dt == DType::F32 { Kernel::Generic } else { Kernel::Auto };
            for heads in [16, 128] {
                let a = SparseMlaAttentionArgs {
                    out: f.c(dt, &[3, heads, dv]),
                    lse: Some(f.c(DType::F32, &[heads, 3])),
                    query: f.c(dt, &[3, heads, d]),
                    cache: f.c(cache_dt, &[nb, bs, w]),
                    indices: f.c(DType::I32, &[3, 2048]),
                    scale: 0.5,
                };
                let stride = slot_stride(&a.cache).expect("a whole cache has the block-size-1 view");
                let da = decode_args(&a, stride, f.t(DType::I32, &[3], &[0]))?;
                let opts = DecodeOptions { kernel, ..DecodeOptions::default() };
                let c = decode::choose(&da, &info, &opts, ChoiceFlags::new(false, true))?;
                add(
                    format!("SparseMlaAttention (decode {})", c.plan.kernel),
                    decode::launches(&da, &c, &info, (1 << 40, 2 << 40, 3 << 40))?,
                );
            }
        }
    }
    // SparseMlaAttention's prefill kernel (16-bit dtypes, 64 heads a CTA).
    if dt != DType::F32 {
        use crate::sparse_mla_attention::prefill_plan;
        let a = SparseMlaAttentionArgs {
            out: f.c(dt, &[3, 128, dv]),
            lse: Some(f.c(DType::F32, &[128, 3])),
            query: f.c(dt, &[3, 128, d]),
            cache: f.c(dt, &[nb, bs, d]),
            indices: f.c(DType::I32, &[3, 2048]),
            scale: 0.5,
        };
        add("SparseMlaAttention (prefill)".into(), prefill_plan(&a)?);
    }
    // CacheIndexerKeys: a column slice of a wider projection into a layer of a pool.
    let a = CacheIndexerKeysArgs {
        k: f.t(dt, &[t, 128], &[576, 1]),
        cache: f.t(dt, &[nb, 4, 128], &[2 * 4 * 128, 128, 1]),
        slot_mapping: f.c(DType::I64, &[t]),
    };
    add("CacheIndexerKeys".into(), crate::cache_indexer_keys::plan(&a)?);
    // PrefillAttention: the generic kernel (any dtype); on 16-bit dtypes the mma.sync kernel
    // and the wgmma kernel at every fast head-dim pair (sm_90 planned without a device).
    {
        use crate::prefill_attention::{plan, Kernel as PK, FAST_DIMS};
        let mut kernels = vec![(PK::Generic, 16, 8)];
        if dt != DType::F32 {
            for (d, dv) in FAST_DIMS {
                kernels.extend([(PK::Mma, d, dv), (PK::Wgmma, d, dv)]);
            }
        }
        for (kernel, d, dv) in kernels {
            let a = PrefillAttentionArgs {
                out: f.c(dt, &[t, n, dv]),
                lse: Some(f.c(DType::F32, &[n, t])),
                query: f.c(dt, &[t, n, d]),
                k: f.c(dt, &[t, n, d]),
                v: f.c(dt, &[t, n, dv]),
                cu_seqlens_q: f.c(DType::I32, &[2]),
                cu_seqlens_k: f.c(DType::I32, &[2]),
                max_seqlen_q: t,
                causal: true,
                scale: 0.5,
            };
            add(format!("PrefillAttention ({kernel:?} {d}x{dv})"), plan(90, &a, kernel)?.1);
        }
    }
    // The fp8 ops: QuantizeFp8, and every fp8 matmul kernel (Gemv at 8, 16 and 32 tokens a
    // CTA on 16-bit dtypes, Mma, Wgmma, Generic with both activation forms), MatmulBTFp8 and the
    // batched form (the absorbed W_UV: K-contiguous per-head weights).
    {
        use crate::fp8_matmul::{
            plan_batched, plan_matmul_bt, plan_quantize, Device, Fp8Options, Kernel as FK, QuantKernel,
        };
        let dev = Device { sm: 90, sms: 132 };
        let part = 5u64 << 40;
        let (f8, f32t) = (DType::F8E4M3, DType::F32);
        let a = QuantizeFp8Args { out: f.c(f8, &[t, 256]), scale: f.c(f32t, &[t, 2]), x: f.c(dt, &[t, 256]) };
        add("QuantizeFp8".into(), plan_quantize(&a, QuantKernel::Warp, dev.sms)?);
        add("QuantizeFp8 wide".into(), plan_quantize(&a, QuantKernel::Wide, dev.sms)?);
        // (kernel, M, fp8 activations, forced K splits): the split-K forms add the combine launch.
        let mut forms = vec![
            (FK::Generic, 3, false, None),
            (FK::Generic, 3, true, None),
            (FK::Mma, 130, true, None),
            (FK::Wgmma, 130, true, None),
            (FK::Wgmma, 130, true, Some(3)),
        ];
        if dt != DType::F32 {
            forms.extend([
                (FK::Gemv, 1, false, None),
                (FK::Gemv, 9, false, Some(2)),
                (FK::Gemv, 17, false, Some(1)),
            ]);
        }
        let (n, k) = (200, 384);
        for (kernel, m, fp8_a, splits) in forms {
            let out = f.c(dt, &[m, n]);
            let act = f.c(if fp8_a { f8 } else { dt }, &[m, k]);
            let a_scale = if fp8_a { Some(f.c(f32t, &[m, 3])) } else { None };
            let (b, b_scale) = (f.c(f8, &[n, k]), f.c(f32t, &[2, 3]));
            let a = MatmulBTFp8Args { out, a: act, a_scale, b, b_scale };
            let launches = plan_matmul_bt(dev, &a, &Fp8Options { kernel, splits }, part)?.1;
            let split = splits.unwrap_or(1) > 1 || (kernel == FK::Gemv && m == 1);
            assert_eq!(launches.len(), if split { 2 } else { 1 }, "{kernel:?} M {m} splits {splits:?}");
            add(format!("MatmulBTFp8 ({kernel:?}, splits {splits:?})"), launches);
        }
        let (g, l, v) = (4, 512, 128);
        for kernel in [FK::Auto, FK::Generic] {
            let a = BatchedMatmulFp8Args {
                out: f.c(dt, &[g, 2, v]),
                a: f.c(dt, &[g, 2, l]),
                a_scale: None,
                b: f.t(f8, &[g, l, v], &[256 * l, 1, l]),
                b_scale: f.t(f32t, &[g, 4, 1], &[8, 1, 1]),
            };
            add(
                format!("BatchedMatmulFp8 ({kernel:?})"),
                plan_batched(dev, &a, &Fp8Options { kernel, splits: None }, part)?.1,
            );
        }
    }
    // The skinny GEMM (16-bit dtypes): 16-bit weights through MatmulBT / BatchedMatmul and
    // fp8 weights through MatmulBTFp8 at 1, 9, 17 and 33 tokens (t1, t2, t4, t8; w8tma t1, t2, t4),
    // split and unsplit, and at o_proj's shape (w8tma_shallow t1, t2).
    if dt != DType::F32 {
        use crate::fp8_matmul::{plan_matmul_bt, Device, Fp8Options, Kernel as FK};
        use crate::skinny_gemm::{plan, Problem};
        let (n, k) = (200, 384);
        for (m, splits) in [(1, None), (9, Some(3)), (17, Some(1)), (33, None)] {
            let a = MatmulBTArgs { out: f.c(dt, &[m, n]), a: f.c(dt, &[m, k]), b: f.c(dt, &[n, k]) };
            add(
                format!("MatmulBT (skinny M {m})"),
                plan(132, false, &Problem::of_matmul_bt(&a), splits, 6 << 40)?.0,
            );
            // K of 8 chunks: sm_90 takes the TMA form up to M 32 (with VT_SKINNY_TMA on), sm_80
            // the cp.async one.
            let k8 = 1024;
            let a = MatmulBTFp8Args {
                out: f.c(dt, &[m, n]),
                a: f.c(dt, &[m, k8]),
                a_scale: None,
                b: f.c(DType::F8E4M3, &[n, k8]),
                b_scale: f.c(DType::F32, &[2, 8]),
            };
            for sm in [90, 80] {
                let dev = Device { sm, sms: 132 };
                let l = plan_matmul_bt(dev, &a, &Fp8Options { kernel: FK::Skinny, splits }, 6 << 40)?.1;
                add(format!("MatmulBTFp8 (Skinny M {m}, sm_{sm})"), l);
            }
        }
        // o_proj's shape at 1 and 9 tokens: the shallow rings (w8tma_shallow t1, t2).
        for m in [1, 9] {
            let (n, k) = (7168, 16384);
            let a = MatmulBTFp8Args {
                out: f.c(dt, &[m, n]),
                a: f.c(dt, &[m, k]),
                a_scale: None,
                b: f.c(DType::F8E4M3, &[n, k]),
                b_scale: f.c(DType::F32, &[n / 128, k / 128]),
            };
            let dev = Device { sm: 90, sms: 132 };
            let l = plan_matmul_bt(dev, &a, &Fp8Options { kernel: FK::Skinny, splits: None }, 6 << 40)?.1;
            add(format!("MatmulBTFp8 (Skinny o_proj M {m}, sm_90)"), l);
        }
        let a = BatchedMatmulArgs {
            out: f.c(dt, &[4, 2, 128]),
            a: f.t(dt, &[4, 2, 512], &[512, 4 * 512, 1]),
            b: f.t(dt, &[4, 512, 128], &[128 * 512, 1, 512]),
        };
        add("BatchedMatmul (skinny)".into(), plan(132, false, &Problem::of_batched(&a), None, 6 << 40)?.0);
        // N-contiguous per-head weights (the block's 16-bit W_UK_T / W_UV): w16n t1..t8.
        for m in [1, 9, 17, 33] {
            let a = BatchedMatmulArgs {
                out: f.c(dt, &[4, m, 512]),
                a: f.t(dt, &[4, m, 128], &[128, 4 * 128, 1]),
                b: f.c(dt, &[4, 128, 512]),
            };
            add(
                format!("BatchedMatmul (skinny N-contiguous M {m})"),
                plan(132, false, &Problem::of_batched(&a), None, 6 << 40)?.0,
            );
        }
    }
    // IndexerTopK: the generic score kernel (every dtype, f32 weights and i64 positions) and,
    // on 16-bit dtypes, the tensor-core one (weights in the dtype, i32 positions).
    {
        use crate::indexer_top_k::{layout, plan, Kernel as IK};
        // (kernel, weights dtype, positions dtype, heads, Di, sequences): Di 128 with <= 64
        // heads takes the Q-in-registers tensor-core kernel (two queries a CTA with one
        // sequence for the 3 queries), Di 64 the general one.
        let mut kernels = vec![(IK::Generic, DType::F32, DType::I64, 64, 128, 2)];
        if dt != DType::F32 {
            kernels.push((IK::Mma, dt, DType::I32, 64, 128, 2));
            kernels.push((IK::Mma, dt, DType::I32, 64, 128, 1));
            kernels.push((IK::Mma, DType::F32, DType::I32, 80, 64, 2));
        }
        for (kernel, wdt, pdt, h, di, seqs) in kernels {
            let a = IndexerTopKArgs {
                out: f.t(DType::I32, &[t, 64], &[72, 1]),
                query: f.c(dt, &[t, h, di]),
                weights: f.c(wdt, &[t, h]),
                cache: f.t(dt, &[nb, 4, di], &[2 * 4 * di, di, 1]),
                block_table: f.c(DType::I32, &[seqs, 8]),
                seq_ids: f.c(DType::I32, &[t]),
                positions: f.c(pdt, &[t]),
                scale: 0.088,
            };
            let l = layout(&a)?;
            add(
                format!("IndexerTopK ({kernel:?}, H {h}, Di {di}, {seqs} sequences)"),
                plan(&a, kernel, 1 << 40, &l, 232_448)?.1,
            );
        }
    }
    Ok(out)
}

#[test]
fn planned_launches_match_the_ptx_parameter_lists() {
    if !crate::test_util::nvrtc_ready() {
        return;
    }
    let mut plans = Vec::new();
    for dt in [DType::F32, DType::F16, DType::BF16] {
        plans.extend(samples(dt).expect("sample plans"));
    }
    let mut covered = BTreeSet::new();
    let mut ptx: BTreeMap<&'static str, BTreeMap<String, Vec<Param>>> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut launched = BTreeSet::new();
    for (what, l) in &plans {
        covered.insert(what.split(' ').next().unwrap_or_default().to_string());
        if !ptx.contains_key(l.src.name) {
            let (code, headers) = crate::kernels::texts(l.src).expect("kernel text");
            let headers: Vec<(&str, &str)> = headers.iter().map(|(n, t)| (*n, t.as_str())).collect();
            let name = format!("{}.cu", l.src.name);
            let image = nvrtc::compile(&name, &code, &headers, Target::PtxArchSpecific(90)).expect("NVRTC");
            ptx.insert(l.src.name, entries(&String::from_utf8_lossy(&image.bytes)));
        }
        let symbol = l.symbol();
        launched.insert(symbol.clone());
        let Some(params) = ptx.get(l.src.name).and_then(|e| e.get(&symbol)) else {
            problems.push(format!("{what}: {symbol} is not an entry of {}.cu", l.src.name));
            continue;
        };
        if params.len() != l.args.len() {
            problems.push(format!(
                "{what}: {symbol} declares {} parameters, the host passes {}",
                params.len(),
                l.args.len()
            ));
        }
        for (i, (p, a)) in params.iter().zip(&l.args).enumerate() {
            if !matches(p, a) {
                problems.push(format!("{what}: {symbol} parameter {i} is {p:?}, the host passes {a:?}"));
            }
        }
    }
    for (file, es) in &ptx {
        for name in es.keys().filter(|n| !launched.contains(*n)) {
            problems.push(format!("{file}.cu: entry {name} is launched by no sample"));
        }
    }
    // Every op plans launches here except the cuBLAS matmul path (no kernel: MatmulBT
    // shares BatchedMatmul's fallback kernel).
    for op in OpId::ALL {
        let exempt = matches!(op, OpId::MatmulBT) || crate::OP_GAPS.contains(op);
        if !exempt && !covered.contains(op.name()) {
            problems.push(format!("{op}: no sample plan"));
        }
    }
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
    println!("{} planned launches checked against {} kernel files", plans.len(), ptx.len());
}

#[test]
fn ptx_parameter_lists_parse() {
    let ptx = "
.visible .entry k_bf16(
\t.param .u64 .ptr .global .align 1 k_bf16_param_0,
\t.param .u32 k_bf16_param_1,
\t.param .f32 k_bf16_param_2,
\t.param .align 8 .b8 k_bf16_param_3[240]
)
{
}
.visible .entry empty()
{
}";
    let e = entries(ptx);
    assert_eq!(e["k_bf16"], vec![Param::B64, Param::B32, Param::F32, Param::Struct { align: 8, size: 240 }]);
    assert_eq!(e["empty"], vec![]);
}
