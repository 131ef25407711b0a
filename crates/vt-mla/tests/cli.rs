//! The `vt-mla` binary: `run` on the goldens, `info`, and its errors.

mod common;

use common::{
    golden_case, read_out, safetensors_bytes, synthetic, synthetic_checkpoint, tmp, vt_mla, vt_mla_run, Case,
};
use mla_block::{HostTensor, DEFAULT_LAYER_PREFIX};
use vt_core::DType;

#[test]
fn run_reproduces_the_goldens_in_the_input_dtype() {
    for (name, schedule, bs) in [
        ("qlora_yarn_mscale_f32", "prefill:10,decode:4,prefill:18", "16"),
        ("v2lite_noyarn_bf16", "prefill:1,decode:27", "1"),
    ] {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        let out_path = tmp(&format!("{name}.safetensors"));
        // Both option forms: `--key value` and `--key=value`.
        let bs = format!("--block-size={bs}");
        let o = vt_mla_run(&dir, &out_path, &["--backend", "cpu", "--schedule", schedule, &bs]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{name}: {stderr}");
        let out = read_out(&out_path);
        assert_eq!(out.dtype, case.dtype(), "out is written in the input dtype");
        assert_eq!(out.shape, case.hidden.shape);
        let err = case.rel_err(&out);
        eprintln!("vt-mla run {name} --schedule {schedule} {bs}: rel err {err:.3e}\n{stderr}");
        assert!(err <= case.tolerance(), "{name}: {err:.3e}");
    }
}

/// DeepSeek-V3.2 (issue 19): `vt-mla run` on the sparse goldens (indexer + sparse attention
/// for every token) under a prefill + decode schedule, and an fp8_ds_mla cache refused by
/// name (the indexer keys live beside the latents in the activation dtype); `--tp 2` on CPU
/// ranks (the indexer replicated on each).
#[test]
fn run_reproduces_the_v32_sparse_goldens() {
    for (name, schedule, bs) in [
        ("v32_sparse_f32", "prefill:13,decode:7,prefill:20", "4"),
        ("v32_sparse_mscale_bf16", "prefill:1,decode:35", "16"),
    ] {
        let Some(dir) = golden_case(name) else { return };
        let case = Case::load(&dir);
        let out_path = tmp(&format!("{name}.safetensors"));
        let o =
            vt_mla_run(&dir, &out_path, &["--backend", "cpu", "--schedule", schedule, "--block-size", bs]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{name}: {stderr}");
        assert!(stderr.contains("DeepSeek-V3.2 sparse (index_topk"), "{stderr}");
        let err = case.rel_err(&read_out(&out_path));
        eprintln!("vt-mla run {name} --schedule {schedule}: rel err {err:.3e}\n{stderr}");
        assert!(err <= case.tolerance(), "{name}: {err:.3e}");
    }
    // Tensor parallel: 2 CPU ranks, the indexer replicated on each.
    let Some(dir) = golden_case("v32_sparse_f32") else { return };
    let case = Case::load(&dir);
    let out_path = tmp("v32_tp2.safetensors");
    let o =
        vt_mla_run(&dir, &out_path, &["--backend", "cpu", "--tp", "2", "--schedule", "prefill:17,decode:23"]);
    assert!(o.status.success(), "tp 2: {}", String::from_utf8_lossy(&o.stderr));
    let err = case.rel_err(&read_out(&out_path));
    assert!(err <= case.tolerance(), "v32_sparse_f32 --tp 2: {err:.3e}");
    let Some(dir) = golden_case("v32_sparse_mscale_bf16") else { return };
    let o = vt_mla_run(
        &dir,
        &tmp("v32_fp8.safetensors"),
        &["--backend", "cpu", "--kv-cache-dtype", "fp8_ds_mla"],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && stderr.contains("kv_cache_dtype") && stderr.contains("indexer"),
        "{stderr}"
    );
}

/// `vt-mla bench --layer small-v32`: the decode step of a random DeepSeek-V3.2-shaped layer
/// (indexer + sparse attention) at TP 1 and 2 on the CPU, past its top-k (context 40 > 16).
#[test]
fn bench_times_a_v32_layer() {
    let o = vt_mla()
        .args(["bench", "--backend", "cpu", "--layer", "small-v32", "--tp", "1,2", "--dtype", "f32"])
        .args(["--batch", "2", "--context", "40", "--steps", "1", "--rounds", "1", "--warmup", "0"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("random small-v32 MLA layer") && stdout.contains("2 ranks"), "{stdout}");
}

#[test]
fn run_defaults_positions_to_0_through_t_and_honours_layer_prefix() {
    let (_, host) = synthetic(false, DType::F32);
    let cfg_path = tmp("synthetic_config.json");
    std::fs::write(&cfg_path, common::synthetic_config_json(false)).unwrap();
    let w_path = tmp("synthetic_weights.safetensors");
    std::fs::write(&w_path, safetensors_bytes(&synthetic_checkpoint(&host, "model.layers.5.self_attn.")))
        .unwrap();
    let (s, t, h) = (2i64, 6i64, 16i64);
    let vals: Vec<f64> = (0..s * t * h).map(|i| ((i * 37 % 101) as f64 - 50.0) / 50.0).collect();
    let hidden =
        HostTensor { dtype: DType::F32, shape: vec![s, t, h], bytes: vt_core::encode_f64(DType::F32, &vals) };
    let pos: Vec<f64> = (0..s).flat_map(|_| 0..t).map(|p| p as f64).collect();
    let positions =
        HostTensor { dtype: DType::I64, shape: vec![s, t], bytes: vt_core::encode_f64(DType::I64, &pos) };
    let with_pos = tmp("in_pos.safetensors");
    let no_pos = tmp("in_nopos.safetensors");
    std::fs::write(
        &with_pos,
        safetensors_bytes(&[("hidden_states".into(), hidden.clone()), ("positions".into(), positions)]),
    )
    .unwrap();
    std::fs::write(&no_pos, safetensors_bytes(&[("hidden_states".into(), hidden)])).unwrap();
    let mut outs = Vec::new();
    for (input, name) in [(&with_pos, "out_pos.safetensors"), (&no_pos, "out_nopos.safetensors")] {
        let out = tmp(name);
        let o = vt_mla()
            .args(["run", "--layer-prefix", "model.layers.5.self_attn.", "--schedule", "prefill:2,decode:4"])
            .arg("--config")
            .arg(&cfg_path)
            .arg("--weights")
            .arg(&w_path)
            .arg("--input")
            .arg(input)
            .arg("--output")
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        outs.push(read_out(&out));
    }
    assert_eq!(outs[0].bytes, outs[1].bytes);
    assert!(outs[0].to_f64().iter().all(|v| v.is_finite()));
    // The default prefix does not find layer 5's weights, and says which tensor it wanted.
    let o = vt_mla()
        .arg("run")
        .arg("--config")
        .arg(&cfg_path)
        .arg("--weights")
        .arg(&w_path)
        .arg("--input")
        .arg(&no_pos)
        .arg("--output")
        .arg(tmp("never.safetensors"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && stderr.contains(&format!("{DEFAULT_LAYER_PREFIX}q_proj.weight")),
        "{stderr}"
    );
}

#[test]
fn run_rejects_a_schedule_that_does_not_sum_to_t_and_bad_arguments() {
    let Some(dir) = golden_case("qlora_yarn_interleave_f32") else { return };
    let out = tmp("bad.safetensors");
    let o = vt_mla_run(&dir, &out, &["--schedule", "prefill:16,decode:4"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.contains("covers 20 tokens but each sequence has 24"), "{stderr}");
    assert_eq!(o.status.code(), Some(1), "a run that fails is exit status 1, not a usage error");
    // Usage errors: exit status 2, the message and the usage on stderr.
    for (extra, want) in [
        (&["--backend", "tpu"][..], "invalid value 'tpu' for '--backend <BACKEND>'"),
        (&["--block-size", "0"], "'--block-size <N>': `0` is not a positive integer"),
        (&["--frobnicate", "1"], "unexpected argument '--frobnicate'"),
        (&["--schedule", "prefill:x"], "'--schedule <STEPS>'"),
        (&["--transport", "host"], "--tp <N>"),
        (&["--tp", "0"], "'--tp <N>': `0` is not a positive integer"),
    ] {
        let o = vt_mla_run(&dir, &out, extra);
        usage_error(&o, want, &format!("run {extra:?}"));
    }
    let o = vt_mla().args(["run", "--config", "x.json"]).output().unwrap();
    usage_error(&o, "--weights <PATH>", "run without --weights");
    let o = vt_mla().arg("frob").output().unwrap();
    usage_error(&o, "unrecognized subcommand 'frob'", "frob");
    let o = vt_mla().output().unwrap();
    usage_error(&o, "Usage: vt-mla", "no command");
}

/// Exit status 2, `want` and the usage line on stderr.
fn usage_error(o: &std::process::Output, want: &str, what: &str) {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{what}: {stderr}");
    assert!(
        stderr.contains(want) && stderr.contains("Usage: vt-mla"),
        "{what}: wanted `{want}` in\n{stderr}"
    );
}

#[test]
fn every_command_has_help() {
    for args in [
        &["--help"][..],
        &["-h"],
        &["help"],
        &["run", "--help"],
        &["help", "run"],
        &["bench", "--help"],
        &["bench", "-h"],
        &["info", "--help"],
    ] {
        let o = vt_mla().args(args).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success() && out.contains("Usage: vt-mla"), "{args:?}: {out}");
    }
    let o = vt_mla().args(["run", "--help"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    for flag in
        ["--config", "--weights", "--layer-prefix", "--schedule", "--block-size", "--tp", "--transport"]
    {
        assert!(out.contains(flag), "run --help lacks {flag}: {out}");
    }
    let o = vt_mla().args(["bench", "--help"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("--layer") && out.contains("[default: 1,2]"), "{out}");
}

#[test]
fn info_lists_backends_devices_and_registered_ops() {
    let o = vt_mla().arg("info").output().unwrap();
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    eprintln!("{text}");
    assert!(text.contains("cpu: registered"), "{text}");
    for op in vt_core::OpId::ALL {
        assert!(text.contains(op.name()), "{text} lacks {op}");
    }
    assert!(text.contains("VT_MLA_FUSED_NORM_ROPE="));
    assert!(text.contains("MLA block: runs here (fused and split norm+rope paths)"), "{text}");
    assert!(text.contains("--backend auto runs the MLA block on:"), "{text}");
    assert!(text.contains("DeepSeek-V3.2 sparse block (indexer + SparseMlaAttention): runs here"), "{text}");
}

/// `vt-mla run` on the published layouts (issue 14): a sharded directory, its index file
/// and `--layer N`, and an fp8 block-quantized checkpoint; fixtures from
/// `tools/fixtures/checkpoints.py golden`.
#[test]
fn run_takes_sharded_and_fp8_checkpoints_and_a_layer_number() {
    let name = "qlora_yarn_neox_bf16";
    let Some(dir) = golden_case(name) else { return };
    let fx = dir.join("../../fixtures/checkpoints").join(name);
    let run = |weights: &std::path::Path, config: &std::path::Path, extra: &[&str], out: &str| {
        let out = tmp(out);
        let o = vt_mla()
            .args(["run", "--backend", "cpu", "--schedule", "prefill:7,decode:25"])
            .arg("--config")
            .arg(config)
            .arg("--weights")
            .arg(weights)
            .arg("--input")
            .arg(dir.join("input.safetensors"))
            .arg("--output")
            .arg(&out)
            .args(extra)
            .output()
            .unwrap();
        (o, out)
    };
    let cfg = dir.join("config.json");
    let (o, single) = run(&dir.join("weights.safetensors"), &cfg, &[], "ck_single.safetensors");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let single = read_out(&single);
    let sharded = fx.join("sharded");
    for (weights, extra) in
        [(sharded.clone(), vec![]), (sharded.join("model.safetensors.index.json"), vec!["--layer", "0"])]
    {
        let (o, out) = run(&weights, &cfg, &extra, "ck_sharded.safetensors");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(read_out(&out).bytes, single.bytes, "{} {extra:?}", weights.display());
    }
    // Layer 1 of the fixture is the halved decoy: it runs, and gives another output.
    let (o, out) = run(&sharded, &cfg, &["--layer", "1"], "ck_layer1.safetensors");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_ne!(read_out(&out).bytes, single.bytes);
    let (o, _) = run(&sharded, &cfg, &["--layer", "9"], "ck_layer9.safetensors");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("missing tensor `model.layers.9.self_attn."), "{err}");
    let (o, _) = run(&sharded, &cfg, &["--layer", "1", "--layer-prefix", "x."], "ck_both.safetensors");
    assert_eq!(o.status.code(), Some(2), "--layer and --layer-prefix together are a usage error");
    // fp8: the same bits as the script's dequantized weights, within fp8 error of the golden.
    let fp8 = fx.join("fp8");
    let (o, a) = run(&fp8.join("weights.safetensors"), &fp8.join("config.json"), &[], "ck_fp8.safetensors");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (o, b) =
        run(&fp8.join("dequantized.safetensors"), &fp8.join("config.json"), &[], "ck_deq.safetensors");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (a, b) = (read_out(&a), read_out(&b));
    assert_eq!(a.bytes, b.bytes);
    let err = Case::load(&dir).rel_err(&a);
    assert!(err <= 0.1, "fp8 vs transformers on the unquantized weights: {err}");
}

#[test]
fn bench_layers_times_a_stack_on_one_allocator() {
    let o = vt_mla()
        .args([
            "bench",
            "--backend",
            "cpu",
            "--layer",
            "small",
            "--layers",
            "2",
            "--batch",
            "2",
            "--context",
            "8",
        ])
        .args(["--steps", "1", "--rounds", "1", "--warmup", "0", "--block-size", "4"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("decode step of 2 random small MLA layers"), "{stdout}");
    assert!(stdout.contains("attention only") && stdout.contains("no MoE"), "{stdout}");
    assert!(stdout.contains("ms/layer"), "{stdout}");
    let o = vt_mla().args(["bench", "--layers", "0"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
}
