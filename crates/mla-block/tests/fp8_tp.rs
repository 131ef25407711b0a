//! Tensor parallelism and decode context parallelism on an fp8_ds_mla KV cache, on CPU
//! ranks (host communicator): TP = N / DCP = M against the TP = 1 block with the same fp8
//! cache, at the TP tolerances (1e-5 f32, 2e-2 bf16), since both read the same fp8 bytes:
//! the latent rows are computed by the replicated A-projection (the same bits on every
//! rank), and a row's encoding depends on that row alone, so a DCP rank's share holds
//! exactly the rows of the plain cache that it owns.
//!
//! The layer is [`RandomLayerSpec::SMALL_FP8`] (8 heads, DeepSeek-V3's latent and rope
//! widths 512 and 64, which the fp8_ds_mla row needs), plus every golden whose rows fit the
//! fp8 cache (kv_lora_rank 512, qk_rope_head_dim 64), which is also held to transformers'
//! output at the fp8 bound 6e-2.

use std::path::PathBuf;

use mla_block::runner::{RunOptions, Schedule};
use mla_block::tp::dcp::run_schedule_dcp_with_cache;
use mla_block::tp::{
    compare_tp, rel_frobenius, run_schedule_tp_with_cache, tp1_reference, RandomLayerSpec, TpCase, TpGroup,
    TpModel, Transport,
};
use mla_block::KvCacheDtype;
use vt_core::{DType, DeviceType};

const FP8: KvCacheDtype = KvCacheDtype::Fp8DsMla;

fn group(tp: usize, dcp: usize) -> TpGroup {
    vt_backends::init();
    TpGroup::open_with_dcp(DeviceType::Cpu, tp, dcp, Transport::Host).expect("cpu group")
}

/// TP = `tp`, DCP = `dcp` with an fp8 cache against TP = 1 with an fp8 cache (and, for a
/// golden, both against transformers); returns the error vs TP = 1.
fn check(case: &TpCase, tp: usize, dcp: usize, schedule: &str, opts: &RunOptions) -> f64 {
    let case = case.clone().with_kv_cache(FP8);
    let g = group(tp, dcp);
    let sch: Schedule = schedule.parse().expect("schedule");
    let c =
        compare_tp(&case, &g, &sch, opts).unwrap_or_else(|e| panic!("{} tp {tp} dcp {dcp}: {e}", case.name));
    eprintln!(
        "fp8 cache {:28} {:4} tp {tp} dcp {dcp} | {schedule:38} | block {:2} | vs tp1 fp8 {:.3e} (tol {:.0e}) | \
         vs expected tp1 {} tpN {}",
        case.name,
        case.dtype(),
        opts.block_size,
        c.err_vs_tp1,
        case.tp_tolerance(),
        c.tp1_vs_expected.map_or("-".into(), |e| format!("{e:.3e}")),
        c.tpn_vs_expected.map_or("-".into(), |e| format!("{e:.3e}")),
    );
    assert!(c.stats.ranks_identical, "{} tp {tp} dcp {dcp}: ranks differ", case.name);
    assert!(
        c.passed(&case),
        "{} tp {tp} dcp {dcp} {schedule}: vs tp1 {:.3e} (tol {:.0e}), vs expected {:?} (tol {:.0e})",
        case.name,
        c.err_vs_tp1,
        case.tp_tolerance(),
        c.tpn_vs_expected,
        case.golden_tolerance()
    );
    c.err_vs_tp1
}

fn small(dtype: DType) -> TpCase {
    TpCase::random(&RandomLayerSpec::SMALL_FP8, &format!("small_fp8_{dtype}"), dtype, 2, 24, 5).expect("case")
}

#[test]
fn tp_on_an_fp8_cache_matches_tp1_on_it() {
    let all = RunOptions { block_size: 64, chunk_workspace_tokens: None };
    let mixed = RunOptions { block_size: 16, chunk_workspace_tokens: Some(4) };
    for (dtype, tps) in [(DType::BF16, &[2usize, 8][..]), (DType::F32, &[4][..])] {
        let case = small(dtype);
        for &tp in tps {
            check(&case, tp, 1, "prefill:24", &all);
            // prefill, chunked context through a 4-row workspace (GatherMlaCache dequantizes),
            // decode (MlaDecodeAttention reads the fp8 rows)
            check(&case, tp, 1, "prefill:5,decode:3,prefill:9,decode:7", &mixed);
        }
    }
}

#[test]
fn dcp_on_an_fp8_cache_matches_dcp1_on_it() {
    for (dtype, runs) in
        [(DType::BF16, &[(2, 2, 4), (4, 2, 16)][..]), (DType::F32, &[(4, 4, 1), (8, 2, 64)][..])]
    {
        let case = small(dtype);
        for &(tp, dcp, bs) in runs {
            let opts = RunOptions { block_size: bs, chunk_workspace_tokens: None };
            check(&case, tp, dcp, "prefill:9,decode:15", &opts);
        }
    }
}

/// The TP and DCP runs really hold fp8 rows: their output differs from the float cache's
/// (by about e4m3's rounding, well within 6e-2) far more than from TP = 1's fp8 output.
#[test]
fn the_parallel_runs_read_the_fp8_rows_not_a_float_cache() {
    let case = small(DType::F32);
    let sch: Schedule = "prefill:9,decode:15".parse().unwrap();
    let opts = RunOptions { block_size: 4, chunk_workspace_tokens: None };
    let g = group(4, 2);
    let float_tp1 = tp1_reference(&case, g.queues()[0].device(), &sch, &opts).unwrap().to_f64();
    let fp8_tp1 = tp1_reference(&case.clone().with_kv_cache(FP8), g.queues()[0].device(), &sch, &opts)
        .unwrap()
        .to_f64();
    let model = TpModel::load(&g, &case.cfg, &case.weights).unwrap();
    let blocks = model.blocks(None).unwrap();
    let (dcp_out, _) =
        run_schedule_dcp_with_cache(&g, &blocks, &case.hidden, &case.positions, &sch, &opts, FP8).unwrap();
    let g2 = group(2, 1);
    let model2 = TpModel::load(&g2, &case.cfg, &case.weights).unwrap();
    let blocks2 = model2.blocks(None).unwrap();
    let (tp_out, _) = run_schedule_tp_with_cache(
        &g2,
        &blocks2,
        &case.hidden,
        &case.positions,
        &sch,
        &opts,
        FP8,
        &|_, _| {},
    )
    .unwrap();
    let quant = rel_frobenius(&fp8_tp1, &float_tp1);
    eprintln!("fp8 vs float cache at TP = 1: {quant:.3e}");
    assert!(quant > 1e-3 && quant <= 6e-2, "{quant:.3e}");
    for (what, out) in [("tp 4 dcp 2", dcp_out.to_f64()), ("tp 2", tp_out.to_f64())] {
        let vs_fp8 = rel_frobenius(&out, &fp8_tp1);
        let vs_float = rel_frobenius(&out, &float_tp1);
        eprintln!("{what} fp8: vs TP = 1 fp8 {vs_fp8:.3e}, vs TP = 1 float {vs_float:.3e}");
        assert!(vs_fp8 <= 1e-5 && vs_fp8 * 100.0 < vs_float, "{what}: {vs_fp8:.3e} / {vs_float:.3e}");
    }
}

/// A layer whose rows are not 512 + 64 is refused by name under TP and DCP too.
#[test]
fn tp_and_dcp_refuse_an_fp8_cache_for_other_row_widths() {
    let case =
        TpCase::random(&RandomLayerSpec::SMALL, "small", DType::F32, 1, 8, 1).unwrap().with_kv_cache(FP8);
    assert!(!case.fits_fp8_cache());
    let sch: Schedule = "prefill:4,decode:4".parse().unwrap();
    for (tp, dcp) in [(2, 1), (2, 2)] {
        let e = compare_tp(&case, &group(tp, dcp), &sch, &RunOptions::default()).unwrap_err().to_string();
        assert!(e.contains("fp8_ds_mla") && e.contains("576"), "tp {tp} dcp {dcp}: {e}");
    }
}

/// Every golden that an fp8 cache can hold (kv_lora_rank 512, rope 64), at TP 2 and
/// TP = DCP = 2, against TP = 1 with the fp8 cache and against transformers (<= 6e-2).
#[test]
fn tp_and_dcp_on_an_fp8_cache_on_the_goldens_that_fit_it() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("goldens")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("config.json").is_file())
        .collect();
    dirs.sort();
    let mut n = 0;
    for d in dirs {
        let case = TpCase::from_golden_dir(&d).expect("golden");
        if !case.fits_fp8_cache() {
            continue;
        }
        let t = case.t();
        let half = t / 2;
        let bs4 = RunOptions { block_size: 4, chunk_workspace_tokens: None };
        let mixed = RunOptions { block_size: 16, chunk_workspace_tokens: Some(4) };
        for tp in [2, 4] {
            if case.cfg.dims.num_heads % tp as i64 == 0 {
                check(&case, tp, 1, &format!("prefill:5,decode:3,prefill:9,decode:{}", t - 17), &mixed);
                check(&case, tp, tp, &format!("prefill:{half},decode:{}", t - half), &bs4);
            }
        }
        n += 1;
    }
    assert!(n > 0, "no golden under {} has kv_lora_rank 512 and rope 64", dir.display());
}
