//! Shared by the integration tests: the golden cases and the comparison metric.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use mla_block::runner::{run_schedule, run_steps, RunOptions, RunStats, Schedule, SeqPart};
use mla_block::tp::RandomLayerSpec;
use mla_block::{
    HostTensor, HostWeights, MlaBatchMetadata, MlaBlock, MlaConfig, MlaLimits, MlaWeightStore, MlaWorkspace,
    PagedKvCache, StepSeq, DEFAULT_LAYER_PREFIX,
};
use rand::Rng;
use safetensors::SafeTensors;
use vt_core::{Buffer, DType, Device, Queue};

/// `tests/golden` of the workspace, found from this crate's manifest directory.
pub fn golden_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

/// The golden case directories, or `None` (with a loud message) if the goldens have not
/// landed yet. Once `tests/golden` exists, a missing case is a failure, not a skip.
pub fn golden_case(name: &str) -> Option<PathBuf> {
    let root = golden_root();
    if !root.is_dir() {
        eprintln!("\n!!!!! SKIPPED: {} does not exist yet, golden tests did not run !!!!!\n", root.display());
        return None;
    }
    let dir = root.join(name);
    assert!(dir.join("config.json").is_file(), "golden case {} is missing its config.json", dir.display());
    Some(dir)
}

/// The checkpoint fixtures of the workspace (`tests/fixtures/checkpoints`).
pub fn checkpoint_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/checkpoints")
}

/// Golden case `name`'s fp8 checkpoint fixture: its directory and its config.
pub fn fp8_fixture(name: &str) -> (PathBuf, MlaConfig) {
    let dir = checkpoint_fixtures().join(name).join("fp8");
    let cfg = MlaConfig::from_file(&dir.join("config.json")).unwrap();
    (dir, cfg)
}

/// The schedules every golden case runs under, for a sequence of `t` tokens:
/// (schedule, block size, chunk workspace rows).
pub fn golden_schedules(t: i64) -> Vec<(String, i64, Option<i64>)> {
    let chunked = if t > 24 {
        format!("prefill:16,prefill:8,prefill:{}", t - 24)
    } else {
        "prefill:16,prefill:8".into()
    };
    let half = t / 2;
    vec![
        // all at once
        (format!("prefill:{t}"), 64, None),
        // chunked prefill: later chunks attend to cached context (one gather chunk) ...
        (chunked.clone(), 16, None),
        // ... and with a 6-row gather workspace, so the context is split into many chunks
        (chunked, 1, Some(6)),
        // prefill then decodes
        (format!("prefill:{half},decode:{}", t - half), 16, None),
        // prefill:1 then decodes
        (format!("prefill:1,decode:{}", t - 1), 1, None),
        // interleaved, with a 4-row workspace
        (format!("prefill:5,decode:3,prefill:9,decode:{}", t - 17), 64, Some(4)),
    ]
}

/// A queue on CUDA device 0, or `None` (with a SKIP message) without one.
pub fn cuda_queue() -> Option<Queue> {
    vt_backends::init();
    match Queue::new(Device::new(vt_core::DeviceType::Cuda, 0)) {
        Ok(q) => Some(q),
        Err(_) => {
            eprintln!("SKIP: no CUDA device");
            None
        }
    }
}

pub fn cpu_queue() -> Queue {
    vt_backends::init();
    Queue::new(Device::CPU).expect("the CPU backend registers")
}

/// The queue the golden tests run on: the CPU, or the device type named by
/// `MLA_TEST_DEVICE` (`cpu`, `cuda`, `hip`) so a GPU backend can be held to the goldens with
/// the same tests.
pub fn test_queue() -> Queue {
    vt_backends::init();
    let kind = match std::env::var("MLA_TEST_DEVICE") {
        Ok(s) => vt_core::DeviceType::parse(&s)
            .unwrap_or_else(|| panic!("MLA_TEST_DEVICE={s:?} is not cpu/cuda/hip")),
        Err(_) => vt_core::DeviceType::Cpu,
    };
    Queue::new(Device::new(kind, 0)).unwrap_or_else(|e| panic!("MLA_TEST_DEVICE: {e}"))
}

pub struct Case {
    pub name: String,
    pub cfg: MlaConfig,
    pub weights: HostWeights,
    pub hidden: HostTensor,
    pub positions: Vec<i64>,
    pub expected: Vec<f64>,
}

impl Case {
    pub fn load(dir: &Path) -> Case {
        let cfg = MlaConfig::from_file(&dir.join("config.json")).unwrap();
        let weights =
            HostWeights::from_file(&dir.join("weights.safetensors"), &cfg.dims, DEFAULT_LAYER_PREFIX, None)
                .unwrap();
        let input = std::fs::read(dir.join("input.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&input).unwrap();
        let hidden = HostTensor::from_safetensors(&st, "hidden_states", "input").unwrap();
        let pos = HostTensor::from_safetensors(&st, "positions", "input").unwrap();
        let positions =
            mla_block::runner::positions_or_default(Some(&pos), hidden.shape[0], hidden.shape[1]).unwrap();
        let exp = std::fs::read(dir.join("expected.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&exp).unwrap();
        let expected = HostTensor::from_safetensors(&st, "out", "expected").unwrap();
        assert_eq!(expected.shape, hidden.shape);
        Case {
            name: dir.file_name().unwrap().to_string_lossy().into_owned(),
            cfg,
            weights,
            hidden,
            positions,
            expected: expected.to_f64(),
        }
    }

    pub fn s(&self) -> i64 {
        self.hidden.shape[0]
    }
    pub fn t(&self) -> i64 {
        self.hidden.shape[1]
    }
    pub fn dtype(&self) -> DType {
        self.hidden.dtype
    }

    /// Relative Frobenius tolerance of the case's dtype (f32 1e-4, bf16/f16 2e-2).
    pub fn tolerance(&self) -> f64 {
        if self.dtype() == DType::F32 {
            1e-4
        } else {
            2e-2
        }
    }

    pub fn store(&self, q: &Queue) -> MlaWeightStore {
        MlaWeightStore::from_host(q, &self.cfg, &self.weights).unwrap()
    }

    pub fn block<'a>(&self, store: &'a MlaWeightStore, fused: Option<bool>) -> MlaBlock<'a> {
        let mut b = MlaBlock::new(self.cfg.dims, store.views(), self.cfg.rope.is_neox).unwrap();
        b.set_fused_norm_rope(fused);
        b
    }

    pub fn run(
        &self,
        q: &Queue,
        block: &MlaBlock<'_>,
        schedule: &str,
        opts: &RunOptions,
    ) -> (HostTensor, RunStats) {
        let sch: Schedule = schedule.parse().unwrap();
        run_schedule(q, block, &self.hidden, &self.positions, &sch, opts)
            .unwrap_or_else(|e| panic!("{} under {schedule}: {e}", self.name))
    }

    pub fn run_steps(
        &self,
        q: &Queue,
        block: &MlaBlock<'_>,
        steps: &[Vec<SeqPart>],
        opts: &RunOptions,
    ) -> HostTensor {
        run_steps(q, block, &self.hidden, &self.positions, steps, opts).unwrap().0
    }

    /// ||out - expected|| / ||expected||.
    pub fn rel_err(&self, out: &HostTensor) -> f64 {
        rel_frobenius(&out.to_f64(), &self.expected)
    }
}

pub fn rel_frobenius(out: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len());
    let (mut num, mut den) = (0.0, 0.0);
    for (a, b) in out.iter().zip(reference) {
        num += (a - b) * (a - b);
        den += b * b;
    }
    // NaN anywhere (an unwritten element) must fail, so do not let it compare as "small".
    if num.is_nan() {
        return f64::INFINITY;
    }
    (num / den).sqrt()
}

pub const CASES: [&str; 5] = [
    "qlora_yarn_interleave_f32",
    "qlora_yarn_neox_bf16",
    "v2lite_yarn_f32",
    "v2lite_noyarn_bf16",
    "qlora_yarn_mscale_f32",
];

/// A small random block that needs no golden files: H 16, N 2, Q 8 (or the q_proj branch),
/// L 8, P 4, R 4, V 4, plain rope, max_position_embeddings 64.
pub fn synthetic_config_json(q_lora: bool) -> String {
    format!(
        r#"{{"hidden_size": 16, "num_attention_heads": 2, "q_lora_rank": {}, "kv_lora_rank": 8,
            "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 64, "rope_theta": 10000.0, "rope_scaling": null}}"#,
        if q_lora { "8" } else { "null" }
    )
}

pub fn synthetic(q_lora: bool, dtype: DType) -> (MlaConfig, HostWeights) {
    use rand::{Rng, SeedableRng};
    let cfg = MlaConfig::from_json_str(&synthetic_config_json(q_lora)).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let tensors = mla_block::hf_weight_shapes(&cfg.dims)
        .into_iter()
        .map(|(name, shape)| {
            let n: i64 = shape.iter().product();
            let vals: Vec<f64> = (0..n).map(|_| rng.gen_range(-0.5..0.5)).collect();
            (name, HostTensor { dtype, shape, bytes: vt_core::encode_f64(dtype, &vals) })
        })
        .collect();
    (cfg, HostWeights { dtype, tensors })
}

/// Safetensors bytes of `tensors` (names as given).
pub fn safetensors_bytes(tensors: &[(String, HostTensor)]) -> Vec<u8> {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, t)| {
            let dt = match t.dtype {
                DType::BF16 => Dtype::BF16,
                DType::F16 => Dtype::F16,
                DType::F32 => Dtype::F32,
                DType::I32 => Dtype::I32,
                DType::I64 => Dtype::I64,
                DType::F8E4M3 => Dtype::F8_E4M3,
                DType::Fp8DsMla => Dtype::U8,
            };
            let shape = t.shape.iter().map(|&d| d as usize).collect();
            (n.clone(), TensorView::new(dt, shape, &t.bytes).unwrap())
        })
        .collect();
    safetensors::serialize(views, &None).unwrap()
}

/// The synthetic weights as a checkpoint under `prefix`.
pub fn synthetic_checkpoint(w: &HostWeights, prefix: &str) -> Vec<(String, HostTensor)> {
    w.tensors.iter().map(|(n, t)| (format!("{prefix}{n}.weight"), t.clone())).collect()
}

/// `name` in this test process's scratch directory.
pub fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vt-mla-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The `out` tensor of a safetensors file (what `vt-mla run` writes).
pub fn read_out(path: &Path) -> HostTensor {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    HostTensor::from_safetensors(&st, "out", "out").unwrap()
}

/// One to three random edits of `seed`: bit flips, byte overwrites with JSON / number
/// characters, truncation, growth, another safetensors header length, a digit run replaced by
/// a number whose products wrap, a copied span spliced in elsewhere.
pub fn mutate(rng: &mut impl Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..rng.gen_range(1..4) {
        match rng.gen_range(0..7) {
            0 if !b.is_empty() => {
                let i = rng.gen_range(0..b.len());
                b[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !b.is_empty() => {
                let i = rng.gen_range(0..b.len());
                b[i] =
                    *[0u8, 0xff, b'9', b'-', b'"', b'{', b'[', b'.'].get(rng.gen_range(0..8)).unwrap_or(&0);
            }
            2 => b.truncate(rng.gen_range(0..=b.len())),
            3 => b.extend((0..rng.gen_range(1..64)).map(|_| rng.gen::<u8>())),
            4 if b.len() >= 8 => {
                // Another header length.
                let n: u64 =
                    *[0u64, 1, 7, u64::MAX, 1 << 40, b.len() as u64].get(rng.gen_range(0..6)).unwrap_or(&0);
                b[..8].copy_from_slice(&n.to_le_bytes());
            }
            5 => {
                // A digit run replaced by a number whose products wrap.
                if let Some(i) = (0..b.len())
                    .map(|_| rng.gen_range(0..b.len().max(1)))
                    .find(|&i| b.get(i).is_some_and(u8::is_ascii_digit))
                {
                    let big = [
                        "9223372036854775807",
                        "4611686018427387904",
                        "18446744073709551615",
                        "0",
                        "-1",
                        "1e308",
                    ];
                    let j = (i..b.len()).find(|&j| !b[j].is_ascii_digit()).unwrap_or(b.len());
                    let rep = big[rng.gen_range(0..big.len())].as_bytes().to_vec();
                    b.splice(i..j, rep);
                }
            }
            _ => {
                let i = rng.gen_range(0..=b.len());
                let j = rng.gen_range(i..=b.len());
                let chunk: Vec<u8> = b[i..j].to_vec();
                let k = rng.gen_range(0..=b.len());
                b.splice(k..k, chunk);
            }
        }
    }
    b
}

/// What [`capture_and_replay_decode_step`] leaves for its caller's accuracy checks.
pub struct ReplayedDecodeStep {
    /// Tokens of every sequence prefilled before the three decode steps (`T - 3`).
    pub pre: i64,
    /// The paged cache's block size.
    pub block_size: i64,
    /// The graph's output for token `pre + 2`, `[S, H]` bytes.
    pub replayed: Vec<u8>,
    /// The output buffer, holding the direct run of that step (equal to `replayed`).
    pub out: Buffer,
    s: i64,
    t: i64,
    h: i64,
}

impl ReplayedDecodeStep {
    /// Token `pre + 2`'s rows of every sequence, `[S, H]`, out of a whole `[S, T, H]` output.
    pub fn step_rows(&self, all: &[f64]) -> Vec<f64> {
        let (s, t, h, pre) = (self.s, self.t, self.h, self.pre);
        (0..s)
            .flat_map(|seq| {
                let at = ((seq * t + pre + 2) * h) as usize;
                all[at..at + h as usize].to_vec()
            })
            .collect()
    }
}

/// The golden decode step under a CUDA graph, shared by `cuda_graph.rs` (float cache) and
/// `cuda_graph_fp8.rs` (fp8_ds_mla cache), which differ only in the cache's dtype and in what
/// they check the replay against. Prefills `T - 3` tokens of every sequence, warms up on
/// token `T - 3`, captures token `T - 2`'s `launch` (replay = direct run, bit for bit), then
/// replays it for token `T - 1` after `prepare` uploads new metadata (= a direct run, bit for
/// bit, and no workspace allocation after the warm-up). `what` names the step in the panic
/// when it cannot be captured.
pub fn capture_and_replay_decode_step(
    q: &Queue,
    case: &Case,
    block: &MlaBlock<'_>,
    cache_dtype: DType,
    what: &str,
) -> ReplayedDecodeStep {
    let name = &case.name;
    let (s, t, h) = (case.s(), case.t(), case.hidden.shape[2]);
    let dt = case.dtype();
    let hidden = case.hidden.to_f64();
    // Rows of token `tok` of every sequence, [S, H].
    let rows = |tok: i64| -> Buffer {
        let mut v = Vec::with_capacity((s * h) as usize);
        for seq in 0..s {
            let at = ((seq * t + tok) * h) as usize;
            v.extend_from_slice(&hidden[at..at + h as usize]);
        }
        Buffer::from_f64(q, dt, &[s, h], &v).unwrap()
    };
    let bs = 16;
    let blocks_per_seq = (t + bs - 1) / bs;
    let mut cache =
        PagedKvCache::new(q, cache_dtype, s * blocks_per_seq, bs, block.dims().cache_row_dim()).unwrap();
    let mut ws = MlaWorkspace::new(MlaLimits {
        max_tokens: s * t,
        max_seqs: s,
        max_blocks_per_seq: blocks_per_seq,
        chunk_workspace_tokens: s * t,
    })
    .unwrap();
    let ids: Vec<_> = (0..s).map(|_| cache.add_sequence()).collect();
    let pos =
        |seq: i64, from: i64, to: i64| &case.positions[(seq * t + from) as usize..(seq * t + to) as usize];
    let mut meta = MlaBatchMetadata::default();

    // Prefill all but the last 3 tokens of every sequence, one sequence per step.
    let pre = t - 3;
    for seq in 0..s {
        let steps = [StepSeq { seq: ids[seq as usize], positions: pos(seq, 0, pre), decode: false }];
        meta.plan(&mut cache, &steps, s * t).unwrap();
        let at = (seq * t * h) as usize;
        let x = Buffer::from_f64(q, dt, &[pre, h], &hidden[at..at + (pre * h) as usize]).unwrap();
        let y = Buffer::nan(q, dt, &[pre, h]).unwrap();
        block.forward(q, &mut ws, &x.view(), &meta, &cache.view(), &y.view()).unwrap();
    }
    let decode_step = |tok: i64, cache: &mut PagedKvCache, meta: &mut MlaBatchMetadata| {
        let steps: Vec<_> = (0..s)
            .map(|seq| StepSeq { seq: ids[seq as usize], positions: pos(seq, tok, tok + 1), decode: true })
            .collect();
        meta.plan(cache, &steps, s * t).unwrap();
    };
    let out = Buffer::nan(q, dt, &[s, h]).unwrap();

    // Warm-up decode (token pre): modules compiled, decode partials allocated.
    let x0 = rows(pre);
    decode_step(pre, &mut cache, &mut meta);
    block.prepare(q, &mut ws, &meta).unwrap();
    block.launch(q, &ws, &x0.view(), &meta, &cache.view(), &out.view()).unwrap();
    let allocations = ws.allocations();

    // Token pre+1: direct run, then the same step captured and replayed (the replay writes
    // token pre+1's cache rows again, the same bytes).
    let x1 = rows(pre + 1);
    decode_step(pre + 1, &mut cache, &mut meta);
    block.prepare(q, &mut ws, &meta).unwrap();
    block.launch(q, &ws, &x1.view(), &meta, &cache.view(), &out.view()).unwrap();
    let direct1 = out.to_bytes(q).unwrap();
    let graph =
        vt_cuda::graph::capture(q, || block.launch(q, &ws, &x1.view(), &meta, &cache.view(), &out.view()))
            .unwrap_or_else(|e| panic!("{name}: the {what} is not capturable: {e}"));
    out.fill_pattern(q, dt.nan_bytes()).unwrap();
    graph.launch().unwrap();
    assert_eq!(out.to_bytes(q).unwrap(), direct1, "{name}: graph replay differs from the direct run");

    // Token pre+2: new metadata uploaded in place by `prepare`, then only the graph runs;
    // then the same step directly.
    let x2 = rows(pre + 2);
    decode_step(pre + 2, &mut cache, &mut meta);
    block.prepare(q, &mut ws, &meta).unwrap();
    // The graph reads x1's buffer: feed it token pre+2's rows.
    x1.write_bytes(q, &x2.to_bytes(q).unwrap()).unwrap();
    out.fill_pattern(q, dt.nan_bytes()).unwrap();
    graph.launch().unwrap();
    let replayed = out.to_bytes(q).unwrap();
    block.launch(q, &ws, &x2.view(), &meta, &cache.view(), &out.view()).unwrap();
    assert_eq!(
        replayed,
        out.to_bytes(q).unwrap(),
        "{name}: replay with new metadata differs from a direct run"
    );
    assert_eq!(ws.allocations(), allocations, "{name}: decode steps allocated after warm-up");
    ReplayedDecodeStep { pre, block_size: bs, replayed, out, s, t, h }
}

/// A layer with DeepSeek's block-aligned widths, small elsewhere: hidden 256, 4 heads, q_lora
/// 128, kv_lora 512, nope 128, rope 64, v 128 (every weight can stay fp8, the absorbed ones
/// included).
pub const ALIGNED: RandomLayerSpec = RandomLayerSpec {
    hidden_size: 256,
    num_heads: 4,
    q_lora_rank: 128,
    kv_lora_rank: 512,
    qk_nope_head_dim: 128,
    qk_rope_head_dim: 64,
    v_head_dim: 128,
    max_position_embeddings: 4096,
    indexer: None,
};

/// Runs the schedule `sch` through a block over `store` (block size 16, 8-token chunk
/// workspace); `fused` overrides the fused norm+rope path (`None`: the block's default).
pub fn run_store_schedule(
    q: &Queue,
    cfg: &MlaConfig,
    store: &MlaWeightStore,
    hidden: &HostTensor,
    pos: &[i64],
    sch: &str,
    fused: Option<bool>,
) -> HostTensor {
    let mut block = MlaBlock::new(cfg.dims, store.views(), cfg.rope.is_neox).unwrap();
    block.set_fused_norm_rope(fused);
    let sch: Schedule = sch.parse().unwrap();
    let opts = RunOptions { block_size: 16, chunk_workspace_tokens: Some(8) };
    run_schedule(q, &block, hidden, pos, &sch, &opts).unwrap().0
}
