//! A decode step of the whole block does no host synchronization and no allocation once
//! warmed up: its `launch` half captures into a CUDA graph (thread-local capture mode,
//! where any sync, allocation or read-back from the capturing thread fails), and replays of
//! the graph after `prepare` uploads the next step's metadata reproduce direct runs bit for
//! bit. `DecodeGraphs` (one graph per batch-size bucket) replays steps with new metadata
//! while sequences join and leave, bit for bit with the same padded step run eagerly and
//! within tolerance of the plain unpadded step and of the CPU. Skips without a CUDA device.

mod common;
#[path = "support/serving.rs"]
mod serving;

use common::{capture_and_replay_decode_step, cuda_queue, golden_case, Case};
use mla_block::tp::RandomLayerSpec;
use mla_block::{MlaBatchMetadata, MlaLimits, MlaWorkspace, PagedKvCache, StepSeq};
use serving::{check_replay, serve, serve_on_gpu_and_cpu, to_f64, Serving};
use vt_core::{Buffer, DType};

/// One CUDA test of this file at a time: another test's thread may make an implicit device
/// synchronization (a free, say) while this one records, which can invalidate the capture and
/// says nothing about the step captured. Call 5 of 2026-12-01 saw
/// `decode_graphs_replay_v32_sparse_steps` lose its capture ("invalidated before LayerNorm")
/// with every test of this file in parallel, after passing with two test threads; this is the
/// suspected cause, not yet confirmed on a GPU.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static GPU: std::sync::Mutex<()> = std::sync::Mutex::new(());
    GPU.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn a_decode_step_of_the_block_captures_into_a_cuda_graph_and_replays_bit_for_bit() {
    capture_and_replay_a_decode_step(None);
}

/// The same with both decode-step fusions on (`VT_FUSE_DECODE_QUERY`, `VT_FUSE_CACHE_WRITE`:
/// the query rope and the cache write inside FusedNormRope, the absorbed BMM writing the
/// decode query directly).
#[test]
fn a_decode_step_with_the_fusions_on_captures_into_a_cuda_graph_and_replays_bit_for_bit() {
    capture_and_replay_a_decode_step(Some(true));
}

fn capture_and_replay_a_decode_step(fuse: Option<bool>) {
    let _gpu = one_at_a_time();
    let Some(q) = cuda_queue() else { return };
    for name in ["qlora_yarn_neox_bf16", "v2lite_yarn_f32"] {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        let store = case.store(&q);
        let mut block = case.block(&store, None);
        block.set_fuse_decode_query(fuse);
        block.set_fuse_cache_write(fuse);
        if fuse == Some(true) {
            assert!(
                block.uses_fused_decode_query() && block.uses_fused_cache_write(),
                "{name}: fusions not taken"
            );
        }
        let step = capture_and_replay_decode_step(&q, &case, &block, case.dtype(), "decode step");

        // And the replayed step is the full-causal answer for that token.
        let got = step.out.to_f64(&q).unwrap();
        let want = step.step_rows(&case.expected);
        let err = common::rel_frobenius(&got, &want);
        eprintln!("{name}: graph-replayed decode step vs transformers: rel err {err:.3e}");
        assert!(err <= case.tolerance(), "{name}: {err:.3e}");
    }
}

/// `launch` refuses a workspace that `prepare` did not size and fill for this step, rather
/// than running on stale metadata.
#[test]
fn launch_without_a_matching_prepare_is_an_error_naming_the_workspace() {
    let q = common::cpu_queue();
    let Some(dir) = golden_case("v2lite_yarn_f32") else { return };
    let case = Case::load(&dir);
    let store = case.store(&q);
    let block = case.block(&store, None);
    let (t, h) = (case.t(), case.hidden.shape[2]);
    let dt = case.dtype();
    let mut cache = PagedKvCache::new(&q, dt, 4, 16, block.dims().cache_row_dim()).unwrap();
    let limits = MlaLimits { max_tokens: t, max_seqs: 1, max_blocks_per_seq: 4, chunk_workspace_tokens: t };
    let mut ws = MlaWorkspace::new(limits).unwrap();
    let id = cache.add_sequence();
    let x = Buffer::from_f64(&q, dt, &[4, h], &case.hidden.to_f64()[..(4 * h) as usize]).unwrap();
    let y = Buffer::nan(&q, dt, &[4, h]).unwrap();
    let mut meta = MlaBatchMetadata::default();
    let steps = [StepSeq { seq: id, positions: &case.positions[..4], decode: false }];
    meta.plan(&mut cache, &steps, t).unwrap();
    let err = block.launch(&q, &ws, &x.view(), &meta, &cache.view(), &y.view()).unwrap_err();
    assert!(
        matches!(&err, vt_core::Error::InvalidArgument { arg: "ws", .. }),
        "expected an error naming `ws`, got {err}"
    );
    block.prepare(&q, &mut ws, &meta).unwrap();
    block.launch(&q, &ws, &x.view(), &meta, &cache.view(), &y.view()).unwrap();
    assert!(y.to_f64(&q).unwrap().iter().all(|v| v.is_finite()));
}

/// An engine's serving loop over `DecodeGraphs` on CUDA: buckets 1, 2, 4, 8, two layers;
/// sequences join (prefilled eagerly) and leave between decode steps, so the replayed
/// graphs see new positions, slots, block tables and lengths every step, and buckets change.
/// Each replay equals the same padded step run op by op (bit for bit), and is within
/// tolerance of the plain unpadded step (other GEMM shapes) and of the CPU running the same
/// schedule.
#[test]
fn decode_graphs_replay_new_metadata_while_sequences_join_and_leave() {
    let _gpu = one_at_a_time();
    let Some(q) = cuda_queue() else { return };
    let cpu = common::cpu_queue();
    // The V3 cache row (512 + 64: the tensor-core decode kernels) in bf16 with 8 heads (the
    // mma.sync kernel) and with V3's 128 heads (sm_90: the wgmma kernel, TMA loads), and the
    // small layer in f32 (the generic kernel).
    let v3_heads = RandomLayerSpec { num_heads: 128, ..RandomLayerSpec::SMALL_FP8 };
    for (spec, dt, tol) in [
        (RandomLayerSpec::SMALL_FP8, DType::BF16, 2e-2),
        (v3_heads, DType::BF16, 2e-2),
        (RandomLayerSpec::SMALL, DType::F32, 1e-4),
    ] {
        let s = Serving { spec, decode_steps: 24, ..Serving::small(dt) };
        let (gpu, host) = serve_on_gpu_and_cpu(&q, &cpu, &s);
        assert!(gpu.buckets_used.len() >= 3, "{dt}: buckets used {:?}", gpu.buckets_used);
        let (mut same_unpadded, mut worst_unpadded, mut worst_cpu) = (0, 0f64, 0f64);
        for (g, c) in gpu.steps.iter().zip(&host.steps) {
            let (got, ec) = check_replay(dt, g, c);
            same_unpadded += usize::from(g.graph == g.unpadded);
            let eu = common::rel_frobenius(&got, &to_f64(dt, &g.unpadded));
            assert!(eu <= tol, "{dt} step {}: graph vs unpadded eager {eu:.3e}", g.step);
            assert!(ec <= tol, "{dt} step {}: graph vs CPU {ec:.3e}", g.step);
            worst_unpadded = worst_unpadded.max(eu);
            worst_cpu = worst_cpu.max(ec);
        }
        eprintln!(
            "{dt} kv_lora {} heads {}: {} replayed steps ({} joined, {} left, buckets {:?}): = padded eager bit for \
             bit; bit-identical to the unpadded step in {same_unpadded}, worst {worst_unpadded:.3e}; vs CPU worst \
             {worst_cpu:.3e}",
            spec.kv_lora_rank,
            spec.num_heads,
            gpu.steps.len(),
            gpu.joined,
            gpu.left,
            gpu.buckets_used
        );
    }
}

/// DeepSeek-V3.2-shaped layers (issue 19: indexer + SparseMlaAttention in every decode step)
/// under `DecodeGraphs` on CUDA: every replay equals the same padded step run op by op bit
/// for bit; in f32 (the small layer, top 16) also the CPU within 1e-4 (an indexer near-tie
/// could flip a selection there; random scores make that unlikely at f32 precision). The bf16
/// V3-width layer with 128 heads and V3.2's 64 x 128 indexer (top 16, so contexts pass it)
/// reports its distance to the CPU without a bound: bf16 rounding may flip near-tied picks.
#[test]
fn decode_graphs_replay_v32_sparse_steps() {
    let _gpu = one_at_a_time();
    let Some(q) = cuda_queue() else { return };
    let cpu = common::cpu_queue();
    let v32_wide = RandomLayerSpec {
        num_heads: 128,
        indexer: Some(mla_block::IndexerDims { n_heads: 64, head_dim: 128, topk: 16 }),
        ..RandomLayerSpec::SMALL_FP8
    };
    for (spec, dt, tol) in
        [(RandomLayerSpec::SMALL_V32, DType::F32, Some(1e-4)), (v32_wide, DType::BF16, None)]
    {
        let s = Serving { spec, decode_steps: 24, ..Serving::small(dt) };
        let (gpu, host) = serve_on_gpu_and_cpu(&q, &cpu, &s);
        let mut worst_cpu = 0f64;
        for (g, c) in gpu.steps.iter().zip(&host.steps) {
            let (_, ec) = check_replay(dt, g, c);
            if let Some(tol) = tol {
                assert!(ec <= tol, "{dt} step {}: graph vs CPU {ec:.3e}", g.step);
            }
            worst_cpu = worst_cpu.max(ec);
        }
        eprintln!(
            "v32 {dt} heads {} indexer {:?}: {} replayed steps = padded eager bit for bit; vs CPU worst {worst_cpu:.3e}",
            spec.num_heads,
            spec.indexer,
            gpu.steps.len()
        );
    }
}

/// `DecodeGraphs` with both decode-step fusions on in every block: each replay equals the
/// same padded step run op by op (bit for bit) and stays within tolerance of the CPU serving
/// the same schedule and of the GPU with the fusions off (the absorbed BMM then writes a
/// differently strided output, which cuBLAS may serve with another algorithm).
#[test]
fn decode_graphs_replay_with_the_decode_step_fusions_on() {
    let _gpu = one_at_a_time();
    let Some(q) = cuda_queue() else { return };
    let cpu = common::cpu_queue();
    let v3_heads = RandomLayerSpec { num_heads: 128, ..RandomLayerSpec::SMALL_FP8 };
    for (spec, dt, tol) in [(v3_heads, DType::BF16, 2e-2), (RandomLayerSpec::SMALL, DType::F32, 1e-4)] {
        let on = Serving { spec, decode_steps: 16, fuse: Some(true), ..Serving::small(dt) };
        let (gpu, host) = serve_on_gpu_and_cpu(&q, &cpu, &on);
        let off = serve(&q, &Serving { fuse: Some(false), ..on.clone() });
        assert_eq!(gpu.steps.len(), off.steps.len());
        let (mut worst_cpu, mut worst_off, mut same_off) = (0f64, 0f64, 0);
        for ((g, c), o) in gpu.steps.iter().zip(&host.steps).zip(&off.steps) {
            let (got, ec) = check_replay(dt, g, c);
            let eo = common::rel_frobenius(&got, &to_f64(dt, &o.graph));
            assert!(ec <= tol, "{dt} step {}: fused graph vs CPU {ec:.3e}", g.step);
            assert!(eo <= tol, "{dt} step {}: fused vs unfused graph {eo:.3e}", g.step);
            same_off += usize::from(g.graph == o.graph);
            worst_cpu = worst_cpu.max(ec);
            worst_off = worst_off.max(eo);
        }
        eprintln!(
            "{dt} heads {}: {} replayed fused steps = padded eager bit for bit; vs CPU worst {worst_cpu:.3e}; vs \
             unfused graphs worst {worst_off:.3e}, bit-identical in {same_off}",
            spec.num_heads,
            gpu.steps.len()
        );
    }
}
