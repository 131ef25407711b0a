//! ConcatAndCacheMla: `cache[s / BS, s % BS, :] = [kv_c[t] | k_pe[t]]`, slot < 0 skipped.

use vt_core::{ConcatAndCacheMlaArgs, OpId, Queue, Result};

use crate::host::HostView;

const OP: OpId = OpId::ConcatAndCacheMla;

pub(crate) fn run(_q: &Queue, a: &ConcatAndCacheMlaArgs<'_>) -> Result<()> {
    let kv_c = HostView::new(OP, &a.kv_c)?;
    let k_pe = HostView::new(OP, &a.k_pe)?;
    let cache = HostView::new(OP, &a.cache)?;
    let slots = HostView::new(OP, &a.slot_mapping)?;
    let (t, l, r) = (kv_c.dim(0), kv_c.dim(1), k_pe.dim(1));
    let (nb, bs) = (cache.dim(0), cache.dim(1));
    let mut row = vec![0f32; l + r];
    // In token order, so the last of two tokens with the same slot wins.
    for ti in 0..t {
        let slot = slots.get_int(&[ti]);
        // Padding (< 0) is skipped; validation rejects slots past the cache on the CPU,
        // and one would be skipped here too.
        if slot < 0 || slot as usize >= nb * bs {
            continue;
        }
        let slot = slot as usize;
        let (latent, rope) = row.split_at_mut(l);
        kv_c.read_row(&[ti], latent);
        k_pe.read_row(&[ti], rope);
        // A copy: values read from the same dtype store back unchanged.
        cache.write_row(&[slot / bs, slot % bs], &row);
    }
    Ok(())
}
