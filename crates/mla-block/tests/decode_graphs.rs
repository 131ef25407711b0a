//! `DecodeGraphs` on the CPU, where the queue cannot capture and every step runs eagerly:
//! padded steps (buckets, padding rows of length 0 and slot -1) equal the plain unpadded
//! step bit for bit while sequences join and leave between steps; the refusals name their
//! argument. The CUDA side (graph replays) is `tests/cuda_graph.rs`.

mod common;
#[path = "support/serving.rs"]
mod serving;

use mla_block::tp::RandomLayerSpec;
use mla_block::{
    DecodeGraphConfig, DecodeGraphs, LayeredKvCache, MlaBatchMetadata, MlaBlock, MlaWeightStore, StepMode,
    StepSeq,
};
use serving::{serve, Serving};
use vt_core::{DType, Error};

#[test]
fn padded_decode_steps_equal_the_plain_step_bit_for_bit_while_sequences_join_and_leave() {
    let q = common::cpu_queue();
    // Debug-build CPU ops are slow: two layers in f32, one in bf16.
    for (dt, layers, steps) in [(DType::F32, 2, 16), (DType::BF16, 1, 10)] {
        let s = Serving { layers, decode_steps: steps, ..Serving::small(dt) };
        let served = serve(&q, &s);
        match &served.mode {
            StepMode::Eager { why } => {
                assert!(why.contains("graph capture is not supported"), "{why}");
                assert!(why.contains("CUDA"), "{why}");
            }
            StepMode::Graph => panic!("the CPU queue cannot capture"),
        }
        assert!(served.joined >= 4 && served.left >= 2, "joined {}, left {}", served.joined, served.left);
        assert!(served.buckets_used.len() >= 2, "buckets used: {:?}", served.buckets_used);
        assert!(served.steps.iter().any(|r| r.rows < r.bucket), "no padded step");
        for r in &served.steps {
            assert_eq!(r.graph, r.unpadded, "{dt} step {}: B = {} in bucket {}", r.step, r.rows, r.bucket);
            assert_eq!(r.graph, r.padded_eager, "{dt} step {}", r.step);
            assert!(serving::to_f64(dt, &r.graph).iter().all(|v| v.is_finite()), "{dt} step {}", r.step);
        }
        eprintln!(
            "{dt}: {} decode steps, {} joined, {} left, buckets {:?}: padded = unpadded bit for bit",
            served.steps.len(),
            served.joined,
            served.left,
            served.buckets_used
        );
    }
}

/// A V3-shaped cache row (kv_lora 512, rope 64) and the fast-kernel dims, on the CPU.
#[test]
fn the_fp8_sized_small_layer_pads_bit_for_bit_too() {
    let q = common::cpu_queue();
    let s = Serving {
        spec: RandomLayerSpec::SMALL_FP8,
        layers: 1,
        decode_steps: 8,
        ..Serving::small(DType::BF16)
    };
    for r in serve(&q, &s).steps {
        assert_eq!(r.graph, r.unpadded, "step {}", r.step);
    }
}

/// A DeepSeek-V3.2-shaped layer (indexer + sparse attention, top 16): padded decode steps
/// (padding rows select nothing) equal the plain step bit for bit while sequences join and
/// leave, through two layers on one cache of [latent | indexer key] rows (prompts up to 12
/// tokens and 16 decode steps: contexts pass the top-k).
#[test]
fn a_v32_sparse_layer_pads_bit_for_bit_too() {
    let q = common::cpu_queue();
    let s = Serving {
        spec: RandomLayerSpec::SMALL_V32,
        layers: 2,
        decode_steps: 10,
        ..Serving::small(DType::F32)
    };
    let served = serve(&q, &s);
    assert!(served.steps.iter().any(|r| r.rows < r.bucket), "no padded step");
    for r in &served.steps {
        assert_eq!(r.graph, r.unpadded, "step {}", r.step);
        assert_eq!(r.graph, r.padded_eager, "step {}", r.step);
        assert!(serving::to_f64(DType::F32, &r.graph).iter().all(|v| v.is_finite()), "step {}", r.step);
    }
}

fn arg_of(e: &Error) -> &'static str {
    match e {
        Error::InvalidArgument { arg, .. } => arg,
        other => panic!("expected an invalid argument, got {other}"),
    }
}

#[test]
fn decode_graphs_refuse_what_they_cannot_run_naming_the_argument() {
    let q = common::cpu_queue();
    let spec = RandomLayerSpec::SMALL;
    let (cfg, w) = spec.layer(DType::F32, 1).unwrap();
    let store = MlaWeightStore::from_host(&q, &cfg, &w).unwrap();
    let block = MlaBlock::new(cfg.dims, store.views(), cfg.rope.is_neox).unwrap();
    let blocks = [block];
    let mut cache = LayeredKvCache::new(&q, DType::F32, 1, 16, 4, cfg.dims.cache_row_dim()).unwrap();

    for (buckets, width, arg) in [
        (vec![], 4, "buckets"),
        (vec![0, 2], 4, "buckets"),
        (vec![2, 2], 4, "buckets"),
        (vec![4, 2], 4, "buckets"),
        (vec![1, 2], 0, "max_blocks_per_seq"),
    ] {
        let cfg = DecodeGraphConfig::new(width).with_buckets(&buckets);
        let e = DecodeGraphs::new(&q, &blocks, &cache, cfg).err().expect("refused");
        assert_eq!(arg_of(&e), arg, "{buckets:?} width {width}: {e}");
    }
    // Two layers of blocks on a one-layer cache.
    let e = DecodeGraphs::new(&q, &[block, block], &cache, DecodeGraphConfig::new(4)).err().unwrap();
    assert_eq!(arg_of(&e), "blocks", "{e}");

    let mut g =
        DecodeGraphs::new(&q, &blocks, &cache, DecodeGraphConfig::new(2).with_buckets(&[1, 2])).unwrap();
    assert_eq!(g.bucket_for(1), Some(1));
    assert_eq!(g.bucket_for(2), Some(2));
    assert_eq!(g.bucket_for(3), None);
    // Nothing prepared yet.
    assert_eq!(arg_of(&g.input().unwrap_err()), "prepare");
    assert_eq!(arg_of(&g.run(&cache).unwrap_err()), "prepare");

    let ids: Vec<_> = (0..3).map(|_| cache.add_sequence()).collect();
    let mut meta = MlaBatchMetadata::default();
    // A prefill step.
    meta.plan(&mut cache, &[StepSeq { seq: ids[0], positions: &[0, 1, 2], decode: false }], 16).unwrap();
    let e = g.prepare(&meta).unwrap_err();
    assert_eq!(arg_of(&e), "meta");
    assert!(e.to_string().contains("prefill"), "{e}");
    // An empty step.
    meta.plan(&mut cache, &[], 16).unwrap();
    assert_eq!(arg_of(&g.prepare(&meta).unwrap_err()), "meta");
    // More sequences than the largest bucket.
    let mut big = MlaBatchMetadata::default();
    let mut scratch = LayeredKvCache::new(&q, DType::F32, 1, 16, 4, cfg.dims.cache_row_dim()).unwrap();
    let sids: Vec<_> = (0..3).map(|_| scratch.add_sequence()).collect();
    let ssteps: Vec<_> = sids.iter().map(|&seq| StepSeq { seq, positions: &[0], decode: true }).collect();
    big.plan(&mut scratch, &ssteps, 16).unwrap();
    let e = g.prepare(&big).unwrap_err();
    assert!(e.to_string().contains("largest bucket"), "{e}");
    // A sequence wider than the captured block tables (3 blocks of 4 > width 2).
    let long: Vec<i64> = (0..9).collect();
    meta.plan(&mut cache, &[StepSeq { seq: ids[1], positions: &long, decode: false }], 16).unwrap();
    meta.plan(&mut cache, &[StepSeq { seq: ids[1], positions: &[9], decode: true }], 16).unwrap();
    let e = g.prepare(&meta).unwrap_err();
    assert!(e.to_string().contains("max_blocks_per_seq"), "{e}");

    // A good step, then run on another cache.
    meta.plan(&mut cache, &[StepSeq { seq: ids[2], positions: &[0], decode: true }], 16).unwrap();
    assert_eq!(g.prepare(&meta).unwrap(), 1);
    assert_eq!(g.prepared_rows(), Some((1, 1)));
    assert_eq!(g.input().unwrap().shape(), &[1, cfg.dims.hidden_size]);
    let other = LayeredKvCache::new(&q, DType::F32, 1, 16, 4, cfg.dims.cache_row_dim()).unwrap();
    assert_eq!(arg_of(&g.run(&other).unwrap_err()), "cache");
    g.run(&cache).unwrap();
    assert!(q.read_f64(&g.output().unwrap()).unwrap().iter().all(|v| v.is_finite()));
}

/// A hand-made padding row with a slot >= 0 is refused by the metadata check: length 0
/// is only for rows that write nothing.
#[test]
fn a_length_zero_row_must_have_a_negative_slot() {
    let meta = MlaBatchMetadata {
        num_decode_tokens: 2,
        positions: vec![3, 0],
        slot_mapping: vec![3, -1],
        decode_max_blocks: 1,
        decode_block_table: vec![0, 0],
        decode_seq_lens: vec![4, 0],
        ..MlaBatchMetadata::default()
    };
    meta.check(2, 4, 4, 64).unwrap();
    let bad = MlaBatchMetadata { slot_mapping: vec![3, 5], ..meta.clone() };
    let e = bad.check(2, 4, 4, 64).unwrap_err();
    assert_eq!(arg_of(&e), "decode_seq_lens", "{e}");
    let neg = MlaBatchMetadata { decode_seq_lens: vec![4, -1], ..meta };
    assert_eq!(arg_of(&neg.check(2, 4, 4, 64).unwrap_err()), "decode_seq_lens");
}
