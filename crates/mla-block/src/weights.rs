//! The block's weights: views the forward reads ([`MlaBlockWeights`]), an owning store
//! loaded from a Hugging Face safetensors checkpoint ([`MlaWeightStore`]), and the weight
//! absorption of `kv_b_proj` into `W_UK_T` / `W_UV` for the decode form.

use std::path::Path;

use safetensors::{Dtype as StDtype, SafeTensors};
use vt_core::{Buffer, DType, Element, Error, Queue, Result, Tensor};

use crate::checkpoint::{Checkpoint, RawTensor, WeightSource};
use crate::config::MlaConfig;
use crate::dims::MlaBlockDims;
use crate::fp8::{absorbed_keep_fp8, keeps_fp8, scale_name, Fp8BlockWeights, Fp8Matrix, WeightsDtype};
use crate::rope_cache::RopeCosSinCache;

/// The block's weights as device views. A field is `None` when it is not set; which ones
/// are required depends on the q branch ([`MlaBlockWeights::check`]).
///
/// All float weights share the activations' dtype; `rope_cos_sin_cache` is f32.
#[derive(Clone, Copy, Debug, Default)]
pub struct MlaBlockWeights<'a> {
    /// q_lora branch: `[q_a_proj; kv_a_proj_with_mqa]` stacked by rows, `[Q+L+R, H]`.
    pub fused_qkv_a_proj: Option<Tensor<'a>>,
    /// q_lora branch: `[Q]`.
    pub q_a_layernorm: Option<Tensor<'a>>,
    /// q_lora branch: [N*(P+R), Q].
    pub q_b_proj: Option<Tensor<'a>>,
    /// q_proj branch: [N*(P+R), H].
    pub q_proj: Option<Tensor<'a>>,
    /// q_proj branch: `[L+R, H]`.
    pub kv_a_proj_with_mqa: Option<Tensor<'a>>,
    /// `[L]`: normalizes the latent only, never the rope part.
    pub kv_a_layernorm: Option<Tensor<'a>>,
    /// [N*(P+V), L]: the up-projection of the materialized (prefill) form.
    pub kv_b_proj: Option<Tensor<'a>>,
    /// `[N, P, L]`: `kv_b_proj`'s key half, absorbed into the decode query.
    pub w_uk_t: Option<Tensor<'a>>,
    /// `[N, L, V]`: `kv_b_proj`'s value half, applied after decode attention.
    pub w_uv: Option<Tensor<'a>>,
    /// `[H, N*V]`.
    pub o_proj: Option<Tensor<'a>>,
    /// `[max_pos, R]` f32, from [`crate::YarnRopeParams::cos_sin_cache`] (a store's is its
    /// shared [`RopeCosSinCache`]).
    pub rope_cos_sin_cache: Option<Tensor<'a>>,
    /// Weights kept in fp8 (issue 17, [`crate::fp8`]): each one set replaces its float field
    /// above (q_a / kv_a replace the fused A-projection's rows), which may then be `None`.
    pub fp8: Fp8BlockWeights<'a>,
    /// DeepSeek-V3.2's lightning indexer (required when the dims have one).
    pub indexer: IndexerWeights<'a>,
}

/// The indexer's weights (`self_attn.indexer.*` in the checkpoint), in the compute dtype.
#[derive(Clone, Copy, Debug, Default)]
pub struct IndexerWeights<'a> {
    /// `indexer.wq_b` `[Hi*Di, Q]`: the indexer query from `q_a_layernorm`'s output.
    pub wq_b: Option<Tensor<'a>>,
    /// `indexer.wk` `[Di, H]`: the indexer key.
    pub wk: Option<Tensor<'a>>,
    /// `indexer.k_norm` weight `[Di]` (a LayerNorm, eps 1e-6).
    pub k_norm: Option<Tensor<'a>>,
    /// `indexer.k_norm` bias `[Di]`.
    pub k_norm_bias: Option<Tensor<'a>>,
    /// `indexer.weights_proj` `[Hi, H]`: the per-head weights of the scores.
    pub weights_proj: Option<Tensor<'a>>,
}

/// The indexer's checkpoint names (as [`hf_weight_shapes`] lists them) and shapes.
fn indexer_shapes(dims: &MlaBlockDims) -> Vec<(&'static str, Vec<i64>)> {
    let Some(ix) = dims.indexer else { return Vec::new() };
    let (h, q) = (dims.hidden_size, dims.q_lora_rank);
    vec![
        ("indexer.wq_b", vec![ix.n_heads * ix.head_dim, q]),
        ("indexer.wk", vec![ix.head_dim, h]),
        ("indexer.k_norm", vec![ix.head_dim]),
        ("indexer.k_norm.bias", vec![ix.head_dim]),
        ("indexer.weights_proj", vec![ix.n_heads, h]),
    ]
}

/// The checkpoint tensor of weight `name`: `{prefix}{name}.weight`, or `{prefix}{name}` for
/// a bias (`indexer.k_norm.bias`).
pub(crate) fn tensor_name(prefix: &str, name: &str) -> String {
    if name.ends_with(".bias") {
        format!("{prefix}{name}")
    } else {
        format!("{prefix}{name}.weight")
    }
}

const OP: &str = "MlaBlockWeights";

impl<'a> MlaBlockWeights<'a> {
    /// Every weight the selected branch needs is set, has the right shape and dtype, a unit
    /// inner stride, and lives on `device`. Errors name the weight.
    pub fn check(&self, dims: &MlaBlockDims, dtype: DType, device: vt_core::Device) -> Result<()> {
        dims.validate()?;
        let (h, n, q) = (dims.hidden_size, dims.num_heads, dims.q_lora_rank);
        let (l, p, r, v) = (dims.kv_lora_rank, dims.qk_nope_head_dim, dims.qk_rope_head_dim, dims.v_head_dim);
        let dqk = dims.qk_head_dim();
        let branch = if dims.has_q_lora() { "q_lora" } else { "q_proj" };
        let mut want: Vec<(&'static str, Option<Tensor<'a>>, Vec<i64>)> = Vec::new();
        let f8 = &self.fp8;
        // A weight kept in fp8 is checked as such; otherwise its float view is required. A
        // float view set beside an fp8 one (the absorbed weights under
        // VT_FP8_ABSORBED_BY_STEP) is checked too.
        let mut either = |name: &'static str,
                          fp8: Option<Fp8Matrix<'a>>,
                          float: Option<Tensor<'a>>,
                          shape: Vec<i64>|
         -> Result<()> {
            match fp8 {
                Some(m) => {
                    check_fp8(name, &m, &shape, device)?;
                    if float.is_some() {
                        want.push((name, float, shape));
                    }
                    Ok(())
                }
                None => {
                    want.push((name, float, shape));
                    Ok(())
                }
            }
        };
        if dims.has_q_lora() {
            // q_a: fp8, or rows 0..Q of the fused float weight. kv_a: fp8, a float
            // kv_a_proj_with_mqa, or rows Q.. of the fused float weight.
            let kv_a_apart = f8.kv_a_proj_with_mqa.is_some() || self.kv_a_proj_with_mqa.is_some();
            if f8.q_a_proj.is_none() || !kv_a_apart {
                either("fused_qkv_a_proj", None, self.fused_qkv_a_proj, vec![q + l + r, h])?;
            }
            if let Some(m) = f8.q_a_proj {
                check_fp8("q_a_proj", &m, &[q, h], device)?;
            }
            if let Some(m) = f8.fused_qkv_a_proj {
                // The merged A-projection multiplies it in place of the two: they must be its
                // rows 0..Q and Q.. (views of the same codes).
                check_fp8("fp8.fused_qkv_a_proj", &m, &[q + l + r, h], device)?;
                let row_view = |part: Option<Fp8Matrix<'a>>, a: i64| {
                    part.is_some_and(|x| {
                        m.rows(a, a + x.w.dim(0)).is_ok_and(|v| {
                            v.w.data_addr() == x.w.data_addr() && v.scale.data_addr() == x.scale.data_addr()
                        })
                    })
                };
                if !row_view(f8.q_a_proj, 0) || !row_view(f8.kv_a_proj_with_mqa, q) {
                    return Err(Error::invalid(
                        "MlaBlockWeights",
                        "fp8.fused_qkv_a_proj",
                        "needs fp8.q_a_proj and fp8.kv_a_proj_with_mqa set to its rows 0..Q and Q..Q+L+R",
                    ));
                }
            }
            if kv_a_apart {
                either("kv_a_proj_with_mqa", f8.kv_a_proj_with_mqa, self.kv_a_proj_with_mqa, vec![l + r, h])?;
            }
            either("q_a_layernorm", None, self.q_a_layernorm, vec![q])?;
            either("q_b_proj", f8.q_b_proj, self.q_b_proj, vec![n * dqk, q])?;
        } else {
            either("q_proj", f8.q_proj, self.q_proj, vec![n * dqk, h])?;
            either("kv_a_proj_with_mqa", f8.kv_a_proj_with_mqa, self.kv_a_proj_with_mqa, vec![l + r, h])?;
        }
        either("kv_a_layernorm", None, self.kv_a_layernorm, vec![l])?;
        either("kv_b_proj", f8.kv_b_proj, self.kv_b_proj, vec![n * (p + v), l])?;
        either("w_uk_t", f8.w_uk_t, self.w_uk_t, vec![n, p, l])?;
        either("w_uv", f8.w_uv, self.w_uv, vec![n, l, v])?;
        either("o_proj", f8.o_proj, self.o_proj, vec![h, n * v])?;
        let ix = &self.indexer;
        let fields = [ix.wq_b, ix.wk, ix.k_norm, ix.k_norm_bias, ix.weights_proj];
        for ((name, shape), t) in indexer_shapes(dims).into_iter().zip(fields) {
            either(name, None, t, shape)?;
        }
        for (name, t, shape) in want {
            let Some(t) = t else {
                return Err(Error::invalid(
                    OP,
                    name,
                    format!("required weight `{name}` is not set for the {branch} branch"),
                ));
            };
            check_tensor(name, &t, &shape, dtype, device)?;
        }
        let Some(cache) = self.rope_cos_sin_cache else {
            return Err(Error::invalid(OP, "rope_cos_sin_cache", "required cos/sin cache is not set"));
        };
        if cache.rank() != 2 || cache.dim(1) != r || cache.dim(0) <= 0 {
            return Err(Error::invalid(
                OP,
                "rope_cos_sin_cache",
                format!("shape is {:?}, expected [max_pos > 0, qk_rope_head_dim = {r}]", cache.shape()),
            ));
        }
        if cache.dtype() != DType::F32 || !cache.is_contiguous() || cache.device() != device {
            return Err(Error::invalid(
                OP,
                "rope_cos_sin_cache",
                format!("must be contiguous f32 on {device}, got {cache:?}"),
            ));
        }
        Ok(())
    }
}

/// An fp8 weight: e4m3 codes of `shape` (stride 1 on the last dim of a matrix, on K of
/// a per-head weight) and f32 scales of one per 128 x 128 block of each matrix.
fn check_fp8(name: &'static str, m: &Fp8Matrix<'_>, shape: &[i64], dev: vt_core::Device) -> Result<()> {
    let w = &m.w;
    if w.shape() != shape || w.dtype() != DType::F8E4M3 || w.device() != dev {
        return Err(Error::invalid(
            OP,
            name,
            format!(
                "fp8 weight is {} {:?} on {}, expected f8e4m3 {shape:?} on {dev}",
                w.dtype(),
                w.shape(),
                w.device()
            ),
        ));
    }
    let r = shape.len();
    let sshape: Vec<i64> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if i + 2 >= r { vt_core::fp8_block::blocks(d) } else { d })
        .collect();
    let s = &m.scale;
    if s.shape() != sshape.as_slice() || s.dtype() != DType::F32 || s.device() != dev {
        return Err(Error::invalid(
            OP,
            name,
            format!("fp8 scales are {} {:?}, expected f32 {sshape:?} on {dev}", s.dtype(), s.shape()),
        ));
    }
    Ok(())
}

fn check_tensor(
    name: &'static str,
    t: &Tensor<'_>,
    shape: &[i64],
    dtype: DType,
    dev: vt_core::Device,
) -> Result<()> {
    if t.shape() != shape {
        return Err(Error::invalid(OP, name, format!("shape is {:?}, expected {shape:?}", t.shape())));
    }
    if t.dtype() != dtype {
        return Err(Error::invalid(OP, name, format!("dtype is {}, the block runs in {dtype}", t.dtype())));
    }
    if t.device() != dev {
        return Err(Error::invalid(OP, name, format!("is on {}, the block runs on {dev}", t.device())));
    }
    let r = t.rank();
    if t.dim(r - 1) > 1 && t.stride(r - 1) != 1 {
        return Err(Error::invalid(
            OP,
            name,
            format!("last dim must have stride 1, strides {:?}", t.strides()),
        ));
    }
    Ok(())
}

/// `W_UK_T` `[N,P,L]` and `W_UV` `[N,L,V]` in row-major order.
#[derive(Clone, Debug, PartialEq)]
pub struct AbsorbedKvBProj<T> {
    pub w_uk_t: Vec<T>,
    pub w_uv: Vec<T>,
}

/// Splits `kv_b_proj` (torch layout [N*(P+V), L]) into the absorbed decode weights:
/// `W_UK_T[n,p,l] = kv_b[n*(P+V) + p, l]` and `W_UV[n,l,v] = kv_b[n*(P+V) + P + v, l]`.
/// Pure data movement, so exact for any element type (bf16, f16, f32).
pub fn absorb_kv_b_proj<T: Element>(kv_b_proj: &[T], dims: &MlaBlockDims) -> Result<AbsorbedKvBProj<T>> {
    dims.validate()?;
    let (n, p, v, l) = (
        dims.num_heads as usize,
        dims.qk_nope_head_dim as usize,
        dims.v_head_dim as usize,
        dims.kv_lora_rank as usize,
    );
    let row = p + v;
    if kv_b_proj.len() != n * row * l {
        return Err(Error::invalid(
            "absorb_kv_b_proj",
            "kv_b_proj",
            format!("holds {} elements, expected N*(P+V)*L = {}", kv_b_proj.len(), n * row * l),
        ));
    }
    let mut w_uk_t = Vec::with_capacity(n * p * l);
    let mut w_uv = vec![kv_b_proj.first().copied().unwrap_or(T::from_f64(0.0)); n * l * v];
    for h in 0..n {
        for i in 0..p {
            let src = (h * row + i) * l;
            w_uk_t.extend_from_slice(&kv_b_proj[src..src + l]);
        }
        for i in 0..v {
            let src = (h * row + p + i) * l;
            for j in 0..l {
                w_uv[(h * l + j) * v + i] = kv_b_proj[src + j];
            }
        }
    }
    Ok(AbsorbedKvBProj { w_uk_t, w_uv })
}

/// A host tensor: dtype, shape and little-endian bytes (what safetensors holds).
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<i64>,
    pub bytes: Vec<u8>,
}

impl HostTensor {
    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }

    /// The values as f64 (float and integer dtypes).
    pub fn to_f64(&self) -> Vec<f64> {
        decode_f64(self.dtype, &self.bytes)
    }

    /// The same values in `dtype` (round to nearest even when narrowing).
    pub fn converted(&self, dtype: DType) -> HostTensor {
        if dtype == self.dtype {
            return self.clone();
        }
        HostTensor { dtype, shape: self.shape.clone(), bytes: vt_core::encode_f64(dtype, &self.to_f64()) }
    }

    /// Reads tensor `name` of a safetensors file (bf16, f16, f32, i32 or i64).
    pub fn from_safetensors(st: &SafeTensors<'_>, name: &str, context: &str) -> Result<HostTensor> {
        let view = st.tensor(name).map_err(|_| Error::other(context, format!("missing tensor `{name}`")))?;
        let dtype = match view.dtype() {
            StDtype::BF16 => DType::BF16,
            StDtype::F16 => DType::F16,
            StDtype::F32 => DType::F32,
            StDtype::I32 => DType::I32,
            StDtype::I64 => DType::I64,
            other => {
                return Err(Error::other(
                    context,
                    format!(
                    "tensor `{name}` has dtype {other:?}; supported: bf16, f16, f32 (i32/i64 for indices)"
                ),
                ))
            }
        };
        let shape = view.shape().iter().map(|&d| i64::try_from(d).ok()).collect::<Option<Vec<i64>>>();
        let Some(shape) = shape.filter(|s| vt_core::checked_numel(s).is_ok()) else {
            return Err(Error::other(
                context,
                format!("tensor `{name}` has shape {:?}, whose size overflows i64", view.shape()),
            ));
        };
        Ok(HostTensor { dtype, shape, bytes: view.data().to_vec() })
    }

    /// Uploads to a contiguous device buffer.
    pub fn to_buffer(&self, queue: &Queue) -> Result<Buffer> {
        Buffer::from_bytes(queue, self.dtype, &self.shape, &self.bytes)
    }
}

/// Decodes little-endian bytes of `dtype` to f64.
pub fn decode_f64(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    let es = dtype.size_of();
    bytes
        .chunks_exact(es)
        .map(|c| match dtype {
            DType::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::I64 => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64,
            DType::F8E4M3 => vt_core::f8e4m3_to_f32(c[0]) as f64,
            // No checkpoint tensor has the cache's row layout; its bytes, as read_f64.
            DType::Fp8DsMla => c[0] as f64,
        })
        .collect()
}

/// The checkpoint weights of one layer, by their Hugging Face names (without the layer
/// prefix and `.weight`), in one float dtype.
#[derive(Clone, Debug)]
pub struct HostWeights {
    pub dtype: DType,
    /// `(name, tensor)`, e.g. `("q_b_proj", ...)`.
    pub tensors: Vec<(&'static str, HostTensor)>,
}

/// The Hugging Face weight names the branch needs, with their expected shapes (a
/// DeepSeek-V3.2 block's indexer included: `indexer.wq_b`, ..., `indexer.k_norm.bias`, the
/// one name that is a bias rather than a `.weight`).
pub fn hf_weight_shapes(dims: &MlaBlockDims) -> Vec<(&'static str, Vec<i64>)> {
    let (h, n, q) = (dims.hidden_size, dims.num_heads, dims.q_lora_rank);
    let (l, p, r, v) = (dims.kv_lora_rank, dims.qk_nope_head_dim, dims.qk_rope_head_dim, dims.v_head_dim);
    let dqk = dims.qk_head_dim();
    let mut w = Vec::new();
    if dims.has_q_lora() {
        w.push(("q_a_proj", vec![q, h]));
        w.push(("q_a_layernorm", vec![q]));
        w.push(("q_b_proj", vec![n * dqk, q]));
    } else {
        w.push(("q_proj", vec![n * dqk, h]));
    }
    w.push(("kv_a_proj_with_mqa", vec![l + r, h]));
    w.push(("kv_a_layernorm", vec![l]));
    w.push(("kv_b_proj", vec![n * (p + v), l]));
    w.push(("o_proj", vec![h, n * v]));
    w.extend(indexer_shapes(dims));
    w
}

impl HostWeights {
    /// Reads the branch's weights `"{prefix}{name}.weight"` from safetensors bytes and
    /// converts them to `dtype` (default: the dtype of `kv_b_proj`, bf16 if it is fp8). A
    /// missing tensor, a wrong shape or an unsupported dtype is an error naming the tensor;
    /// fp8 e4m3 weights are dequantized with their `.weight_scale_inv` block scales.
    pub fn from_safetensors_bytes(
        bytes: &[u8],
        dims: &MlaBlockDims,
        prefix: &str,
        dtype: Option<DType>,
        context: &str,
    ) -> Result<HostWeights> {
        let st = crate::safetensors_header::deserialize_safetensors(bytes, context)?;
        let file = Path::new(context);
        let source = |name: &str| -> Result<WeightSource<'_>> {
            let raw = RawTensor::from_safetensors(&st, name, file)?;
            let scale_name = format!("{name}_scale_inv");
            let scale = if raw.dtype == StDtype::F8_E4M3 {
                Some(RawTensor::from_safetensors(&st, &scale_name, file).map_err(|_| {
                    Error::other(
                        context,
                        format!("fp8 tensor `{name}` has no scale tensor `{scale_name}` (fp8 weights need one f32 scale per 128x128 block)"),
                    )
                })?)
            } else {
                None
            };
            WeightSource::new(raw, scale)
        };
        let sources = layer_sources(dims, prefix, context, source)?;
        HostWeights::from_sources(&sources, dtype, false)
    }

    /// Reads the layer's weights from a checkpoint (see [`Checkpoint::open`]: a file, an
    /// index, or a directory), converting (and dequantizing fp8) to `dtype`.
    pub fn from_checkpoint(
        ckpt: &Checkpoint,
        dims: &MlaBlockDims,
        prefix: &str,
        dtype: Option<DType>,
    ) -> Result<HostWeights> {
        let ctx = ckpt.origin().display().to_string();
        let sources = layer_sources(dims, prefix, &ctx, |name| ckpt.weight(name))?;
        HostWeights::from_sources(&sources, dtype, true)
    }

    fn from_sources(
        sources: &[(&'static str, WeightSource<'_>)],
        dtype: Option<DType>,
        release: bool,
    ) -> Result<HostWeights> {
        let dtype = compute_dtype(sources, dtype)?;
        let mut tensors = Vec::with_capacity(sources.len());
        for (name, src) in sources {
            let bytes = src.to_bytes(dtype, release)?;
            tensors.push((*name, HostTensor { dtype, shape: src.shape().to_vec(), bytes }));
        }
        Ok(HostWeights { dtype, tensors })
    }

    /// [`HostWeights::from_checkpoint`], keeping fp8 weights in fp8 when `keep_fp8`: such a
    /// weight is its e4m3 codes (dtype `F8E4M3`) beside its scales under
    /// [`crate::fp8::scale_name`] (f32 `[ceil(rows/128), ceil(cols/128)]`), both as stored;
    /// every other weight is converted to the compute dtype as before.
    pub fn from_checkpoint_with(
        ckpt: &Checkpoint,
        dims: &MlaBlockDims,
        prefix: &str,
        dtype: Option<DType>,
        keep_fp8: bool,
    ) -> Result<HostWeights> {
        if !keep_fp8 {
            return HostWeights::from_checkpoint(ckpt, dims, prefix, dtype);
        }
        let ctx = ckpt.origin().display().to_string();
        let sources = layer_sources(dims, prefix, &ctx, |name| ckpt.weight(name))?;
        let dtype = compute_dtype(&sources, dtype)?;
        let mut tensors = Vec::with_capacity(sources.len() + 6);
        for (name, src) in &sources {
            match (src.fp8_parts()?, scale_name(name)) {
                (Some((codes, scales)), Some(sname)) => {
                    let shape = src.shape().to_vec();
                    let sshape =
                        vec![vt_core::fp8_block::blocks(shape[0]), vt_core::fp8_block::blocks(shape[1])];
                    tensors.push((*name, HostTensor { dtype: DType::F8E4M3, shape, bytes: codes.to_vec() }));
                    let sbytes = scales.iter().flat_map(|v| v.to_le_bytes()).collect();
                    tensors.push((sname, HostTensor { dtype: DType::F32, shape: sshape, bytes: sbytes }));
                }
                _ => tensors.push((
                    *name,
                    HostTensor { dtype, shape: src.shape().to_vec(), bytes: src.to_bytes(dtype, true)? },
                )),
            }
        }
        Ok(HostWeights { dtype, tensors })
    }

    /// Whether weight `name` is held in fp8 (codes beside their scales).
    pub fn is_fp8(&self, name: &str) -> bool {
        self.get(name).is_some_and(|t| t.dtype == DType::F8E4M3)
    }

    /// Weight `name` in the compute dtype: as held, or dequantized from fp8 (the f32
    /// product code x scale, rounded once, as the loaders dequantize).
    pub fn float(&self, name: &'static str) -> Result<HostTensor> {
        let t = self.require(name)?;
        if t.dtype != DType::F8E4M3 {
            return Ok(t.clone());
        }
        let sname = scale_name(name)
            .ok_or_else(|| Error::invalid("HostWeights", name, format!("`{name}` cannot be fp8")))?;
        dequantize_fp8(t, self.require(sname)?, self.dtype, name)
    }

    /// Reads a checkpoint: a `.safetensors` file, a `model.safetensors.index.json`, or a
    /// directory holding one; see [`HostWeights::from_checkpoint`].
    pub fn from_file(
        path: &Path,
        dims: &MlaBlockDims,
        prefix: &str,
        dtype: Option<DType>,
    ) -> Result<HostWeights> {
        HostWeights::from_checkpoint(&Checkpoint::open(path)?, dims, prefix, dtype)
    }

    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.tensors.iter().find(|(n, _)| *n == name).map(|(_, t)| t)
    }

    fn require(&self, name: &'static str) -> Result<&HostTensor> {
        self.get(name)
            .ok_or_else(|| Error::invalid("HostWeights", name, format!("weight `{name}` is missing")))
    }
}

/// An fp8 weight `[rows, cols]` with its scales `[ceil(rows/128), ceil(cols/128)]`, decoded
/// to `dtype`: the f32 product code x scale, rounded once.
pub fn dequantize_fp8(
    codes: &HostTensor,
    scales: &HostTensor,
    dtype: DType,
    name: &str,
) -> Result<HostTensor> {
    use vt_core::fp8_block::{blocks, decode, BLOCK};
    let bad = |msg: String| Error::invalid("HostWeights", "fp8", format!("`{name}`: {msg}"));
    let [rows, cols] = codes.shape[..] else {
        return Err(bad(format!("fp8 weights are 2-D, got {:?}", codes.shape)));
    };
    let (rb, cb) = (blocks(rows), blocks(cols));
    if codes.dtype != DType::F8E4M3 || scales.dtype != DType::F32 || scales.shape != [rb, cb] {
        return Err(bad(format!(
            "{} {:?} with {} {:?} scales, expected f8e4m3 with f32 [{rb}, {cb}]",
            codes.dtype, codes.shape, scales.dtype, scales.shape
        )));
    }
    let s: Vec<f32> =
        scales.bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let (cols_u, cb_u) = (cols as usize, cb as usize);
    let mut bytes = Vec::with_capacity(codes.bytes.len() * dtype.size_of());
    for (i, &c) in codes.bytes.iter().enumerate() {
        let v = decode(c, s[(i / cols_u / BLOCK) * cb_u + (i % cols_u) / BLOCK]);
        // Rounded from the f32 product, as the checkpoint loader rounds it.
        match dtype {
            DType::BF16 => bytes.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            DType::F16 => bytes.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            DType::F32 => bytes.extend_from_slice(&v.to_le_bytes()),
            other => return Err(bad(format!("cannot dequantize to {other}"))),
        }
    }
    Ok(HostTensor { dtype, shape: codes.shape.clone(), bytes })
}

/// The branch's weights `"{prefix}{name}.weight"` through `get`, checked against the
/// dims' shapes; errors name the full tensor name (and `context`).
fn layer_sources<'a>(
    dims: &MlaBlockDims,
    prefix: &str,
    context: &str,
    get: impl Fn(&str) -> Result<WeightSource<'a>>,
) -> Result<Vec<(&'static str, WeightSource<'a>)>> {
    dims.validate()?;
    let branch = if dims.has_q_lora() { "q_lora_rank set" } else { "q_lora_rank null" };
    let mut out = Vec::new();
    for (name, shape) in hf_weight_shapes(dims) {
        let full = tensor_name(prefix, name);
        let src = get(&full).map_err(|e| match e {
            Error::Other { context, msg } if msg.starts_with("missing tensor") => {
                Error::Other { context, msg: format!("{msg} (needed by the block with {branch})") }
            }
            e => e,
        })?;
        if src.shape() != shape.as_slice() {
            return Err(Error::other(
                context,
                format!("tensor `{full}` has shape {:?}, expected {shape:?}", src.shape()),
            ));
        }
        out.push((name, src));
    }
    Ok(out)
}

/// The compute dtype: `dtype`, else the stored dtype of `kv_b_proj` (bf16 when it is fp8).
fn compute_dtype(sources: &[(&'static str, WeightSource<'_>)], dtype: Option<DType>) -> Result<DType> {
    let dtype = match dtype {
        Some(d) => d,
        None => match sources.iter().find(|(n, _)| *n == "kv_b_proj").map(|(_, s)| s.stored_dtype()) {
            Some(DType::F8E4M3) => DType::BF16,
            Some(d) => d,
            None => DType::F32,
        },
    };
    if !dtype.is_compute_float() {
        return Err(Error::invalid("HostWeights", "dtype", format!("{dtype} is not bf16/f16/f32")));
    }
    Ok(dtype)
}

/// The block's weights in device memory: the checkpoint tensors, the fused q_a/kv_a
/// projection, the absorbed `W_UK_T` / `W_UV`, and a handle on the f32 cos/sin cache, which
/// every store of the same rope parameters on the same device shares
/// ([`MlaWeightStore::rope_cos_sin_cache`]).
pub struct MlaWeightStore {
    dims: MlaBlockDims,
    dtype: DType,
    bufs: Vec<(&'static str, Buffer)>,
    /// Shared, at a fixed device address for as long as this store (or any sharer) lives:
    /// the views borrow `self`, so they and the graphs capturing them cannot outlive it.
    rope_cache: RopeCosSinCache,
}

impl MlaWeightStore {
    /// Loads `"{prefix}{name}.weight"` tensors from a checkpoint (a `.safetensors` file, a
    /// `model.safetensors.index.json`, or a directory holding one; see
    /// [`Checkpoint::open`]) and builds every derived weight. `dtype`: the compute dtype
    /// (default: the checkpoint's; bf16 for fp8 checkpoints).
    pub fn load(
        queue: &Queue,
        cfg: &MlaConfig,
        path: &Path,
        prefix: &str,
        dtype: Option<DType>,
    ) -> Result<Self> {
        MlaWeightStore::from_checkpoint(queue, cfg, &Checkpoint::open(path)?, prefix, dtype)
    }

    /// Loads the layer `"{prefix}{name}.weight"` straight from a mapped checkpoint into
    /// device buffers: each weight is converted (fp8 dequantized) a few MiB at a time into
    /// its buffer, and the mapped pages already read are released as it goes, so the process
    /// holds little more than the buffers the block keeps. Derived weights are built on the
    /// way: the fused `[q_a_proj; kv_a_proj_with_mqa]` rows are written into one buffer, and
    /// `W_UK_T` / `W_UV` are absorbed from `kv_b_proj` head by head. The result is the same as
    /// [`HostWeights::from_checkpoint`] + [`MlaWeightStore::from_host`], bit for bit.
    pub fn from_checkpoint(
        queue: &Queue,
        cfg: &MlaConfig,
        ckpt: &Checkpoint,
        prefix: &str,
        dtype: Option<DType>,
    ) -> Result<Self> {
        let dims = cfg.dims;
        let ctx = ckpt.origin().display().to_string();
        let sources = layer_sources(&dims, prefix, &ctx, |name| ckpt.weight(name))?;
        let dtype = compute_dtype(&sources, dtype)?;
        let src =
            |name: &'static str| -> Result<&WeightSource<'_>> {
                sources.iter().find(|(n, _)| *n == name).map(|(_, s)| s).ok_or_else(|| {
                    Error::invalid("MlaWeightStore", name, format!("weight `{name}` is missing"))
                })
            };
        // Rows of `s` into rows `row0..` of the 2-D buffer `buf`; a 1-D weight as a whole.
        let fill = |buf: &Buffer, row0: i64, s: &WeightSource<'_>| -> Result<()> {
            if s.shape().len() == 1 {
                return buf.write_bytes(queue, &s.to_bytes(dtype, true)?);
            }
            let row_bytes = s.shape()[1] as usize * dtype.size_of();
            let view = buf.view();
            s.for_each_chunk(0, s.shape()[0], dtype, true, |r, bytes| {
                let n = (bytes.len() / row_bytes.max(1)) as i64;
                queue.write_bytes(&view.slice(0, row0 + r, row0 + r + n)?, bytes)
            })
        };
        let new_buf = |shape: &[i64]| Buffer::uninit(queue, dtype, shape);
        let mut bufs = Vec::new();
        let h = dims.hidden_size;
        if dims.has_q_lora() {
            let (qa, kva) = (src("q_a_proj")?, src("kv_a_proj_with_mqa")?);
            let rows = dims.q_lora_rank + dims.latent_row_dim();
            let fused = new_buf(&[rows, h])?;
            fill(&fused, 0, qa)?;
            fill(&fused, dims.q_lora_rank, kva)?;
            bufs.push(("fused_qkv_a_proj", fused));
            for name in ["q_a_layernorm", "q_b_proj"] {
                let s = src(name)?;
                let b = new_buf(s.shape())?;
                fill(&b, 0, s)?;
                bufs.push((name, b));
            }
        } else {
            for name in ["q_proj", "kv_a_proj_with_mqa"] {
                let s = src(name)?;
                let b = new_buf(s.shape())?;
                fill(&b, 0, s)?;
                bufs.push((name, b));
            }
        }
        let s = src("kv_a_layernorm")?;
        let b = new_buf(s.shape())?;
        fill(&b, 0, s)?;
        bufs.push(("kv_a_layernorm", b));
        // kv_b_proj head by head: its rows, W_UK_T[h] = its first P rows, W_UV[h] = the
        // transpose of its last V rows.
        let (n, p, l, v) = (dims.num_heads, dims.qk_nope_head_dim, dims.kv_lora_rank, dims.v_head_dim);
        let kv_b = src("kv_b_proj")?;
        let (kvb, uk, uv) = (new_buf(&[n * (p + v), l])?, new_buf(&[n, p, l])?, new_buf(&[n, l, v])?);
        let es = dtype.size_of();
        let (pu, lu, vu) = (p as usize, l as usize, v as usize);
        let mut head = Vec::with_capacity((pu + vu) * lu * es);
        let mut tr = vec![0u8; lu * vu * es];
        for hd in 0..n {
            let (r0, r1) = (hd * (p + v), (hd + 1) * (p + v));
            head.clear();
            kv_b.for_each_chunk(r0, r1, dtype, true, |_, bytes| {
                head.extend_from_slice(bytes);
                Ok(())
            })?;
            queue.write_bytes(&kvb.view().slice(0, r0, r1)?, &head)?;
            queue.write_bytes(&uk.view().slice(0, hd, hd + 1)?, &head[..pu * lu * es])?;
            for i in 0..vu {
                for j in 0..lu {
                    let from = ((pu + i) * lu + j) * es;
                    let to = (j * vu + i) * es;
                    tr[to..to + es].copy_from_slice(&head[from..from + es]);
                }
            }
            queue.write_bytes(&uv.view().slice(0, hd, hd + 1)?, &tr)?;
        }
        bufs.push(("kv_b_proj", kvb));
        bufs.push(("w_uk_t", uk));
        bufs.push(("w_uv", uv));
        for name in ["o_proj"].into_iter().chain(indexer_shapes(&dims).into_iter().map(|(n, _)| n)) {
            let s = src(name)?;
            let b = new_buf(s.shape())?;
            fill(&b, 0, s)?;
            bufs.push((name, b));
        }
        let rope_cache =
            RopeCosSinCache::shared(queue, &cfg.rope, dims.qk_rope_head_dim, cfg.max_position_embeddings)?;
        Ok(MlaWeightStore { dims, dtype, bufs, rope_cache })
    }

    /// Bytes of device memory the store holds: every weight, the derived ones, and the
    /// cos/sin cache in full although layers of the same rope parameters on one device share
    /// it ([`MlaWeightStore::rope_cos_sin_cache`]); [`MlaWeightStore::total_device_bytes`]
    /// counts a stack with each cache once.
    pub fn device_bytes(&self) -> u64 {
        self.weight_bytes() + self.rope_cache.bytes()
    }

    /// Bytes of device memory the stores hold together: their weights, and each distinct
    /// cos/sin cache once (one per device and rope parameters however many layers share it).
    pub fn total_device_bytes<'s>(stores: impl IntoIterator<Item = &'s MlaWeightStore>) -> u64 {
        let mut caches: Vec<&RopeCosSinCache> = Vec::new();
        let mut total = 0;
        for s in stores {
            total += s.weight_bytes();
            if !caches.iter().any(|c| c.same_buffer(&s.rope_cache)) {
                total += s.rope_cache.bytes();
                caches.push(&s.rope_cache);
            }
        }
        total
    }

    /// The store's own buffers (all but the shared cos/sin cache).
    fn weight_bytes(&self) -> u64 {
        self.bufs.iter().map(|(_, b)| b.numel() as u64 * b.dtype().size_of() as u64).sum()
    }

    /// The cos/sin cache this layer reads: one buffer shared (reference-counted) by every
    /// store loaded on the same device with the same rope parameters, rope dim and
    /// `max_position_embeddings` ([`RopeCosSinCache`]); it lives as long as any of them.
    pub fn rope_cos_sin_cache(&self) -> &RopeCosSinCache {
        &self.rope_cache
    }

    /// Uploads host weights and builds the derived ones (fused A-projection, absorption,
    /// cos/sin cache with `cfg.max_position_embeddings` rows).
    pub fn from_host(queue: &Queue, cfg: &MlaConfig, w: &HostWeights) -> Result<Self> {
        let dims = cfg.dims;
        dims.validate()?;
        let dtype = w.dtype;
        for (name, shape) in hf_weight_shapes(&dims) {
            let t = w.require(name)?;
            let fp8 = t.dtype == DType::F8E4M3 && scale_name(name).is_some_and(|s| w.get(s).is_some());
            if t.shape != shape || (t.dtype != dtype && !fp8) {
                return Err(Error::invalid(
                    "HostWeights",
                    name,
                    format!("is {} {:?}, expected {dtype} {shape:?}", t.dtype, t.shape),
                ));
            }
        }
        // The cos/sin cache first: a huge max_position_embeddings fails before any upload.
        let rope_cache =
            RopeCosSinCache::shared(queue, &cfg.rope, dims.qk_rope_head_dim, cfg.max_position_embeddings)?;
        // fp8 weights stay fp8 where the block can multiply them so (crate::fp8), the rest
        // is dequantized to the compute dtype.
        let keep = |name: &str| w.is_fp8(name) && keeps_fp8(name, &dims);
        let fp8_pair = |name: &'static str| -> Result<[(&'static str, Buffer); 2]> {
            let (codes, scales) = fp8_buffer_names(name);
            let (t, st) = (w.require(name)?, w.require(scale_name(name).unwrap_or_default())?);
            Ok([
                (codes, Buffer::from_bytes(queue, DType::F8E4M3, &t.shape, &t.bytes)?),
                (scales, Buffer::from_bytes(queue, DType::F32, &st.shape, &st.bytes)?),
            ])
        };
        let weight = |name: &'static str| -> Result<Vec<(&'static str, Buffer)>> {
            if keep(name) {
                Ok(fp8_pair(name)?.into())
            } else {
                Ok(vec![(name, w.float(name)?.to_buffer(queue)?)])
            }
        };
        let mut bufs = Vec::new();
        if dims.has_q_lora() {
            let block = vt_core::fp8_block::BLOCK as i64;
            if keep("q_a_proj") && keep("kv_a_proj_with_mqa") && dims.q_lora_rank % block == 0 {
                // Both fp8 and q_lora_rank a whole number of scale blocks: stacked like the
                // float fused weight, codes and scale rows alike (kv_a's scale blocks then
                // start at row Q), so the fused path multiplies them in one GEMM; q_a and
                // kv_a are its row views (`fp8_views`).
                let mut codes = Vec::new();
                let mut scales = Vec::new();
                for name in ["q_a_proj", "kv_a_proj_with_mqa"] {
                    codes.extend_from_slice(&w.require(name)?.bytes);
                    scales.extend_from_slice(&w.require(scale_name(name).unwrap_or_default())?.bytes);
                }
                let rows = dims.q_lora_rank + dims.latent_row_dim();
                let (codes_name, scales_name) = fp8_buffer_names("fused_qkv_a_proj");
                let h = dims.hidden_size;
                let scale_shape = [vt_core::fp8_block::blocks(rows), vt_core::fp8_block::blocks(h)];
                bufs.push((codes_name, Buffer::from_bytes(queue, DType::F8E4M3, &[rows, h], &codes)?));
                bufs.push((scales_name, Buffer::from_bytes(queue, DType::F32, &scale_shape, &scales)?));
            } else if keep("q_a_proj") {
                // Held apart: fp8 q_a, and kv_a in fp8 or the compute dtype.
                bufs.extend(weight("q_a_proj")?);
                bufs.extend(weight("kv_a_proj_with_mqa")?);
            } else {
                let qa = w.float("q_a_proj")?;
                let kva = w.float("kv_a_proj_with_mqa")?;
                let mut bytes = qa.bytes.clone();
                bytes.extend_from_slice(&kva.bytes);
                let rows = dims.q_lora_rank + dims.latent_row_dim();
                bufs.push((
                    "fused_qkv_a_proj",
                    Buffer::from_bytes(queue, dtype, &[rows, dims.hidden_size], &bytes)?,
                ));
            }
            bufs.push(("q_a_layernorm", w.require("q_a_layernorm")?.to_buffer(queue)?));
            bufs.extend(weight("q_b_proj")?);
        } else {
            bufs.extend(weight("q_proj")?);
            bufs.extend(weight("kv_a_proj_with_mqa")?);
        }
        bufs.push(("kv_a_layernorm", w.require("kv_a_layernorm")?.to_buffer(queue)?));
        let (n, p, l, v) = (dims.num_heads, dims.qk_nope_head_dim, dims.kv_lora_rank, dims.v_head_dim);
        bufs.extend(weight("kv_b_proj")?);
        // VT_FP8_ABSORBED (on): the absorbed weights stay fp8; off, they are dequantized once
        // here, which the views below see (no `w_uk_t#fp8` buffer).
        if keep("kv_b_proj") && absorbed_keep_fp8(&dims) && vt_core::flags::fp8_absorbed() {
            // W_UK_T as a per-head transposed copy of the codes ([N, L, P]); W_UV and both
            // scale tensors are views of kv_b_proj's (`views`).
            let codes = &w.require("kv_b_proj")?.bytes;
            let (pu, lu, vu) = (p as usize, l as usize, v as usize);
            let mut uk = vec![0u8; n as usize * lu * pu];
            for h in 0..n as usize {
                for i in 0..pu {
                    let row = &codes[(h * (pu + vu) + i) * lu..][..lu];
                    for (j, &c) in row.iter().enumerate() {
                        uk[(h * lu + j) * pu + i] = c;
                    }
                }
            }
            bufs.push(("w_uk_t#fp8", Buffer::from_bytes(queue, DType::F8E4M3, &[n, l, p], &uk)?));
            // VT_FP8_ABSORBED_BY_STEP: the dequantized form too, which steps of
            // fp8::ABSORBED_FLOAT_MIN_TOKENS tokens or more multiply (block.rs).
            if vt_core::flags::fp8_absorbed_by_step() {
                let (uk, uv) = absorb_bytes(&w.float("kv_b_proj")?, &dims)?;
                bufs.push(("w_uk_t", Buffer::from_bytes(queue, dtype, &[n, p, l], &uk)?));
                bufs.push(("w_uv", Buffer::from_bytes(queue, dtype, &[n, l, v], &uv)?));
            }
        } else {
            let kv_b = w.float("kv_b_proj")?;
            let (uk, uv) = absorb_bytes(&kv_b, &dims)?;
            bufs.push(("w_uk_t", Buffer::from_bytes(queue, dtype, &[n, p, l], &uk)?));
            bufs.push(("w_uv", Buffer::from_bytes(queue, dtype, &[n, l, v], &uv)?));
        }
        bufs.extend(weight("o_proj")?);
        // The indexer's weights in the compute dtype (fp8 ones dequantized: the block
        // multiplies them with the float ops).
        for (name, _) in indexer_shapes(&dims) {
            bufs.push((name, w.float(name)?.to_buffer(queue)?));
        }
        Ok(MlaWeightStore { dims, dtype, bufs, rope_cache })
    }

    /// [`MlaWeightStore::load`] with the fp8 policy `weights` (issue 17): fp8 weights of the
    /// checkpoint stay fp8 when `weights.keeps_fp8_on(queue's device, dtype)` (see [`crate::fp8`]
    /// for which ones can), else they are dequantized as [`MlaWeightStore::load`] does.
    pub fn load_with(
        queue: &Queue,
        cfg: &MlaConfig,
        path: &Path,
        prefix: &str,
        dtype: Option<DType>,
        weights: WeightsDtype,
    ) -> Result<Self> {
        MlaWeightStore::from_checkpoint_with(queue, cfg, &Checkpoint::open(path)?, prefix, dtype, weights)
    }

    /// [`MlaWeightStore::from_checkpoint`] with the fp8 policy `weights` (see
    /// [`MlaWeightStore::load_with`]). Keeping fp8 goes through [`HostWeights`] (the layer
    /// in host memory once, in fp8: half its bf16 size).
    pub fn from_checkpoint_with(
        queue: &Queue,
        cfg: &MlaConfig,
        ckpt: &Checkpoint,
        prefix: &str,
        dtype: Option<DType>,
        weights: WeightsDtype,
    ) -> Result<Self> {
        if !weights.keeps_fp8_on(queue.device().kind, dtype) {
            return MlaWeightStore::from_checkpoint(queue, cfg, ckpt, prefix, dtype);
        }
        let host = HostWeights::from_checkpoint_with(ckpt, &cfg.dims, prefix, dtype, true)?;
        MlaWeightStore::from_host(queue, cfg, &host)
    }

    /// How many weights are held in fp8 (0: a dequantized or float store); the stacked
    /// `[q_a_proj; kv_a_proj_with_mqa]` counts as the two it holds.
    pub fn fp8_weights(&self) -> usize {
        let stacked = fp8_buffer_names("fused_qkv_a_proj").0;
        self.bufs
            .iter()
            .filter(|(_, b)| b.dtype() == DType::F8E4M3)
            .map(|(name, _)| if *name == stacked { 2 } else { 1 })
            .sum()
    }

    pub fn dims(&self) -> &MlaBlockDims {
        &self.dims
    }

    /// The compute dtype of every float weight.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    fn view(&self, name: &str) -> Option<Tensor<'_>> {
        self.bufs.iter().find(|(n, _)| *n == name).map(|(_, b)| b.view())
    }

    fn fp8_matrix(&self, name: &'static str) -> Option<Fp8Matrix<'_>> {
        let (codes, scales) = fp8_buffer_names(name);
        Some(Fp8Matrix { w: self.view(codes)?, scale: self.view(scales)? })
    }

    /// The fp8 weights' views; the absorbed ones are views of `kv_b_proj`'s codes (W_UV)
    /// and scales (both), W_UK_T reads the transposed copy.
    fn fp8_views(&self) -> Fp8BlockWeights<'_> {
        let d = self.dims;
        let (n, p, l, v) = (d.num_heads, d.qk_nope_head_dim, d.kv_lora_rank, d.v_head_dim);
        let kv_b = self.fp8_matrix("kv_b_proj");
        let b = vt_core::fp8_block::BLOCK as i64;
        let lb = vt_core::fp8_block::blocks(l);
        let head_rows = (p + v) / b * lb; // scale elements per head

        // Whether the load kept them fp8 (absorbed_keep_fp8 and VT_FP8_ABSORBED when it ran).
        let absorbed = kv_b.filter(|_| absorbed_keep_fp8(&d) && self.view("w_uk_t#fp8").is_some());
        let w_uk_t = absorbed.and_then(|m| {
            Some(Fp8Matrix {
                w: self.view("w_uk_t#fp8")?.as_strided(0, &[n, p, l], &[l * p, 1, p]).ok()?,
                scale: m.scale.as_strided(0, &[n, p / b, lb], &[head_rows, lb, 1]).ok()?,
            })
        });
        let w_uv = absorbed.and_then(|m| {
            Some(Fp8Matrix {
                w: m.w.as_strided(p * l, &[n, l, v], &[(p + v) * l, 1, l]).ok()?,
                scale: m.scale.as_strided(p / b * lb, &[n, lb, v / b], &[head_rows, 1, lb]).ok()?,
            })
        });
        let stacked = self.fp8_matrix("fused_qkv_a_proj");
        let ql = d.q_lora_rank;
        let rows = |a: i64, b: i64| stacked.and_then(|m| m.rows(a, b).ok());
        Fp8BlockWeights {
            fused_qkv_a_proj: stacked,
            q_a_proj: self.fp8_matrix("q_a_proj").or(rows(0, ql)),
            kv_a_proj_with_mqa: self.fp8_matrix("kv_a_proj_with_mqa").or(rows(ql, ql + d.latent_row_dim())),
            q_b_proj: self.fp8_matrix("q_b_proj"),
            q_proj: self.fp8_matrix("q_proj"),
            kv_b_proj: kv_b,
            w_uk_t,
            w_uv,
            o_proj: self.fp8_matrix("o_proj"),
        }
    }

    /// Views of every stored weight.
    pub fn views(&self) -> MlaBlockWeights<'_> {
        MlaBlockWeights {
            fused_qkv_a_proj: self.view("fused_qkv_a_proj"),
            q_a_layernorm: self.view("q_a_layernorm"),
            q_b_proj: self.view("q_b_proj"),
            q_proj: self.view("q_proj"),
            kv_a_proj_with_mqa: self.view("kv_a_proj_with_mqa"),
            kv_a_layernorm: self.view("kv_a_layernorm"),
            kv_b_proj: self.view("kv_b_proj"),
            w_uk_t: self.view("w_uk_t"),
            w_uv: self.view("w_uv"),
            o_proj: self.view("o_proj"),
            rope_cos_sin_cache: Some(self.rope_cache.view()),
            fp8: self.fp8_views(),
            indexer: IndexerWeights {
                wq_b: self.view("indexer.wq_b"),
                wk: self.view("indexer.wk"),
                k_norm: self.view("indexer.k_norm"),
                k_norm_bias: self.view("indexer.k_norm.bias"),
                weights_proj: self.view("indexer.weights_proj"),
            },
        }
    }
}

/// The store's buffer names of an fp8 weight's codes and scales.
fn fp8_buffer_names(name: &str) -> (&'static str, &'static str) {
    match name {
        "q_a_proj" => ("q_a_proj#fp8", "q_a_proj#scale"),
        "fused_qkv_a_proj" => ("fused_qkv_a_proj#fp8", "fused_qkv_a_proj#scale"),
        "q_b_proj" => ("q_b_proj#fp8", "q_b_proj#scale"),
        "q_proj" => ("q_proj#fp8", "q_proj#scale"),
        "kv_a_proj_with_mqa" => ("kv_a_proj_with_mqa#fp8", "kv_a_proj_with_mqa#scale"),
        "kv_b_proj" => ("kv_b_proj#fp8", "kv_b_proj#scale"),
        "o_proj" => ("o_proj#fp8", "o_proj#scale"),
        _ => ("", ""),
    }
}

/// [`absorb_kv_b_proj`] on the raw bytes of a bf16, f16 or f32 host tensor.
pub fn absorb_bytes(kv_b: &HostTensor, dims: &MlaBlockDims) -> Result<(Vec<u8>, Vec<u8>)> {
    fn go<T: Element>(
        bytes: &[u8],
        dims: &MlaBlockDims,
        from: fn(&[u8]) -> T,
        to: fn(T) -> Vec<u8>,
    ) -> Result<(Vec<u8>, Vec<u8>)> {
        let vals: Vec<T> = bytes.chunks_exact(std::mem::size_of::<T>()).map(from).collect();
        let a = absorb_kv_b_proj(&vals, dims)?;
        Ok((a.w_uk_t.into_iter().flat_map(to).collect(), a.w_uv.into_iter().flat_map(to).collect()))
    }
    match kv_b.dtype {
        DType::BF16 => go::<half::bf16>(
            &kv_b.bytes,
            dims,
            |c| half::bf16::from_le_bytes([c[0], c[1]]),
            |x| x.to_le_bytes().to_vec(),
        ),
        DType::F16 => go::<half::f16>(
            &kv_b.bytes,
            dims,
            |c| half::f16::from_le_bytes([c[0], c[1]]),
            |x| x.to_le_bytes().to_vec(),
        ),
        DType::F32 => go::<f32>(
            &kv_b.bytes,
            dims,
            |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            |x| x.to_le_bytes().to_vec(),
        ),
        other => {
            Err(Error::invalid("absorb_kv_b_proj", "kv_b_proj", format!("dtype {other} is not bf16/f16/f32")))
        }
    }
}
