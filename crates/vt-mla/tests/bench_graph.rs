//! `vt-mla bench --graph` on the CPU: eager and graph columns side by side (the CPU has no
//! graphs and says so), the per-op breakdown of a decode step and the launch gaps; its
//! options are refused without `--graph`. `vt-mla bench-gemm`: every decode GEMM at each M,
//! with JSON. On a CUDA device `MLA_TEST_DEVICE=cuda` runs the same commands there (the
//! graph column replays CUDA graphs, the GEMMs get floors).

mod common;

use common::vt_mla;

#[test]
fn bench_graph_prints_eager_and_graph_steps_and_a_per_op_breakdown() {
    // The decode-step fusions on (the default) and off: the rows they remove come and go.
    for fuse in ["1", "0"] {
        bench_graph_breakdown(fuse);
    }
}

/// `vt-mla bench --graph` of the small layer on `MLA_TEST_DEVICE` (default the CPU), 3
/// sequences of `context` tokens, block size 16, two short rounds; `extra` arguments and
/// `env` added. Asserts it succeeded and returns (backend, stdout).
fn bench_graph(env: &[(&str, &str)], context: &str, extra: &[&str]) -> (String, String) {
    let backend = std::env::var("MLA_TEST_DEVICE").unwrap_or_else(|_| "cpu".into());
    let o = vt_mla()
        .envs(env.iter().copied())
        .args(["bench", "--graph", "--backend", &backend, "--layer", "small", "--tp", "1"])
        .args(["--batch", "3", "--context", context, "--block-size", "16"])
        .args(extra)
        .args(["--steps", "2", "--rounds", "1", "--warmup", "1", "--iters", "2", "--profile", "2"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    eprintln!("{out}");
    (backend, out)
}

fn bench_graph_breakdown(fuse: &str) {
    let (backend, out) = bench_graph(
        &[("VT_FUSE_DECODE_QUERY", fuse), ("VT_FUSE_CACHE_WRITE", fuse)],
        "20",
        &["--layers", "2"],
    );
    let on_off = if fuse == "1" { "on" } else { "off" };
    for want in [
        "eager",
        "graph/eager",
        "engine loop (1 rounds x 2 steps, host-timed)",
        "one step (events",
        "per op:",
        "sum",
        "launch gaps (step - sum of ops): eager",
        "gap before",
        &format!("VT_FUSE_DECODE_QUERY {on_off}"),
        &format!("VT_FUSE_CACHE_WRITE {on_off}"),
    ] {
        assert!(out.contains(want), "missing `{want}` in\n{out}");
    }
    // Every op of the decode step, once per layer (fused norm+rope path: q_a_proj and
    // kv_a_proj as one merged GEMM); the fusions remove the q rope, the cache write and the
    // query concat.
    let fused_away = ["rope", "cache_write", "concat_q"];
    let row = |op: &str| out.lines().find(|l| l.trim_start().starts_with(&format!("{op} ")));
    for op in ["q_a_proj", "kv_a_proj"] {
        assert!(row(op).is_none(), "`{op}` row beside the merged A-projection in\n{out}");
    }
    for op in [
        "qkv_a_proj (merged)",
        "rms_norm",
        "q_b_proj",
        "kv_norm_rope",
        "rope",
        "cache_write",
        "q_absorb (bmm)",
        "concat_q",
        "decode_attention",
        "v_up (bmm)",
        "o_proj",
    ] {
        if fuse == "1" && fused_away.contains(&op) {
            assert!(row(op).is_none(), "`{op}` row with the fusions on in\n{out}");
            continue;
        }
        let line = row(op).unwrap_or_else(|| {
            panic!("no `{op}` row in\n{out}");
        });
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols[cols.len() - 2], "2", "{op}: two launches (two layers): {line}");
        assert!(cols[cols.len() - 1].parse::<f64>().is_ok_and(|g| g >= 0.0), "{op}: the gap before: {line}");
    }
    if backend == "cpu" {
        assert!(out.contains("no graphs on this device") && out.contains("graphs need CUDA"), "{out}");
    }
}

#[test]
fn graph_options_need_graph() {
    for opt in ["--iters", "--profile"] {
        let o = vt_mla().args(["bench", "--backend", "cpu", opt, "3"]).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{opt} without --graph is a usage error");
        assert!(String::from_utf8_lossy(&o.stderr).contains("--graph"), "{opt}");
    }
}

#[test]
fn bench_gemm_times_every_decode_gemm_at_each_m() {
    let backend = std::env::var("MLA_TEST_DEVICE").unwrap_or_else(|_| "cpu".into());
    let json = common::tmp("gemm.json");
    let o = vt_mla()
        .args([
            "bench-gemm",
            "--backend",
            &backend,
            "--layer",
            "small",
            "--m",
            "1,5",
            "--iters",
            "2",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    eprintln!("{out}");
    for g in ["q_a_proj", "kv_a_proj", "qkv_a (merged)", "q_b_proj", "q_absorb (bmm)", "v_up (bmm)", "o_proj"]
    {
        let n = out.lines().filter(|l| l.starts_with(&format!("{g} "))).count();
        assert_eq!(n, 2, "{g}: one row per M in\n{out}");
    }
    assert!(out.contains("M =   5: the step's GEMMs"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["rows"].as_array().map(|r| r.len()), Some(14));
    if backend == "cuda" {
        assert!(v["rows"][0]["floor_us"].as_f64().is_some_and(|f| f > 0.0), "{v}");
    }
}

/// `--weights-dtype fp8`: the random layer's projections block-quantized and kept in fp8
/// (the small layer: q_a, q_b, kv_b and o_proj; kv_a and the absorbed weights are not
/// 128-aligned there); 3 x 44 cached tokens make the cache-filling prefill quantize its
/// activations (132 rows). On CUDA both floors are printed.
#[test]
fn bench_graph_runs_fp8_weights() {
    let (backend, out) = bench_graph(&[], "44", &["--weights-dtype", "fp8"]);
    for want in [
        "4 fp8 weights",
        "fp8 weights: decode steps of 3 tokens multiply 16-bit activations",
        "one step (events",
    ] {
        assert!(out.contains(want), "missing `{want}` in\n{out}");
    }
    for op in ["q_a_proj", "q_b_proj", "o_proj"] {
        assert!(
            out.lines().any(|l| l.trim_start().starts_with(&format!("{op} "))),
            "no `{op}` row in\n{out}"
        );
    }
    if backend == "cuda" {
        assert!(out.contains("with fp8 weights:") && out.contains("of the fp8-weight floor"), "{out}");
    } else {
        assert!(out.contains("(fp8 weights; ") && out.contains("MB in bf16)"), "{out}");
    }
}
