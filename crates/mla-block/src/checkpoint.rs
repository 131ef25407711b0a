//! Hugging Face checkpoints as they are published: one `.safetensors` file, or shards listed
//! by `model.safetensors.index.json`, memory-mapped and read where the tensors lie; fp8
//! e4m3 weights with one f32 scale per 128x128 block dequantized on the way into the
//! block's dtype.
//!
//! - [`Checkpoint::open`] takes a `.safetensors` file, an index `.json`, or a directory
//!   holding `model.safetensors.index.json` (or a single `model.safetensors`). Shards are
//!   mapped (memmap2) the first time one of their tensors is asked for, so a model of 163
//!   shards maps only the files a layer needs.
//! - [`WeightSource`]: one weight as stored (dtype, shape, bytes in the mapping, its fp8
//!   scales). [`WeightSource::for_each_chunk`] converts it to a dtype a few MiB of rows at
//!   a time and tells the kernel it may drop the mapped pages already consumed
//!   (`MADV_DONTNEED`: the pages stay in the page cache, the process stops holding them),
//!   so loading a layer keeps in memory little more than what the block keeps.
//! - fp8 (`F8_E4M3`, OCP e4m3fn: bias 7, no infinities, `0x7f`/`0xff` NaN) with
//!   `<name>_scale_inv` f32 `[ceil(rows/128), ceil(cols/128)]`: `w[r, c] = fp8(q[r, c]) *
//!   scale[r / 128, c / 128]` computed in f32 and rounded once to the target dtype, as
//!   DeepSeek's `weight_dequant` does; partial edge blocks use their block's scale.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::Value;
use vt_core::{DType, Error, Result};

/// The index file name of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The side of DeepSeek's fp8 scale blocks (`weight_block_size: [128, 128]`).
pub const FP8_BLOCK: i64 = 128;

/// Bytes of source converted per chunk (then its mapped pages are released).
const CHUNK_BYTES: usize = 4 << 20;

/// The largest index `.json` read (DeepSeek-V3's lists 91k tensors in under 10 MB).
pub const MAX_INDEX_BYTES: u64 = 256 << 20;

/// The text of the small JSON file `path` (a config or an index), read through a limit: a
/// file past `limit` bytes (a weights file given by mistake, or `/dev/zero`, which never
/// ends) is an error naming it, not an unbounded read into memory.
pub(crate) fn read_json_text(path: &Path, limit: u64) -> Result<String> {
    use std::io::Read;
    let ctx = || path.display().to_string();
    let file = File::open(path).map_err(|e| Error::other(ctx(), format!("cannot read: {e}")))?;
    let mut text = String::new();
    file.take(limit + 1)
        .read_to_string(&mut text)
        .map_err(|e| Error::other(ctx(), format!("cannot read: {e}")))?;
    if text.len() as u64 > limit {
        return Err(Error::other(
            ctx(),
            format!("is more than {limit} bytes, larger than any such JSON file (is it the right file?)"),
        ));
    }
    Ok(text)
}

/// A tensor's place in a mapped file.
#[derive(Clone, Debug)]
struct TensorInfo {
    dtype: StDtype,
    shape: Vec<i64>,
    /// Byte range inside the mapping (header included in the offset).
    start: usize,
    end: usize,
}

/// One mapped safetensors file and its header.
struct Mapped {
    map: Mmap,
    tensors: HashMap<String, TensorInfo>,
}

impl Mapped {
    fn open(path: &Path) -> Result<Mapped> {
        let ctx = path.display().to_string();
        let file = File::open(path).map_err(|e| Error::other(ctx.clone(), format!("cannot open: {e}")))?;
        // SAFETY: the mapping is read-only and private to this process; like every reader of
        // a mapped checkpoint we rely on the file not being truncated or rewritten while it is
        // mapped (a concurrent writer could change the bytes under us, never our memory
        // safety beyond that documented caveat of mmap).
        let map =
            unsafe { Mmap::map(&file) }.map_err(|e| Error::other(ctx.clone(), format!("cannot map: {e}")))?;
        // The checked reading first: its errors name the file and the tensor at fault.
        crate::safetensors_header::check_safetensors_header(&map, &ctx)?;
        let (header_len, meta) = SafeTensors::read_metadata(&map)
            .map_err(|e| Error::other(ctx.clone(), format!("not a safetensors file: {e}")))?;
        let base =
            header_len.checked_add(8).ok_or_else(|| Error::other(ctx.clone(), "header length overflows"))?;
        let mut tensors = HashMap::new();
        for (name, info) in meta.tensors() {
            let bad = |what: &str| Error::other(ctx.clone(), format!("tensor `{name}`: {what}"));
            let shape = info
                .shape
                .iter()
                .map(|&d| i64::try_from(d).map_err(|_| bad("a dimension does not fit i64")))
                .collect::<Result<Vec<i64>>>()?;
            let (s, e) = info.data_offsets;
            let start = base.checked_add(s).ok_or_else(|| bad("data offset overflows"))?;
            let end = base.checked_add(e).ok_or_else(|| bad("data offset overflows"))?;
            if start > end || end > map.len() {
                return Err(bad("data lies outside the file"));
            }
            tensors.insert(name, TensorInfo { dtype: info.dtype, shape, start, end });
        }
        Ok(Mapped { map, tensors })
    }

    /// Tells the kernel the process no longer needs the mapped pages of `range`.
    fn release(&self, start: usize, len: usize) {
        if len == 0 {
            return;
        }
        // SAFETY: the mapping is a read-only file mapping, so dropping its pages only makes a
        // later read fault them in again from the file (the page cache keeps them); no byte
        // of it is ever written, so nothing can be lost. memmap2 aligns `start` down to a
        // page. Advice is a hint: a failure changes nothing, so it is ignored.
        #[cfg(unix)]
        let _ = unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
        #[cfg(not(unix))]
        let _ = (start, len);
    }
}

/// One file of the checkpoint, mapped on first use.
struct Shard {
    path: PathBuf,
    mapped: OnceLock<Mapped>,
}

/// A checkpoint: one safetensors file or the shards of an index, mapped lazily.
pub struct Checkpoint {
    /// What the user named (for messages).
    origin: PathBuf,
    shards: Vec<Shard>,
    /// Tensor name -> shard.
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Checkpoint({}, {} file(s), {} tensors)",
            self.origin.display(),
            self.shards.len(),
            self.index.len()
        )
    }
}

impl Checkpoint {
    /// Opens a `.safetensors` file, an index `.json` file, or a directory holding
    /// `model.safetensors.index.json` (else a single `model.safetensors`).
    pub fn open(path: &Path) -> Result<Checkpoint> {
        let ctx = path.display().to_string();
        if path.is_dir() {
            let index = path.join(INDEX_FILE);
            if index.is_file() {
                return Checkpoint::from_index(&index);
            }
            let single = path.join("model.safetensors");
            if single.is_file() {
                return Checkpoint::from_file(&single);
            }
            return Err(Error::other(
                ctx,
                format!("is a directory without {INDEX_FILE} or model.safetensors"),
            ));
        }
        if !path.exists() {
            return Err(Error::other(ctx, "does not exist"));
        }
        if path.extension().is_some_and(|e| e == "json") {
            Checkpoint::from_index(path)
        } else {
            Checkpoint::from_file(path)
        }
    }

    fn from_file(path: &Path) -> Result<Checkpoint> {
        let mapped = Mapped::open(path)?;
        let index = mapped.tensors.keys().map(|k| (k.clone(), 0)).collect();
        let cell = OnceLock::new();
        let _ = cell.set(mapped);
        Ok(Checkpoint {
            origin: path.to_path_buf(),
            shards: vec![Shard { path: path.to_path_buf(), mapped: cell }],
            index,
        })
    }

    fn from_index(path: &Path) -> Result<Checkpoint> {
        let ctx = path.display().to_string();
        let text = read_json_text(path, MAX_INDEX_BYTES)?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Error::other(ctx.clone(), format!("not valid JSON: {e}")))?;
        let Some(map) = v.get("weight_map").and_then(Value::as_object) else {
            return Err(Error::other(ctx, "field `weight_map`: missing or not an object"));
        };
        // Two entries for one tensor (in the map or anywhere else): the JSON parse keeps the
        // last without a word, so which shard holds it would be a guess.
        if let Some(key) = crate::safetensors_header::first_duplicate_key(&text) {
            return Err(Error::other(
                ctx,
                format!("field `{key}`: listed twice (each key must appear once)"),
            ));
        }
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        let mut shards: Vec<Shard> = Vec::new();
        let mut by_file: HashMap<String, usize> = HashMap::new();
        let mut index = HashMap::new();
        for (name, file) in map {
            let Some(file) = file.as_str() else {
                return Err(Error::other(ctx, format!("field `weight_map.{name}`: not a file name")));
            };
            let rel = Path::new(file);
            // An empty name has no components at all, and would name the directory itself.
            if file.is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
                return Err(Error::other(
                    ctx,
                    format!("field `weight_map.{name}`: `{file}` is not a plain relative path inside the checkpoint"),
                ));
            }
            let i = match by_file.get(file) {
                Some(&i) => i,
                None => {
                    shards.push(Shard { path: dir.join(rel), mapped: OnceLock::new() });
                    by_file.insert(file.to_string(), shards.len() - 1);
                    shards.len() - 1
                }
            };
            index.insert(name.clone(), i);
        }
        Ok(Checkpoint { origin: path.to_path_buf(), shards, index })
    }

    /// What was opened (for messages).
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// Files of the checkpoint (shards listed by the index, or the one file).
    pub fn num_files(&self) -> usize {
        self.shards.len()
    }

    /// Every file the checkpoint reads: the index it was opened through (if any) and each
    /// shard it lists, or the one file (what `vt-mla run` refuses to write its output over).
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.origin.as_path()).chain(self.shards.iter().map(|s| s.path.as_path()))
    }

    /// Files mapped so far.
    pub fn mapped_files(&self) -> usize {
        self.shards.iter().filter(|s| s.mapped.get().is_some()).count()
    }

    /// Whether the checkpoint lists tensor `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Every tensor name the checkpoint lists (unordered).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    fn shard(&self, i: usize) -> Result<&Mapped> {
        let Some(s) = self.shards.get(i) else {
            return Err(Error::other(self.origin.display().to_string(), format!("no file {i}")));
        };
        if let Some(m) = s.mapped.get() {
            return Ok(m);
        }
        let m = Mapped::open(&s.path)?;
        Ok(s.mapped.get_or_init(|| m))
    }

    /// The raw stored tensor `name`: dtype, shape and bytes (in the mapping).
    pub fn raw(&self, name: &str) -> Result<RawTensor<'_>> {
        let Some(&i) = self.index.get(name) else {
            return Err(Error::other(self.origin.display().to_string(), format!("missing tensor `{name}`")));
        };
        let m = self.shard(i)?;
        let Some(info) = m.tensors.get(name) else {
            return Err(Error::other(
                self.shards[i].path.display().to_string(),
                format!("missing tensor `{name}` (the index lists it in this file)"),
            ));
        };
        Ok(RawTensor {
            name: name.to_string(),
            file: &self.shards[i].path,
            dtype: info.dtype,
            shape: info.shape.clone(),
            data: &m.map[info.start..info.end],
            mapped: Some((m, info.start)),
        })
    }

    /// Weight `name` ready for conversion: bf16/f16/f32, or fp8 e4m3 with its
    /// `{name}_scale_inv` (checked: f32, `[ceil(rows/128), ceil(cols/128)]`, finite).
    pub fn weight(&self, name: &str) -> Result<WeightSource<'_>> {
        let raw = self.raw(name)?;
        let scale = if raw.dtype == StDtype::F8_E4M3 {
            let sname = format!("{name}_scale_inv");
            if !self.contains(&sname) {
                return Err(Error::other(
                    raw.file.display().to_string(),
                    format!("fp8 tensor `{name}` has no scale tensor `{sname}` (fp8 weights need one f32 scale per 128x128 block)"),
                ));
            }
            Some(self.raw(&sname)?)
        } else {
            None
        };
        WeightSource::new(raw, scale)
    }
}

/// A stored tensor: where it came from, its dtype, shape and bytes.
#[derive(Clone)]
pub struct RawTensor<'a> {
    pub name: String,
    pub file: &'a Path,
    pub dtype: StDtype,
    pub shape: Vec<i64>,
    pub data: &'a [u8],
    /// The mapping and the data's offset in it, to release consumed pages.
    mapped: Option<(&'a Mapped, usize)>,
}

impl<'a> RawTensor<'a> {
    /// A tensor of an in-memory safetensors file (nothing to release).
    pub fn from_safetensors(st: &'a SafeTensors<'a>, name: &str, file: &'a Path) -> Result<RawTensor<'a>> {
        let view = st
            .tensor(name)
            .map_err(|_| Error::other(file.display().to_string(), format!("missing tensor `{name}`")))?;
        let shape = view
            .shape()
            .iter()
            .map(|&d| {
                i64::try_from(d).map_err(|_| {
                    Error::other(
                        file.display().to_string(),
                        format!("tensor `{name}`: a dimension does not fit i64"),
                    )
                })
            })
            .collect::<Result<Vec<i64>>>()?;
        Ok(RawTensor {
            name: name.to_string(),
            file,
            dtype: view.dtype(),
            shape,
            data: view.data(),
            mapped: None,
        })
    }

    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::other(self.file.display().to_string(), format!("tensor `{}` {msg}", self.name))
    }

    fn release(&self, from: usize, len: usize) {
        if let Some((m, off)) = self.mapped {
            m.release(off + from, len);
        }
    }
}

impl std::fmt::Debug for RawTensor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawTensor(`{}` {:?} {:?} in {})", self.name, self.dtype, self.shape, self.file.display())
    }
}

impl std::fmt::Debug for WeightSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeightSource({:?}{})", self.raw, if self.is_fp8() { ", fp8 block scales" } else { "" })
    }
}

/// The vt dtype of a stored safetensors dtype, if vt has it.
pub fn vt_dtype(d: StDtype) -> Option<DType> {
    match d {
        StDtype::BF16 => Some(DType::BF16),
        StDtype::F16 => Some(DType::F16),
        StDtype::F32 => Some(DType::F32),
        StDtype::I32 => Some(DType::I32),
        StDtype::I64 => Some(DType::I64),
        StDtype::F8_E4M3 => Some(DType::F8E4M3),
        _ => None,
    }
}

/// The 256 values of OCP fp8 e4m3fn (`float8_e4m3fn`): sign, 4 exponent bits (bias 7), 3
/// mantissa bits; exponent 0 is subnormal (`m/8 * 2^-6`); there are no infinities, and
/// only `0x7f` / `0xff` (all exponent and mantissa bits set) are NaN, so `0x7e` = 448 is the
/// largest finite value.
pub fn e4m3fn_table() -> &'static [f32; 256] {
    static TABLE: OnceLock<[f32; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [0f32; 256];
        for (b, v) in t.iter_mut().enumerate() {
            let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
            let e = ((b >> 3) & 0xf) as i32;
            let m = (b & 0x7) as f32;
            *v = if e == 0xf && b & 0x7 == 0x7 {
                f32::NAN
            } else if e == 0 {
                sign * (m / 8.0) * 2f32.powi(-6)
            } else {
                sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
            };
        }
        t
    })
}

/// fp8 e4m3fn byte to f32 (exact).
pub fn e4m3fn_to_f32(b: u8) -> f32 {
    e4m3fn_table()[b as usize]
}

/// A weight as stored, ready to be converted into a compute dtype chunk by chunk.
#[derive(Clone)]
pub struct WeightSource<'a> {
    pub raw: RawTensor<'a>,
    /// fp8: the scales `[ceil(rows/128), ceil(cols/128)]`, decoded.
    scale: Option<(Vec<f32>, i64)>,
    rows: i64,
    cols: i64,
}

impl<'a> WeightSource<'a> {
    /// Checks dtype, size and (fp8) the scale tensor; errors name the tensor.
    pub fn new(raw: RawTensor<'a>, scale: Option<RawTensor<'a>>) -> Result<WeightSource<'a>> {
        let (rows, cols) = match raw.shape[..] {
            [n] => (1, n),
            [r, c] => (r, c),
            _ => return Err(raw.err(format!("has shape {:?}; weights are 1-D or 2-D", raw.shape))),
        };
        let es = match raw.dtype {
            StDtype::BF16 | StDtype::F16 => 2,
            StDtype::F32 => 4,
            StDtype::F8_E4M3 => 1,
            other => {
                return Err(raw.err(format!(
                    "has dtype {}; supported: bf16, f16, f32, fp8 e4m3 (f8_e4m3) with block scales",
                    format!("{other:?}").to_lowercase()
                )))
            }
        };
        let want = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(es))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| raw.err(format!("shape {:?} overflows", raw.shape)))?;
        if raw.data.len() != want {
            return Err(raw.err(format!(
                "holds {} bytes, its shape {:?} needs {want}",
                raw.data.len(),
                raw.shape
            )));
        }
        let scale = match (raw.dtype, scale) {
            (StDtype::F8_E4M3, None) => {
                return Err(raw.err(format!("is fp8 but has no `{}_scale_inv`", raw.name)));
            }
            (StDtype::F8_E4M3, Some(s)) => {
                if raw.shape.len() != 2 {
                    return Err(raw.err(format!(
                        "is fp8 with shape {:?}; only 2-D weights take block scales",
                        raw.shape
                    )));
                }
                let (rb, cb) = (blocks(rows), blocks(cols));
                if s.dtype != StDtype::F32 || s.shape != [rb, cb] {
                    return Err(s.err(format!(
                        "is {:?} {:?}; the scales of `{}` [{rows}, {cols}] must be F32 [{rb}, {cb}] (one per {FP8_BLOCK}x{FP8_BLOCK} block, partial edge blocks included)",
                        s.dtype, s.shape, raw.name
                    )));
                }
                let vals: Vec<f32> =
                    s.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                if vals.len() as i64 != rb * cb {
                    return Err(s.err(format!("holds {} values for [{rb}, {cb}]", vals.len())));
                }
                if let Some(i) = vals.iter().position(|v| !v.is_finite()) {
                    return Err(s.err(format!(
                        "scale [{}, {}] is {} (must be finite)",
                        i as i64 / cb,
                        i as i64 % cb,
                        vals[i]
                    )));
                }
                Some((vals, cb))
            }
            (_, Some(s)) => {
                return Err(s.err(format!("is a block scale but `{}` is {:?}, not fp8", raw.name, raw.dtype)));
            }
            (_, None) => None,
        };
        Ok(WeightSource { raw, scale, rows, cols })
    }

    /// The stored shape.
    pub fn shape(&self) -> &[i64] {
        &self.raw.shape
    }

    /// The stored dtype as a vt dtype (fp8 is `F8E4M3`).
    pub fn stored_dtype(&self) -> DType {
        vt_dtype(self.raw.dtype).unwrap_or(DType::F32)
    }

    /// Whether the weight is fp8 with block scales.
    pub fn is_fp8(&self) -> bool {
        self.scale.is_some()
    }

    /// An fp8 weight as stored: its e4m3 codes (checked: no NaN code, as the dequantizing
    /// path checks) and its decoded scales `[ceil(rows/128), ceil(cols/128)]`, row-major
    /// (what [`crate::HostWeights::from_checkpoint_with`] keeps when fp8 weights stay fp8).
    /// `None` for a float weight.
    pub fn fp8_parts(&self) -> Result<Option<(&'a [u8], &[f32])>> {
        let Some((scales, _)) = &self.scale else { return Ok(None) };
        let cols = self.cols.max(1) as usize;
        if let Some(i) = self.raw.data.iter().position(|&q| q & 0x7f == 0x7f) {
            let q = self.raw.data[i];
            return Err(self.raw.err(format!(
                "holds an fp8 NaN (0x{q:02x}) at [{}, {}]",
                i / cols,
                i % cols
            )));
        }
        Ok(Some((self.raw.data, scales)))
    }

    fn row_bytes_stored(&self) -> usize {
        self.raw.data.len() / self.rows.max(1) as usize
    }

    /// Converts rows `r0..r1` to `dtype` (bf16/f16/f32) in chunks of a few MiB: `f(row, bytes)`
    /// gets each chunk's first row and its bytes (the mapped bytes themselves when no
    /// conversion is needed). With `release`, the mapped pages of each chunk are given back
    /// to the kernel after `f` returns.
    pub fn for_each_chunk(
        &self,
        r0: i64,
        r1: i64,
        dtype: DType,
        release: bool,
        mut f: impl FnMut(i64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        if !dtype.is_compute_float() {
            return Err(self.raw.err(format!("cannot be converted to {dtype}")));
        }
        if r0 < 0 || r1 < r0 || r1 > self.rows {
            return Err(self.raw.err(format!("has {} rows, asked for {r0}..{r1}", self.rows)));
        }
        let rb = self.row_bytes_stored();
        let per = (CHUNK_BYTES / rb.max(1)).max(1) as i64;
        let same = vt_dtype(self.raw.dtype) == Some(dtype);
        let mut staging = Vec::new();
        let mut r = r0;
        while r < r1 {
            let e = (r + per).min(r1);
            let (a, b) = (r as usize * rb, e as usize * rb);
            let src = &self.raw.data[a..b];
            if same {
                f(r, src)?;
            } else {
                staging.clear();
                self.convert_rows(r, e, src, dtype, &mut staging)?;
                f(r, &staging)?;
            }
            if release {
                self.raw.release(a, b - a);
            }
            r = e;
        }
        Ok(())
    }

    /// The whole weight in `dtype` as host bytes.
    pub fn to_bytes(&self, dtype: DType, release: bool) -> Result<Vec<u8>> {
        let n = usize::try_from(self.rows.checked_mul(self.cols).unwrap_or(i64::MAX))
            .ok()
            .and_then(|n| n.checked_mul(dtype.size_of()))
            .ok_or_else(|| self.raw.err("is too large"))?;
        let mut out = Vec::with_capacity(n);
        self.for_each_chunk(0, self.rows, dtype, release, |_, b| {
            out.extend_from_slice(b);
            Ok(())
        })?;
        Ok(out)
    }

    fn convert_rows(&self, r0: i64, r1: i64, src: &[u8], dtype: DType, out: &mut Vec<u8>) -> Result<()> {
        let cols = self.cols as usize;
        if cols == 0 {
            // Rows of no columns: nothing to convert (and `chunks_exact(0)` would panic).
            return Ok(());
        }
        out.reserve((r1 - r0) as usize * cols * dtype.size_of());
        let put = |out: &mut Vec<u8>, v: f32| match dtype {
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            _ => out.extend_from_slice(&v.to_le_bytes()),
        };
        match (self.raw.dtype, &self.scale) {
            (StDtype::F8_E4M3, Some((scales, cb))) => {
                let lut = e4m3fn_table();
                for (i, row) in src.chunks_exact(cols).enumerate() {
                    let r = r0 + i as i64;
                    let srow = &scales[(r / FP8_BLOCK * cb) as usize..][..*cb as usize];
                    for (c, &q) in row.iter().enumerate() {
                        if q & 0x7f == 0x7f {
                            return Err(self.raw.err(format!("holds an fp8 NaN (0x{q:02x}) at [{r}, {c}]")));
                        }
                        put(out, lut[q as usize] * srow[c / FP8_BLOCK as usize]);
                    }
                }
            }
            (StDtype::BF16, _) => {
                for c in src.chunks_exact(2) {
                    put(out, half::bf16::from_le_bytes([c[0], c[1]]).to_f32());
                }
            }
            (StDtype::F16, _) => {
                for c in src.chunks_exact(2) {
                    put(out, half::f16::from_le_bytes([c[0], c[1]]).to_f32());
                }
            }
            (StDtype::F32, _) => {
                for c in src.chunks_exact(4) {
                    put(out, f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                }
            }
            (other, _) => {
                return Err(self.raw.err(format!("has dtype {other:?}, which cannot be converted")))
            }
        }
        Ok(())
    }
}

/// Blocks of [`FP8_BLOCK`] covering `n` (the last one partial).
fn blocks(n: i64) -> i64 {
    n / FP8_BLOCK + i64::from(n % FP8_BLOCK != 0)
}

/// `model.layers.{layer}.self_attn.`: the prefix of a layer's attention weights in Hugging
/// Face DeepSeek checkpoints.
pub fn layer_prefix(layer: usize) -> String {
    format!("model.layers.{layer}.self_attn.")
}
