//! The released `config.json` of every MLA model on the hub (fixtures in
//! `tests/fixtures/configs`, see its README for which values were verified where) parses into
//! the dims, rope and YaRN settings of the model's modeling code, or is refused with a message
//! naming what the block lacks (issue 14, item 3).

use std::path::Path;

use mla_block::{yarn_get_mscale, MlaConfig};

/// What a released config must parse into.
struct Want {
    file: &'static str,
    /// hidden, heads, q_lora (0: q_proj branch), kv_lora, nope, rope, v.
    dims: [i64; 7],
    eps: f32,
    max_pos: i64,
    /// rope_theta, then YaRN (factor, original max positions, beta_fast, beta_slow, mscale,
    /// mscale_all_dim), GPT-J pairing (DeepSeek's interleave).
    theta: f64,
    yarn: [f64; 6],
    fp8: bool,
}

const fn v3_like(file: &'static str, heads: i64, max_pos: i64, theta: f64, yarn: [f64; 6]) -> Want {
    Want { file, dims: [7168, heads, 1536, 512, 128, 64, 128], eps: 1e-6, max_pos, theta, yarn, fp8: true }
}

const V2_YARN: [f64; 6] = [40.0, 4096.0, 32.0, 1.0, 0.707, 0.707];
const V3_YARN: [f64; 6] = [40.0, 4096.0, 32.0, 1.0, 1.0, 1.0];

const PARSED: [Want; 8] = [
    Want {
        file: "deepseek-v2-lite.json",
        dims: [2048, 16, 0, 512, 128, 64, 128],
        eps: 1e-6,
        max_pos: 163840,
        theta: 10000.0,
        yarn: V2_YARN,
        fp8: false,
    },
    Want {
        file: "deepseek-v2.json",
        dims: [5120, 128, 1536, 512, 128, 64, 128],
        eps: 1e-6,
        max_pos: 163840,
        theta: 10000.0,
        yarn: V2_YARN,
        fp8: false,
    },
    Want {
        file: "deepseek-v2.5.json",
        dims: [5120, 128, 1536, 512, 128, 64, 128],
        eps: 1e-6,
        max_pos: 163840,
        theta: 10000.0,
        // V2.5 ships mscale 1.0 / mscale_all_dim 1.0 (V3's values), unlike V2's 0.707.
        yarn: V3_YARN,
        fp8: false,
    },
    v3_like("deepseek-v3.json", 128, 163840, 10000.0, V3_YARN),
    v3_like("deepseek-r1.json", 128, 163840, 10000.0, V3_YARN),
    v3_like("deepseek-v3.1.json", 128, 163840, 10000.0, V3_YARN),
    v3_like("kimi-k2-instruct.json", 64, 131072, 50000.0, [32.0, 4096.0, 1.0, 1.0, 1.0, 1.0]),
    // Its indexer is checked in `deepseek_v32_parses_its_indexer`.
    v3_like("deepseek-v3.2-exp.json", 128, 163840, 10000.0, V3_YARN),
];

/// (file, words the refusal must contain).
const REFUSED: [(&str, &[&str]); 1] = [("minicpm3-4b.json", &["rope_scaling.rope_type", "longrope"])];

fn fixture(file: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configs").join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn released_configs_parse_into_their_modeling_codes_dims_and_yarn() {
    for w in &PARSED {
        let c = MlaConfig::from_json_str(&fixture(w.file)).unwrap_or_else(|e| panic!("{}: {e}", w.file));
        let d = c.dims;
        let got = [
            d.hidden_size,
            d.num_heads,
            d.q_lora_rank,
            d.kv_lora_rank,
            d.qk_nope_head_dim,
            d.qk_rope_head_dim,
            d.v_head_dim,
        ];
        assert_eq!(got, w.dims, "{}: dims", w.file);
        assert_eq!(d.rms_norm_eps, w.eps, "{}", w.file);
        assert_eq!(c.max_position_embeddings, w.max_pos, "{}", w.file);
        assert_eq!(c.rope.base, w.theta, "{}", w.file);
        assert!(!c.rope.is_neox, "{}: DeepSeek's rope is interleaved (GPT-J pairs)", w.file);
        let y = c.rope.yarn.unwrap_or_else(|| panic!("{}: YaRN expected", w.file));
        let got = [
            y.factor,
            y.original_max_position_embeddings as f64,
            y.beta_fast,
            y.beta_slow,
            y.mscale,
            y.mscale_all_dim,
        ];
        assert_eq!(got, w.yarn, "{}: YaRN", w.file);
        assert_eq!((y.attn_factor, y.extrapolation_factor, y.truncate), (1.0, 1.0, true), "{}", w.file);
        // Softmax scale as DeepSeek's modeling code: (P+R)^-0.5 * yarn_get_mscale(f, mscale_all_dim)^2.
        let m = yarn_get_mscale(y.factor, y.mscale_all_dim);
        let want = (d.qk_head_dim() as f64).powf(-0.5) * m * m;
        assert!(((d.scale as f64) - want).abs() <= 1e-6 * want, "{}: scale {} vs {want}", w.file, d.scale);
        assert_eq!(c.fp8_weight_block, w.fp8.then_some([128, 128]), "{}: quantization", w.file);
    }
}

#[test]
fn released_configs_of_features_the_block_lacks_are_refused_by_name() {
    for (file, words) in REFUSED {
        let e = MlaConfig::from_json_str(&fixture(file)).expect_err(file).to_string();
        for w in words {
            assert!(e.contains(w), "{file}: `{e}` does not mention `{w}`");
        }
    }
}

/// DeepSeek-V3.2-Exp's indexer (64 heads of 128, top 2048), its cache row (latent 576 +
/// indexer key 128), and the refusals around it: the index fields on another model type,
/// V3.2 without q_lora, with a non-interleaved main rope, or with an indexer head narrower
/// than the rope dim.
#[test]
fn deepseek_v32_parses_its_indexer() {
    let text = fixture("deepseek-v3.2-exp.json");
    let c = MlaConfig::from_json_str(&text).unwrap();
    let ix = c.dims.indexer.expect("deepseek_v32 has an indexer");
    assert_eq!((ix.n_heads, ix.head_dim, ix.topk), (64, 128, 2048));
    assert!(c.dims.is_sparse());
    assert_eq!((c.dims.latent_row_dim(), c.dims.cache_row_dim()), (576, 704));
    let base: serde_json::Value = serde_json::from_str(&text).unwrap();
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = base.clone();
        f(&mut v);
        MlaConfig::from_json_str(&v.to_string()).expect_err("must be refused").to_string()
    };
    let cases: [(&str, String); 5] = [
        ("model_type", edit(&|v| v["model_type"] = "deepseek_v3".into())),
        ("q_lora_rank", edit(&|v| v["q_lora_rank"] = serde_json::Value::Null)),
        ("rope_interleave", edit(&|v| v["rope_interleave"] = false.into())),
        ("index_head_dim", edit(&|v| v["index_head_dim"] = 32.into())),
        ("index_topk", edit(&|v| drop(v.as_object_mut().unwrap().remove("index_topk")))),
    ];
    for (word, e) in cases {
        assert!(e.contains(word), "`{e}` does not name `{word}`");
    }
}

#[test]
fn minicpm3_without_longrope_derives_v_head_dim_and_rotates_halves() {
    // MiniCPM3 has no v_head_dim (hidden / heads) and rotates halves; with a plain rope its
    // dims parse (the real config is refused for longrope above).
    let mut v: serde_json::Value = serde_json::from_str(&fixture("minicpm3-4b.json")).unwrap();
    v["rope_scaling"] = serde_json::Value::Null;
    let c = MlaConfig::from_json_str(&v.to_string()).unwrap();
    assert_eq!((c.dims.v_head_dim, c.dims.q_lora_rank, c.dims.kv_lora_rank), (64, 768, 256));
    assert!(c.rope.is_neox);
    assert_eq!(c.dims.rms_norm_eps, 1e-5);
}

#[test]
fn quantization_configs_other_than_fp8_128x128_blocks_are_refused_by_key() {
    let base: serde_json::Value = serde_json::from_str(&fixture("deepseek-v3.json")).unwrap();
    let cases: [(&str, &[&str]); 7] = [
        (r#"{"quant_method": "awq", "bits": 4}"#, &["quantization_config.quant_method", "awq"]),
        (
            r#"{"quant_method": "compressed-tensors", "format": "pack-quantized"}"#,
            &["quant_method", "compressed-tensors"],
        ),
        (r#"{"quant_method": "fp8", "fmt": "e4m3"}"#, &["weight_block_size", "per-tensor"]),
        (r#"{"quant_method": "fp8", "weight_block_size": [64, 64]}"#, &["weight_block_size", "[64, 64]"]),
        (
            r#"{"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}"#,
            &["quantization_config.fmt", "e5m2"],
        ),
        (
            r#"{"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}"#,
            &["activation_scheme", "static"],
        ),
        (
            r#"{"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}"#,
            &["quantization_config.modules_to_not_convert"],
        ),
    ];
    for (q, words) in cases {
        let mut v = base.clone();
        v["quantization_config"] = serde_json::from_str(q).unwrap();
        let e = MlaConfig::from_json_str(&v.to_string()).expect_err(q).to_string();
        for w in words {
            assert!(e.contains(w), "{q}: `{e}` does not mention `{w}`");
        }
    }
}
