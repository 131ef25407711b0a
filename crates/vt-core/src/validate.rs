//! Argument checks shared by the entry points. Every failure names the op and argument.

use crate::{DType, Device, Error, OpId, Result, Tensor};

/// The checks for one call of one op on one queue.
pub(crate) struct Check {
    pub op: OpId,
    pub device: Device,
}

impl Check {
    pub fn new(op: OpId, device: Device) -> Check {
        Check { op, device }
    }

    pub fn err(&self, arg: &'static str, msg: impl Into<String>) -> Error {
        Error::invalid(self.op, arg, msg)
    }

    /// Rank, device and dtype class of a floating-point operand.
    pub fn float(&self, arg: &'static str, t: &Tensor<'_>, rank: usize) -> Result<()> {
        self.rank(arg, t, rank)?;
        self.on_device(arg, t)?;
        if !t.dtype().is_compute_float() {
            return Err(self.err(arg, format!("dtype {} is not one of bf16, f16, f32", t.dtype())));
        }
        Ok(())
    }

    /// Rank, device and exact dtype.
    pub fn typed(&self, arg: &'static str, t: &Tensor<'_>, rank: usize, dtype: DType) -> Result<()> {
        self.rank(arg, t, rank)?;
        self.on_device(arg, t)?;
        if t.dtype() != dtype {
            return Err(self.err(arg, format!("dtype is {}, expected {dtype}", t.dtype())));
        }
        Ok(())
    }

    pub fn rank(&self, arg: &'static str, t: &Tensor<'_>, rank: usize) -> Result<()> {
        if t.rank() != rank {
            return Err(
                self.err(arg, format!("rank is {} (shape {:?}), expected {rank}", t.rank(), t.shape()))
            );
        }
        Ok(())
    }

    pub fn on_device(&self, arg: &'static str, t: &Tensor<'_>) -> Result<()> {
        if t.device() != self.device {
            return Err(self.err(arg, format!("is on {} but the queue is on {}", t.device(), self.device)));
        }
        Ok(())
    }

    pub fn same_dtype(&self, arg: &'static str, t: &Tensor<'_>, dtype: DType) -> Result<()> {
        if t.dtype() != dtype {
            return Err(self.err(arg, format!("dtype is {}, but the op runs in {dtype}", t.dtype())));
        }
        Ok(())
    }

    /// `t.shape()[d] == want`; `what` says where `want` comes from.
    pub fn dim(&self, arg: &'static str, t: &Tensor<'_>, d: usize, want: i64, what: &str) -> Result<()> {
        if t.dim(d) != want {
            return Err(self.err(
                arg,
                format!("dim {d} is {} (shape {:?}), expected {want} ({what})", t.dim(d), t.shape()),
            ));
        }
        Ok(())
    }

    /// The last dim has stride 1 (rows may be strided).
    pub fn unit_inner(&self, arg: &'static str, t: &Tensor<'_>) -> Result<()> {
        let r = t.rank();
        if r > 0 && t.dim(r - 1) > 1 && t.stride(r - 1) != 1 {
            return Err(self.err(arg, format!("last dim must have stride 1, strides are {:?}", t.strides())));
        }
        Ok(())
    }

    pub fn contiguous(&self, arg: &'static str, t: &Tensor<'_>) -> Result<()> {
        if !t.is_contiguous() {
            return Err(
                self.err(arg, format!("must be contiguous, shape {:?} strides {:?}", t.shape(), t.strides()))
            );
        }
        Ok(())
    }

    /// An output: no two indices write the same element.
    pub fn output(&self, arg: &'static str, t: &Tensor<'_>) -> Result<()> {
        if !t.is_non_overlapping() {
            return Err(self.err(
                arg,
                format!("output overlaps itself (shape {:?}, strides {:?})", t.shape(), t.strides()),
            ));
        }
        Ok(())
    }

    /// `out` shares no memory with `input`.
    pub fn disjoint(
        &self,
        out_arg: &'static str,
        out: &Tensor<'_>,
        in_arg: &'static str,
        input: &Tensor<'_>,
    ) -> Result<()> {
        if out.overlaps(input) {
            return Err(self.err(out_arg, format!("overlaps input `{in_arg}`, which this op does not allow")));
        }
        Ok(())
    }

    /// Rank, device and dtype of the operands of an fp8 block-scaled matmul, all of `rank`:
    /// `out` bf16, f16 or f32; `b` e4m3 with an f32 `b_scale`; `a` in `out`'s dtype without
    /// `a_scale` (weight-only fp8), or e4m3 with an f32 `a_scale`. Shapes are each op's own.
    pub fn fp8_matmul_dtypes(&self, rank: usize, x: &Fp8MatmulOperands<'_, '_>) -> Result<()> {
        self.float("out", x.out, rank)?;
        self.typed("b", x.b, rank, DType::F8E4M3)?;
        self.typed("b_scale", x.b_scale, rank, DType::F32)?;
        match x.a_scale {
            None => {
                self.float("a", x.a, rank)?;
                self.same_dtype("a", x.a, x.out.dtype())
            }
            Some(s) => {
                self.typed("a", x.a, rank, DType::F8E4M3)?;
                self.typed("a_scale", s, rank, DType::F32)
            }
        }
    }

    /// The output of an fp8 block-scaled matmul overlaps neither itself nor any input.
    pub fn fp8_matmul_output(&self, x: &Fp8MatmulOperands<'_, '_>) -> Result<()> {
        self.output("out", x.out)?;
        self.disjoint("out", x.out, "a", x.a)?;
        self.disjoint("out", x.out, "b", x.b)?;
        self.disjoint("out", x.out, "b_scale", x.b_scale)?;
        if let Some(s) = x.a_scale {
            self.disjoint("out", x.out, "a_scale", s)?;
        }
        Ok(())
    }

    /// Whether an MLA cache is an fp8_ds_mla cache; if it is, also its rank (3), device
    /// and row bytes ([`crate::fp8_ds_mla::ROW_BYTES`]). A float cache is left to the op's
    /// own checks, which keep naming the argument they always named.
    pub fn fp8_mla_cache(&self, arg: &'static str, cache: &Tensor<'_>) -> Result<bool> {
        if cache.dtype() != DType::Fp8DsMla {
            return Ok(false);
        }
        self.rank(arg, cache, 3)?;
        self.on_device(arg, cache)?;
        self.dim(arg, cache, 2, crate::fp8_ds_mla::ROW_BYTES as i64, "the fp8_ds_mla row bytes")?;
        Ok(true)
    }

    /// A paged cache `[NB, BS, D]` has a block size BS >= 1 (block arithmetic divides by it).
    pub fn block_size(&self, arg: &'static str, cache: &Tensor<'_>) -> Result<()> {
        if cache.dim(1) < 1 {
            return Err(self.err(arg, format!("block size (dim 1) must be >= 1, shape {:?}", cache.shape())));
        }
        Ok(())
    }

    pub fn positive_finite(&self, arg: &'static str, v: f32) -> Result<()> {
        if !(v.is_finite() && v > 0.0) {
            return Err(self.err(arg, format!("must be finite and > 0, got {v}")));
        }
        Ok(())
    }
}

/// The operands of an fp8 block-scaled matmul as [`crate::matmul_bt_fp8`] and
/// [`crate::batched_matmul_fp8`] both name them: their contracts agree on the operands'
/// dtypes and aliasing, checked once by [`Check::fp8_matmul_dtypes`] and
/// [`Check::fp8_matmul_output`].
pub(crate) struct Fp8MatmulOperands<'t, 'a> {
    pub out: &'t Tensor<'a>,
    pub a: &'t Tensor<'a>,
    pub a_scale: Option<&'t Tensor<'a>>,
    pub b: &'t Tensor<'a>,
    pub b_scale: &'t Tensor<'a>,
}

/// Checks of index tensors' values. Only possible where the values are host-readable
/// (the CPU device); GPU kernels instead skip out-of-range indices and never write
/// outside their outputs (see each op's contract). A view with more elements than host
/// memory can hold (a huge stride-0 dim) is an error naming `arg`.
pub(crate) fn host_ints(c: &Check, arg: &'static str, t: &Tensor<'_>) -> Result<Option<Vec<i64>>> {
    let v = t.host_values().map_err(|e| match e {
        Error::InvalidArgument { msg, .. } => c.err(arg, msg),
        e => e,
    })?;
    Ok(v.map(|v| v.into_iter().map(|x| x as i64).collect()))
}

/// A cumulative-lengths tensor `[B+1]`: starts at 0, nondecreasing, ends at most at `total`.
pub(crate) fn check_cu_seqlens(c: &Check, arg: &'static str, t: &Tensor<'_>, total: i64) -> Result<()> {
    let Some(v) = host_ints(c, arg, t)? else { return Ok(()) };
    if v.first().copied() != Some(0) {
        return Err(c.err(arg, format!("must start at 0, got {:?}", v.first())));
    }
    if let Some(i) = v.windows(2).position(|w| w[1] < w[0]) {
        return Err(
            c.err(arg, format!("must be nondecreasing: entry {} is {} after {}", i + 1, v[i + 1], v[i]))
        );
    }
    let last = v.last().copied().unwrap_or(0);
    if last > total {
        return Err(c.err(arg, format!("ends at {last}, past the {total} rows available")));
    }
    Ok(())
}
