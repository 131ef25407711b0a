//! A model's attention stack on one allocator (issue 14, item 5): one `LayeredKvCache`, one
//! plan and one metadata upload per step for every layer, equal bit for bit to running each
//! layer with its own cache, plan and workspace.

mod common;

use common::test_queue;
use mla_block::layers::{bench_decode_layers, forward_layers};
use mla_block::tp::{DecodeBenchOptions, RandomLayerSpec};
use mla_block::{
    LayeredKvCache, MlaBatchMetadata, MlaBlock, MlaConfig, MlaLimits, MlaWeightStore, MlaWorkspace,
    PagedKvCache, StepSeq,
};
use vt_core::{Buffer, DType, Queue};

const LAYERS: usize = 3;

fn stack(q: &Queue, dtype: DType) -> (MlaConfig, Vec<MlaWeightStore>) {
    let mut stores = Vec::new();
    let mut cfg = None;
    for i in 0..LAYERS {
        let (c, w) = RandomLayerSpec::SMALL.layer(dtype, 100 + i as u64).unwrap();
        stores.push(MlaWeightStore::from_host(q, &c, &w).unwrap());
        cfg = Some(c);
    }
    (cfg.unwrap(), stores)
}

/// (decode, tokens per sequence) of each step: prefill, chunked prefill over the cache,
/// decodes.
const STEPS: [(bool, usize); 6] = [(false, 7), (false, 5), (true, 1), (true, 1), (false, 3), (true, 1)];

#[test]
fn one_allocator_and_one_plan_per_step_equal_per_layer_caches_bit_for_bit() {
    let q = test_queue();
    for dtype in [DType::F32, DType::BF16] {
        let (cfg, stores) = stack(&q, dtype);
        let blocks: Vec<MlaBlock<'_>> =
            stores.iter().map(|s| MlaBlock::new(cfg.dims, s.views(), cfg.rope.is_neox).unwrap()).collect();
        let h = cfg.dims.hidden_size;
        let (s, bs, nb) = (2usize, 4i64, 16i64);
        let max_t = 7 * s as i64;
        let spec = RandomLayerSpec::SMALL;
        let limits =
            MlaLimits { max_tokens: max_t, max_seqs: 2, max_blocks_per_seq: 8, chunk_workspace_tokens: 6 };

        // One allocator for all layers.
        let mut shared =
            LayeredKvCache::new(&q, dtype, LAYERS as i64, nb, bs, cfg.dims.cache_row_dim()).unwrap();
        let ids: Vec<_> = (0..s).map(|_| shared.add_sequence()).collect();
        let mut ws = MlaWorkspace::new(limits).unwrap();
        let mut meta = MlaBatchMetadata::default();
        // Per layer: its own cache, plan and workspace.
        let mut own: Vec<PagedKvCache> = (0..LAYERS)
            .map(|_| PagedKvCache::new(&q, dtype, nb, bs, cfg.dims.cache_row_dim()).unwrap())
            .collect();
        let own_ids: Vec<Vec<_>> =
            own.iter_mut().map(|c| (0..s).map(|_| c.add_sequence()).collect()).collect();
        let mut own_ws: Vec<MlaWorkspace> = (0..LAYERS).map(|_| MlaWorkspace::new(limits).unwrap()).collect();
        let mut own_meta: Vec<MlaBatchMetadata> = (0..LAYERS).map(|_| MlaBatchMetadata::default()).collect();

        let mut pos = 0i64;
        for (k, &(decode, n)) in STEPS.iter().enumerate() {
            let positions: Vec<i64> = (pos..pos + n as i64).collect();
            let t = (n * s) as i64;
            let hidden = spec.hidden(1, t, dtype, 7 + k as u64);
            let x = Buffer::from_bytes(&q, dtype, &[t, h], &hidden.bytes).unwrap();
            let [a, b, y] = [0; 3].map(|_| Buffer::nan(&q, dtype, &[t, h]).unwrap());
            let seqs: Vec<StepSeq<'_>> =
                ids.iter().map(|&seq| StepSeq { seq, positions: &positions, decode }).collect();
            meta.plan(&mut shared, &seqs, limits.chunk_workspace_tokens).unwrap();
            forward_layers(
                &q,
                &blocks,
                &mut ws,
                &meta,
                &shared,
                &x.view(),
                [&a.view(), &b.view()],
                &y.view(),
            )
            .unwrap();

            let mut input = x;
            for (i, block) in blocks.iter().enumerate() {
                let seqs: Vec<StepSeq<'_>> =
                    own_ids[i].iter().map(|&seq| StepSeq { seq, positions: &positions, decode }).collect();
                own_meta[i].plan(&mut own[i], &seqs, limits.chunk_workspace_tokens).unwrap();
                let out = Buffer::nan(&q, dtype, &[t, h]).unwrap();
                block
                    .forward(&q, &mut own_ws[i], &input.view(), &own_meta[i], &own[i].view(), &out.view())
                    .unwrap();
                input = out;
            }
            assert_eq!(
                y.to_bytes(&q).unwrap(),
                input.to_bytes(&q).unwrap(),
                "{dtype} step {k}: the shared-allocator stack differs from per-layer caches"
            );
            // Every layer's cache rows are the per-layer cache's.
            for (i, c) in own.iter().enumerate() {
                assert_eq!(
                    q.read_bytes(&shared.layer(i as i64).unwrap()).unwrap(),
                    q.read_bytes(&c.view()).unwrap()
                );
            }
            assert!(y.to_f64(&q).unwrap().iter().all(|v| v.is_finite()));
            pos += n as i64;
        }
        // The metadata went up once per step, into one workspace, for all layers.
        assert_eq!(shared.seq_len(ids[0]).unwrap(), pos);
        for id in ids {
            shared.free_sequence(id).unwrap();
        }
        assert_eq!(shared.free_blocks(), nb);
    }
}

#[test]
fn a_stack_needs_one_cache_layer_per_block_and_identical_layers() {
    let q = test_queue();
    let (cfg, stores) = stack(&q, DType::F32);
    let blocks: Vec<MlaBlock<'_>> =
        stores.iter().map(|s| MlaBlock::new(cfg.dims, s.views(), cfg.rope.is_neox).unwrap()).collect();
    let cache = LayeredKvCache::new(&q, DType::F32, 2, 4, 4, cfg.dims.cache_row_dim()).unwrap();
    let e = mla_block::layers::check_layers(&blocks, &cache).unwrap_err().to_string();
    assert!(e.contains("3 blocks for a cache of 2 layers"), "{e}");
    let e = cache.layer(2).unwrap_err().to_string();
    assert!(e.contains("layer") && e.contains("0..2"), "{e}");
    let mut mixed = blocks.clone();
    mixed[1].set_fused_norm_rope(Some(!blocks[0].uses_fused_norm_rope()));
    let cache3 = LayeredKvCache::new(&q, DType::F32, 3, 4, 4, cfg.dims.cache_row_dim()).unwrap();
    if blocks[0].uses_fused_norm_rope() || mixed[1].uses_fused_norm_rope() {
        let e = mla_block::layers::check_layers(&mixed, &cache3).unwrap_err().to_string();
        assert!(e.contains("layer 1 differs"), "{e}");
    }
    assert!(LayeredKvCache::new(&q, DType::F32, 0, 4, 4, 8).is_err());
    assert!(LayeredKvCache::new(&q, DType::I32, 1, 4, 4, 8).is_err());
    assert!(LayeredKvCache::new(&q, DType::F32, i64::MAX / 2, 4, 4, 8).is_err());
}

#[test]
fn the_layer_stack_decode_bench_runs() {
    let q = test_queue();
    let (cfg, stores) = stack(&q, DType::BF16);
    let blocks: Vec<MlaBlock<'_>> =
        stores.iter().map(|s| MlaBlock::new(cfg.dims, s.views(), cfg.rope.is_neox).unwrap()).collect();
    let o = DecodeBenchOptions {
        batch: 3,
        context: 9,
        warmup: 1,
        steps: 2,
        rounds: 3,
        block_size: 4,
        prefill_tokens: 18,
    };
    let r = bench_decode_layers(&q, &blocks, &o, 5).unwrap();
    assert_eq!((r.layers, r.rounds_ms.len()), (LAYERS, 3));
    assert!(r.ms_per_step > 0.0 && r.min_ms_per_step <= r.ms_per_step);
    assert!((r.ms_per_layer * LAYERS as f64 - r.ms_per_step).abs() < 1e-9);
    let bad = DecodeBenchOptions { context: 1 << 40, ..o };
    assert!(bench_decode_layers(&q, &blocks, &bad, 5).unwrap_err().to_string().contains("rope positions"));
}
