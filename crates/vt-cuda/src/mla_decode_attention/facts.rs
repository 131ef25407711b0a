//! The facts the host plans MlaDecodeAttention with, checked against the kernel headers
//! without a GPU: `kernels-cuda/mla_decode_attention.cu` is compiled by NVRTC (to PTX for
//! compute_90a, so the wgmma kernels are in) with `VT_MLA_DECODE_FACTS` defined, which adds
//! constant tables the PTX carries as byte arrays:
//! - `mla_decode_facts`: sizeof and alignof `mla::Params`, BN, D and Dv of the tensor-core
//!   kernels, the generic kernel's shared bytes per D and per Dv, combine columns per CTA;
//! - `{entry}_facts` beside every extern "C" kernel (`MLA_FACTS` in params.cuh): threads,
//!   query rows per CTA, dynamic shared memory, KV ring slots;
//! - `mla_decode_params_facts`, added by this test: offset and size of every field of
//!   [`Params`] (listed by an exhaustive pattern, so a field cannot be left out) in the
//!   device's `mla::Params`, which must have no other member (a structured binding of
//!   exactly that many names compiles).
//!
//! Every planned launch of every kernel (as `ptx_check.rs` samples them) is then compared
//! with its entry's table, and every entry must have one. Needs libnvrtc and the CUDA
//! headers (`.ci/kernels-cuda-deps`); skipped with a note otherwise.

use std::collections::{BTreeMap, BTreeSet};

use vt_core::{contiguous_strides, DType, MlaDecodeAttentionArgs, Tensor};

use super::{
    choose, combine, generic, launches, mma_sm80, wgmma_sm90, ChoiceFlags, DecodeOptions, DeviceInfo, Kernel,
    Params, FAST_D, FAST_DV, SRC, TILE_TOKENS,
};
use crate::nvrtc::{self, Target};

/// `(rust name, C++ name, host offset, host size)` of every field of [`Params`].
macro_rules! fields {
    ($($rust:ident $(= $cpp:ident)?),* $(,)?) => {{
        let p = Params::default();
        // Exhaustive: a field of Params missing from this list is a compile error.
        let Params { $($rust: _),* } = p;
        vec![$((
            stringify!($rust),
            fields!(@cpp $rust $($cpp)?),
            std::mem::offset_of!(Params, $rust) as i64,
            std::mem::size_of_val(&p.$rust) as i64,
        )),*]
    }};
    (@cpp $rust:ident) => { stringify!($rust) };
    (@cpp $rust:ident $cpp:ident) => { stringify!($cpp) };
}

fn param_fields() -> Vec<(&'static str, &'static str, i64, i64)> {
    fields!(
        q,
        out,
        lse,
        cache,
        block_table,
        seq_lens,
        part_o,
        part_lse,
        seq_info,
        q_sb,
        q_ss,
        q_sh,
        o_sb,
        o_ss,
        o_sh,
        l_sb,
        l_sh,
        l_ss,
        c_sblk,
        c_srow,
        bt_sb,
        bt_sm,
        sl_s,
        b = B,
        s_q,
        n = N,
        d,
        dv,
        nb = NB,
        bs = BS,
        mb = MB,
        m_total,
        num_parts,
        min_tiles,
        combine_wpr,
        scale_log2,
    )
}

/// The `.global .align 8 .b8 NAME[N] = {...}` arrays of a PTX text, as little-endian i64s
/// (NVRTC leaves trailing zero bytes out of the initializer).
pub(crate) fn tables(ptx: &str) -> BTreeMap<String, Vec<i64>> {
    let mut out = BTreeMap::new();
    for line in ptx.lines() {
        let Some(rest) = line.trim().strip_prefix(".global .align 8 .b8 ") else { continue };
        let (decl, init) = rest.split_once(" = {").unwrap_or((rest.trim_end_matches(';'), "}"));
        let Some((name, len)) = decl.split_once('[') else { continue };
        let Ok(len) = len.trim_end_matches(']').parse::<usize>() else { continue };
        let mut bytes: Vec<u8> = init
            .trim_end_matches(';')
            .trim_end_matches('}')
            .split(',')
            .filter(|b| !b.trim().is_empty())
            .map(|b| b.trim().parse().expect("a byte"))
            .collect();
        bytes.resize(len, 0);
        let words = bytes.chunks(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        out.insert(name.to_string(), words);
    }
    out
}

/// The `.entry` names of a PTX text.
fn entry_names(ptx: &str) -> BTreeSet<String> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|r| r.split('(').next().unwrap_or_default().trim().to_string())
        .collect()
}

/// The kernel file with the facts switched on and the field table of [`Params`] appended,
/// compiled to compute_90a PTX.
fn facts_ptx() -> String {
    let (code, headers) = crate::kernels::texts(&SRC).expect("kernel text");
    let mut src = format!("#define VT_MLA_DECODE_FACTS 1\n{code}\n");
    src.push_str("#define VT_OFF(F) (long long)((char*)&(((mla::Params*)0)->F) - (char*)0)\n");
    src.push_str("#define VT_SIZE(F) (long long)sizeof(((mla::Params*)0)->F)\n");
    let f = param_fields();
    let items: Vec<String> = f.iter().map(|(_, c, _, _)| format!("VT_OFF({c}), VT_SIZE({c})")).collect();
    src.push_str(&format!(
        "extern \"C\" __device__ const long long mla_decode_params_facts[{}] = {{{}}};\n",
        2 * f.len(),
        items.join(", ")
    ));
    // A structured binding names exactly the struct's members: one more in mla::Params
    // than here (even one hidden in its tail padding) does not compile.
    let names: Vec<String> = (0..f.len()).map(|i| format!("f{i}")).collect();
    src.push_str(&format!(
        "__device__ void vt_params_has_{}_fields(const mla::Params& p) {{ [[maybe_unused]] const auto& [{}] = p; }}\n",
        f.len(),
        names.join(", ")
    ));
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let image = nvrtc::compile("mla_decode_attention_facts.cu", &src, &headers, Target::PtxArchSpecific(90))
        .expect("NVRTC compiles the facts build");
    String::from_utf8_lossy(&image.bytes).into_owned()
}

/// Every kernel choice the PTX check samples: (kernel, heads, TMA flag, query dtype, cache
/// dtype, D, Dv), at B = 2, s_q = 1, block size 64, then [`paged_samples`].
fn samples() -> Vec<Sample> {
    let mut out = Vec::new();
    for dt in [DType::F32, DType::F16, DType::BF16] {
        out.push((Kernel::Generic, 2, false, dt, dt, FAST_D, FAST_DV));
        // Other head dims: the generic kernel's shared memory follows D and Dv.
        out.push((Kernel::Generic, 3, false, dt, dt, 72, 40));
        out.push((Kernel::Generic, 16, false, dt, DType::Fp8DsMla, FAST_D, FAST_DV));
        if dt == DType::F32 {
            continue;
        }
        // The mma kernels over an fp8_ds_mla cache (no small ring at 64 rows).
        for heads in [8, 32, 64, 128] {
            out.push((Kernel::Mma, heads, false, dt, DType::Fp8DsMla, FAST_D, FAST_DV));
            if heads <= 32 {
                out.push((Kernel::MmaSmall, heads, false, dt, DType::Fp8DsMla, FAST_D, FAST_DV));
            }
        }
        for heads in [8, 32, 64, 128] {
            out.extend([
                (Kernel::Mma, heads, false, dt, dt, FAST_D, FAST_DV),
                (Kernel::MmaSmall, heads, false, dt, dt, FAST_D, FAST_DV),
            ]);
        }
        for heads in [64, 128] {
            out.extend([
                (Kernel::Wgmma, heads, false, dt, dt, FAST_D, FAST_DV),
                (Kernel::Wgmma, heads, true, dt, dt, FAST_D, FAST_DV),
                (Kernel::WgmmaSeesaw, heads, true, dt, dt, FAST_D, FAST_DV),
                (Kernel::Wgmma3, heads, true, dt, dt, FAST_D, FAST_DV),
                // Without the TMA: the gather form.
                (Kernel::Wgmma3, heads, false, dt, dt, FAST_D, FAST_DV),
            ]);
        }
        // The three-warpgroup kernel's CTA pairs: two row blocks at 128 heads.
        out.push((Kernel::Wgmma3Pair, 128, true, dt, dt, FAST_D, FAST_DV));
        for heads in [8, 32, 64] {
            out.extend([
                (Kernel::WgmmaNarrow, heads, false, dt, dt, FAST_D, FAST_DV),
                (Kernel::WgmmaNarrow, heads, true, dt, dt, FAST_D, FAST_DV),
            ]);
        }
        for heads in [8, 16, 32] {
            out.push((Kernel::WgmmaNarrow, heads, false, dt, DType::Fp8DsMla, FAST_D, FAST_DV));
            out.push((Kernel::WgmmaNarrow, heads, true, dt, DType::Fp8DsMla, FAST_D, FAST_DV));
        }
        for heads in [64, 128] {
            out.push((Kernel::Wgmma, heads, false, dt, DType::Fp8DsMla, FAST_D, FAST_DV));
            // The CTA pairs: two row blocks at 128 heads.
            if heads == 128 {
                out.push((Kernel::WgmmaFp8Pair, heads, false, dt, DType::Fp8DsMla, FAST_D, FAST_DV));
            }
            // The raw-ring kernel: bf16 queries only.
            if dt == DType::BF16 {
                out.push((Kernel::WgmmaFp8Raw, heads, true, dt, DType::Fp8DsMla, FAST_D, FAST_DV));
                // Without the TMA: its gather form.
                out.push((Kernel::WgmmaFp8Raw, heads, false, dt, DType::Fp8DsMla, FAST_D, FAST_DV));
            }
        }
    }
    out
}

/// A sample of [`samples`]: (kernel, heads, TMA flag, query dtype, cache dtype, D, Dv).
type Sample = (Kernel, i64, bool, DType, DType, i64, i64);

/// The choices only a cache of 16- or 32-row pages takes (the paged TMA forms of the
/// three-warpgroup kernel and of its pairs), with the block size of each.
fn paged_samples() -> Vec<(Sample, i64)> {
    let mut out = Vec::new();
    for dt in [DType::F16, DType::BF16] {
        out.push(((Kernel::Wgmma3Paged, 64, true, dt, dt, FAST_D, FAST_DV), 16));
        out.push(((Kernel::Wgmma3Paged, 128, true, dt, dt, FAST_D, FAST_DV), 32));
        out.push(((Kernel::Wgmma3Pair, 128, true, dt, dt, FAST_D, FAST_DV), 16));
    }
    out
}

#[test]
fn host_planning_facts_match_the_kernel_headers() {
    if !crate::test_util::nvrtc_ready() {
        return;
    }
    let ptx = facts_ptx();
    let t = tables(&ptx);
    let mut problems = Vec::new();
    let mut check = |what: String, host: i64, device: i64| {
        if host != device {
            problems.push(format!("{what}: host {host}, device {device}"));
        }
    };

    // The module's table.
    let m = &t["mla_decode_facts"];
    check("sizeof(mla::Params)".into(), std::mem::size_of::<Params>() as i64, m[0]);
    check("alignof(mla::Params)".into(), std::mem::align_of::<Params>() as i64, m[1]);
    check("KV tokens per tile (mla::BN)".into(), TILE_TOKENS, m[2]);
    check("tensor-core D (mla::FD)".into(), FAST_D, m[3]);
    check("tensor-core Dv (mla::FDV)".into(), FAST_DV, m[4]);
    check("generic shared bytes per D".into(), generic::smem_bytes(1, 0), m[5]);
    check("generic shared bytes per Dv".into(), generic::smem_bytes(0, 1), m[6]);
    check("combine columns per CTA".into(), combine::COLS, m[7]);
    check("combine CTAs an SM holds (MLA_COMBINE_MIN_CTAS)".into(), combine::CTAS_PER_SM, m[8]);

    // Params, field by field.
    let pf = &t["mla_decode_params_facts"];
    for (i, (rust, cpp, off, size)) in param_fields().into_iter().enumerate() {
        check(format!("offset of Params::{rust} (mla::Params::{cpp})"), off, pf[2 * i]);
        check(format!("size of Params::{rust} (mla::Params::{cpp})"), size, pf[2 * i + 1]);
    }

    // Every entry point has its facts.
    let entries = entry_names(&ptx);
    for e in &entries {
        if !t.contains_key(&format!("{e}_facts")) {
            check(format!("{e}: no MLA_FACTS beside the entry (tables of 1)"), 1, 0);
        }
    }

    // Every planned launch against its entry's facts.
    let info = DeviceInfo { sm: 90, sms: 132, wgmma: true, smem_optin: super::MAX_SMEM, pair_clusters: 66 };
    let mem = vec![0u128; 1 << 18];
    let view = |dt: DType, shape: &[i64]| -> Tensor<'_> {
        let s = contiguous_strides(shape);
        crate::test_util::host_view(&mem, dt, 0, shape, &s[..shape.len()])
    };
    let mut launched = BTreeSet::new();
    let all = samples().into_iter().map(|s| (s, 64)).chain(paged_samples());
    // Every other sample with the combine's strided form (VT_MLA_COMBINE_STRIDE).
    for (i, ((kernel, heads, tma, dt, cache_dt, d, dv), bs)) in all.enumerate() {
        let (b, nb) = (2i64, 16i64);
        let stride = i % 2 == 1;
        let cache_w = if cache_dt == DType::Fp8DsMla { 656 } else { d };
        let a = MlaDecodeAttentionArgs {
            out: view(dt, &[b, 1, heads, dv]),
            lse: Some(view(DType::F32, &[b, heads, 1])),
            query: view(dt, &[b, 1, heads, d]),
            cache: view(cache_dt, &[nb, bs, cache_w]),
            block_table: view(DType::I32, &[b, 8]),
            seq_lens: view(DType::I32, &[b]),
            scale: 0.5,
        };
        let c = choose(
            &a,
            &info,
            &DecodeOptions { kernel, ..DecodeOptions::default() },
            ChoiceFlags { combine_stride: stride, ..ChoiceFlags::new(tma, true) },
        )
        .expect("a plan");
        // The strided samples' combine on one SM (a wave of 3 CTAs), so that it strides wherever
        // a sequence has two or more row groups and its kernels are launched here.
        let linfo = if stride { DeviceInfo { sms: 1, ..info } } else { info };
        let ls = launches(&a, &c, &linfo, (1 << 40, 2 << 40, 3 << 40)).expect("launches");
        let m_total = heads;
        let (main, comb) = (&ls[0], &ls[1]);
        let what = format!("{} ({kernel:?}, {heads} heads, D {d}, Dv {dv})", main.symbol());
        launched.insert(main.symbol());
        launched.insert(comb.symbol());
        let Some(f) = t.get(&format!("{}_facts", main.symbol())) else {
            check(format!("{what}: no facts table"), 1, 0);
            continue;
        };
        check(format!("{what}: threads"), main.block as i64, f[0]);
        check(format!("{what}: rows per CTA"), c.plan.rows_per_cta as i64, f[1]);
        check(format!("{what}: grid.y"), main.grid.1 as i64, (m_total + f[1] - 1) / f[1]);
        // Per family, exhaustively: a new Kernel variant must say here what its facts are.
        let (smem, slots) = match kernel {
            Kernel::Generic | Kernel::Auto => {
                // The generic kernel's shared memory follows D and Dv.
                check(
                    format!("{what}: shared memory at D 576, Dv 512"),
                    m[5] * FAST_D + m[6] * FAST_DV,
                    f[2],
                );
                (m[5] * d + m[6] * dv, 0)
            }
            Kernel::Mma | Kernel::MmaSmall => {
                let (mt, small) = (c.plan.rows_per_cta, kernel == Kernel::MmaSmall);
                if cache_dt == DType::Fp8DsMla {
                    let hs = mma_sm80::fp8_slots(mt, small).expect("an fp8 ring");
                    (mma_sm80::fp8_smem(mt, hs) as i64, hs as i64)
                } else {
                    (mma_sm80::smem(mt, mma_sm80::slots(mt, small)) as i64, mma_sm80::slots(mt, small) as i64)
                }
            }
            Kernel::Wgmma | Kernel::WgmmaSeesaw => (wgmma_sm90::SMEM as i64, wgmma_sm90::STAGES as i64),
            // Clusters along grid.y: whole pairs of row blocks.
            Kernel::WgmmaFp8Pair => {
                check(format!("{what}: grid.y a multiple of the cluster"), main.grid.1 as i64 % 2, 0);
                (wgmma_sm90::SMEM as i64, wgmma_sm90::STAGES as i64)
            }
            Kernel::Wgmma3Pair => {
                check(format!("{what}: grid.y a multiple of the cluster"), main.grid.1 as i64 % 2, 0);
                (wgmma_sm90::w3_smem(false) as i64, wgmma_sm90::W3_SLOTS as i64)
            }
            Kernel::Wgmma3Paged => (wgmma_sm90::w3_smem(false) as i64, wgmma_sm90::W3_SLOTS as i64),
            // The gather forms (`_cp_`) add each slot's flags.
            Kernel::Wgmma3 | Kernel::WgmmaFp8Raw => {
                let (fp8, cp) = (kernel == Kernel::WgmmaFp8Raw, main.symbol().contains("_cp_"));
                let smem = if cp { wgmma_sm90::w3_cp_smem(fp8) } else { wgmma_sm90::w3_smem(fp8) };
                let slots = if cp { wgmma_sm90::W3_SLOTS } else { wgmma_sm90::w3_slots(fp8) };
                (smem as i64, slots as i64)
            }
            Kernel::WgmmaNarrow if cache_dt == DType::Fp8DsMla => {
                let mt = c.plan.rows_per_cta;
                (wgmma_sm90::narrow_fp8_smem(mt) as i64, wgmma_sm90::narrow_fp8_raws(mt) as i64)
            }
            Kernel::WgmmaNarrow => {
                (wgmma_sm90::narrow_smem(c.plan.rows_per_cta) as i64, wgmma_sm90::STAGES as i64)
            }
        };
        check(format!("{what}: shared memory (host)"), main.smem as i64, smem);
        if !matches!(kernel, Kernel::Generic | Kernel::Auto) {
            check(format!("{what}: shared memory (device)"), smem, f[2]);
        }
        check(format!("{what}: KV slots"), slots, f[3]);
        let what = format!("{} (after {})", comb.symbol(), main.symbol());
        let Some(f) = t.get(&format!("{}_facts", comb.symbol())) else {
            check(format!("{what}: no facts table"), 1, 0);
            continue;
        };
        check(format!("{what}: threads"), comb.block as i64, f[0]);
        check(format!("{what}: warps (rows per CTA at a warp per row)"), combine::WARPS, f[1]);
        let rows = f[1] / c.combine_wpr;
        let (groups, z) = ((m_total + rows - 1) / rows, (dv + m[7] - 1) / m[7]);
        let (name, y) = combine::form(stride, b, groups, z, linfo.sms);
        check(format!("{what}: grid.y"), comb.grid.1 as i64, y);
        check(
            format!("{what}: the strided form"),
            comb.symbol().contains("_strided_") as i64,
            name.contains("_strided") as i64,
        );
        check(format!("{what}: grid.z"), comb.grid.2 as i64, (dv + m[7] - 1) / m[7]);
    }
    for e in entries.iter().filter(|e| !launched.contains(*e)) {
        check(format!("{e}: launched by no sample here"), 1, 0);
    }
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
    println!("{} entries' facts checked, {} Params fields", entries.len(), param_fields().len());
}

#[test]
fn byte_tables_parse() {
    let ptx = ".global .align 8 .b8 a_facts[16] = {0, 1, 0, 0, 0, 0, 0, 0, 8};\n\
               .global .align 8 .b8 z_facts[8];\n\
               .global .align 4 .u32 other = 3;";
    let t = tables(ptx);
    assert_eq!(t["a_facts"], vec![256, 8]);
    assert_eq!(t["z_facts"], vec![0]);
    assert_eq!(t.len(), 2);
}
