//! Config fields that are valid numbers but absurd sizes: every dimension past its
//! documented bound (`mla_block::MAX_DIM`, `MAX_HEADS`), products of dimensions that size a
//! weight or a per-token buffer past theirs (`MAX_WEIGHT_ELEMENTS`,
//! `MAX_TOKEN_ROW_ELEMENTS`), a `max_position_embeddings` whose cos/sin cache is past
//! `MAX_COS_SIN_CACHE_BYTES`, and DeepSeek-V3.2's `index_topk` past `max_position_embeddings`.
//! Each is an error naming the config field and its value, raised while parsing, before
//! anything is allocated; the values at the bounds are accepted.

mod common;

use common::{cpu_queue, synthetic, synthetic_config_json};
use mla_block::tp::RandomLayerSpec;
use mla_block::{
    MlaBlockDims, MlaConfig, MlaWeightStore, YarnRopeParams, MAX_COS_SIN_CACHE_BYTES, MAX_DIM, MAX_HEADS,
};
use serde_json::Value;
use vt_core::DType;

/// `json` with the top-level `key` set to `value` (JSON text).
fn edit(json: &str, edits: &[(&str, &str)]) -> String {
    let mut v: Value = serde_json::from_str(json).unwrap();
    for (key, value) in edits {
        v[*key] = serde_json::from_str(value).unwrap();
    }
    v.to_string()
}

/// The synthetic dense config (H 16, N 2, Q 8, L 8, P 4, R 4, V 4, 64 positions) edited.
fn dense_with(edits: &[(&str, &str)]) -> String {
    edit(&synthetic_config_json(true), edits)
}

/// The small DeepSeek-V3.2 config (indexer 4 x 32, top 16, 4096 positions) edited.
fn v32_with(edits: &[(&str, &str)]) -> String {
    edit(&RandomLayerSpec::SMALL_V32.config_json(), edits)
}

/// The error of parsing `json`, which must name config.json, the field (as written in the
/// message, in backticks) and every other word of `words`.
fn assert_field_error(json: &str, field: &str, words: &[&str], what: &str) {
    let msg = match MlaConfig::from_json_str(json) {
        Ok(_) => panic!("{what}: accepted"),
        Err(e) => e.to_string(),
    };
    let named = format!("field `{field}`");
    for w in ["config.json", named.as_str()].iter().chain(words) {
        assert!(msg.contains(w), "{what}: `{msg}` does not mention {w:?}");
    }
}

#[test]
fn a_config_with_kv_lora_rank_past_its_bound_is_an_error_naming_the_field() {
    // 1e12, as an integer and as a float: neither overflows i64 in the block's products
    // (4 * 2 * 8 * 1e12), so this used to pass the config and fail later naming a tensor.
    for value in ["1000000000000", "1e12"] {
        let json = dense_with(&[("kv_lora_rank", value)]);
        assert_field_error(&json, "kv_lora_rank", &["1000000000000", "bound", "1048576"], value);
    }
    // Just past the bound and at it.
    let past = (MAX_DIM + 1).to_string();
    assert_field_error(&dense_with(&[("kv_lora_rank", &past)]), "kv_lora_rank", &[&past], "2^20 + 1");
    let at = dense_with(&[("kv_lora_rank", &MAX_DIM.to_string())]);
    assert_eq!(MlaConfig::from_json_str(&at).map(|c| c.dims.kv_lora_rank).ok(), Some(MAX_DIM));
}

#[test]
fn every_dimension_field_past_its_bound_is_an_error_naming_the_field_and_its_value() {
    let wide = 1i64 << 40; // even (a valid rope dim but for its size), far past 2^20
    for field in
        ["hidden_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"]
    {
        for value in [MAX_DIM + 2, wide] {
            let v = value.to_string();
            assert_field_error(&dense_with(&[(field, &v)]), field, &[&v, "bound"], &format!("{field} = {v}"));
        }
    }
    for value in [MAX_HEADS + 1, wide] {
        let v = value.to_string();
        let what = format!("num_attention_heads = {v}");
        assert_field_error(
            &dense_with(&[("num_attention_heads", &v)]),
            "num_attention_heads",
            &[&v, "bound"],
            &what,
        );
    }
    // The dims constructor itself, whatever builds it: the error names the dim.
    let rope = YarnRopeParams::plain(1e4);
    let e = MlaBlockDims::new(16, 2, 8, 1_000_000_000_000, 4, 4, 4, 1e-6, &rope).unwrap_err().to_string();
    assert!(e.contains("MlaBlockDims") && e.contains("kv_lora_rank") && e.contains("1000000000000"), "{e}");
}

#[test]
fn dimensions_within_their_bounds_whose_products_size_a_buffer_past_its_bound_are_errors_naming_the_field() {
    // 65536 heads of 512 + 4 dims: the query row N * (P + R) is 33.8M elements per token
    // (every weight stays within its bound: q_b_proj is that times q_lora_rank 8).
    let n = MAX_HEADS.to_string();
    let json = dense_with(&[("num_attention_heads", &n), ("qk_nope_head_dim", "512")]);
    assert_field_error(
        &json,
        "num_attention_heads",
        &["65536", "elements", "bound", "one token's row"],
        "row",
    );
    // 4096 heads over a hidden size of 2^20: o_proj [2^20, 4096 * 4] is 2^34 elements.
    let json = dense_with(&[("num_attention_heads", "4096"), ("hidden_size", &MAX_DIM.to_string())]);
    assert_field_error(
        &json,
        "num_attention_heads",
        &["o_proj", "4096", "1048576", "elements", "bound"],
        "o_proj",
    );
    // A dim at its bound whose products stay small is accepted.
    let json = dense_with(&[("hidden_size", &MAX_DIM.to_string())]);
    assert_eq!(MlaConfig::from_json_str(&json).map(|c| c.dims.hidden_size).ok(), Some(MAX_DIM));
}

#[test]
fn a_max_position_embeddings_whose_cos_sin_cache_is_past_its_bound_is_an_error_naming_the_field_and_the_bytes(
) {
    // 1e8 positions of a rope dim of 64: 25.6 GB of cos/sin cache per layer, built whole
    // when the weights load.
    let json = dense_with(&[("max_position_embeddings", "100000000"), ("qk_rope_head_dim", "64")]);
    assert_field_error(&json, "max_position_embeddings", &["100000000", "25600000000 bytes", "bound"], "1e8");
    // The bound is in bytes: 2^30 / (64 * 4) = 4194304 positions at rope dim 64.
    let rows = MAX_COS_SIN_CACHE_BYTES / (64 * 4);
    let at = dense_with(&[("max_position_embeddings", &rows.to_string()), ("qk_rope_head_dim", "64")]);
    assert_eq!(MlaConfig::from_json_str(&at).map(|c| c.max_position_embeddings).ok(), Some(rows));
    let past = (rows + 1).to_string();
    let json = dense_with(&[("max_position_embeddings", &past), ("qk_rope_head_dim", "64")]);
    assert_field_error(&json, "max_position_embeddings", &[&past, "bytes"], "bound + 1");
    // i64::MAX positions: the bytes are exact, not wrapped.
    let json = dense_with(&[("max_position_embeddings", &i64::MAX.to_string())]);
    let bytes = (i64::MAX as i128 * 4 * 4).to_string();
    assert_field_error(&json, "max_position_embeddings", &[&bytes], "i64::MAX");
}

#[test]
fn a_cos_sin_cache_past_its_bound_is_refused_before_it_is_allocated_whoever_asks() {
    let rope = YarnRopeParams::plain(1e4);
    let e = rope.cos_sin_cache(64, 100_000_000).unwrap_err().to_string();
    assert!(e.contains("max_position_embeddings") && e.contains("25600000000 bytes"), "{e}");
    // An MlaConfig built in code (its fields are public) meets the same bound at load time.
    let (mut cfg, w) = synthetic(true, DType::F32);
    cfg.max_position_embeddings = 100_000_000;
    let q = cpu_queue();
    let e = MlaWeightStore::from_host(&q, &cfg, &w).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("max_position_embeddings") && e.contains("1600000000 bytes"), "{e}");
}

#[test]
fn a_v32_config_with_index_topk_past_max_position_embeddings_is_an_error_naming_the_field_and_value() {
    // SMALL_V32 has 4096 positions: a query never sees more tokens than that.
    assert_field_error(&v32_with(&[("index_topk", "4097")]), "index_topk", &["4097", "4096"], "4097");
    assert_field_error(
        &v32_with(&[("index_topk", "1000000000000")]),
        "index_topk",
        &["1000000000000", "bound"],
        "1e12",
    );
    for bad in ["0", "-1"] {
        assert_field_error(&v32_with(&[("index_topk", bad)]), "index_topk", &[bad], bad);
    }
    let at = MlaConfig::from_json_str(&v32_with(&[("index_topk", "4096")])).unwrap();
    assert_eq!(at.dims.indexer.map(|ix| ix.topk), Some(4096));
}

#[test]
fn v32_indexer_dims_past_their_bounds_are_errors_naming_the_field_and_value() {
    let past_heads = (MAX_HEADS + 1).to_string();
    assert_field_error(
        &v32_with(&[("index_n_heads", &past_heads)]),
        "index_n_heads",
        &[&past_heads, "bound"],
        "heads",
    );
    let past_dim = (MAX_DIM + 2).to_string();
    assert_field_error(
        &v32_with(&[("index_head_dim", &past_dim)]),
        "index_head_dim",
        &[&past_dim, "bound"],
        "dim",
    );
    // Within their bounds, but the indexer query row Hi * Di is 2^16 * 2^10 = 2^26.
    let json = v32_with(&[("index_n_heads", &MAX_HEADS.to_string()), ("index_head_dim", "1024")]);
    assert_field_error(&json, "index_n_heads", &["65536", "1024", "elements", "bound"], "Hi * Di");
}
