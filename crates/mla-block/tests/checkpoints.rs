//! Checkpoints as published (issue 14): sharded with an index, fp8 with 128x128 block
//! scales, memory-mapped. The fixtures in `tests/fixtures/checkpoints` come from
//! `tools/fixtures/checkpoints.py golden` (numpy only): per golden a 3-shard copy with a decoy
//! layer 1 (the same tensors halved), and an fp8 copy with `dequantized.safetensors`, the
//! script's own dequantization in the golden's dtype.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use mla_block::checkpoint::{e4m3fn_table, e4m3fn_to_f32, RawTensor, WeightSource, FP8_BLOCK};
use mla_block::runner::{run_schedule, RunOptions, Schedule};
use mla_block::{layer_prefix, Checkpoint, HostTensor, HostWeights, MlaBlock, MlaConfig, MlaWeightStore};
use safetensors::tensor::TensorView;
use safetensors::Dtype as StDtype;
use vt_core::{DType, Queue};

/// `out` of `case`'s input under `schedule` through the weights `store`.
fn run(q: &Queue, case: &Case, cfg: &MlaConfig, store: &MlaWeightStore, schedule: &str) -> HostTensor {
    let block = MlaBlock::new(cfg.dims, store.views(), cfg.rope.is_neox).unwrap();
    let sch: Schedule = schedule.parse().unwrap();
    let opts = RunOptions { block_size: 16, chunk_workspace_tokens: Some(8) };
    run_schedule(q, &block, &case.hidden, &case.positions, &sch, &opts).unwrap().0
}

fn schedule(case: &Case) -> String {
    let t = case.t();
    format!("prefill:5,decode:3,prefill:9,decode:{}", t - 17)
}

/// Every view's bytes, by name.
fn store_bytes(q: &Queue, s: &MlaWeightStore) -> Vec<(&'static str, Vec<u8>)> {
    let v = s.views();
    [
        ("fused_qkv_a_proj", v.fused_qkv_a_proj),
        ("q_a_layernorm", v.q_a_layernorm),
        ("q_b_proj", v.q_b_proj),
        ("q_proj", v.q_proj),
        ("kv_a_proj_with_mqa", v.kv_a_proj_with_mqa),
        ("kv_a_layernorm", v.kv_a_layernorm),
        ("kv_b_proj", v.kv_b_proj),
        ("w_uk_t", v.w_uk_t),
        ("w_uv", v.w_uv),
        ("o_proj", v.o_proj),
        ("rope_cos_sin_cache", v.rope_cos_sin_cache),
    ]
    .into_iter()
    .filter_map(|(n, t)| t.map(|t| (n, q.read_bytes(&t).unwrap())))
    .collect()
}

#[test]
fn a_sharded_checkpoint_reproduces_the_single_file_bit_for_bit() {
    let q = test_queue();
    for name in CASES {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        let single =
            MlaWeightStore::load(&q, &case.cfg, &dir.join("weights.safetensors"), &layer_prefix(0), None)
                .unwrap();
        let sharded_dir = checkpoint_fixtures().join(name).join("sharded");
        // The directory, and the index file itself.
        for path in [sharded_dir.clone(), sharded_dir.join("model.safetensors.index.json")] {
            let ckpt = Checkpoint::open(&path).unwrap();
            assert_eq!(ckpt.num_files(), 3, "{name}");
            let sharded =
                MlaWeightStore::from_checkpoint(&q, &case.cfg, &ckpt, &layer_prefix(0), None).unwrap();
            assert_eq!(store_bytes(&q, &sharded), store_bytes(&q, &single), "{name}: weights");
            let sch = schedule(&case);
            let a = run(&q, &case, &case.cfg, &single, &sch);
            let b = run(&q, &case, &case.cfg, &sharded, &sch);
            assert_eq!(a.bytes, b.bytes, "{name}: sharded output differs from the single file's");
            assert!(case.rel_err(&b) <= case.tolerance(), "{name}: {}", case.rel_err(&b));
        }
        // Layer 1 is the decoy: the same tensors halved, so another block.
        let ckpt = Checkpoint::open(&sharded_dir).unwrap();
        let l1 = HostWeights::from_checkpoint(&ckpt, &case.cfg.dims, &layer_prefix(1), None).unwrap();
        let l0 = HostWeights::from_checkpoint(&ckpt, &case.cfg.dims, &layer_prefix(0), None).unwrap();
        for ((n, a), (_, b)) in l0.tensors.iter().zip(&l1.tensors) {
            let half: Vec<f64> = a.to_f64().iter().map(|v| v * 0.5).collect();
            assert_eq!(b.to_f64(), half, "{name}: layer 1's {n}");
        }
        let missing =
            HostWeights::from_checkpoint(&ckpt, &case.cfg.dims, &layer_prefix(7), None).unwrap_err();
        assert!(missing.to_string().contains("missing tensor `model.layers.7.self_attn."), "{missing}");
    }
}

#[test]
fn streaming_into_device_buffers_equals_loading_through_host_weights() {
    let q = test_queue();
    for name in CASES {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for path in [
                checkpoint_fixtures().join(name).join("sharded"),
                checkpoint_fixtures().join(name).join("fp8/weights.safetensors"),
            ] {
                let sub = path.display().to_string();
                let ckpt = Checkpoint::open(&path).unwrap();
                let host = HostWeights::from_checkpoint(&ckpt, &case.cfg.dims, &layer_prefix(0), Some(dtype))
                    .unwrap();
                let a = MlaWeightStore::from_host(&q, &case.cfg, &host).unwrap();
                let b = MlaWeightStore::from_checkpoint(&q, &case.cfg, &ckpt, &layer_prefix(0), Some(dtype))
                    .unwrap();
                assert_eq!(store_bytes(&q, &a), store_bytes(&q, &b), "{name} {sub} {dtype}");
                assert_eq!(a.device_bytes(), b.device_bytes());
            }
        }
    }
}

/// fp8 vs transformers on the unquantized weights (transformers was not run on the fp8
/// weights): quantization error, not arithmetic; measured 5.6e-2..7.1e-2 on the goldens.
const FP8_TOLERANCE: f64 = 0.1;

#[test]
fn an_fp8_checkpoint_matches_the_block_on_its_dequantized_weights_bit_for_bit() {
    let q = test_queue();
    let mut worst: f64 = 0.0;
    for name in CASES {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        let (fp8_dir, cfg) = fp8_fixture(name);
        assert_eq!(cfg.fp8_weight_block, Some([128, 128]));
        assert_eq!(cfg.dims, case.cfg.dims);
        let dt = case.dtype();
        let fp8 =
            MlaWeightStore::load(&q, &cfg, &fp8_dir.join("weights.safetensors"), &layer_prefix(0), Some(dt))
                .unwrap();
        let deq = MlaWeightStore::load(
            &q,
            &cfg,
            &fp8_dir.join("dequantized.safetensors"),
            &layer_prefix(0),
            Some(dt),
        )
        .unwrap();
        assert_eq!(store_bytes(&q, &fp8), store_bytes(&q, &deq), "{name}: dequantized weights");
        for sch in [format!("prefill:{}", case.t()), schedule(&case)] {
            let a = run(&q, &case, &cfg, &fp8, &sch);
            let b = run(&q, &case, &cfg, &deq, &sch);
            assert_eq!(a.bytes, b.bytes, "{name} {sch}: fp8 output differs from the dequantized weights'");
            let e = case.rel_err(&a);
            eprintln!("{name} {sch}: fp8 vs transformers (unquantized weights) {e:.3e}");
            assert!(e <= FP8_TOLERANCE, "{name}: {e}");
            worst = worst.max(e);
        }
    }
    eprintln!("worst fp8 error vs transformers: {worst:.3e} (tolerance {FP8_TOLERANCE})");
}

#[test]
fn e4m3fn_decodes_exactly_with_no_infinities() {
    let t = e4m3fn_table();
    assert_eq!(t[0x00], 0.0);
    assert!(t[0x80] == 0.0 && t[0x80].is_sign_negative());
    assert_eq!(t[0x01], 2f32.powi(-9)); // smallest subnormal
    assert_eq!(t[0x07], 7.0 * 2f32.powi(-9)); // largest subnormal
    assert_eq!(t[0x08], 2f32.powi(-6)); // smallest normal
    assert_eq!(t[0x38], 1.0);
    assert_eq!(t[0x78], 256.0); // exponent all ones is still finite in e4m3fn
    assert_eq!(t[0x7e], 448.0); // the largest finite value
    assert_eq!(t[0xfe], -448.0);
    assert!(t[0x7f].is_nan() && t[0xff].is_nan());
    assert_eq!(t.iter().filter(|v| v.is_nan()).count(), 2);
    assert!(t.iter().all(|v| !v.is_infinite()));
    for b in 0..=255u8 {
        let (a, c) = (e4m3fn_to_f32(b), vt_core::f8e4m3_to_f32(b));
        assert!(a == c || (a.is_nan() && c.is_nan()), "0x{b:02x}: {a} vs vt_core's {c}");
        if !a.is_nan() {
            assert_eq!(vt_core::f32_to_f8e4m3(a) & 0x7f, b & 0x7f, "0x{b:02x} round trip");
        }
    }
}

fn st_bytes(tensors: &[(&str, StDtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize(views, &None).unwrap()
}

/// A 300 x 200 fp8 weight: 3 x 2 blocks of 128, the last row and column blocks partial.
fn fp8_weight() -> (Vec<u8>, Vec<f32>) {
    let (rows, cols) = (300usize, 200usize);
    let q: Vec<u8> = (0..rows * cols)
        .map(|i| ((i * 37 + i / 7) % 255) as u8)
        .map(|b| if b & 0x7f == 0x7f { 0x3c } else { b })
        .collect();
    let scales = vec![0.5f32, 2.0, 0.125, 3.0, 1e-3, 7.25];
    (q, scales)
}

#[test]
fn fp8_block_scales_cover_partial_edge_blocks() {
    let (q, scales) = fp8_weight();
    let sb: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
    let bytes = st_bytes(&[
        ("w.weight", StDtype::F8_E4M3, vec![300, 200], q.clone()),
        ("w.weight_scale_inv", StDtype::F32, vec![3, 2], sb),
    ]);
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let file = Path::new("w.safetensors");
    let src = WeightSource::new(
        RawTensor::from_safetensors(&st, "w.weight", file).unwrap(),
        Some(RawTensor::from_safetensors(&st, "w.weight_scale_inv", file).unwrap()),
    )
    .unwrap();
    assert!(src.is_fp8());
    let f32s = src.to_bytes(DType::F32, false).unwrap();
    let bf16 = src.to_bytes(DType::BF16, false).unwrap();
    for r in 0..300 {
        for c in 0..200 {
            let i = r * 200 + c;
            let want = e4m3fn_to_f32(q[i]) * scales[(r / FP8_BLOCK as usize) * 2 + c / FP8_BLOCK as usize];
            let got = f32::from_le_bytes(f32s[4 * i..4 * i + 4].try_into().unwrap());
            assert_eq!(got.to_bits(), want.to_bits(), "[{r}, {c}]");
            let got = half::bf16::from_le_bytes([bf16[2 * i], bf16[2 * i + 1]]);
            assert_eq!(got, half::bf16::from_f32(want), "[{r}, {c}] bf16");
        }
    }
}

#[test]
fn fp8_scale_and_value_errors_name_the_tensor() {
    let (q, scales) = fp8_weight();
    let sb = |s: &[f32]| s.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>();
    let file = Path::new("w.safetensors");
    let check = |tensors: &[(&str, StDtype, Vec<usize>, Vec<u8>)], words: &[&str]| {
        let bytes = st_bytes(tensors);
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let raw = RawTensor::from_safetensors(&st, "w.weight", file).unwrap();
        let scale = RawTensor::from_safetensors(&st, "w.weight_scale_inv", file).ok();
        let e = match WeightSource::new(raw, scale) {
            Err(e) => e.to_string(),
            Ok(s) => s.to_bytes(DType::BF16, false).err().map(|e| e.to_string()).unwrap_or_default(),
        };
        for w in words {
            assert!(e.contains(w), "`{e}` does not mention `{w}`");
        }
    };
    let w = ("w.weight", StDtype::F8_E4M3, vec![300, 200], q.clone());
    check(std::slice::from_ref(&w), &["w.safetensors", "`w.weight`", "fp8", "w.weight_scale_inv"]);
    check(
        &[w.clone(), ("w.weight_scale_inv", StDtype::F32, vec![2, 2], sb(&scales[..4]))],
        &["`w.weight_scale_inv`", "[2, 2]", "[3, 2]", "partial edge blocks"],
    );
    let half_scales: Vec<u8> = scales.iter().flat_map(|s| half::bf16::from_f32(*s).to_le_bytes()).collect();
    check(
        &[w.clone(), ("w.weight_scale_inv", StDtype::BF16, vec![3, 2], half_scales)],
        &["`w.weight_scale_inv`", "F32"],
    );
    let mut bad = scales.clone();
    bad[4] = f32::INFINITY;
    check(
        &[w.clone(), ("w.weight_scale_inv", StDtype::F32, vec![3, 2], sb(&bad))],
        &["`w.weight_scale_inv`", "[2, 0]", "finite"],
    );
    let mut nan = q.clone();
    nan[200 * 130 + 150] = 0xff;
    check(
        &[
            ("w.weight", StDtype::F8_E4M3, vec![300, 200], nan),
            ("w.weight_scale_inv", StDtype::F32, vec![3, 2], sb(&scales)),
        ],
        &["`w.weight`", "fp8 NaN", "0xff", "[130, 150]"],
    );
    check(
        &[
            ("w.weight", StDtype::F8_E4M3, vec![6], vec![1; 6]),
            ("w.weight_scale_inv", StDtype::F32, vec![1], sb(&[1.0])),
        ],
        &["`w.weight`", "2-D"],
    );
    check(
        &[
            ("w.weight", StDtype::F32, vec![2, 2], vec![0; 16]),
            ("w.weight_scale_inv", StDtype::F32, vec![1, 1], sb(&[1.0])),
        ],
        &["`w.weight_scale_inv`", "not fp8"],
    );
}

#[test]
fn checkpoint_paths_and_indexes_that_do_not_hold_are_errors_naming_them() {
    let tmp = std::env::temp_dir().join(format!("vt-ckpt-errors-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let e = Checkpoint::open(&tmp).unwrap_err().to_string();
    assert!(e.contains("model.safetensors.index.json"), "{e}");
    let e = Checkpoint::open(&tmp.join("nope.safetensors")).unwrap_err().to_string();
    assert!(e.contains("nope.safetensors") && e.contains("does not exist"), "{e}");
    let st = st_bytes(&[("a.weight", StDtype::F32, vec![2], vec![0; 8])]);
    std::fs::write(tmp.join("s1.safetensors"), &st).unwrap();
    let index = |map: &str| {
        std::fs::write(
            tmp.join("model.safetensors.index.json"),
            format!(r#"{{"metadata": {{}}, "weight_map": {map}}}"#),
        )
        .unwrap();
        Checkpoint::open(&tmp)
    };
    let ck = index(
        r#"{"a.weight": "s1.safetensors", "b.weight": "s1.safetensors", "c.weight": "s2.safetensors"}"#,
    )
    .unwrap();
    assert_eq!((ck.num_files(), ck.mapped_files()), (2, 0));
    assert_eq!(ck.raw("a.weight").unwrap().shape, vec![2]);
    assert_eq!(ck.mapped_files(), 1, "only the shard holding a.weight is mapped");
    let e = ck.raw("b.weight").unwrap_err().to_string();
    assert!(e.contains("s1.safetensors") && e.contains("`b.weight`") && e.contains("index lists it"), "{e}");
    let e = ck.raw("c.weight").unwrap_err().to_string();
    assert!(e.contains("s2.safetensors") && e.contains("cannot open"), "{e}");
    let e = ck.raw("d.weight").unwrap_err().to_string();
    assert!(e.contains("missing tensor `d.weight`"), "{e}");
    let e = index(r#"{"a.weight": "../s1.safetensors"}"#).unwrap_err().to_string();
    assert!(e.contains("weight_map.a.weight") && e.contains("plain relative path"), "{e}");
    let e = index(r#"[]"#).unwrap_err().to_string();
    assert!(e.contains("weight_map"), "{e}");
    std::fs::write(tmp.join("bad.safetensors"), b"garbage!garbage!").unwrap();
    let e = Checkpoint::open(&tmp.join("bad.safetensors")).unwrap_err().to_string();
    assert!(e.contains("bad.safetensors") && e.contains("safetensors"), "{e}");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A DeepSeek-V3-sized layer from `tools/fixtures/checkpoints.py random-v3 --out DIR`
/// (`VT_V3_LAYER_DIR`; 374 MB, so not in CI): it loads, the store holds what the block
/// keeps, and the sharded / fp8 variants load too when present next to it.
#[test]
#[ignore = "needs a V3-sized layer on disk (VT_V3_LAYER_DIR) and ~1 GB of memory"]
fn a_deepseek_v3_sized_layer_loads() {
    let dir = PathBuf::from(std::env::var("VT_V3_LAYER_DIR").unwrap_or_else(|_| "/tmp/v3layer".into()));
    let q = cpu_queue();
    let cfg = MlaConfig::from_file(&dir.join("config.json")).unwrap();
    let t0 = std::time::Instant::now();
    let store = MlaWeightStore::load(&q, &cfg, &dir, &layer_prefix(0), None).unwrap();
    eprintln!("V3 layer: {:.3} s, {} bytes kept", t0.elapsed().as_secs_f64(), store.device_bytes());
    MlaBlock::new(cfg.dims, store.views(), false).unwrap();
}
