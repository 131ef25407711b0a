//! The block-scaled fp8 ops on the CPU against naive f64 code written from the contracts
//! (not from `vt_core::fp8_block`): MatmulBTFp8 and BatchedMatmulFp8 with the weight (and
//! optionally the activations) decoded from e4m3 bit fields times their block's scale,
//! QuantizeFp8's codes and scales; plus malformed arguments for the three entry points.

mod common;

use common::*;
use rand::Rng;
use vt_core::*;

/// A random finite e4m3 code.
fn code(rng: &mut impl Rng) -> u8 {
    let c: u8 = rng.gen_range(0..0x7f);
    c | if rng.gen_bool(0.5) { 0x80 } else { 0 }
}

/// An fp8 operand of `len` random codes (as a byte buffer viewed through `shape`/`strides`
/// from `offset`): the buffer and the codes.
fn fp8_buf(q: &Queue, rng: &mut impl Rng, len: i64) -> (Buffer, Vec<u8>) {
    let codes: Vec<u8> = (0..len).map(|_| code(rng)).collect();
    (Buffer::from_bytes(q, DType::F8E4M3, &[len], &codes).unwrap(), codes)
}

fn f32_buf(q: &Queue, vals: &[f32]) -> Buffer {
    Buffer::from_slice(q, &[vals.len() as i64], vals).unwrap()
}

fn scales(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| 2f32.powf(rng.gen_range(-10.0..-4.0))).collect()
}

#[test]
fn matmul_bt_fp8_matches_the_decoded_product_on_strided_views() {
    let q = queue();
    let mut rng = rng("matmul_bt_fp8_matches_the_decoded_product_on_strided_views");
    // b = rows 128..128+N, cols 0..K of a [N + 129, K + 5] fp8 weight; its scales the
    // matching row of the weight's [2, 2] scale tensor.
    let (m, n, k) = (5i64, 70i64, 200i64);
    let (rows, ld) = (n + 129, k + 5);
    let (wbuf, wcodes) = fp8_buf(&q, &mut rng, rows * ld);
    let b = wbuf.view().as_strided(128 * ld, &[n, k], &[ld, 1]).unwrap();
    let ws = scales(&mut rng, 2 * 2);
    let wsbuf = f32_buf(&q, &ws);
    let b_scale = wsbuf.view().as_strided(2, &[1, 2], &[2, 1]).unwrap();
    let w = |j: i64, kk: i64| {
        e4m3(wcodes[((128 + j) * ld + kk) as usize]) * ws[(2 + (j / 128) * 2 + kk / 128) as usize] as f64
    };
    for fp8_a in [false, true] {
        for dt in FLOAT_DTYPES {
            let (a_pool, a_fp8);
            let (a, a_scale, av): (Tensor<'_>, Option<Tensor<'_>>, Vec<f64>);
            let asv = scales(&mut rng, (m * 2) as usize);
            let asbuf = f32_buf(&q, &asv);
            if fp8_a {
                // a = cols 3..3+K of rows K + 7 wide; scales stored transposed [2, M].
                a_fp8 = fp8_buf(&q, &mut rng, m * (k + 7));
                a = a_fp8.0.view().as_strided(3, &[m, k], &[k + 7, 1]).unwrap();
                a_scale = Some(asbuf.view().as_strided(0, &[m, 2], &[1, m]).unwrap());
                av = (0..m * k)
                    .map(|e| {
                        let (i, kk) = (e / k, e % k);
                        e4m3(a_fp8.1[(i * (k + 7) + 3 + kk) as usize])
                            * asv[((kk / 128) * m + i) as usize] as f64
                    })
                    .collect();
            } else {
                a_pool = Pool::input(
                    &q,
                    &mut rng,
                    dt,
                    &[m, k],
                    Layout::Strided { len: m * (k + 7), offset: 3, strides: vec![k + 7, 1] },
                );
                a = a_pool.view();
                a_scale = None;
                av = a_pool.values(&q);
            }
            let out = Pool::output(&q, dt, &[m, n], Layout::Padded);
            matmul_bt_fp8(&q, &MatmulBTFp8Args { out: out.view(), a, a_scale, b, b_scale }).unwrap();
            let mut want = vec![0f64; (m * n) as usize];
            for i in 0..m {
                for j in 0..n {
                    want[(i * n + j) as usize] = (0..k).map(|kk| av[(i * k + kk) as usize] * w(j, kk)).sum();
                }
            }
            assert_close(&format!("MatmulBTFp8 {dt} fp8 a {fp8_a}"), &out.values(&q), &want, tol(dt));
            out.assert_outside_untouched(&q);
        }
    }
}

#[test]
fn batched_matmul_fp8_reads_a_heads_transposed_slice_of_kv_b_proj() {
    // W_UV [G, L, V] = rows 128..256 of each head of kv_b [G * 256, L] read transposed,
    // with the odd rows of its [2G, L/128] scales.
    let q = queue();
    let mut rng = rng("batched_matmul_fp8_reads_a_heads_transposed_slice_of_kv_b_proj");
    let (g, m, l, v) = (3i64, 4i64, 256i64, 128i64);
    let (kvb, codes) = fp8_buf(&q, &mut rng, g * 256 * l);
    let b = kvb.view().as_strided(128 * l, &[g, l, v], &[256 * l, 1, l]).unwrap();
    let s = scales(&mut rng, (2 * g * 2) as usize);
    let sbuf = f32_buf(&q, &s);
    let b_scale = sbuf.view().as_strided(2, &[g, 2, 1], &[4, 1, 1]).unwrap();
    for dt in FLOAT_DTYPES {
        // a [G, M, L] as a view of [M, G, L].
        let a = Pool::input(
            &q,
            &mut rng,
            dt,
            &[g, m, l],
            Layout::Strided { len: g * m * l, offset: 0, strides: vec![l, g * l, 1] },
        );
        let out = Pool::output(&q, dt, &[g, m, v], Layout::Padded);
        batched_matmul_fp8(
            &q,
            &BatchedMatmulFp8Args { out: out.view(), a: a.view(), a_scale: None, b, b_scale },
        )
        .unwrap();
        let av = a.values(&q);
        let mut want = vec![0f64; (g * m * v) as usize];
        for h in 0..g {
            for i in 0..m {
                for j in 0..v {
                    want[((h * m + i) * v + j) as usize] = (0..l)
                        .map(|kk| {
                            let wv = e4m3(codes[((h * 256 + 128 + j) * l + kk) as usize])
                                * s[((2 * h + 1) * 2 + kk / 128) as usize] as f64;
                            av[((h * m + i) * l + kk) as usize] * wv
                        })
                        .sum();
                }
            }
        }
        assert_close(&format!("BatchedMatmulFp8 {dt}"), &out.values(&q), &want, tol(dt));
        out.assert_outside_untouched(&q);
        a.assert_unchanged(&q);
    }
}

#[test]
fn quantize_fp8_gives_amax_over_448_scales_and_nearest_even_codes() {
    let q = queue();
    let mut rng = rng("quantize_fp8_gives_amax_over_448_scales_and_nearest_even_codes");
    let (m, k) = (3i64, 300i64);
    for dt in FLOAT_DTYPES {
        // Group 1 of row 1 all zero; magnitudes differ per group.
        let vals: Vec<f64> = (0..m * k)
            .map(|e| {
                let (i, c) = (e / k, e % k);
                if i == 1 && c / 128 == 1 {
                    0.0
                } else {
                    rng.gen_range(-1.0..1.0) * 2f64.powi((c / 128) as i32 * 3 - 2)
                }
            })
            .collect();
        let x = Pool::with_values(&q, dt, &[m, k], m * k, 0, vec![k, 1], &vals);
        let out = Buffer::nan(&q, DType::F8E4M3, &[m, k]).unwrap();
        let sc = Buffer::nan(&q, DType::F32, &[m, 3]).unwrap();
        quantize_fp8(&q, &QuantizeFp8Args { out: out.view(), scale: sc.view(), x: x.view() }).unwrap();
        let (codes, got_s) = (out.to_bytes(&q).unwrap(), sc.to_f64(&q).unwrap());
        // The scales stored transposed ([ceil(K/128), M], strides [1, M]: cuBLASLt's
        // layout, what the block's prefill uses) hold the same values, the codes the same.
        let out_t = Buffer::nan(&q, DType::F8E4M3, &[m, k]).unwrap();
        let sc_t = Buffer::nan(&q, DType::F32, &[3 * m]).unwrap();
        let sc_tv = sc_t.view().as_strided(0, &[m, 3], &[1, m]).unwrap();
        quantize_fp8(&q, &QuantizeFp8Args { out: out_t.view(), scale: sc_tv, x: x.view() }).unwrap();
        assert_eq!(out_t.to_bytes(&q).unwrap(), codes, "{dt}: codes with transposed scales");
        let got_t = sc_t.to_f64(&q).unwrap();
        for (i, grp) in (0..m as usize).flat_map(|i| (0..3usize).map(move |g| (i, g))) {
            assert_eq!(
                got_t[grp * m as usize + i],
                got_s[i * 3 + grp],
                "{dt}: transposed scale [{i}, {grp}]"
            );
        }
        let xv = x.values(&q);
        for i in 0..m as usize {
            for grp in 0..3usize {
                let cols = grp * 128..((grp + 1) * 128).min(k as usize);
                let amax = cols.clone().map(|c| xv[i * k as usize + c].abs()).fold(0.0, f64::max);
                let want_s = (amax as f32 / 448.0) as f64;
                assert_eq!(got_s[i * 3 + grp], want_s, "{dt}: scale [{i}, {grp}]");
                for c in cols {
                    let code = codes[i * k as usize + c];
                    if want_s == 0.0 {
                        assert_eq!(code, 0, "{dt}: zero group code");
                        continue;
                    }
                    // The nearest code to x / scale (in f32), ties to the even code.
                    let t = (xv[i * k as usize + c] as f32 / want_s as f32) as f64;
                    let best = (0u8..=0xfe)
                        .filter(|&b| b & 0x7f != 0x7f)
                        .min_by(|&p, &r| {
                            let (ep, er) = ((e4m3(p) - t).abs(), (e4m3(r) - t).abs());
                            ep.total_cmp(&er).then((p & 1).cmp(&(r & 1)))
                        })
                        .unwrap();
                    assert_eq!(e4m3(code), e4m3(best), "{dt}: [{i}, {c}] = {t} (in scale units)");
                }
            }
        }
    }
}

#[test]
fn fp8_entry_points_reject_malformed_arguments() {
    let q = queue();
    let z = |dt: DType, shape: &[i64]| Buffer::zeros(&q, dt, shape).unwrap();
    let (f8, f32t, bf) = (DType::F8E4M3, DType::F32, DType::BF16);
    let (out, a, b, bs) = (z(bf, &[3, 130]), z(bf, &[3, 200]), z(f8, &[130, 200]), z(f32t, &[2, 2]));
    let (a8, as8) = (z(f8, &[3, 200]), z(f32t, &[3, 2]));
    let ok = MatmulBTFp8Args { out: out.view(), a: a.view(), a_scale: None, b: b.view(), b_scale: bs.view() };
    matmul_bt_fp8(&q, &ok).unwrap();
    matmul_bt_fp8(&q, &MatmulBTFp8Args { a: a8.view(), a_scale: Some(as8.view()), ..ok }).unwrap();
    let op = OpId::MatmulBTFp8;
    let bad_b = z(bf, &[130, 200]);
    expect_invalid("b not fp8", matmul_bt_fp8(&q, &MatmulBTFp8Args { b: bad_b.view(), ..ok }), op, "b");
    let bs3 = z(f32t, &[1, 2]);
    expect_invalid(
        "scale rows",
        matmul_bt_fp8(&q, &MatmulBTFp8Args { b_scale: bs3.view(), ..ok }),
        op,
        "b_scale",
    );
    let bs_bf = z(bf, &[2, 2]);
    expect_invalid(
        "scale dtype",
        matmul_bt_fp8(&q, &MatmulBTFp8Args { b_scale: bs_bf.view(), ..ok }),
        op,
        "b_scale",
    );
    expect_invalid(
        "fp8 a without scales",
        matmul_bt_fp8(&q, &MatmulBTFp8Args { a: a8.view(), ..ok }),
        op,
        "a",
    );
    expect_invalid(
        "16-bit a with scales",
        matmul_bt_fp8(&q, &MatmulBTFp8Args { a_scale: Some(as8.view()), ..ok }),
        op,
        "a",
    );
    let as_bad = z(f32t, &[3, 1]);
    expect_invalid(
        "a_scale groups",
        matmul_bt_fp8(&q, &MatmulBTFp8Args { a: a8.view(), a_scale: Some(as_bad.view()), ..ok }),
        op,
        "a_scale",
    );
    let a3 = z(bf, &[3, 200, 1]);
    expect_invalid("a of rank 3", matmul_bt_fp8(&q, &MatmulBTFp8Args { a: a3.view(), ..ok }), op, "a");
    let b_t = b.view().transpose(0, 1).unwrap();
    let out_t = z(bf, &[3, 200]);
    expect_invalid(
        "b with no unit inner stride",
        matmul_bt_fp8(
            &q,
            &MatmulBTFp8Args {
                out: out_t.view(),
                a: z(bf, &[3, 130]).view(),
                b: b_t,
                b_scale: z(f32t, &[2, 2]).view(),
                ..ok
            },
        ),
        op,
        "b",
    );
    let out_f32 = z(f32t, &[3, 130]);
    expect_invalid(
        "mixed dtypes",
        matmul_bt_fp8(&q, &MatmulBTFp8Args { out: out_f32.view(), ..ok }),
        op,
        "a",
    );

    // BatchedMatmulFp8.
    let op = OpId::BatchedMatmulFp8;
    let (out, a, b, bs) =
        (z(bf, &[2, 3, 130]), z(bf, &[2, 3, 200]), z(f8, &[2, 200, 130]), z(f32t, &[2, 2, 2]));
    let ok =
        BatchedMatmulFp8Args { out: out.view(), a: a.view(), a_scale: None, b: b.view(), b_scale: bs.view() };
    batched_matmul_fp8(&q, &ok).unwrap();
    let bs_t = z(f32t, &[2, 2, 1]);
    expect_invalid(
        "scale N blocks",
        batched_matmul_fp8(&q, &BatchedMatmulFp8Args { b_scale: bs_t.view(), ..ok }),
        op,
        "b_scale",
    );
    let b_g = z(f8, &[3, 200, 130]);
    expect_invalid(
        "b groups",
        batched_matmul_fp8(&q, &BatchedMatmulFp8Args { b: b_g.view(), ..ok }),
        op,
        "b",
    );
    let wide = z(bf, &[2, 3, 200]);
    expect_invalid(
        "out overlapping a",
        batched_matmul_fp8(
            &q,
            &BatchedMatmulFp8Args { out: wide.view().slice(2, 0, 130).unwrap(), a: wide.view(), ..ok },
        ),
        op,
        "out",
    );

    // QuantizeFp8.
    let op = OpId::QuantizeFp8;
    let (x, o, s) = (z(bf, &[3, 200]), z(f8, &[3, 200]), z(f32t, &[3, 2]));
    let ok = QuantizeFp8Args { out: o.view(), scale: s.view(), x: x.view() };
    quantize_fp8(&q, &ok).unwrap();
    let o16 = z(bf, &[3, 200]);
    expect_invalid("16-bit out", quantize_fp8(&q, &QuantizeFp8Args { out: o16.view(), ..ok }), op, "out");
    let s1 = z(f32t, &[3, 1]);
    expect_invalid(
        "scale groups",
        quantize_fp8(&q, &QuantizeFp8Args { scale: s1.view(), ..ok }),
        op,
        "scale",
    );
    let x8 = z(f8, &[3, 200]);
    expect_invalid("fp8 x", quantize_fp8(&q, &QuantizeFp8Args { x: x8.view(), ..ok }), op, "x");
}
