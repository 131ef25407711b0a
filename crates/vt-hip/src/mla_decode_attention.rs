//! MlaDecodeAttention: kernels-hip/mla_decode_attention.hip, one block per query row
//! (any head count, any block size including 1), online softmax over key tiles; over an
//! fp8_ds_mla cache the same kernel dequantizes keys and values on load
//! (`mla_decode_attention_fp8_{query dtype}`).

use vt_core::{DType, Error, MlaDecodeAttentionArgs, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step, KEY_TILE, MAX_SHARED_BYTES};

const OP: OpId = OpId::MlaDecodeAttention;

/// Dynamic shared memory of the attention kernels (`VT_ATTN_SMEM_FLOATS` in attention.h),
/// or an error naming `arg` when the head dims do not fit in one block's shared memory.
pub(crate) fn attention_shared_bytes(op: OpId, arg: &'static str, d: i64, dv: i64) -> Result<u32> {
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
    let (b, sq, n, d) = (a.query.dim(0), a.query.dim(1), a.query.dim(2), a.query.dim(3));
    let dv = a.out.dim(3);
    let shared = attention_shared_bytes(OP, "query", d, dv)?;
    let (o, q, c, bt) = (&a.out, &a.query, &a.cache, &a.block_table);
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
    // An fp8_ds_mla cache's strides are in bytes; its rows decode to D = 576 values.
    let kernel =
        if c.dtype() == DType::Fp8DsMla { "mla_decode_attention_fp8" } else { "mla_decode_attention" };
    let launch = Launch::new(kernel, "mla_decode_attention.hip", q.dtype(), b * sq * n, args)?;
    Ok(kernels([launch.map(|l| l.with_shared_bytes(shared))]))
}

pub(crate) fn run(q: &Queue, a: &MlaDecodeAttentionArgs<'_>) -> Result<()> {
    HipQueue::of(OP, q)?.run(&plan(a)?)
}

#[cfg(test)]
mod tests {
    use vt_core::{DType, Error, MlaDecodeAttentionArgs, OpId, Subject};

    use crate::launch::Step;
    use crate::selfcheck::Fake;

    fn args(f: &mut Fake, b: i64, n: i64, d: i64, dv: i64) -> MlaDecodeAttentionArgs<'static> {
        MlaDecodeAttentionArgs {
            out: f.c(DType::BF16, &[b, 1, n, dv]).unwrap(),
            lse: None,
            query: f.c(DType::BF16, &[b, 1, n, d]).unwrap(),
            cache: f.c(DType::BF16, &[64, 1, d]).unwrap(),
            block_table: f.c(DType::I32, &[b, 64]).unwrap(),
            seq_lens: f.c(DType::I32, &[b]).unwrap(),
            scale: 0.1,
        }
    }

    #[test]
    fn decode_attention_with_page_size_1_and_two_heads_is_one_block_per_query_row() {
        let mut f = Fake::new();
        let steps = super::plan(&args(&mut f, 3, 2, 576, 512)).unwrap();
        let [Step::Kernel(l)] = &steps[..] else { panic!("{steps:?}") };
        assert_eq!(l.kernel, "mla_decode_attention_bf16");
        assert_eq!(l.grid, 3 * 2);
        assert_eq!(l.shared_bytes, (576 + 512 + 128) * 4);
    }

    /// An fp8_ds_mla cache (656-byte rows, byte strides) runs the fp8 kernel of the query's
    /// dtype with the decoded D = 576 in shared memory.
    #[test]
    fn decode_attention_over_an_fp8_cache_launches_the_fp8_kernel_of_the_query_dtype() {
        let mut f = Fake::new();
        for (dt, name) in [(DType::BF16, "bf16"), (DType::F16, "f16"), (DType::F32, "f32")] {
            let a = MlaDecodeAttentionArgs {
                out: f.c(dt, &[3, 1, 2, 512]).unwrap(),
                lse: None,
                query: f.c(dt, &[3, 1, 2, 576]).unwrap(),
                cache: f.c(DType::Fp8DsMla, &[64, 16, 656]).unwrap(),
                block_table: f.c(DType::I32, &[3, 64]).unwrap(),
                seq_lens: f.c(DType::I32, &[3]).unwrap(),
                scale: 0.1,
            };
            let steps = super::plan(&a).unwrap();
            let [Step::Kernel(l)] = &steps[..] else { panic!("{steps:?}") };
            assert_eq!(l.kernel, format!("mla_decode_attention_fp8_{name}"));
            assert_eq!(l.grid, 3 * 2);
            assert_eq!(l.shared_bytes, (576 + 512 + 128) * 4);
        }
    }

    #[test]
    fn decode_attention_with_head_dims_past_shared_memory_is_an_error_naming_query() {
        let mut f = Fake::new();
        let e = super::plan(&args(&mut f, 1, 1, 16_000, 512)).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::InvalidArgument { op: Subject::Op(OpId::MlaDecodeAttention), arg: "query", .. }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("64 KiB"), "{e}");
    }

    #[test]
    fn empty_batches_launch_nothing_and_huge_ones_cap_the_grid() {
        let mut f = Fake::new();
        assert!(super::plan(&args(&mut f, 0, 16, 576, 512)).unwrap().is_empty());
        let steps = super::plan(&args(&mut f, 40_000, 16, 64, 32)).unwrap();
        let [Step::Kernel(l)] = &steps[..] else { panic!("{steps:?}") };
        assert_eq!(l.grid as i64, crate::launch::MAX_GRID);
    }
}
