//! SparseMlaAttention: kernels-hip/sparse_mla_attention.hip, one block per query row
//! (token, head; any head count, dims, strides, block size), an online softmax over the
//! listed slots in tiles (negative and past-the-cache entries skipped on the device); over
//! an fp8_ds_mla cache the same kernel dequantizes keys and values on load
//! (`sparse_mla_attention_fp8_{query dtype}`). The generic kernel of the CUDA backend, not
//! its decode-kernel fast path.

use vt_core::{DType, Error, OpId, Queue, Result, SparseMlaAttentionArgs};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};
use crate::mla_decode_attention::attention_shared_bytes;

const OP: OpId = OpId::SparseMlaAttention;

pub(crate) fn plan(a: &SparseMlaAttentionArgs<'_>) -> Result<Vec<Step>> {
    let (t, n, d) = (a.query.dim(0), a.query.dim(1), a.query.dim(2));
    let dv = a.out.dim(2);
    let rows = t.checked_mul(n).ok_or_else(|| Error::invalid(OP, "query", "T x N overflows"))?;
    let (c, q, o, idx) = (&a.cache, &a.query, &a.out, &a.indices);
    let slots =
        c.dim(0).checked_mul(c.dim(1)).ok_or_else(|| Error::invalid(OP, "cache", "NB x BS overflows"))?;
    let shared = attention_shared_bytes(OP, "query", d, dv)?;
    let (lse_s0, lse_s1) = a.lse.map_or((0, 0), |l| (l.stride(0), l.stride(1)));
    let args = KernelArgs::new()
        .tensor(o)
        .i64s(&[o.stride(0), o.stride(1)])
        .opt_tensor(a.lse.as_ref())
        .i64s(&[lse_s0, lse_s1])
        .tensor(q)
        .i64s(&[q.stride(0), q.stride(1)])
        .tensor(c)
        .i64s(&[c.stride(0), c.stride(1), c.dim(1), slots])
        .tensor(idx)
        .i64s(&[idx.stride(0), idx.stride(1), t, n, d, dv, idx.dim(1)])
        .f32(a.scale);
    // An fp8_ds_mla cache's strides are in bytes; its rows decode to D = 576 values.
    let kernel =
        if c.dtype() == DType::Fp8DsMla { "sparse_mla_attention_fp8" } else { "sparse_mla_attention" };
    let launch = Launch::new(kernel, "sparse_mla_attention.hip", q.dtype(), rows, args)?;
    Ok(kernels([launch.map(|l| l.with_shared_bytes(shared))]))
}

pub(crate) fn run(q: &Queue, a: &SparseMlaAttentionArgs<'_>) -> Result<()> {
    HipQueue::of(OP, q)?.run(&plan(a)?)
}

#[cfg(test)]
mod tests {
    use vt_core::{DType, Error, OpId, SparseMlaAttentionArgs, Subject};

    use crate::launch::{Arg, Step};
    use crate::selfcheck::Fake;

    fn args(
        f: &mut Fake,
        cache_dt: DType,
        dt: DType,
        t: i64,
        n: i64,
        d: i64,
    ) -> SparseMlaAttentionArgs<'static> {
        let w = if cache_dt == DType::Fp8DsMla { 656 } else { d };
        SparseMlaAttentionArgs {
            out: f.c(dt, &[t, n, 512]).unwrap(),
            lse: Some(f.t(DType::F32, &[n, t], &[1, n]).unwrap()),
            query: f.c(dt, &[t, n, d]).unwrap(),
            cache: f.t(cache_dt, &[8, 64, w], &[2 * 64 * w, w, 1]).unwrap(),
            indices: f.c(DType::I32, &[t, 2048]).unwrap(),
            scale: 0.1,
        }
    }

    /// One block per (token, head); the cache's slot count NB x BS, its strides (bytes for
    /// fp8_ds_mla), lse stored [T, N] passed as its transposed [N, T] view.
    #[test]
    fn sparse_attention_is_one_block_per_query_row_over_either_cache() {
        let mut f = Fake::new();
        for (cache_dt, dt, kernel) in [
            (DType::BF16, DType::BF16, "sparse_mla_attention_bf16"),
            (DType::F32, DType::F32, "sparse_mla_attention_f32"),
            (DType::Fp8DsMla, DType::BF16, "sparse_mla_attention_fp8_bf16"),
            (DType::Fp8DsMla, DType::F16, "sparse_mla_attention_fp8_f16"),
        ] {
            let a = args(&mut f, cache_dt, dt, 3, 16, 576);
            let steps = super::plan(&a).unwrap();
            let [Step::Kernel(l)] = &steps[..] else { panic!("{steps:?}") };
            assert_eq!(l.kernel, kernel);
            assert_eq!(l.grid, 3 * 16);
            assert_eq!(l.shared_bytes, (576 + 512 + 128) * 4);
            assert_eq!(l.args.0.len(), 23);
            assert_eq!(&l.args.0[4..6], &[Arg::I64(1), Arg::I64(16)], "lse [N, T] strides");
            let w = if cache_dt == DType::Fp8DsMla { 656 } else { 576 };
            assert_eq!(&l.args.0[10..14], &[Arg::I64(2 * 64 * w), Arg::I64(w), Arg::I64(64), Arg::I64(512)]);
            assert_eq!(
                &l.args.0[15..22],
                &[
                    Arg::I64(2048),
                    Arg::I64(1),
                    Arg::I64(3),
                    Arg::I64(16),
                    Arg::I64(576),
                    Arg::I64(512),
                    Arg::I64(2048)
                ]
            );
        }
    }

    #[test]
    fn sparse_attention_without_lse_passes_a_null_pointer_and_no_tokens_launch_nothing() {
        let mut f = Fake::new();
        let mut a = args(&mut f, DType::BF16, DType::BF16, 2, 4, 576);
        a.lse = None;
        let steps = super::plan(&a).unwrap();
        let [Step::Kernel(l)] = &steps[..] else { panic!("{steps:?}") };
        assert_eq!(l.args.0[3], Arg::Ptr(0));
        assert!(super::plan(&args(&mut f, DType::BF16, DType::BF16, 0, 4, 576)).unwrap().is_empty());
    }

    #[test]
    fn sparse_attention_with_head_dims_past_shared_memory_is_an_error_naming_query() {
        let mut f = Fake::new();
        let e = super::plan(&args(&mut f, DType::F32, DType::F32, 1, 1, 16_000)).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::InvalidArgument { op: Subject::Op(OpId::SparseMlaAttention), arg: "query", .. }
            ),
            "{e}"
        );
    }
}
