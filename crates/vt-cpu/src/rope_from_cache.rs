//! RopeFromCache: rotate q (and k) in place by angles from a `[max_pos, R]` cos/sin cache.

use vt_core::{OpId, Queue, Result, RopeFromCacheArgs};

use crate::host::HostView;

const OP: OpId = OpId::RopeFromCache;

pub(crate) fn run(_q: &Queue, a: &RopeFromCacheArgs<'_>) -> Result<()> {
    let q = HostView::new(OP, &a.query)?;
    let k = HostView::opt(OP, &a.key)?;
    let positions = HostView::new(OP, &a.positions)?;
    let cache = HostView::new(OP, &a.cos_sin_cache)?;
    let (t, r) = (q.dim(0), q.dim(2));
    let mut cos_sin = vec![0f32; r];
    let mut row = vec![0f32; r];
    for ti in 0..t {
        let Some(pos) = position(&positions, &cache, ti) else { continue };
        cache.read_row(&[pos], &mut cos_sin);
        let (cos, sin) = cos_sin.split_at(r / 2);
        for x in std::iter::once(&q).chain(k.as_ref()) {
            for h in 0..x.dim(1) {
                x.read_row(&[ti, h], &mut row);
                rope_row(&mut row, cos, sin, a.is_neox);
                x.write_row(&[ti, h], &row);
            }
        }
    }
    Ok(())
}

/// `positions[t]` if it is a row of the cache (validation guarantees it on the CPU;
/// an out-of-range position leaves the token unrotated, as on GPUs).
pub(crate) fn position(positions: &HostView<'_>, cache: &HostView<'_>, t: usize) -> Option<usize> {
    let p = positions.get_int(&[t]);
    (p >= 0 && (p as usize) < cache.dim(0)).then_some(p as usize)
}

/// Rotates one head's rotary slice in f32 (shared with FusedNormRope). Pair i is
/// `(i, i + R/2)` for neox, `(2i, 2i + 1)` for GPT-J, and uses `cos[i]`, `sin[i]`.
pub(crate) fn rope_row(x: &mut [f32], cos: &[f32], sin: &[f32], is_neox: bool) {
    let half = x.len() / 2;
    for i in 0..half {
        let (i0, i1) = if is_neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
        let (x0, x1) = (x[i0], x[i1]);
        x[i0] = x0 * cos[i] - x1 * sin[i];
        x[i1] = x1 * cos[i] + x0 * sin[i];
    }
}
