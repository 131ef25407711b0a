//! The softmax-weighted sum shared by the attention ops (MlaDecodeAttention,
//! PrefillAttention, SparseMlaAttention), and their loop over query rows.

use crate::gemm::dot;
use crate::par;

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

/// The attention ops' loop over `rows` (each one query row of one head): `one(r, q, logits,
/// out)` fills the row's `dv` outputs and returns its lse, with `q` (`d` values) and `logits`
/// (`keys` values) as scratch, on the machine's threads; then `store(r, out, lse)` runs for
/// every row in order on this thread (the ops' views are written from one thread only).
pub(crate) fn attend_rows(
    rows: usize,
    (d, dv, keys): (usize, usize, usize),
    one: impl Fn(usize, &mut [f32], &mut [f32], &mut [f32]) -> f32 + Sync,
    mut store: impl FnMut(usize, &[f32], f32),
) {
    let mut res = vec![0f32; rows * (dv + 1)];
    par::fill_rows(&mut res, dv + 1, keys.saturating_mul(d + dv), |r0, chunk| {
        let (mut q, mut logits) = (vec![0f32; d], vec![0f32; keys]);
        for (i, row) in chunk.chunks_exact_mut(dv + 1).enumerate() {
            let (o, l) = row.split_at_mut(dv);
            l[0] = one(r0 + i, &mut q, &mut logits, o);
        }
    });
    for (r, row) in res.chunks_exact(dv + 1).enumerate() {
        store(r, &row[..dv], row[dv]);
    }
}
