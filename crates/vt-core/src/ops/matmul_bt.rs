use crate::registry::dispatch;
use crate::validate::Check;
use crate::{OpId, Queue, Result, Tensor};

/// Arguments of [`matmul_bt`].
#[derive(Clone, Copy, Debug)]
pub struct MatmulBTArgs<'a> {
    pub out: Tensor<'a>,
    pub a: Tensor<'a>,
    pub b: Tensor<'a>,
}

/// `out[M,N] = a[M,K] . b[N,K]^T` (a linear layer with torch's `[out, in]` weight).
///
/// - `a` `[M,K]`, `b` `[N,K]`, `out` `[M,N]`: one float dtype; the last dim of each has
///   stride 1, rows may be strided (a column slice of a wider buffer, a row slice of a
///   weight). K may be 0 (out = 0).
/// - `out` must not overlap `a` or `b`.
pub fn matmul_bt(q: &Queue, args: &MatmulBTArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, MatmulBT, args)
}

fn validate(q: &Queue, x: &MatmulBTArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::MatmulBT, q.device());
    c.float("out", &x.out, 2)?;
    c.float("a", &x.a, 2)?;
    c.float("b", &x.b, 2)?;
    let dt = x.out.dtype();
    c.same_dtype("a", &x.a, dt)?;
    c.same_dtype("b", &x.b, dt)?;
    let (m, k, n) = (x.a.dim(0), x.a.dim(1), x.b.dim(0));
    c.dim("b", &x.b, 1, k, "a's K")?;
    c.dim("out", &x.out, 0, m, "a's M")?;
    c.dim("out", &x.out, 1, n, "b's N")?;
    for (name, t) in [("out", &x.out), ("a", &x.a), ("b", &x.b)] {
        c.unit_inner(name, t)?;
    }
    c.output("out", &x.out)?;
    c.disjoint("out", &x.out, "a", &x.a)?;
    c.disjoint("out", &x.out, "b", &x.b)
}
