//! The decode-step fusions (`VT_FUSE_DECODE_QUERY`: the decode query's rope inside
//! FusedNormRope, written straight into the decode attention's query, and the absorbed BMM
//! writing its latent columns; `VT_FUSE_CACHE_WRITE`: the cache write inside FusedNormRope)
//! against the unfused fused-kv path: bit for bit on the CPU for every combination, through
//! prefill, chunked context, decode and mixed decode + prefill steps; within tolerance on the
//! device under test (`MLA_TEST_DEVICE`).

mod common;

use common::{golden_case, test_queue, Case};
use mla_block::runner::{run_schedule_with_cache, RunOptions, Schedule, SeqPart};
use mla_block::{KvCacheDtype, MlaBlock};
use vt_core::{DType, DeviceType};

/// Prefills with and without cached context, decode steps, and decode tokens sharing a
/// forward with prefill tokens (a two-sequence case of `t` tokens each).
fn mixed_steps(t: i64) -> Vec<Vec<SeqPart>> {
    let p = |seq, tokens| SeqPart { seq, tokens, decode: false };
    let dec = |seq| SeqPart { seq, tokens: 1, decode: true };
    vec![
        vec![p(0, 10)],
        vec![p(1, 5), p(0, 4)],
        vec![dec(0), p(1, 9)],
        vec![dec(1), p(0, 6)],
        vec![dec(0), dec(1)],
        vec![dec(0), dec(1)],
        vec![p(0, t - 23), p(1, t - 17)],
    ]
}

fn with_fusions<'a>(mut b: MlaBlock<'a>, query: bool, cache: bool) -> MlaBlock<'a> {
    b.set_fuse_decode_query(Some(query));
    b.set_fuse_cache_write(Some(cache));
    b
}

const COMBOS: [(bool, bool); 3] = [(true, false), (false, true), (true, true)];

/// On the CPU every combination gives the unfused path's bytes; the overrides are taken.
#[test]
fn decode_step_fusions_are_bit_identical_on_the_cpu() {
    let q = common::cpu_queue();
    for name in common::CASES {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        assert_eq!(case.s(), 2, "{name}: the mixed steps need two sequences");
        let store = case.store(&q);
        let plain = with_fusions(case.block(&store, Some(true)), false, false);
        assert!(!plain.uses_fused_decode_query() && !plain.uses_fused_cache_write());
        let steps = mixed_steps(case.t());
        let opts = RunOptions { block_size: 16, chunk_workspace_tokens: Some(6) };
        let want = case.run_steps(&q, &plain, &steps, &opts);
        let sched = format!("prefill:7,prefill:9,decode:{}", case.t() - 16);
        let (want_sched, _) = case.run(&q, &plain, &sched, &opts);
        for (fq, fc) in COMBOS {
            let fused = with_fusions(case.block(&store, Some(true)), fq, fc);
            assert_eq!((fused.uses_fused_decode_query(), fused.uses_fused_cache_write()), (fq, fc));
            let got = case.run_steps(&q, &fused, &steps, &opts);
            assert!(got.bytes == want.bytes, "{name}: query {fq} cache {fc}: mixed steps differ");
            let (got_sched, _) = case.run(&q, &fused, &sched, &opts);
            assert!(got_sched.bytes == want_sched.bytes, "{name}: query {fq} cache {fc}: schedule differs");
            assert!(case.rel_err(&got) <= case.tolerance(), "{name}: {:.3e}", case.rel_err(&got));
        }
        // The split kv path ignores both (they ride in FusedNormRope).
        let split = with_fusions(case.block(&store, Some(false)), true, true);
        assert!(!split.uses_fused_decode_query() && !split.uses_fused_cache_write());
        eprintln!("{name}: 3 fused combinations = unfused bit for bit (mixed steps and schedule)");
    }
}

/// On the device under test the fused paths agree with the unfused one: bit for bit on the
/// CPU; elsewhere within 1e-5 (f32) / 1e-2 (16-bit) relative Frobenius error, since the
/// absorbed BMM writes another output layout (cuBLAS may pick another algorithm).
#[test]
fn decode_step_fusions_agree_on_the_test_device() {
    let q = test_queue();
    for name in common::CASES {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        let store = case.store(&q);
        let plain = with_fusions(case.block(&store, Some(true)), false, false);
        if !plain.uses_fused_norm_rope() {
            eprintln!("SKIP: FusedNormRope is not registered on {}", q.device());
            return;
        }
        let steps = mixed_steps(case.t());
        let opts = RunOptions { block_size: 16, chunk_workspace_tokens: Some(6) };
        let want = case.run_steps(&q, &plain, &steps, &opts);
        for (fq, fc) in COMBOS {
            let fused = with_fusions(case.block(&store, Some(true)), fq, fc);
            let got = case.run_steps(&q, &fused, &steps, &opts);
            let diff = common::rel_frobenius(&got.to_f64(), &want.to_f64());
            let golden = case.rel_err(&got);
            eprintln!(
                "{name} on {}: query {fq} cache {fc}: vs unfused {diff:.3e} (bit-identical: {}), vs \
                 transformers {golden:.3e}",
                q.device(),
                got.bytes == want.bytes
            );
            if q.device().kind == DeviceType::Cpu {
                assert!(got.bytes == want.bytes, "{name}: query {fq} cache {fc} differ on the CPU");
            } else {
                let tol = if case.dtype() == DType::F32 { 1e-5 } else { 1e-2 };
                assert!(diff <= tol, "{name}: query {fq} cache {fc}: {diff:.3e} > {tol:e}");
            }
            assert!(golden <= case.tolerance(), "{name}: query {fq} cache {fc}: {golden:.3e}");
        }
    }
}

/// The V3-width goldens (L 512, R 64) over a float and an fp8_ds_mla cache (where the cache
/// write stays a ConcatAndCacheMla launch) and the DeepSeek-V3.2 goldens (the cache write
/// fused into the latent part of their rows; the query fusion not taken): every combination
/// gives the unfused bytes on the device under test when it is the CPU, within the GPU
/// bound elsewhere.
#[test]
fn decode_step_fusions_on_fp8_caches_and_sparse_blocks() {
    let q = test_queue();
    let cases = [
        ("latent512_yarn_bf16", KvCacheDtype::Auto),
        ("latent512_yarn_bf16", KvCacheDtype::Fp8DsMla),
        ("latent512_qproj_f32", KvCacheDtype::Fp8DsMla),
        ("v32_sparse_f32", KvCacheDtype::Auto),
        ("v32_sparse_mscale_bf16", KvCacheDtype::Auto),
    ];
    for (name, cache) in cases {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        let store = case.store(&q);
        let t = case.t();
        let sch: Schedule = format!("prefill:7,prefill:9,decode:{}", t - 16).parse().unwrap();
        let opts = RunOptions { block_size: 16, chunk_workspace_tokens: Some(6) };
        let run = |b: &MlaBlock<'_>| {
            run_schedule_with_cache(&q, b, &case.hidden, &case.positions, &sch, &opts, cache, &|_, _| {})
                .unwrap_or_else(|e| panic!("{name} ({}): {e}", cache.name()))
                .0
        };
        let plain = with_fusions(case.block(&store, Some(true)), false, false);
        if !plain.uses_fused_norm_rope() {
            eprintln!("SKIP: FusedNormRope is not registered on {}", q.device());
            return;
        }
        let want = run(&plain);
        for (fq, fc) in COMBOS {
            let fused = with_fusions(case.block(&store, Some(true)), fq, fc);
            if case.cfg.dims.is_sparse() {
                assert!(!fused.uses_fused_decode_query(), "{name}: a sparse block takes no fused query");
            }
            let got = run(&fused);
            let diff = common::rel_frobenius(&got.to_f64(), &want.to_f64());
            eprintln!(
                "{name} ({} cache) on {}: query {fq} cache {fc}: vs unfused {diff:.3e} (bit-identical: {})",
                cache.name(),
                q.device(),
                got.bytes == want.bytes
            );
            if q.device().kind == DeviceType::Cpu {
                assert!(got.bytes == want.bytes, "{name} ({}): query {fq} cache {fc} differ", cache.name());
            } else {
                let tol = if case.dtype() == DType::F32 { 1e-5 } else { 1e-2 };
                assert!(
                    diff <= tol,
                    "{name} ({}): query {fq} cache {fc}: {diff:.3e} > {tol:e}",
                    cache.name()
                );
            }
        }
    }
}
