//! `vt-mla run` at the program's edges (issue 15): sizes whose products wrap, configs whose
//! derived values are not finite, huge but valid sizes, an output that is one of the
//! inputs, and errors that must name the input at fault. Every case is a clean exit 1 (or
//! 2 for usage) with a message, never a panic, an abort or a silently wrong output.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{safetensors_bytes, synthetic, synthetic_checkpoint, synthetic_config_json, vt_mla};
use mla_block::{HostTensor, DEFAULT_LAYER_PREFIX};
use vt_core::DType;

/// A directory of its own for one test, with the synthetic layer's files in it.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn new(test: &str) -> Files {
        let dir = std::env::temp_dir().join(format!("vt-mla-edges-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (_, host) = synthetic(false, DType::F32);
        std::fs::write(dir.join("config.json"), synthetic_config_json(false)).unwrap();
        std::fs::write(
            dir.join("weights.safetensors"),
            safetensors_bytes(&synthetic_checkpoint(&host, DEFAULT_LAYER_PREFIX)),
        )
        .unwrap();
        std::fs::write(dir.join("input.safetensors"), input_bytes(2, 6)).unwrap();
        Files { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `vt-mla run` on `config.json`, `weights.safetensors`, `input.safetensors` in the
    /// directory (each replaceable through `extra`, which comes last), writing `output`.
    fn run(&self, output: &Path, extra: &[&str]) -> Output {
        self.run_env(output, extra, &[])
    }

    fn run_env(&self, output: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = vt_mla();
        c.args(["run", "--backend", "cpu"]);
        for (flag, file) in [
            ("--config", "config.json"),
            ("--weights", "weights.safetensors"),
            ("--input", "input.safetensors"),
        ] {
            if !extra.contains(&flag) {
                c.arg(flag).arg(self.path(file));
            }
        }
        c.arg("--output").arg(output).args(extra).env_remove("RUST_LOG");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    }

    /// A config with `edit` applied to the synthetic one, written as `name`.
    fn config_with(
        &self,
        name: &str,
        edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
    ) -> String {
        let mut v: serde_json::Value = serde_json::from_str(&synthetic_config_json(false)).unwrap();
        edit(v.as_object_mut().unwrap());
        let p = self.path(name);
        std::fs::write(&p, v.to_string()).unwrap();
        p.display().to_string()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn input_bytes(s: i64, t: i64) -> Vec<u8> {
    let h = 16;
    let vals: Vec<f64> = (0..s * t * h).map(|i| ((i * 37 % 101) as f64 - 50.0) / 50.0).collect();
    let hidden =
        HostTensor { dtype: DType::F32, shape: vec![s, t, h], bytes: vt_core::encode_f64(DType::F32, &vals) };
    safetensors_bytes(&[("hidden_states".into(), hidden)])
}

/// Exit status 1 (a failed run, not a crash: no panic, no abort) with every needle in the
/// message.
fn fails_with(o: &Output, needles: &[&str], what: &str) {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{what}: exit {:?}\n{stderr}", o.status);
    assert!(!stderr.contains("panicked"), "{what}: panicked\n{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{what}: stderr lacks {n:?}\n{stderr}");
    }
}

// ------------------------------------------------------------ integer overflow

#[test]
fn config_dimensions_whose_products_wrap_are_errors_naming_the_field() {
    let f = Files::new("cfg_overflow");
    let out = f.path("out.safetensors");
    let big = 1i64 << 61;
    for (field, value) in [
        ("num_attention_heads", big),
        ("hidden_size", big),
        ("kv_lora_rank", big),
        ("qk_nope_head_dim", i64::MAX - 2),
        ("v_head_dim", big),
    ] {
        let cfg = f.config_with(&format!("{field}.json"), |c| {
            c.insert(field.into(), value.into());
        });
        let o = f.run(&out, &["--config", &cfg]);
        fails_with(&o, &["config.json", field], &format!("{field} = {value}"));
        assert!(!out.exists(), "{field}: no output is written");
    }
}

#[test]
fn command_line_numbers_whose_products_wrap_are_errors() {
    let f = Files::new("cli_overflow");
    let out = f.path("out.safetensors");
    let max = i64::MAX.to_string();
    // Schedule counts whose sum wraps to T = 6.
    let wrap = format!("prefill:{},prefill:{},prefill:8", i64::MAX, i64::MAX);
    let o = f.run(&out, &["--schedule", &wrap]);
    fails_with(&o, &["schedule", "overflow"], "schedule sum");
    // A block size whose cache size wraps.
    let o = f.run(&out, &["--block-size", &max]);
    fails_with(&o, &["--block-size", "bytes"], "--block-size i64::MAX");
    // --tp far beyond any head count: an error, not a hang or an allocation without bound.
    let o = f.run(&out, &["--tp", &max]);
    fails_with(&o, &["--tp"], "--tp i64::MAX");
    let o = f.run(&out, &["--tp", "4611686018427387904"]);
    fails_with(&o, &["--tp"], "--tp 2^62");
    assert!(!out.exists());
}

// ------------------------------------------------------------ derived values finite

#[test]
fn yarn_parameters_that_make_the_rope_cache_or_scale_non_finite_are_named() {
    let f = Files::new("nonfinite");
    let out = f.path("out.safetensors");
    let yarn = |extra: serde_json::Value| {
        let mut s =
            serde_json::json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16});
        for (k, v) in extra.as_object().unwrap() {
            s.as_object_mut().unwrap().insert(k.clone(), v.clone());
        }
        s
    };
    for (field, extra) in [
        ("rope_scaling.beta_fast", serde_json::json!({"beta_fast": 0.0})),
        ("rope_scaling.beta_slow", serde_json::json!({"beta_slow": -1.0})),
        ("rope_scaling.mscale", serde_json::json!({"mscale": 1e308})),
        ("rope_scaling.attn_factor", serde_json::json!({"attn_factor": 1e300})),
        ("rope_scaling.extrapolation_factor", serde_json::json!({"extrapolation_factor": 1e308})),
        ("rope_scaling.mscale_all_dim", serde_json::json!({"mscale_all_dim": 1e307})),
    ] {
        let cfg = f.config_with(&format!("{field}.json"), |c| {
            c.insert("rope_scaling".into(), yarn(extra.clone()));
        });
        let o = f.run(&out, &["--config", &cfg]);
        fails_with(&o, &["config.json", field, "finite"], field);
        assert!(!out.exists(), "{field}: no (NaN) output is written");
    }
    let cfg = f.config_with("theta.json", |c| {
        c.insert("rope_theta".into(), 1e308.into());
    });
    let o = f.run(&out, &["--config", &cfg]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    // A huge but finite theta is valid (the frequencies tend to 0): the run succeeds.
    assert!(o.status.success(), "{stderr}");
}

// ------------------------------------------------------------ huge but valid sizes

#[test]
fn a_huge_max_position_embeddings_is_an_error_with_the_bytes_needed() {
    let f = Files::new("huge_maxpos");
    let out = f.path("out.safetensors");
    let cfg = f.config_with("maxpos.json", |c| {
        c.insert("max_position_embeddings".into(), (1i64 << 50).into());
    });
    let o = f.run(&out, &["--config", &cfg]);
    fails_with(&o, &["max_position_embeddings", "bytes"], "max_position_embeddings 2^50");
}

#[test]
fn a_huge_block_size_is_an_error_naming_it_and_the_bytes() {
    let f = Files::new("huge_bs");
    let out = f.path("out.safetensors");
    let o = f.run(&out, &["--block-size", "1099511627776"]);
    fails_with(&o, &["--block-size", "1099511627776", "bytes"], "--block-size 2^40");
}

// ------------------------------------------------------------ output vs inputs

#[test]
fn an_output_that_is_one_of_the_inputs_is_refused_before_any_work() {
    let f = Files::new("same_file");
    let check = |output: &Path, victim: &str, what: &str| {
        let before = std::fs::read(f.path(victim)).unwrap();
        let o = f.run(output, &[]);
        fails_with(&o, &["--output", "same file"], what);
        assert_eq!(std::fs::read(f.path(victim)).unwrap(), before, "{what}: {victim} is unchanged");
    };
    for victim in ["config.json", "weights.safetensors", "input.safetensors"] {
        check(&f.path(victim), victim, &format!("the same path as {victim}"));
        // Another spelling of the same path.
        let other = f.dir.join(".").join("..").join(f.dir.file_name().unwrap()).join(victim);
        check(&other, victim, &format!("another path to {victim}"));
        // A symlink to it.
        let link = f.path(&format!("link-to-{victim}"));
        std::os::unix::fs::symlink(f.path(victim), &link).unwrap();
        check(&link, victim, &format!("a symlink to {victim}"));
        // A hard link to it.
        let hard = f.path(&format!("hard-{victim}"));
        std::fs::hard_link(f.path(victim), &hard).unwrap();
        check(&hard, victim, &format!("a hard link to {victim}"));
    }
}

#[test]
fn an_output_over_a_shard_or_the_index_of_a_sharded_checkpoint_is_refused() {
    let f = Files::new("same_shard");
    // The synthetic weights as a one-shard indexed checkpoint in a folder of its own.
    let ck = f.path("ckpt");
    std::fs::create_dir_all(&ck).unwrap();
    std::fs::copy(f.path("weights.safetensors"), ck.join("shard-1.safetensors")).unwrap();
    let names =
        safetensors::SafeTensors::read_metadata(&std::fs::read(ck.join("shard-1.safetensors")).unwrap())
            .unwrap()
            .1
            .tensors()
            .into_keys()
            .map(|n| (n, serde_json::Value::from("shard-1.safetensors")))
            .collect::<serde_json::Map<_, _>>();
    let index = ck.join("model.safetensors.index.json");
    std::fs::write(&index, serde_json::json!({ "weight_map": names }).to_string()).unwrap();
    let ck_s = ck.to_string_lossy().to_string();
    let index_s = index.to_string_lossy().to_string();
    // The folder loads (the refusals below are about the output, not a broken checkpoint).
    let ok = f.run(&f.path("out.safetensors"), &["--weights", &ck_s]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    for weights in [&ck_s, &index_s] {
        for victim in ["shard-1.safetensors", "model.safetensors.index.json"] {
            let before = std::fs::read(ck.join(victim)).unwrap();
            let o = f.run(&ck.join(victim), &["--weights", weights]);
            fails_with(
                &o,
                &["--output", "same file", "--weights"],
                &format!("--weights {weights}, output {victim}"),
            );
            assert_eq!(std::fs::read(ck.join(victim)).unwrap(), before, "{victim} is unchanged");
        }
    }
}

#[test]
fn the_output_replaces_an_old_file_whole_and_leaves_no_temporary() {
    let f = Files::new("atomic");
    let out = f.path("out.safetensors");
    std::fs::write(&out, b"old contents").unwrap();
    // A failed run leaves the old file alone.
    let o = f.run(&out, &["--schedule", "prefill:5"]);
    fails_with(&o, &["schedule"], "bad schedule");
    assert_eq!(std::fs::read(&out).unwrap(), b"old contents");
    let o = f.run(&out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out_t = common::read_out(&out);
    assert_eq!(out_t.shape, vec![2, 6, 16]);
    let names: Vec<_> = std::fs::read_dir(&f.dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(
        names.iter().all(|n| !n.to_string_lossy().contains(".tmp")),
        "a temporary file was left behind: {names:?}"
    );
    // An output folder that does not exist: an error naming the output, nothing created.
    let missing = f.path("no-such-dir").join("out.safetensors");
    let o = f.run(&missing, &[]);
    fails_with(&o, &["no-such-dir"], "missing output folder");
}

// ------------------------------------------------------------ errors name the input

#[test]
fn an_input_with_no_tokens_is_blamed_not_the_schedule() {
    let f = Files::new("t0");
    let out = f.path("out.safetensors");
    std::fs::write(f.path("input.safetensors"), input_bytes(2, 0)).unwrap();
    let o = f.run(&out, &[]);
    fails_with(&o, &["input.safetensors", "hidden_states", "T = 0"], "T = 0");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!stderr.contains("Schedule"), "a schedule nobody gave is blamed: {stderr}");
    std::fs::write(f.path("input.safetensors"), input_bytes(0, 3)).unwrap();
    let o = f.run(&out, &[]);
    fails_with(&o, &["input.safetensors", "hidden_states", "S = 0"], "S = 0");
}

/// A safetensors file with one tensor whose header does not match its data.
fn bad_safetensors(name: &str, header_entry: &str, data: usize) -> Vec<u8> {
    let header = format!("{{\"{name}\":{header_entry}}}");
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend(std::iter::repeat_n(0u8, data));
    b
}

#[test]
fn safetensors_errors_name_the_file_and_the_tensor() {
    let f = Files::new("st_errors");
    let out = f.path("out.safetensors");
    for (entry, data, needle) in [
        (r#"{"dtype":"F32","shape":[1,2,16],"data_offsets":[0,100]}"#, 100, "128 bytes"),
        (r#"{"dtype":"F32","shape":[1,2,16],"data_offsets":[0,128]}"#, 64, "past the end"),
        (r#"{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,128]}"#, 128, "overflow"),
        (r#"{"dtype":"Q4","shape":[1,2,16],"data_offsets":[0,128]}"#, 128, "dtype"),
    ] {
        std::fs::write(f.path("input.safetensors"), bad_safetensors("hidden_states", entry, data)).unwrap();
        let o = f.run(&out, &[]);
        fails_with(&o, &["input.safetensors", "`hidden_states`", needle], entry);
        let w = bad_safetensors(&format!("{DEFAULT_LAYER_PREFIX}q_proj.weight"), entry, data);
        std::fs::write(f.path("bad-weights.safetensors"), w).unwrap();
        std::fs::write(f.path("input.safetensors"), input_bytes(2, 6)).unwrap();
        let bad_w = f.path("bad-weights.safetensors").display().to_string();
        let o = f.run(&out, &["--weights", &bad_w]);
        fails_with(&o, &["bad-weights.safetensors", "q_proj.weight", needle], entry);
    }
}

#[test]
fn an_invalid_flag_value_warns_on_stderr_without_rust_log() {
    let f = Files::new("flag");
    let out = f.path("out.safetensors");
    let o = f.run_env(&out, &[], &[("VT_MLA_FUSED_NORM_ROPE", "maybe")]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("VT_MLA_FUSED_NORM_ROPE=\"maybe\"") && stderr.contains("warning"), "{stderr}");
    assert_eq!(stderr.matches("VT_MLA_FUSED_NORM_ROPE=\"maybe\"").count(), 1, "warned once: {stderr}");
}

/// Exit status 2 (a usage error: the message and the usage, no panic).
fn usage_with(o: &Output, needles: &[&str], what: &str) {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{what}: exit {:?}\n{stderr}", o.status);
    assert!(!stderr.contains("panicked"), "{what}: panicked\n{stderr}");
    for n in needles.iter().chain(&["Usage: vt-mla"]) {
        assert!(stderr.contains(n), "{what}: stderr lacks {n:?}\n{stderr}");
    }
}

#[test]
fn bad_flag_values_are_usage_errors_naming_the_flag_and_the_value() {
    let f = Files::new("flags");
    let out = f.path("out.safetensors");
    for (extra, needles) in [
        (&["--schedule", "banana"][..], &["--schedule", "banana"][..]),
        (&["--schedule", ""], &["--schedule"]),
        (&["--schedule", "prefill:6,"], &["--schedule"]),
        (&["--schedule", "decode:-1"], &["--schedule", "decode:-1"]),
        (&["--schedule", "prefill:0"], &["--schedule", "prefill:0"]),
        (&["--schedule", "prefill:99999999999999999999"], &["--schedule", "99999999999999999999"]),
        (&["--schedule", "warmup:3"], &["--schedule", "warmup"]),
        (&["--block-size", "0"], &["--block-size", "`0`"]),
        // A negative number is the flag's value (it read as an unknown flag `-6`).
        (&["--block-size", "-64"], &["--block-size", "`-64`"]),
        (&["--tp", "-2"], &["--tp", "`-2`"]),
        (&["--dcp", "-1"], &["--dcp", "`-1`"]),
        (&["--block-size", "1e3"], &["--block-size", "`1e3`"]),
        (&["--tp", "0"], &["--tp", "`0`"]),
        (&["--dcp", "0"], &["--dcp", "`0`"]),
        (&["--tp", "99999999999999999999"], &["--tp", "99999999999999999999"]),
        (&["--layer", "-1"], &["--layer", "'-1'"]),
        (&["--layer", "1", "--layer-prefix", "x."], &["--layer"]),
        (&["--kv-cache-dtype", "fp4"], &["--kv-cache-dtype", "fp4"]),
        (&["--weights-dtype", "int8"], &["--weights-dtype", "int8"]),
    ] {
        let what = format!("{extra:?}");
        usage_with(&f.run(&out, extra), needles, &what);
        assert!(!out.exists(), "{what}: wrote an output");
    }
}

#[test]
fn run_arguments_the_files_cannot_satisfy_are_errors_naming_them() {
    let f = Files::new("run_args");
    let out = f.path("out.safetensors");
    // The synthetic layer has 2 heads and one layer (0).
    fails_with(
        &f.run(&out, &["--layer", "7"]),
        &["model.layers.7.self_attn.", "missing tensor"],
        "--layer 7",
    );
    fails_with(&f.run(&out, &["--tp", "3"]), &["--tp 3", "num_attention_heads = 2"], "--tp 3");
    fails_with(
        &f.run(&out, &["--schedule", "prefill:4"]),
        &["prefill:4", "covers 4 tokens", "6"],
        "schedule",
    );
    let i = f.path("input.safetensors").display().to_string();
    // hidden_states of the wrong dtype, rank or width; positions of the wrong dtype.
    let input = |name: &str, dtype: DType, shape: Vec<i64>| {
        let n: i64 = shape.iter().product();
        let t = HostTensor { dtype, shape, bytes: vt_core::encode_f64(dtype, &vec![0.5; n as usize]) };
        std::fs::write(&i, safetensors_bytes(&[(name.into(), t)])).unwrap();
    };
    for (dtype, shape, needles) in [
        (DType::I64, vec![2, 6, 16], &["i64", "[2, 6, 16]", "f32/bf16/f16"][..]),
        (DType::F32, vec![12, 16], &["[12, 16]", "[S, T, H]"]),
        (DType::F32, vec![1, 2, 6, 16], &["[1, 2, 6, 16]", "[S, T, H]"]),
        (DType::F32, vec![2, 6, 8], &["H = 8", "hidden_size is 16"]),
    ] {
        input("hidden_states", dtype, shape.clone());
        let what = format!("hidden_states {dtype} {shape:?}");
        fails_with(
            &f.run(&out, &[]),
            &[&["input.safetensors", "`hidden_states`"][..], needles].concat(),
            &what,
        );
    }
    input("not_hidden", DType::F32, vec![2, 6, 16]);
    fails_with(
        &f.run(&out, &[]),
        &["input.safetensors", "missing tensor `hidden_states`"],
        "no hidden_states",
    );
    // [1, 2^40, 0] holds no bytes: the default positions (2^40 i64s) were allocated before
    // H was looked at, and the process aborted.
    let empty = HostTensor { dtype: DType::F32, shape: vec![1, 1 << 40, 0], bytes: vec![] };
    std::fs::write(&i, safetensors_bytes(&[("hidden_states".into(), empty)])).unwrap();
    fails_with(&f.run(&out, &[]), &["input.safetensors", "H = 0", "hidden_size is 16"], "H = 0");
    assert!(!out.exists(), "a failed run wrote an output");
}
