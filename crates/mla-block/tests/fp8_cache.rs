//! The block with an fp8_ds_mla KV cache on the CPU, against the same block with a cache in
//! the activation dtype, under every kind of schedule and block sizes 1, 16 and 64.
//!
//! Not the transformers goldens: those layers have kv_lora_rank 32-64 and rope 8-16, and
//! the fp8_ds_mla row is defined for 512 + 64 only (`vt_core::fp8_ds_mla`). The layer here
//! is a random one with DeepSeek-V3's latent and rope widths (512, 64), small elsewhere so
//! the CPU runs it quickly.
//!
//! Bound 6e-2 relative Frobenius error: e4m3 keeps 3 mantissa bits, so one latent value is
//! off by at most 2^-4 = 6.25e-2 of itself (half an ulp; values far below their group's
//! amax lose more in absolute terms but weigh less), and the attention output, a convex
//! mix of those latents, carries that relative error or less; the f32 reference adds
//! nothing measurable. An error at the bound means the cache, not rounding, is wrong.

use mla_block::runner::{run_schedule_with_cache, RunOptions, Schedule};
use mla_block::tp::RandomLayerSpec;
use mla_block::{KvCacheDtype, MlaBlock, MlaWeightStore};
use vt_core::{DType, Device, Queue};

const SPEC: RandomLayerSpec = RandomLayerSpec {
    hidden_size: 256,
    num_heads: 4,
    q_lora_rank: 64,
    kv_lora_rank: 512,
    qk_nope_head_dim: 32,
    qk_rope_head_dim: 64,
    v_head_dim: 32,
    max_position_embeddings: 4096,
    indexer: None,
};

const BOUND: f64 = 6e-2;

fn rel(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    let den: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    num / den
}

#[test]
fn an_fp8_cache_stays_within_6e_2_of_the_float_cache_under_every_schedule() {
    vt_cpu::register();
    let q = Queue::new(Device::CPU).expect("cpu queue");
    let t = 40i64;
    let schedules: [(&str, i64, Option<i64>); 6] = [
        ("prefill:40", 64, None),
        ("prefill:16,prefill:8,prefill:16", 16, None),
        ("prefill:16,prefill:8,prefill:16", 1, Some(6)),
        ("prefill:20,decode:20", 16, None),
        ("prefill:1,decode:39", 1, None),
        ("prefill:5,decode:3,prefill:9,decode:23", 64, Some(4)),
    ];
    let mut worst: f64 = 0.0;
    for dtype in [DType::F32, DType::BF16] {
        let (cfg, w) = SPEC.layer(dtype, 16).expect("layer");
        let store = MlaWeightStore::from_host(&q, &cfg, &w).expect("weights");
        let block = MlaBlock::new(cfg.dims, store.views(), cfg.rope.is_neox).expect("block");
        let hidden = SPEC.hidden(2, t, dtype, 7);
        let positions: Vec<i64> = (0..2).flat_map(|_| 0..t).collect();
        for (schedule, block_size, ws) in schedules {
            let sch: Schedule = schedule.parse().expect("schedule");
            let opts = RunOptions { block_size, chunk_workspace_tokens: ws };
            let run = |cache: KvCacheDtype| {
                run_schedule_with_cache(&q, &block, &hidden, &positions, &sch, &opts, cache, &|_, _| {})
                    .unwrap_or_else(|e| panic!("{schedule} with a {} cache: {e}", cache.name()))
                    .0
                    .to_f64()
            };
            let (float, fp8) = (run(KvCacheDtype::Auto), run(KvCacheDtype::Fp8DsMla));
            assert!(fp8.iter().all(|v| v.is_finite()), "{dtype} {schedule}: non-finite output");
            let err = rel(&fp8, &float);
            eprintln!(
                "fp8_ds_mla cache {dtype:4} | {schedule:40} | block {block_size:2} | ws {:>4} | rel err vs {dtype} cache {err:.3e}",
                ws.map_or("all".into(), |w| w.to_string())
            );
            assert!(err <= BOUND, "{dtype} {schedule} (block {block_size}): rel err {err:.3e} > {BOUND:.0e}");
            // One prefill of the whole sequence attends over its fresh keys and never reads
            // the cache (exact); every other schedule reads cached context, which is
            // quantized: close, not equal (a cache read as the float one would be equal).
            if schedule == "prefill:40" {
                assert_eq!(err, 0.0, "{dtype}: a single prefill does not read the cache");
            } else {
                assert!(err > 0.0, "{dtype} {schedule}: the fp8 run equals the float run exactly");
            }
            worst = worst.max(err);
        }
    }
    eprintln!("fp8_ds_mla cache: worst rel err {worst:.3e} (bound {BOUND:.0e})");
}

#[test]
fn cache_dtypes_parse_size_and_refuse_what_they_cannot_hold() {
    use mla_block::row_bytes;
    for k in KvCacheDtype::ALL {
        assert_eq!(k.name().parse::<KvCacheDtype>(), Ok(k));
    }
    assert!("fp8".parse::<KvCacheDtype>().is_err());
    assert_eq!(row_bytes(DType::Fp8DsMla, 576).unwrap(), 656);
    assert_eq!(row_bytes(DType::BF16, 576).unwrap(), 1152);
    assert!(row_bytes(DType::Fp8DsMla, 80).is_err(), "fp8 rows hold 512 + 64 only");
    assert!(KvCacheDtype::Bf16.resolve(DType::F32).is_err(), "a bf16 cache needs bf16 activations");
    assert_eq!(KvCacheDtype::Auto.resolve(DType::F16).unwrap(), DType::F16);
    // A block whose L, R are not 512, 64 refuses an fp8 cache by name.
    vt_cpu::register();
    let q = Queue::new(Device::CPU).unwrap();
    let (cfg, w) = RandomLayerSpec::SMALL.layer(DType::F32, 1).unwrap();
    let store = MlaWeightStore::from_host(&q, &cfg, &w).unwrap();
    let block = MlaBlock::new(cfg.dims, store.views(), cfg.rope.is_neox).unwrap();
    let hidden = RandomLayerSpec::SMALL.hidden(1, 4, DType::F32, 1);
    let sch: Schedule = "prefill:4".parse().unwrap();
    let e = run_schedule_with_cache(
        &q,
        &block,
        &hidden,
        &[0, 1, 2, 3],
        &sch,
        &RunOptions::default(),
        KvCacheDtype::Fp8DsMla,
        &|_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("fp8_ds_mla") && e.contains("576"), "{e}");
}
