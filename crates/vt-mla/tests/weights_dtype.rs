//! `vt-mla run --weights-dtype auto|fp8|dequantize` (issue 17) on an fp8 block-quantized
//! fixture (`tests/fixtures/checkpoints/*/fp8`): `fp8` keeps the projections in fp8 and says
//! so, its output stays within the bf16 tolerance of the dequantized run (single rank and
//! `--tp 2` on CPU ranks) and within fp8 error of transformers; `auto` on the CPU
//! dequantizes (the same bits as `dequantize`); a bad mode is a usage error.

mod common;

use common::{golden_case, read_out, tmp, vt_mla, Case};

#[test]
fn weights_dtype_keeps_fp8_or_dequantizes() {
    let name = "qlora_yarn_neox_bf16";
    let Some(dir) = golden_case(name) else { return };
    let fp8 = dir.join("../../fixtures/checkpoints").join(name).join("fp8");
    let run = |extra: &[&str], out: &str| {
        let out = tmp(out);
        let o = vt_mla()
            .args(["run", "--backend", "cpu", "--schedule", "prefill:7,decode:25"])
            .arg("--config")
            .arg(fp8.join("config.json"))
            .arg("--weights")
            .arg(fp8.join("weights.safetensors"))
            .arg("--input")
            .arg(dir.join("input.safetensors"))
            .arg("--output")
            .arg(&out)
            .args(extra)
            .output()
            .unwrap();
        (o, out)
    };
    let (o, deq) = run(&["--weights-dtype", "dequantize"], "wd_deq.safetensors");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let deq = read_out(&deq);
    let (o, auto) = run(&[], "wd_auto.safetensors");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(read_out(&auto).bytes, deq.bytes, "auto dequantizes on the CPU");
    let case = Case::load(&dir);
    for (extra, out) in [
        (vec!["--weights-dtype", "fp8"], "wd_fp8.safetensors"),
        (vec!["--weights-dtype=fp8", "--tp", "2"], "wd_fp8_tp2.safetensors"),
    ] {
        let (o, path) = run(&extra, out);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{extra:?}: {stderr}");
        assert!(stderr.contains("fp8 weights"), "{extra:?}: {stderr}");
        let a = read_out(&path);
        let e = common::rel_frobenius(&a.to_f64(), &deq.to_f64());
        let t = case.rel_err(&a);
        eprintln!("{extra:?}: vs dequantized {e:.3e}, vs transformers {t:.3e}");
        assert!(e <= 2e-2, "{extra:?}: {e}");
        assert!(t <= 0.1, "{extra:?}: {t}");
    }
    let (o, _) = run(&["--weights-dtype", "int4"], "wd_bad.safetensors");
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
}
