//! CUDA graphs over an fp8_ds_mla KV cache (issue 16): a decode step of the block whose
//! cache is the 656-byte fp8 row captures into a CUDA graph (thread-local capture mode: any
//! sync, allocation or read-back fails) and its replays, before and after `prepare` uploads
//! new metadata, equal direct runs bit for bit; the replayed step is within the fp8 bound
//! (6e-2) of transformers and within tolerance of the CPU on the same fp8 cache. Then
//! `DecodeGraphs` serving over an fp8 `LayeredKvCache` while sequences join and leave:
//! replays = the same padded step eagerly, bit for bit. The CUDA tests skip without a CUDA
//! device; the CPU test runs the same serving loop eagerly (padded = unpadded bit for bit).

mod common;
#[path = "support/serving.rs"]
mod serving;

use common::{capture_and_replay_decode_step, cuda_queue, golden_case, Case};
use mla_block::runner::{run_schedule_with_cache, RunOptions, Schedule};
use mla_block::tp::RandomLayerSpec;
use mla_block::KvCacheDtype;
use serving::{check_replay, serve, serve_on_gpu_and_cpu, to_f64, Serving};
use vt_core::DType;

/// The fp8_ds_mla bound against transformers (docs/mla.md, "The fp8_ds_mla cache").
const FP8_BOUND: f64 = 6e-2;

/// The GPU's and the CPU's fp8 runs encode latents computed by different GEMMs: a code
/// whose value sat on a rounding midpoint may differ by one e4m3 step, rarely; bf16 adds
/// its own rounding differences (the float cache's tolerance).
fn cpu_tolerance(dt: DType) -> f64 {
    if dt == DType::F32 {
        1e-3
    } else {
        2e-2
    }
}

#[test]
fn a_decode_step_on_an_fp8_cache_captures_into_a_cuda_graph_and_replays_bit_for_bit() {
    let Some(q) = cuda_queue() else { return };
    for name in ["latent512_yarn_bf16", "latent512_qproj_f32"] {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        let store = case.store(&q);
        let block = case.block(&store, None);
        let dt = case.dtype();
        let step =
            capture_and_replay_decode_step(&q, &case, &block, DType::Fp8DsMla, "fp8-cache decode step");
        let pre = step.pre;

        // The replayed step against transformers (fp8 bound) and against the CPU running the
        // same schedule on an fp8 cache (prefill:T-3, then 3 decode steps).
        let got = to_f64(dt, &step.replayed);
        assert!(got.iter().all(|v| v.is_finite()), "{name}: non-finite output");
        let vs_gold = common::rel_frobenius(&got, &step.step_rows(&case.expected));
        let cpu = common::cpu_queue();
        let cpu_store = case.store(&cpu);
        let cpu_block = case.block(&cpu_store, None);
        let sch: Schedule = format!("prefill:{pre},decode:3").parse().unwrap();
        let opts = RunOptions { block_size: step.block_size, chunk_workspace_tokens: None };
        let cpu_out = run_schedule_with_cache(
            &cpu,
            &cpu_block,
            &case.hidden,
            &case.positions,
            &sch,
            &opts,
            KvCacheDtype::Fp8DsMla,
            &|_, _| {},
        )
        .unwrap()
        .0
        .to_f64();
        let vs_cpu = common::rel_frobenius(&got, &step.step_rows(&cpu_out));
        eprintln!(
            "{name}: graph-replayed decode step on an fp8_ds_mla cache: vs transformers {vs_gold:.3e}, vs the CPU \
             fp8 run {vs_cpu:.3e}"
        );
        assert!(vs_gold <= FP8_BOUND, "{name}: vs transformers {vs_gold:.3e}");
        assert!(vs_cpu <= cpu_tolerance(dt), "{name}: vs CPU {vs_cpu:.3e}");
    }
}

fn fp8_serving(dt: DType) -> Serving {
    Serving {
        spec: RandomLayerSpec::SMALL_FP8,
        layers: 1,
        decode_steps: 12,
        kv_cache: KvCacheDtype::Fp8DsMla,
        ..Serving::small(dt)
    }
}

/// `DecodeGraphs` over an fp8 `LayeredKvCache` on CUDA: every replay equals the same padded
/// step run op by op, bit for bit, and is within tolerance of the unpadded step and of
/// the CPU serving the same schedule on an fp8 cache.
#[test]
fn decode_graphs_replay_on_an_fp8_cache_while_sequences_join_and_leave() {
    let Some(q) = cuda_queue() else { return };
    let cpu = common::cpu_queue();
    for dt in [DType::BF16, DType::F32] {
        let s = fp8_serving(dt);
        let (gpu, host) = serve_on_gpu_and_cpu(&q, &cpu, &s);
        let tol = cpu_tolerance(dt);
        let (mut worst_unpadded, mut worst_cpu) = (0f64, 0f64);
        for (g, c) in gpu.steps.iter().zip(&host.steps) {
            let (got, ec) = check_replay(dt, g, c);
            let eu = common::rel_frobenius(&got, &to_f64(dt, &g.unpadded));
            assert!(eu <= tol && ec <= tol, "{dt} step {}: vs unpadded {eu:.3e}, vs CPU {ec:.3e}", g.step);
            worst_unpadded = worst_unpadded.max(eu);
            worst_cpu = worst_cpu.max(ec);
        }
        eprintln!(
            "fp8_ds_mla {dt}: {} replayed steps (buckets {:?}) = padded eager bit for bit; vs unpadded worst \
             {worst_unpadded:.3e}, vs CPU worst {worst_cpu:.3e}",
            gpu.steps.len(),
            gpu.buckets_used
        );
    }
}

/// The same serving loop on the CPU (eager): padded steps equal the unpadded ones bit for
/// bit on an fp8 cache, and differ from the float cache's (the rows really are fp8).
#[test]
fn decode_graphs_on_an_fp8_cache_pad_bit_for_bit_on_the_cpu() {
    let q = common::cpu_queue();
    let s = fp8_serving(DType::F32);
    let fp8 = serve(&q, &s);
    let float = serve(&q, &Serving { kv_cache: KvCacheDtype::Auto, ..s.clone() });
    let mut differ = 0;
    for (r, f) in fp8.steps.iter().zip(&float.steps) {
        assert_eq!(r.graph, r.unpadded, "step {}", r.step);
        assert_eq!(r.graph, r.padded_eager, "step {}", r.step);
        let e = common::rel_frobenius(&to_f64(DType::F32, &r.graph), &to_f64(DType::F32, &f.graph));
        assert!(e <= FP8_BOUND, "step {}: fp8 vs float cache {e:.3e}", r.step);
        differ += usize::from(e > 1e-4);
    }
    assert_eq!(differ, fp8.steps.len(), "every decode step reads fp8 rows");
}
