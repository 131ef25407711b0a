//! FusedNormRope: RmsNorm of a kv row's latent part and RoPE of its rope part, through
//! the very same per-row functions as RmsNorm and RopeFromCache (bit-identical); the
//! optional query rope and cache write likewise reuse RopeFromCache's rotation and store
//! the same values as the outputs.

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
    let (q_in, q_out) = match &a.query {
        Some(x) => (Some(HostView::new(OP, &x.input)?), Some(HostView::new(OP, &x.out)?)),
        None => (None, None),
    };
    let (kv_cache, slots) = match &a.cache_write {
        Some(x) => (Some(HostView::new(OP, &x.cache)?), Some(HostView::new(OP, &x.slot_mapping)?)),
        None => (None, None),
    };
    let (t, l) = (kv.dim(0), w.dim(0));
    let r = kv.dim(1) - l;
    let mut weight = vec![0f32; l];
    w.read_row(&[], &mut weight);
    let mut row = vec![0f32; l + r];
    let mut normed = vec![0f32; l + r];
    let mut cos_sin = vec![0f32; r];
    let mut head = vec![0f32; r];
    for ti in 0..t {
        kv.read_row(&[ti], &mut row);
        let (latent, rope) = row.split_at_mut(l);
        rms_norm_row(latent, &weight, a.eps, kv.dtype(), &mut normed[..l]);
        latent_out.write_row(&[ti], &normed[..l]);
        // As RopeFromCache: an out-of-range position leaves the rope part unrotated.
        let pos = position(&positions, &cache, ti);
        if let Some(pos) = pos {
            cache.read_row(&[pos], &mut cos_sin);
            let (cos, sin) = cos_sin.split_at(r / 2);
            rope_row(rope, cos, sin, a.is_neox);
        }
        rope_out.write_row(&[ti], rope);
        if let (Some(qi), Some(qo)) = (&q_in, &q_out) {
            if ti < qi.dim(0) {
                for h in 0..qi.dim(1) {
                    qi.read_row(&[ti, h], &mut head);
                    if pos.is_some() {
                        let (cos, sin) = cos_sin.split_at(r / 2);
                        rope_row(&mut head, cos, sin, a.is_neox);
                    }
                    qo.write_row(&[ti, h], &head);
                }
            }
        }
        if let (Some(kc), Some(sl)) = (&kv_cache, &slots) {
            // As ConcatAndCacheMla: padding (< 0) and slots past the cache are skipped. The
            // f32 values written are those `latent_out` and `rope_out` received, so the
            // cache holds the same bits.
            let s = sl.get_int(&[ti]);
            let bs = kc.dim(1);
            if s >= 0 && (s as usize) < kc.dim(0) * bs {
                let s = s as usize;
                normed[l..].copy_from_slice(rope);
                kc.write_row(&[s / bs, s % bs], &normed);
            }
        }
    }
    Ok(())
}
