//! Hostile input files, one malformation each, written to a scratch directory: safetensors
//! files and shards (truncated, header length past the end, header not JSON, data offsets
//! reversed / overlapping / past the end / not matching the shape, unknown dtypes, shapes
//! whose size overflows, a name listed twice), indexes (a missing shard, a path leaving
//! the directory, an empty path, a name listed twice), fp8 weights, configs and inputs.
//! Every load returns an error naming the file (or field) and the value at fault, never
//! panics, and leaves the file byte for byte as it was.

mod common;

use std::path::{Path, PathBuf};

use common::{cpu_queue, safetensors_bytes, synthetic, synthetic_checkpoint, synthetic_config_json};
use mla_block::{layer_prefix, Checkpoint, HostTensor, HostWeights, MlaConfig, MlaWeightStore};
use vt_core::DType;

/// A scratch directory of its own, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("vt-hostile-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A safetensors file from its header text and `data` zero bytes of data.
fn raw_safetensors(header: &str, data: usize) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend(std::iter::repeat_n(0u8, data));
    b
}

/// The message of `r`'s error (a panic fails the test by itself).
fn err_of<T>(r: vt_core::Result<T>, what: &str) -> String {
    match r {
        Ok(_) => panic!("{what}: loaded"),
        Err(e) => e.to_string(),
    }
}

fn assert_mentions(msg: &str, needles: &[&str], what: &str) {
    for n in needles {
        assert!(msg.contains(n), "{what}: `{msg}` does not mention {n:?}");
    }
}

/// Opens `path` and reads every tensor it lists; the first error.
fn open_and_read_all(path: &Path) -> vt_core::Result<()> {
    let ck = Checkpoint::open(path)?;
    let mut names: Vec<String> = ck.names().map(str::to_string).collect();
    names.sort();
    for n in names {
        ck.raw(&n)?;
    }
    Ok(())
}

#[test]
fn malformed_safetensors_files_are_errors_naming_the_file_the_tensor_and_the_value() {
    let s = Scratch::new("st");
    let e = |shape: &str, dtype: &str, offsets: &str| {
        format!(r#"{{"dtype":"{dtype}","shape":{shape},"data_offsets":{offsets}}}"#)
    };
    let good = raw_safetensors(&format!(r#"{{"w.weight":{}}}"#, e("[2,2]", "F32", "[0,16]")), 16);
    // (case, file bytes, words the error must hold besides the file name)
    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        ("an empty file", vec![], vec!["0 bytes", "8-byte header length"]),
        ("a file shorter than the length prefix", vec![1, 2, 3], vec!["3 bytes"]),
        ("truncated in the data", good[..good.len() - 5].to_vec(), vec!["`w.weight`", "[0, 16]", "11 bytes"]),
        ("truncated in the header", good[..20].to_vec(), vec!["header length", "runs past", "20 bytes"]),
        (
            "a header length past the end of the file",
            {
                let mut b = good.clone();
                b[..8].copy_from_slice(&4096u64.to_le_bytes());
                b
            },
            vec!["header length 4096", "runs past"],
        ),
        (
            "a header length past the format's limit",
            {
                let mut b = good.clone();
                b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
                b
            },
            vec![&*Box::leak(u64::MAX.to_string().into_boxed_str()), "exceeds"],
        ),
        ("a header that is not JSON", raw_safetensors("{not json}", 0), vec!["not JSON"]),
        ("a header that is not an object", raw_safetensors("[1,2]", 0), vec!["not a JSON object"]),
        (
            "reversed data offsets",
            raw_safetensors(&format!(r#"{{"w.weight":{}}}"#, e("[2,2]", "F32", "[16,0]")), 16),
            vec!["`w.weight`", "[16, 0]", "backwards"],
        ),
        (
            "overlapping data offsets",
            raw_safetensors(
                &format!(
                    r#"{{"a.weight":{},"b.weight":{}}}"#,
                    e("[4]", "F32", "[0,16]"),
                    e("[4]", "F32", "[8,24]")
                ),
                24,
            ),
            vec!["`b.weight`", "[8, 24]", "overlap"],
        ),
        (
            "data offsets past the end",
            raw_safetensors(&format!(r#"{{"w.weight":{}}}"#, e("[2,2]", "F32", "[0,16]")), 8),
            vec!["`w.weight`", "[0, 16]", "past the end of the data (8 bytes"],
        ),
        (
            "data offsets that do not match shape x dtype",
            raw_safetensors(&format!(r#"{{"w.weight":{}}}"#, e("[2,3]", "F32", "[0,16]")), 16),
            vec!["`w.weight`", "[2, 3]", "24 bytes", "16 bytes"],
        ),
        (
            "an unknown dtype",
            raw_safetensors(&format!(r#"{{"w.weight":{}}}"#, e("[2,2]", "Q4_K", "[0,16]")), 16),
            vec!["`w.weight`", "\"Q4_K\""],
        ),
        (
            "a shape whose byte size overflows usize",
            raw_safetensors(
                &format!(r#"{{"w.weight":{}}}"#, e("[4294967296,4294967296,2]", "F32", "[0,16]")),
                16,
            ),
            vec!["`w.weight`", "4294967296", "overflows"],
        ),
        (
            "a negative dimension",
            raw_safetensors(&format!(r#"{{"w.weight":{}}}"#, e("[-2,2]", "F32", "[0,16]")), 16),
            vec!["`w.weight`", "-2"],
        ),
        (
            "a tensor listed twice",
            raw_safetensors(
                &format!(
                    r#"{{"w.weight":{},"w.weight":{}}}"#,
                    e("[2]", "F32", "[0,8]"),
                    e("[2]", "F32", "[8,16]")
                ),
                16,
            ),
            vec!["`w.weight`", "listed twice"],
        ),
    ];
    for (case, bytes, words) in cases {
        let path = s.write("model.safetensors", &bytes);
        let msg = err_of(open_and_read_all(&path), case);
        assert_mentions(&msg, &["model.safetensors"], case);
        assert_mentions(&msg, &words, case);
        assert!(std::fs::read(&path).unwrap() == bytes, "{case}: the file changed");
        // The same bytes as a shard of an index: the error names the shard.
        let shard = s.write("shard-1.safetensors", &bytes);
        s.write("model.safetensors.index.json", br#"{"weight_map": {"w.weight": "shard-1.safetensors"}}"#);
        let r = Checkpoint::open(&s.0).and_then(|ck| ck.raw("w.weight").map(|_| ()));
        let msg = err_of(r, case);
        assert_mentions(&msg, &["shard-1.safetensors"], case);
        assert!(std::fs::read(&shard).unwrap() == bytes, "{case}: the shard changed");
        std::fs::remove_file(s.0.join("model.safetensors.index.json")).unwrap();
    }
    // And the unedited file loads (the cases are not vacuous).
    let path = s.write("model.safetensors", &good);
    open_and_read_all(&path).unwrap();
}

#[test]
fn loading_a_shard_whose_header_runs_past_the_file_is_an_error_naming_the_file() {
    let s = Scratch::new("shard_header");
    let good = raw_safetensors(r#"{"a.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 8);
    s.write("s1.safetensors", &good);
    let mut bad = good.clone();
    bad[..8].copy_from_slice(&1000u64.to_le_bytes());
    s.write("s2.safetensors", &bad);
    s.write(
        "model.safetensors.index.json",
        br#"{"weight_map": {"a.weight": "s1.safetensors", "b.weight": "s2.safetensors"}}"#,
    );
    let ck = Checkpoint::open(&s.0).unwrap();
    ck.raw("a.weight").unwrap();
    let msg = err_of(ck.raw("b.weight"), "header past the file");
    assert_mentions(&msg, &["s2.safetensors", "header length 1000", "runs past"], "header past the file");
    assert!(std::fs::read(s.0.join("s2.safetensors")).unwrap() == bad);
}

#[test]
fn an_index_naming_a_shard_twice_over_or_outside_the_directory_is_an_error_naming_the_entry() {
    let s = Scratch::new("index");
    let st = raw_safetensors(r#"{"a.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 8);
    s.write("s1.safetensors", &st);
    s.write("s2.safetensors", &st);
    let index = |text: &str| {
        let p = s.write("model.safetensors.index.json", text.as_bytes());
        let r = Checkpoint::open(&s.0).and_then(|ck| ck.raw("a.weight").map(|_| ()));
        assert!(std::fs::read(&p).unwrap() == text.as_bytes(), "the index changed");
        r
    };
    // (index text, words of the error)
    for (text, words) in [
        (
            // The same tensor in two shards: the parse kept the second without a word.
            r#"{"weight_map": {"a.weight": "s1.safetensors", "a.weight": "s2.safetensors"}}"#,
            vec!["model.safetensors.index.json", "weight_map.a.weight", "twice"],
        ),
        (
            // An empty file name has no path components: it named the directory itself.
            r#"{"weight_map": {"a.weight": ""}}"#,
            vec!["weight_map.a.weight", "``", "plain relative path"],
        ),
        (
            r#"{"weight_map": {"a.weight": "../s1.safetensors"}}"#,
            vec!["weight_map.a.weight", "../s1.safetensors"],
        ),
        (r#"{"weight_map": {"a.weight": "/etc/hostname"}}"#, vec!["weight_map.a.weight", "/etc/hostname"]),
        (
            r#"{"weight_map": {"a.weight": "./s1.safetensors"}}"#,
            vec!["weight_map.a.weight", "./s1.safetensors"],
        ),
        (
            r#"{"weight_map": {"a.weight": "missing.safetensors"}}"#,
            vec!["missing.safetensors", "cannot open"],
        ),
        (r#"{"weight_map": {"a.weight": 7}}"#, vec!["weight_map.a.weight", "not a file name"]),
        (r#"{"weight_map": [1]}"#, vec!["model.safetensors.index.json", "weight_map"]),
        (r#"{"weight_map": {"#, vec!["model.safetensors.index.json", "JSON"]),
    ] {
        let msg = err_of(index(text), text);
        assert_mentions(&msg, &words, text);
    }
    // Plain relative names, nested ones included, load.
    std::fs::create_dir_all(s.0.join("sub")).unwrap();
    s.write("sub/s3.safetensors", &st);
    index(r#"{"weight_map": {"a.weight": "sub/s3.safetensors"}}"#).unwrap();
    index(r#"{"weight_map": {"a.weight": "s1.safetensors"}}"#).unwrap();
}

#[test]
fn a_missing_layer_or_tensor_is_an_error_naming_its_full_name() {
    let s = Scratch::new("layer");
    let (cfg, host) = synthetic(true, DType::F32);
    let path =
        s.write("model.safetensors", &safetensors_bytes(&synthetic_checkpoint(&host, &layer_prefix(0))));
    let q = cpu_queue();
    let ck = Checkpoint::open(&path).unwrap();
    MlaWeightStore::from_checkpoint(&q, &cfg, &ck, &layer_prefix(0), None).unwrap();
    let msg = err_of(MlaWeightStore::from_checkpoint(&q, &cfg, &ck, &layer_prefix(61), None), "layer 61");
    assert_mentions(&msg, &["model.safetensors", "model.layers.61.self_attn.", "missing tensor"], "layer 61");
    // One tensor left out.
    let mut tensors = synthetic_checkpoint(&host, &layer_prefix(0));
    tensors.retain(|(n, _)| !n.ends_with("kv_b_proj.weight"));
    let path = s.write("model.safetensors", &safetensors_bytes(&tensors));
    let ck = Checkpoint::open(&path).unwrap();
    let msg = err_of(HostWeights::from_checkpoint(&ck, &cfg.dims, &layer_prefix(0), None), "no kv_b_proj");
    assert_mentions(
        &msg,
        &["model.safetensors", "`model.layers.0.self_attn.kv_b_proj.weight`"],
        "no kv_b_proj",
    );
}

/// An fp8 tensor `name` of `shape` (codes 0x38 = 1.0) with scales of `scale_shape`.
fn fp8_file(shape: [usize; 2], scale_shape: &[usize]) -> Vec<u8> {
    let codes = vec![0x38u8; shape[0] * shape[1]];
    let n: usize = scale_shape.iter().product();
    let scales: Vec<u8> = (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect();
    let t = |dtype, shape: Vec<usize>, bytes| HostTensor {
        dtype,
        shape: shape.into_iter().map(|d| d as i64).collect(),
        bytes,
    };
    safetensors_bytes(&[
        ("w.weight".into(), t(DType::F8E4M3, shape.to_vec(), codes)),
        ("w.weight_scale_inv".into(), t(DType::F32, scale_shape.to_vec(), scales)),
    ])
}

#[test]
fn fp8_weights_with_misshaped_scales_or_no_columns_are_errors_or_empty_never_a_panic() {
    let s = Scratch::new("fp8");
    let load = |bytes: &[u8]| {
        let path = s.write("w.safetensors", bytes);
        let r = Checkpoint::open(&path).and_then(|ck| ck.weight("w.weight")?.to_bytes(DType::BF16, false));
        assert!(std::fs::read(&path).unwrap() == bytes, "the file changed");
        r
    };
    assert_eq!(load(&fp8_file([130, 4], &[2, 1])).unwrap().len(), 130 * 4 * 2);
    for (scale_shape, want) in [(vec![1, 1], "[1, 1]"), (vec![2], "[2]"), (vec![2, 1, 1], "[2, 1, 1]")] {
        let msg = err_of(load(&fp8_file([130, 4], &scale_shape)), want);
        assert_mentions(&msg, &["w.safetensors", "`w.weight_scale_inv`", want, "[2, 1]"], want);
    }
    // No columns: the conversion took `chunks_exact(0)` of the rows, a panic.
    assert_eq!(load(&fp8_file([3, 0], &[1, 0])).unwrap(), Vec::<u8>::new());
}

#[test]
fn a_checkpoint_at_a_non_utf8_path_loads_or_errors_naming_it() {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let s = Scratch::new("non_utf8");
        let name = std::ffi::OsStr::from_bytes(b"w\xff\xfe.safetensors");
        let path = s.0.join(name);
        let bytes = raw_safetensors(r#"{"a.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 8);
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(Checkpoint::open(&path).unwrap().raw("a.weight").unwrap().shape, vec![2]);
        std::fs::write(&path, &bytes[..12]).unwrap();
        let msg = err_of(Checkpoint::open(&path), "truncated");
        assert_mentions(&msg, &["w\u{fffd}\u{fffd}.safetensors"], "truncated");
        let msg = err_of(Checkpoint::open(&s.0.join(std::ffi::OsStr::from_bytes(b"\xff.json"))), "missing");
        assert_mentions(&msg, &["\u{fffd}.json", "does not exist"], "missing");
    }
}

fn config_with(key: &str, value: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&synthetic_config_json(true)).unwrap();
    v[key] = serde_json::from_str(value).unwrap();
    v.to_string()
}

#[test]
fn config_fields_zero_negative_huge_or_written_twice_are_errors_naming_the_field_and_value() {
    for (key, value, words) in [
        ("num_attention_heads", "0", vec!["num_attention_heads", "0"]),
        ("num_attention_heads", "-3", vec!["num_attention_heads", "-3"]),
        ("hidden_size", "0", vec!["hidden_size", "0"]),
        ("kv_lora_rank", "-1", vec!["kv_lora_rank", "-1"]),
        ("q_lora_rank", "-8", vec!["q_lora_rank", "-8"]),
        ("qk_rope_head_dim", "3", vec!["qk_rope_head_dim", "3", "even"]),
        ("v_head_dim", "9", vec!["v_head_dim", "9", "qk_head_dim"]),
        ("kv_lora_rank", "4611686018427387904", vec!["kv_lora_rank", "overflows"]),
        ("num_attention_heads", "1e300", vec!["num_attention_heads", "integer"]),
        ("max_position_embeddings", "-1", vec!["max_position_embeddings", "-1"]),
        ("rms_norm_eps", "-1e-6", vec!["rms_norm_eps"]),
    ] {
        let what = format!("{key} = {value}");
        let msg = err_of(MlaConfig::from_json_str(&config_with(key, value)), &what);
        assert_mentions(&msg, &["config.json"], &what);
        assert_mentions(&msg, &words, &what);
    }
    // A key written twice: serde_json kept the last value without a word.
    let twice = synthetic_config_json(true).replacen('{', r#"{"num_attention_heads": 128, "#, 1);
    let msg = err_of(MlaConfig::from_json_str(&twice), "written twice");
    assert_mentions(&msg, &["config.json", "num_attention_heads", "twice"], "written twice");
}

#[test]
fn an_input_of_width_zero_is_an_error_before_any_allocation_sized_by_its_header() {
    // [1, 2^40, 0] holds no bytes, so the file is tiny; the default positions were 2^40
    // i64s (8 TiB), allocated before H was compared with anything.
    let hidden = HostTensor { dtype: DType::F32, shape: vec![1, 1 << 40, 0], bytes: vec![] };
    let bytes = safetensors_bytes(&[("hidden_states".into(), hidden)]);
    let msg = err_of(mla_block::loaders::input_from_bytes(&bytes), "H = 0");
    assert_mentions(&msg, &["input.safetensors", "`hidden_states`", "[1, 1099511627776, 0]"], "H = 0");
    // The default positions themselves are checked and reserved fallibly.
    let msg = err_of(mla_block::runner::positions_or_default(None, 1 << 40, 1 << 40), "S * T");
    assert_mentions(&msg, &["positions", "1099511627776"], "S * T");
    let msg = err_of(mla_block::runner::positions_or_default(None, -1, 4), "S < 0");
    assert_mentions(&msg, &["positions", "-1"], "S < 0");
    assert_eq!(mla_block::runner::positions_or_default(None, 2, 3).unwrap(), vec![0, 1, 2, 0, 1, 2]);
}

#[test]
fn a_config_or_index_that_never_ends_is_an_error_naming_it_not_an_unbounded_read() {
    let s = Scratch::new("endless");
    // A weights file given as the config by mistake: 64 MiB, sparse (no disk blocks).
    let big = s.0.join("config.json");
    std::fs::File::create(&big).unwrap().set_len(64 << 20).unwrap();
    let msg = err_of(MlaConfig::from_file(&big), "a 64 MiB config");
    assert_mentions(&msg, &["config.json", "more than 16777216 bytes"], "a 64 MiB config");
    #[cfg(unix)]
    {
        // `/dev/zero` never ends: read_to_string grew until memory ran out.
        let msg = err_of(MlaConfig::from_file(Path::new("/dev/zero")), "/dev/zero config");
        assert_mentions(&msg, &["/dev/zero", "more than"], "/dev/zero config");
        let index = s.0.join("model.safetensors.index.json");
        std::os::unix::fs::symlink("/dev/zero", &index).unwrap();
        let msg = err_of(Checkpoint::open(&index), "/dev/zero index");
        assert_mentions(
            &msg,
            &["model.safetensors.index.json", "more than 268435456 bytes"],
            "/dev/zero index",
        );
    }
}
