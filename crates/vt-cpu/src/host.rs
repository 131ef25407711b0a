//! Element access to host-resident [`Tensor`] views, shared by every CPU op.
//!
//! A [`HostView`] reads and writes single elements of any float (or index) dtype by
//! logical index, honouring the view's strides and element offset. Reads convert to
//! f32 (exact for bf16/f16/f32); writes round an f32 once to the storage dtype (round
//! to nearest even, via `half`). The raw-pointer access lives in [`HostView::read_at`]
//! and [`HostView::write_at`], the only unsafe code of the ops.

use vt_core::{read_host_elem, DType, DeviceType, Error, OpId, Result, Tensor, MAX_RANK};

/// A view of host memory with checked element access.
#[derive(Clone, Copy)]
pub(crate) struct HostView<'a> {
    t: Tensor<'a>,
    /// The element offsets `[lo, hi)` the view covers (empty view: `lo == hi`). Every
    /// access is checked against them, so an indexing bug reads NaN / skips a write
    /// instead of touching memory outside the view.
    lo: i64,
    hi: i64,
}

impl<'a> HostView<'a> {
    /// Wraps a view. Errors if the view is not in host memory (validation already
    /// checked the device; this keeps the unsafe access below sound regardless).
    pub fn new(op: OpId, t: &Tensor<'a>) -> Result<HostView<'a>> {
        if t.device().kind != DeviceType::Cpu {
            return Err(Error::op_failed(
                op,
                "cpu",
                format!("a tensor on {} reached the CPU backend", t.device()),
            ));
        }
        let (lo, hi) = t.elem_span().unwrap_or((0, 0));
        Ok(HostView { t: *t, lo, hi })
    }

    /// Wraps an optional view.
    pub fn opt(op: OpId, t: &Option<Tensor<'a>>) -> Result<Option<HostView<'a>>> {
        t.as_ref().map(|t| HostView::new(op, t)).transpose()
    }

    pub fn dim(&self, d: usize) -> usize {
        self.t.dim(d).max(0) as usize
    }

    pub fn dtype(&self) -> DType {
        self.t.dtype()
    }

    /// The element offset of logical index `idx` (missing trailing indices are 0).
    pub fn offset_of(&self, idx: &[usize]) -> i64 {
        let strides = self.t.strides();
        let mut off = self.t.offset();
        for (i, &x) in idx.iter().enumerate().take(MAX_RANK.min(strides.len())) {
            off += x as i64 * strides[i];
        }
        off
    }

    /// The element at `idx` as f32 (index dtypes convert as `as f32`; use [`Self::get_int`]).
    pub fn get(&self, idx: &[usize]) -> f32 {
        self.read_at(self.offset_of(idx)) as f32
    }

    /// The element at `idx` of an index tensor (i32/i64).
    pub fn get_int(&self, idx: &[usize]) -> i64 {
        self.read_at(self.offset_of(idx)) as i64
    }

    /// Rounds `v` to the storage dtype and stores it at `idx`.
    pub fn set(&self, idx: &[usize], v: f32) {
        self.write_at(self.offset_of(idx), v)
    }

    /// Stores an index value at `idx` of an i32/i64 tensor exactly (no f32 rounding; an
    /// i32 store truncates as `as i32`). Other dtypes store it through [`Self::set`].
    pub fn set_int(&self, idx: &[usize], v: i64) {
        let off = self.offset_of(idx);
        if off < self.lo || off >= self.hi {
            return;
        }
        let p = (self.t.base_addr() as usize + off as usize * self.t.dtype().size_of()) as *mut u8;
        // SAFETY: as in `write_at`: `p` addresses one element of the live host allocation.
        unsafe {
            match self.t.dtype() {
                DType::I32 => (p as *mut i32).write_unaligned(v as i32),
                DType::I64 => (p as *mut i64).write_unaligned(v),
                _ => self.write_at(off, v as f32),
            }
        }
    }

    /// Reads `dst.len()` elements along the last dim, starting at `lead` (the indices of
    /// the other dims; the last index starts at 0).
    pub fn read_row(&self, lead: &[usize], dst: &mut [f32]) {
        let start = self.offset_of(lead);
        let step = self.last_stride();
        if step == 1 && self.read_unit_row(start, dst) {
            return;
        }
        for (i, d) in dst.iter_mut().enumerate() {
            *d = self.read_at(start + i as i64 * step) as f32;
        }
    }

    /// Writes `src` along the last dim starting at `lead`, rounding each value once.
    pub fn write_row(&self, lead: &[usize], src: &[f32]) {
        self.write_row_from(lead, 0, src)
    }

    /// Writes `src` along the last dim starting at `lead` and last index `col`.
    pub fn write_row_from(&self, lead: &[usize], col: usize, src: &[f32]) {
        let step = self.last_stride();
        let start = self.offset_of(lead) + col as i64 * step;
        for (i, &v) in src.iter().enumerate() {
            self.write_at(start + i as i64 * step, v);
        }
    }

    /// [`Self::read_row`] of a unit-stride row of a 16-bit, f32 or e4m3 view that lies wholly inside
    /// the view, as one slice (the matmuls read their operands this way; element by element
    /// they spent most of their time converting). Returns false, reading nothing, otherwise.
    fn read_unit_row(&self, start: i64, dst: &mut [f32]) -> bool {
        let inside = i64::try_from(dst.len())
            .ok()
            .and_then(|n| start.checked_add(n))
            .is_some_and(|end| start >= self.lo && end <= self.hi);
        let dtype = self.t.dtype();
        if !inside || !matches!(dtype, DType::BF16 | DType::F16 | DType::F32 | DType::F8E4M3) {
            return false;
        }
        let p = (self.t.base_addr() as usize + start as usize * dtype.size_of()) as *const u8;
        // SAFETY: elements `start..start + dst.len()` lie inside the view's element span
        // (checked above), which lies inside its live host allocation (as in `read_at`).
        unsafe {
            match dtype {
                DType::BF16 => {
                    // bf16 is f32's upper half: the shift is the exact conversion, NaNs included.
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = f32::from_bits(u32::from((p as *const u16).add(i).read_unaligned()) << 16);
                    }
                }
                DType::F16 => {
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = half::f16::from_bits((p as *const u16).add(i).read_unaligned()).to_f32();
                    }
                }
                DType::F8E4M3 => {
                    let table = e4m3_table();
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = table[usize::from(p.add(i).read())];
                    }
                }
                _ => {
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = (p as *const f32).add(i).read_unaligned();
                    }
                }
            }
        }
        true
    }

    fn last_stride(&self) -> i64 {
        self.t.strides().last().copied().unwrap_or(1)
    }

    fn read_at(&self, off: i64) -> f64 {
        if off < self.lo || off >= self.hi {
            return f64::NAN;
        }
        // SAFETY: `off` lies inside the view's element span, which `Tensor::as_strided`
        // checked lies inside the view's live host allocation (the device is the CPU,
        // checked in `new`); the view's lifetime keeps that allocation alive.
        unsafe { read_host_elem(self.t.base_addr(), self.t.dtype(), off) }
    }

    fn write_at(&self, off: i64, v: f32) {
        if off < self.lo || off >= self.hi {
            return;
        }
        let p = (self.t.base_addr() as usize + off as usize * self.t.dtype().size_of()) as *mut u8;
        // SAFETY: as in `read_at`, `p` addresses one element of the live host allocation.
        // Host buffers are only ever accessed through raw pointers (never Rust references),
        // so writing through a shared view does not alias a reference.
        unsafe {
            match self.t.dtype() {
                DType::BF16 => (p as *mut u16).write_unaligned(half::bf16::from_f32(v).to_bits()),
                DType::F16 => (p as *mut u16).write_unaligned(half::f16::from_f32(v).to_bits()),
                DType::F32 => (p as *mut f32).write_unaligned(v),
                DType::I32 => (p as *mut i32).write_unaligned(v as i32),
                DType::I64 => (p as *mut i64).write_unaligned(v as i64),
                DType::F8E4M3 => p.write(vt_core::fp8_block::encode_e4m3(v)),
                // A raw row byte (see `DType::Fp8DsMla`): the ops encode rows themselves.
                DType::Fp8DsMla => p.write(v as u8),
            }
        }
    }
}

/// Rounds an f32 to `dtype` and back: the value a store of `v` would hold.
pub(crate) fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        DType::F16 => half::f16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// Every e4m3 code's value ([`vt_core::f8e4m3_to_f32`], computed once): the fp8 matmuls'
/// weight rows decode through it.
fn e4m3_table() -> &'static [f32; 256] {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|c| vt_core::f8e4m3_to_f32(c as u8)))
}
