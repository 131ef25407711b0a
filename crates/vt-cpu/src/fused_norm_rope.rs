//! FusedNormRope: RmsNorm of a kv row's latent part and RoPE of its rope part, through
//! the very same per-row functions as RmsNorm and RopeFromCache (bit-identical).

use vt_core::{FusedNormRopeArgs, OpId, Queue, Result};

use crate::host::HostView;
use crate::rms_norm::rms_norm_row;
use crate::rope_from_cache::{position, rope_row};

const OP: OpId = OpId::FusedNormRope;

pub(crate) fn run(_q: &Queue, a: &FusedNormRopeArgs<'_>) -> Result<()> {
    let kv = HostView::new(OP, &a.kv)?;
    let w = HostView::new(OP, &a.weight)?;
    let latent_out = HostView::new(OP, &a.latent_out)?;
    let rope_out = HostView::new(OP, &a.rope_out)?;
    let positions = HostView::new(OP, &a.positions)?;
    let cache = HostView::new(OP, &a.cos_sin_cache)?;
    let (t, l) = (kv.dim(0), w.dim(0));
    let r = kv.dim(1) - l;
    let mut weight = vec![0f32; l];
    w.read_row(&[], &mut weight);
    let mut row = vec![0f32; l + r];
    let mut normed = vec![0f32; l];
    let mut cos_sin = vec![0f32; r];
    for ti in 0..t {
        kv.read_row(&[ti], &mut row);
        let (latent, rope) = row.split_at_mut(l);
        rms_norm_row(latent, &weight, a.eps, kv.dtype(), &mut normed);
        latent_out.write_row(&[ti], &normed);
        // As RopeFromCache: an out-of-range position leaves the rope part unrotated.
        if let Some(pos) = position(&positions, &cache, ti) {
            cache.read_row(&[pos], &mut cos_sin);
            let (cos, sin) = cos_sin.split_at(r / 2);
            rope_row(rope, cos, sin, a.is_neox);
        }
        rope_out.write_row(&[ti], rope);
    }
    Ok(())
}
