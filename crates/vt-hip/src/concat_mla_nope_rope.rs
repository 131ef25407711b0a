//! ConcatMlaNopeRope: kernels-hip/concat_mla_nope_rope.hip, one block per (token, head);
//! a one-head rope is broadcast by giving the kernel a head stride of 0.

use vt_core::{ConcatMlaNopeRopeArgs, OpId, Queue, Result};

use crate::backend::HipQueue;
use crate::launch::{kernels, KernelArgs, Launch, Step};

pub(crate) fn plan(a: &ConcatMlaNopeRopeArgs<'_>) -> Result<Vec<Step>> {
    let (t, n, p, r) = (a.nope.dim(0), a.nope.dim(1), a.nope.dim(2), a.rope.dim(2));
    let rope_head_stride = if a.rope.dim(1) == 1 { 0 } else { a.rope.stride(1) };
    let args = KernelArgs::new()
        .tensor(&a.out)
        .i64s(&[a.out.stride(0), a.out.stride(1)])
        .tensor(&a.nope)
        .i64s(&[a.nope.stride(0), a.nope.stride(1)])
        .tensor(&a.rope)
        .i64s(&[a.rope.stride(0), rope_head_stride, t, n, p, r]);
    Ok(kernels([Launch::new(
        "concat_mla_nope_rope",
        "concat_mla_nope_rope.hip",
        a.out.dtype(),
        t * n,
        args,
    )?]))
}

pub(crate) fn run(q: &Queue, a: &ConcatMlaNopeRopeArgs<'_>) -> Result<()> {
    HipQueue::of(OpId::ConcatMlaNopeRope, q)?.run(&plan(a)?)
}

#[cfg(test)]
mod tests {
    use vt_core::{ConcatMlaNopeRopeArgs, DType};

    use crate::launch::{Arg, Step};
    use crate::selfcheck::Fake;

    #[test]
    fn a_one_head_rope_is_broadcast_with_head_stride_0() {
        let mut f = Fake::new();
        for (rope_heads, want) in [(1, 0), (4, 64)] {
            let args = ConcatMlaNopeRopeArgs {
                out: f.c(DType::F16, &[3, 4, 192]).unwrap(),
                nope: f.c(DType::F16, &[3, 4, 128]).unwrap(),
                rope: f.c(DType::F16, &[3, rope_heads, 64]).unwrap(),
            };
            let steps = super::plan(&args).unwrap();
            let [Step::Kernel(l)] = &steps[..] else { panic!("{steps:?}") };
            // out, 2 strides, nope, 2 strides, rope, token stride, then the head stride.
            assert_eq!(l.args.0[8], Arg::I64(want), "rope with {rope_heads} head(s)");
            assert_eq!(l.grid, 12);
        }
    }
}
