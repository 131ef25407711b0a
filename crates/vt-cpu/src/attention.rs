//! The softmax-weighted sum shared by MlaDecodeAttention and PrefillAttention.

use crate::gemm::dot;

/// Rows `0..count` of a row-major f32 matrix with `width` columns: keys or values.
pub(crate) struct Rows<'s> {
    pub data: &'s [f32],
    pub width: usize,
}

impl Rows<'_> {
    fn row(&self, j: usize, len: usize) -> &[f32] {
        &self.data[j * self.width..j * self.width + len]
    }
}

/// Attention of one query over keys/values `0..count`, all in f32:
/// `logit[j] = scale * (q . k[j])`, `out = softmax(logit) . v[j][..out.len()]`; returns
/// `lse = ln(sum(exp(logit)))`. With no keys, `out = 0` and `lse = -inf`. `logits` is
/// scratch of at least `count` entries.
pub(crate) fn attend(
    q: &[f32],
    keys: &Rows<'_>,
    values: &Rows<'_>,
    count: usize,
    scale: f32,
    logits: &mut [f32],
    out: &mut [f32],
) -> f32 {
    out.fill(0.0);
    if count == 0 {
        return f32::NEG_INFINITY;
    }
    let mut max = f32::NEG_INFINITY;
    for (j, l) in logits.iter_mut().enumerate().take(count) {
        *l = scale * dot(q, keys.row(j, q.len()));
        max = max.max(*l);
    }
    let dv = out.len();
    let mut sum = 0f32;
    for (j, &l) in logits.iter().enumerate().take(count) {
        let p = (l - max).exp();
        sum += p;
        for (o, &v) in out.iter_mut().zip(values.row(j, dv)) {
            *o += p * v;
        }
    }
    for o in out.iter_mut() {
        *o /= sum;
    }
    max + sum.ln()
}
