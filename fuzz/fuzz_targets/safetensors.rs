//! Safetensors bytes as a header, an input file and a checkpoint of a small layer: errors
//! or values, never a panic or an abort.
#![no_main]

use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"{"hidden_size": 16, "num_attention_heads": 2, "q_lora_rank": null, "kv_lora_rank": 8,
    "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4, "max_position_embeddings": 64}"#;

fuzz_target!(|data: &[u8]| {
    let _ = mla_block::check_safetensors_header(data, "fuzz");
    let _ = mla_block::loaders::input_from_bytes(data);
    if let Ok(cfg) = mla_block::MlaConfig::from_json_str(CONFIG) {
        let _ = mla_block::loaders::weights_from_bytes(data, &cfg, mla_block::DEFAULT_LAYER_PREFIX);
    }
});
