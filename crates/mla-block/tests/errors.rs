//! Every validation of the block, its weights, its config, its cache and its metadata is a
//! clear error naming what is wrong (never a panic, never a silently wrong answer).

mod common;

use common::{cpu_queue, safetensors_bytes, synthetic, synthetic_checkpoint, synthetic_config_json};
use mla_block::runner::{run_schedule, RunOptions, Schedule};
use mla_block::{
    HostTensor, HostWeights, MlaBatchMetadata, MlaBlock, MlaBlockDims, MlaConfig, MlaLimits, MlaWeightStore,
    MlaWorkspace, PagedKvCache, StepSeq, YarnRopeParams, DEFAULT_LAYER_PREFIX,
};
use vt_core::{Buffer, DType};

fn err_of<T>(r: vt_core::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn assert_err<T>(r: vt_core::Result<T>, needles: &[&str]) {
    let msg = err_of(r);
    for n in needles {
        assert!(msg.contains(n), "error {msg:?} does not mention {n:?}");
    }
}

fn dims() -> MlaBlockDims {
    MlaBlockDims::new(16, 2, 8, 8, 4, 4, 4, 1e-6, &YarnRopeParams::plain(10000.0)).unwrap()
}

// ---------------------------------------------------------------- dims

#[test]
fn dims_reject_every_zero_dimension_by_name() {
    let rope = YarnRopeParams::plain(10000.0);
    let names =
        ["hidden_size", "num_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"];
    for (i, name) in names.iter().enumerate() {
        let mut v = [16, 2, 8, 4, 4, 4];
        v[i] = 0;
        let r = MlaBlockDims::new(v[0], v[1], 8, v[2], v[3], v[4], v[5], 1e-6, &rope);
        assert_err(r, &["MlaBlockDims", name, "> 0"]);
    }
}

#[test]
fn dims_reject_negative_q_lora_rank() {
    let r = MlaBlockDims::new(16, 2, -1, 8, 4, 4, 4, 1e-6, &YarnRopeParams::plain(1e4));
    assert_err(r, &["q_lora_rank", ">= 0"]);
}

#[test]
fn dims_reject_odd_rope_dim() {
    let r = MlaBlockDims::new(16, 2, 8, 8, 4, 3, 4, 1e-6, &YarnRopeParams::plain(1e4));
    assert_err(r, &["qk_rope_head_dim", "even"]);
}

#[test]
fn dims_reject_v_head_dim_wider_than_qk_head_dim() {
    let r = MlaBlockDims::new(16, 2, 8, 8, 4, 4, 9, 1e-6, &YarnRopeParams::plain(1e4));
    assert_err(r, &["v_head_dim", "qk_head_dim"]);
}

#[test]
fn dims_reject_a_scale_not_set_through_the_attention_scale_function() {
    let d = MlaBlockDims { scale: 0.0, ..dims() };
    assert_err(d.validate(), &["scale", "mla_attention_scale"]);
}

#[test]
fn dims_reject_bad_eps() {
    let r = MlaBlockDims::new(16, 2, 8, 8, 4, 4, 4, 0.0, &YarnRopeParams::plain(1e4));
    assert_err(r, &["rms_norm_eps"]);
}

// ---------------------------------------------------------------- weights (views)

#[test]
fn a_missing_weight_is_named_for_each_branch() {
    let q = cpu_queue();
    for q_lora in [true, false] {
        let (cfg, host) = synthetic(q_lora, DType::F32);
        let store = MlaWeightStore::from_host(&q, &cfg, &host).unwrap();
        let full = store.views();
        assert!(MlaBlock::new(cfg.dims, full, false).is_ok());
        let branch = if q_lora { "q_lora" } else { "q_proj" };
        let mut required =
            vec!["kv_a_layernorm", "kv_b_proj", "w_uk_t", "w_uv", "o_proj", "rope_cos_sin_cache"];
        if q_lora {
            required.extend(["fused_qkv_a_proj", "q_a_layernorm", "q_b_proj"]);
        } else {
            required.extend(["q_proj", "kv_a_proj_with_mqa"]);
        }
        for name in required {
            let mut w = full;
            match name {
                "fused_qkv_a_proj" => w.fused_qkv_a_proj = None,
                "q_a_layernorm" => w.q_a_layernorm = None,
                "q_b_proj" => w.q_b_proj = None,
                "q_proj" => w.q_proj = None,
                "kv_a_proj_with_mqa" => w.kv_a_proj_with_mqa = None,
                "kv_a_layernorm" => w.kv_a_layernorm = None,
                "kv_b_proj" => w.kv_b_proj = None,
                "w_uk_t" => w.w_uk_t = None,
                "w_uv" => w.w_uv = None,
                "o_proj" => w.o_proj = None,
                "rope_cos_sin_cache" => w.rope_cos_sin_cache = None,
                _ => unreachable!(),
            }
            let msg = err_of(MlaBlock::new(cfg.dims, w, false));
            assert!(msg.contains(name), "{branch}: {msg:?} does not name {name}");
            if name != "rope_cos_sin_cache" {
                assert!(msg.contains(branch), "{msg:?} does not name the {branch} branch");
            }
        }
    }
}

#[test]
fn a_misshaped_or_mistyped_weight_is_named() {
    let q = cpu_queue();
    let (cfg, host) = synthetic(true, DType::F32);
    let store = MlaWeightStore::from_host(&q, &cfg, &host).unwrap();
    let mut w = store.views();
    w.kv_b_proj = w.fused_qkv_a_proj;
    assert_err(MlaBlock::new(cfg.dims, w, false), &["kv_b_proj", "shape"]);
    let bf = Buffer::zeros(&q, DType::BF16, &[8]).unwrap();
    let mut w = store.views();
    w.kv_a_layernorm = Some(bf.view());
    assert_err(MlaBlock::new(cfg.dims, w, false), &["kv_a_layernorm", "dtype"]);
    let c16 = Buffer::zeros(&q, DType::F16, &[64, 4]).unwrap();
    let mut w = store.views();
    w.rope_cos_sin_cache = Some(c16.view());
    assert_err(MlaBlock::new(cfg.dims, w, false), &["rope_cos_sin_cache", "f32"]);
}

// ---------------------------------------------------------------- loading

#[test]
fn a_missing_checkpoint_tensor_is_named_with_its_full_name() {
    let (cfg, host) = synthetic(true, DType::BF16);
    let mut ck = synthetic_checkpoint(&host, DEFAULT_LAYER_PREFIX);
    ck.retain(|(n, _)| !n.ends_with("q_b_proj.weight"));
    let bytes = safetensors_bytes(&ck);
    let r =
        HostWeights::from_safetensors_bytes(&bytes, &cfg.dims, DEFAULT_LAYER_PREFIX, None, "w.safetensors");
    assert_err(
        r,
        &["w.safetensors", "missing tensor `model.layers.0.self_attn.q_b_proj.weight`", "q_lora_rank set"],
    );
    // The q_proj branch needs q_proj, which a q_lora checkpoint does not have.
    let (cfg2, _) = synthetic(false, DType::BF16);
    let all = safetensors_bytes(&synthetic_checkpoint(&host, DEFAULT_LAYER_PREFIX));
    let r = HostWeights::from_safetensors_bytes(&all, &cfg2.dims, DEFAULT_LAYER_PREFIX, None, "w");
    assert_err(r, &["missing tensor `model.layers.0.self_attn.q_proj.weight`", "q_lora_rank null"]);
}

#[test]
fn a_wrong_layer_prefix_reports_the_tensor_it_looked_for() {
    let (cfg, host) = synthetic(false, DType::F32);
    let bytes = safetensors_bytes(&synthetic_checkpoint(&host, DEFAULT_LAYER_PREFIX));
    let r = HostWeights::from_safetensors_bytes(&bytes, &cfg.dims, "model.layers.3.self_attn.", None, "w");
    assert_err(r, &["model.layers.3.self_attn."]);
}

#[test]
fn a_misshaped_checkpoint_tensor_is_named_with_both_shapes() {
    let (cfg, host) = synthetic(true, DType::F32);
    let mut ck = synthetic_checkpoint(&host, DEFAULT_LAYER_PREFIX);
    for (n, t) in ck.iter_mut() {
        if n.ends_with("o_proj.weight") {
            t.shape = vec![8, 16];
        }
    }
    let bytes = safetensors_bytes(&ck);
    let r = HostWeights::from_safetensors_bytes(&bytes, &cfg.dims, DEFAULT_LAYER_PREFIX, None, "w");
    assert_err(r, &["o_proj.weight", "[8, 16]", "[16, 8]"]);
}

#[test]
fn an_unsupported_checkpoint_dtype_is_named() {
    let (cfg, host) = synthetic(true, DType::F32);
    let mut ck = synthetic_checkpoint(&host, DEFAULT_LAYER_PREFIX);
    for (n, t) in ck.iter_mut() {
        if n.ends_with("kv_b_proj.weight") {
            t.dtype = DType::I32;
        }
    }
    let bytes = safetensors_bytes(&ck);
    let r = HostWeights::from_safetensors_bytes(&bytes, &cfg.dims, DEFAULT_LAYER_PREFIX, None, "w");
    assert_err(r, &["kv_b_proj.weight", "i32"]);
    let r =
        HostWeights::from_safetensors_bytes(b"not safetensors", &cfg.dims, DEFAULT_LAYER_PREFIX, None, "w");
    assert_err(r, &["not a safetensors file"]);
}

// ---------------------------------------------------------------- config

fn with(key: &str, value: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&synthetic_config_json(true)).unwrap();
    v[key] = serde_json::from_str(value).unwrap();
    v.to_string()
}

fn without(key: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&synthetic_config_json(true)).unwrap();
    v.as_object_mut().unwrap().remove(key);
    v.to_string()
}

#[test]
fn config_missing_or_mistyped_fields_are_named() {
    for key in [
        "hidden_size",
        "num_attention_heads",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
    ] {
        assert_err(MlaConfig::from_json_str(&without(key)), &["config.json", key, "missing"]);
    }
    assert_err(MlaConfig::from_json_str(&with("kv_lora_rank", "8.5")), &["kv_lora_rank", "integer"]);
    assert_err(MlaConfig::from_json_str(&with("q_lora_rank", "\"big\"")), &["q_lora_rank", "integer"]);
    assert_err(MlaConfig::from_json_str("[1, 2]"), &["config.json", "object"]);
    assert_err(MlaConfig::from_json_str("{"), &["config.json", "JSON"]);
}

#[test]
fn config_unsupported_values_are_named() {
    let linear = with("rope_scaling", r#"{"type": "linear", "factor": 2.0}"#);
    assert_err(MlaConfig::from_json_str(&linear), &["rope_scaling.rope_type", "linear"]);
    let llama3 = with("rope_parameters", r#"{"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}"#);
    assert_err(MlaConfig::from_json_str(&llama3), &["rope_parameters.rope_type", "llama3"]);
    assert_err(MlaConfig::from_json_str(&with("rope_interleave", "null")), &["rope_interleave", "null"]);
    assert_err(MlaConfig::from_json_str(&with("rope_interleave", "1")), &["rope_interleave"]);
    // fp8 with 128x128 block scales loads (dequantized); other quantizations are refused.
    let fp8 = with("quantization_config", r#"{"quant_method": "fp8", "weight_block_size": [128, 128]}"#);
    assert_eq!(MlaConfig::from_json_str(&fp8).map(|c| c.fp8_weight_block).ok(), Some(Some([128, 128])));
    let gptq = with("quantization_config", r#"{"quant_method": "gptq", "bits": 4}"#);
    assert_err(MlaConfig::from_json_str(&gptq), &["quantization_config.quant_method", "gptq"]);
    assert_err(MlaConfig::from_json_str(&with("attention_bias", "true")), &["attention_bias"]);
    let no_factor = with("rope_scaling", r#"{"type": "yarn", "original_max_position_embeddings": 4}"#);
    assert_err(MlaConfig::from_json_str(&no_factor), &["rope_scaling.factor", "missing"]);
    let explicit = with("rope_scaling", r#"{"type": "yarn", "factor": 4.0, "attention_factor": 1.5}"#);
    assert_err(MlaConfig::from_json_str(&explicit), &["rope_scaling.attention_factor"]);
    assert_err(MlaConfig::from_json_str(&with("rope_scaling", "3")), &["rope_scaling"]);
    // Invalid dims inside a valid config surface the dims' own errors.
    assert_err(MlaConfig::from_json_str(&with("qk_rope_head_dim", "5")), &["qk_rope_head_dim", "even"]);
    assert_err(MlaConfig::from_json_str(&with("max_position_embeddings", "0")), &["max_position_embeddings"]);
}

// ---------------------------------------------------------------- cache and planning

#[test]
fn running_out_of_blocks_is_an_error_that_changes_nothing() {
    let q = cpu_queue();
    let mut cache = PagedKvCache::new(&q, DType::F32, 3, 4, 12).unwrap();
    let (a, b) = (cache.add_sequence(), cache.add_sequence());
    let mut slots = Vec::new();
    cache.append(a, 6, &mut slots).unwrap();
    assert_eq!(slots, vec![0, 1, 2, 3, 4, 5], "blocks 0 and 1, in order");
    assert_eq!(cache.free_blocks(), 1);
    assert_err(cache.append(b, 5, &mut slots), &["out of KV cache blocks", "needs 2"]);
    assert_eq!((cache.free_blocks(), cache.seq_len(b).unwrap(), slots.len()), (1, 0, 6));
    // A whole step that does not fit is refused before any sequence takes a block.
    let pos = [0i64; 5];
    let mut meta = MlaBatchMetadata::default();
    let seqs = [
        StepSeq { seq: a, positions: &pos[..2], decode: false },
        StepSeq { seq: b, positions: &pos, decode: false },
    ];
    assert_err(meta.plan(&mut cache, &seqs, 16), &["out of KV cache blocks", "the step needs 2"]);
    assert_eq!((cache.seq_len(a).unwrap(), cache.seq_len(b).unwrap(), cache.free_blocks()), (6, 0, 1));
    // Freeing returns the blocks.
    cache.free_sequence(a).unwrap();
    assert_eq!(cache.free_blocks(), 3);
    assert_err(cache.seq_len(a), &["does not exist"]);
    assert_err(PagedKvCache::new(&q, DType::F32, 0, 4, 12), &["num_blocks"]);
    assert_err(PagedKvCache::new(&q, DType::I32, 1, 4, 12), &["dtype"]);
}

#[test]
fn plan_rejects_malformed_steps() {
    let q = cpu_queue();
    let mut cache = PagedKvCache::new(&q, DType::F32, 8, 4, 12).unwrap();
    let (a, b) = (cache.add_sequence(), cache.add_sequence());
    let pos = [0i64, 1, 2];
    let mut meta = MlaBatchMetadata::default();
    let pf = |seq, n: usize| StepSeq { seq, positions: &pos[..n], decode: false };
    let dc = |seq, n: usize| StepSeq { seq, positions: &pos[..n], decode: true };
    assert_err(meta.plan(&mut cache, &[pf(a, 1), dc(b, 1)], 8), &["decode entry 1 follows a prefill"]);
    assert_err(meta.plan(&mut cache, &[dc(a, 2)], 8), &["exactly 1"]);
    assert_err(meta.plan(&mut cache, &[pf(a, 0)], 8), &["no tokens"]);
    assert_err(meta.plan(&mut cache, &[pf(a, 1), pf(a, 1)], 8), &["appears twice"]);
    meta.plan(&mut cache, &[pf(a, 3), pf(b, 3)], 8).unwrap();
    assert!(meta.chunks.is_empty());
    assert_err(
        meta.plan(&mut cache, &[pf(a, 1), pf(b, 1)], 1),
        &["chunk_workspace_tokens", "2 prefill sequences"],
    );
    assert_eq!(cache.seq_len(a).unwrap(), 3, "a refused plan takes no tokens");
    // With 4 rows for 2 sequences of 3 cached tokens: 2 positions each per chunk, 2 chunks.
    meta.plan(&mut cache, &[pf(a, 1), pf(b, 1)], 4).unwrap();
    assert_eq!(meta.chunks.len(), 2);
    assert_eq!(meta.chunks[0].cu_seq_lens, vec![0, 2, 4]);
    assert_eq!(meta.chunks[1].cu_seq_lens, vec![0, 1, 2]);
    assert_eq!(meta.chunks[1].seq_starts, vec![2, 2]);
}

// ---------------------------------------------------------------- metadata and forward

struct Rig {
    q: vt_core::Queue,
    cfg: MlaConfig,
    store: MlaWeightStore,
}

fn rig() -> Rig {
    let q = cpu_queue();
    let (cfg, host) = synthetic(true, DType::F32);
    let store = MlaWeightStore::from_host(&q, &cfg, &host).unwrap();
    Rig { q, cfg, store }
}

/// Plans one prefill of `n` tokens at `positions`, then lets `corrupt` damage the metadata,
/// and returns the forward's result.
fn forward_with(
    rig: &Rig,
    n: usize,
    positions: &[i64],
    corrupt: impl Fn(&mut MlaBatchMetadata),
) -> vt_core::Result<()> {
    let block = MlaBlock::new(rig.cfg.dims, rig.store.views(), false).unwrap();
    let mut cache = PagedKvCache::new(&rig.q, DType::F32, 4, 4, 12).unwrap();
    let a = cache.add_sequence();
    let mut meta = MlaBatchMetadata::default();
    meta.plan(&mut cache, &[StepSeq { seq: a, positions: &positions[..n], decode: false }], 16).unwrap();
    corrupt(&mut meta);
    let x = Buffer::zeros(&rig.q, DType::F32, &[n as i64, 16]).unwrap();
    let y = Buffer::zeros(&rig.q, DType::F32, &[n as i64, 16]).unwrap();
    let mut ws = MlaWorkspace::new(MlaLimits::default()).unwrap();
    block.forward(&rig.q, &mut ws, &x.view(), &meta, &cache.view(), &y.view())
}

#[test]
fn positions_past_the_cos_sin_cache_are_an_error() {
    let r = rig();
    assert!(forward_with(&r, 3, &[0, 1, 63], |_| {}).is_ok());
    assert_err(forward_with(&r, 3, &[0, 1, 64], |_| {}), &["positions[2] = 64", "max_position_embeddings"]);
    assert_err(forward_with(&r, 3, &[-1, 1, 2], |_| {}), &["positions[0] = -1"]);
}

#[test]
fn inconsistent_metadata_is_rejected_before_any_op_runs() {
    let r = rig();
    let pos = [0i64, 1, 2, 3, 4];
    assert_err(forward_with(&r, 5, &pos, |m| m.slot_mapping[1] = 16), &["slot_mapping[1] = 16"]);
    assert_err(forward_with(&r, 5, &pos, |m| m.prefill_block_table[1] = 9), &["prefill_block_table", "= 9"]);
    assert_err(forward_with(&r, 5, &pos, |m| m.prefill_cu_seqlens_q = vec![0, 4]), &["prefill_cu_seqlens_q"]);
    assert_err(forward_with(&r, 5, &pos, |m| m.max_query_len = 2), &["max_query_len"]);
    assert_err(forward_with(&r, 5, &pos, |m| m.num_decode_tokens = 6), &["num_decode_tokens"]);
    assert_err(forward_with(&r, 5, &pos, |m| m.num_decode_tokens = 1), &["decode_seq_lens"]);
    assert_err(forward_with(&r, 5, &pos, |m| m.positions.pop().map(|_| ()).unwrap_or(())), &["positions"]);
    // Context that the chunks do not tile exactly.
    assert_err(forward_with(&r, 5, &pos, |m| m.prefill_context_lens = vec![2]), &["chunks", "cover 0"]);
    assert_err(
        forward_with(&r, 5, &pos, |m| {
            m.prefill_context_lens = vec![2];
            m.chunks = vec![mla_block::ContextChunk { cu_seq_lens: vec![0, 2], seq_starts: vec![1] }];
        }),
        &["chunk 0 gives sequence 0 positions 1..3"],
    );
}

#[test]
fn forward_rejects_mismatched_tensors() {
    let r = rig();
    let block = MlaBlock::new(r.cfg.dims, r.store.views(), false).unwrap();
    let mut cache = PagedKvCache::new(&r.q, DType::F32, 4, 4, 12).unwrap();
    let a = cache.add_sequence();
    let mut meta = MlaBatchMetadata::default();
    meta.plan(&mut cache, &[StepSeq { seq: a, positions: &[0, 1], decode: false }], 16).unwrap();
    let mut ws = MlaWorkspace::new(MlaLimits::default()).unwrap();
    let x = Buffer::zeros(&r.q, DType::F32, &[2, 16]).unwrap();
    let x16 = Buffer::zeros(&r.q, DType::F16, &[2, 16]).unwrap();
    let wide = Buffer::zeros(&r.q, DType::F32, &[2, 17]).unwrap();
    let y = Buffer::zeros(&r.q, DType::F32, &[2, 16]).unwrap();
    let y3 = Buffer::zeros(&r.q, DType::F32, &[3, 16]).unwrap();
    let bad_cache = Buffer::zeros(&r.q, DType::F32, &[4, 4, 11]).unwrap();
    let kv = cache.view();
    assert_err(
        block.forward(&r.q, &mut ws, &x16.view(), &meta, &kv, &y.view()),
        &["MlaBlock", "hidden", "f16"],
    );
    assert_err(block.forward(&r.q, &mut ws, &wide.view(), &meta, &kv, &y.view()), &["hidden", "[2, 17]"]);
    assert_err(block.forward(&r.q, &mut ws, &x.view(), &meta, &kv, &y3.view()), &["out", "3 rows"]);
    assert_err(block.forward(&r.q, &mut ws, &x.view(), &meta, &bad_cache.view(), &y.view()), &["kv_cache"]);
    assert_err(MlaWorkspace::new(MlaLimits { max_tokens: 0, ..MlaLimits::default() }), &["max_tokens"]);
    block.forward(&r.q, &mut ws, &x.view(), &meta, &kv, &y.view()).unwrap();
}

// ---------------------------------------------------------------- schedules

#[test]
fn a_schedule_that_does_not_sum_to_t_is_an_error() {
    let q = cpu_queue();
    let (cfg, host) = synthetic(false, DType::F32);
    let store = MlaWeightStore::from_host(&q, &cfg, &host).unwrap();
    let block = MlaBlock::new(cfg.dims, store.views(), false).unwrap();
    let hidden = HostTensor { dtype: DType::F32, shape: vec![1, 6, 16], bytes: vec![0; 6 * 16 * 4] };
    let pos: Vec<i64> = (0..6).collect();
    let sch: Schedule = "prefill:4,decode:1".parse().unwrap();
    assert_err(
        run_schedule(&q, &block, &hidden, &pos, &sch, &RunOptions::default()),
        &["covers 5 tokens", "has 6"],
    );
    let sch: Schedule = "prefill:4,decode:2".parse().unwrap();
    assert!(run_schedule(&q, &block, &hidden, &pos, &sch, &RunOptions::default()).is_ok());
    for bad in ["prefill", "prefill:x", "prefill:0", "decode:-1", "warmup:3", ""] {
        assert_err(bad.parse::<Schedule>(), &["schedule"]);
    }
    assert_eq!("prefill:16, decode:8".parse::<Schedule>().unwrap().to_string(), "prefill:16,decode:8");
}

// ---------------------------------------------------------------- DeepSeek-V3.2

/// The indexer's dims, weights and cache are checked by name: a zero or too narrow indexer
/// dim, the q_proj branch, each missing indexer weight, a wrong-shaped one, and a cache whose
/// rows lack the indexer key (or are fp8_ds_mla).
#[test]
fn v32_indexer_dims_weights_and_cache_errors_are_named() {
    use mla_block::tp::RandomLayerSpec;
    use mla_block::IndexerDims;
    let ix = IndexerDims { n_heads: 2, head_dim: 8, topk: 4 };
    for (bad, name) in [
        (IndexerDims { n_heads: 0, ..ix }, "index_n_heads"),
        (IndexerDims { head_dim: 0, ..ix }, "index_head_dim"),
        (IndexerDims { topk: 0, ..ix }, "index_topk"),
        (IndexerDims { head_dim: 2, ..ix }, "index_head_dim"),
    ] {
        assert_err(dims().with_indexer(bad), &["MlaBlockDims", name]);
    }
    let q_proj = MlaBlockDims::new(16, 2, 0, 8, 4, 4, 4, 1e-6, &YarnRopeParams::plain(1e4)).unwrap();
    assert_err(q_proj.with_indexer(ix), &["q_lora_rank"]);

    let q = cpu_queue();
    let (cfg, w) = RandomLayerSpec::SMALL_V32.layer(DType::F32, 3).unwrap();
    for name in
        ["indexer.wq_b", "indexer.wk", "indexer.k_norm", "indexer.k_norm.bias", "indexer.weights_proj"]
    {
        let mut missing = w.clone();
        missing.tensors.retain(|(n, _)| *n != name);
        assert_err(MlaWeightStore::from_host(&q, &cfg, &missing), &[name, "missing"]);
        let mut misshaped = w.clone();
        for (n, t) in misshaped.tensors.iter_mut() {
            if *n == name {
                let len = t.shape[0] + 1;
                t.shape[0] = len;
                t.bytes = vec![0; (t.numel() as usize) * 4];
            }
        }
        assert_err(MlaWeightStore::from_host(&q, &cfg, &misshaped), &[name]);
    }
    // A block whose views lack an indexer weight (a store built for the dense dims).
    let mut dense_cfg = cfg;
    dense_cfg.dims.indexer = None;
    let dense_store = MlaWeightStore::from_host(&q, &dense_cfg, &w).unwrap();
    assert_err(MlaBlock::new(cfg.dims, dense_store.views(), false), &["indexer.wq_b", "not set"]);

    // The cache: rows of L+R only (no indexer key), and an fp8_ds_mla cache.
    let store = MlaWeightStore::from_host(&q, &cfg, &w).unwrap();
    let block = MlaBlock::new(cfg.dims, store.views(), false).unwrap();
    let mut cache = PagedKvCache::new(&q, DType::F32, 4, 4, cfg.dims.latent_row_dim()).unwrap();
    let id = cache.add_sequence();
    let mut meta = MlaBatchMetadata::default();
    meta.plan(&mut cache, &[StepSeq { seq: id, positions: &[0, 1], decode: false }], 16).unwrap();
    let x = Buffer::from_f64(&q, DType::F32, &[2, 128], &vec![0.5; 256]).unwrap();
    let y = Buffer::nan(&q, DType::F32, &[2, 128]).unwrap();
    let mut ws = MlaWorkspace::new(MlaLimits::default()).unwrap();
    assert_err(
        block.forward(&q, &mut ws, &x.view(), &meta, &cache.view(), &y.view()),
        &["kv_cache", "L+R+Di", "indexer key"],
    );
    let hidden = HostTensor {
        dtype: DType::F32,
        shape: vec![1, 2, 128],
        bytes: vt_core::encode_f64(DType::F32, &[0.5; 256]),
    };
    let r = mla_block::runner::run_schedule_with_cache(
        &q,
        &block,
        &hidden,
        &[0, 1],
        &Schedule::all_at_once(2),
        &RunOptions::default(),
        mla_block::KvCacheDtype::Fp8DsMla,
        &|_, _| {},
    );
    assert_err(r, &["kv_cache_dtype", "indexer"]);
}
