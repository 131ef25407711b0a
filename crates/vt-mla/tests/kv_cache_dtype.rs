//! `--kv-cache-dtype` and the cache sizes `vt-mla info` prints (issue 16).

mod common;

use common::{golden_case, tmp, vt_mla, vt_mla_run};

#[test]
fn info_prints_tokens_per_gb_for_each_cache_dtype() {
    let o = vt_mla().arg("info").output().unwrap();
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    // 10^9 / 1152 and 10^9 / 656 (the fp8_ds_mla row): 1.76x the tokens.
    for want in [
        "bf16       1152 bytes/token",
        "868055 tokens/GB",
        "fp8_ds_mla  656 bytes/token",
        "1524390 tokens/GB",
    ] {
        assert!(text.contains(want), "`{want}` not in\n{text}");
    }
}

#[test]
fn kv_cache_dtype_is_parsed_and_refused_where_the_layer_cannot_hold_it() {
    let Some(dir) = golden_case("qlora_yarn_interleave_f32") else { return };
    let out = tmp("kv_cache_dtype.safetensors");
    let o = vt_mla_run(&dir, &out, &["--kv-cache-dtype", "fp9"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown kv cache dtype") && stderr.contains("Usage: vt-mla"), "{stderr}");
    // The golden's kv_lora_rank is 32: no fp8_ds_mla row (512 + 64) fits; a run error.
    let o = vt_mla_run(&dir, &out, &["--kv-cache-dtype", "fp8_ds_mla"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("fp8_ds_mla") && stderr.contains("576"), "{stderr}");
    // A bf16 cache for f32 activations is refused by name.
    let o = vt_mla_run(&dir, &out, &["--kv-cache-dtype", "bf16"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("bf16 cache needs bf16 activations"), "{stderr}");
    // auto is the default: the run succeeds and says which cache it used.
    let o = vt_mla_run(&dir, &out, &["--kv-cache-dtype", "auto"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && stderr.contains("auto cache"), "{stderr}");
}

/// `--kv-cache-dtype fp8_ds_mla` on a golden with 512 + 64 rows: the plain run within 6e-2
/// of transformers, and `--tp 2` / `--dcp 2` (CPU ranks) on the same fp8 cache equal to it
/// at the TP tolerance (f32: 1e-5), far closer than to the float cache's output.
#[test]
fn fp8_ds_mla_runs_alone_under_tp_and_under_dcp() {
    let Some(dir) = golden_case("latent512_qproj_f32") else { return };
    let schedule = ["--backend", "cpu", "--schedule", "prefill:20,decode:20", "--block-size", "16"];
    let fp8 = [&schedule[..], &["--kv-cache-dtype", "fp8_ds_mla"]].concat();
    let run = |name: &str, extra: &[&str]| {
        let out = tmp(name);
        let o = vt_mla_run(&dir, &out, extra);
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{extra:?}: {stderr}");
        assert!(stderr.contains(if extra.contains(&"fp8_ds_mla") {
            "fp8_ds_mla cache"
        } else {
            "auto cache"
        }));
        common::read_out(&out).to_f64()
    };
    let float = run("float.safetensors", &schedule);
    let plain = run("fp8.safetensors", &fp8);
    let tp = run("fp8_tp2.safetensors", &[&fp8[..], &["--tp", "2"]].concat());
    let dcp = run("fp8_dcp2.safetensors", &[&fp8[..], &["--dcp", "2"]].concat());
    let case = common::Case::load(&dir);
    let vs_gold = common::rel_frobenius(&plain, &case.expected);
    let vs_float = common::rel_frobenius(&plain, &float);
    eprintln!("vt-mla run fp8_ds_mla: vs transformers {vs_gold:.3e}, vs the float cache {vs_float:.3e}");
    assert!(vs_gold <= 6e-2 && vs_float > 1e-3, "{vs_gold:.3e} / {vs_float:.3e}");
    for (what, out) in [("--tp 2", &tp), ("--dcp 2", &dcp)] {
        let e = common::rel_frobenius(out, &plain);
        eprintln!("vt-mla run fp8_ds_mla {what} vs the plain fp8 run: {e:.3e}");
        assert!(e <= 1e-5, "{what}: {e:.3e}");
    }
}
