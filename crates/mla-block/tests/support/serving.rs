//! A small serving loop over [`DecodeGraphs`], shared by `tests/decode_graphs.rs` (CPU) and
//! `tests/cuda_graph.rs` (CUDA): sequences join (prefilled eagerly, together) and leave
//! between decode steps at random (from a seed only, so every queue sees the same
//! schedule and the same block ids), and each decode step runs three ways:
//!
//! - `unpadded`: `layers::forward_layers` with the engine's own metadata (B rows) and its
//!   own workspace, the plain eager step;
//! - `graph`: `DecodeGraphs::prepare` + `run` (a graph replay where the queue captures);
//! - `padded_eager`: `DecodeGraphs::run_eager` of the same prepared step.
//!
//! The three write the same cache rows (in that order, so the graph's values are the ones
//! that stay); the record holds each one's output rows.
#![allow(dead_code)]

use mla_block::layers::forward_layers;
use mla_block::tp::RandomLayerSpec;
use mla_block::{
    DecodeGraphConfig, DecodeGraphs, KvCacheDtype, LayeredKvCache, MlaBatchMetadata, MlaBlock, MlaLimits,
    MlaWeightStore, MlaWorkspace, SeqId, StepMode, StepSeq,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vt_core::{Buffer, DType, Queue};

/// What to serve.
#[derive(Clone, Debug)]
pub struct Serving {
    pub spec: RandomLayerSpec,
    pub dtype: DType,
    pub layers: usize,
    pub buckets: Vec<i64>,
    pub block_size: i64,
    /// Most tokens a sequence reaches (it leaves then).
    pub max_len: i64,
    pub max_prompt: i64,
    pub decode_steps: usize,
    pub seed: u64,
    pub use_graphs: bool,
    /// The cache's dtype (`Fp8DsMla`: the 656-byte rows, for L = 512, R = 64 layers).
    pub kv_cache: KvCacheDtype,
    /// Both decode-step fusions forced on or off in every block (`VT_FUSE_DECODE_QUERY`,
    /// `VT_FUSE_CACHE_WRITE`; `None`: the flags).
    pub fuse: Option<bool>,
}

impl Serving {
    pub fn small(dtype: DType) -> Serving {
        Serving {
            spec: RandomLayerSpec::SMALL,
            dtype,
            layers: 2,
            buckets: vec![1, 2, 4, 8],
            block_size: 4,
            max_len: 40,
            max_prompt: 12,
            decode_steps: 16,
            seed: 7,
            use_graphs: true,
            kv_cache: KvCacheDtype::Auto,
            fuse: None,
        }
    }

    pub fn max_blocks(&self) -> i64 {
        (self.max_len + self.block_size - 1) / self.block_size
    }
}

/// One decode step's outputs, `[B, H]` bytes each.
#[derive(Clone, Debug)]
pub struct StepRecord {
    pub step: usize,
    pub seqs: Vec<SeqId>,
    pub rows: i64,
    pub bucket: i64,
    pub unpadded: Vec<u8>,
    pub graph: Vec<u8>,
    pub padded_eager: Vec<u8>,
}

/// What [`serve`] saw.
#[derive(Debug)]
pub struct Served {
    pub mode: StepMode,
    pub steps: Vec<StepRecord>,
    pub joined: usize,
    pub left: usize,
    pub buckets_used: Vec<i64>,
}

/// Serves `s` on a CUDA queue `gpu`, which must replay graphs, and on the CPU queue `cpu`:
/// the two runs, with the same number of steps.
pub fn serve_on_gpu_and_cpu(gpu: &Queue, cpu: &Queue, s: &Serving) -> (Served, Served) {
    let dt = s.dtype;
    let on_gpu = serve(gpu, s);
    assert_eq!(on_gpu.mode, StepMode::Graph, "{dt}: CUDA must replay graphs");
    let on_cpu = serve(cpu, s);
    assert_eq!(on_gpu.steps.len(), on_cpu.steps.len());
    (on_gpu, on_cpu)
}

/// The checks of every step `g` replayed on a GPU against the CPU's same step `c`: the same
/// sequences, the replay equal to the same padded step run op by op (bit for bit), a finite
/// output. Returns the replay's output and its relative distance to the CPU's.
pub fn check_replay(dt: DType, g: &StepRecord, c: &StepRecord) -> (Vec<f64>, f64) {
    assert_eq!(g.seqs, c.seqs, "{dt} step {}: the schedules differ", g.step);
    assert_eq!(
        g.graph, g.padded_eager,
        "{dt} step {}: graph replay differs from the same padded step run op by op (B = {}, bucket {})",
        g.step, g.rows, g.bucket
    );
    let got = to_f64(dt, &g.graph);
    assert!(got.iter().all(|v| v.is_finite()), "{dt} step {}: non-finite output", g.step);
    let vs_cpu = super::common::rel_frobenius(&got, &to_f64(dt, &c.graph));
    (got, vs_cpu)
}

/// Runs the loop on `q` (see the module docs).
pub fn serve(q: &Queue, s: &Serving) -> Served {
    let dt = s.dtype;
    let stores: Vec<MlaWeightStore> = (0..s.layers)
        .map(|i| {
            let (cfg, w) = s.spec.layer(dt, s.seed.wrapping_add(i as u64)).unwrap();
            MlaWeightStore::from_host(q, &cfg, &w).unwrap()
        })
        .collect();
    let cfg = s.spec.config().unwrap();
    let blocks: Vec<MlaBlock<'_>> = stores
        .iter()
        .map(|st| {
            let mut b = MlaBlock::new(cfg.dims, st.views(), cfg.rope.is_neox).unwrap();
            b.set_fuse_decode_query(s.fuse);
            b.set_fuse_cache_write(s.fuse);
            b
        })
        .collect();
    let d = cfg.dims;
    let h = d.hidden_size;
    let max_live = *s.buckets.last().unwrap();
    let num_blocks = max_live * s.max_blocks();
    let cache_dt = s.kv_cache.resolve(dt).unwrap();
    let mut cache =
        LayeredKvCache::new(q, cache_dt, s.layers as i64, num_blocks, s.block_size, d.cache_row_dim())
            .unwrap();
    let gcfg = DecodeGraphConfig { use_graphs: s.use_graphs, ..DecodeGraphConfig::new(s.max_blocks()) }
        .with_buckets(&s.buckets);
    let mut graphs = DecodeGraphs::new(q, &blocks, &cache, gcfg).unwrap();
    let mode = graphs.mode().clone();

    // The engine's own eager workspace (prefills and the unpadded reference decode).
    let rows = max_live * s.max_prompt;
    let mut ws = MlaWorkspace::new(MlaLimits {
        max_tokens: rows,
        max_seqs: max_live,
        max_blocks_per_seq: s.max_blocks(),
        chunk_workspace_tokens: rows,
    })
    .unwrap();
    let [x, s0, s1, y] = [0; 4].map(|_| Buffer::nan(q, dt, &[rows, h]).unwrap());
    let mut meta = MlaBatchMetadata::default();
    let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
    let mut live: Vec<SeqId> = Vec::new();
    let (mut joined, mut left) = (0, 0);
    let mut buckets_used = Vec::new();
    let mut steps = Vec::new();
    let mut fresh = 1000u64;

    let eager =
        |meta: &MlaBatchMetadata, ws: &mut MlaWorkspace, cache: &LayeredKvCache, bytes: &[u8]| -> Vec<u8> {
            let t = meta.num_tokens();
            let [xv, av, bv, yv] = [&x, &s0, &s1, &y].map(|b| b.view().slice(0, 0, t).unwrap());
            q.write_bytes(&xv, bytes).unwrap();
            forward_layers(q, &blocks, ws, meta, cache, &xv, [&av, &bv], &yv).unwrap();
            q.read_bytes(&yv).unwrap()
        };

    for step in 0..s.decode_steps {
        // Leave: sequences at their last token, and some at random.
        live.retain(|&seq| {
            let len = cache.seq_len(seq).unwrap();
            let go = len >= s.max_len - 1 || rng.gen_bool(0.15);
            if go {
                cache.free_sequence(seq).unwrap();
                left += 1;
            }
            !go
        });
        // Join: a few new sequences, prefilled together in one eager step.
        let mut new: Vec<(SeqId, Vec<i64>)> = Vec::new();
        while (live.len() + new.len()) < max_live as usize && (live.is_empty() || rng.gen_bool(0.4)) {
            let n = rng.gen_range(1..=s.max_prompt);
            new.push((cache.add_sequence(), (0..n).collect()));
            if rng.gen_bool(0.5) {
                break;
            }
        }
        if !new.is_empty() {
            let parts: Vec<StepSeq<'_>> =
                new.iter().map(|(seq, p)| StepSeq { seq: *seq, positions: p, decode: false }).collect();
            meta.plan(&mut cache, &parts, rows).unwrap();
            fresh += 1;
            let hb = s.spec.hidden(1, meta.num_tokens(), dt, fresh).bytes;
            eager(&meta, &mut ws, &cache, &hb);
            joined += new.len();
            live.extend(new.iter().map(|(seq, _)| *seq));
        }
        // Decode: every live sequence, one token each.
        let pos: Vec<[i64; 1]> = live.iter().map(|&seq| [cache.seq_len(seq).unwrap()]).collect();
        let parts: Vec<StepSeq<'_>> =
            live.iter().zip(&pos).map(|(&seq, p)| StepSeq { seq, positions: p, decode: true }).collect();
        meta.plan(&mut cache, &parts, rows).unwrap();
        let b = meta.num_tokens();
        fresh += 1;
        let hb = s.spec.hidden(1, b, dt, fresh).bytes;
        let unpadded = eager(&meta, &mut ws, &cache, &hb);
        assert_eq!(graphs.prepare(&meta).unwrap(), b);
        let (_, bucket) = graphs.prepared_rows().unwrap();
        q.write_bytes(&graphs.input().unwrap(), &hb).unwrap();
        graphs.run(&cache).unwrap();
        let graph = q.read_bytes(&graphs.output().unwrap()).unwrap();
        graphs.run_eager(&cache).unwrap();
        let padded_eager = q.read_bytes(&graphs.output().unwrap()).unwrap();
        if !buckets_used.contains(&bucket) {
            buckets_used.push(bucket);
        }
        steps.push(StepRecord { step, seqs: live.clone(), rows: b, bucket, unpadded, graph, padded_eager });
    }
    drop(graphs);
    Served { mode, steps, joined, left, buckets_used }
}

/// Bytes of `dt` values as f64.
pub fn to_f64(dt: DType, bytes: &[u8]) -> Vec<f64> {
    let es = dt.size_of();
    bytes
        .chunks_exact(es)
        .map(|c| match dt {
            DType::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            other => panic!("not a float dtype: {other}"),
        })
        .collect()
}
