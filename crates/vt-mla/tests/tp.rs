//! `vt-mla run --tp N` and `vt-mla bench`: TP = 4 against TP = 1 through the binary, the
//! scaling table, and their errors (ranks on the CPU with the host communicator).

mod common;

use common::{golden_case, read_out, tmp, vt_mla, vt_mla_run};
use mla_block::tp::device_count;
use vt_core::DeviceType;

#[test]
fn cli_run_with_tp_matches_tp1_and_names_what_is_missing() {
    let Some(dir) = golden_case("v2lite_yarn_f32") else { return };
    let schedule = ["--schedule", "prefill:12,decode:8,prefill:20", "--block-size", "16"];
    let (a, b) = (tmp("tp1.safetensors"), tmp("tp4.safetensors"));
    let o1 = vt_mla_run(&dir, &a, &[&schedule[..], &["--backend", "cpu"]].concat());
    assert!(o1.status.success(), "{}", String::from_utf8_lossy(&o1.stderr));
    let o4 = vt_mla_run(&dir, &b, &[&schedule[..], &["--backend", "cpu", "--tp", "4"]].concat());
    let err = String::from_utf8_lossy(&o4.stderr);
    assert!(o4.status.success(), "{err}");
    assert!(err.contains("tp 4: 4 ranks sharing cpu:0 over host"), "{err}");
    let e = common::rel_frobenius(&read_out(&b).to_f64(), &read_out(&a).to_f64());
    eprintln!("vt-mla run --tp 4 vs tp 1: {e:.3e}");
    assert!(e <= 1e-5, "{e:.3e}");

    let Some(six) = golden_case("qlora_yarn_neox_bf16") else { return };
    let o = vt_mla_run(&six, &tmp("x.safetensors"), &["--backend", "cpu", "--tp", "4"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("is not divisible by tp = 4"), "{err}");

    vt_backends::init();
    let found = device_count(DeviceType::Cuda);
    let tp = (found + 1).to_string();
    let o = vt_mla_run(&dir, &tmp("y.safetensors"), &["--backend", "cuda", "--tp", &tp]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(&format!("found {found}")), "{err}");
    let o = vt_mla_run(&dir, &tmp("z.safetensors"), &["--backend", "cpu", "--tp", "0"]);
    assert_eq!(o.status.code(), Some(2), "--tp 0 is a usage error");
    assert!(String::from_utf8_lossy(&o.stderr).contains("'--tp <N>'"));
}

#[test]
fn cli_run_with_dcp_matches_dcp1_and_refuses_chunked_context() {
    let Some(dir) = golden_case("v2lite_yarn_f32") else { return };
    let schedule = ["--schedule", "prefill:20,decode:20", "--block-size", "4", "--backend", "cpu"];
    let (a, b, c) = (tmp("dcp1.safetensors"), tmp("dcp2.safetensors"), tmp("tp4dcp2.safetensors"));
    let o1 = vt_mla_run(&dir, &a, &schedule);
    assert!(o1.status.success(), "{}", String::from_utf8_lossy(&o1.stderr));
    for (out, extra) in [(&b, &["--dcp", "2"][..]), (&c, &["--tp", "4", "--dcp", "2"][..])] {
        let o = vt_mla_run(&dir, out, &[&schedule[..], extra].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{extra:?}: {err}");
        assert!(err.contains("dcp = 2"), "{err}");
        let e = common::rel_frobenius(&read_out(out).to_f64(), &read_out(&a).to_f64());
        eprintln!("vt-mla run {extra:?} vs dcp 1: {e:.3e}");
        assert!(e <= 1e-5, "{extra:?}: {e:.3e}");
    }
    let chunked = ["--schedule", "prefill:12,decode:8,prefill:20", "--backend", "cpu", "--dcp", "2"];
    let o = vt_mla_run(&dir, &tmp("dcpx.safetensors"), &chunked);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("chunked-context prefill"), "{err}");
    let o = vt_mla_run(&dir, &tmp("dcpy.safetensors"), &["--backend", "cpu", "--tp", "4", "--dcp", "3"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("divide tp = 4"), "{err}");
}

#[test]
fn cli_bench_prints_the_scaling_table() {
    let o = vt_mla()
        .args([
            "bench",
            "--backend",
            "cpu",
            "--layer",
            "small",
            "--tp",
            "1,2",
            "--batch",
            "2",
            "--context",
            "6",
        ])
        .args(["--steps", "2", "--rounds", "1", "--warmup", "1", "--block-size", "4"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    eprintln!("{out}");
    assert!(
        out.contains("efficiency") && out.lines().filter(|l| l.contains("over host")).count() == 2,
        "{out}"
    );
    let o = vt_mla().args(["bench", "--backend", "cpu", "--layer", "huge"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "an unknown layer is a usage error");
    assert!(String::from_utf8_lossy(&o.stderr).contains("invalid value 'huge' for '--layer <LAYER>'"));
}
