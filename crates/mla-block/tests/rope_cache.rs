//! One cos/sin cache per device and rope parameters (`RopeCosSinCache`): layers loaded with
//! equal parameters read one buffer (one device address, as captured decode graphs hold it),
//! layers with other parameters their own; a shared cache outlives any one of its layers and
//! gives the outputs a private one gives.
//!
//! Tests of this binary run in parallel in one process, and the registry is process-wide:
//! each test that counts holders or looks for a freed cache uses a `rope_theta` of its own.

mod common;

use std::path::Path;

use common::{cpu_queue, synthetic};
use mla_block::runner::{run_schedule, RunOptions, Schedule};
use mla_block::{
    layer_prefix, Checkpoint, HostTensor, HostWeights, MlaBlock, MlaConfig, MlaWeightStore, RopeCosSinCache,
    YarnRopeParams, YarnScaling,
};
use vt_core::{Buffer, DType, Queue};

/// One change to a YaRN field.
type YarnChange = fn(&mut YarnScaling);

/// The synthetic q_lora layer (H 16, R 4, 64 positions) with rope base `theta`.
fn layer(theta: f64, dtype: DType) -> (MlaConfig, HostWeights) {
    let (mut cfg, w) = synthetic(true, dtype);
    cfg.rope.base = theta;
    (cfg, w)
}

fn cache_addr(store: &MlaWeightStore) -> u64 {
    store.views().rope_cos_sin_cache.expect("a store sets its cos/sin cache").data_addr()
}

/// The cache's values as the store's view reads them, beside the freshly computed ones.
fn assert_cache_holds(q: &Queue, store: &MlaWeightStore, cfg: &MlaConfig) {
    let view = store.views().rope_cos_sin_cache.unwrap();
    let got = q.read_f64(&view).unwrap();
    let want: Vec<f64> = cfg
        .rope
        .cos_sin_cache(cfg.dims.qk_rope_head_dim, cfg.max_position_embeddings)
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect();
    assert_eq!(got, want, "the cos/sin cache holds its parameters' values");
}

/// `out` of a fixed input (one sequence of 6 tokens: a prefill of 4, then 2 decodes).
fn run(q: &Queue, cfg: &MlaConfig, store: &MlaWeightStore) -> Vec<f64> {
    run_block(q, cfg, &MlaBlock::new(cfg.dims, store.views(), cfg.rope.is_neox).unwrap())
}

fn run_block(q: &Queue, cfg: &MlaConfig, block: &MlaBlock<'_>) -> Vec<f64> {
    let (t, h) = (6i64, cfg.dims.hidden_size);
    let vals: Vec<f64> = (0..t * h).map(|i| ((i * 37 % 101) as f64 / 101.0) - 0.5).collect();
    let hidden =
        HostTensor { dtype: DType::F32, shape: vec![1, t, h], bytes: vt_core::encode_f64(DType::F32, &vals) };
    let positions: Vec<i64> = (0..t).map(|p| p * 7).collect();
    let sch: Schedule = "prefill:4,decode:2".parse().unwrap();
    let opts = RunOptions { block_size: 4, chunk_workspace_tokens: Some(4) };
    let out = run_schedule(q, block, &hidden, &positions, &sch, &opts).unwrap().0.to_f64();
    assert!(out.iter().all(|v| v.is_finite()));
    out
}

#[test]
fn layers_with_equal_rope_params_share_one_cos_sin_cache() {
    let q = cpu_queue();
    let (cfg, w) = layer(10001.0, DType::F32);
    let a = MlaWeightStore::from_host(&q, &cfg, &w).unwrap();
    let b = MlaWeightStore::from_host(&q, &cfg, &w).unwrap();
    assert_eq!(cache_addr(&a), cache_addr(&b), "one device address for both layers");
    assert!(a.rope_cos_sin_cache().same_buffer(b.rope_cos_sin_cache()));
    assert_eq!(a.rope_cos_sin_cache().holders(), 2);
    assert_cache_holds(&q, &b, &cfg);

    // The other weights stay the layer's own.
    let (va, vb) = (a.views(), b.views());
    assert_ne!(va.o_proj.unwrap().data_addr(), vb.o_proj.unwrap().data_addr());

    // Memory: each store counts the cache, the stack counts it once.
    let cache = a.rope_cos_sin_cache().bytes();
    assert_eq!(cache, 64 * 4 * 4);
    assert_eq!(MlaWeightStore::total_device_bytes([&a, &b]), a.device_bytes() + b.device_bytes() - cache);

    // A third layer, with the pairing flipped (it changes how the rope ops read the cache,
    // not its values), shares it too.
    let mut neox = cfg;
    neox.rope.is_neox = !cfg.rope.is_neox;
    let c = MlaWeightStore::from_host(&q, &neox, &w).unwrap();
    assert_eq!(cache_addr(&c), cache_addr(&a));
    assert_eq!(a.rope_cos_sin_cache().holders(), 3);
}

/// The loaders as an engine calls them: every layer of a sharded checkpoint (layer 1 is
/// layer 0 halved), through `from_checkpoint`, `load` and the fp8 policy's `load_with`.
#[test]
fn layers_of_one_checkpoint_share_one_cos_sin_cache_through_every_loader() {
    let q = cpu_queue();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/checkpoints/qlora_yarn_neox_bf16/sharded");
    let cfg = MlaConfig::from_file(&dir.join("config.json")).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    let mut stores: Vec<MlaWeightStore> = (0..2)
        .map(|l| MlaWeightStore::from_checkpoint(&q, &cfg, &ckpt, &layer_prefix(l), None).unwrap())
        .collect();
    stores.push(MlaWeightStore::load(&q, &cfg, &dir, &layer_prefix(1), None).unwrap());
    stores.push(
        MlaWeightStore::load_with(&q, &cfg, &dir, &layer_prefix(0), None, mla_block::WeightsDtype::Fp8)
            .unwrap(),
    );
    let addr = cache_addr(&stores[0]);
    for s in &stores {
        assert_eq!(cache_addr(s), addr);
    }
    let cache = stores[0].rope_cos_sin_cache();
    assert_eq!((cache.rows(), cache.rotary_dim()), (cfg.max_position_embeddings, cfg.dims.qk_rope_head_dim));
    let own: u64 = stores.iter().map(|s| s.device_bytes() - cache.bytes()).sum();
    assert_eq!(MlaWeightStore::total_device_bytes(&stores), own + cache.bytes());
    assert_cache_holds(&q, &stores[2], &cfg);
}

#[test]
fn layers_with_different_rope_params_get_their_own_cos_sin_caches() {
    let q = cpu_queue();
    let theta = 10002.0;
    let (cfg, w) = layer(theta, DType::F32);
    let base = MlaWeightStore::from_host(&q, &cfg, &w).unwrap();
    let yarn = YarnScaling::with_defaults(4.0, 16);
    let mut variants: Vec<(&str, MlaConfig)> = Vec::new();
    let mut with = |what: &'static str, f: &dyn Fn(&mut MlaConfig)| {
        let mut c = cfg;
        f(&mut c);
        variants.push((what, c));
    };
    with("rope_theta", &|c| c.rope.base = theta + 1.0);
    with("max_position_embeddings", &|c| c.max_position_embeddings = 32);
    with("yarn", &|c| c.rope.yarn = Some(yarn));
    let fields: [(&str, YarnChange); 9] = [
        ("factor", |y| y.factor = 8.0),
        ("original_max_position_embeddings", |y| y.original_max_position_embeddings = 8),
        ("beta_fast", |y| y.beta_fast = 16.0),
        ("beta_slow", |y| y.beta_slow = 2.0),
        ("mscale", |y| y.mscale = 0.707),
        ("mscale_all_dim", |y| y.mscale_all_dim = 0.707),
        ("attn_factor", |y| y.attn_factor = 1.5),
        ("extrapolation_factor", |y| y.extrapolation_factor = 0.5),
        ("truncate", |y| y.truncate = false),
    ];
    for (name, change) in fields {
        let mut y = yarn;
        change(&mut y);
        let mut c = cfg;
        c.rope.yarn = Some(y);
        variants.push((name, c));
    }
    let stores: Vec<(&str, MlaWeightStore, MlaConfig)> = variants
        .into_iter()
        .map(|(what, c)| (what, MlaWeightStore::from_host(&q, &c, &w).unwrap(), c))
        .collect();
    let mut addrs = vec![("base", cache_addr(&base))];
    for (what, s, c) in &stores {
        assert!(!s.rope_cos_sin_cache().same_buffer(base.rope_cos_sin_cache()), "{what}");
        assert_eq!(s.rope_cos_sin_cache().holders(), 1, "{what}: a cache of its own");
        assert_cache_holds(&q, s, c);
        addrs.push((what, cache_addr(s)));
    }
    for (i, (wa, a)) in addrs.iter().enumerate() {
        for (wb, b) in &addrs[i + 1..] {
            assert_ne!(a, b, "{wa} and {wb} differ, so do their caches");
        }
    }

    // The rope dim: a cache of another width (through the registry directly; a layer of
    // another rope dim has other weights too).
    let r4 = RopeCosSinCache::shared(&q, &cfg.rope, 4, 64).unwrap();
    let r8 = RopeCosSinCache::shared(&q, &cfg.rope, 8, 64).unwrap();
    assert!(r4.same_buffer(base.rope_cos_sin_cache()));
    assert!(!r8.same_buffer(&r4));
    assert_eq!((r8.rows(), r8.rotary_dim(), r8.bytes()), (64, 8, 64 * 8 * 4));
}

#[test]
fn dropping_one_layer_keeps_the_other_layers_cos_sin_cache_valid() {
    let q = cpu_queue();
    let theta = 10003.0;
    let (cfg, w) = layer(theta, DType::F32);
    let (rows, dim) = (cfg.max_position_embeddings, cfg.dims.qk_rope_head_dim);
    assert!(RopeCosSinCache::find(q.device(), &cfg.rope, dim, rows).is_none(), "no layer holds it yet");
    let a = MlaWeightStore::from_host(&q, &cfg, &w).unwrap();
    let b = MlaWeightStore::from_host(&q, &cfg, &w).unwrap();
    let before = run(&q, &cfg, &b);
    let addr = cache_addr(&b);
    drop(a);
    assert_eq!(b.rope_cos_sin_cache().holders(), 1);
    // Fresh allocations of the cache's size, poisoned: had the cache been freed with layer
    // a, one of them would likely land on it.
    let poison: Vec<Buffer> = (0..8).map(|_| Buffer::nan(&q, DType::F32, &[rows, dim]).unwrap()).collect();
    assert_eq!(cache_addr(&b), addr, "the cache did not move");
    assert_cache_holds(&q, &b, &cfg);
    assert_eq!(run(&q, &cfg, &b), before, "layer b's output is unchanged, bit for bit");

    // A layer loaded now joins b's cache; once every holder is gone the registry keeps
    // nothing alive and the next load builds a new one.
    let c = MlaWeightStore::from_host(&q, &cfg, &w).unwrap();
    assert_eq!(cache_addr(&c), addr);
    drop((b, c));
    assert!(RopeCosSinCache::find(q.device(), &cfg.rope, dim, rows).is_none(), "freed with its last layer");
    drop(poison);
    let d = MlaWeightStore::from_host(&q, &cfg, &w).unwrap();
    assert_eq!(d.rope_cos_sin_cache().holders(), 1);
    assert_cache_holds(&q, &d, &cfg);
    assert!(RopeCosSinCache::find(q.device(), &cfg.rope, dim, rows)
        .is_some_and(|f| f.same_buffer(d.rope_cos_sin_cache())));
}

/// The shared cache holds exactly what each layer used to build for itself: a block reading
/// it gives, bit for bit, the output of the same block reading a private copy.
#[test]
fn a_shared_cos_sin_cache_gives_the_outputs_of_a_private_one_bit_for_bit() {
    let q = cpu_queue();
    for (theta, yarn) in [(10004.0, None), (10005.0, Some(YarnScaling::with_defaults(4.0, 16)))] {
        let (mut cfg, w) = layer(theta, DType::F32);
        cfg.rope.yarn = yarn;
        let a = MlaWeightStore::from_host(&q, &cfg, &w).unwrap();
        let b = MlaWeightStore::from_host(&q, &cfg, &w).unwrap();
        assert!(a.rope_cos_sin_cache().same_buffer(b.rope_cos_sin_cache()));
        let private = cfg
            .rope
            .cos_sin_cache_buffer(&q, cfg.dims.qk_rope_head_dim, cfg.max_position_embeddings)
            .unwrap();
        let mut views = b.views();
        views.rope_cos_sin_cache = Some(private.view());
        let own = run_block(&q, &cfg, &MlaBlock::new(cfg.dims, views, cfg.rope.is_neox).unwrap());
        assert_eq!(run(&q, &cfg, &a), own);
        assert_eq!(run(&q, &cfg, &b), own);
    }
}

/// Layers loaded on several threads at once (as TP ranks or a parallel loader do) still end
/// up on one buffer.
#[test]
fn concurrent_loaders_of_equal_rope_params_share_one_cos_sin_cache() {
    let q = cpu_queue();
    let (cfg, w) = layer(10006.0, DType::F32);
    let stores: Vec<MlaWeightStore> = std::thread::scope(|s| {
        let handles: Vec<_> =
            (0..8).map(|_| s.spawn(|| MlaWeightStore::from_host(&q, &cfg, &w).unwrap())).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let addr = cache_addr(&stores[0]);
    assert!(stores.iter().all(|s| cache_addr(s) == addr));
    assert_eq!(stores[0].rope_cos_sin_cache().holders(), 8);
}

/// A cache that cannot be built is the loader's error, as before sharing (the bound is
/// checked before anything is allocated or registered).
#[test]
fn an_oversized_cos_sin_cache_is_refused_before_it_is_registered() {
    let q = cpu_queue();
    let rope = YarnRopeParams::plain(10007.0);
    let rows = mla_block::MAX_COS_SIN_CACHE_BYTES / (4 * 4) + 1;
    let e = RopeCosSinCache::shared(&q, &rope, 4, rows).unwrap_err().to_string();
    assert!(e.contains("max_position_embeddings") && e.contains("past the bound"), "{e}");
    assert!(RopeCosSinCache::find(q.device(), &rope, 4, rows).is_none());
}
