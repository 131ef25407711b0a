//! CacheIndexerKeys: kernels-hip/cache_indexer_keys.hip, one block per token copies its
//! indexer key row into its cache slot; padding and out-of-range slots are skipped on the
//! device, so only rows of slots inside 0..NB*BS are written.

use vt_core::{CacheIndexerKeysArgs, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};

const OP: OpId = OpId::CacheIndexerKeys;

pub(crate) fn plan(a: &CacheIndexerKeysArgs<'_>) -> Result<Vec<Step>> {
    let (t, di) = (a.k.dim(0), a.k.dim(1));
    let c = &a.cache;
    let args = KernelArgs::new()
        .tensor(c)
        .i64s(&[c.stride(0), c.stride(1), c.dim(0), c.dim(1)])
        .tensor(&a.k)
        .i64(a.k.stride(0))
        .tensor(&a.slot_mapping)
        .i64s(&[a.slot_mapping.stride(0), t, di]);
    // No row to write, or no cache row to write it to: nothing to launch.
    let tokens = if di == 0 || c.dim(0) == 0 || c.dim(1) == 0 { 0 } else { t };
    Ok(kernels([Launch::new("cache_indexer_keys", "cache_indexer_keys.hip", c.dtype(), tokens, args)?]))
}

pub(crate) fn run(q: &Queue, a: &CacheIndexerKeysArgs<'_>) -> Result<()> {
    HipQueue::of(OP, q)?.run(&plan(a)?)
}

#[cfg(test)]
mod tests {
    use vt_core::{CacheIndexerKeysArgs, DType};

    use crate::launch::{Arg, Step};
    use crate::selfcheck::Fake;

    /// One block per token, the cache's block and row strides and its NB, BS passed; a
    /// column slice of a wider projection keeps its row stride.
    #[test]
    fn indexer_keys_are_written_one_block_per_token() {
        let mut f = Fake::new();
        for (dt, name) in [(DType::BF16, "bf16"), (DType::F16, "f16"), (DType::F32, "f32")] {
            let a = CacheIndexerKeysArgs {
                k: f.t(dt, &[5, 128], &[640, 1]).unwrap(),
                cache: f.t(dt, &[4, 64, 128], &[2 * 64 * 128, 128, 1]).unwrap(),
                slot_mapping: f.c(DType::I64, &[5]).unwrap(),
            };
            let steps = super::plan(&a).unwrap();
            let [Step::Kernel(l)] = &steps[..] else { panic!("{steps:?}") };
            assert_eq!(l.kernel, format!("cache_indexer_keys_{name}"));
            assert_eq!(l.grid, 5);
            assert_eq!(l.args.0.len(), 11);
            assert_eq!(&l.args.0[1..5], &[Arg::I64(2 * 64 * 128), Arg::I64(128), Arg::I64(4), Arg::I64(64)]);
            assert_eq!(l.args.0[6], Arg::I64(640));
            assert_eq!(&l.args.0[9..], &[Arg::I64(5), Arg::I64(128)]);
        }
    }

    #[test]
    fn no_tokens_launch_nothing() {
        let mut f = Fake::new();
        let a = CacheIndexerKeysArgs {
            k: f.c(DType::BF16, &[0, 128]).unwrap(),
            cache: f.c(DType::BF16, &[4, 64, 128]).unwrap(),
            slot_mapping: f.c(DType::I64, &[0]).unwrap(),
        };
        assert!(super::plan(&a).unwrap().is_empty());
    }
}
