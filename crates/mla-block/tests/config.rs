//! Hugging Face config.json parsing: both rope forms, the rotation style, the q branch, and
//! the YaRN numbers (softmax scale with mscale^2, rotation mscale of the cos/sin cache).

mod common;

use mla_block::{yarn_get_mscale, MlaConfig};

const LEGACY: &str = r#"{
  "hidden_size": 7168, "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-06,
  "max_position_embeddings": 163840, "rope_theta": 10000,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"}
}"#;

const PARAMETERS: &str = r#"{
  "hidden_size": 7168, "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-06,
  "max_position_embeddings": 163840,
  "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "beta_fast": 32, "beta_slow": 1, "factor": 40.0,
                      "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}
}"#;

#[test]
fn legacy_rope_scaling_and_rope_parameters_forms_parse_to_the_same_block() {
    let a = MlaConfig::from_json_str(LEGACY).unwrap();
    let b = MlaConfig::from_json_str(PARAMETERS).unwrap();
    assert_eq!(a, b);
    let c =
        MlaConfig::from_json_str(&LEGACY.replace("\"type\": \"yarn\"", "\"rope_type\": \"yarn\"")).unwrap();
    assert_eq!(a, c);
    let y = a.rope.yarn.unwrap();
    assert_eq!(
        (y.factor, y.original_max_position_embeddings, y.mscale, y.mscale_all_dim),
        (40.0, 4096, 1.0, 1.0)
    );
    assert_eq!(
        (a.dims.q_lora_rank, a.dims.kv_lora_rank, a.dims.qk_head_dim(), a.max_position_embeddings),
        (1536, 512, 192, 163840)
    );
    // DeepSeek-V3: scale = 192^-0.5 * (1 + 0.1 ln 40)^2; rotation mscale 1 (mscale == mscale_all_dim).
    let m = 1.0 + 0.1 * 40f64.ln();
    assert!((a.dims.scale as f64 - 192f64.powf(-0.5) * m * m).abs() < 1e-7, "{}", a.dims.scale);
    assert_eq!(a.rope.rotation_mscale(), 1.0);
}

#[test]
fn rope_interleave_absent_or_true_means_gptj_pairs_and_false_means_neox() {
    assert!(!MlaConfig::from_json_str(LEGACY).unwrap().rope.is_neox);
    let t = LEGACY.replace("\"rope_theta\": 10000,", "\"rope_theta\": 10000, \"rope_interleave\": true,");
    assert!(!MlaConfig::from_json_str(&t).unwrap().rope.is_neox);
    let f = LEGACY.replace("\"rope_theta\": 10000,", "\"rope_theta\": 10000, \"rope_interleave\": false,");
    assert!(MlaConfig::from_json_str(&f).unwrap().rope.is_neox);
}

#[test]
fn q_lora_rank_null_or_absent_selects_the_q_proj_branch() {
    let null = LEGACY.replace("\"q_lora_rank\": 1536", "\"q_lora_rank\": null");
    let d = MlaConfig::from_json_str(&null).unwrap().dims;
    assert_eq!(d.q_lora_rank, 0);
    assert!(!d.has_q_lora());
    let absent = LEGACY.replace("\"q_lora_rank\": 1536,", "");
    assert_eq!(MlaConfig::from_json_str(&absent).unwrap().dims.q_lora_rank, 0);
}

#[test]
fn no_rope_scaling_means_plain_rope_and_an_unscaled_softmax() {
    let plain = LEGACY.split("\"rope_scaling\"").next().unwrap().to_string() + "\"rope_scaling\": null}";
    let c = MlaConfig::from_json_str(&plain).unwrap();
    assert!(c.rope.yarn.is_none());
    assert_eq!(c.dims.scale, (192f64.powf(-0.5)) as f32);
    let default = PARAMETERS.replace("\"rope_type\": \"yarn\"", "\"rope_type\": \"default\"");
    let c = MlaConfig::from_json_str(&default).unwrap();
    assert!(c.rope.yarn.is_none() && c.rope.base == 10000.0);
    // Without any rope keys: theta 10000.
    assert_eq!(MlaConfig::from_json_str(&common::synthetic_config_json(true)).unwrap().rope.base, 10000.0);
}

/// The goldens' softmax scales and rotation mscales as transformers computed them
/// (tests/golden/README.md, cross-check table).
#[test]
fn golden_configs_give_transformers_scales() {
    let cases = [
        ("qlora_yarn_interleave_f32", 0.25794002, 1.0, false),
        ("qlora_yarn_neox_bf16", 0.23257571, 1.0, true),
        ("v2lite_yarn_f32", 0.22617696, 1.0, false),
        ("v2lite_noyarn_bf16", 0.20412415, 1.0, false),
        ("qlora_yarn_mscale_f32", 0.27046756, 0.92104236, true),
    ];
    for (name, scale, rot, neox) in cases {
        let Some(dir) = common::golden_case(name) else { return };
        let c = MlaConfig::from_file(&dir.join("config.json")).unwrap();
        assert!((c.dims.scale as f64 - scale).abs() < 1e-7, "{name}: scale {} vs {scale}", c.dims.scale);
        assert!(
            (c.rope.rotation_mscale() - rot).abs() < 1e-8,
            "{name}: rotation mscale {}",
            c.rope.rotation_mscale()
        );
        assert_eq!(c.rope.is_neox, neox, "{name}");
    }
}

/// Where one of mscale / mscale_all_dim is absent, the block follows the seed, vLLM and
/// DeepSeek's own modeling code (defaults mscale 1, mscale_all_dim 0), not transformers
/// (which then uses 1 + 0.1 ln factor); docs/mla.md records the difference.
#[test]
fn absent_mscale_keys_take_the_seed_defaults() {
    let with = |extra: &str| {
        let json = format!(
            r#"{{"hidden_size": 16, "num_attention_heads": 2, "q_lora_rank": null, "kv_lora_rank": 8,
                "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4, "max_position_embeddings": 2560,
                "rope_parameters": {{"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                     "original_max_position_embeddings": 64 {extra}}}}}"#
        );
        MlaConfig::from_json_str(&json).unwrap()
    };
    let m40 = |m: f64| yarn_get_mscale(40.0, m);
    let a = with(r#", "mscale_all_dim": 1.0"#);
    assert!((a.rope.rotation_mscale() - 1.0 / m40(1.0) * m40(1.0)).abs() < 1e-15);
    assert!((a.dims.scale as f64 - 8f64.powf(-0.5) * m40(1.0) * m40(1.0)).abs() < 1e-7);
    let b = with(r#", "mscale": 0.707"#);
    assert!((b.rope.rotation_mscale() - 1.260804).abs() < 1e-6, "{}", b.rope.rotation_mscale());
    assert!((b.dims.scale as f64 - 8f64.powf(-0.5)).abs() < 1e-7, "no mscale_all_dim: no softmax correction");
    let c = with("");
    assert!((c.rope.rotation_mscale() - 1.368888).abs() < 1e-6, "both absent agrees with transformers");
}
