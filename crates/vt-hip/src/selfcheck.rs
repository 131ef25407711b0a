//! Checks, without a GPU, that the host side and the kernels agree: every kernel file is
//! compiled by hiprtc through the same path the backend uses (for a target given by name),
//! and every launch that the ops plan for sample arguments of every op and dtype is checked
//! against the compiled kernel's metadata: the kernel exists, the host passes as many
//! arguments as it declares with the same sizes and kinds (pointer or value), the block
//! fits its workgroup limit, and static plus dynamic shared memory fit in 64 KiB. Every
//! exported kernel must be launched by some op, and every op of [`OpId::ALL`] must plan.
//!
//! What this cannot check: that the kernels compute the right thing (that needs an AMD GPU).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use vt_core::*;

use crate::codeobject::{self, KernelMeta};
use crate::launch::{Arg, Step};
use crate::sys::{self, Libraries};
use crate::{compile, driver};

/// What [`run`] found.
#[derive(Debug)]
pub struct Report {
    pub arch: String,
    pub hiprtc_version: (i32, i32),
    pub files: usize,
    /// Kernels exported by the compiled files.
    pub kernels: usize,
    /// Planned launches checked against them.
    pub launches: usize,
    /// Wave size the compiler used for `arch` (64 on CDNA).
    pub wavefront_size: u64,
    /// Every kernel file and its compile error, if any.
    pub compiled: Vec<(String, Option<String>)>,
    /// Compile failures and host/kernel mismatches; empty when everything agrees.
    pub problems: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hiprtc {}.{} for {}: {} files, {} kernels (wave{}), {} planned launches checked: {}",
            self.hiprtc_version.0,
            self.hiprtc_version.1,
            self.arch,
            self.files,
            self.kernels,
            self.wavefront_size,
            self.launches,
            if self.passed() { "ok".to_string() } else { format!("{} problem(s)", self.problems.len()) }
        )?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

/// Compiles every kernel file for `arch` with hiprtc and checks the ops' planned launches
/// against the result. `cache`: the disk cache to use (`None` compiles everything afresh,
/// as CI does). `Err` only when hiprtc cannot be loaded; compile failures and mismatches
/// are listed in the report.
pub fn run(libs: &Libraries, arch: &str, cache: Option<&Path>) -> Result<Report, String> {
    let (_, opened) = sys::load_hip(&libs.hip)?;
    let (rtc, _) = sys::load_hiprtc(&opened, &libs.hiprtc)?;
    let hiprtc_version = driver::hiprtc_version(rtc).map_err(|e| e.to_string())?;
    let mut metas: BTreeMap<String, (&'static str, KernelMeta)> = BTreeMap::new();
    let mut compiled = Vec::new();
    for (file, _) in compile::SOURCES {
        let result = compile::compile_with_cache(rtc, file, arch, cache)
            .map_err(|e| e.to_string())
            .and_then(|code| codeobject::kernels(&code.bytes).map_err(|e| format!("{file}: {e}")));
        match result {
            Ok(kernels) => {
                for k in kernels {
                    metas.insert(k.name.clone(), (*file, k));
                }
                compiled.push((file.to_string(), None));
            }
            Err(e) => compiled.push((file.to_string(), Some(e))),
        }
    }
    let mut report = Report {
        arch: arch.to_string(),
        hiprtc_version,
        files: compile::SOURCES.len(),
        kernels: metas.len(),
        launches: 0,
        wavefront_size: metas.values().map(|(_, k)| k.wavefront_size).max().unwrap_or(0),
        problems: compiled
            .iter()
            .filter_map(|(f, e)| e.as_ref().map(|e| format!("{f} did not compile: {e}")))
            .collect(),
        compiled,
    };
    let mut launched = BTreeSet::new();
    let (plans, problems) = sample_plans();
    report.problems.extend(problems);
    for (what, step) in plans {
        let Step::Kernel(l) = step else { continue };
        report.launches += 1;
        launched.insert(l.kernel.clone());
        let Some((file, meta)) = metas.get(&l.kernel) else {
            if report.compiled.iter().any(|(f, e)| f == l.file && e.is_some()) {
                continue; // already reported as a compile failure
            }
            report.problems.push(format!("{what}: kernel {} is not exported by any file", l.kernel));
            continue;
        };
        if *file != l.file {
            report.problems.push(format!("{what}: {} is in {file}, the launch names {}", l.kernel, l.file));
        }
        let declared: Vec<_> = meta.explicit_args().collect();
        if declared.len() != l.args.0.len() {
            report.problems.push(format!(
                "{what}: {} declares {} arguments, the host passes {}",
                l.kernel,
                declared.len(),
                l.args.0.len()
            ));
        }
        for (i, (d, a)) in declared.iter().zip(&l.args.0).enumerate() {
            let kind_ok = match a {
                Arg::Ptr(_) => d.value_kind == "global_buffer",
                _ => d.value_kind == "by_value",
            };
            if d.size != a.size() as u64 || !kind_ok {
                report.problems.push(format!(
                    "{what}: {} argument {i} is {} bytes ({}), the host passes {a:?} ({} bytes)",
                    l.kernel,
                    d.size,
                    d.value_kind,
                    a.size()
                ));
            }
        }
        if l.block as u64 > meta.max_flat_workgroup_size {
            report.problems.push(format!(
                "{what}: block of {} threads > {}'s limit {}",
                l.block, l.kernel, meta.max_flat_workgroup_size
            ));
        }
        if meta.group_segment_fixed_size + l.shared_bytes as u64 > 65_536 {
            report.problems.push(format!(
                "{what}: {} bytes static + {} dynamic shared memory exceed 64 KiB",
                meta.group_segment_fixed_size, l.shared_bytes
            ));
        }
        if l.grid == 0 || l.grid as i64 > crate::launch::MAX_GRID {
            report.problems.push(format!("{what}: grid of {} blocks", l.grid));
        }
    }
    for name in metas.keys() {
        if !launched.contains(name) {
            report.problems.push(format!("kernel {name} is launched by no op"));
        }
    }
    Ok(report)
}

/// Views over made-up addresses: plans read only their metadata, never their memory.
pub(crate) struct Fake {
    next: u64,
}

impl Fake {
    pub(crate) fn new() -> Fake {
        Fake { next: 0 }
    }
    pub(crate) fn t(&mut self, dtype: DType, shape: &[i64], strides: &[i64]) -> Result<Tensor<'static>> {
        self.next += 1 << 32;
        // SAFETY: these views are only handed to `plan` functions, which read their shape,
        // strides and addresses and never dereference them (nothing is launched).
        unsafe {
            Tensor::from_raw_parts(
                self.next,
                1 << 30,
                dtype,
                Device::new(DeviceType::Hip, 0),
                shape,
                strides,
                0,
            )
        }
    }
    pub(crate) fn c(&mut self, dtype: DType, shape: &[i64]) -> Result<Tensor<'static>> {
        let s = contiguous_strides(shape);
        self.t(dtype, shape, &s[..shape.len()])
    }
}

type Plans = Vec<(String, Step)>;

/// Plans of every op for sample arguments (optional tensors absent and present), in every
/// float dtype; GEMMs without rocBLAS, so their kernel is planned.
fn sample_plans() -> (Plans, Vec<String>) {
    let mut plans = Vec::new();
    let mut problems = Vec::new();
    let mut covered = BTreeSet::new();
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let samples = match op_samples(dt) {
            Ok(s) => s,
            Err(e) => {
                problems.push(format!("samples for {dt}: {e}"));
                continue;
            }
        };
        for (op, steps) in samples {
            match steps {
                Ok(steps) if !steps.is_empty() => {
                    covered.insert(op);
                    plans.extend(steps.into_iter().map(|s| (format!("{op} {dt}"), s)));
                }
                Ok(_) => problems.push(format!("{op} {dt}: the sample planned nothing")),
                Err(e) => problems.push(format!("{op} {dt}: {e}")),
            }
        }
    }
    for op in OpId::ALL {
        if !covered.contains(op) && !crate::OP_GAPS.contains(op) {
            problems.push(format!("{op}: no sample plan"));
        }
    }
    (plans, problems)
}

fn op_samples(dt: DType) -> Result<Vec<(OpId, Result<Vec<Step>>)>> {
    let mut f = Fake::new();
    let mut out: Vec<(OpId, Result<Vec<Step>>)> = Vec::new();
    let mut add = |op: OpId, r: Result<Vec<Step>>| out.push((op, r));
    let (t, n, l, r, bs, nb) = (3i64, 2i64, 8i64, 4i64, 1i64, 16i64);

    add(
        OpId::MatmulBT,
        (|| {
            let args =
                MatmulBTArgs { out: f.c(dt, &[t, 5])?, a: f.t(dt, &[t, 6], &[10, 1])?, b: f.c(dt, &[5, 6])? };
            crate::matmul_bt::plan(&args, false)
        })(),
    );
    add(
        OpId::BatchedMatmul,
        (|| {
            let args = BatchedMatmulArgs {
                out: f.c(dt, &[n, t, 5])?,
                a: f.t(dt, &[n, t, 6], &[6, 12, 1])?,
                b: f.t(dt, &[n, 6, 5], &[1, 2, 12])?,
            };
            crate::batched_matmul::plan(&args, false)
        })(),
    );
    add(
        OpId::RmsNorm,
        (|| {
            let x = f.t(dt, &[t, l], &[l + r, 1])?;
            crate::rms_norm::plan(&RmsNormArgs { out: x, x, weight: f.c(dt, &[l])?, eps: 1e-6 })
        })(),
    );
    add(
        OpId::LayerNorm,
        (|| {
            let x = f.t(dt, &[t, l], &[l + r, 1])?;
            crate::layer_norm::plan(&LayerNormArgs {
                out: x,
                x,
                weight: f.c(dt, &[l])?,
                bias: f.c(dt, &[l])?,
                eps: 1e-6,
            })
        })(),
    );
    let positions = f.c(DType::I64, &[t])?;
    let cos_sin = f.c(DType::F32, &[32, r])?;
    add(
        OpId::RopeFromCache,
        (|| {
            let q = f.t(dt, &[t, n, r], &[n * (l + r), l + r, 1])?;
            let k = f.t(dt, &[t, 1, r], &[l + r, l + r, 1])?;
            let mut steps = Vec::new();
            for key in [None, Some(k)] {
                let args = RopeFromCacheArgs {
                    query: q,
                    key,
                    positions,
                    cos_sin_cache: cos_sin,
                    is_neox: key.is_some(),
                };
                steps.extend(crate::rope_from_cache::plan(&args)?);
            }
            Ok(steps)
        })(),
    );
    add(
        OpId::FusedNormRope,
        (|| {
            let args = FusedNormRopeArgs {
                latent_out: f.c(dt, &[t, l])?,
                rope_out: f.c(dt, &[t, r])?,
                kv: f.t(dt, &[t, l + r], &[2 * (l + r), 1])?,
                weight: f.c(dt, &[l])?,
                positions,
                cos_sin_cache: cos_sin,
                eps: 1e-6,
                is_neox: false,
                query: None,
                cache_write: None,
            };
            crate::fused_norm_rope::plan(&args)
        })(),
    );
    add(
        OpId::ConcatAndCacheMla,
        (|| {
            let args = ConcatAndCacheMlaArgs {
                kv_c: f.c(dt, &[t, l])?,
                k_pe: f.t(dt, &[t, r], &[l + r, 1])?,
                cache: f.c(dt, &[nb, bs, l + r])?,
                slot_mapping: f.c(DType::I64, &[t])?,
            };
            crate::concat_and_cache_mla::plan(&args)
        })(),
    );
    add(
        OpId::GatherMlaCache,
        (|| {
            let mut steps = Vec::new();
            for starts in [None, Some(f.c(DType::I32, &[2])?)] {
                let args = GatherMlaCacheArgs {
                    out: f.c(dt, &[7, l + r])?,
                    cache: f.c(dt, &[nb, bs, l + r])?,
                    block_table: f.c(DType::I32, &[2, 8])?,
                    cu_seq_lens: f.c(DType::I32, &[3])?,
                    seq_starts: starts,
                };
                steps.extend(crate::gather_mla_cache::plan(&args)?);
            }
            Ok(steps)
        })(),
    );
    // The fp8_ds_mla cache: 656-byte rows (512 + 64 values), a layer of a two-layer pool
    // (strides in bytes), every query / kv dtype.
    let (fl, fr, fw) = (512i64, 64i64, 656i64);
    let fp8_cache = |f: &mut Fake| f.t(DType::Fp8DsMla, &[nb, bs, fw], &[2 * bs * fw, fw, 1]);
    add(
        OpId::ConcatAndCacheMla,
        (|| {
            let args = ConcatAndCacheMlaArgs {
                kv_c: f.t(dt, &[t, fl], &[fl + fr, 1])?,
                k_pe: f.t(dt, &[t, fr], &[fl + fr, 1])?,
                cache: fp8_cache(&mut f)?,
                slot_mapping: f.c(DType::I64, &[t])?,
            };
            crate::concat_and_cache_mla::plan(&args)
        })(),
    );
    add(
        OpId::GatherMlaCache,
        (|| {
            let mut steps = Vec::new();
            for starts in [None, Some(f.c(DType::I32, &[2])?)] {
                let args = GatherMlaCacheArgs {
                    out: f.c(dt, &[7, fl + fr])?,
                    cache: fp8_cache(&mut f)?,
                    block_table: f.c(DType::I32, &[2, 8])?,
                    cu_seq_lens: f.c(DType::I32, &[3])?,
                    seq_starts: starts,
                };
                steps.extend(crate::gather_mla_cache::plan(&args)?);
            }
            Ok(steps)
        })(),
    );
    add(
        OpId::MlaDecodeAttention,
        (|| {
            let mut steps = Vec::new();
            for lse in [None, Some(f.c(DType::F32, &[2, n, 1])?)] {
                let args = MlaDecodeAttentionArgs {
                    out: f.c(dt, &[2, 1, n, fl])?,
                    lse,
                    query: f.c(dt, &[2, 1, n, fl + fr])?,
                    cache: fp8_cache(&mut f)?,
                    block_table: f.c(DType::I32, &[2, 8])?,
                    seq_lens: f.c(DType::I32, &[2])?,
                    scale: 0.5,
                };
                steps.extend(crate::mla_decode_attention::plan(&args)?);
            }
            Ok(steps)
        })(),
    );
    // DeepSeek-V3.2's sparse ops: the attention over both cache kinds (lse absent and
    // present, stored [T, N] and passed transposed), the indexer with both weight dtypes and
    // both position dtypes (a layer of a two-layer key pool), the key cache writer.
    add(
        OpId::SparseMlaAttention,
        (|| {
            let mut steps = Vec::new();
            for (fp8, lse) in [(false, None), (true, Some(f.t(DType::F32, &[n, t], &[1, n])?))] {
                let (d, cache) =
                    if fp8 { (fl + fr, fp8_cache(&mut f)?) } else { (l + r, f.c(dt, &[nb, bs, l + r])?) };
                let args = SparseMlaAttentionArgs {
                    out: f.c(dt, &[t, n, if fp8 { fl } else { l }])?,
                    lse,
                    query: f.t(dt, &[t, n, d], &[n * (d + 8), d + 8, 1])?,
                    cache,
                    indices: f.t(DType::I32, &[t, 5], &[1, t])?,
                    scale: 0.5,
                };
                steps.extend(crate::sparse_mla_attention::plan(&args)?);
            }
            Ok(steps)
        })(),
    );
    add(
        OpId::IndexerTopK,
        (|| {
            let mut steps = Vec::new();
            for (wdt, pdt) in [(dt, DType::I32), (DType::F32, DType::I64)] {
                let args = IndexerTopKArgs {
                    out: f.c(DType::I32, &[t, 4])?,
                    query: f.t(dt, &[t, n, l], &[n * (l + r), l + r, 1])?,
                    weights: f.t(wdt, &[t, n], &[1, t])?,
                    cache: f.t(dt, &[nb, 4, l], &[2 * 4 * l, l, 1])?,
                    block_table: f.c(DType::I32, &[2, 8])?,
                    seq_ids: f.c(DType::I32, &[t])?,
                    positions: f.c(pdt, &[t])?,
                    scale: 0.25,
                };
                let layout = crate::indexer_top_k::layout(&args)?;
                steps.extend(crate::indexer_top_k::plan(&args, &layout, 1 << 40)?);
            }
            Ok(steps)
        })(),
    );
    add(
        OpId::CacheIndexerKeys,
        (|| {
            let args = CacheIndexerKeysArgs {
                k: f.t(dt, &[t, l], &[l + r, 1])?,
                cache: f.t(dt, &[nb, 4, l], &[2 * 4 * l, l, 1])?,
                slot_mapping: f.c(DType::I64, &[t])?,
            };
            crate::cache_indexer_keys::plan(&args)
        })(),
    );
    add(
        OpId::ConcatMlaNopeRope,
        (|| {
            let mut steps = Vec::new();
            for rope_heads in [1, n] {
                let args = ConcatMlaNopeRopeArgs {
                    out: f.c(dt, &[t, n, l + r])?,
                    nope: f.t(dt, &[t, n, l], &[l, t * l, 1])?,
                    rope: f.c(dt, &[t, rope_heads, r])?,
                };
                steps.extend(crate::concat_mla_nope_rope::plan(&args)?);
            }
            Ok(steps)
        })(),
    );
    add(
        OpId::MlaDecodeAttention,
        (|| {
            let mut steps = Vec::new();
            for lse in [None, Some(f.c(DType::F32, &[2, n, 1])?)] {
                let args = MlaDecodeAttentionArgs {
                    out: f.c(dt, &[2, 1, n, l])?,
                    lse,
                    query: f.c(dt, &[2, 1, n, l + r])?,
                    cache: f.c(dt, &[nb, bs, l + r])?,
                    block_table: f.c(DType::I32, &[2, 8])?,
                    seq_lens: f.c(DType::I32, &[2])?,
                    scale: 0.5,
                };
                steps.extend(crate::mla_decode_attention::plan(&args)?);
            }
            Ok(steps)
        })(),
    );
    add(
        OpId::PrefillAttention,
        (|| {
            let mut steps = Vec::new();
            for lse in [None, Some(f.c(DType::F32, &[n, t])?)] {
                let args = PrefillAttentionArgs {
                    out: f.c(dt, &[t, n, l])?,
                    lse,
                    query: f.c(dt, &[t, n, l + r])?,
                    k: f.t(dt, &[t, n, l + r], &[n * (2 * l + r), 2 * l + r, 1])?,
                    v: f.t(dt, &[t, n, l], &[n * (2 * l + r), 2 * l + r, 1])?,
                    cu_seqlens_q: f.c(DType::I32, &[2])?,
                    cu_seqlens_k: f.c(DType::I32, &[2])?,
                    max_seqlen_q: t,
                    causal: lse.is_some(),
                    scale: 0.5,
                };
                steps.extend(crate::prefill_attention::plan(&args)?);
            }
            Ok(steps)
        })(),
    );
    // The fp8 ops: both activation forms of both matmuls, QuantizeFp8.
    let (f8, f32t) = (DType::F8E4M3, DType::F32);
    add(
        OpId::MatmulBTFp8,
        (|| {
            let mut steps = Vec::new();
            for fp8_a in [false, true] {
                let args = MatmulBTFp8Args {
                    out: f.c(dt, &[t, 200])?,
                    a: f.c(if fp8_a { f8 } else { dt }, &[t, 384])?,
                    a_scale: if fp8_a { Some(f.t(f32t, &[t, 3], &[1, t])?) } else { None },
                    b: f.c(f8, &[200, 384])?,
                    b_scale: f.c(f32t, &[2, 3])?,
                };
                steps.extend(crate::fp8_matmul::plan_matmul_bt(&args)?);
            }
            Ok(steps)
        })(),
    );
    add(
        OpId::BatchedMatmulFp8,
        (|| {
            let args = BatchedMatmulFp8Args {
                out: f.c(dt, &[n, t, 128])?,
                a: f.c(dt, &[n, t, 512])?,
                a_scale: None,
                b: f.t(f8, &[n, 512, 128], &[256 * 512, 1, 512])?,
                b_scale: f.t(f32t, &[n, 4, 1], &[8, 1, 1])?,
            };
            crate::fp8_matmul::plan_batched(&args)
        })(),
    );
    add(
        OpId::QuantizeFp8,
        (|| {
            let args = QuantizeFp8Args {
                out: f.c(f8, &[t, 200])?,
                scale: f.c(f32t, &[t, 2])?,
                x: f.c(dt, &[t, 200])?,
            };
            crate::fp8_matmul::plan_quantize(&args)
        })(),
    );
    add(
        OpId::MergeAttnStates,
        (|| {
            let mut steps = Vec::new();
            for out_lse in [None, Some(f.c(DType::F32, &[n, t])?)] {
                let args = MergeAttnStatesArgs {
                    out: f.c(dt, &[t, n, l])?,
                    out_lse,
                    prefix: f.c(dt, &[t, n, l])?,
                    prefix_lse: f.c(DType::F32, &[n, t])?,
                    suffix: f.c(dt, &[t, n, l])?,
                    suffix_lse: f.t(DType::F32, &[n, t], &[1, n])?,
                };
                steps.extend(crate::merge_attn_states::plan(&args)?);
            }
            Ok(steps)
        })(),
    );
    Ok(out)
}
