//! The block-scaled fp8 ops: MatmulBTFp8, BatchedMatmulFp8 and QuantizeFp8.
//!
//! Weights are random e4m3 codes over the whole range (values exact in e4m3, so the upload
//! rounds nothing) with one random f32 scale per 128 x 128 block, spread over 2^-10 .. 2^-4
//! so that a kernel reading the wrong block's scale is far off; some cases hold a zero
//! block (scale 0, as `quantize_weight` gives an all-zero block). Activations are the
//! dtype under test, or e4m3 codes with per-token 1 x 128 scales (the both-fp8 form).
//! Shapes mix the MLA block's (decode rows, absorbed per-head weights) with small odd ones:
//! N and K not multiples of 128 (partial blocks) or of 16 (the kernels' vector width),
//! tensor-parallel row and column slices of a weight with their scale rows / columns,
//! misaligned rows, M = 1, 7, 33, 130.

use rand::Rng;
use vt_core::fp8_block::{blocks, BLOCK};

use crate::case::{strides_of, Builder, Cases, Exec, Ty, View};

/// A random e4m3 value (never NaN): a uniform code of 0x00..0x7e with a random sign.
fn e4m3_value(b: &mut Builder) -> f64 {
    let code: u8 = b.rng.gen_range(0..0x7f);
    let v = vt_core::f8e4m3_to_f32(code) as f64;
    if b.rng.gen_bool(0.5) {
        -v
    } else {
        v
    }
}

fn e4m3_values(b: &mut Builder, n: i64) -> Vec<f64> {
    (0..n).map(|_| e4m3_value(b)).collect()
}

/// A random block scale in [2^-10, 2^-4).
fn scale_value(b: &mut Builder) -> f64 {
    2f64.powf(b.rng.gen_range(-10.0..-4.0))
}

/// A buffer of e4m3 codes `[rows, cols]` (row-major) viewed from `(r0, c0)` as `[n, k]`.
fn fp8_matrix(
    b: &mut Builder,
    name: &str,
    (rows, cols): (i64, i64),
    (r0, c0): (i64, i64),
    (n, k): (i64, i64),
) -> View {
    let vals = e4m3_values(b, rows * cols);
    b.values(name, Ty::F8E4M3, &[rows, cols], vals).sub(r0 * cols + c0, &[n, k], &[cols, 1])
}

/// Scales `[rows, cols]` (row-major), block `zero` (if any) 0.
fn scales(b: &mut Builder, name: &str, (rows, cols): (i64, i64), zero: Option<(i64, i64)>) -> View {
    let mut vals: Vec<f64> = (0..rows * cols).map(|_| scale_value(b)).collect();
    if let Some((r, c)) = zero {
        vals[(r * cols + c) as usize] = 0.0;
    }
    b.values(name, Ty::F32, &[rows, cols], vals)
}

/// `out[M,N] = A . W^T`: `b` is rows `b_row0..b_row0+N`, columns `b_col0..b_col0+K` of an
/// fp8 weight with rows `b_ld` wide (`b_row0`, `b_col0` multiples of 128, so its scales are
/// the matching slice of the weight's scale tensor); `a` is columns `a_off..a_off+K` of rows
/// `a_ld` wide; `out` columns `o_off..` of rows `o_ld` wide. `fp8_a`: `a` in e4m3 with
/// per-token scales. `zero`: a weight scale block (of the view) set to 0.
struct MatmulFp8 {
    m: i64,
    n: i64,
    k: i64,
    a: (i64, i64),
    b: (i64, i64, i64),
    out: (i64, i64),
    fp8_a: bool,
    zero: Option<(i64, i64)>,
}

impl MatmulFp8 {
    fn contiguous(m: i64, n: i64, k: i64) -> MatmulFp8 {
        MatmulFp8 { m, n, k, a: (k, 0), b: (k, 0, 0), out: (n, 0), fp8_a: false, zero: None }
    }

    fn fp8(self) -> MatmulFp8 {
        MatmulFp8 { fp8_a: true, ..self }
    }

    fn build(self, bld: &mut Builder) -> Exec {
        let MatmulFp8 {
            m,
            n,
            k,
            a: (a_ld, a_off),
            b: (b_ld, b_col0, b_row0),
            out: (o_ld, o_off),
            fp8_a,
            zero,
        } = self;
        let rows = b_row0 + n + 1;
        let b = fp8_matrix(bld, "b", (rows, b_ld), (b_row0, b_col0), (n, k));
        let (sr, sc) = (blocks(rows), blocks(b_ld));
        let (r0, c0) = (b_row0 / BLOCK as i64, b_col0 / BLOCK as i64);
        let zero_full = zero.map(|(r, c)| (r + r0, c + c0));
        let b_scale =
            scales(bld, "b_scale", (sr, sc), zero_full).sub(r0 * sc + c0, &[blocks(n), blocks(k)], &[sc, 1]);
        let (a, a_scale) = if fp8_a {
            let a = fp8_matrix(bld, "a", (m, a_ld), (0, a_off), (m, k));
            // Per-token scales stored transposed ([K/128, M], as DeepGEMM keeps them).
            let g = blocks(k);
            let s = scales(bld, "a_scale", (g, m), None).sub(0, &[m, g], &[1, m]);
            (a, Some(s))
        } else {
            (bld.uniform("a", &[m, a_ld], -1.0, 1.0).sub(a_off, &[m, k], &[a_ld, 1]), None)
        };
        let out = bld.poison("out", Ty::Float, &[m, o_ld]).sub(o_off, &[m, n], &[o_ld, 1]);
        bld.output("out", &out);
        Box::new(move |q, bufs| {
            let a_scale = a_scale.as_ref().map(|s| s.tensor(bufs)).transpose()?;
            vt_core::matmul_bt_fp8(
                q,
                &vt_core::MatmulBTFp8Args {
                    out: out.tensor(bufs)?,
                    a: a.tensor(bufs)?,
                    a_scale,
                    b: b.tensor(bufs)?,
                    b_scale: b_scale.tensor(bufs)?,
                },
            )
        })
    }
}

pub(super) fn matmul_bt_fp8(c: &mut Cases) {
    c.add("decode row: M 1, N 576, K 512", |b| MatmulFp8::contiguous(1, 576, 512).build(b));
    c.add("M 7, N 264 (a partial N block), K 384, one zero scale block", |b| {
        MatmulFp8 { zero: Some((1, 2)), ..MatmulFp8::contiguous(7, 264, 384) }.build(b)
    });
    c.add(
        "tensor-parallel rows: b = rows 128..384 of a weight with its scale rows 1..3, a row stride 300, \
         out = cols 5..261 of rows of 270",
        |b| {
            MatmulFp8 { a: (300, 0), b: (256, 0, 128), out: (270, 5), ..MatmulFp8::contiguous(5, 256, 256) }
                .build(b)
        },
    );
    c.add("tensor-parallel columns: b = cols 128..384 of rows of 512 with its scale cols 1..3, N 130", |b| {
        MatmulFp8 { b: (512, 128, 0), ..MatmulFp8::contiguous(3, 130, 256) }.build(b)
    });
    c.add("odd sizes M 33, N 70, K 200 (partial K block, K not a multiple of 16)", |b| {
        MatmulFp8 { a: (203, 1), ..MatmulFp8::contiguous(33, 70, 200) }.build(b)
    });
    c.add("M 16, N 144, K 400 (K a multiple of 16, not of 128)", |b| {
        MatmulFp8::contiguous(16, 144, 400).build(b)
    });
    c.add("misaligned weight rows (row stride K + 3): M 4, N 40, K 96", |b| {
        MatmulFp8 { b: (99, 0, 0), ..MatmulFp8::contiguous(4, 40, 96) }.build(b)
    });
    c.add("M 128, N 128, K 1024", |b| MatmulFp8::contiguous(128, 128, 1024).build(b));
    c.add("both fp8 (per-token 1x128 activation scales, stored transposed): M 7, N 200, K 384", |b| {
        MatmulFp8::contiguous(7, 200, 384).fp8().build(b)
    });
    c.add("both fp8: M 130, N 256, K 512, a = cols 128..640 of rows of 768", |b| {
        MatmulFp8 { a: (768, 128), ..MatmulFp8::contiguous(130, 256, 512) }.fp8().build(b)
    });
    c.add("both fp8, odd sizes M 9, N 70, K 200, one zero scale block", |b| {
        MatmulFp8 { zero: Some((0, 1)), ..MatmulFp8::contiguous(9, 70, 200) }.fp8().build(b)
    });
    c.add("K 0 (out = 0)", |b| MatmulFp8::contiguous(3, 5, 0).build(b));
    c.add("M 0 (nothing to write)", |b| MatmulFp8::contiguous(0, 4, 8).build(b));
}

/// A `[d0, d1, d2]` view of a contiguous buffer whose storage dims are the logical dims in
/// `order` (storage dim i = logical dim `order[i]`), filled by `fill(len)`.
fn stored_as(
    b: &mut Builder,
    name: &str,
    ty: Ty,
    logical: [i64; 3],
    order: [usize; 3],
    vals: Vec<f64>,
) -> View {
    let storage = [logical[order[0]], logical[order[1]], logical[order[2]]];
    let sst = strides_of(&storage);
    let mut strides = [0i64; 3];
    for i in 0..3 {
        strides[order[i]] = sst[i];
    }
    b.values(name, ty, &storage, vals).sub(0, &logical, &strides)
}

struct Bmm {
    a: View,
    a_scale: Option<View>,
    b: View,
    b_scale: View,
    out: View,
}

fn bmm(x: Bmm) -> Exec {
    Box::new(move |q, bufs| {
        let a_scale = x.a_scale.as_ref().map(|s| s.tensor(bufs)).transpose()?;
        vt_core::batched_matmul_fp8(
            q,
            &vt_core::BatchedMatmulFp8Args {
                out: x.out.tensor(bufs)?,
                a: x.a.tensor(bufs)?,
                a_scale,
                b: x.b.tensor(bufs)?,
                b_scale: x.b_scale.tensor(bufs)?,
            },
        )
    })
}

const PLAIN: [usize; 3] = [0, 1, 2];

/// The float activations `[g, m, k]` stored in `order`, and the poisoned output `[g, m, n]`
/// stored in `out_order`.
fn float_a_out(
    b: &mut Builder,
    (g, m, k, n): (i64, i64, i64, i64),
    order: [usize; 3],
    out_order: [usize; 3],
) -> (View, View) {
    let vals = (0..g * m * k).map(|_| b.rng.gen_range(-1.0..1.0)).collect();
    let a = stored_as(b, "a", Ty::Float, [g, m, k], order, vals);
    let storage = [[g, m, n][out_order[0]], [g, m, n][out_order[1]], [g, m, n][out_order[2]]];
    let sst = strides_of(&storage);
    let mut strides = [0i64; 3];
    for i in 0..3 {
        strides[out_order[i]] = sst[i];
    }
    let out = b.poison("out", Ty::Float, &storage).sub(0, &[g, m, n], &strides);
    b.output("out", &out);
    (a, out)
}

/// The absorbed decode weights as the block keeps them: `kv_b_proj` `[G*(P+V), L]` in fp8
/// with scales `[2G, L/128]` (P = V = 128), viewed per head.
fn kv_b(b: &mut Builder, g: i64, l: i64) -> (View, View) {
    let (p, v) = (128, 128);
    let w = e4m3_values(b, g * (p + v) * l);
    let w = b.values("kv_b_proj", Ty::F8E4M3, &[g * (p + v), l], w);
    let s = scales(b, "kv_b_proj scale", (2 * g, blocks(l)), Some((3, 1)));
    (w, s)
}

pub(super) fn batched_matmul_fp8(c: &mut Cases) {
    c.add(
        "absorbed q, block layout: q_nope [N 8, B 2, P 128] = view of q [B, N, 192], W_UK_T [N, P, L 512] \
         = per-head transposed copy [N, L, P] (K contiguous), scales [N, L/128, 1]",
        |b| {
            let (g, m, k, n) = (8, 2, 128, 512);
            // q [B, N, P + R] with the nope part read as [N, B, P].
            let q = (0..m * g * 192).map(|_| b.rng.gen_range(-1.0..1.0)).collect();
            let a = b.values("q", Ty::Float, &[m, g, 192], q).sub(0, &[g, m, k], &[192, g * 192, 1]);
            let out = b.poison("out", Ty::Float, &[m, g, n]).sub(0, &[g, m, n], &[n, g * n, 1]);
            b.output("out", &out);
            let w = e4m3_values(b, g * n * k);
            let w = stored_as(b, "w_uk", Ty::F8E4M3, [g, k, n], [0, 2, 1], w);
            let s = (0..g * blocks(n)).map(|_| scale_value(b)).collect();
            let s = stored_as(b, "w_uk scale", Ty::F32, [g, 1, blocks(n)], [0, 2, 1], s);
            bmm(Bmm { a, a_scale: None, b: w, b_scale: s, out })
        },
    );
    c.add(
        "absorbed q, checkpoint layout: W_UK_T [N 4, P 128, L 512] = view of kv_b_proj rows (N contiguous), \
         scales = its even scale rows, M 3",
        |b| {
            let (g, m, k, n) = (4, 3, 128, 512);
            let (a, out) = float_a_out(b, (g, m, k, n), PLAIN, PLAIN);
            let (w, s) = kv_b(b, g, n);
            let w = w.sub(0, &[g, k, n], &[256 * n, n, 1]);
            let s = s.sub(0, &[g, 1, 4], &[8, 4, 1]);
            bmm(Bmm { a, a_scale: None, b: w, b_scale: s, out })
        },
    );
    c.add(
        "absorbed v: attn [N 8, B 2, L 512] = view of [B, N, L], W_UV [N, L, V 128] = kv_b_proj rows \
         128..256 of each head read transposed (K contiguous), scales = its odd scale rows",
        |b| {
            let (g, m, k, n) = (8, 2, 512, 128);
            let (a, out) = float_a_out(b, (g, m, k, n), [1, 0, 2], [1, 0, 2]);
            let (w, s) = kv_b(b, g, k);
            let w = w.sub(128 * k, &[g, k, n], &[256 * k, 1, k]);
            let s = s.sub(4, &[g, 4, 1], &[8, 1, 1]);
            bmm(Bmm { a, a_scale: None, b: w, b_scale: s, out })
        },
    );
    c.add("contiguous [K, N] weights with partial blocks: G 3, M 5, K 200, N 70", |b| {
        let (g, m, k, n) = (3, 5, 200, 70);
        let (a, out) = float_a_out(b, (g, m, k, n), PLAIN, PLAIN);
        let w = e4m3_values(b, g * k * n);
        let w = stored_as(b, "w", Ty::F8E4M3, [g, k, n], PLAIN, w);
        let s = (0..g * 2).map(|_| scale_value(b)).collect();
        let s = stored_as(b, "w scale", Ty::F32, [g, 2, 1], PLAIN, s);
        bmm(Bmm { a, a_scale: None, b: w, b_scale: s, out })
    });
    c.add("K-contiguous weights, N and K not multiples of 128: G 2, M 7, K 272, N 136", |b| {
        let (g, m, k, n) = (2, 7, 272, 136);
        let (a, out) = float_a_out(b, (g, m, k, n), PLAIN, PLAIN);
        let w = e4m3_values(b, g * k * n);
        let w = stored_as(b, "w", Ty::F8E4M3, [g, k, n], [0, 2, 1], w);
        let s = (0..g * 3 * 2).map(|_| scale_value(b)).collect();
        let s = stored_as(b, "w scale", Ty::F32, [g, 3, 2], PLAIN, s);
        bmm(Bmm { a, a_scale: None, b: w, b_scale: s, out })
    });
    c.add("both fp8 (per-token activation scales): G 4, M 3, K 256, N 130, K-contiguous weights", |b| {
        let (g, m, k, n) = (4, 3, 256, 130);
        let av = e4m3_values(b, g * m * k);
        let a = stored_as(b, "a", Ty::F8E4M3, [g, m, k], PLAIN, av);
        let asv = (0..g * m * 2).map(|_| scale_value(b)).collect();
        let a_scale = stored_as(b, "a_scale", Ty::F32, [g, m, 2], PLAIN, asv);
        let w = e4m3_values(b, g * k * n);
        let w = stored_as(b, "w", Ty::F8E4M3, [g, k, n], [0, 2, 1], w);
        let s = (0..g * 2 * 2).map(|_| scale_value(b)).collect();
        let s = stored_as(b, "w scale", Ty::F32, [g, 2, 2], PLAIN, s);
        let out = b.poison("out", Ty::Float, &[g, m, n]);
        b.output("out", &out);
        bmm(Bmm { a, a_scale: Some(a_scale), b: w, b_scale: s, out })
    });
    c.add("no unit stride in the last two dims of a, b or out (G innermost): G 3, M 5, K 12, N 6", |b| {
        let (g, m, k, n) = (3, 5, 12, 6);
        let (a, out) = float_a_out(b, (g, m, k, n), [2, 1, 0], [1, 2, 0]);
        let w = e4m3_values(b, g * k * n);
        let w = stored_as(b, "w", Ty::F8E4M3, [g, k, n], [1, 2, 0], w);
        let s = (0..g).map(|_| scale_value(b)).collect();
        let s = stored_as(b, "w scale", Ty::F32, [g, 1, 1], PLAIN, s);
        bmm(Bmm { a, a_scale: None, b: w, b_scale: s, out })
    });
    c.add("G 1, M 1 (one row), K 40, N 9", |b| {
        let (g, m, k, n) = (1, 1, 40, 9);
        let (a, out) = float_a_out(b, (g, m, k, n), PLAIN, PLAIN);
        let w = e4m3_values(b, g * k * n);
        let w = stored_as(b, "w", Ty::F8E4M3, [g, k, n], PLAIN, w);
        let s = vec![scale_value(b)];
        let s = stored_as(b, "w scale", Ty::F32, [1, 1, 1], PLAIN, s);
        bmm(Bmm { a, a_scale: None, b: w, b_scale: s, out })
    });
}

/// Quantizes `x` `[M,K]` (columns `x_off..` of rows `x_ld` wide, group g of each row scaled by
/// `mags[g]`, group `zero` all zero) into `out` (rows `o_ld` wide) and a scale tensor stored
/// transposed when `scale_t`.
fn quantize(
    b: &mut Builder,
    (m, k): (i64, i64),
    (x_ld, x_off): (i64, i64),
    o_ld: i64,
    zero: Option<i64>,
    scale_t: bool,
) -> Exec {
    let g = blocks(k);
    let mut vals = Vec::with_capacity((m * x_ld) as usize);
    for _ in 0..m {
        let mags: Vec<f64> = (0..g).map(|_| 2f64.powi(b.rng.gen_range(-8..=8))).collect();
        for j in 0..x_ld {
            let c = j - x_off;
            let v = if (0..k).contains(&c) {
                let grp = c / BLOCK as i64;
                if Some(grp) == zero {
                    0.0
                } else {
                    b.rng.gen_range(-1.0..1.0) * mags[grp as usize]
                }
            } else {
                b.rng.gen_range(-1.0..1.0)
            };
            vals.push(v);
        }
    }
    let x = b.values("x", Ty::Float, &[m, x_ld], vals).sub(x_off, &[m, k], &[x_ld, 1]);
    let out = b.poison("out", Ty::F8E4M3, &[m, o_ld]).sub(0, &[m, k], &[o_ld, 1]);
    b.output("out", &out);
    let scale = if scale_t {
        b.poison("scale", Ty::F32, &[g, m]).sub(0, &[m, g], &[1, m])
    } else {
        b.poison("scale", Ty::F32, &[m, g])
    };
    b.output("scale", &scale);
    Box::new(move |q, bufs| {
        vt_core::quantize_fp8(
            q,
            &vt_core::QuantizeFp8Args {
                out: out.tensor(bufs)?,
                scale: scale.tensor(bufs)?,
                x: x.tensor(bufs)?,
            },
        )
    })
}

pub(super) fn quantize_fp8(c: &mut Cases) {
    c.add("M 5, K 512", |b| quantize(b, (5, 512), (512, 0), 512, None, false));
    c.add(
        "M 7, K 200 (a partial group), x = cols 3..203 of rows of 210, out rows of 256, scales stored transposed",
        |b| quantize(b, (7, 200), (210, 3), 256, None, true),
    );
    c.add("M 3, K 384, group 1 all zero (scale 0, zero codes)", |b| {
        quantize(b, (3, 384), (384, 0), 384, Some(1), false)
    });
    c.add("decode row: M 1, K 7168", |b| quantize(b, (1, 7168), (7168, 0), 7168, None, true));
    c.add("M 130, K 136", |b| quantize(b, (130, 136), (136, 0), 144, Some(1), false));
    c.add("M 0 (nothing to write)", |b| quantize(b, (0, 256), (256, 0), 256, None, false));
}
