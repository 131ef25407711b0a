//! ConcatAndCacheMla: `cache[s / BS, s % BS, :] = [kv_c[t] | k_pe[t]]`, slot < 0 skipped;
//! an fp8_ds_mla cache gets the row encoded.

use vt_core::fp8_ds_mla::{self, LATENT, ROPE, ROW_BYTES};
use vt_core::{ConcatAndCacheMlaArgs, DType, Error, OpId, Queue, Result};

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
        if cache.dtype() == DType::Fp8DsMla {
            write_fp8_row(&cache, slot / bs, slot % bs, latent, rope)?;
            continue;
        }
        // A copy: values read from the same dtype store back unchanged.
        cache.write_row(&[slot / bs, slot % bs], &row);
    }
    Ok(())
}

/// Encodes one token as an fp8_ds_mla row and stores its bytes (validation fixed L = 512
/// and R = 64; a mismatch here is a backend bug, reported, not a panic).
fn write_fp8_row(cache: &HostView<'_>, blk: usize, r: usize, latent: &[f32], rope: &[f32]) -> Result<()> {
    let bad = || Error::op_failed(OP, "cpu", "fp8_ds_mla row widths are not 512 + 64");
    let latent: &[f32; LATENT] = latent.try_into().map_err(|_| bad())?;
    let rope: &[f32; ROPE] = rope.try_into().map_err(|_| bad())?;
    let mut bytes = [0u8; ROW_BYTES];
    fp8_ds_mla::encode_row(latent, rope, &mut bytes);
    // Bytes as f32 values 0..=255: HostView stores them back as `v as u8`, exactly.
    let vals: Vec<f32> = bytes.iter().map(|&b| b as f32).collect();
    cache.write_row(&[blk, r], &vals);
    Ok(())
}
