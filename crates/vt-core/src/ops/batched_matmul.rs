use crate::registry::dispatch;
use crate::validate::Check;
use crate::{OpId, Queue, Result, Tensor};

/// Arguments of [`batched_matmul`].
#[derive(Clone, Copy, Debug)]
pub struct BatchedMatmulArgs<'a> {
    pub out: Tensor<'a>,
    pub a: Tensor<'a>,
    pub b: Tensor<'a>,
}

/// `out[g] = a[g] . b[g]` for `a` `[G,M,K]`, `b` `[G,K,N]`, `out` `[G,M,N]`.
///
/// Any strides on every dim of every operand (the MLA block feeds transposed views such
/// as q_nope as `[N,B,P]` with strides [P+R, N*(P+R), 1]); one float dtype. Backends that
/// call a BLAS pick the transpose flags from the strides and fall back to their own
/// kernel when neither of a matrix's last two strides is 1. `out` must not overlap
/// itself, `a` or `b`.
pub fn batched_matmul(q: &Queue, args: &BatchedMatmulArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, BatchedMatmul, args)
}

fn validate(q: &Queue, x: &BatchedMatmulArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::BatchedMatmul, q.device());
    c.float("out", &x.out, 3)?;
    c.float("a", &x.a, 3)?;
    c.float("b", &x.b, 3)?;
    let dt = x.out.dtype();
    c.same_dtype("a", &x.a, dt)?;
    c.same_dtype("b", &x.b, dt)?;
    let (g, m, k, n) = (x.a.dim(0), x.a.dim(1), x.a.dim(2), x.b.dim(2));
    c.dim("b", &x.b, 0, g, "a's G")?;
    c.dim("b", &x.b, 1, k, "a's K")?;
    c.dim("out", &x.out, 0, g, "a's G")?;
    c.dim("out", &x.out, 1, m, "a's M")?;
    c.dim("out", &x.out, 2, n, "b's N")?;
    c.output("out", &x.out)?;
    c.disjoint("out", &x.out, "a", &x.a)?;
    c.disjoint("out", &x.out, "b", &x.b)
}
