//! GatherMlaCache: kernels-hip/gather_mla_cache.hip, one block per workspace row; an
//! fp8_ds_mla cache is dequantized into the workspace (`gather_mla_cache_fp8_{out dtype}`).

use vt_core::{DType, GatherMlaCacheArgs, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};

pub(crate) fn plan(a: &GatherMlaCacheArgs<'_>) -> Result<Vec<Step>> {
    let (c, bt) = (&a.cache, &a.block_table);
    let rows = a.out.dim(0);
    let fp8 = c.dtype() == DType::Fp8DsMla;
    let args = KernelArgs::new().tensor(&a.out).i64s(&[a.out.stride(0), rows]).tensor(c);
    // The fp8 kernel's row width is the decoded 576 (validation fixed it); strides in bytes.
    let args = if fp8 {
        args.i64s(&[c.stride(0), c.stride(1), c.dim(0), c.dim(1)])
    } else {
        args.i64s(&[c.stride(0), c.stride(1), c.dim(0), c.dim(1), c.dim(2)])
    };
    let args = args
        .tensor(bt)
        .i64s(&[bt.stride(0), bt.stride(1), bt.dim(1)])
        .tensor(&a.cu_seq_lens)
        .i64s(&[a.cu_seq_lens.stride(0), bt.dim(0)])
        .opt_tensor(a.seq_starts.as_ref())
        .i64(a.seq_starts.map_or(0, |s| s.stride(0)));
    let launch = if fp8 {
        Launch::new("gather_mla_cache_fp8", "gather_mla_cache.hip", a.out.dtype(), rows, args)?
    } else {
        Launch::new("gather_mla_cache", "gather_mla_cache.hip", c.dtype(), rows, args)?
    };
    Ok(kernels([launch]))
}

pub(crate) fn run(q: &Queue, a: &GatherMlaCacheArgs<'_>) -> Result<()> {
    HipQueue::of(OpId::GatherMlaCache, q)?.run(&plan(a)?)
}

#[cfg(test)]
mod tests {
    use vt_core::{DType, GatherMlaCacheArgs};

    use crate::launch::{Arg, Step};
    use crate::selfcheck::Fake;

    /// An fp8_ds_mla cache is gathered by the fp8 kernel of the workspace's dtype, which
    /// takes no row width (the decoded 576); a float cache keeps the float kernel.
    #[test]
    fn an_fp8_cache_is_gathered_by_the_fp8_kernel_of_the_workspace_dtype() {
        let mut f = Fake::new();
        for (cache_dt, out_dt, kernel, nargs) in [
            (DType::Fp8DsMla, DType::BF16, "gather_mla_cache_fp8_bf16", 17),
            (DType::Fp8DsMla, DType::F32, "gather_mla_cache_fp8_f32", 17),
            (DType::BF16, DType::BF16, "gather_mla_cache_bf16", 18),
        ] {
            let w = if cache_dt == DType::Fp8DsMla { 656 } else { 576 };
            let a = GatherMlaCacheArgs {
                out: f.c(out_dt, &[9, 576]).unwrap(),
                cache: f.c(cache_dt, &[8, 16, w]).unwrap(),
                block_table: f.c(DType::I32, &[2, 4]).unwrap(),
                cu_seq_lens: f.c(DType::I32, &[3]).unwrap(),
                seq_starts: None,
            };
            let steps = super::plan(&a).unwrap();
            let [Step::Kernel(l)] = &steps[..] else { panic!("{steps:?}") };
            assert_eq!(l.kernel, kernel);
            assert_eq!(l.grid, 9);
            assert_eq!(l.args.0.len(), nargs, "{kernel}");
            // The cache's strides: bytes for fp8 (656 a row), elements otherwise.
            assert_eq!(l.args.0[4], Arg::I64(16 * w), "{kernel}");
        }
    }
}
