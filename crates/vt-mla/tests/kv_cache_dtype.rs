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
