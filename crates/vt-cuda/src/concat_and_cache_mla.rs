//! ConcatAndCacheMla: one block per token writes `[kv_c | k_pe]` into its cache slot
//! (`kernels-cuda/concat_and_cache_mla.cu`); padding and out-of-range slots are skipped on
//! the device.

use vt_core::{ConcatAndCacheMlaArgs, DType, OpId, Queue, Result};

use crate::rope_from_cache::int;
use crate::{grid_1d, kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("concat_and_cache_mla");

const OP: OpId = OpId::ConcatAndCacheMla;

pub(crate) fn run(q: &Queue, a: &ConcatAndCacheMlaArgs<'_>) -> Result<()> {
    CudaQueue::of(q, OP)?.run(OP, &plan(a)?)
}

/// The kernel writes only rows of slots inside 0..NB*BS.
pub(crate) fn plan(a: &ConcatAndCacheMlaArgs<'_>) -> Result<Vec<Launch>> {
    let (t, l, r) = (a.kv_c.dim(0), a.kv_c.dim(1), a.k_pe.dim(1));
    let (nb, bs) = (a.cache.dim(0), a.cache.dim(1));
    if t == 0 || nb == 0 || bs == 0 {
        return Ok(vec![]);
    }
    if a.cache.dtype() == DType::Fp8DsMla {
        return Ok(vec![fp8_plan(a, t, nb, bs)]);
    }
    let mut args = row_args(a, t);
    args.extend([int(OP, "kv_c", l)?.into(), int(OP, "k_pe", r)?.into(), nb.into(), bs.into()]);
    Ok(vec![Launch::new(&SRC, "concat_and_cache_mla", a.cache.dtype(), (grid_1d(t), 1, 1), 128, args)])
}

/// The leading parameters that both kernels take (`kv_c, kvc_s, k_pe, kpe_s, cache, c_sb,
/// c_sr, slots, slot_s, tokens`); the float one adds `l, r, nb, bs`, the fp8 one `nb, bs`.
fn row_args(a: &ConcatAndCacheMlaArgs<'_>, t: i64) -> Vec<Arg> {
    vec![
        a.kv_c.data_addr().into(),
        a.kv_c.stride(0).into(),
        a.k_pe.data_addr().into(),
        a.k_pe.stride(0).into(),
        a.cache.data_addr().into(),
        a.cache.stride(0).into(),
        a.cache.stride(1).into(),
        a.slot_mapping.data_addr().into(),
        a.slot_mapping.stride(0).into(),
        t.into(),
    ]
}

/// An fp8_ds_mla cache: `concat_and_cache_mla_fp8_{kv dtype}`, one block of 128 threads
/// (a warp per 128-value scale group) per token; validation fixed L = 512, R = 64. Cache
/// strides are in bytes (one-byte elements).
fn fp8_plan(a: &ConcatAndCacheMlaArgs<'_>, t: i64, nb: i64, bs: i64) -> Launch {
    let mut args = row_args(a, t);
    args.extend([nb.into(), bs.into()]);
    Launch::new(&SRC, "concat_and_cache_mla_fp8", a.kv_c.dtype(), (grid_1d(t), 1, 1), 128, args)
}

#[cfg(test)]
mod gpu_tests {
    use vt_core::fp8_ds_mla::{encode_row, LATENT, ROPE, ROPE_OFFSET, ROW_BYTES, SCALE_OFFSET};
    use vt_core::{Buffer, DType, Device, DeviceType, Probe, Queue};

    use super::*;

    /// The fp8_ds_mla writer kernel (called through its plan, past the op's refusal) against
    /// the host encoder on the same bf16 inputs, byte by byte, region by region. Skips
    /// without a CUDA device.
    #[test]
    fn fp8_writer_bytes_match_the_host_encoder() -> Result<()> {
        if !matches!(crate::register(), Probe::Registered { .. }) {
            println!("SKIP: no CUDA device");
            return Ok(());
        }
        let q = Queue::new(Device::new(DeviceType::Cuda, 0))?;
        let (t, nb, bs) = (3usize, 2i64, 4i64);
        let val = |i: usize| half::bf16::from_f32(((i * 2654435761) % 1000) as f32 / 250.0 - 2.0);
        let kv: Vec<half::bf16> = (0..t * LATENT).map(val).collect();
        let pe: Vec<half::bf16> = (0..t * ROPE).map(|i| val(i + 7)).collect();
        let slots = [0i64, 5, 2];
        let kv_b = Buffer::from_slice(&q, &[t as i64, LATENT as i64], &kv)?;
        let pe_b = Buffer::from_slice(&q, &[t as i64, ROPE as i64], &pe)?;
        let sl_b = Buffer::from_slice(&q, &[t as i64], &slots)?;
        let cache = Buffer::from_bytes(
            &q,
            DType::Fp8DsMla,
            &[nb, bs, ROW_BYTES as i64],
            &vec![0xffu8; (nb * bs) as usize * ROW_BYTES],
        )?;
        let a = ConcatAndCacheMlaArgs {
            kv_c: kv_b.view(),
            k_pe: pe_b.view(),
            cache: cache.view(),
            slot_mapping: sl_b.view(),
        };
        CudaQueue::of(&q, OP)?.run(OP, &plan(&a)?)?;
        let got = q.read_bytes(&cache.view())?;
        let mut bad = [0usize; 3];
        for (tok, &s) in slots.iter().enumerate() {
            let mut lat = [0f32; LATENT];
            let mut rope = [0f32; ROPE];
            for i in 0..LATENT {
                lat[i] = kv[tok * LATENT + i].to_f32();
            }
            for i in 0..ROPE {
                rope[i] = pe[tok * ROPE + i].to_f32();
            }
            let mut want = [0u8; ROW_BYTES];
            encode_row(&lat, &rope, &mut want);
            let row = &got[s as usize * ROW_BYTES..(s as usize + 1) * ROW_BYTES];
            for i in 0..ROW_BYTES {
                if row[i] != want[i] {
                    let region = if i < SCALE_OFFSET {
                        0
                    } else if i < ROPE_OFFSET {
                        1
                    } else {
                        2
                    };
                    if bad[region] < 4 {
                        println!("token {tok} byte {i}: gpu {:#04x} host {:#04x}", row[i], want[i]);
                    }
                    bad[region] += 1;
                }
            }
        }
        println!("mismatched bytes: latent {}, scales {}, rope {}", bad[0], bad[1], bad[2]);
        assert_eq!(bad, [0, 0, 0]);
        Ok(())
    }
}
