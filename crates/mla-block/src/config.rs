//! Hugging Face `config.json` of DeepSeek-V2/V3 (and V2-Lite) models.
//!
//! Both rope forms are read:
//! - the released checkpoints' top-level `rope_theta` plus `rope_scaling` (`null`, or an
//!   object keyed by `type` or `rope_type`);
//! - transformers 5's `rope_parameters` object, which carries `rope_type` and `rope_theta`
//!   itself (a top-level `rope_theta` is the fallback).
//!
//! `rope_interleave` absent means interleaved (GPT-J pairs), as in transformers;
//! `q_lora_rank: null` (or absent, or 0) selects the q_proj branch. Anything the block
//! cannot reproduce (another rope type, attention bias, quantized weights) is an error that
//! names the field and its value.
//!
//! DeepSeek-V3.2 (`model_type: deepseek_v32`): `index_n_heads`, `index_head_dim` and
//! `index_topk` (all required) give the block its lightning indexer
//! ([`crate::IndexerDims`]); transformers' `DeepseekV32Attention` always rotates the main
//! attention's rope interleaved and needs `q_lora_rank`, so `rope_interleave: false` and
//! `q_lora_rank: null` are errors there. The index fields on any other model type are an
//! error too (they would be ignored).
//!
//! Sizes: every dimension has an upper bound ([`crate::MAX_DIM`], [`crate::MAX_HEADS`]), so
//! do the weights and per-token rows they imply, the cos/sin cache that
//! `max_position_embeddings` sizes ([`crate::MAX_COS_SIN_CACHE_BYTES`]) and V3.2's
//! `index_topk` (at most `max_position_embeddings`); a value past one is an error naming
//! the field and its value (docs/mla.md, "Size bounds and the cos/sin cache").

use std::path::Path;

use serde_json::{Map, Value};
use vt_core::{Error, Result};

use crate::dims::{IndexerDims, MlaBlockDims};
use crate::rope::{YarnRopeParams, YarnScaling};

const CTX: &str = "config.json";

/// The largest `config.json` read (the released ones are a few KB).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// What the block needs from a model config.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlaConfig {
    pub dims: MlaBlockDims,
    pub rope: YarnRopeParams,
    /// `max_position_embeddings`: rows of the cos/sin cache (positions must be below it);
    /// the cache's bytes are at most [`crate::MAX_COS_SIN_CACHE_BYTES`].
    pub max_position_embeddings: i64,
    /// `quantization_config` of an fp8 checkpoint (DeepSeek-V3's form: `quant_method: fp8`,
    /// `fmt: e4m3`, `weight_block_size: [128, 128]`): the scale block `[rows, cols]`; the
    /// loader dequantizes such weights into the compute dtype. `None`: not quantized.
    pub fp8_weight_block: Option<[i64; 2]>,
}

impl MlaConfig {
    /// Reads and parses a `config.json` file.
    pub fn from_file(path: &Path) -> Result<MlaConfig> {
        let text = crate::checkpoint::read_json_text(path, MAX_CONFIG_BYTES)?;
        MlaConfig::from_json_str(&text)
    }

    /// Parses the text of a `config.json`.
    pub fn from_json_str(text: &str) -> Result<MlaConfig> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| Error::other(CTX, format!("not valid JSON: {e}")))?;
        let Some(obj) = v.as_object() else {
            return Err(Error::other(CTX, "the top level is not a JSON object"));
        };
        // `{"num_attention_heads": 128, ..., "num_attention_heads": 16}` parses as the last.
        if let Some(key) = crate::safetensors_header::first_duplicate_key(text) {
            return Err(field_err(&key, "is written twice (each key must appear once)"));
        }
        MlaConfig::from_json(obj)
    }

    /// Parses an already decoded `config.json` object.
    pub fn from_json(c: &Map<String, Value>) -> Result<MlaConfig> {
        reject_unsupported(c)?;
        let fp8_weight_block = parse_quantization(c)?;
        let hidden_size = req_int(c, "hidden_size")?;
        let num_heads = req_int(c, "num_attention_heads")?;
        let q_lora_rank = match c.get("q_lora_rank") {
            None | Some(Value::Null) => 0,
            Some(_) => req_int(c, "q_lora_rank")?,
        };
        let kv_lora_rank = req_int(c, "kv_lora_rank")?;
        let nope = req_int(c, "qk_nope_head_dim")?;
        let rope_dim = req_int(c, "qk_rope_head_dim")?;
        let v = match (c.get("v_head_dim"), c.get("model_type").and_then(Value::as_str)) {
            // MiniCPM3 leaves it out: its config class sets hidden_size / num_attention_heads.
            (None | Some(Value::Null), Some("minicpm3")) if num_heads > 0 => hidden_size / num_heads,
            _ => req_int(c, "v_head_dim")?,
        };
        let eps = opt_f64(c, "rms_norm_eps")?.unwrap_or(1e-6);
        let max_pos = req_int(c, "max_position_embeddings")?;
        if max_pos <= 0 {
            return Err(field_err("max_position_embeddings", format!("must be > 0, got {max_pos}")));
        }
        let is_neox = match c.get("rope_interleave") {
            // MiniCPM3 rotates halves (rotate_half), without DeepSeek's interleave.
            None => c.get("model_type").and_then(Value::as_str) == Some("minicpm3"),
            Some(Value::Bool(b)) => !b,
            // transformers reads an explicit null as false (neox), DeepSeek's default is
            // interleaved: too ambiguous to guess.
            Some(Value::Null) => {
                return Err(field_err(
                    "rope_interleave",
                    "null is ambiguous; write true (interleaved) or false (neox)",
                ))
            }
            Some(other) => {
                return Err(field_err("rope_interleave", format!("must be true or false, got {other}")))
            }
        };
        let v32 = c.get("model_type").and_then(Value::as_str) == Some("deepseek_v32");
        if v32 && is_neox {
            return Err(field_err(
                "rope_interleave",
                "false is not what DeepSeek-V3.2 does: transformers' DeepseekV32Attention always rotates the \
                 main attention's rope interleaved (only its indexer uses the half-split rope)",
            ));
        }
        let rope = parse_rope(c, max_pos, is_neox)?;
        // Derived values (cos/sin cache, attention scale) must be finite: name the field.
        // Dims the block rejects anyway (odd or huge) are left to MlaBlockDims::new.
        if rope_dim > 0 && rope_dim % 2 == 0 {
            let qk = nope.checked_add(rope_dim).unwrap_or(i64::MAX);
            rope.check_finite(rope_dim, qk, max_pos)
                .map_err(|(field, msg)| field_err(&rope_field(c, field), msg))?;
        }
        let dims = MlaBlockDims::new(
            hidden_size,
            num_heads,
            q_lora_rank,
            kv_lora_rank,
            nope,
            rope_dim,
            v,
            eps as f32,
            &rope,
        )
        .map_err(dims_err)?;
        // The cos/sin cache is built whole, max_position_embeddings rows, when the weights
        // are loaded (rope::MAX_COS_SIN_CACHE_BYTES says why and how much): refused here,
        // with the bytes, once the rope dim is known to be sane.
        crate::rope::cos_sin_cache_bytes(rope_dim, max_pos)
            .map_err(|msg| field_err("max_position_embeddings", msg))?;
        let dims = if v32 {
            let indexer = IndexerDims {
                n_heads: req_int(c, "index_n_heads")?,
                head_dim: req_int(c, "index_head_dim")?,
                topk: req_int(c, "index_topk")?,
            };
            let dims = dims.with_indexer(indexer).map_err(dims_err)?;
            // A query sees at most max_position_embeddings tokens (positions are below it),
            // and DeepSeek's indexer selects min(index_topk, tokens seen): a larger index_topk
            // selects nothing more, but every token's top-k row (index_topk i32s) is allocated.
            if indexer.topk > max_pos {
                return Err(field_err(
                    "index_topk",
                    format!(
                        "{} is more than max_position_embeddings {max_pos}: a query never sees more \
                         tokens than that to select from",
                        indexer.topk
                    ),
                ));
            }
            dims
        } else {
            dims
        };
        Ok(MlaConfig { dims, rope, max_position_embeddings: max_pos, fp8_weight_block })
    }
}

fn field_err(field: &str, msg: impl std::fmt::Display) -> Error {
    Error::other(CTX, format!("field `{field}`: {msg}"))
}

/// An [`MlaBlockDims`] error restated for the config field it came from.
fn dims_err(e: Error) -> Error {
    match e {
        Error::InvalidArgument { arg, msg, .. } => {
            let field = match arg {
                "num_heads" => "num_attention_heads",
                other => other,
            };
            field_err(field, msg)
        }
        e => e,
    }
}

/// The config spelling of a rope parameter named by [`crate::YarnRopeParams::check_finite`].
fn rope_field(c: &Map<String, Value>, field: &str) -> String {
    let section = match c.get("rope_parameters") {
        Some(Value::Object(_)) => "rope_parameters",
        _ => "rope_scaling",
    };
    let in_section = c.get(section).and_then(Value::as_object).is_some_and(|p| p.contains_key(field));
    if field == "rope_theta" && !in_section {
        field.to_string()
    } else {
        format!("{section}.{field}")
    }
}

/// DeepSeek-V3.2's sparse attention (DSA) fields: read for `model_type: deepseek_v32`,
/// refused on any other model type (whose attention would ignore them).
const SPARSE_INDEXER_KEYS: [&str; 3] = ["index_topk", "index_n_heads", "index_head_dim"];

/// `quantization_config`: absent or null, or DeepSeek's fp8 form with 128x128 weight blocks
/// (`quant_method: fp8`, `fmt: e4m3`, `activation_scheme: dynamic`, `weight_block_size:
/// [128, 128]`, V3.1's `scale_fmt: ue8m0`: power-of-two scales, the same dequantization).
/// Anything else is an error naming the key.
fn parse_quantization(c: &Map<String, Value>) -> Result<Option<[i64; 2]>> {
    let q = match c.get("quantization_config") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(q)) => q,
        Some(other) => {
            return Err(field_err("quantization_config", format!("must be an object, got {other}")))
        }
    };
    let s = |k: &str| q.get(k).and_then(Value::as_str);
    let method = s("quant_method").unwrap_or("?");
    if method != "fp8" {
        return Err(field_err(
            "quantization_config.quant_method",
            format!(
                "{method:?} is not supported; the loader reads bf16/f16/f32 weights and fp8 e4m3 weights with 128x128 block scales (quant_method \"fp8\")"
            ),
        ));
    }
    let checks: [(&str, &[&str]); 3] =
        [("fmt", &["e4m3"]), ("activation_scheme", &["dynamic"]), ("scale_fmt", &["ue8m0"])];
    for (key, allowed) in checks {
        match q.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(v)) if allowed.contains(&v.as_str()) => {}
            Some(v) => {
                return Err(field_err(
                    &format!("quantization_config.{key}"),
                    format!("{v} is not supported (supported: {allowed:?})"),
                ))
            }
        }
    }
    let block = match q.get("weight_block_size") {
        Some(Value::Array(a)) if a.len() == 2 => [
            as_int("quantization_config.weight_block_size", &a[0])?,
            as_int("quantization_config.weight_block_size", &a[1])?,
        ],
        None | Some(Value::Null) => {
            return Err(field_err(
                "quantization_config.weight_block_size",
                "is missing: per-tensor fp8 is not supported, only 128x128 block scales",
            ))
        }
        Some(v) => {
            return Err(field_err(
                "quantization_config.weight_block_size",
                format!("must be [rows, cols], got {v}"),
            ))
        }
    };
    if block != [crate::checkpoint::FP8_BLOCK, crate::checkpoint::FP8_BLOCK] {
        return Err(field_err(
            "quantization_config.weight_block_size",
            format!("{block:?} is not supported, only [128, 128]"),
        ));
    }
    if let Some((k, v)) = q.iter().find(|(k, v)| {
        !v.is_null()
            && !matches!(
                k.as_str(),
                "quant_method" | "fmt" | "activation_scheme" | "scale_fmt" | "weight_block_size"
            )
    }) {
        return Err(field_err(&format!("quantization_config.{k}"), format!("{v} is not supported")));
    }
    Ok(Some(block))
}

fn reject_unsupported(c: &Map<String, Value>) -> Result<()> {
    let v32 = c.get("model_type").and_then(Value::as_str) == Some("deepseek_v32");
    if let Some(key) = SPARSE_INDEXER_KEYS.iter().find(|k| !v32 && c.get(**k).is_some_and(|v| !v.is_null())) {
        return Err(field_err(
            key,
            format!(
                "DeepSeek-V3.2's sparse attention indexer (index_n_heads, index_head_dim, index_topk) runs for \
                 model_type \"deepseek_v32\" only; this config's model_type is {}",
                c.get("model_type").map_or("absent".to_string(), |v| v.to_string())
            ),
        ));
    }
    if c.get("attention_bias").and_then(Value::as_bool) == Some(true) {
        return Err(field_err(
            "attention_bias",
            "true is not supported (DeepSeek's MLA projections have no bias)",
        ));
    }
    Ok(())
}

fn req_int(c: &Map<String, Value>, key: &str) -> Result<i64> {
    match c.get(key) {
        None => Err(field_err(key, "is missing")),
        Some(v) => as_int(key, v),
    }
}

fn as_int(key: &str, v: &Value) -> Result<i64> {
    if let Some(i) = v.as_i64() {
        return Ok(i);
    }
    // Some configs write integers as floats (`64.0`); accept only exact ones.
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => Ok(f as i64),
        _ => Err(field_err(key, format!("must be an integer, got {v}"))),
    }
}

fn opt_f64(c: &Map<String, Value>, key: &str) -> Result<Option<f64>> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| field_err(key, format!("must be a number, got {v}"))),
    }
}

fn parse_rope(c: &Map<String, Value>, max_pos: i64, is_neox: bool) -> Result<YarnRopeParams> {
    let top_theta = opt_f64(c, "rope_theta")?;
    // transformers 5 form first; the released checkpoints' form otherwise.
    let (section, params) = match (c.get("rope_parameters"), c.get("rope_scaling")) {
        (Some(Value::Object(p)), _) => ("rope_parameters", Some(p)),
        (Some(Value::Null) | None, Some(Value::Object(s))) => ("rope_scaling", Some(s)),
        (Some(Value::Null) | None, Some(Value::Null) | None) => ("rope_scaling", None),
        (Some(other), _) => {
            return Err(field_err("rope_parameters", format!("must be an object, got {other}")))
        }
        (_, Some(other)) => {
            return Err(field_err("rope_scaling", format!("must be an object or null, got {other}")))
        }
    };
    let Some(p) = params else {
        return Ok(YarnRopeParams { base: top_theta.unwrap_or(10000.0), yarn: None, is_neox });
    };
    let key = |k: &str| format!("{section}.{k}");
    let num = |k: &str| -> Result<Option<f64>> {
        match p.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                v.as_f64().map(Some).ok_or_else(|| field_err(&key(k), format!("must be a number, got {v}")))
            }
        }
    };
    let theta = num("rope_theta")?.or(top_theta).unwrap_or(10000.0);
    let rope_type = match p.get("rope_type").or_else(|| p.get("type")) {
        None | Some(Value::Null) => "default".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(field_err(&key("rope_type"), format!("must be a string, got {other}"))),
    };
    match rope_type.as_str() {
        "default" => Ok(YarnRopeParams { base: theta, yarn: None, is_neox }),
        "yarn" | "deepseek_yarn" => {
            let factor = num("factor")?.ok_or_else(|| field_err(&key("factor"), "is missing for YaRN"))?;
            if !(factor.is_finite() && factor > 0.0) {
                return Err(field_err(&key("factor"), format!("must be finite and > 0, got {factor}")));
            }
            let orig = match p.get("original_max_position_embeddings") {
                None | Some(Value::Null) => max_pos,
                Some(v) => as_int(&key("original_max_position_embeddings"), v)?,
            };
            if orig <= 0 {
                return Err(field_err(
                    &key("original_max_position_embeddings"),
                    format!("must be > 0, got {orig}"),
                ));
            }
            let mut y = YarnScaling::with_defaults(factor, orig);
            if let Some(v) = num("beta_fast")? {
                y.beta_fast = v;
            }
            if let Some(v) = num("beta_slow")? {
                y.beta_slow = v;
            }
            if let Some(v) = num("mscale")? {
                y.mscale = v;
            }
            if let Some(v) = num("mscale_all_dim")? {
                y.mscale_all_dim = v;
            }
            if let Some(v) = num("extrapolation_factor")? {
                y.extrapolation_factor = v;
            }
            if let Some(v) = num("attn_factor")? {
                y.attn_factor = v;
            }
            if let Some(v) = p.get("attention_factor").filter(|v| !v.is_null()) {
                return Err(field_err(
                    &key("attention_factor"),
                    format!(
                        "an explicit attention_factor ({v}) is not supported; use mscale / mscale_all_dim"
                    ),
                ));
            }
            match p.get("truncate") {
                None | Some(Value::Null) => {}
                Some(Value::Bool(b)) => y.truncate = *b,
                Some(other) => {
                    return Err(field_err(&key("truncate"), format!("must be a bool, got {other}")))
                }
            }
            Ok(YarnRopeParams { base: theta, yarn: Some(y), is_neox })
        }
        other => Err(field_err(
            &key("rope_type"),
            format!("rope type {other:?} is not supported (only \"default\" and \"yarn\")"),
        )),
    }
}
