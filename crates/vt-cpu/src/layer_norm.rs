//! LayerNorm: `out = (x - mean) / sqrt(var + eps) * weight + bias`, as the contract says.

use vt_core::{LayerNormArgs, OpId, Queue, Result};

use crate::host::HostView;

const OP: OpId = OpId::LayerNorm;

pub(crate) fn run(_q: &Queue, a: &LayerNormArgs<'_>) -> Result<()> {
    let (out, x) = (HostView::new(OP, &a.out)?, HostView::new(OP, &a.x)?);
    let (w, b) = (HostView::new(OP, &a.weight)?, HostView::new(OP, &a.bias)?);
    let (t, d) = (x.dim(0), x.dim(1));
    let mut weight = vec![0f32; d];
    let mut bias = vec![0f32; d];
    w.read_row(&[], &mut weight);
    b.read_row(&[], &mut bias);
    let mut row = vec![0f32; d];
    let mut res = vec![0f32; d];
    for i in 0..t {
        // The whole row is read before any of it is written: `out` may be `x`.
        x.read_row(&[i], &mut row);
        layer_norm_row(&row, &weight, &bias, a.eps, &mut res);
        out.write_row(&[i], &res);
    }
    Ok(())
}

/// One row in f32, sums in index order; the caller's store rounds each value once.
fn layer_norm_row(x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len().max(1) as f32;
    let mean = x.iter().fold(0f32, |s, &v| s + v) / n;
    let var = x.iter().fold(0f32, |s, &v| s + (v - mean) * (v - mean)) / n;
    let rstd = 1.0f32 / (var + eps).sqrt();
    for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(weight).zip(bias) {
        *o = (v - mean) * rstd * w + b;
    }
}
