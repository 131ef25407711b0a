//! The block's weights kept in fp8 (issue 17): DeepSeek's e4m3 codes with their 128 x 128
//! block scales, multiplied by vt-core's block-scaled fp8 ops instead of being dequantized
//! at load ([`WeightsDtype`]).
//!
//! - Which weights stay fp8 ([`keeps_fp8`]): every projection the block multiplies whole
//!   (`q_a_proj`, `q_b_proj` / `q_proj`, `kv_b_proj`, `o_proj`); `kv_a_proj_with_mqa` when
//!   `kv_lora_rank` is a multiple of 128 (the split norm+rope path multiplies its rows
//!   `0..L` and `L..L+R` apart, and a view's scale blocks count from its first row); the
//!   absorbed `W_UK_T` / `W_UV` when `qk_nope_head_dim` and `qk_nope_head_dim + v_head_dim`
//!   are multiples of 128 (a head's rows of `kv_b_proj` then start a scale block). A weight
//!   that does not qualify is dequantized (the f32 product code x scale, rounded once to
//!   the compute dtype), so the fused and split paths always multiply the same weights.
//!   DeepSeek V2/V3/R1 qualify everywhere.
//! - `W_UK_T` is kept as a per-head transposed copy of the codes (`[N, L, P]`, read as
//!   `[N, P, L]`: K contiguous, the layout the weight-streaming kernel reads); its scales and
//!   `W_UV` (rows `P..P+V` of each head, read transposed) are views of `kv_b_proj`'s.
//! - The A-projections: when both stay fp8 and `q_lora_rank` is a multiple of 128 the store
//!   stacks them (codes and scale rows) into `fused_qkv_a_proj`, which the fused path
//!   multiplies in one GEMM, as it does the float stack; q_a / kv_a are its row views.
//! - Activations (`linear`): steps of fewer than [`FP8_QUANT_MIN_TOKENS`] tokens (decode)
//!   multiply 16-bit activations by the fp8 weight (weight-only: the weight bytes are what a
//!   decode step streams); larger ones (prefill) quantize the activations per token in
//!   1 x 128 groups first (QuantizeFp8, into the workspace) and run both operands in fp8 (the
//!   fp8 tensor rate). A step's numerics so depend on its token count, as in the seeds. The
//!   scales are stored `[ceil(K/128), tokens]` (per token column-major), the layout
//!   cuBLASLt's block-scaled GEMM reads, so MatmulBTFp8's Auto takes it where its other rules
//!   hold (M a multiple of 4, ...; `VT_FP8_LT`, on by default: `0` keeps the Wgmma kernel).
//! - Tensor parallelism: a rank's rows (or columns) of an fp8 weight keep their scale rows
//!   (columns) when the slice starts at a multiple of 128 on every rank; otherwise that
//!   weight is dequantized for every rank (`tp::shard_weights`).

use vt_core::fp8_block::{blocks, quantize_weight, BLOCK};
use vt_core::{
    batched_matmul, batched_matmul_fp8, matmul_bt, matmul_bt_fp8, quantize_fp8, BatchedMatmulArgs,
    BatchedMatmulFp8Args, DType, Error, MatmulBTArgs, MatmulBTFp8Args, QuantizeFp8Args, Queue, Result,
    Tensor,
};

use crate::dims::MlaBlockDims;
use crate::weights::{HostTensor, HostWeights};
use crate::workspace::{MlaWorkspace, Slot};

/// How a checkpoint's fp8 weights are held (`vt-mla run --weights-dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightsDtype {
    /// fp8 kept on CUDA devices for bf16/f16 compute (the fp8 kernels' fast paths take
    /// 16-bit activations), dequantized elsewhere (the CPU and HIP references compute the
    /// same function more slowly, and HIP's fp8 ops are not tuned).
    #[default]
    Auto,
    /// fp8 kept wherever the block can (see the module docs), on any device.
    Fp8,
    /// Dequantized to the compute dtype at load (what the library's loaders do by default).
    Dequantize,
}

impl WeightsDtype {
    pub fn parse(s: &str) -> Option<WeightsDtype> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Some(WeightsDtype::Auto),
            "fp8" | "f8e4m3" | "e4m3" => Some(WeightsDtype::Fp8),
            "dequantize" | "dequantized" => Some(WeightsDtype::Dequantize),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            WeightsDtype::Auto => "auto",
            WeightsDtype::Fp8 => "fp8",
            WeightsDtype::Dequantize => "dequantize",
        }
    }

    /// Whether fp8 weights are kept on `device` for a block computing in `dtype` (`None`:
    /// the checkpoint's default, bf16 for fp8 checkpoints).
    pub fn keeps_fp8_on(self, device: vt_core::DeviceType, dtype: Option<DType>) -> bool {
        match self {
            WeightsDtype::Auto => device == vt_core::DeviceType::Cuda && dtype != Some(DType::F32),
            WeightsDtype::Fp8 => true,
            WeightsDtype::Dequantize => false,
        }
    }
}

/// Steps with at least this many tokens quantize their activations (both operands fp8).
/// Measured on the H200 (docs/perf.md, "Decode GEMMs"): at 64 tokens quantize + Wgmma beat
/// the weight-only skinny kernel on q_b (33.8 against 55.6 us) and o_proj (82.3 against
/// 107.2), tied on the A-projection; at 32 tokens weight-only won (q_b 25.5 against 35.9).
pub const FP8_QUANT_MIN_TOKENS: i64 = 64;

/// Steps with at least this many tokens multiply the absorbed weights in their dequantized
/// form where the store holds both (`VT_FP8_ABSORBED_BY_STEP`). `VT_FP8_ABSORBED`'s A/B on an
/// H100 (docs/perf.md, "Twenty-ninth session"): the fp8 BMMs 4 us faster at 1 token, the float
/// ones 1.5-3% of the step faster at 32 and 7% at 128; with both held and this cut, the step
/// matched the faster form at 1, 32 and 128 tokens ("Thirtieth session").
pub const ABSORBED_FLOAT_MIN_TOKENS: i64 = 32;

/// The name of a weight's scale tensor in [`crate::HostWeights`] (the checkpoint's name).
pub fn scale_name(name: &str) -> Option<&'static str> {
    Some(match name {
        "q_a_proj" => "q_a_proj_scale_inv",
        "q_b_proj" => "q_b_proj_scale_inv",
        "q_proj" => "q_proj_scale_inv",
        "kv_a_proj_with_mqa" => "kv_a_proj_with_mqa_scale_inv",
        "kv_b_proj" => "kv_b_proj_scale_inv",
        "o_proj" => "o_proj_scale_inv",
        _ => return None,
    })
}

/// `w` with every projection that an fp8 checkpoint holds in fp8 ([`scale_name`])
/// block-quantized as DeepSeek's are: e4m3 codes and one f32 scale per 128 x 128 block
/// (amax / 448, `vt_core::fp8_block::quantize_weight`) under the checkpoint's scale name; the
/// other tensors as they are. For benches and tests of fp8 weights without a checkpoint
/// (random layers); [`crate::MlaWeightStore::from_host`] then keeps them fp8 where the block
/// can ([`keeps_fp8`]).
pub fn quantize_host_weights(w: &HostWeights) -> Result<HostWeights> {
    let mut tensors = Vec::with_capacity(w.tensors.len() + 6);
    for (name, t) in &w.tensors {
        let Some(sname) = scale_name(name) else {
            tensors.push((*name, t.clone()));
            continue;
        };
        let bad = |why: String| Error::invalid("quantize_host_weights", name, why);
        let [rows, cols] = t.shape[..] else {
            return Err(bad(format!("is {:?}, not a matrix", t.shape)));
        };
        if !matches!(t.dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(bad(format!("is {}, not a float weight", t.dtype)));
        }
        // (Exact: every f32 / bf16 / f16 value survives f64 and back.)
        let vals: Vec<f32> = t.to_f64().into_iter().map(|v| v as f32).collect();
        let n = usize::try_from(rows)
            .ok()
            .zip(usize::try_from(cols).ok())
            .filter(|&(r, c)| r.checked_mul(c) == Some(vals.len()))
            .ok_or_else(|| bad(format!("{} values for shape {:?}", vals.len(), t.shape)))?;
        let (codes, scales) = quantize_weight(&vals, n.0, n.1);
        tensors.push((*name, HostTensor { dtype: DType::F8E4M3, shape: t.shape.clone(), bytes: codes }));
        tensors.push((
            sname,
            HostTensor {
                dtype: DType::F32,
                shape: vec![blocks(rows), blocks(cols)],
                bytes: scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
            },
        ));
    }
    Ok(HostWeights { dtype: w.dtype, tensors })
}

/// Whether the checkpoint weight `name` stays fp8 in a block of `dims` (module docs).
pub fn keeps_fp8(name: &str, dims: &MlaBlockDims) -> bool {
    let b = BLOCK as i64;
    match name {
        "q_a_proj" | "q_b_proj" | "q_proj" | "kv_b_proj" | "o_proj" => true,
        "kv_a_proj_with_mqa" => dims.kv_lora_rank % b == 0,
        _ => false,
    }
}

/// Whether the absorbed `W_UK_T` / `W_UV` stay fp8 (views of an fp8 `kv_b_proj`).
pub fn absorbed_keep_fp8(dims: &MlaBlockDims) -> bool {
    let b = BLOCK as i64;
    dims.qk_nope_head_dim % b == 0 && (dims.qk_nope_head_dim + dims.v_head_dim) % b == 0
}

/// An fp8 weight: e4m3 codes and their block scales (`[.., ceil(rows/128), ceil(cols/128)]`,
/// counted from the view's first element).
#[derive(Clone, Copy, Debug)]
pub struct Fp8Matrix<'a> {
    pub w: Tensor<'a>,
    pub scale: Tensor<'a>,
}

impl<'a> Fp8Matrix<'a> {
    /// Rows `a..b` of a 2-D weight with their scale rows; `a` must start a scale block.
    pub fn rows(&self, a: i64, b: i64) -> Result<Fp8Matrix<'a>> {
        if a % BLOCK as i64 != 0 {
            return Err(Error::invalid(
                "Fp8Matrix",
                "rows",
                format!("rows {a}..{b} do not start a 128-row scale block"),
            ));
        }
        Ok(Fp8Matrix { w: self.w.slice(0, a, b)?, scale: self.scale.slice(0, a / BLOCK as i64, blocks(b))? })
    }
}

/// The block's fp8 weights; a weight set here replaces its float field of
/// [`crate::MlaBlockWeights`] (which may then be `None`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp8BlockWeights<'a> {
    /// q_lora branch: `[q_a_proj; kv_a_proj_with_mqa]` stacked, `[Q+L+R, H]` (Q a multiple
    /// of 128, so kv_a's scale blocks start at row Q). When set, the fused path runs the
    /// A-projection as one GEMM on it, and `q_a_proj` / `kv_a_proj_with_mqa` must be its
    /// rows `0..Q` / `Q..Q+L+R` (checked).
    pub fused_qkv_a_proj: Option<Fp8Matrix<'a>>,
    /// q_lora branch: `[Q, H]`.
    pub q_a_proj: Option<Fp8Matrix<'a>>,
    /// `[L+R, H]`.
    pub kv_a_proj_with_mqa: Option<Fp8Matrix<'a>>,
    /// `[N*(P+R), Q]`.
    pub q_b_proj: Option<Fp8Matrix<'a>>,
    /// q_proj branch: `[N*(P+R), H]`.
    pub q_proj: Option<Fp8Matrix<'a>>,
    /// `[N*(P+V), L]`.
    pub kv_b_proj: Option<Fp8Matrix<'a>>,
    /// `[N, P, L]` (K contiguous: a view of a `[N, L, P]` copy).
    pub w_uk_t: Option<Fp8Matrix<'a>>,
    /// `[N, L, V]` (K contiguous: a view of `kv_b_proj`).
    pub w_uv: Option<Fp8Matrix<'a>>,
    /// `[H, N*V]`.
    pub o_proj: Option<Fp8Matrix<'a>>,
}

impl Fp8BlockWeights<'_> {
    pub fn any(&self) -> bool {
        [
            self.q_a_proj,
            self.kv_a_proj_with_mqa,
            self.q_b_proj,
            self.q_proj,
            self.kv_b_proj,
            self.w_uk_t,
            self.w_uv,
            self.o_proj,
        ]
        .iter()
        .any(Option::is_some)
    }

    /// The widest K a quantized activation can have (for the workspace), 0 without fp8.
    pub(crate) fn max_k(&self) -> i64 {
        [self.q_a_proj, self.kv_a_proj_with_mqa, self.q_b_proj, self.q_proj, self.kv_b_proj, self.o_proj]
            .iter()
            .flatten()
            .map(|m| m.w.dim(1))
            .max()
            .unwrap_or(0)
    }
}

/// A weight the block multiplies: a float view, or fp8.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Weight<'a> {
    Float(Tensor<'a>),
    Fp8(Fp8Matrix<'a>),
}

impl<'a> Weight<'a> {
    /// The weight named `name`: fp8 when set there, else the float view.
    pub fn pick(
        fp8: Option<Fp8Matrix<'a>>,
        float: Option<Tensor<'a>>,
        name: &'static str,
    ) -> Result<Weight<'a>> {
        match (fp8, float) {
            (Some(m), _) => Ok(Weight::Fp8(m)),
            (None, Some(t)) => Ok(Weight::Float(t)),
            (None, None) => {
                Err(Error::invalid("MlaBlock", name, format!("required weight `{name}` is not set")))
            }
        }
    }

    /// The absorbed weight `name` for a step of `rows` tokens: the float view from
    /// [`ABSORBED_FLOAT_MIN_TOKENS`] rows when both forms are held (`VT_FP8_ABSORBED_BY_STEP`),
    /// else as [`Weight::pick`].
    pub fn pick_by_rows(
        fp8: Option<Fp8Matrix<'a>>,
        float: Option<Tensor<'a>>,
        name: &'static str,
        rows: i64,
    ) -> Result<Weight<'a>> {
        match (fp8, float) {
            (Some(_), Some(t)) if rows >= ABSORBED_FLOAT_MIN_TOKENS => Ok(Weight::Float(t)),
            (f, t) => Weight::pick(f, t, name),
        }
    }

    pub fn rows(&self, a: i64, b: i64) -> Result<Weight<'a>> {
        Ok(match self {
            Weight::Float(t) => Weight::Float(t.slice(0, a, b)?),
            Weight::Fp8(m) => Weight::Fp8(m.rows(a, b)?),
        })
    }
}

/// `out[M,N] = a[M,K] . W^T` for a linear weight: MatmulBT, or MatmulBTFp8 (weight-only,
/// or with `a` quantized into the workspace when M >= [`FP8_QUANT_MIN_TOKENS`] and the
/// workspace was sized for it by [`ensure_workspace`]).
pub(crate) fn linear(
    q: &Queue,
    ws: &MlaWorkspace,
    out: Tensor<'_>,
    a: Tensor<'_>,
    w: Weight<'_>,
) -> Result<()> {
    let m = match w {
        Weight::Float(b) => return matmul_bt(q, &MatmulBTArgs { out, a, b }),
        Weight::Fp8(m) => m,
    };
    let (rows, k) = (a.dim(0), a.dim(1));
    if rows >= FP8_QUANT_MIN_TOKENS {
        let qa = ws.view(Slot::Fp8Act, 0, &[rows, k])?;
        let qs = act_scale_view(ws, rows, k)?;
        quantize_fp8(q, &QuantizeFp8Args { out: qa, scale: qs, x: a })?;
        return matmul_bt_fp8(
            q,
            &MatmulBTFp8Args { out, a: qa, a_scale: Some(qs), b: m.w, b_scale: m.scale },
        );
    }
    matmul_bt_fp8(q, &MatmulBTFp8Args { out, a, a_scale: None, b: m.w, b_scale: m.scale })
}

/// The per-token scales of `rows` quantized activations of width `k`: `[rows, ceil(k/128)]`
/// stored transposed (strides `[1, rows]`: token m's group g at `g * rows + m`), the layout
/// cuBLASLt's block-scaled GEMM reads (`vt_cuda::fp8_matmul::Kernel::Lt`; DeepGEMM and
/// torch keep it too). QuantizeFp8 and MatmulBTFp8 take any scale strides, so every backend
/// and kernel reads the same view; where Lt's other rules fail (M not a multiple of 4, odd
/// widths) the op's Auto runs the other kernels on it as it is (no copy).
fn act_scale_view<'w>(ws: &'w MlaWorkspace, rows: i64, k: i64) -> Result<Tensor<'w>> {
    ws.view(Slot::Fp8ActScale, 0, &[blocks(k), rows])?.transpose(0, 1)
}

/// `out[g] = a[g] . W[g]` for the absorbed per-head weights (decode: weight-only).
pub(crate) fn bmm(q: &Queue, out: Tensor<'_>, a: Tensor<'_>, w: Weight<'_>) -> Result<()> {
    match w {
        Weight::Float(b) => batched_matmul(q, &BatchedMatmulArgs { out, a, b }),
        Weight::Fp8(m) => {
            batched_matmul_fp8(q, &BatchedMatmulFp8Args { out, a, a_scale: None, b: m.w, b_scale: m.scale })
        }
    }
}

/// Sizes the quantized-activation scratch for a step whose largest GEMM input has `rows`
/// rows (nothing for a step below [`FP8_QUANT_MIN_TOKENS`] or a block without fp8 weights).
pub(crate) fn ensure_workspace(
    q: &Queue,
    ws: &mut MlaWorkspace,
    fp8: &Fp8BlockWeights<'_>,
    rows: i64,
) -> Result<()> {
    let k = fp8.max_k();
    if k == 0 || rows < FP8_QUANT_MIN_TOKENS {
        return Ok(());
    }
    let size = |cols: i64| {
        rows.checked_mul(cols).ok_or_else(|| {
            Error::invalid(
                "MlaBlock",
                "tokens",
                format!("{rows} tokens x {cols} overflows the fp8 scratch size"),
            )
        })
    };
    let (codes, scales) = (size(k)?, size(blocks(k))?);
    ws.ensure(q, Slot::Fp8Act, DType::F8E4M3, codes, codes)?;
    ws.ensure(q, Slot::Fp8ActScale, DType::F32, scales, scales)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vt_core::fp8_block::quantize_row;
    use vt_core::{encode_f64, Buffer, Device};

    use crate::workspace::MlaLimits;

    /// A random layer's projections become codes beside their checkpoint-named 128 x 128
    /// scales, decoding back to within half an e4m3 step; the norms stay as they are.
    #[test]
    fn host_weights_quantize_as_fp8_checkpoints_hold_them() {
        let spec = crate::tp::RandomLayerSpec::SMALL;
        let (_, w) = spec.layer(DType::BF16, 3).unwrap();
        let q = quantize_host_weights(&w).unwrap();
        for (name, t) in &w.tensors {
            let got = q.get(name).unwrap();
            let Some(sname) = scale_name(name) else {
                assert_eq!(got, t, "{name} unchanged");
                continue;
            };
            assert_eq!((got.dtype, &got.shape), (DType::F8E4M3, &t.shape), "{name}");
            let s = q.get(sname).unwrap();
            assert_eq!(s.shape, vec![blocks(t.shape[0]), blocks(t.shape[1])], "{sname}");
            let deq = q.float(name).unwrap().to_f64();
            let amax = t.to_f64().iter().fold(0f64, |m, v| m.max(v.abs()));
            for (a, b) in deq.iter().zip(t.to_f64()) {
                // e4m3 keeps 3 mantissa bits (half a step: 1/16 relative), bf16 rounds again.
                assert!((a - b).abs() <= b.abs() / 12.0 + amax / 448.0 / 64.0, "{name}: {a} vs {b}");
            }
        }
        assert_eq!(q.tensors.len(), w.tensors.len() + 5, "q_a, q_b, kv_a, kv_b, o_proj: 5 scales");
    }

    /// A prefill-sized `linear` on the CPU quantizes into the column-major scale layout
    /// (token m's group g at `g * rows + m`, cuBLASLt's) and multiplies the same numbers as
    /// row-major scales would: the output is bit for bit MatmulBTFp8 on a row-major copy.
    /// 130 and 132 tokens: M not a multiple of 4 (Lt refuses it on the GPU) and one that is.
    #[test]
    fn prefill_linear_quantizes_into_column_major_scales() {
        vt_cpu::register();
        let q = Queue::new(Device::CPU).expect("the CPU backend registers");
        let (n, k) = (256i64, 300i64);
        let kb = blocks(k);
        let mut z = 0x5eed_u64;
        let mut next = move || {
            z = z.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (z >> 33) as u32
        };
        // Weight codes avoid the NaN codes 0x7f / 0xff.
        let codes: Vec<u8> = (0..n * k).map(|_| (next() % 0x7f) as u8 | (next() as u8 & 0x80)).collect();
        let scales: Vec<f64> = (0..blocks(n) * kb).map(|i| 2f64.powi(-8 + i as i32 % 5)).collect();
        let w = Buffer::from_bytes(&q, DType::F8E4M3, &[n, k], &codes).unwrap();
        let ws_buf =
            Buffer::from_bytes(&q, DType::F32, &[blocks(n), kb], &encode_f64(DType::F32, &scales)).unwrap();
        let m = Fp8Matrix { w: w.view(), scale: ws_buf.view() };
        let fp8 = Fp8BlockWeights { q_a_proj: Some(m), ..Default::default() };
        for rows in [130i64, 132] {
            assert!(rows >= FP8_QUANT_MIN_TOKENS);
            let vals: Vec<f64> = (0..rows * k)
                .map(|i| (next() as f64 / u32::MAX as f64 - 0.5) * 2f64.powi((i % k / 128) as i32))
                .collect();
            let x = Buffer::from_bytes(&q, DType::BF16, &[rows, k], &encode_f64(DType::BF16, &vals)).unwrap();
            let out = Buffer::nan(&q, DType::BF16, &[rows, n]).unwrap();
            let mut ws = MlaWorkspace::new(MlaLimits::default()).unwrap();
            ensure_workspace(&q, &mut ws, &fp8, rows).unwrap();
            linear(&q, &ws, out.view(), x.view(), Weight::Fp8(m)).unwrap();

            // The scales in the slot, column-major, as quantize_row gives them per token.
            let xs = q.read_f64(&x.view()).unwrap();
            let got = q.read_f64(&ws.view(Slot::Fp8ActScale, 0, &[kb * rows]).unwrap()).unwrap();
            let mut row_major = vec![0f64; (rows * kb) as usize];
            let (mut c, mut s) = (vec![0u8; k as usize], vec![0f32; kb as usize]);
            for t in 0..rows as usize {
                let r: Vec<f32> = xs[t * k as usize..][..k as usize].iter().map(|&v| v as f32).collect();
                quantize_row(&r, &mut c, &mut s);
                for g in 0..kb as usize {
                    assert_eq!(
                        got[g * rows as usize + t],
                        s[g] as f64,
                        "rows {rows}: scale of token {t}, group {g}"
                    );
                    row_major[t * kb as usize + g] = s[g] as f64;
                }
            }
            // The same product with row-major scales (a copy) and the same codes.
            let qa = ws.view(Slot::Fp8Act, 0, &[rows, k]).unwrap();
            let sr =
                Buffer::from_bytes(&q, DType::F32, &[rows, kb], &encode_f64(DType::F32, &row_major)).unwrap();
            let want = Buffer::nan(&q, DType::BF16, &[rows, n]).unwrap();
            let args = MatmulBTFp8Args {
                out: want.view(),
                a: qa,
                a_scale: Some(sr.view()),
                b: m.w,
                b_scale: m.scale,
            };
            matmul_bt_fp8(&q, &args).unwrap();
            let (o, e) = (q.read_f64(&out.view()).unwrap(), q.read_f64(&want.view()).unwrap());
            assert!(o.iter().all(|v| v.is_finite()), "rows {rows}: output written");
            assert_eq!(o, e, "rows {rows}: column-major scales multiply as row-major ones do");
        }
    }
}
