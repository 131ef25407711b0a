use crate::registry::dispatch;
use crate::validate::{host_ints, Check};
use crate::{fp8_ds_mla, DType, OpId, Queue, Result, Tensor};

/// Arguments of [`concat_and_cache_mla`].
#[derive(Clone, Copy, Debug)]
pub struct ConcatAndCacheMlaArgs<'a> {
    pub kv_c: Tensor<'a>,
    pub k_pe: Tensor<'a>,
    pub cache: Tensor<'a>,
    pub slot_mapping: Tensor<'a>,
}

/// `cache[s / BS, s % BS, :] = [kv_c[t] | k_pe[t]]` for `s = slot_mapping[t]`.
///
/// - `kv_c` `[T,L]`, `k_pe` `[T,R]` (stride 1 on the last dim), `cache` `[NB,BS,L+R]` (stride
///   1 on the last dim; block and row strides free, so a cache may be a view into a
///   larger pool); one float dtype. Any block size BS >= 1.
/// - Or an fp8 cache: `cache` `[NB,BS,656]` of [`DType::Fp8DsMla`] with L = 512, R = 64
///   (kv_c / k_pe in any one float dtype). Each written row is
///   [`fp8_ds_mla::encode_row`](crate::fp8_ds_mla::encode_row) of the token's values (read
///   as f32): bytes 0..512 the e4m3 codes of `kv_c / scale_g`, bytes 512..528 the f32 scales
///   `scale_g = amax(|kv_c[128 g .. 128 g + 128]|) / 448`, bytes 528..656 k_pe in bf16. A
///   group of zeros gets scale 0 and zero codes (decodes to 0, stays finite). GPU kernels
///   write the same bytes (IEEE f32 division, round to nearest even).
/// - `slot_mapping` `[T]` i64. A slot < 0 is padding: that token is skipped. A slot
///   >= NB*BS is an error on the CPU; GPU kernels skip it.
/// - `cache` must not overlap the inputs. Two tokens with the same slot: the last wins
///   on the CPU; unspecified on GPUs.
pub fn concat_and_cache_mla(q: &Queue, args: &ConcatAndCacheMlaArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, ConcatAndCacheMla, args)
}

fn validate(q: &Queue, a: &ConcatAndCacheMlaArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::ConcatAndCacheMla, q.device());
    c.float("kv_c", &a.kv_c, 2)?;
    c.float("k_pe", &a.k_pe, 2)?;
    let fp8 = c.fp8_mla_cache("cache", &a.cache)?;
    if !fp8 {
        c.float("cache", &a.cache, 3)?;
    }
    // A float cache sets the op's dtype; an fp8 cache takes kv_c's.
    let dt = if fp8 { a.kv_c.dtype() } else { a.cache.dtype() };
    c.same_dtype("kv_c", &a.kv_c, dt)?;
    c.same_dtype("k_pe", &a.k_pe, dt)?;
    let (t, l, r) = (a.kv_c.dim(0), a.kv_c.dim(1), a.k_pe.dim(1));
    c.dim("k_pe", &a.k_pe, 0, t, "kv_c's T")?;
    if fp8 {
        c.dim("kv_c", &a.kv_c, 1, fp8_ds_mla::LATENT as i64, "the fp8_ds_mla latent width")?;
        c.dim("k_pe", &a.k_pe, 1, fp8_ds_mla::ROPE as i64, "the fp8_ds_mla rope width")?;
    } else {
        let width = l.checked_add(r).ok_or_else(|| c.err("k_pe", "L + R overflows i64"))?;
        c.dim("cache", &a.cache, 2, width, "kv_c's L + k_pe's R")?;
    }
    c.block_size("cache", &a.cache)?;
    for (name, x) in [("kv_c", &a.kv_c), ("k_pe", &a.k_pe), ("cache", &a.cache)] {
        c.unit_inner(name, x)?;
    }
    c.output("cache", &a.cache)?;
    c.disjoint("cache", &a.cache, "kv_c", &a.kv_c)?;
    c.disjoint("cache", &a.cache, "k_pe", &a.k_pe)?;
    c.typed("slot_mapping", &a.slot_mapping, 1, DType::I64)?;
    c.dim("slot_mapping", &a.slot_mapping, 0, t, "kv_c's T")?;
    c.disjoint("cache", &a.cache, "slot_mapping", &a.slot_mapping)?;
    if let Some(v) = host_ints(&c, "slot_mapping", &a.slot_mapping)? {
        let slots = a.cache.dim(0) * a.cache.dim(1);
        if let Some((i, s)) = v.iter().enumerate().find(|(_, &s)| s >= slots) {
            return Err(
                c.err("slot_mapping", format!("slot_mapping[{i}] = {s} is past the cache's {slots} slots"))
            );
        }
    }
    Ok(())
}
