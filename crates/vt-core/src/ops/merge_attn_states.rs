use crate::registry::dispatch;
use crate::validate::Check;
use crate::{DType, OpId, Queue, Result, Tensor};

/// Arguments of [`merge_attn_states`].
#[derive(Clone, Copy, Debug)]
pub struct MergeAttnStatesArgs<'a> {
    pub out: Tensor<'a>,
    pub out_lse: Option<Tensor<'a>>,
    pub prefix: Tensor<'a>,
    pub prefix_lse: Tensor<'a>,
    pub suffix: Tensor<'a>,
    pub suffix_lse: Tensor<'a>,
}

/// Merges two partial attention results over disjoint key sets by their lse:
/// `m = max(lp, ls)`, `wp = exp(lp - m)`, `ws = exp(ls - m)`,
/// `out = (wp * prefix + ws * suffix) / (wp + ws)`, `out_lse = m + ln(wp + ws)`.
///
/// - `prefix`, `suffix`, `out` `[T,N,V]`; one float dtype; stride 1 on V.
/// - `prefix_lse`, `suffix_lse`, `out_lse` (optional) `[N,T]` f32.
/// - Empty sides: an lse of -inf (or +inf, which upstream also treats as empty) means
///   "no keys": that side gets weight 0; both empty gives `out = 0`, `out_lse = -inf`.
/// - Outputs must not overlap each other or any input.
pub fn merge_attn_states(q: &Queue, args: &MergeAttnStatesArgs<'_>) -> Result<()> {
    validate(q, args)?;
    dispatch!(q, MergeAttnStates, args)
}

fn validate(queue: &Queue, a: &MergeAttnStatesArgs<'_>) -> Result<()> {
    let c = Check::new(OpId::MergeAttnStates, queue.device());
    c.float("out", &a.out, 3)?;
    c.float("prefix", &a.prefix, 3)?;
    c.float("suffix", &a.suffix, 3)?;
    let dt = a.out.dtype();
    c.same_dtype("prefix", &a.prefix, dt)?;
    c.same_dtype("suffix", &a.suffix, dt)?;
    let (t, n, v) = (a.out.dim(0), a.out.dim(1), a.out.dim(2));
    for (name, x) in [("prefix", &a.prefix), ("suffix", &a.suffix)] {
        c.dim(name, x, 0, t, "out's T")?;
        c.dim(name, x, 1, n, "out's N")?;
        c.dim(name, x, 2, v, "out's V")?;
    }
    for (name, x) in [("out", &a.out), ("prefix", &a.prefix), ("suffix", &a.suffix)] {
        c.unit_inner(name, x)?;
    }
    for (name, x) in [("prefix_lse", &a.prefix_lse), ("suffix_lse", &a.suffix_lse)] {
        c.typed(name, x, 2, DType::F32)?;
        c.dim(name, x, 0, n, "out's N")?;
        c.dim(name, x, 1, t, "out's T")?;
    }
    c.output("out", &a.out)?;
    let inputs = [
        ("prefix", &a.prefix),
        ("prefix_lse", &a.prefix_lse),
        ("suffix", &a.suffix),
        ("suffix_lse", &a.suffix_lse),
    ];
    for (name, x) in inputs {
        c.disjoint("out", &a.out, name, x)?;
    }
    if let Some(l) = &a.out_lse {
        c.typed("out_lse", l, 2, DType::F32)?;
        c.dim("out_lse", l, 0, n, "out's N")?;
        c.dim("out_lse", l, 1, t, "out's T")?;
        c.output("out_lse", l)?;
        c.disjoint("out_lse", l, "out", &a.out)?;
        for (name, x) in inputs {
            c.disjoint("out_lse", l, name, x)?;
        }
    }
    Ok(())
}
