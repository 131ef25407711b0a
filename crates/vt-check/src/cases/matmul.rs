//! MatmulBT and BatchedMatmul.

use crate::case::{strides_of, Builder, Cases, Exec, Ty, View};

/// `out[M,N] = a[M,K] . b[N,K]^T` with every operand a row-strided view: `a` is columns
/// `a_off..a_off+K` of rows `a_ld` wide, `b` is rows `b_row0..b_row0+N` of a weight
/// with rows `b_ld` wide, `out` is columns `out_off..` of rows `out_ld` wide.
struct MatmulBT {
    m: i64,
    n: i64,
    k: i64,
    a: (i64, i64),
    b: (i64, i64, i64),
    out: (i64, i64),
}

impl MatmulBT {
    fn contiguous(m: i64, n: i64, k: i64) -> MatmulBT {
        MatmulBT { m, n, k, a: (k, 0), b: (k, 0, 0), out: (n, 0) }
    }

    fn build(self, bld: &mut Builder) -> Exec {
        let MatmulBT { m, n, k, a: (a_ld, a_off), b: (b_ld, b_off, b_row0), out: (o_ld, o_off) } = self;
        let a = bld.uniform("a", &[m, a_ld], -1.0, 1.0).sub(a_off, &[m, k], &[a_ld, 1]);
        let b = bld.uniform("b", &[b_row0 + n + 1, b_ld], -1.0, 1.0).sub(
            b_row0 * b_ld + b_off,
            &[n, k],
            &[b_ld, 1],
        );
        let out = bld.poison("out", Ty::Float, &[m, o_ld]).sub(o_off, &[m, n], &[o_ld, 1]);
        bld.output("out", &out);
        Box::new(move |q, bufs| {
            vt_core::matmul_bt(
                q,
                &vt_core::MatmulBTArgs { out: out.tensor(bufs)?, a: a.tensor(bufs)?, b: b.tensor(bufs)? },
            )
        })
    }
}

pub(super) fn matmul_bt(c: &mut Cases) {
    c.add("contiguous M 7, N 13, K 32", |b| MatmulBT::contiguous(7, 13, 32).build(b));
    c.add(
        "row-strided: a = cols 40..104 of rows of 104, b = rows 16..40 of a weight (row stride 72), \
         out = cols 3..27 of rows of 30",
        |b| MatmulBT { m: 5, n: 24, k: 64, a: (104, 40), b: (72, 4, 16), out: (30, 3) }.build(b),
    );
    c.add("decode row: M 1, N 576, K 512", |b| MatmulBT::contiguous(1, 576, 512).build(b));
    c.add("odd sizes M 33, N 70, K 200, a row stride 203", |b| {
        MatmulBT { m: 33, n: 70, k: 200, a: (203, 1), b: (200, 0, 0), out: (70, 0) }.build(b)
    });
    c.add("K 0 (out = 0)", |b| MatmulBT::contiguous(3, 5, 0).build(b));
    c.add("M 0 (nothing to write)", |b| MatmulBT::contiguous(0, 4, 8).build(b));
}

/// A `[d0, d1, d2]` operand stored as a contiguous buffer whose dims are the logical dims
/// in `order` (storage dim i = logical dim `order[i]`), the innermost storage dim `pad`
/// elements wider; the view starts `pad / 2` elements in. `order = [0, 1, 2]` and
/// `pad = 0` is plain contiguous.
fn stored(b: &mut Builder, name: &str, logical: [i64; 3], order: [usize; 3], pad: i64, output: bool) -> View {
    let storage = [logical[order[0]], logical[order[1]], logical[order[2]] + pad];
    let sst = strides_of(&storage);
    let mut strides = [0i64; 3];
    for i in 0..3 {
        strides[order[i]] = sst[i];
    }
    let whole =
        if output { b.poison(name, Ty::Float, &storage) } else { b.uniform(name, &storage, -1.0, 1.0) };
    let v = whole.sub(pad / 2, &logical, &strides);
    if output {
        b.output(name, &v);
    }
    v
}

fn bmm(a: View, b: View, out: View) -> Exec {
    Box::new(move |q, bufs| {
        vt_core::batched_matmul(
            q,
            &vt_core::BatchedMatmulArgs { out: out.tensor(bufs)?, a: a.tensor(bufs)?, b: b.tensor(bufs)? },
        )
    })
}

const PLAIN: [usize; 3] = [0, 1, 2];

pub(super) fn batched_matmul(c: &mut Cases) {
    c.add("contiguous G 3, M 5, K 16, N 7", |b| {
        let (g, m, k, n) = (3, 5, 16, 7);
        let a = stored(b, "a", [g, m, k], PLAIN, 0, false);
        let bb = stored(b, "b", [g, k, n], PLAIN, 0, false);
        bmm(a, bb, stored(b, "out", [g, m, n], PLAIN, 0, true))
    });
    c.add(
        "absorbed q: q_nope [N 8, B 2, P 128] = view of q [B, N, P+R 192] (transposed a), \
         W_UK [N, P, L 512], out [N, B, L] = view of [B, N, L]",
        |b| {
            let (g, m, k, n) = (8, 2, 128, 512);
            let a = stored(b, "q", [g, m, k], [1, 0, 2], 64, false);
            let w = stored(b, "w_uk", [g, k, n], PLAIN, 0, false);
            bmm(a, w, stored(b, "out", [g, m, n], [1, 0, 2], 0, true))
        },
    );
    c.add("transposed b (column-major [K, N] per group): G 4, M 6, K 24, N 10", |b| {
        let (g, m, k, n) = (4, 6, 24, 10);
        let a = stored(b, "a", [g, m, k], PLAIN, 0, false);
        let bb = stored(b, "b", [g, k, n], [0, 2, 1], 0, false);
        bmm(a, bb, stored(b, "out", [g, m, n], PLAIN, 0, true))
    });
    c.add("no unit stride in the last two dims of a, b or out (G innermost): G 3, M 5, K 12, N 6", |b| {
        let (g, m, k, n) = (3, 5, 12, 6);
        let a = stored(b, "a", [g, m, k], [2, 1, 0], 0, false);
        let bb = stored(b, "b", [g, k, n], [1, 2, 0], 0, false);
        bmm(a, bb, stored(b, "out", [g, m, n], [1, 2, 0], 0, true))
    });
    c.add(
        "absorbed v: attn [N 8, B 2, L 512] = view of [B, N, L], W_UV [N, L, V 128] = \
         transposed slice of kv_b_proj [N, P+V, L], out [N, B, V] = view of [B, N, V]",
        |b| {
            let (g, m, k, n, p) = (8, 2, 512, 128, 32);
            let a = stored(b, "attn", [g, m, k], [1, 0, 2], 0, false);
            let w = b.uniform("kv_b_proj", &[g, p + n, k], -1.0, 1.0).sub(
                p * k,
                &[g, k, n],
                &[(p + n) * k, 1, k],
            );
            bmm(a, w, stored(b, "out", [g, m, n], [1, 0, 2], 0, true))
        },
    );
    c.add("G 1, M 1 (one row)", |b| {
        let (g, m, k, n) = (1, 1, 40, 9);
        let a = stored(b, "a", [g, m, k], PLAIN, 0, false);
        let bb = stored(b, "b", [g, k, n], PLAIN, 0, false);
        bmm(a, bb, stored(b, "out", [g, m, n], PLAIN, 0, true))
    });
}
