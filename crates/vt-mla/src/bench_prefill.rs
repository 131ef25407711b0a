//! `vt-mla bench-prefill`: the prefill forward of one random MLA layer (DeepSeek-V3's sizes
//! by default), one sequence of T new tokens, optionally after `--context C` cached tokens
//! (chunked prefill: the new tokens also attend to the context, gathered from the paged
//! cache), with a per-op time breakdown and a torch peer.
//!
//! - The forward is `MlaBlock::launch` after one `prepare` (the step's metadata upload is
//!   outside the timing; its shape never changes, so the same prepared workspace serves
//!   every launch; the new tokens' cache rows are rewritten in place each time).
//! - Total: `--iters` forwards back to back between two queue synchronizations, host-timed,
//!   per forward; the median of `--rounds` rounds (and the fastest).
//! - Per op (see `op_timer`): in `--rounds` more forwards every launch is rerun
//!   `--op-iters` times back to back between synchronizations; a launch's time is the median
//!   over those forwards, then launches are summed by name (a GEMM by its weight, `attention`
//!   for the new tokens, `(ctx)` for the context's). Their sum against the total shows what
//!   the forward loses between launches.
//! - FLOPs: GEMMs `2 M N K`; attention `2 x visible (query, key) pairs x heads x (qk + v)`;
//!   bytes: each op's inputs read once and outputs written once (the floor a kernel could
//!   reach); TFLOP/s for GEMMs and attention, GB/s for the rest.
//! - `--peer FILE`: rows of `tools/peers/prefill_step.py` (`{"rows": [{"T", "context", "ms",
//!   "ops": {name: ms}}]}`, the same op names, timed the same way in the same device call);
//!   prints torch's ms per op and vt/torch per T against issue 11's target (<= 1.1x).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use mla_block::tp::RandomLayerSpec;
use mla_block::{
    MlaBatchMetadata, MlaBlock, MlaBlockDims, MlaLimits, MlaWeightStore, MlaWorkspace, PagedKvCache, StepSeq,
};
use vt_core::{Buffer, DType, Device, DeviceType, Error, Queue, Result};

use crate::tp::{DTypeArg, LayerArg};
use crate::{op_timer, positive_i64, positive_usize, progress, BackendArg};

/// Issue 11's target: vt's forward within this factor of torch's.
pub const TARGET_RATIO: f64 = 1.1;
/// Context tokens per untimed forward while filling the cache.
const FILL_TOKENS: i64 = 8192;

#[derive(Args, Debug)]
pub struct PrefillBenchArgs {
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// New tokens of the one sequence per forward, comma-separated.
    #[arg(long, value_name = "T,...", value_delimiter = ',', default_value = "1024,4096,8192", value_parser = positive_i64)]
    tokens: Vec<i64>,
    /// Tokens already cached for the sequence (chunked prefill: the new tokens attend to
    /// them through the gathered context as well as to each other).
    #[arg(long, value_name = "N", default_value_t = 0)]
    context: i64,
    /// Rows of the context gather workspace (default: the whole context, at most 65536).
    #[arg(long, value_name = "N", value_parser = positive_i64)]
    chunk_tokens: Option<i64>,
    #[arg(long, value_enum, default_value_t = LayerArg::V3)]
    layer: LayerArg,
    #[arg(long, value_enum, default_value_t = DTypeArg::Bf16)]
    dtype: DTypeArg,
    /// Forwards back to back per timed round.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = positive_usize)]
    iters: usize,
    /// Rounds (the median round is reported); also the profiled forwards of the breakdown.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = positive_usize)]
    rounds: usize,
    /// Untimed forwards first (at least one runs).
    #[arg(long, value_name = "N", default_value_t = 2)]
    warmup: usize,
    /// Reruns of each launch in the per-op breakdown.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = positive_usize)]
    op_iters: usize,
    /// Skip the per-op breakdown (totals only).
    #[arg(long)]
    no_breakdown: bool,
    /// The torch peer's JSON (tools/peers/prefill_step.py --json FILE, same device call).
    #[arg(long, value_name = "FILE")]
    peer: Option<PathBuf>,
    /// Write our rows (the peer's format plus our columns) as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Tokens per KV cache block.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = positive_i64)]
    block_size: i64,
    /// Seed of the random layer and inputs.
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,
}

/// Model FLOPs and bytes of one op (summed over its launches in a forward).
#[derive(Clone, Debug, PartialEq)]
pub struct OpCost {
    pub label: String,
    pub flops: f64,
    pub bytes: f64,
}

/// The FLOPs and bytes of each op of a prefill forward (the fused norm+rope path) of `t`
/// new tokens after `context` cached ones, the context gathered `chunk_rows` rows at a time;
/// `elt` bytes per element. Names as `op_timer::label` gives them. `fused_cache_write`: the
/// cache write rides in `kv_norm_rope` (`VT_FUSE_CACHE_WRITE`, `MlaBlock::uses_fused_cache_write`):
/// its row writes count there and there is no `cache_write` launch. `merged_a`: q_a_proj and
/// kv_a_proj run as one GEMM (`MlaBlock::uses_merged_a_projection`).
pub fn op_costs(
    d: &MlaBlockDims,
    t: i64,
    context: i64,
    chunk_rows: i64,
    elt: usize,
    fused_cache_write: bool,
    merged_a: bool,
) -> Vec<OpCost> {
    let f = |x: i64| x as f64;
    let e = elt as f64;
    let (tt, c) = (f(t), f(context));
    let (h, n, ql) = (f(d.hidden_size), f(d.num_heads), f(d.q_lora_rank));
    let (l, p, r, v) = (f(d.kv_lora_rank), f(d.qk_nope_head_dim), f(d.qk_rope_head_dim), f(d.v_head_dim));
    let gemm = |m: f64, nn: f64, k: f64| (2.0 * m * nn * k, e * (m * k + nn * k + m * nn));
    let mut out = Vec::new();
    let mut push = |label: &str, (flops, bytes): (f64, f64)| {
        out.push(OpCost { label: label.to_string(), flops, bytes });
    };
    if d.q_lora_rank > 0 {
        if merged_a {
            push("qkv_a_proj (merged)", gemm(tt, ql + l + r, h));
        } else {
            push("q_a_proj", gemm(tt, ql, h));
            push("kv_a_proj", gemm(tt, l + r, h));
        }
        push("rms_norm", (0.0, e * (2.0 * tt * ql + ql)));
        push("q_b_proj", gemm(tt, n * (p + r), ql));
    } else {
        push("kv_a_proj", gemm(tt, l + r, h));
        push("q_proj", gemm(tt, n * (p + r), h));
    }
    // positions (i64) and one f32 cos/sin row of R per token.
    let rope_meta = 8.0 * tt + 4.0 * tt * r;
    if fused_cache_write {
        // The cache rows written (and the slots read) by the same launch.
        push("kv_norm_rope", (0.0, e * 3.0 * tt * (l + r) + l * e + rope_meta + 8.0 * tt));
        push("rope", (0.0, e * 2.0 * tt * n * r + rope_meta));
    } else {
        push("kv_norm_rope", (0.0, e * 2.0 * tt * (l + r) + l * e + rope_meta));
        push("rope", (0.0, e * 2.0 * tt * n * r + rope_meta));
        push("cache_write", (0.0, e * 2.0 * tt * (l + r) + 8.0 * tt));
    }
    push("kv_b_proj", gemm(tt, n * (p + v), l));
    push("concat_k", (0.0, e * (tt * n * p + tt * r + tt * n * (p + r))));
    let pairs = tt * (tt + 1.0) / 2.0;
    push("attention", (2.0 * pairs * n * (p + r + v), e * (2.0 * tt * n * (p + r) + 2.0 * tt * n * v)));
    if context > 0 {
        let k = f((context + chunk_rows.max(1) - 1) / chunk_rows.max(1));
        push("gather_ctx", (0.0, e * 2.0 * c * (l + r)));
        let (fl, _) = gemm(c, n * (p + v), l);
        push("kv_b_proj (ctx)", (fl, e * (c * l + k * n * (p + v) * l + c * n * (p + v))));
        push("concat_k (ctx)", (0.0, e * (c * n * p + c * r + c * n * (p + r))));
        let bytes =
            e * (k * tt * n * (p + r) + c * n * (p + r) + c * n * v + k * tt * n * v) + 4.0 * k * n * tt;
        push("attention (ctx)", (2.0 * tt * c * n * (p + r + v), bytes));
        // k - 1 merges into the accumulator, then one with the new tokens' result.
        push("merge", (0.0, k * (e * 3.0 * tt * n * v + 4.0 * 3.0 * n * tt)));
    }
    push("o_proj", gemm(tt, h, n * v));
    out
}

/// Per-op time of a forward: summed over the launches of that name.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTime {
    pub label: String,
    pub calls: usize,
    pub ms: f64,
}

/// What one T measured.
#[derive(Clone, Debug, PartialEq)]
pub struct StepTimes {
    pub t: i64,
    pub context: i64,
    /// Median round, ms per forward.
    pub ms: f64,
    /// Fastest round.
    pub min_ms: f64,
    /// Empty without the breakdown.
    pub ops: Vec<OpTime>,
}

/// One row of the torch peer.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerRow {
    pub t: i64,
    pub context: i64,
    pub ms: f64,
    pub ops: Vec<(String, f64)>,
}

/// The torch peer's file.
#[derive(Clone, Debug, PartialEq)]
pub struct Peer {
    pub name: String,
    pub rows: Vec<PeerRow>,
}

impl Peer {
    pub fn row(&self, t: i64, context: i64) -> Option<&PeerRow> {
        self.rows.iter().find(|r| r.t == t && r.context == context)
    }
}

/// Parses `tools/peers/prefill_step.py`'s JSON: `{"peer": NAME, "rows": [ROW...]}` or a bare
/// list of rows; a row is `{"T": int, "ms": number, "context": int (default 0), "ops":
/// {name: ms} (optional)}`; other keys are ignored. `ctx` names the file in errors.
pub fn parse_peer(text: &str, ctx: &str) -> Result<Peer> {
    let bad = |msg: String| Error::other(ctx.to_string(), msg);
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let (name, rows) = match &v {
        serde_json::Value::Array(rows) => ("torch".to_string(), rows),
        serde_json::Value::Object(o) => {
            let name = o.get("peer").and_then(|p| p.as_str()).unwrap_or("torch").to_string();
            match o.get("rows").and_then(|r| r.as_array()) {
                Some(rows) => (name, rows),
                None => return Err(bad("has no \"rows\" list".into())),
            }
        }
        _ => return Err(bad("is neither an object with \"rows\" nor a list of rows".into())),
    };
    let mut out = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let int = |key: &str| row.get(key).and_then(|x| x.as_i64());
        let t = int("T").ok_or_else(|| bad(format!("row {i}: no integer \"T\"")))?;
        let context = match row.get("context") {
            None | Some(serde_json::Value::Null) => 0,
            Some(_) => {
                int("context").ok_or_else(|| bad(format!("row {i}: \"context\" is not an integer")))?
            }
        };
        let ms = row
            .get("ms")
            .and_then(|x| x.as_f64())
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| bad(format!("row {i}: no positive number \"ms\"")))?;
        let mut ops = Vec::new();
        if let Some(o) = row.get("ops") {
            let o = o.as_object().ok_or_else(|| bad(format!("row {i}: \"ops\" is not an object")))?;
            for (k, x) in o {
                let ms = x.as_f64().ok_or_else(|| bad(format!("row {i}: op `{k}` is not a number")))?;
                ops.push((k.clone(), ms));
            }
        }
        out.push(PeerRow { t, context, ms, ops });
    }
    Ok(Peer { name, rows: out })
}

/// The median of `v` (NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => 0.5 * (s[n / 2 - 1] + s[n / 2]),
    }
}

/// Per-launch medians over profiled forwards, summed by name in first-launch order. Every
/// forward must launch the same ops in the same order.
pub fn aggregate(forwards: &[Vec<(String, f64)>]) -> Result<Vec<OpTime>> {
    let Some(first) = forwards.first() else { return Ok(Vec::new()) };
    for (i, f) in forwards.iter().enumerate() {
        let same = f.len() == first.len() && f.iter().zip(first).all(|(a, b)| a.0 == b.0);
        if !same {
            return Err(Error::other(
                "vt-mla bench-prefill",
                format!("profiled forward {i} launched other ops than forward 0"),
            ));
        }
    }
    let mut out: Vec<OpTime> = Vec::new();
    for (j, (label, _)) in first.iter().enumerate() {
        let ms = median(&forwards.iter().map(|f| f[j].1).collect::<Vec<_>>());
        match out.iter_mut().find(|o| o.label == *label) {
            Some(o) => {
                o.calls += 1;
                o.ms += ms;
            }
            None => out.push(OpTime { label: label.clone(), calls: 1, ms }),
        }
    }
    Ok(out)
}

/// A rate with 2 decimals under 10, else none.
fn rate(x: f64) -> String {
    if x < 10.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.0}")
    }
}

fn ratio_cell(ours: f64, theirs: Option<f64>) -> String {
    match theirs {
        Some(t) if t > 0.0 => format!("{:.2}x", ours / t),
        _ => "-".into(),
    }
}

/// The per-op table of one T: calls, vt ms, share of the summed ops, TFLOP/s or GB/s from
/// `costs`, torch's ms and vt/torch; then the sum of the ops against the forward, and the
/// torch ops the forward has no launch of (torch names its ops as we do).
pub fn format_breakdown(s: &StepTimes, costs: &[OpCost], peer: Option<&PeerRow>) -> String {
    let mut o = String::new();
    let sum: f64 = s.ops.iter().map(|x| x.ms).sum();
    let peer_ms = |label: &str| peer.and_then(|p| p.ops.iter().find(|(k, _)| k == label).map(|(_, ms)| *ms));
    let _ = writeln!(
        o,
        "  {:<18} {:>5} {:>10} {:>6} {:>9} {:>9} {:>10} {:>9}",
        "op", "calls", "vt ms", "share", "TFLOP/s", "GB/s", "torch ms", "vt/torch"
    );
    for x in &s.ops {
        let cost = costs.iter().find(|c| c.label == x.label);
        let secs = x.ms * 1e-3;
        let (tf, gb) = match cost {
            Some(c) if c.flops > 0.0 => (rate(c.flops / secs / 1e12), rate(c.bytes / secs / 1e9)),
            Some(c) => ("-".into(), rate(c.bytes / secs / 1e9)),
            None => ("-".into(), "-".into()),
        };
        let theirs = peer_ms(&x.label);
        let _ = writeln!(
            o,
            "  {:<18} {:>5} {:>10.4} {:>5.1}% {:>9} {:>9} {:>10} {:>9}",
            x.label,
            x.calls,
            x.ms,
            100.0 * x.ms / sum.max(1e-30),
            tf,
            gb,
            theirs.map(|t| format!("{t:.4}")).unwrap_or_else(|| "-".into()),
            ratio_cell(x.ms, theirs)
        );
    }
    if let Some(p) = peer {
        for (k, ms) in p.ops.iter().filter(|(k, _)| !s.ops.iter().any(|x| x.label == *k)) {
            let _ = writeln!(
                o,
                "  {k:<18} {:>5} {:>10} {:>6} {:>9} {:>9} {ms:>10.4} {:>9}",
                "-", "-", "", "", "", "-"
            );
        }
    }
    let peer_sum: Option<f64> =
        peer.filter(|p| !p.ops.is_empty()).map(|p| p.ops.iter().map(|(_, m)| m).sum());
    let _ = writeln!(
        o,
        "  {:<18} {:>5} {:>10.4} {:>6} {:>9} {:>9} {:>10} {:>9}",
        "sum of ops",
        s.ops.iter().map(|x| x.calls).sum::<usize>(),
        sum,
        "",
        "",
        "",
        peer_sum.map(|t| format!("{t:.4}")).unwrap_or_else(|| "-".into()),
        ratio_cell(sum, peer_sum)
    );
    let _ = writeln!(
        o,
        "  forward {:.4} ms = sum of ops {:+.1}% (time between launches, or overlap when negative)",
        s.ms,
        100.0 * (s.ms / sum.max(1e-30) - 1.0)
    );
    o
}

/// The summary: one line per T with the forward's ms, TFLOP/s of the model FLOPs, torch's ms,
/// vt/torch and the target.
pub fn format_summary(rows: &[(StepTimes, f64)], peer: Option<&Peer>) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:>6} {:>8} {:>10} {:>10} {:>8} {:>10} {:>9} {:>12}",
        "T", "context", "vt ms", "min ms", "TFLOP/s", "torch ms", "vt/torch", "<= 1.1x"
    );
    for (s, flops) in rows {
        let theirs = peer.and_then(|p| p.row(s.t, s.context)).map(|r| r.ms);
        let verdict = match theirs {
            Some(t) if s.ms / t <= TARGET_RATIO => "ok",
            Some(_) => "MISS",
            None => "-",
        };
        let _ = writeln!(
            o,
            "{:>6} {:>8} {:>10.4} {:>10.4} {:>8} {:>10} {:>9} {:>12}",
            s.t,
            s.context,
            s.ms,
            s.min_ms,
            rate(flops / (s.ms * 1e-3) / 1e12),
            theirs.map(|t| format!("{t:.4}")).unwrap_or_else(|| "-".into()),
            ratio_cell(s.ms, theirs),
            verdict
        );
    }
    o
}

/// Our rows as JSON (the peer's row format plus our columns).
pub fn rows_json(
    impl_name: &str,
    device: &str,
    rows: &[(StepTimes, f64)],
    peer: Option<&Peer>,
) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|(s, flops)| {
            let ops: serde_json::Map<String, serde_json::Value> =
                s.ops.iter().map(|x| (x.label.clone(), serde_json::json!(x.ms))).collect();
            let theirs = peer.and_then(|p| p.row(s.t, s.context)).map(|r| r.ms);
            serde_json::json!({
                "T": s.t, "context": s.context, "ms": s.ms, "min_ms": s.min_ms, "ops": ops,
                "tflops": flops / (s.ms * 1e-3) / 1e12,
                "torch_ms": theirs, "ratio": theirs.map(|t| s.ms / t),
            })
        })
        .collect();
    serde_json::json!({ "impl": impl_name, "device": device, "rows": rows })
}

/// Timing options of [`measure`].
#[derive(Clone, Copy, Debug)]
pub struct MeasureOptions {
    pub context: i64,
    pub chunk_tokens: i64,
    pub block_size: i64,
    pub iters: usize,
    pub rounds: usize,
    pub warmup: usize,
    /// 0: no breakdown.
    pub op_iters: usize,
    pub seed: u64,
}

/// Times the prefill forward of `t` new tokens of one sequence (after `o.context` cached
/// tokens) through `block` on `q` (see the module docs). The breakdown needs
/// `op_timer::install` for the queue's device first.
pub fn measure(
    q: &Queue,
    block: &MlaBlock<'_>,
    spec: &RandomLayerSpec,
    t: i64,
    o: &MeasureOptions,
) -> Result<StepTimes> {
    let d = *block.dims();
    let dt = block.dtype();
    let (c, bs) = (o.context, o.block_size);
    if c < 0 {
        return Err(Error::invalid("bench-prefill", "context", format!("must be >= 0, got {c}")));
    }
    if c + t > block.max_position() {
        return Err(Error::invalid(
            "bench-prefill",
            "tokens",
            format!("context + tokens = {} exceed the {} rope positions", c + t, block.max_position()),
        ));
    }
    let blocks = (c + t + bs - 1) / bs;
    let mut cache = PagedKvCache::new(q, dt, blocks, bs, d.cache_row_dim())?;
    let fill = c.min(FILL_TOKENS);
    let rows = t.max(fill);
    let mut ws = MlaWorkspace::new(MlaLimits {
        max_tokens: rows,
        max_seqs: 1,
        max_blocks_per_seq: blocks,
        chunk_workspace_tokens: o.chunk_tokens,
    })?;
    let seq = cache.add_sequence();
    let x = Buffer::from_bytes(q, dt, &[rows, d.hidden_size], &spec.hidden(1, rows, dt, o.seed).bytes)?;
    let y = Buffer::nan(q, dt, &[rows, d.hidden_size])?;
    let mut meta = MlaBatchMetadata::default();
    let mut start = 0;
    while start < c {
        let end = (start + FILL_TOKENS).min(c);
        let pos: Vec<i64> = (start..end).collect();
        meta.plan(&mut cache, &[StepSeq { seq, positions: &pos, decode: false }], o.chunk_tokens)?;
        let n = end - start;
        block.forward(
            q,
            &mut ws,
            &x.view().slice(0, 0, n)?,
            &meta,
            &cache.view(),
            &y.view().slice(0, 0, n)?,
        )?;
        start = end;
    }
    let pos: Vec<i64> = (c..c + t).collect();
    meta.plan(&mut cache, &[StepSeq { seq, positions: &pos, decode: false }], o.chunk_tokens)?;
    block.prepare(q, &mut ws, &meta)?;
    let (xv, yv) = (x.view().slice(0, 0, t)?, y.view().slice(0, 0, t)?);
    let cache_v = cache.view();
    let launch = || block.launch(q, &ws, &xv, &meta, &cache_v, &yv);
    for _ in 0..o.warmup.max(1) {
        launch()?;
    }
    q.synchronize()?;
    for row in [0, t - 1] {
        let vals = q.read_f64(&yv.slice(0, row, row + 1)?)?;
        if vals.iter().any(|v| !v.is_finite()) {
            return Err(Error::other("bench-prefill", format!("T = {t}: output row {row} is not finite")));
        }
    }
    let mut rounds = Vec::with_capacity(o.rounds);
    for _ in 0..o.rounds.max(1) {
        q.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..o.iters.max(1) {
            launch()?;
        }
        q.synchronize()?;
        rounds.push(t0.elapsed().as_secs_f64() * 1e3 / o.iters.max(1) as f64);
    }
    let ops = if o.op_iters > 0 {
        let mut forwards = Vec::with_capacity(o.rounds);
        for _ in 0..o.rounds.max(1) {
            forwards.push(op_timer::profile(&d, o.op_iters, launch)?);
        }
        aggregate(&forwards)?
    } else {
        Vec::new()
    };
    Ok(StepTimes {
        t,
        context: c,
        ms: median(&rounds),
        min_ms: rounds.iter().copied().fold(f64::INFINITY, f64::min),
        ops,
    })
}

/// `vt-mla bench-prefill`. `pick` maps `--backend` to a device type.
pub fn run(a: &PrefillBenchArgs, pick: impl Fn(BackendArg) -> Result<DeviceType>) -> Result<()> {
    let kind = pick(a.backend)?;
    let (layer_name, spec) = match a.layer {
        LayerArg::V3 => ("v3", RandomLayerSpec::DEEPSEEK_V3),
        LayerArg::V32 => ("v32", RandomLayerSpec::DEEPSEEK_V32),
        LayerArg::Small => ("small", RandomLayerSpec::SMALL),
        LayerArg::SmallV32 => ("small-v32", RandomLayerSpec::SMALL_V32),
    };
    let dtype = match a.dtype {
        DTypeArg::Bf16 => DType::BF16,
        DTypeArg::F16 => DType::F16,
        DTypeArg::F32 => DType::F32,
    };
    if a.context < 0 {
        return Err(Error::invalid("bench-prefill", "context", format!("must be >= 0, got {}", a.context)));
    }
    let peer = match &a.peer {
        Some(path) => {
            let ctx = path.display().to_string();
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::other(ctx.clone(), format!("cannot read: {e}")))?;
            Some(parse_peer(&text, &ctx)?)
        }
        None => None,
    };
    let q = Queue::new(Device::new(kind, 0))?;
    let (cfg, host) = progress::stage("making the random layer", || spec.layer(dtype, a.seed))?;
    let store = progress::stage(format!("uploading the weights to {kind}"), || {
        MlaWeightStore::from_host(&q, &cfg, &host)
    })?;
    drop(host);
    let block = MlaBlock::new(cfg.dims, store.views(), cfg.rope.is_neox)?;
    let d = cfg.dims;
    let device =
        vt_core::registry::backend(kind).map(|b| b.device_name(0)).unwrap_or_else(|| kind.to_string());
    let chunk_tokens = a.chunk_tokens.unwrap_or(a.context.clamp(1, 65536));
    let breakdown = !a.no_breakdown;
    if breakdown {
        op_timer::install(kind)?;
    }
    println!(
        "vt-mla bench-prefill: prefill forward of a random {layer_name} MLA layer ({dtype}; hidden {}, {} heads, q_lora {}, \
         kv_lora {}, rope {}, nope {}, v {}; {} norm+rope) on {kind} ({device})",
        d.hidden_size,
        d.num_heads,
        d.q_lora_rank,
        d.kv_lora_rank,
        d.qk_rope_head_dim,
        d.qk_nope_head_dim,
        d.v_head_dim,
        if block.uses_fused_norm_rope() { "fused" } else { "split" }
    );
    println!(
        "one sequence, {} cached context tokens{}, block size {}; {} warm-up forwards, {} rounds of {} forwards back to \
         back (median round, host-timed between queue synchronizations){}",
        a.context,
        if a.context > 0 { format!(" (gathered {chunk_tokens} rows per chunk)") } else { String::new() },
        a.block_size,
        a.warmup.max(1),
        a.rounds,
        a.iters,
        if breakdown {
            format!("; per op: each launch rerun {} times between synchronizations, median over {} forwards", a.op_iters, a.rounds)
        } else {
            String::new()
        }
    );
    if let Some(p) = &peer {
        println!("peer: {} ({} rows)", p.name, p.rows.len());
    }
    let o = MeasureOptions {
        context: a.context,
        chunk_tokens,
        block_size: a.block_size,
        iters: a.iters,
        rounds: a.rounds,
        warmup: a.warmup,
        op_iters: if breakdown { a.op_iters } else { 0 },
        seed: a.seed,
    };
    let mut rows = Vec::new();
    let mut failed = 0;
    for &t in &a.tokens {
        let res = progress::stage(format!("T = {t}: filling the cache, timing"), || {
            measure(&q, &block, &spec, t, &o)
        });
        match res {
            Ok(s) => {
                let costs = op_costs(
                    &d,
                    t,
                    a.context,
                    chunk_tokens,
                    dtype.size_of(),
                    block.uses_fused_cache_write(),
                    block.uses_merged_a_projection(),
                );
                let flops: f64 = costs.iter().map(|c| c.flops).sum();
                let prow = peer.as_ref().and_then(|p| p.row(t, a.context));
                println!(
                    "\nT = {t}: forward {:.4} ms ({:.0} TFLOP/s of {:.1} GFLOP){}",
                    s.ms,
                    flops / (s.ms * 1e-3) / 1e12,
                    flops / 1e9,
                    match prow {
                        Some(r) => format!(", torch {:.4} ms, vt/torch {:.2}x", r.ms, s.ms / r.ms),
                        None => String::new(),
                    }
                );
                if breakdown {
                    print!("{}", format_breakdown(&s, &costs, prow));
                }
                rows.push((s, flops));
            }
            Err(e) => {
                failed += 1;
                println!("\nT = {t}: error: {e}");
            }
        }
    }
    println!("\nsummary (vt/torch target <= {TARGET_RATIO}x, issue 11 item 7):");
    print!("{}", format_summary(&rows, peer.as_ref()));
    if let Some(path) = &a.json {
        let v = rows_json(&format!("vt {}", env!("CARGO_PKG_VERSION")), &device, &rows, peer.as_ref());
        let text =
            serde_json::to_string_pretty(&v).map_err(|e| Error::other("bench-prefill", e.to_string()))?;
        std::fs::write(path, text)
            .map_err(|e| Error::other(path.display().to_string(), format!("cannot write: {e}")))?;
    }
    if failed > 0 {
        return Err(Error::other(
            "vt-mla bench-prefill",
            format!("{failed} of {} token counts could not run", a.tokens.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v3() -> MlaBlockDims {
        RandomLayerSpec::DEEPSEEK_V3.config().map(|c| c.dims).expect("v3 config")
    }

    fn cost<'a>(c: &'a [OpCost], label: &str) -> &'a OpCost {
        c.iter().find(|x| x.label == label).expect(label)
    }

    #[test]
    fn v3_flops_follow_the_gemm_and_attention_formulas() {
        let d = v3();
        let c = op_costs(&d, 1024, 0, 1, 2, false, false);
        let t = 1024.0;
        assert_eq!(cost(&c, "q_a_proj").flops, 2.0 * t * 1536.0 * 7168.0);
        assert_eq!(cost(&c, "kv_a_proj").flops, 2.0 * t * 576.0 * 7168.0);
        assert_eq!(cost(&c, "q_b_proj").flops, 2.0 * t * 1536.0 * 128.0 * 192.0);
        assert_eq!(cost(&c, "kv_b_proj").flops, 2.0 * t * 512.0 * 128.0 * 256.0);
        assert_eq!(cost(&c, "o_proj").flops, 2.0 * t * 16384.0 * 7168.0);
        // Issue 11: 2 x visible pairs x heads x (192 + 128).
        assert_eq!(cost(&c, "attention").flops, 2.0 * (t * (t + 1.0) / 2.0) * 128.0 * 320.0);
        // o_proj bytes: activations in, the weight, the output; bf16.
        assert_eq!(cost(&c, "o_proj").bytes, 2.0 * (t * 16384.0 + 7168.0 * 16384.0 + t * 7168.0));
        assert!(c.iter().all(|x| !x.label.contains("ctx")));
        let total: f64 = c.iter().map(|x| x.flops).sum();
        assert!((total / 1e9 - 425.5).abs() < 1.0, "{total}");
    }

    #[test]
    fn context_adds_the_gather_the_context_up_projection_and_the_merges() {
        let d = v3();
        let c = op_costs(&d, 4096, 16384, 8192, 2, false, false);
        assert_eq!(cost(&c, "attention (ctx)").flops, 2.0 * 4096.0 * 16384.0 * 128.0 * 320.0);
        assert_eq!(cost(&c, "kv_b_proj (ctx)").flops, 2.0 * 16384.0 * 512.0 * 128.0 * 256.0);
        assert_eq!(cost(&c, "gather_ctx").bytes, 2.0 * 2.0 * 16384.0 * 576.0);
        // Two chunks: one merge into the accumulator, one with the new tokens.
        let one_merge = 2.0 * 3.0 * 4096.0 * 128.0 * 128.0 + 12.0 * 128.0 * 4096.0;
        assert_eq!(cost(&c, "merge").bytes, 2.0 * one_merge);
        assert_eq!(c.last().map(|x| x.label.as_str()), Some("o_proj"));
    }

    #[test]
    fn the_peer_file_parses_with_and_without_context_and_ops() {
        let text = r#"{"peer": "torch 2.8 cuBLAS + cuDNN SDPA", "rows": [
            {"T": 1024, "ms": 1.5, "ops": {"q_a_proj": 0.1, "attention": 0.4}},
            {"T": 4096, "context": 16384, "ms": 9.0, "extra": true}]}"#;
        let p = parse_peer(text, "peer.json").expect("parses");
        assert_eq!(p.name, "torch 2.8 cuBLAS + cuDNN SDPA");
        assert_eq!(p.rows.len(), 2);
        let r = p.row(1024, 0).expect("row");
        assert_eq!(r.ms, 1.5);
        let mut ops = r.ops.clone();
        ops.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(ops, vec![("attention".to_string(), 0.4), ("q_a_proj".to_string(), 0.1)]);
        assert_eq!(p.row(4096, 16384).map(|r| r.ops.len()), Some(0));
        assert!(p.row(4096, 0).is_none());
        let bare = parse_peer(r#"[{"T": 8, "ms": 2}]"#, "x").expect("a bare list");
        assert_eq!(bare.rows[0].t, 8);
    }

    #[test]
    fn bad_peer_files_are_errors_naming_the_row() {
        for (text, want) in [
            ("nope", "not JSON"),
            (r#"{"x": 1}"#, "no \"rows\""),
            (r#"[{"ms": 1}]"#, "row 0: no integer \"T\""),
            (r#"[{"T": 1, "ms": 1}, {"T": 2}]"#, "row 1: no positive number \"ms\""),
            (r#"[{"T": 1, "ms": -1}]"#, "positive"),
            (r#"[{"T": 1, "ms": 1, "ops": [1]}]"#, "\"ops\" is not an object"),
            (r#"[{"T": 1, "ms": 1, "ops": {"a": "x"}}]"#, "op `a` is not a number"),
            (r#"[{"T": 1, "ms": 1, "context": 0.5}]"#, "\"context\" is not an integer"),
        ] {
            let e = parse_peer(text, "peer.json").expect_err(text).to_string();
            assert!(e.contains(want) && e.contains("peer.json"), "{text}: {e}");
        }
    }

    #[test]
    fn launches_aggregate_by_name_with_per_launch_medians() {
        let f = |a: f64, b: f64, c: f64| {
            vec![("kv_b_proj".to_string(), a), ("attention".to_string(), b), ("kv_b_proj".to_string(), c)]
        };
        let ops = aggregate(&[f(1.0, 5.0, 2.0), f(3.0, 4.0, 2.0), f(2.0, 9.0, 8.0)]).expect("same launches");
        assert_eq!(
            ops,
            vec![
                OpTime { label: "kv_b_proj".into(), calls: 2, ms: 2.0 + 2.0 },
                OpTime { label: "attention".into(), calls: 1, ms: 5.0 },
            ]
        );
        let other = vec![("o_proj".to_string(), 1.0)];
        assert!(aggregate(&[f(1.0, 1.0, 1.0), other]).is_err());
        assert_eq!(median(&[4.0, 1.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn tables_show_ratios_targets_and_missing_peers() {
        let s = StepTimes {
            t: 1024,
            context: 0,
            ms: 2.2,
            min_ms: 2.1,
            ops: vec![
                OpTime { label: "o_proj".into(), calls: 1, ms: 1.0 },
                OpTime { label: "attention".into(), calls: 1, ms: 1.0 },
            ],
        };
        let costs = op_costs(&v3(), 1024, 0, 1, 2, false, false);
        let peer = Peer {
            name: "torch".into(),
            rows: vec![PeerRow {
                t: 1024,
                context: 0,
                ms: 2.0,
                ops: vec![("o_proj".into(), 0.5), ("reshape".into(), 0.25)],
            }],
        };
        let b = format_breakdown(&s, &costs, peer.row(1024, 0));
        let o_line = b.lines().find(|l| l.trim_start().starts_with("o_proj")).expect("o_proj line");
        assert!(o_line.contains("2.00x") && o_line.contains("50.0%"), "{o_line}");
        // 240.5 GFLOP in 1 ms.
        assert!(o_line.contains(" 241 "), "{o_line}");
        let a_line = b.lines().find(|l| l.trim_start().starts_with("attention")).expect("attention line");
        assert!(a_line.trim_end().ends_with('-'), "{a_line}");
        assert!(b.contains("reshape"), "torch-only ops are listed:\n{b}");
        assert!(b.contains("sum of ops") && b.contains("+10.0%"), "{b}");
        let flops: f64 = costs.iter().map(|c| c.flops).sum();
        let fast = StepTimes { t: 4096, ms: 1.0, min_ms: 1.0, ..s.clone() };
        let sum = format_summary(&[(s.clone(), flops), (fast, flops)], Some(&peer));
        let lines: Vec<&str> = sum.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].contains("1.10x") && lines[1].trim_end().ends_with("ok"), "{}", lines[1]);
        assert!(lines[2].trim_end().ends_with('-'), "no peer row for 4096: {}", lines[2]);
        let slow = StepTimes { ms: 2.3, ..s.clone() };
        assert!(format_summary(&[(slow, flops)], Some(&peer)).contains("MISS"));
        let j = rows_json("vt", "cpu", &[(s, flops)], Some(&peer));
        assert_eq!(j["rows"][0]["T"], 1024);
        assert_eq!(j["rows"][0]["ops"]["o_proj"], 1.0);
        assert!((j["rows"][0]["ratio"].as_f64().unwrap_or(0.0) - 1.1).abs() < 1e-12);
    }

    #[test]
    fn a_small_layer_prefill_runs_on_the_cpu_with_a_breakdown() {
        vt_backends::init();
        op_timer::install(DeviceType::Cpu).expect("install");
        let spec = RandomLayerSpec::SMALL;
        let q = Queue::new(Device::new(DeviceType::Cpu, 0)).expect("cpu queue");
        let (cfg, host) = spec.layer(DType::F32, 1).expect("layer");
        let store = MlaWeightStore::from_host(&q, &cfg, &host).expect("store");
        let mut block = MlaBlock::new(cfg.dims, store.views(), cfg.rope.is_neox).expect("block");
        block.set_fused_norm_rope(Some(true));
        let o = MeasureOptions {
            context: 40,
            chunk_tokens: 16,
            block_size: 16,
            iters: 2,
            rounds: 3,
            warmup: 1,
            op_iters: 2,
            seed: 3,
        };
        let s = measure(&q, &block, &spec, 24, &o).expect("runs");
        assert!(s.ms > 0.0 && s.min_ms <= s.ms);
        let names: Vec<&str> = s.ops.iter().map(|x| x.label.as_str()).collect();
        let costs = op_costs(
            &cfg.dims,
            24,
            40,
            16,
            4,
            block.uses_fused_cache_write(),
            block.uses_merged_a_projection(),
        );
        for c in &costs {
            assert!(names.contains(&c.label.as_str()), "{} not launched: {names:?}", c.label);
        }
        // 40 context rows in chunks of 16: three gathers, three context attentions, three merges.
        let calls = |n: &str| s.ops.iter().find(|x| x.label == n).map(|x| x.calls);
        assert_eq!(calls("gather_ctx"), Some(3));
        assert_eq!(calls("attention (ctx)"), Some(3));
        assert_eq!(calls("merge"), Some(3));
        assert_eq!(calls("attention"), Some(1));
        let no_ctx =
            measure(&q, &block, &spec, 8, &MeasureOptions { context: 0, op_iters: 0, ..o }).expect("runs");
        assert!(no_ctx.ops.is_empty());
    }
}
