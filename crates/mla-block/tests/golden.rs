//! The block against transformers' `DeepseekV3Attention` and `DeepseekV32Attention`
//! (tests/golden, see its README):
//! every golden under every kind of schedule and block sizes 1, 16 and 64, on the CPU
//! backend. Tolerances (relative Frobenius error vs `expected`): f32 1e-4, bf16 2e-2.

mod common;

use common::{cpu_queue, golden_case, golden_schedules, test_queue, Case};
use mla_block::runner::{RunOptions, SeqPart};
use vt_core::{op_registered, DeviceType, OpId};

fn check_case(name: &str) {
    let Some(dir) = golden_case(name) else { return };
    let case = Case::load(&dir);
    let q = test_queue();
    let store = case.store(&q);
    let block = case.block(&store, None);
    let mut worst: f64 = 0.0;
    for (schedule, block_size, ws) in golden_schedules(case.t()) {
        let opts = RunOptions { block_size, chunk_workspace_tokens: ws };
        let (out, stats) = case.run(&q, &block, &schedule, &opts);
        let err = case.rel_err(&out);
        eprintln!(
            "golden {name:26} {:4} {} | {schedule:42} | block {block_size:2} | ws {:>4} | {:3} forwards, {:3} chunks | rel err {err:.3e}",
            case.dtype(),
            q.device(),
            ws.map_or("all".into(), |w| w.to_string()),
            stats.forwards,
            stats.context_chunks
        );
        assert!(
            err <= case.tolerance(),
            "{name} under {schedule} (block {block_size}): rel err {err:.3e} > {:.0e}",
            case.tolerance()
        );
        if schedule.contains("prefill:16,prefill:8") {
            assert!(stats.context_chunks >= 1, "chunked prefill must go through the chunked-context path");
            if ws == Some(6) {
                assert!(
                    stats.context_chunks >= 4,
                    "a 6-row workspace must split the context into several chunks"
                );
            }
        }
        worst = worst.max(err);
    }
    eprintln!("golden {name}: worst rel err {worst:.3e} (tolerance {:.0e})", case.tolerance());
}

#[test]
fn golden_qlora_yarn_interleave_f32_matches_transformers_under_every_schedule() {
    check_case("qlora_yarn_interleave_f32");
}

#[test]
fn golden_qlora_yarn_neox_bf16_matches_transformers_under_every_schedule() {
    check_case("qlora_yarn_neox_bf16");
}

#[test]
fn golden_v2lite_yarn_f32_matches_transformers_under_every_schedule() {
    check_case("v2lite_yarn_f32");
}

#[test]
fn golden_v2lite_noyarn_bf16_matches_transformers_under_every_schedule() {
    check_case("v2lite_noyarn_bf16");
}

#[test]
fn golden_qlora_yarn_mscale_f32_matches_transformers_under_every_schedule() {
    check_case("qlora_yarn_mscale_f32");
}

/// DeepSeek-V3.2 (transformers' `DeepseekV32Attention`, issue 19): the indexer's top-k
/// selection and the sparse absorbed attention of every token, prefill included, under every
/// schedule (the indexer keys and latents are written as the tokens arrive, so chunked
/// prefill and decode select over what is cached, as a whole-sequence prefill does).
#[test]
fn golden_v32_sparse_f32_matches_transformers_under_every_schedule() {
    check_case("v32_sparse_f32");
}

#[test]
fn golden_v32_sparse_mscale_bf16_matches_transformers_under_every_schedule() {
    check_case("v32_sparse_mscale_bf16");
}

/// A long V3.2 prefill runs its absorbed sparse attention in chunks of tokens: with chunks of
/// 7 (and 1) tokens the goldens still match transformers under every schedule, with the same
/// bits as one chunk on the CPU.
#[test]
fn v32_sparse_attention_in_token_chunks_matches_the_goldens() {
    let q = test_queue();
    for name in ["v32_sparse_f32", "v32_sparse_mscale_bf16"] {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        let store = case.store(&q);
        let whole = case.block(&store, None);
        for rows in [7, 1] {
            let mut chunked = case.block(&store, None);
            chunked.set_sparse_rows(rows).unwrap();
            for (schedule, block_size, ws) in golden_schedules(case.t()) {
                let opts = RunOptions { block_size, chunk_workspace_tokens: ws };
                let (a, _) = case.run(&q, &chunked, &schedule, &opts);
                let err = case.rel_err(&a);
                assert!(err <= case.tolerance(), "{name} rows {rows} {schedule}: {err:.3e}");
                if q.device().kind == DeviceType::Cpu {
                    let (b, _) = case.run(&q, &whole, &schedule, &opts);
                    assert!(a.bytes == b.bytes, "{name} rows {rows} {schedule}: chunked differs from whole");
                }
            }
        }
        assert!(whole.clone().set_sparse_rows(0).is_err());
    }
}

/// The V3.2 goldens pin the selection: the same block with a top-k of T (every visible
/// token: dense attention) misses transformers' output by far more than the tolerance.
#[test]
fn v32_goldens_need_the_selection() {
    let q = test_queue();
    for name in ["v32_sparse_f32", "v32_sparse_mscale_bf16"] {
        let Some(dir) = golden_case(name) else { return };
        let mut case = Case::load(&dir);
        let mut ix = case.cfg.dims.indexer.expect("a V3.2 golden has an indexer");
        assert!(case.t() > ix.topk, "{name}: T must exceed index_topk for the selection to matter");
        ix.topk = case.t();
        case.cfg.dims = case.cfg.dims.with_indexer(ix).unwrap();
        let store = case.store(&q);
        let block = case.block(&store, None);
        let err =
            case.rel_err(&case.run(&q, &block, &format!("prefill:{}", case.t()), &RunOptions::default()).0);
        eprintln!("{name} with top-k = T (dense): rel err {err:.3e}");
        assert!(
            err > 20.0 * case.tolerance(),
            "{name}: dense attention is within {err:.3e} of the sparse golden"
        );
    }
}

/// The fused kv path (one merged A-projection GEMM + FusedNormRope) and the split path
/// (two GEMMs + RmsNorm + RopeFromCache) give the same bits on the CPU, for both q
/// branches, both rotation styles and both dtypes, through prefill, chunked context and
/// decode.
#[test]
fn fused_and_split_paths_are_bit_identical_on_cpu() {
    let q = cpu_queue();
    assert!(
        op_registered(OpId::FusedNormRope, DeviceType::Cpu),
        "the fused path needs FusedNormRope on the CPU"
    );
    for name in common::CASES {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        let store = case.store(&q);
        let fused = case.block(&store, Some(true));
        let split = case.block(&store, Some(false));
        assert!(fused.uses_fused_norm_rope() && !split.uses_fused_norm_rope());
        let t = case.t();
        let schedule = format!("prefill:7,prefill:9,decode:{}", t - 16);
        let opts = RunOptions { block_size: 16, chunk_workspace_tokens: Some(6) };
        let (a, _) = case.run(&q, &fused, &schedule, &opts);
        let (b, _) = case.run(&q, &split, &schedule, &opts);
        assert!(a.bytes == b.bytes, "{name}: fused and split outputs differ");
        assert!(case.rel_err(&a) <= case.tolerance(), "{name}: {:.3e}", case.rel_err(&a));
    }
}

/// On the device under test (`MLA_TEST_DEVICE`, default the CPU) the fused and split paths
/// agree: bit for bit on the CPU, within 1e-5 (f32) / 1e-2 (16-bit) relative Frobenius error
/// elsewhere, where the merged A-projection GEMM may pick another cuBLAS algorithm than the
/// two narrower ones.
#[test]
fn fused_and_split_paths_agree_on_the_test_device() {
    let q = test_queue();
    if !op_registered(OpId::FusedNormRope, q.device().kind) {
        eprintln!("SKIP: FusedNormRope is not registered on {}", q.device());
        return;
    }
    for name in common::CASES {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        let store = case.store(&q);
        let fused = case.block(&store, Some(true));
        let split = case.block(&store, Some(false));
        let t = case.t();
        let schedule = format!("prefill:7,prefill:9,decode:{}", t - 16);
        let opts = RunOptions { block_size: 16, chunk_workspace_tokens: Some(6) };
        let (a, _) = case.run(&q, &fused, &schedule, &opts);
        let (b, _) = case.run(&q, &split, &schedule, &opts);
        let diff = common::rel_frobenius(&a.to_f64(), &b.to_f64());
        eprintln!(
            "fused vs split {name} on {}: rel err {diff:.3e}, bit-identical: {}",
            q.device(),
            a.bytes == b.bytes
        );
        if q.device().kind == DeviceType::Cpu {
            assert!(a.bytes == b.bytes, "{name}: fused and split outputs differ on the CPU");
        } else {
            let tol = if case.dtype() == vt_core::DType::F32 { 1e-5 } else { 1e-2 };
            assert!(diff <= tol, "{name}: fused vs split differ by {diff:.3e} > {tol:e}");
        }
    }
}

/// Decode and prefill tokens in the same forward (decode tokens first; prefill sequences
/// with and without cached context) give every token its full-causal output.
#[test]
fn mixed_decode_and_prefill_step_matches_the_full_causal_result() {
    let q = test_queue();
    for name in ["qlora_yarn_interleave_f32", "v2lite_yarn_f32"] {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        assert_eq!(case.s(), 2);
        let t = case.t();
        let store = case.store(&q);
        let block = case.block(&store, None);
        let p = |seq, tokens| SeqPart { seq, tokens, decode: false };
        let dec = |seq| SeqPart { seq, tokens: 1, decode: true };
        let steps = vec![
            vec![p(0, 10)],
            // two prefills in one forward: seq 1 without context, seq 0 over 10 cached tokens
            vec![p(1, 5), p(0, 4)],
            // seq 0 decodes while seq 1 prefills over its 5 cached tokens
            vec![dec(0), p(1, 9)],
            // seq 1 decodes while seq 0 prefills over its 15 cached tokens
            vec![dec(1), p(0, 6)],
            vec![dec(0), dec(1)],
            vec![p(0, t - 22), p(1, t - 16)],
        ];
        for (block_size, ws) in [(16, None), (1, Some(5))] {
            let out =
                case.run_steps(&q, &block, &steps, &RunOptions { block_size, chunk_workspace_tokens: ws });
            let err = case.rel_err(&out);
            eprintln!("mixed {name}: block {block_size} ws {ws:?}: rel err {err:.3e}");
            assert!(err <= case.tolerance(), "{name} mixed steps (block {block_size}): rel err {err:.3e}");
        }
    }
}

/// After the first forward of each kind, further decode forwards allocate no device
/// memory (the workspace and the metadata buffers are reused).
#[test]
fn decode_steps_do_not_allocate_after_warm_up() {
    let Some(dir) = golden_case("v2lite_yarn_f32") else { return };
    let case = Case::load(&dir);
    let q = test_queue();
    let store = case.store(&q);
    let block = case.block(&store, None);
    let (_, stats) = case.run(
        &q,
        &block,
        "prefill:8,decode:32",
        &RunOptions { block_size: 4, chunk_workspace_tokens: None },
    );
    let decodes: Vec<usize> = stats.allocations.iter().filter(|(d, _)| *d).map(|(_, n)| *n).collect();
    assert_eq!(decodes.len(), 32);
    assert!(decodes.iter().all(|&n| n == decodes[0]), "allocations grew during decode: {decodes:?}");
}

/// transformers' interleaved rope (permute q_pe/k_pe evens-then-odds, then neox) is
/// reproduced by the ops' GPT-J rotation (pair (2i, 2i+1) with frequency i): the interleaved
/// goldens pass with it, and fail by a wide margin with neox pairing.
#[test]
fn interleaved_goldens_match_gptj_pairing_and_not_neox() {
    let q = test_queue();
    for name in ["qlora_yarn_interleave_f32", "v2lite_yarn_f32", "v2lite_noyarn_bf16"] {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        assert!(!case.cfg.rope.is_neox, "{name} is an interleaved case");
        let store = case.store(&q);
        let schedule = format!("prefill:{}", case.t());
        let gptj = mla_block::MlaBlock::new(case.cfg.dims, store.views(), false).unwrap();
        let neox = mla_block::MlaBlock::new(case.cfg.dims, store.views(), true).unwrap();
        let e_gptj = case.rel_err(&case.run(&q, &gptj, &schedule, &RunOptions::default()).0);
        let e_neox = case.rel_err(&case.run(&q, &neox, &schedule, &RunOptions::default()).0);
        eprintln!("{name}: GPT-J pairing rel err {e_gptj:.3e}, neox pairing {e_neox:.3e}");
        assert!(e_gptj <= case.tolerance() && e_neox > 0.05, "{name}: gptj {e_gptj:.3e} neox {e_neox:.3e}");
    }
}

/// f16 checkpoints and inputs work too: an f32 golden converted to f16 stays within the
/// half-precision tolerance under a chunked-prefill + decode schedule.
#[test]
fn f16_run_of_an_f32_golden_is_within_the_half_precision_tolerance() {
    let Some(dir) = golden_case("qlora_yarn_interleave_f32") else { return };
    let mut case = Case::load(&dir);
    case.hidden = case.hidden.converted(vt_core::DType::F16);
    case.weights.dtype = vt_core::DType::F16;
    for (_, t) in case.weights.tensors.iter_mut() {
        *t = t.converted(vt_core::DType::F16);
    }
    let q = test_queue();
    let store = case.store(&q);
    let block = case.block(&store, None);
    assert_eq!(block.dtype(), vt_core::DType::F16);
    let (out, _) = case.run(
        &q,
        &block,
        "prefill:9,prefill:6,decode:9",
        &RunOptions { block_size: 16, chunk_workspace_tokens: Some(6) },
    );
    assert_eq!(out.dtype, vt_core::DType::F16);
    let err = case.rel_err(&out);
    eprintln!("qlora_yarn_interleave_f32 as f16: rel err {err:.3e}");
    assert!(err <= 2e-2, "{err:.3e}");
}

/// A context no longer than index_topk: every query selects every visible token, so the
/// V3.2 block (indexer + SparseMlaAttention for every token) equals the dense block on the
/// same weights (its indexer dropped: materialized prefill attention, MlaDecodeAttention for
/// decode), under a prefill and a prefill + decode schedule, within 1e-5 (f32) / 2e-2 (bf16)
/// relative Frobenius error (the two forms round differently).
#[test]
fn v32_block_equals_the_dense_block_when_the_context_is_shorter_than_top_k() {
    let q = test_queue();
    for name in ["v32_sparse_f32", "v32_sparse_mscale_bf16"] {
        let Some(dir) = golden_case(name) else { return };
        let mut case = Case::load(&dir);
        let k = case.cfg.dims.indexer.expect("a V3.2 golden has an indexer").topk;
        // The first k tokens of each sequence.
        let (s, t, h) = (case.s(), case.t(), case.cfg.dims.hidden_size);
        let row = (h as usize) * case.dtype().size_of();
        let mut bytes = Vec::new();
        let mut positions = Vec::new();
        for si in 0..s as usize {
            let at = si * t as usize;
            bytes.extend_from_slice(&case.hidden.bytes[at * row..(at + k as usize) * row]);
            positions.extend_from_slice(&case.positions[at..at + k as usize]);
        }
        case.hidden = mla_block::HostTensor { dtype: case.dtype(), shape: vec![s, k, h], bytes };
        case.positions = positions;
        let store = case.store(&q);
        let sparse = case.block(&store, None);
        let mut dense_cfg = case.cfg;
        dense_cfg.dims.indexer = None;
        let dense_store = mla_block::MlaWeightStore::from_host(&q, &dense_cfg, &case.weights).unwrap();
        let dense = mla_block::MlaBlock::new(dense_cfg.dims, dense_store.views(), false).unwrap();
        let tol = if case.dtype() == vt_core::DType::F32 { 1e-5 } else { 2e-2 };
        for schedule in [format!("prefill:{k}"), format!("prefill:3,decode:{}", k - 3)] {
            let opts = RunOptions { block_size: 4, chunk_workspace_tokens: None };
            let (a, _) = case.run(&q, &sparse, &schedule, &opts);
            let (b, _) = case.run(&q, &dense, &schedule, &opts);
            let diff = common::rel_frobenius(&a.to_f64(), &b.to_f64());
            eprintln!("{name}: first {k} tokens, {schedule}: sparse vs dense rel err {diff:.3e}");
            assert!(diff <= tol, "{name} {schedule}: sparse vs dense {diff:.3e} > {tol:e}");
        }
    }
}
