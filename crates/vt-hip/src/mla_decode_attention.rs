//! MlaDecodeAttention: kernels-hip/mla_decode_attention.hip, one block per query row
//! (any head count, any block size including 1), online softmax over key tiles.

use vt_core::{Error, MlaDecodeAttentionArgs, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step, KEY_TILE, MAX_SHARED_BYTES};

const OP: &str = "MlaDecodeAttention";

/// Dynamic shared memory of the attention kernels (`VT_ATTN_SMEM_FLOATS` in attention.h),
/// or an error naming `arg` when the head dims do not fit in one block's shared memory.
pub(crate) fn attention_shared_bytes(op: &'static str, arg: &'static str, d: i64, dv: i64) -> Result<u32> {
    let bytes = (d + dv + KEY_TILE) * 4;
    // Static shared memory of the kernels is a few bytes; keep a margin for it.
    if bytes > MAX_SHARED_BYTES - 256 {
        return Err(Error::invalid(
            op,
            arg,
            format!(
                "head dims D = {d}, Dv = {dv} need {bytes} bytes of shared memory; the HIP kernel has 64 KiB"
            ),
        ));
    }
    Ok(bytes as u32)
}

pub(crate) fn plan(a: &MlaDecodeAttentionArgs<'_>) -> Result<Vec<Step>> {
    let (b, sq, n, d) = (a.q.dim(0), a.q.dim(1), a.q.dim(2), a.q.dim(3));
    let dv = a.out.dim(3);
    let shared = attention_shared_bytes(OP, "q", d, dv)?;
    let (o, q, c, bt) = (&a.out, &a.q, &a.cache, &a.block_table);
    let lse_strides = a.lse.map_or([0, 0, 0], |l| [l.stride(0), l.stride(1), l.stride(2)]);
    let args = KernelArgs::new()
        .tensor(o)
        .i64s(&[o.stride(0), o.stride(1), o.stride(2)])
        .opt_tensor(a.lse.as_ref())
        .i64s(&lse_strides)
        .tensor(q)
        .i64s(&[q.stride(0), q.stride(1), q.stride(2)])
        .tensor(c)
        .i64s(&[c.stride(0), c.stride(1), c.dim(0), c.dim(1)])
        .tensor(bt)
        .i64s(&[bt.stride(0), bt.stride(1), bt.dim(1)])
        .tensor(&a.seq_lens)
        .i64s(&[a.seq_lens.stride(0), b, sq, n, d, dv])
        .f32(a.scale);
    let launch =
        Launch::new("mla_decode_attention", "mla_decode_attention.hip", q.dtype(), b * sq * n, args)?;
    Ok(kernels([launch.map(|l| l.with_shared_bytes(shared))]))
}

pub(crate) fn run(q: &Queue, a: &MlaDecodeAttentionArgs<'_>) -> Result<()> {
    HipQueue::of(OP, q)?.run(&plan(a)?)
}
