//! RmsNorm: `out = x / sqrt(mean(x^2) + eps) * weight`, rounded as the contract says.

use vt_core::{DType, OpId, Queue, Result, RmsNormArgs};

use crate::host::{round_to, HostView};

const OP: OpId = OpId::RmsNorm;

pub(crate) fn run(_q: &Queue, a: &RmsNormArgs<'_>) -> Result<()> {
    let (out, x, w) = (HostView::new(OP, &a.out)?, HostView::new(OP, &a.x)?, HostView::new(OP, &a.weight)?);
    let (t, d) = (x.dim(0), x.dim(1));
    let mut weight = vec![0f32; d];
    w.read_row(&[], &mut weight);
    let mut row = vec![0f32; d];
    let mut res = vec![0f32; d];
    for i in 0..t {
        // The whole row is read before any of it is written: `out` may be `x`.
        x.read_row(&[i], &mut row);
        rms_norm_row(&row, &weight, a.eps, x.dtype(), &mut res);
        out.write_row(&[i], &res);
    }
    Ok(())
}

/// One row of RmsNorm, exactly as the contract describes (shared with FusedNormRope so
/// the two are bit-identical): sum of squares in f32 in index order, `scale =
/// 1/sqrt(mean + eps)` in f32, `x * scale` rounded to the storage dtype, then times the
/// weight in f32 (the caller's store rounds that product once).
pub(crate) fn rms_norm_row(x: &[f32], weight: &[f32], eps: f32, dtype: DType, out: &mut [f32]) {
    let mut sum_sq = 0f32;
    for &v in x {
        sum_sq += v * v;
    }
    let mean = sum_sq / x.len().max(1) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = round_to(dtype, v * scale) * w;
    }
}
