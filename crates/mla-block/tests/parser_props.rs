//! Property tests of the parsers fed by input files (issue 15): `config.json`, safetensors
//! headers and `--schedule` strings. Whatever they are given, they return a value or an
//! error, never panic; what they accept is consistent (a config's dims validate, a header
//! we accept is one `safetensors` accepts with the same tensors, a schedule prints back to
//! itself).
//!
//! Case budget: 256 per property, or `PROPTEST_CASES`.

mod common;

use mla_block::runner::{Schedule, Step};
use mla_block::{check_safetensors_header, MlaConfig};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(256)
}

/// Integers that stress sizes: small valid ones, zero, negative, and ones whose products wrap.
fn int() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => (1i64..70).prop_map(Value::from),
        1 => Just(json!(0)),
        1 => Just(json!(-2)),
        1 => Just(json!(1i64 << 31)),
        1 => Just(json!(1i64 << 61)),
        1 => Just(json!(i64::MAX)),
        1 => Just(json!(u64::MAX)),
        1 => Just(json!(64.0)),
        1 => Just(json!(1.5)),
        1 => Just(json!("8")),
        1 => Just(Value::Null),
    ]
}

/// Floats for rope parameters: ordinary values and the edges (0, negative, huge, tiny).
fn float() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => (0.01f64..64.0).prop_map(Value::from),
        1 => Just(json!(0.0)),
        1 => Just(json!(-1.0)),
        1 => Just(json!(1e308)),
        1 => Just(json!(1e-308)),
        1 => Just(json!(40)),
        1 => Just(Value::Null),
        1 => Just(json!("x")),
    ]
}

fn rope_section() -> impl Strategy<Value = Value> {
    let yarn = (
        prop::sample::select(vec!["yarn", "deepseek_yarn", "default", "linear"]),
        float(),
        int(),
        prop::collection::vec(float(), 6),
        any::<bool>(),
    )
        .prop_map(|(ty, factor, orig, f, truncate)| {
            json!({
                "type": ty, "factor": factor, "original_max_position_embeddings": orig,
                "beta_fast": f[0], "beta_slow": f[1], "mscale": f[2], "mscale_all_dim": f[3],
                "attn_factor": f[4], "extrapolation_factor": f[5], "truncate": truncate,
            })
        });
    prop_oneof![2 => Just(Value::Null), 3 => yarn, 1 => Just(json!(3))]
}

fn config() -> impl Strategy<Value = Map<String, Value>> {
    (
        prop::collection::vec(int(), 8),
        float(),
        float(),
        rope_section(),
        any::<bool>(),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(d, eps, theta, rope, params, interleave)| {
            let mut c = Map::new();
            for (k, v) in [
                "hidden_size",
                "num_attention_heads",
                "q_lora_rank",
                "kv_lora_rank",
                "qk_nope_head_dim",
                "qk_rope_head_dim",
                "v_head_dim",
                "max_position_embeddings",
            ]
            .iter()
            .zip(d)
            {
                c.insert(k.to_string(), v);
            }
            c.insert("rms_norm_eps".into(), eps);
            c.insert("rope_theta".into(), theta);
            c.insert(if params { "rope_parameters" } else { "rope_scaling" }.into(), rope);
            if let Some(b) = interleave {
                c.insert("rope_interleave".into(), b.into());
            }
            c
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Any config: an error naming config.json, or dims that validate with a finite
    /// positive scale and a finite cos/sin cache.
    #[test]
    fn config_parsing_never_panics_and_accepts_only_usable_configs(c in config()) {
        match MlaConfig::from_json(&c) {
            Err(e) => prop_assert!(e.to_string().contains("config.json") || e.to_string().contains("MlaBlockDims"), "{}", e),
            Ok(cfg) => {
                prop_assert!(cfg.dims.validate().is_ok());
                prop_assert!(cfg.dims.scale.is_finite() && cfg.dims.scale > 0.0);
                // The cache itself, where it is small enough to build here (checked: both
                // sizes may be near i64::MAX).
                if cfg.max_position_embeddings.checked_mul(cfg.dims.qk_rope_head_dim).is_some_and(|n| n <= 1 << 16) {
                    let cache = cfg.rope.cos_sin_cache(cfg.dims.qk_rope_head_dim, cfg.max_position_embeddings);
                    prop_assert!(cache.is_ok(), "{:?}", cache.err());
                    prop_assert!(cache.unwrap_or_default().iter().all(|v| v.is_finite()));
                }
            }
        }
    }

    /// Arbitrary text as config.json.
    #[test]
    fn config_text_never_panics(s in "\\PC{0,200}") {
        let _ = MlaConfig::from_json_str(&s);
    }

    /// Any bytes: the header check returns, never panics.
    #[test]
    fn safetensors_header_check_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = check_safetensors_header(&bytes, "fuzz");
    }

    /// Headers built from random entries (dtypes, shapes with wrapping sizes, offsets that
    /// gap or overlap): what we accept, `safetensors` accepts with the same tensors, and an
    /// error names the tensor or the data.
    #[test]
    fn safetensors_headers_we_accept_safetensors_accepts(
        entries in prop::collection::vec(
            (
                prop::sample::select(vec!["F32", "BF16", "I64", "U8", "F8_E4M3", "Q4", "f32"]),
                prop::collection::vec(prop_oneof![6 => 0u64..5, 1 => Just(1u64 << 32), 1 => Just(u64::MAX)], 0..4),
                prop_oneof![4 => Just(0i64), 1 => -3i64..4],
            ),
            0..4,
        ),
        extra_data in prop_oneof![4 => Just(0usize), 1 => 1usize..9],
        pad in 0usize..9,
    ) {
        let mut header = Map::new();
        let mut at = 0u64;
        for (i, (dt, shape, skew)) in entries.iter().enumerate() {
            let size = mla_block::safetensors_dtype_size(dt).unwrap_or(4) as u64;
            let n = shape.iter().try_fold(size, |a, &d| a.checked_mul(d)).unwrap_or(u64::MAX).min(64);
            let start = at.saturating_add_signed(*skew);
            let end = start + n;
            header.insert(format!("t{i}"), json!({"dtype": dt, "shape": shape, "data_offsets": [start, end]}));
            at = end;
        }
        let mut text = Value::Object(header).to_string();
        text.push_str(&" ".repeat(pad));
        let data_len = at as usize + extra_data;
        let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(text.as_bytes());
        bytes.extend(std::iter::repeat_n(7u8, data_len));
        let ours = check_safetensors_header(&bytes, "gen.safetensors");
        let theirs = safetensors::SafeTensors::deserialize(&bytes);
        match &ours {
            Ok(list) => {
                prop_assert!(theirs.is_ok(), "we accept what safetensors rejects: {:?}", theirs.err());
                let st = theirs.unwrap();
                for e in list {
                    let v = st.tensor(&e.name);
                    prop_assert!(v.is_ok());
                    let v = v.unwrap();
                    prop_assert_eq!(v.shape(), &e.shape[..]);
                    prop_assert_eq!(v.data().len(), e.data_offsets.1 - e.data_offsets.0);
                }
            }
            Err(e) => {
                let m = e.to_string();
                prop_assert!(m.contains("gen.safetensors"), "{}", m);
                prop_assert!(m.contains("tensor `t") || m.contains("data bytes") || m.contains("header"), "{}", m);
            }
        }
    }

    /// Any string: a schedule or an error; an accepted schedule prints back to itself and
    /// its total is exact or reported as an overflow.
    #[test]
    fn schedule_parsing_never_panics_and_round_trips(
        s in prop_oneof![
            "\\PC{0,40}",
            prop::collection::vec(
                (prop::sample::select(vec!["prefill", "decode", "pre", ""]),
                 prop_oneof![Just("0".to_string()), Just("-1".to_string()), Just(i64::MAX.to_string()), (1u32..100).prop_map(|n| n.to_string()), Just("x".to_string())]),
                1..5,
            ).prop_map(|parts| parts.iter().map(|(k, n)| format!("{k}:{n}")).collect::<Vec<_>>().join(",")),
        ]
    ) {
        if let Ok(sch) = s.parse::<Schedule>() {
            let again: Schedule = sch.to_string().parse().expect("a printed schedule parses");
            prop_assert_eq!(&again, &sch);
            prop_assert!(sch.0.iter().all(|st| matches!(st, Step::Prefill(n) | Step::Decode(n) if *n > 0)));
            let exact: i128 = sch.0.iter().map(|st| match st { Step::Prefill(n) | Step::Decode(n) => *n as i128 }).sum();
            match sch.checked_total() {
                Some(t) => {
                    prop_assert_eq!(t as i128, exact);
                    prop_assert!(sch.check(t).is_ok());
                }
                None => {
                    prop_assert!(exact > i64::MAX as i128);
                    let e = sch.check(6).unwrap_err().to_string();
                    prop_assert!(e.contains("overflows"), "{}", e);
                }
            }
        }
    }
}
