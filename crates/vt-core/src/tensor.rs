//! `Tensor`: a non-owning, strided view of device (or host) memory.
//!
//! A view is an address, a dtype, a device, up to [`MAX_RANK`] dims with element strides,
//! and an element offset. Slicing, explicit strided views, transposes and reshapes of
//! contiguous data never copy. The lifetime `'a` ties a view to the [`crate::Buffer`] it
//! was taken from, so a view cannot outlive its memory; views made from raw addresses
//! ([`Tensor::from_raw_parts`]) are `unsafe` to create for that reason.
//!
//! Every view also carries the extent of the allocation it lies in (in elements), so a
//! derived view that would reach outside the allocation is an error, not a wild write.

use std::marker::PhantomData;

use crate::{DType, Device, Error, Result};

/// The largest rank a view can have.
pub const MAX_RANK: usize = 4;

/// A non-owning strided view. Cheap to copy.
#[derive(Clone, Copy)]
pub struct Tensor<'a> {
    /// Address of element 0 of the allocation (a host pointer for the CPU, a device
    /// address otherwise).
    base: u64,
    /// Elements in the allocation starting at `base`; views may not reach past it.
    extent: i64,
    offset: i64,
    dtype: DType,
    device: Device,
    rank: usize,
    shape: [i64; MAX_RANK],
    strides: [i64; MAX_RANK],
    _memory: PhantomData<&'a ()>,
}

impl std::fmt::Debug for Tensor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({} on {}, shape {:?}, strides {:?}, offset {})",
            self.dtype,
            self.device,
            self.shape(),
            self.strides(),
            self.offset
        )
    }
}

const OP: &str = "Tensor";

impl<'a> Tensor<'a> {
    /// Builds a view over memory that the caller vouches for.
    ///
    /// # Safety
    /// `base` must point to an allocation on `device` of at least `extent` elements of
    /// `dtype` that stays valid (and is not freed) for `'a`.
    pub unsafe fn from_raw_parts(
        base: u64,
        extent: i64,
        dtype: DType,
        device: Device,
        shape: &[i64],
        strides: &[i64],
        offset: i64,
    ) -> Result<Tensor<'a>> {
        if extent < 0 {
            return Err(Error::invalid(OP, "extent", format!("{extent} elements is negative")));
        }
        let t = Tensor {
            base,
            extent,
            offset: 0,
            dtype,
            device,
            rank: 0,
            shape: [1; MAX_RANK],
            strides: [0; MAX_RANK],
            _memory: PhantomData,
        };
        t.as_strided(offset, shape, strides)
    }

    /// A contiguous (row-major) view of a whole allocation.
    ///
    /// # Safety
    /// As for [`Tensor::from_raw_parts`], with `extent` = the product of `shape`.
    pub unsafe fn from_raw_contiguous(
        base: u64,
        dtype: DType,
        device: Device,
        shape: &[i64],
    ) -> Result<Tensor<'a>> {
        let strides = contiguous_strides(shape);
        let extent = checked_numel(shape)?;
        Tensor::from_raw_parts(base, extent, dtype, device, shape, &strides[..shape.len()], 0)
    }

    /// A contiguous view of a whole allocation, for [`crate::Buffer::view`].
    ///
    /// # Safety
    /// As for [`Tensor::from_raw_contiguous`]; `shape` must have rank <= MAX_RANK and
    /// non-negative dims (the caller checked).
    pub(crate) unsafe fn contiguous_unchecked(
        base: u64,
        dtype: DType,
        device: Device,
        shape: &[i64],
    ) -> Tensor<'a> {
        let rank = shape.len().min(MAX_RANK);
        let mut s = [1i64; MAX_RANK];
        s[..rank].copy_from_slice(&shape[..rank]);
        Tensor {
            base,
            extent: s[..rank].iter().product(),
            offset: 0,
            dtype,
            device,
            rank,
            shape: s,
            strides: contiguous_strides(&shape[..rank]),
            _memory: PhantomData,
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn device(&self) -> Device {
        self.device
    }
    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn shape(&self) -> &[i64] {
        &self.shape[..self.rank]
    }
    pub fn strides(&self) -> &[i64] {
        &self.strides[..self.rank]
    }
    /// Size of dim `d`. Panics if `d >= rank` (a programming error, not input data).
    pub fn dim(&self, d: usize) -> i64 {
        self.shape()[d]
    }
    pub fn stride(&self, d: usize) -> i64 {
        self.strides()[d]
    }
    /// The element offset of element `[0, 0, ...]` from the allocation's base.
    pub fn offset(&self) -> i64 {
        self.offset
    }
    pub fn numel(&self) -> i64 {
        self.shape().iter().product()
    }
    /// Address of the allocation's first element.
    pub fn base_addr(&self) -> u64 {
        self.base
    }
    /// Address of element `[0, 0, ...]` of this view.
    pub fn data_addr(&self) -> u64 {
        self.base + (self.offset as u64) * self.dtype.size_of() as u64
    }

    /// The smallest and one-past-largest element offsets (from `base`) this view touches;
    /// `None` for an empty view.
    pub fn elem_span(&self) -> Option<(i64, i64)> {
        if self.numel() == 0 {
            return None;
        }
        let mut hi = self.offset;
        for d in 0..self.rank {
            hi += (self.shape[d] - 1) * self.strides[d];
        }
        Some((self.offset, hi + 1))
    }

    /// The byte range `[start, end)` this view touches, `None` for an empty view.
    pub fn byte_span(&self) -> Option<(u64, u64)> {
        let s = self.dtype.size_of() as u64;
        self.elem_span().map(|(lo, hi)| (self.base + lo as u64 * s, self.base + hi as u64 * s))
    }

    /// Whether two views may share memory (same device and overlapping byte spans).
    /// Conservative: interleaved views that never touch the same element still count.
    pub fn overlaps(&self, other: &Tensor<'_>) -> bool {
        if self.device != other.device {
            return false;
        }
        match (self.byte_span(), other.byte_span()) {
            (Some((a0, a1)), Some((b0, b1))) => a0 < b1 && b0 < a1,
            _ => false,
        }
    }

    /// Same memory, same dtype, same shape and strides: the exact aliasing some ops allow.
    pub fn same_view(&self, other: &Tensor<'_>) -> bool {
        self.device == other.device
            && self.dtype == other.dtype
            && self.data_addr() == other.data_addr()
            && self.shape() == other.shape()
            && self.strides() == other.strides()
    }

    /// Row-major contiguous (size-1 dims may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expect = 1i64;
        for d in (0..self.rank).rev() {
            if self.shape[d] != 1 && self.strides[d] != expect {
                return false;
            }
            expect *= self.shape[d];
        }
        true
    }

    /// No two index tuples map to the same element: required of every output.
    pub fn is_non_overlapping(&self) -> bool {
        // An empty view writes nothing, whatever its strides (which `as_strided` does not
        // bound for it, so the sums below could wrap).
        if self.numel() == 0 {
            return true;
        }
        let mut dims: Vec<(i64, i64)> =
            (0..self.rank).filter(|&d| self.shape[d] > 1).map(|d| (self.strides[d], self.shape[d])).collect();
        dims.sort_unstable();
        let mut reach = 1i64; // one past the largest offset covered by the smaller dims
        for (stride, size) in dims {
            if stride < reach {
                return false;
            }
            // Never wraps for a non-empty view (its last offset fits i64); saturating keeps
            // the answer conservative regardless.
            reach = reach.saturating_add(stride.saturating_mul(size - 1));
        }
        true
    }

    /// A view of the same memory with an explicit shape and element strides, starting
    /// `elem_offset` elements after this view's first element (the seed's View2/View3).
    /// Errors if the result would reach outside the allocation.
    pub fn as_strided(&self, elem_offset: i64, shape: &[i64], strides: &[i64]) -> Result<Tensor<'a>> {
        if shape.len() > MAX_RANK {
            return Err(Error::invalid(OP, "shape", format!("rank {} exceeds {MAX_RANK}", shape.len())));
        }
        if shape.len() != strides.len() {
            return Err(Error::invalid(
                OP,
                "strides",
                format!("{} strides for {} dims", strides.len(), shape.len()),
            ));
        }
        if let Some(d) = shape.iter().position(|&s| s < 0) {
            return Err(Error::invalid(OP, "shape", format!("dim {d} is negative: {shape:?}")));
        }
        if let Some(d) = strides.iter().position(|&s| s < 0) {
            return Err(Error::invalid(OP, "strides", format!("stride {d} is negative: {strides:?}")));
        }
        // Every size derived from the view must fit: the element count (with empty dims
        // counted as 1, so any product of a subset of the dims fits too), its bytes, the
        // extent's bytes, and the offsets of its first and last elements.
        let overflow = |what: &str| {
            Error::invalid(
                OP,
                "view",
                format!(
                    "shape {shape:?} strides {strides:?} at offset {} + {elem_offset}: {what} overflows i64",
                    self.offset
                ),
            )
        };
        let size = self.dtype.size_of() as i64;
        shape
            .iter()
            .try_fold(size, |acc, &d| acc.checked_mul(d.max(1)))
            .ok_or_else(|| overflow("the byte size"))?;
        self.extent.checked_mul(size).ok_or_else(|| overflow("the allocation's byte size"))?;
        let offset = self.offset.checked_add(elem_offset).ok_or_else(|| overflow("the offset"))?;
        if !shape.contains(&0) {
            shape
                .iter()
                .zip(strides)
                .try_fold(offset, |acc, (&d, &s)| (d - 1).checked_mul(s).and_then(|x| acc.checked_add(x)))
                .and_then(|last| last.checked_add(1))
                .ok_or_else(|| overflow("the last element's offset"))?;
        }
        let mut t = *self;
        t.offset = offset;
        t.rank = shape.len();
        t.shape = [1; MAX_RANK];
        t.strides = [0; MAX_RANK];
        t.shape[..shape.len()].copy_from_slice(shape);
        t.strides[..strides.len()].copy_from_slice(strides);
        if let Some((lo, hi)) = t.elem_span() {
            if lo < 0 || hi > self.extent {
                return Err(Error::invalid(
                    OP,
                    "view",
                    format!(
                        "shape {shape:?} strides {strides:?} at offset {} reaches elements [{lo}, {hi}) \
                         outside the allocation of {} elements",
                        t.offset, self.extent
                    ),
                ));
            }
        }
        Ok(t)
    }

    /// Elements `[start, end)` along `dim`, keeping the rank.
    pub fn slice(&self, dim: usize, start: i64, end: i64) -> Result<Tensor<'a>> {
        self.check_dim(dim)?;
        if start < 0 || end < start || end > self.shape[dim] {
            return Err(Error::invalid(
                OP,
                "slice",
                format!("range {start}..{end} out of 0..{} on dim {dim}", self.shape[dim]),
            ));
        }
        let mut shape = self.shape;
        shape[dim] = end - start;
        // `start * stride` overflows only for an empty slice past the last element.
        let skip = start.checked_mul(self.strides[dim]).ok_or_else(|| {
            Error::invalid(OP, "slice", format!("start {start} x stride {} overflows i64", self.strides[dim]))
        })?;
        self.as_strided(skip, &shape[..self.rank], self.strides())
    }

    /// Index `i` along `dim`, dropping that dim.
    pub fn select(&self, dim: usize, i: i64) -> Result<Tensor<'a>> {
        self.check_dim(dim)?;
        let Some(end) = i.checked_add(1) else {
            return Err(Error::invalid(
                OP,
                "select",
                format!("index {i} out of 0..{} on dim {dim}", self.shape[dim]),
            ));
        };
        let s = self.slice(dim, i, end)?;
        let mut shape: Vec<i64> = s.shape().to_vec();
        let mut strides: Vec<i64> = s.strides().to_vec();
        shape.remove(dim);
        strides.remove(dim);
        s.as_strided(0, &shape, &strides)
    }

    /// Swaps two dims (no copy).
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Tensor<'a>> {
        self.check_dim(d0)?;
        self.check_dim(d1)?;
        let mut t = *self;
        t.shape.swap(d0, d1);
        t.strides.swap(d0, d1);
        Ok(t)
    }

    /// Reorders dims: result dim i is this view's dim `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor<'a>> {
        let mut seen = [false; MAX_RANK];
        if perm.len() != self.rank
            || perm.iter().any(|&p| p >= self.rank || std::mem::replace(&mut seen[p], true))
        {
            return Err(Error::invalid(
                OP,
                "perm",
                format!("{perm:?} is not a permutation of 0..{}", self.rank),
            ));
        }
        let shape: Vec<i64> = perm.iter().map(|&p| self.shape[p]).collect();
        let strides: Vec<i64> = perm.iter().map(|&p| self.strides[p]).collect();
        self.as_strided(0, &shape, &strides)
    }

    /// A new shape over contiguous data (no copy). Errors on non-contiguous views.
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor<'a>> {
        if !self.is_contiguous() {
            return Err(Error::invalid(OP, "reshape", format!("{self:?} is not contiguous")));
        }
        if shape.iter().any(|&d| d < 0) || checked_numel(shape)? != self.numel() {
            return Err(Error::invalid(
                OP,
                "reshape",
                format!("cannot view {:?} ({} elements) as {shape:?}", self.shape(), self.numel()),
            ));
        }
        let strides = contiguous_strides(shape);
        self.as_strided(0, shape, &strides[..shape.len().min(MAX_RANK)])
    }

    /// Inserts a size-1 dim at `dim`.
    pub fn unsqueeze(&self, dim: usize) -> Result<Tensor<'a>> {
        if dim > self.rank {
            return Err(Error::invalid(OP, "dim", format!("{dim} > rank {}", self.rank)));
        }
        let mut shape = self.shape().to_vec();
        let mut strides = self.strides().to_vec();
        // Any stride works for a size-1 dim; saturate rather than overflow.
        let s = if dim < self.rank { self.strides[dim].saturating_mul(self.shape[dim]) } else { 1 };
        shape.insert(dim, 1);
        strides.insert(dim, s);
        self.as_strided(0, &shape, &strides)
    }

    /// Reads a host-resident view's elements in logical (row-major) order as `f64`.
    /// Returns `Ok(None)` for views not on the CPU. Used by validation of index tensors.
    ///
    /// A view's element count is not bounded by its allocation (a stride-0 dim repeats
    /// elements), so the values' memory is reserved fallibly: a view with more elements
    /// than can be held is an error naming its shape and strides, not an abort.
    pub fn host_values(&self) -> Result<Option<Vec<f64>>> {
        if self.device.kind != crate::DeviceType::Cpu {
            return Ok(None);
        }
        let mut out = reserve_values(self)?;
        for_each_offset(self, |off| {
            // SAFETY: the view lies inside a live host allocation (checked by `as_strided`
            // against the extent, and the lifetime keeps the allocation alive).
            out.push(unsafe { read_host_elem(self.base, self.dtype, off) });
        });
        Ok(Some(out))
    }

    fn check_dim(&self, dim: usize) -> Result<()> {
        if dim >= self.rank {
            return Err(Error::invalid(OP, "dim", format!("dim {dim} out of range for rank {}", self.rank)));
        }
        Ok(())
    }
}

// SAFETY: a view is an address plus metadata; which thread dereferences it is governed by
// the queue that runs the ops, exactly as for the device allocations it describes.
unsafe impl Send for Tensor<'_> {}
unsafe impl Sync for Tensor<'_> {}

/// An empty vector with room for every element of `t` as f64, or an error naming the view
/// when that cannot be allocated (a broadcast view may have far more elements than its
/// allocation).
pub(crate) fn reserve_values(t: &Tensor<'_>) -> Result<Vec<f64>> {
    let n = t.numel().max(0);
    let mut out = Vec::new();
    usize::try_from(n).ok().and_then(|n| out.try_reserve_exact(n).ok()).ok_or_else(|| {
        Error::invalid(
            OP,
            "view",
            format!(
                "shape {:?} strides {:?}: its {n} elements cannot be read into host memory",
                t.shape(),
                t.strides()
            ),
        )
    })?;
    Ok(out)
}

/// Row-major strides for `shape` (first `shape.len()` entries are meaningful). A stride
/// past `i64::MAX` saturates; [`Tensor::as_strided`] rejects any view it would describe.
pub fn contiguous_strides(shape: &[i64]) -> [i64; MAX_RANK] {
    let mut s = [0i64; MAX_RANK];
    let mut acc = 1i64;
    for d in (0..shape.len().min(MAX_RANK)).rev() {
        s[d] = acc;
        acc = acc.saturating_mul(shape[d]);
    }
    s
}

/// The element count of `shape`, or an error naming the shape when a dim is negative or
/// the product overflows i64.
pub fn checked_numel(shape: &[i64]) -> Result<i64> {
    if let Some(d) = shape.iter().position(|&s| s < 0) {
        return Err(Error::invalid(OP, "shape", format!("dim {d} is negative: {shape:?}")));
    }
    shape
        .iter()
        .try_fold(1i64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::invalid(OP, "shape", format!("{shape:?}: the element count overflows i64")))
}

/// The byte size of a contiguous `shape` of `dtype`, or an error naming the shape when it
/// does not fit `isize` (no allocation can be that large).
pub fn checked_bytes(dtype: DType, shape: &[i64]) -> Result<usize> {
    let n = checked_numel(shape)?;
    n.checked_mul(dtype.size_of() as i64)
        .and_then(|b| isize::try_from(b).ok())
        .map(|b| b as usize)
        .ok_or_else(|| {
            Error::invalid(
                OP,
                "shape",
                format!("{shape:?} of {dtype}: {n} elements of {} bytes overflow isize", dtype.size_of()),
            )
        })
}

/// Calls `f` with the element offset (from base) of every element, in row-major order.
pub fn for_each_offset(t: &Tensor<'_>, f: impl FnMut(i64)) {
    // A Tensor's views were checked to lie inside their buffer when made, so every offset
    // fits; the walk cannot stop early.
    let _ = walk_offsets(t.offset(), t.shape(), t.strides(), f);
}

/// [`for_each_offset`] of a view described by its first element's `offset`, `shape` and
/// `strides` (elements; any rank), without a buffer behind it.
///
/// # Errors
/// `shape` and `strides` of different lengths, or an element offset outside i64 (checked before
/// `f` sees it: `f` may have been called for the elements before it).
pub fn for_each_strided_offset(
    offset: i64,
    shape: &[i64],
    strides: &[i64],
    f: impl FnMut(i64),
) -> Result<()> {
    const OP: &str = "for_each_strided_offset";
    if shape.len() != strides.len() {
        return Err(Error::invalid(
            OP,
            "strides",
            format!("{} strides for the {} dims of shape {shape:?}", strides.len(), shape.len()),
        ));
    }
    walk_offsets(offset, shape, strides, f).ok_or_else(|| {
        Error::invalid(
            OP,
            "strides",
            format!("an element offset of shape {shape:?}, strides {strides:?} from {offset} overflows i64"),
        )
    })
}

/// The row-major walk: the offset moves by one stride per step (checked), and back by
/// `(shape[d] - 1) * strides[d]` when dim `d` wraps. None on overflow.
fn walk_offsets(offset: i64, shape: &[i64], strides: &[i64], mut f: impl FnMut(i64)) -> Option<()> {
    if shape.iter().any(|&n| n <= 0) {
        return Some(());
    }
    let rank = shape.len().min(strides.len());
    let mut idx = vec![0i64; rank];
    let mut off = offset;
    loop {
        f(off);
        let mut d = rank;
        loop {
            if d == 0 {
                return Some(());
            }
            d -= 1;
            if idx[d] + 1 < shape[d] {
                idx[d] += 1;
                off = off.checked_add(strides[d])?;
                break;
            }
            off = off.checked_sub(idx[d].checked_mul(strides[d])?)?;
            idx[d] = 0;
        }
    }
}

/// Reads element `off` of a host allocation as f64.
///
/// # Safety
/// `base + off * size_of(dtype)` must be a readable element of a live host allocation.
pub unsafe fn read_host_elem(base: u64, dtype: DType, off: i64) -> f64 {
    let p = (base as usize + off as usize * dtype.size_of()) as *const u8;
    match dtype {
        DType::BF16 => half::bf16::from_bits((p as *const u16).read_unaligned()).to_f64(),
        DType::F16 => half::f16::from_bits((p as *const u16).read_unaligned()).to_f64(),
        DType::F32 => (p as *const f32).read_unaligned() as f64,
        DType::I32 => (p as *const i32).read_unaligned() as f64,
        DType::I64 => (p as *const i64).read_unaligned() as f64,
        DType::F8E4M3 => f8e4m3_to_f32(p.read()) as f64,
        // The raw byte: a row's values live in its layout, not in one element.
        DType::Fp8DsMla => p.read() as f64,
    }
}

/// Decodes one OCP fp8 e4m3fn byte.
pub fn f8e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0xf) as i32;
    let man = (b & 0x7) as f32;
    if exp == 0xf && (b & 0x7) == 0x7 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}
