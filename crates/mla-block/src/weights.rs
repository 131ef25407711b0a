//! The block's weights: views the forward reads ([`MlaBlockWeights`]), an owning store
//! loaded from a Hugging Face safetensors checkpoint ([`MlaWeightStore`]), and the weight
//! absorption of `kv_b_proj` into `W_UK_T` / `W_UV` for the decode form.

use std::path::Path;

use safetensors::{Dtype as StDtype, SafeTensors};
use vt_core::{Buffer, DType, Element, Error, Queue, Result, Tensor};

use crate::checkpoint::{Checkpoint, RawTensor, WeightSource};
use crate::config::MlaConfig;
use crate::dims::MlaBlockDims;

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
    /// `[max_pos, R]` f32, from [`crate::YarnRopeParams::cos_sin_cache`].
    pub rope_cos_sin_cache: Option<Tensor<'a>>,
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
        if dims.has_q_lora() {
            want.push(("fused_qkv_a_proj", self.fused_qkv_a_proj, vec![q + l + r, h]));
            want.push(("q_a_layernorm", self.q_a_layernorm, vec![q]));
            want.push(("q_b_proj", self.q_b_proj, vec![n * dqk, q]));
        } else {
            want.push(("q_proj", self.q_proj, vec![n * dqk, h]));
            want.push(("kv_a_proj_with_mqa", self.kv_a_proj_with_mqa, vec![l + r, h]));
        }
        want.push(("kv_a_layernorm", self.kv_a_layernorm, vec![l]));
        want.push(("kv_b_proj", self.kv_b_proj, vec![n * (p + v), l]));
        want.push(("w_uk_t", self.w_uk_t, vec![n, p, l]));
        want.push(("w_uv", self.w_uv, vec![n, l, v]));
        want.push(("o_proj", self.o_proj, vec![h, n * v]));
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

/// The Hugging Face weight names the branch needs, with their expected shapes.
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
        let full = format!("{prefix}{name}.weight");
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
/// projection, the absorbed `W_UK_T` / `W_UV`, and the f32 cos/sin cache.
pub struct MlaWeightStore {
    dims: MlaBlockDims,
    dtype: DType,
    bufs: Vec<(&'static str, Buffer)>,
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
            let rows = dims.q_lora_rank + dims.cache_row_dim();
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
        let s = src("o_proj")?;
        let b = new_buf(s.shape())?;
        fill(&b, 0, s)?;
        bufs.push(("o_proj", b));
        let cache =
            cfg.rope.cos_sin_cache_buffer(queue, dims.qk_rope_head_dim, cfg.max_position_embeddings)?;
        bufs.push(("rope_cos_sin_cache", cache));
        Ok(MlaWeightStore { dims, dtype, bufs })
    }

    /// Bytes of device memory the store holds (every weight, derived ones and the cos/sin
    /// cache included).
    pub fn device_bytes(&self) -> u64 {
        self.bufs.iter().map(|(_, b)| b.numel() as u64 * b.dtype().size_of() as u64).sum()
    }

    /// Uploads host weights and builds the derived ones (fused A-projection, absorption,
    /// cos/sin cache with `cfg.max_position_embeddings` rows).
    pub fn from_host(queue: &Queue, cfg: &MlaConfig, w: &HostWeights) -> Result<Self> {
        let dims = cfg.dims;
        dims.validate()?;
        let dtype = w.dtype;
        for (name, shape) in hf_weight_shapes(&dims) {
            let t = w.require(name)?;
            if t.shape != shape || t.dtype != dtype {
                return Err(Error::invalid(
                    "HostWeights",
                    name,
                    format!("is {} {:?}, expected {dtype} {shape:?}", t.dtype, t.shape),
                ));
            }
        }
        // The cos/sin cache first: a huge max_position_embeddings fails before any upload.
        let cache =
            cfg.rope.cos_sin_cache_buffer(queue, dims.qk_rope_head_dim, cfg.max_position_embeddings)?;
        let mut bufs = Vec::new();
        if dims.has_q_lora() {
            let qa = w.require("q_a_proj")?;
            let kva = w.require("kv_a_proj_with_mqa")?;
            let mut bytes = qa.bytes.clone();
            bytes.extend_from_slice(&kva.bytes);
            let rows = dims.q_lora_rank + dims.cache_row_dim();
            bufs.push((
                "fused_qkv_a_proj",
                Buffer::from_bytes(queue, dtype, &[rows, dims.hidden_size], &bytes)?,
            ));
            bufs.push(("q_a_layernorm", w.require("q_a_layernorm")?.to_buffer(queue)?));
            bufs.push(("q_b_proj", w.require("q_b_proj")?.to_buffer(queue)?));
        } else {
            bufs.push(("q_proj", w.require("q_proj")?.to_buffer(queue)?));
            bufs.push(("kv_a_proj_with_mqa", w.require("kv_a_proj_with_mqa")?.to_buffer(queue)?));
        }
        bufs.push(("kv_a_layernorm", w.require("kv_a_layernorm")?.to_buffer(queue)?));
        let kv_b = w.require("kv_b_proj")?;
        bufs.push(("kv_b_proj", kv_b.to_buffer(queue)?));
        let (n, p, l, v) = (dims.num_heads, dims.qk_nope_head_dim, dims.kv_lora_rank, dims.v_head_dim);
        let (uk, uv) = absorb_bytes(kv_b, &dims)?;
        bufs.push(("w_uk_t", Buffer::from_bytes(queue, dtype, &[n, p, l], &uk)?));
        bufs.push(("w_uv", Buffer::from_bytes(queue, dtype, &[n, l, v], &uv)?));
        bufs.push(("o_proj", w.require("o_proj")?.to_buffer(queue)?));
        bufs.push(("rope_cos_sin_cache", cache));
        Ok(MlaWeightStore { dims, dtype, bufs })
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
            rope_cos_sin_cache: self.view("rope_cos_sin_cache"),
        }
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
