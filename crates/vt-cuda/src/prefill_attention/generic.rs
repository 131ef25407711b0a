//! PrefillAttention: a tiled online-softmax kernel with f32 accumulation
//! (`kernels-cuda/prefill_attention.cu`). Grid (query tiles of `max_seqlen_q`, heads,
//! sequences): sizes come from the arguments, never from lengths read back.

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use vt_core::{Error, PrefillAttentionArgs, Queue, Result};

use crate::device::{drv, BACKEND};
use crate::rope_from_cache::int;
use crate::{cfg, kernel_source, optional_lse, view_args, Arg, CudaQueue, KernelSource};

static SRC: KernelSource = kernel_source!("prefill_attention");

/// `PF_BQ`, `PF_BK` and `PF_THREADS` of the kernel file.
const BQ: i64 = 16;
const BK: i64 = 16;
const THREADS: u32 = 128;

/// Dynamic shared memory of one block, laid out as the kernel file describes.
fn smem_bytes(d: i64, dv: i64) -> i64 {
    4 * (BQ * d + BK * d + BK * dv + BQ * dv + BQ * BK + 3 * BQ)
}

pub(crate) fn run(q: &Queue, a: &PrefillAttentionArgs<'_>) -> Result<()> {
    const OP: &str = "PrefillAttention";
    let cq = CudaQueue::of(q, OP)?;
    let (n, d, dv) = (a.q.dim(1), a.q.dim(2), a.v.dim(2));
    let b = a.cu_seqlens_q.dim(0) - 1;
    if b <= 0 || n == 0 || a.max_seqlen_q == 0 || a.q.dim(0) == 0 {
        return Ok(());
    }
    let tiles = (a.max_seqlen_q + BQ - 1) / BQ;
    if tiles > u32::MAX as i64 / 2 || n > 65535 || b > 65535 {
        return Err(Error::invalid(
            OP,
            "q",
            format!("grid of {tiles} query tiles x {n} heads x {b} sequences exceeds CUDA's limits"),
        ));
    }
    let smem = smem_bytes(d, dv);
    let f = cq.function(&SRC, "prefill_attention", a.q.dtype())?;
    if smem > 48 * 1024 {
        let max = cq
            .device
            .ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(drv("shared memory limit"))? as i64;
        if smem > max {
            return Err(Error::backend(
                BACKEND,
                format!(
                    "{OP}: head dims D={d}, Dv={dv} need {smem} bytes of shared memory, the device has {max}"
                ),
            ));
        }
        // Not a stream operation: allowed between launches and during graph capture.
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            .map_err(drv("raising the shared memory limit"))?;
    }
    let views =
        [view_args(&a.out), optional_lse(a.lse.as_ref()), view_args(&a.q), view_args(&a.k), view_args(&a.v)];
    let mut args: Vec<Arg> = views.concat();
    args.extend::<[Arg; 10]>([
        a.cu_seqlens_q.data_addr().into(),
        a.cu_seqlens_q.stride(0).into(),
        a.cu_seqlens_k.data_addr().into(),
        a.cu_seqlens_k.stride(0).into(),
        a.q.dim(0).into(),
        a.k.dim(0).into(),
        int(OP, "q", d)?.into(),
        int(OP, "v", dv)?.into(),
        a.scale.into(),
        (a.causal as i32).into(),
    ]);
    let grid = (tiles as u32, n as u32, b as u32);
    // SAFETY: the arguments follow `prefill_attention_*`'s parameters; vt-core validated the
    // views; the kernel checks each sequence's bounds against Tq / Tk before touching rows.
    unsafe { cq.launch(OP, &f, cfg(grid, THREADS, smem as u32), &args) }
}
