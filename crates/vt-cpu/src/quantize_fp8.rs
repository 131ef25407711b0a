//! QuantizeFp8: each row in 1 x 128 groups by `vt_core::fp8_block::quantize_row` (the
//! definition every backend reproduces bit for bit).

use vt_core::fp8_block::{blocks, decode, quantize_row};
use vt_core::{OpId, QuantizeFp8Args, Queue, Result};

use crate::host::HostView;

const OP: OpId = OpId::QuantizeFp8;

pub(crate) fn run(_q: &Queue, a: &QuantizeFp8Args<'_>) -> Result<()> {
    let (out, scale, x) =
        (HostView::new(OP, &a.out)?, HostView::new(OP, &a.scale)?, HostView::new(OP, &a.x)?);
    let (m, k) = (x.dim(0), x.dim(1));
    let groups = blocks(k as i64) as usize;
    let (mut row, mut codes, mut scales) = (vec![0f32; k], vec![0u8; k], vec![0f32; groups]);
    let mut values = vec![0f32; k];
    for i in 0..m {
        x.read_row(&[i], &mut row);
        quantize_row(&row, &mut codes, &mut scales);
        // Each code is stored as its value, which the e4m3 store encodes back to the code
        // (NaN codes are 0x7f either way).
        for (v, &c) in values.iter_mut().zip(&codes) {
            *v = decode(c, 1.0);
        }
        out.write_row(&[i], &values);
        for (g, &s) in scales.iter().enumerate() {
            scale.set(&[i, g], s);
        }
    }
    Ok(())
}
