//! `vt-mla bench-gemm`: the decode step's GEMMs at decode shapes (M = 1..128 tokens), each
//! through its registered op exactly as the block issues it (the same weights' shapes and
//! the same strided views), against the weight-streaming floor: the bytes the GEMM must move
//! (weight, input and output, each once) at the device's measured copy bandwidth. Issue 18
//! item 3 asks where the backend (cuBLAS on CUDA) stays more than 15% above that floor.
//!
//! - `MatmulBT` (`out[M, N] = x[M, K] . W[N, K]^T`): `q_a_proj` (rows `0..Q` of the fused
//!   A-projection, as the block slices it), `kv_a_proj` (its rows `Q..Q+L+R`), `qkv_a`
//!   (the whole `[Q+L+R, H]` merged weight: one GEMM for both, a fusion candidate),
//!   `q_b_proj`, `o_proj`.
//! - `BatchedMatmul` over the N heads: `q_absorb` (`q_nope [N, M, P]`, a transposed view of
//!   q, times `W_UK_T [N, P, L]`) and `v_up` (`[N, M, L]` view of the attention output times
//!   `W_UV [N, L, V]`, written into `[M, N, V]` viewed as `[N, M, V]`).
//! - Time: CUDA events around each run with the L2 flushed before it (the weights come from
//!   HBM, as in a decode step), the median of `--iters`; elsewhere `vt_core` events, no
//!   floor.

use std::path::PathBuf;

use clap::Args;
use mla_block::tp::RandomLayerSpec;
use mla_block::MlaBlockDims;
use vt_core::{
    batched_matmul, matmul_bt, BatchedMatmulArgs, Buffer, DType, Device, DeviceType, Error, MatmulBTArgs,
    Queue, Result,
};

use crate::graph_bench::StepTimer;
use crate::tp::{DTypeArg, LayerArg};
use crate::{positive_i64, positive_usize, BackendArg};

/// Issue 18's threshold: a GEMM more than this factor above its floor is flagged.
pub const FLAG_RATIO: f64 = 1.15;

#[derive(Args, Debug)]
pub struct GemmBenchArgs {
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    #[arg(long, value_enum, default_value_t = LayerArg::V3)]
    layer: LayerArg,
    #[arg(long, value_enum, default_value_t = DTypeArg::Bf16)]
    dtype: DTypeArg,
    /// Tokens per GEMM (the decode batch), comma-separated.
    #[arg(long, value_name = "M,...", value_delimiter = ',', default_value = "1,32,128", value_parser = positive_i64)]
    m: Vec<i64>,
    /// Timed runs per GEMM and M (the median is reported).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = positive_usize)]
    iters: usize,
    /// Also write the rows as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// Which op a GEMM is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmKind {
    /// `MatmulBT` with a weight `[n, k]`: rows `from..to` of the fused A-projection of
    /// `total` rows when `fused_rows` is `Some((from, to, total))`.
    MatmulBT { n: i64, k: i64, fused_rows: Option<(i64, i64, i64)> },
    /// `q_nope [heads, M, P] x W_UK_T [heads, P, L]`.
    QAbsorb,
    /// `[heads, M, L] x W_UV [heads, L, V]`.
    VUp,
}

/// One of the decode step's GEMMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    pub name: &'static str,
    pub kind: GemmKind,
    /// Part of the step as the block runs it (`qkv_a` is a candidate, not run).
    pub in_step: bool,
}

/// The step's GEMMs for `d` (the q_lora branch: q_a / q_b; else q_proj).
pub fn decode_gemms(d: &MlaBlockDims) -> Vec<Gemm> {
    let (h, n, ql) = (d.hidden_size, d.num_heads, d.q_lora_rank);
    let (l, p, r, v) = (d.kv_lora_rank, d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim);
    let a_rows = if d.has_q_lora() { ql + l + r } else { l + r };
    let mm = |name, n, k, fused_rows, in_step| Gemm {
        name,
        kind: GemmKind::MatmulBT { n, k, fused_rows },
        in_step,
    };
    let mut out = Vec::new();
    if d.has_q_lora() {
        out.push(mm("q_a_proj", ql, h, Some((0, ql, a_rows)), true));
        out.push(mm("kv_a_proj", l + r, h, Some((ql, a_rows, a_rows)), true));
        out.push(mm("qkv_a (merged)", a_rows, h, Some((0, a_rows, a_rows)), false));
        out.push(mm("q_b_proj", n * (p + r), ql, None, true));
    } else {
        out.push(mm("kv_a_proj", l + r, h, None, true));
        out.push(mm("q_proj", n * (p + r), h, None, true));
    }
    out.push(Gemm { name: "q_absorb (bmm)", kind: GemmKind::QAbsorb, in_step: true });
    out.push(Gemm { name: "v_up (bmm)", kind: GemmKind::VUp, in_step: true });
    out.push(mm("o_proj", h, n * v, None, true));
    out
}

impl Gemm {
    /// Elements of (weight, input, output) at `m` tokens: what the GEMM must move.
    pub fn elems(&self, d: &MlaBlockDims, m: i64) -> (i64, i64, i64) {
        let (n, l, p, v) = (d.num_heads, d.kv_lora_rank, d.qk_nope_head_dim, d.v_head_dim);
        match self.kind {
            GemmKind::MatmulBT { n: rows, k, .. } => (rows * k, m * k, m * rows),
            GemmKind::QAbsorb => (n * p * l, n * m * p, n * m * l),
            GemmKind::VUp => (n * l * v, n * m * l, n * m * v),
        }
    }

    /// Multiply-adds times 2.
    pub fn flops(&self, d: &MlaBlockDims, m: i64) -> f64 {
        2.0 * m as f64 * self.elems(d, m).0 as f64
    }

    /// `N x K` (or `heads x K x N`) for the table.
    pub fn shape(&self, d: &MlaBlockDims) -> String {
        let (n, l, p, v) = (d.num_heads, d.kv_lora_rank, d.qk_nope_head_dim, d.v_head_dim);
        match self.kind {
            GemmKind::MatmulBT { n: rows, k, .. } => format!("{rows} x {k}"),
            GemmKind::QAbsorb => format!("{n} x {p} x {l}"),
            GemmKind::VUp => format!("{n} x {l} x {v}"),
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmRow {
    pub gemm: Gemm,
    pub m: i64,
    pub ms: f64,
    pub bytes: f64,
    pub flops: f64,
    /// `bytes / copy bandwidth`, where measured.
    pub floor_ms: Option<f64>,
}

impl GemmRow {
    pub fn over_floor(&self) -> Option<f64> {
        self.floor_ms.map(|f| self.ms / f)
    }
}

/// Times every GEMM of `gemms` at every M of `ms` on `q` with `timer` (see the module
/// docs); `bw`: the copy bandwidth of the floors, where measured.
pub fn run(
    q: &Queue,
    timer: &StepTimer<'_>,
    bw: Option<f64>,
    (d, dt): (&MlaBlockDims, DType),
    gemms: &[Gemm],
    ms: &[i64],
    iters: usize,
) -> Result<Vec<GemmRow>> {
    let mmax = ms.iter().copied().max().unwrap_or(1);
    let n = d.num_heads;
    let (l, p, r, v) = (d.kv_lora_rank, d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim);
    let dqk = p + r;
    let elt = dt.size_of() as f64;
    let mut rows = Vec::new();
    for (gi, g) in gemms.iter().enumerate() {
        let seed = 100 + 10 * gi as u64;
        // The weight (the whole fused A-projection when the block slices it), the input and
        // output buffers for the largest M; each M takes their first rows.
        let (wshape, ashape, oshape): (Vec<i64>, Vec<i64>, Vec<i64>) = match g.kind {
            GemmKind::MatmulBT { n: rows, k, fused_rows } => {
                let wrows = fused_rows.map_or(rows, |(_, _, total)| total);
                (vec![wrows, k], vec![mmax, k], vec![mmax, rows])
            }
            GemmKind::QAbsorb => (vec![n, p, l], vec![mmax, n * dqk], vec![n, mmax, l]),
            GemmKind::VUp => (vec![n, l, v], vec![mmax, n, l], vec![mmax, n, v]),
        };
        let w = Buffer::uninit(q, dt, &wshape)?;
        let a = Buffer::uninit(q, dt, &ashape)?;
        let o = Buffer::uninit(q, dt, &oshape)?;
        let fan_in = *wshape.get(wshape.len() - 2).unwrap_or(&1) as f32;
        let k_in = match g.kind {
            GemmKind::MatmulBT { k, .. } => k as f32,
            _ => fan_in,
        };
        timer.fill(&w.view(), seed, (3.0 / k_in).sqrt())?;
        timer.fill(&a.view(), seed + 1, 3f32.sqrt())?;
        for &m in ms {
            let call = || -> Result<()> {
                match g.kind {
                    GemmKind::MatmulBT { fused_rows, .. } => {
                        let wv = match fused_rows {
                            Some((from, to, _)) => w.view().slice(0, from, to)?,
                            None => w.view(),
                        };
                        matmul_bt(
                            q,
                            &MatmulBTArgs {
                                out: o.view().slice(0, 0, m)?,
                                a: a.view().slice(0, 0, m)?,
                                b: wv,
                            },
                        )
                    }
                    GemmKind::QAbsorb => {
                        let qn = a.view().as_strided(0, &[n, m, p], &[dqk, n * dqk, 1])?;
                        let out = o.view().as_strided(0, &[n, m, l], &[m * l, l, 1])?;
                        batched_matmul(q, &BatchedMatmulArgs { out, a: qn, b: w.view() })
                    }
                    GemmKind::VUp => {
                        let x = a.view().as_strided(0, &[n, m, l], &[l, n * l, 1])?;
                        let out = o.view().as_strided(0, &[n, m, v], &[v, n * v, 1])?;
                        batched_matmul(q, &BatchedMatmulArgs { out, a: x, b: w.view() })
                    }
                }
            };
            let t = timer.time(iters, call)?;
            let (we, ae, oe) = g.elems(d, m);
            let bytes = (we + ae + oe) as f64 * elt;
            rows.push(GemmRow {
                gemm: *g,
                m,
                ms: t,
                bytes,
                flops: g.flops(d, m),
                floor_ms: bw.map(|bw| bytes / bw * 1e3),
            });
        }
    }
    q.synchronize()?;
    Ok(rows)
}

/// Prints the table (and the per-M sums of the step's GEMMs).
pub fn print(rows: &[GemmRow], d: &MlaBlockDims, flushed: bool, bw: Option<f64>) {
    println!(
        "{:<16} {:>18} {:>5} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "gemm", "shape", "M", "us", "floor us", "x floor", "TB/s", "TFLOP/s"
    );
    for r in rows {
        let (floor, over) = match (r.floor_ms, r.over_floor()) {
            (Some(f), Some(x)) => {
                (format!("{:.1}", f * 1e3), format!("{x:.2}{}", if x > FLAG_RATIO { " *" } else { "" }))
            }
            _ => ("-".into(), "-".into()),
        };
        println!(
            "{:<16} {:>18} {:>5} {:>9.1} {:>9} {:>9} {:>8.2} {:>8.1}",
            r.gemm.name,
            r.gemm.shape(d),
            r.m,
            r.ms * 1e3,
            floor,
            over,
            r.bytes / (r.ms * 1e-3) / 1e12,
            r.flops / (r.ms * 1e-3) / 1e12
        );
    }
    let mut ms: Vec<i64> = Vec::new();
    for r in rows {
        if !ms.contains(&r.m) {
            ms.push(r.m);
        }
    }
    for m in ms {
        let step: Vec<&GemmRow> = rows.iter().filter(|r| r.m == m && r.gemm.in_step).collect();
        let t: f64 = step.iter().map(|r| r.ms).sum();
        let f: Option<f64> = step.iter().map(|r| r.floor_ms).sum();
        match f {
            Some(f) => println!(
                "M = {m:>3}: the step's GEMMs (without the merged candidate) {:.1} us, floor {:.1} us ({:.2}x)",
                t * 1e3,
                f * 1e3,
                t / f
            ),
            None => println!("M = {m:>3}: the step's GEMMs (without the merged candidate) {:.1} us", t * 1e3),
        }
    }
    match bw {
        Some(bw) => println!(
            "floor = (weight + input + output bytes) / {:.2} TB/s (measured device-to-device copy, read + write); \
             * more than {:.0}% above it; times: events{}, median",
            bw / 1e12,
            (FLAG_RATIO - 1.0) * 100.0,
            if flushed { ", L2 flushed before each run" } else { "" }
        ),
        None => println!("no floor: the copy bandwidth is measured on CUDA only; times: events, median"),
    }
}

/// The rows as JSON.
pub fn rows_json(device: &str, rows: &[GemmRow], bw: Option<f64>) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "gemm": r.gemm.name, "m": r.m, "us": r.ms * 1e3, "bytes": r.bytes, "flops": r.flops,
                "floor_us": r.floor_ms.map(|f| f * 1e3), "x_floor": r.over_floor(), "in_step": r.gemm.in_step,
            })
        })
        .collect();
    serde_json::json!({ "impl": format!("vt {}", env!("CARGO_PKG_VERSION")), "device": device,
                        "copy_bandwidth": bw, "rows": rows })
}

/// `vt-mla bench-gemm`.
pub fn command(a: &GemmBenchArgs, pick: impl Fn(BackendArg) -> Result<DeviceType>) -> Result<()> {
    let kind = pick(a.backend)?;
    // V3.2's main GEMMs are V3's (its indexer's are not listed here).
    let spec = match a.layer {
        LayerArg::V3 | LayerArg::V32 => RandomLayerSpec::DEEPSEEK_V3,
        LayerArg::Small | LayerArg::SmallV32 => RandomLayerSpec::SMALL,
    };
    let dt = match a.dtype {
        DTypeArg::Bf16 => DType::BF16,
        DTypeArg::F16 => DType::F16,
        DTypeArg::F32 => DType::F32,
    };
    let d = spec.config()?.dims;
    let q = Queue::new(Device::new(kind, 0))?;
    let device =
        vt_core::registry::backend(kind).map(|b| b.device_name(0)).unwrap_or_else(|| kind.to_string());
    println!(
        "vt-mla bench-gemm: the decode step's GEMMs ({} layer, {dt}) on {kind}:0 ({device}), M = {:?}, median of {}",
        match a.layer {
            LayerArg::V3 => "DeepSeek-V3",
            LayerArg::V32 => "DeepSeek-V3.2 (V3's GEMMs, the indexer's left out)",
            LayerArg::Small | LayerArg::SmallV32 => "small",
        },
        a.m,
        a.iters
    );
    let gemms = decode_gemms(&d);
    let timer = StepTimer::new(&q);
    let bw = timer.copy_bandwidth()?;
    let rows =
        crate::progress::stage("timing the GEMMs", || run(&q, &timer, bw, (&d, dt), &gemms, &a.m, a.iters))?;
    print(&rows, &d, timer.flushes(), bw);
    if let Some(path) = &a.json {
        let v = rows_json(&device, &rows, bw);
        let text = serde_json::to_string_pretty(&v).map_err(|e| Error::other("bench-gemm", e.to_string()))?;
        std::fs::write(path, text).map_err(|e| Error::other(path.display().to_string(), e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v3_decode_gemms_have_issue_18s_shapes() {
        let d = RandomLayerSpec::DEEPSEEK_V3.config().unwrap().dims;
        let g = decode_gemms(&d);
        let names: Vec<&str> = g.iter().map(|g| g.name).collect();
        assert_eq!(
            names,
            ["q_a_proj", "kv_a_proj", "qkv_a (merged)", "q_b_proj", "q_absorb (bmm)", "v_up (bmm)", "o_proj"]
        );
        let shapes: Vec<String> = g.iter().map(|g| g.shape(&d)).collect();
        assert_eq!(
            shapes,
            [
                "1536 x 7168",
                "576 x 7168",
                "2112 x 7168",
                "24576 x 1536",
                "128 x 128 x 512",
                "128 x 512 x 128",
                "7168 x 16384"
            ]
        );
        // Weight, input and output elements at M = 32.
        assert_eq!(g[2].elems(&d, 32), (2112 * 7168, 32 * 7168, 32 * 2112));
        assert_eq!(g[4].elems(&d, 32), (128 * 128 * 512, 128 * 32 * 128, 128 * 32 * 512));
        assert_eq!(g[6].flops(&d, 1), 2.0 * 7168.0 * 16384.0);
        // The merged candidate is not part of the step.
        assert_eq!(g.iter().filter(|g| !g.in_step).count(), 1);
    }

    #[test]
    fn the_q_proj_branch_has_no_q_a() {
        let d = RandomLayerSpec { q_lora_rank: 0, ..RandomLayerSpec::SMALL }.config().unwrap().dims;
        let names: Vec<&str> = decode_gemms(&d).iter().map(|g| g.name).collect();
        assert_eq!(names, ["kv_a_proj", "q_proj", "q_absorb (bmm)", "v_up (bmm)", "o_proj"]);
    }

    #[test]
    fn every_gemm_runs_on_the_cpu_at_each_m() {
        vt_backends::init();
        let q = Queue::new(Device::CPU).unwrap();
        let d = RandomLayerSpec::SMALL.config().unwrap().dims;
        let timer = StepTimer::new(&q);
        let gemms = decode_gemms(&d);
        let rows = run(&q, &timer, None, (&d, DType::F32), &gemms, &[1, 3], 2).unwrap();
        assert_eq!(rows.len(), 2 * gemms.len());
        assert!(rows.iter().all(|r| r.ms >= 0.0 && r.floor_ms.is_none() && r.bytes > 0.0));
        assert_eq!((rows[0].m, rows[1].m), (1, 3));
    }
}
