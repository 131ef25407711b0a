use crate::registry::dispatch;
use crate::validate::Check;
use crate::{OpId, Queue, Result, Tensor};

/// Arguments of [`concat_mla_nope_rope`].
#[derive(Clone, Copy, Debug)]
pub struct ConcatMlaNopeRopeArgs<'a> {
    pub out: Tensor<'a>,
    pub nope: Tensor<'a>,
    pub rope: Tensor<'a>,
}

/// `out[t, n, :] = [nope[t, n, :] | rope[t, n or 0, :]]`.
///
/// - `nope` `[T,N,P]`, `rope` `[T,1,R]` (broadcast over the N heads: MLA's shared k_pe) or
///   `[T,N,R]`, `out` `[T,N,P+R]`; one float dtype; stride 1 on the last dim of each, any
///   other strides (the absorbed decode feeds a transposed `nope`).
/// - `out` must not overlap the inputs.
pub fn concat_mla_nope_rope(q: &Queue, args: &ConcatMlaNopeRopeArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, ConcatMlaNopeRope, args)
}

fn validate(q: &Queue, a: &ConcatMlaNopeRopeArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::ConcatMlaNopeRope, q.device());
    c.float("out", &a.out, 3)?;
    c.float("nope", &a.nope, 3)?;
    c.float("rope", &a.rope, 3)?;
    let dt = a.out.dtype();
    c.same_dtype("nope", &a.nope, dt)?;
    c.same_dtype("rope", &a.rope, dt)?;
    let (t, n, p, r) = (a.nope.dim(0), a.nope.dim(1), a.nope.dim(2), a.rope.dim(2));
    c.dim("rope", &a.rope, 0, t, "nope's T")?;
    if a.rope.dim(1) != 1 && a.rope.dim(1) != n {
        return Err(
            c.err("rope", format!("dim 1 is {}, expected 1 (broadcast) or nope's N = {n}", a.rope.dim(1)))
        );
    }
    c.dim("out", &a.out, 0, t, "nope's T")?;
    c.dim("out", &a.out, 1, n, "nope's N")?;
    c.dim("out", &a.out, 2, p + r, "nope's P + rope's R")?;
    for (name, x) in [("out", &a.out), ("nope", &a.nope), ("rope", &a.rope)] {
        c.unit_inner(name, x)?;
    }
    c.output("out", &a.out)?;
    c.disjoint("out", &a.out, "nope", &a.nope)?;
    c.disjoint("out", &a.out, "rope", &a.rope)
}
