//! ConcatAndCacheMla: kernels-hip/concat_and_cache_mla.hip, one block per token; an
//! fp8_ds_mla cache gets its rows encoded (`concat_and_cache_mla_fp8_{kv dtype}`).

use vt_core::{ConcatAndCacheMlaArgs, DType, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};

pub(crate) fn plan(a: &ConcatAndCacheMlaArgs<'_>) -> Result<Vec<Step>> {
    let (t, l, r) = (a.kv_c.dim(0), a.kv_c.dim(1), a.k_pe.dim(1));
    let c = &a.cache;
    if c.dtype() == DType::Fp8DsMla {
        // Validation fixed L = 512, R = 64; the cache's strides are in bytes.
        let args = KernelArgs::new()
            .tensor(c)
            .i64s(&[c.stride(0), c.stride(1), c.dim(0), c.dim(1)])
            .tensor(&a.kv_c)
            .i64(a.kv_c.stride(0))
            .tensor(&a.k_pe)
            .i64(a.k_pe.stride(0))
            .tensor(&a.slot_mapping)
            .i64s(&[a.slot_mapping.stride(0), t]);
        let launch =
            Launch::new("concat_and_cache_mla_fp8", "concat_and_cache_mla.hip", a.kv_c.dtype(), t, args)?;
        return Ok(kernels([launch]));
    }
    let args = KernelArgs::new()
        .tensor(c)
        .i64s(&[c.stride(0), c.stride(1), c.dim(0), c.dim(1)])
        .tensor(&a.kv_c)
        .i64(a.kv_c.stride(0))
        .tensor(&a.k_pe)
        .i64(a.k_pe.stride(0))
        .tensor(&a.slot_mapping)
        .i64s(&[a.slot_mapping.stride(0), t, l, r]);
    Ok(kernels([Launch::new("concat_and_cache_mla", "concat_and_cache_mla.hip", c.dtype(), t, args)?]))
}

pub(crate) fn run(q: &Queue, a: &ConcatAndCacheMlaArgs<'_>) -> Result<()> {
    HipQueue::of(OpId::ConcatAndCacheMla, q)?.run(&plan(a)?)
}

#[cfg(test)]
mod tests {
    use vt_core::{ConcatAndCacheMlaArgs, DType};

    use crate::launch::{Arg, Step};
    use crate::selfcheck::Fake;

    /// An fp8_ds_mla cache is written by the fp8 kernel of the kv dtype, one block per
    /// token, with the cache's strides in bytes.
    #[test]
    fn an_fp8_cache_is_written_by_the_fp8_kernel_of_the_kv_dtype() {
        let mut f = Fake::new();
        for (dt, name) in [(DType::BF16, "bf16"), (DType::F16, "f16"), (DType::F32, "f32")] {
            let a = ConcatAndCacheMlaArgs {
                kv_c: f.t(dt, &[5, 512], &[576, 1]).unwrap(),
                k_pe: f.t(dt, &[5, 64], &[576, 1]).unwrap(),
                cache: f.c(DType::Fp8DsMla, &[4, 64, 656]).unwrap(),
                slot_mapping: f.c(DType::I64, &[5]).unwrap(),
            };
            let steps = super::plan(&a).unwrap();
            let [Step::Kernel(l)] = &steps[..] else { panic!("{steps:?}") };
            assert_eq!(l.kernel, format!("concat_and_cache_mla_fp8_{name}"));
            assert_eq!(l.grid, 5);
            assert_eq!(l.args.0.len(), 12);
            assert_eq!(&l.args.0[1..5], &[Arg::I64(64 * 656), Arg::I64(656), Arg::I64(4), Arg::I64(64)]);
        }
    }
}
