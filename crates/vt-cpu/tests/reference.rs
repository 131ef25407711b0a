//! Every CPU op against a separate, naive f64 implementation written here (different
//! loop order, f64 math), on fresh random inputs stored in bf16, f16 and f32, with
//! non-contiguous views, NaN-poisoned outputs and sentinel-filled surroundings.

mod common;

use common::*;
use rand::seq::SliceRandom;
use rand::Rng;
use vt_core::*;

/// Logical (row-major) index into a flat vector of `shape`.
fn at(shape: &[i64], idx: &[i64]) -> usize {
    let mut off = 0;
    for (s, i) in shape.iter().zip(idx) {
        off = off * s + i;
    }
    off as usize
}

// ---------------------------------------------------------------- MatmulBT

#[test]
fn matmul_bt_matches_reference_on_row_strided_views() {
    let q = queue();
    let mut rng = rng("matmul_bt_matches_reference_on_row_strided_views");
    let (m, k, n) = (5i64, 37i64, 7i64);
    for dt in FLOAT_DTYPES {
        // a: columns 3..3+K of a wider [M, K+5] buffer; b: rows 2..2+N of an [N+4, K] weight.
        let a = Pool::input(
            &q,
            &mut rng,
            dt,
            &[m, k],
            Layout::Strided { len: m * (k + 5), offset: 3, strides: vec![k + 5, 1] },
        );
        let b = Pool::input(
            &q,
            &mut rng,
            dt,
            &[n, k],
            Layout::Strided { len: (n + 4) * k, offset: 2 * k, strides: vec![k, 1] },
        );
        let out = Pool::output(&q, dt, &[m, n], Layout::Padded);
        matmul_bt(&q, &MatmulBTArgs { out: out.view(), a: a.view(), b: b.view() }).unwrap();

        let (av, bv) = (a.values(&q), b.values(&q));
        let mut want = vec![0f64; (m * n) as usize];
        for kk in 0..k {
            for i in 0..m {
                for j in 0..n {
                    want[at(&[m, n], &[i, j])] += av[at(&[m, k], &[i, kk])] * bv[at(&[n, k], &[j, kk])];
                }
            }
        }
        assert_close(&format!("MatmulBT {dt}"), &out.values(&q), &want, tol(dt));
        out.assert_outside_untouched(&q);
        a.assert_unchanged(&q);
        b.assert_unchanged(&q);
    }
}

#[test]
fn matmul_bt_with_k_zero_writes_zeros() {
    let q = queue();
    for dt in FLOAT_DTYPES {
        let a = Buffer::zeros(&q, dt, &[3, 0]).unwrap();
        let b = Buffer::zeros(&q, dt, &[4, 0]).unwrap();
        let out = Pool::output(&q, dt, &[3, 4], Layout::Padded);
        matmul_bt(&q, &MatmulBTArgs { out: out.view(), a: a.view(), b: b.view() }).unwrap();
        assert!(out.values(&q).iter().all(|&v| v == 0.0), "{dt}: K = 0 must give zeros");
        out.assert_outside_untouched(&q);
    }
}

// ---------------------------------------------------------------- BatchedMatmul

fn batched_matmul_case(a_layout: Layout, b_layout: Layout, out_layout: Layout, what: &str) {
    let q = queue();
    let mut rng = rng(what);
    let (g, m, k, n) = (3i64, 4i64, 6i64, 5i64);
    for dt in FLOAT_DTYPES {
        let a = Pool::input(&q, &mut rng, dt, &[g, m, k], a_layout.clone());
        let b = Pool::input(&q, &mut rng, dt, &[g, k, n], b_layout.clone());
        let out = Pool::output(&q, dt, &[g, m, n], out_layout.clone());
        batched_matmul(&q, &BatchedMatmulArgs { out: out.view(), a: a.view(), b: b.view() }).unwrap();

        let (av, bv) = (a.values(&q), b.values(&q));
        let mut want = vec![0f64; (g * m * n) as usize];
        for gi in 0..g {
            for j in 0..n {
                for i in 0..m {
                    let s: f64 = (0..k)
                        .map(|kk| av[at(&[g, m, k], &[gi, i, kk])] * bv[at(&[g, k, n], &[gi, kk, j])])
                        .sum();
                    want[at(&[g, m, n], &[gi, i, j])] = s;
                }
            }
        }
        assert_close(&format!("{what} {dt}"), &out.values(&q), &want, tol(dt));
        out.assert_outside_untouched(&q);
        a.assert_unchanged(&q);
    }
}

#[test]
fn batched_matmul_matches_reference_with_transposed_operands() {
    let (g, m, k, n) = (3i64, 4i64, 6i64, 5i64);
    // The MLA block's shapes: a stored [M,G,K] (q_nope as [N,B,P]), b a weight stored
    // [G,N,K] read as [G,K,N], out stored [M,G,N].
    batched_matmul_case(
        Layout::Strided { len: m * g * k, offset: 0, strides: vec![k, g * k, 1] },
        Layout::Strided { len: g * n * k, offset: 0, strides: vec![n * k, 1, k] },
        Layout::Strided { len: m * g * n, offset: 0, strides: vec![n, g * n, 1] },
        "batched_matmul_matches_reference_with_transposed_operands",
    );
}

#[test]
fn batched_matmul_matches_reference_when_no_inner_stride_is_one() {
    let (g, k, n) = (3i64, 6i64, 5i64);
    // b stored [K,N,G]: neither of its last two strides is 1.
    batched_matmul_case(
        Layout::Padded,
        Layout::Strided { len: k * n * g, offset: 0, strides: vec![1, n * g, g] },
        Layout::Padded,
        "batched_matmul_matches_reference_when_no_inner_stride_is_one",
    );
}

// ---------------------------------------------------------------- RmsNorm

fn rms_norm_reference(x: &[f64], w: &[f64], d: usize, eps: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(d) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / d as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        out.extend(row.iter().zip(w).map(|(v, w)| v * inv * w));
    }
    out
}

#[test]
fn rms_norm_matches_reference_on_row_strided_views() {
    let q = queue();
    let mut rng = rng("rms_norm_matches_reference_on_row_strided_views");
    let (t, d, eps) = (4i64, 40i64, 1e-5f32);
    for dt in FLOAT_DTYPES {
        let x = Pool::input(&q, &mut rng, dt, &[t, d], Layout::Padded);
        let w = Pool::input(&q, &mut rng, dt, &[d], Layout::Contiguous);
        let out = Pool::output(&q, dt, &[t, d], Layout::Padded);
        rms_norm(&q, &RmsNormArgs { out: out.view(), x: x.view(), weight: w.view(), eps }).unwrap();
        let want = rms_norm_reference(&x.values(&q), &w.values(&q), d as usize, eps as f64);
        assert_close(&format!("RmsNorm {dt}"), &out.values(&q), &want, tol(dt));
        out.assert_outside_untouched(&q);
        x.assert_unchanged(&q);
    }
}

// ---------------------------------------------------------------- LayerNorm

fn layer_norm_reference(x: &[f64], w: &[f64], b: &[f64], d: usize, eps: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(d) {
        let mean = row.iter().sum::<f64>() / d as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
        let inv = 1.0 / (var + eps).sqrt();
        out.extend(row.iter().zip(w).zip(b).map(|((v, w), b)| (v - mean) * inv * w + b));
    }
    out
}

/// Row-strided views, in place and out of place, inputs offset by +3 (so a LayerNorm that
/// forgot to center, or dropped the bias, is far off).
#[test]
fn layer_norm_matches_reference_on_row_strided_views_and_in_place() {
    let q = queue();
    let mut rng = rng("layer_norm_matches_reference_on_row_strided_views_and_in_place");
    let (t, d, eps) = (5i64, 48i64, 1e-6f32);
    for dt in FLOAT_DTYPES {
        // Rows of d inside rows of d + 3, at element 1; values in [2, 4).
        let len = 1 + t * (d + 3);
        let vals: Vec<f64> = (0..len).map(|_| rng.gen_range(2.0..4.0)).collect();
        let x = Pool::with_values(&q, dt, &[t, d], len, 1, vec![d + 3, 1], &vals);
        let w = Pool::input(&q, &mut rng, dt, &[d], Layout::Contiguous);
        let b = Pool::input(&q, &mut rng, dt, &[d], Layout::Contiguous);
        let out = Pool::output(&q, dt, &[t, d], Layout::Padded);
        let args = LayerNormArgs { out: out.view(), x: x.view(), weight: w.view(), bias: b.view(), eps };
        layer_norm(&q, &args).unwrap();
        let want = layer_norm_reference(&x.values(&q), &w.values(&q), &b.values(&q), d as usize, eps as f64);
        assert_close(&format!("LayerNorm {dt}"), &out.values(&q), &want, tol(dt));
        out.assert_outside_untouched(&q);
        x.assert_unchanged(&q);
        // In place gives the same bits.
        layer_norm(&q, &LayerNormArgs { out: x.view(), x: x.view(), ..args }).unwrap();
        assert_eq!(x.values(&q), out.values(&q), "LayerNorm {dt}: in place differs");
    }
}

#[test]
fn rms_norm_in_place_equals_out_of_place() {
    let q = queue();
    let mut rng = rng("rms_norm_in_place_equals_out_of_place");
    let (t, d) = (3i64, 24i64);
    for dt in FLOAT_DTYPES {
        let x = Pool::input(&q, &mut rng, dt, &[t, d], Layout::Padded);
        let x2 =
            Pool::with_values(&q, dt, &[t, d], x.before.len() as i64, x.offset, x.strides.clone(), &x.before);
        let w = Pool::input(&q, &mut rng, dt, &[d], Layout::Contiguous);
        let out = Pool::output(&q, dt, &[t, d], Layout::Contiguous);
        rms_norm(&q, &RmsNormArgs { out: out.view(), x: x.view(), weight: w.view(), eps: 1e-6 }).unwrap();
        rms_norm(&q, &RmsNormArgs { out: x2.view(), x: x2.view(), weight: w.view(), eps: 1e-6 }).unwrap();
        let (a, b) = (out.values(&q), x2.values(&q));
        assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()), "{dt}: in place differs");
        x2.assert_outside_untouched(&q);
    }
}

#[test]
fn rms_norm_rounds_as_the_contract_says() {
    // f32 sum of squares in index order, scale = 1/sqrt(mean + eps) in f32, x * scale
    // rounded to the storage dtype, times the weight, rounded once more: bit for bit.
    let q = queue();
    let mut rng = rng("rms_norm_rounds_as_the_contract_says");
    let (t, d, eps) = (3i64, 33i64, 1e-6f32);
    let round = |dt: DType, v: f32| -> f32 {
        match dt {
            DType::BF16 => half::bf16::from_f32(v).to_f32(),
            DType::F16 => half::f16::from_f32(v).to_f32(),
            _ => v,
        }
    };
    for dt in FLOAT_DTYPES {
        let x = Pool::input(&q, &mut rng, dt, &[t, d], Layout::Contiguous);
        let w = Pool::input(&q, &mut rng, dt, &[d], Layout::Contiguous);
        let out = Pool::output(&q, dt, &[t, d], Layout::Contiguous);
        rms_norm(&q, &RmsNormArgs { out: out.view(), x: x.view(), weight: w.view(), eps }).unwrap();
        let (xv, wv, got) = (x.values(&q), w.values(&q), out.values(&q));
        for r in 0..t as usize {
            let row: Vec<f32> = xv[r * d as usize..(r + 1) * d as usize].iter().map(|&v| v as f32).collect();
            let sum = row.iter().fold(0f32, |acc, v| acc + v * v);
            let scale = 1.0f32 / (sum / d as f32 + eps).sqrt();
            for (c, v) in row.iter().enumerate() {
                let want = round(dt, round(dt, v * scale) * wv[c] as f32);
                let g = got[r * d as usize + c] as f32;
                assert_eq!(g.to_bits(), want.to_bits(), "{dt} [{r},{c}]: {g} vs {want}");
            }
        }
    }
}

// ---------------------------------------------------------------- RopeFromCache

/// Rotates `x` [T,H,R] (logical values) in f64 by the cache rows at `pos`.
fn rope_reference(x: &[f64], shape: [i64; 3], pos: &[i64], cache: &[f64], neox: bool) -> Vec<f64> {
    let [t, h, r] = shape;
    let half = r / 2;
    let mut out = x.to_vec();
    for ti in 0..t {
        let row = &cache[(pos[ti as usize] * r) as usize..((pos[ti as usize] + 1) * r) as usize];
        for hi in 0..h {
            for i in 0..half {
                let (i0, i1) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
                let (c, s) = (row[i as usize], row[(half + i) as usize]);
                let (x0, x1) = (x[at(&[t, h, r], &[ti, hi, i0])], x[at(&[t, h, r], &[ti, hi, i1])]);
                out[at(&[t, h, r], &[ti, hi, i0])] = x0 * c - x1 * s;
                out[at(&[t, h, r], &[ti, hi, i1])] = x1 * c + x0 * s;
            }
        }
    }
    out
}

fn rope_case(neox: bool, with_k: bool, what: &str) {
    let q = queue();
    let mut rng = rng(what);
    let (t, hq, p, r, l, max_pos) = (5i64, 3i64, 4i64, 8i64, 6i64, 16usize);
    let cache = cos_sin_cache(&q, max_pos, r as usize);
    let cache_v = cache.to_f64(&q).unwrap();
    for dt in FLOAT_DTYPES {
        // q: the trailing R columns of each head of a [T, Hq, P+R] buffer.
        let qp = Pool::input(
            &q,
            &mut rng,
            dt,
            &[t, hq, r],
            Layout::Strided { len: t * hq * (p + r), offset: p, strides: vec![hq * (p + r), p + r, 1] },
        );
        // k: the trailing R columns of a [T, L+R] row (MLA's shared k_pe), one head.
        let kp = Pool::input(
            &q,
            &mut rng,
            dt,
            &[t, 1, r],
            Layout::Strided { len: t * (l + r), offset: l, strides: vec![l + r, r, 1] },
        );
        let pos: Vec<i64> = (0..t).map(|_| rng.gen_range(0..max_pos as i64)).collect();
        let positions = i64_buf(&q, &pos);
        let (q0, k0) = (qp.values(&q), kp.values(&q));
        let kv = kp.view();
        rope_from_cache(
            &q,
            &RopeFromCacheArgs {
                query: qp.view(),
                key: (with_k.then_some(&kv)).copied(),
                positions: positions.view(),
                cos_sin_cache: cache.view(),
                is_neox: neox,
            },
        )
        .unwrap();
        let want_q = rope_reference(&q0, [t, hq, r], &pos, &cache_v, neox);
        assert_close(&format!("{what} q {dt}"), &qp.values(&q), &want_q, tol(dt));
        qp.assert_outside_untouched(&q);
        if with_k {
            let want_k = rope_reference(&k0, [t, 1, r], &pos, &cache_v, neox);
            assert_close(&format!("{what} k {dt}"), &kp.values(&q), &want_k, tol(dt));
            kp.assert_outside_untouched(&q);
        } else {
            kp.assert_unchanged(&q);
        }
    }
}

#[test]
fn rope_from_cache_neox_matches_reference_on_head_strided_q_and_k() {
    rope_case(true, true, "rope_from_cache_neox_matches_reference_on_head_strided_q_and_k");
}

#[test]
fn rope_from_cache_gptj_matches_reference_on_head_strided_q_and_k() {
    rope_case(false, true, "rope_from_cache_gptj_matches_reference_on_head_strided_q_and_k");
}

#[test]
fn rope_from_cache_without_k_rotates_only_q() {
    rope_case(false, false, "rope_from_cache_without_k_rotates_only_q");
}

// ---------------------------------------------------------------- FusedNormRope

/// FusedNormRope with neither the query nor the cache write: `kv`'s rows split into the
/// RMS-normed `latent` and the rotated `rope`. One place for the call, so the reference test
/// and the bit-identity test below check the very same call.
#[allow(clippy::too_many_arguments)]
fn norm_rope_only(
    q: &Queue,
    latent: &Pool,
    rope: &Pool,
    kv: &Pool,
    w: &Pool,
    positions: &Buffer,
    cache: &Buffer,
    eps: f32,
    neox: bool,
) {
    fused_norm_rope(
        q,
        &FusedNormRopeArgs {
            latent_out: latent.view(),
            rope_out: rope.view(),
            kv: kv.view(),
            weight: w.view(),
            positions: positions.view(),
            cos_sin_cache: cache.view(),
            eps,
            is_neox: neox,
            query: None,
            cache_write: None,
        },
    )
    .unwrap();
}

#[test]
fn fused_norm_rope_matches_reference() {
    let q = queue();
    let mut rng = rng("fused_norm_rope_matches_reference");
    let (t, l, r, max_pos, eps) = (5i64, 16i64, 8i64, 32usize, 1e-6f32);
    let cache = cos_sin_cache(&q, max_pos, r as usize);
    let cache_v = cache.to_f64(&q).unwrap();
    for neox in [true, false] {
        for dt in FLOAT_DTYPES {
            let kv = Pool::input(&q, &mut rng, dt, &[t, l + r], Layout::Padded);
            let w = Pool::input(&q, &mut rng, dt, &[l], Layout::Contiguous);
            let latent = Pool::output(&q, dt, &[t, l], Layout::Padded);
            let rope = Pool::output(&q, dt, &[t, r], Layout::Padded);
            let pos: Vec<i64> = (0..t).map(|_| rng.gen_range(0..max_pos as i64)).collect();
            let positions = i64_buf(&q, &pos);
            norm_rope_only(&q, &latent, &rope, &kv, &w, &positions, &cache, eps, neox);

            let kvv = kv.values(&q);
            let (lat_in, rope_in): (Vec<f64>, Vec<f64>) = {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                for row in kvv.chunks((l + r) as usize) {
                    a.extend_from_slice(&row[..l as usize]);
                    b.extend_from_slice(&row[l as usize..]);
                }
                (a, b)
            };
            let want_lat = rms_norm_reference(&lat_in, &w.values(&q), l as usize, eps as f64);
            let want_rope = rope_reference(&rope_in, [t, 1, r], &pos, &cache_v, neox);
            assert_close(
                &format!("FusedNormRope latent {dt} neox={neox}"),
                &latent.values(&q),
                &want_lat,
                tol(dt),
            );
            assert_close(
                &format!("FusedNormRope rope {dt} neox={neox}"),
                &rope.values(&q),
                &want_rope,
                tol(dt),
            );
            latent.assert_outside_untouched(&q);
            rope.assert_outside_untouched(&q);
            kv.assert_unchanged(&q);
        }
    }
}

#[test]
fn fused_norm_rope_is_bit_identical_to_rms_norm_then_rope_from_cache() {
    let q = queue();
    let mut rng = rng("fused_norm_rope_is_bit_identical_to_rms_norm_then_rope_from_cache");
    let (t, l, r, max_pos, eps) = (7i64, 32i64, 16i64, 64usize, 1e-6f32);
    let cache = cos_sin_cache(&q, max_pos, r as usize);
    for neox in [true, false] {
        for dt in FLOAT_DTYPES {
            let kv = Pool::input(&q, &mut rng, dt, &[t, l + r], Layout::Padded);
            let w = Pool::input(&q, &mut rng, dt, &[l], Layout::Contiguous);
            let pos: Vec<i64> = (0..t).map(|_| rng.gen_range(0..max_pos as i64)).collect();
            let positions = i64_buf(&q, &pos);

            let latent = Pool::output(&q, dt, &[t, l], Layout::Contiguous);
            let rope = Pool::output(&q, dt, &[t, r], Layout::Contiguous);
            norm_rope_only(&q, &latent, &rope, &kv, &w, &positions, &cache, eps, neox);

            // Split path: RmsNorm on the latent slice, RopeFromCache on a copy of the rope slice.
            let kv_view = kv.view();
            let split_latent = Pool::output(&q, dt, &[t, l], Layout::Contiguous);
            rms_norm(
                &q,
                &RmsNormArgs {
                    out: split_latent.view(),
                    x: kv_view.slice(1, 0, l).unwrap(),
                    weight: w.view(),
                    eps,
                },
            )
            .unwrap();
            let rope_part = q.read_f64(&kv_view.slice(1, l, l + r).unwrap()).unwrap();
            let split_rope = Buffer::from_f64(&q, dt, &[t, 1, r], &rope_part).unwrap();
            rope_from_cache(
                &q,
                &RopeFromCacheArgs {
                    query: split_rope.view(),
                    key: None,
                    positions: positions.view(),
                    cos_sin_cache: cache.view(),
                    is_neox: neox,
                },
            )
            .unwrap();

            let bits = |v: Vec<f64>| v.into_iter().map(f64::to_bits).collect::<Vec<_>>();
            assert_eq!(bits(latent.values(&q)), bits(split_latent.values(&q)), "{dt} neox={neox}: latent");
            assert_eq!(bits(rope.values(&q)), bits(split_rope.to_f64(&q).unwrap()), "{dt} neox={neox}: rope");
        }
    }
}

// ---------------------------------------------------------------- ConcatAndCacheMla

fn concat_and_cache_case(bs: i64, what: &str) {
    let q = queue();
    let mut rng = rng(what);
    let (t, l, r) = (20i64, 12i64, 4i64);
    let w = l + r;
    let nb = (t + bs - 1) / bs + 2;
    for dt in FLOAT_DTYPES {
        let kv_c = Pool::input(&q, &mut rng, dt, &[t, l], Layout::Padded);
        let k_pe = Pool::input(&q, &mut rng, dt, &[t, r], Layout::Padded);
        // The cache: blocks 1..=NB of a pool of NB+2 blocks with rows of W+2.
        let cache = Pool::output(
            &q,
            dt,
            &[nb, bs, w],
            Layout::Strided {
                len: (nb + 2) * bs * (w + 2),
                offset: bs * (w + 2),
                strides: vec![bs * (w + 2), w + 2, 1],
            },
        );
        let mut all: Vec<i64> = (0..nb * bs).collect();
        all.shuffle(&mut rng);
        let mut slots: Vec<i64> = all[..t as usize].to_vec();
        for (i, s) in slots.iter_mut().enumerate() {
            if i % 5 == 3 {
                *s = -1 - i as i64; // padding
            }
        }
        slots[(t - 1) as usize] = slots[1]; // a repeated slot: the last token wins
        let slot_buf = i64_buf(&q, &slots);
        concat_and_cache_mla(
            &q,
            &ConcatAndCacheMlaArgs {
                kv_c: kv_c.view(),
                k_pe: k_pe.view(),
                cache: cache.view(),
                slot_mapping: slot_buf.view(),
            },
        )
        .unwrap();

        let (kc, kp) = (kv_c.values(&q), k_pe.values(&q));
        let mut want = vec![f64::NAN; (nb * bs * w) as usize];
        for (ti, &s) in slots.iter().enumerate() {
            if s < 0 {
                continue;
            }
            let row = (s * w) as usize; // [NB, BS, W] row-major: slot s is row s
            for c in 0..l as usize {
                want[row + c] = kc[ti * l as usize + c];
            }
            for c in 0..r as usize {
                want[row + l as usize + c] = kp[ti * r as usize + c];
            }
        }
        let got = cache.values(&q);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(same(*g, *w), "{what} {dt}: cache element {i} is {g}, expected {w}");
        }
        cache.assert_outside_untouched(&q);
    }
}

#[test]
fn concat_and_cache_mla_matches_reference_with_block_size_1() {
    concat_and_cache_case(1, "concat_and_cache_mla_matches_reference_with_block_size_1");
}

#[test]
fn concat_and_cache_mla_matches_reference_with_block_size_16() {
    concat_and_cache_case(16, "concat_and_cache_mla_matches_reference_with_block_size_16");
}

#[test]
fn concat_and_cache_mla_matches_reference_with_block_size_64() {
    concat_and_cache_case(64, "concat_and_cache_mla_matches_reference_with_block_size_64");
}

// ---------------------------------------------------------------- GatherMlaCache

fn gather_case(bs: i64, with_starts: bool, what: &str) {
    let q = queue();
    let mut rng = rng(what);
    let d = 20i64;
    let lens: Vec<i64> = vec![rng.gen_range(1..=40), 0, rng.gen_range(1..=40), bs + 1];
    let starts: Vec<i64> = lens.iter().map(|_| if with_starts { rng.gen_range(0..10) } else { 0 }).collect();
    let b = lens.len() as i64;
    let mb = lens.iter().zip(&starts).map(|(l, s)| (l + s + bs - 1) / bs).max().unwrap().max(1);
    let nb = b * mb + 1;
    let mut ids: Vec<i32> = (0..nb as i32).collect();
    ids.shuffle(&mut rng);
    let table: Vec<i32> = ids[..(b * mb) as usize].to_vec();
    let mut cu = vec![0i32];
    for l in &lens {
        cu.push(cu.last().unwrap() + *l as i32);
    }
    let t_ws = *cu.last().unwrap() as i64 + 2; // two rows past cu[B] stay untouched
    let bt_buf = i32_buf(&q, &[b, mb], &table);
    let cu_buf = i32_buf(&q, &[b + 1], &cu);
    let starts32: Vec<i32> = starts.iter().map(|&s| s as i32).collect();
    let starts_buf = i32_buf(&q, &[b], &starts32);
    for dt in FLOAT_DTYPES {
        let cache = Pool::input(
            &q,
            &mut rng,
            dt,
            &[nb, bs, d],
            Layout::Strided {
                len: (nb + 1) * bs * (d + 3),
                offset: bs * (d + 3),
                strides: vec![bs * (d + 3), d + 3, 1],
            },
        );
        let out = Pool::output(&q, dt, &[t_ws, d], Layout::Padded);
        let sv = starts_buf.view();
        gather_mla_cache(
            &q,
            &GatherMlaCacheArgs {
                out: out.view(),
                cache: cache.view(),
                block_table: bt_buf.view(),
                cu_seq_lens: cu_buf.view(),
                seq_starts: (with_starts.then_some(&sv)).copied(),
            },
        )
        .unwrap();

        let cv = cache.values(&q);
        let mut want = vec![f64::NAN; (t_ws * d) as usize];
        for bi in 0..b as usize {
            for (blk_i, &id) in table[bi * mb as usize..(bi + 1) * mb as usize].iter().enumerate() {
                for rr in 0..bs {
                    let p = blk_i as i64 * bs + rr;
                    if p < starts[bi] || p >= starts[bi] + lens[bi] {
                        continue;
                    }
                    let dst = (cu[bi] as i64 + p - starts[bi]) * d;
                    let src = at(&[nb, bs, d], &[id as i64, rr, 0]);
                    for c in 0..d {
                        want[(dst + c) as usize] = cv[src + c as usize];
                    }
                }
            }
        }
        let got = out.values(&q);
        let filled = (*cu.last().unwrap() as i64 * d) as usize;
        assert!(got[..filled].iter().all(|v| !v.is_nan()), "{what} {dt}: a gathered row is unwritten");
        assert!(
            got[filled..].iter().all(|v| v.is_nan()),
            "{what} {dt}: rows past cu_seq_lens[B] were written"
        );
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(same(*g, *w), "{what} {dt}: out element {i} is {g}, expected {w}");
        }
        out.assert_outside_untouched(&q);
        cache.assert_unchanged(&q);
    }
}

#[test]
fn gather_mla_cache_matches_reference_with_block_size_1() {
    gather_case(1, false, "gather_mla_cache_matches_reference_with_block_size_1");
}

#[test]
fn gather_mla_cache_matches_reference_with_block_size_16() {
    gather_case(16, false, "gather_mla_cache_matches_reference_with_block_size_16");
}

#[test]
fn gather_mla_cache_matches_reference_with_block_size_64() {
    gather_case(64, false, "gather_mla_cache_matches_reference_with_block_size_64");
}

#[test]
fn gather_mla_cache_with_seq_starts_matches_reference_with_block_sizes_1_16_64() {
    for bs in [1, 16, 64] {
        gather_case(bs, true, "gather_mla_cache_with_seq_starts_matches_reference");
    }
}

// ---------------------------------------------------------------- ConcatMlaNopeRope

fn concat_nope_rope_case(broadcast: bool, what: &str) {
    let q = queue();
    let mut rng = rng(what);
    let (t, n, p, r, l) = (3i64, 4i64, 6i64, 4i64, 5i64);
    let rn = if broadcast { 1 } else { n };
    for dt in FLOAT_DTYPES {
        // nope transposed: stored [N,T,P], read as [T,N,P].
        let nope = Pool::input(
            &q,
            &mut rng,
            dt,
            &[t, n, p],
            Layout::Strided { len: n * t * p, offset: 0, strides: vec![p, t * p, 1] },
        );
        let rope = if broadcast {
            // The trailing R columns of a [T, L+R] row.
            Pool::input(
                &q,
                &mut rng,
                dt,
                &[t, 1, r],
                Layout::Strided { len: t * (l + r), offset: l, strides: vec![l + r, r, 1] },
            )
        } else {
            Pool::input(&q, &mut rng, dt, &[t, n, r], Layout::Padded)
        };
        let out = Pool::output(&q, dt, &[t, n, p + r], Layout::Padded);
        concat_mla_nope_rope(
            &q,
            &ConcatMlaNopeRopeArgs { out: out.view(), nope: nope.view(), rope: rope.view() },
        )
        .unwrap();

        let (nv, rv) = (nope.values(&q), rope.values(&q));
        let mut want = Vec::new();
        for ti in 0..t {
            for h in 0..n {
                want.extend((0..p).map(|c| nv[at(&[t, n, p], &[ti, h, c])]));
                want.extend((0..r).map(|c| rv[at(&[t, rn, r], &[ti, if broadcast { 0 } else { h }, c])]));
            }
        }
        let got = out.values(&q);
        assert!(got.iter().zip(&want).all(|(g, w)| g == w), "{what} {dt}: not an exact copy");
        out.assert_outside_untouched(&q);
    }
}

#[test]
fn concat_mla_nope_rope_broadcasts_a_single_rope_head_over_transposed_nope() {
    concat_nope_rope_case(true, "concat_mla_nope_rope_broadcasts_a_single_rope_head_over_transposed_nope");
}

#[test]
fn concat_mla_nope_rope_with_per_head_rope_matches_reference() {
    concat_nope_rope_case(false, "concat_mla_nope_rope_with_per_head_rope_matches_reference");
}

// ---------------------------------------------------------------- MlaDecodeAttention

struct DecodeRun {
    out: Vec<f64>,
    lse: Option<Vec<f64>>,
    want_out: Vec<f64>,
    want_lse: Vec<f64>,
}

/// Runs decode attention on random data and the f64 reference; `lens` are seq_lens.
fn decode_run(
    q: &Queue,
    rng: &mut impl Rng,
    dt: DType,
    bs: i64,
    sq: i64,
    lens: &[i64],
    with_lse: bool,
) -> DecodeRun {
    let (n, d, dv) = (4i64, 24i64, 16i64);
    let b = lens.len() as i64;
    let mb = lens.iter().map(|l| (l + bs - 1) / bs).max().unwrap().max(1);
    let nb = b * mb + 1;
    let mut ids: Vec<i32> = (0..nb as i32).collect();
    ids.shuffle(rng);
    let table: Vec<i32> = ids[..(b * mb) as usize].to_vec();
    let bt = i32_buf(q, &[b, mb], &table);
    let lens32: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
    let seq_lens = i32_buf(q, &[b], &lens32);
    // The cache: blocks 1..=NB of a pool with rows of D+4.
    let cache = Pool::input(
        q,
        rng,
        dt,
        &[nb, bs, d],
        Layout::Strided {
            len: (nb + 1) * bs * (d + 4),
            offset: bs * (d + 4),
            strides: vec![bs * (d + 4), d + 4, 1],
        },
    );
    let qp = Pool::input(q, rng, dt, &[b, sq, n, d], Layout::Padded);
    let out = Pool::output(q, dt, &[b, sq, n, dv], Layout::Padded);
    let lse = Pool::output(q, DType::F32, &[b, n, sq], Layout::Padded);
    let scale = 1.5 / (d as f32).sqrt();
    let lse_view = lse.view();
    mla_decode_attention(
        q,
        &MlaDecodeAttentionArgs {
            out: out.view(),
            lse: (with_lse.then_some(&lse_view)).copied(),
            query: qp.view(),
            cache: cache.view(),
            block_table: bt.view(),
            seq_lens: seq_lens.view(),
            scale,
        },
    )
    .unwrap();
    out.assert_outside_untouched(q);
    lse.assert_outside_untouched(q);
    cache.assert_unchanged(q);
    if !with_lse {
        lse.assert_unchanged(q);
    }

    let (cv, qv) = (cache.values(q), qp.values(q));
    let mut want_out = vec![0f64; (b * sq * n * dv) as usize];
    let mut want_lse = vec![f64::NEG_INFINITY; (b * n * sq) as usize];
    for bi in 0..b {
        let len = lens[bi as usize];
        let key = |j: i64| at(&[nb, bs, d], &[table[(bi * mb + j / bs) as usize] as i64, j % bs, 0]);
        for h in 0..n {
            for s in 0..sq {
                let visible = len - sq + s + 1;
                if visible <= 0 {
                    continue;
                }
                let qrow = at(&[b, sq, n, d], &[bi, s, h, 0]);
                let logits: Vec<f64> = (0..visible)
                    .map(|j| {
                        scale as f64 * (0..d as usize).map(|c| qv[qrow + c] * cv[key(j) + c]).sum::<f64>()
                    })
                    .collect();
                let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let denom: f64 = logits.iter().map(|l| (l - m).exp()).sum();
                want_lse[at(&[b, n, sq], &[bi, h, s])] = m + denom.ln();
                for c in 0..dv {
                    let o: f64 =
                        (0..visible).map(|j| (logits[j as usize] - m).exp() * cv[key(j) + c as usize]).sum();
                    want_out[at(&[b, sq, n, dv], &[bi, s, h, c])] = o / denom;
                }
            }
        }
    }
    DecodeRun { out: out.values(q), lse: with_lse.then(|| lse.values(q)), want_out, want_lse }
}

fn decode_case(bs: i64, what: &str) {
    let q = queue();
    let mut rng = rng(what);
    for dt in FLOAT_DTYPES {
        for sq in [1, 2] {
            // An empty sequence, one shorter than s_q for s_q = 2, one spanning 2+ blocks, one random.
            let lens = [0, 1, (2 * bs + 3).min(131), rng.gen_range(2..=80)];
            let r = decode_run(&q, &mut rng, dt, bs, sq, &lens, true);
            assert_close(&format!("{what} out {dt} s_q={sq}"), &r.out, &r.want_out, tol(dt));
            assert_lse_close(&format!("{what} lse {dt} s_q={sq}"), &r.lse.unwrap(), &r.want_lse, 1e-5);
        }
    }
}

#[test]
fn decode_attention_matches_reference_with_block_size_1() {
    decode_case(1, "decode_attention_matches_reference_with_block_size_1");
}

#[test]
fn decode_attention_matches_reference_with_block_size_16() {
    decode_case(16, "decode_attention_matches_reference_with_block_size_16");
}

#[test]
fn decode_attention_matches_reference_with_block_size_64() {
    decode_case(64, "decode_attention_matches_reference_with_block_size_64");
}

#[test]
fn decode_attention_without_lse_matches_reference() {
    let q = queue();
    let mut rng = rng("decode_attention_without_lse_matches_reference");
    for dt in FLOAT_DTYPES {
        let r = decode_run(&q, &mut rng, dt, 16, 2, &[5, 33], false);
        assert_close(&format!("decode without lse {dt}"), &r.out, &r.want_out, tol(dt));
    }
}

#[test]
fn decode_attention_query_that_sees_no_key_gets_zero_and_minus_inf_lse() {
    let q = queue();
    let mut rng = rng("decode_attention_query_that_sees_no_key_gets_zero_and_minus_inf_lse");
    let (n, dv) = (4usize, 16usize);
    for dt in FLOAT_DTYPES {
        // Sequence 0 is empty; sequence 1 holds 1 token, so with s_q = 2 its first query sees none.
        let r = decode_run(&q, &mut rng, dt, 16, 2, &[0, 1], true);
        let lse = r.lse.unwrap();
        let out_at =
            |b: usize, s: usize, h: usize| &r.out[((b * 2 + s) * n + h) * dv..((b * 2 + s) * n + h + 1) * dv];
        for h in 0..n {
            for s in 0..2 {
                assert!(out_at(0, s, h).iter().all(|&v| v == 0.0), "{dt}: empty sequence out must be 0");
                assert_eq!(lse[(h) * 2 + s], f64::NEG_INFINITY, "{dt}: empty sequence lse");
            }
            assert!(
                out_at(1, 0, h).iter().all(|&v| v == 0.0),
                "{dt}: query 0 of a 1-token sequence sees nothing"
            );
            assert_eq!(lse[(n + h) * 2], f64::NEG_INFINITY);
            assert!(lse[(n + h) * 2 + 1].is_finite());
        }
        assert_close(&format!("decode empty {dt}"), &r.out, &r.want_out, tol(dt));
    }
}

// ---------------------------------------------------------------- PrefillAttention

fn prefill_case(causal: bool, with_lse: bool, what: &str) {
    let q = queue();
    let mut rng = rng(what);
    let (n, d, dv) = (3i64, 12i64, 8i64);
    // (lq, lk): equal, chunked (fewer queries than keys), more queries than keys (causal:
    // the first ones see nothing), no queries, no keys, random.
    let seqs = [(5i64, 5i64), (3, 8), (4, 2), (0, 3), (2, 0), (rng.gen_range(1..10), rng.gen_range(1..10))];
    let (mut cu_q, mut cu_k) = (vec![0i32], vec![0i32]);
    for (lq, lk) in seqs {
        cu_q.push(cu_q.last().unwrap() + lq as i32);
        cu_k.push(cu_k.last().unwrap() + lk as i32);
    }
    let used_q = *cu_q.last().unwrap() as i64;
    let (tq, tk) = (used_q + 2, *cu_k.last().unwrap() as i64 + 1);
    let b = seqs.len() as i64;
    let cu_q_buf = i32_buf(&q, &[b + 1], &cu_q);
    let cu_k_buf = i32_buf(&q, &[b + 1], &cu_k);
    let max_q = seqs.iter().map(|s| s.0).max().unwrap();
    let scale = 1.0 / (d as f32).sqrt();
    for dt in FLOAT_DTYPES {
        let qp = Pool::input(&q, &mut rng, dt, &[tq, n, d], Layout::Padded);
        // k and v: column slices of one [Tk, N, D+Dv+1] up-projection output.
        let w = d + dv + 1;
        let kp = Pool::input(
            &q,
            &mut rng,
            dt,
            &[tk, n, d],
            Layout::Strided { len: tk * n * w, offset: 0, strides: vec![n * w, w, 1] },
        );
        let kv_vals = kp.before.clone();
        let vp = Pool::with_values(&q, dt, &[tk, n, dv], tk * n * w, d, vec![n * w, w, 1], &kv_vals);
        let out = Pool::output(&q, dt, &[tq, n, dv], Layout::Padded);
        let lse = Pool::output(&q, DType::F32, &[n, tq], Layout::Padded);
        let args = PrefillAttentionArgs {
            out: out.view(),
            lse: with_lse.then(|| lse.view()),
            query: qp.view(),
            k: kp.view(),
            v: vp.view(),
            cu_seqlens_q: cu_q_buf.view(),
            cu_seqlens_k: cu_k_buf.view(),
            max_seqlen_q: max_q,
            causal,
            scale,
        };
        prefill_attention(&q, &args).unwrap();

        let (qv, kv, vv) = (qp.values(&q), kp.values(&q), vp.values(&q));
        let mut want_out = vec![0f64; (used_q * n * dv) as usize];
        let mut want_lse = vec![f64::NEG_INFINITY; (n * used_q) as usize];
        for (bi, &(lq, lk)) in seqs.iter().enumerate() {
            let (q0, k0) = (cu_q[bi] as i64, cu_k[bi] as i64);
            for h in 0..n {
                for i in 0..lq {
                    let visible = if causal { (lk - lq + i + 1).clamp(0, lk) } else { lk };
                    if visible == 0 {
                        continue;
                    }
                    let logits: Vec<f64> = (0..visible)
                        .map(|j| {
                            let dotp: f64 = (0..d)
                                .map(|c| {
                                    qv[at(&[tq, n, d], &[q0 + i, h, c])]
                                        * kv[at(&[tk, n, d], &[k0 + j, h, c])]
                                })
                                .sum();
                            dotp * scale as f64
                        })
                        .collect();
                    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let p: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
                    let z: f64 = p.iter().sum();
                    want_lse[(h * used_q + q0 + i) as usize] = m + z.ln();
                    for c in 0..dv {
                        let o: f64 =
                            (0..visible).map(|j| p[j as usize] * vv[at(&[tk, n, dv], &[k0 + j, h, c])]).sum();
                        want_out[at(&[tq, n, dv], &[q0 + i, h, c])] = o / z;
                    }
                }
            }
        }
        let got = out.values(&q);
        let used = (used_q * n * dv) as usize;
        assert_close(&format!("{what} out {dt}"), &got[..used], &want_out, tol(dt));
        assert!(
            got[used..].iter().all(|v| v.is_nan()),
            "{what} {dt}: rows past cu_seqlens_q[B] were written"
        );
        out.assert_outside_untouched(&q);
        lse.assert_outside_untouched(&q);
        qp.assert_unchanged(&q);
        kp.assert_unchanged(&q);
        if with_lse {
            let lv = lse.values(&q);
            let mut got_lse = Vec::new();
            for h in 0..n {
                let row = &lv[(h * tq) as usize..((h + 1) * tq) as usize];
                got_lse.extend_from_slice(&row[..used_q as usize]);
                assert!(
                    row[used_q as usize..].iter().all(|v| v.is_nan()),
                    "{what} {dt}: lse past cu_seqlens_q[B] written"
                );
            }
            assert_lse_close(&format!("{what} lse {dt}"), &got_lse, &want_lse, 1e-5);
        } else {
            lse.assert_unchanged(&q);
        }
    }
}

#[test]
fn prefill_attention_causal_matches_reference_with_lse() {
    prefill_case(true, true, "prefill_attention_causal_matches_reference_with_lse");
}

#[test]
fn prefill_attention_non_causal_matches_reference_with_lse() {
    prefill_case(false, true, "prefill_attention_non_causal_matches_reference_with_lse");
}

#[test]
fn prefill_attention_causal_without_lse_matches_reference() {
    prefill_case(true, false, "prefill_attention_causal_without_lse_matches_reference");
}

// ---------------------------------------------------------------- MergeAttnStates

/// `empty(h, t)` gives overrides (e.g. +-inf) for the prefix and suffix lse of one entry.
fn merge_case(
    what: &str,
    empty: impl Fn(i64, i64) -> (Option<f64>, Option<f64>),
) -> Vec<(DType, Vec<f64>, Vec<f64>)> {
    let q = queue();
    let mut rng = rng(what);
    let (t, n, v) = (6i64, 3i64, 8i64);
    let mut results = Vec::new();
    for dt in FLOAT_DTYPES {
        let prefix = Pool::input(&q, &mut rng, dt, &[t, n, v], Layout::Padded);
        let suffix = Pool::input(&q, &mut rng, dt, &[t, n, v], Layout::Padded);
        let (mut lp, mut ls) = (Vec::new(), Vec::new());
        for h in 0..n {
            for ti in 0..t {
                let (op, os) = empty(h, ti);
                // Wide range, so one side can dominate entirely.
                lp.push(op.unwrap_or_else(|| rng.gen_range(-6.0..6.0)));
                ls.push(os.unwrap_or_else(|| rng.gen_range(-6.0..6.0)));
            }
        }
        let plse = Pool::with_values(&q, DType::F32, &[n, t], n * t, 0, vec![t, 1], &lp);
        let slse = Pool::with_values(&q, DType::F32, &[n, t], n * t, 0, vec![t, 1], &ls);
        let out = Pool::output(&q, dt, &[t, n, v], Layout::Padded);
        let out_lse = Pool::output(&q, DType::F32, &[n, t], Layout::Padded);
        let args = MergeAttnStatesArgs {
            out: out.view(),
            out_lse: Some(out_lse.view()),
            prefix: prefix.view(),
            prefix_lse: plse.view(),
            suffix: suffix.view(),
            suffix_lse: slse.view(),
        };
        merge_attn_states(&q, &args).unwrap();

        let (pv, sv, lpv, lsv) = (prefix.values(&q), suffix.values(&q), plse.values(&q), slse.values(&q));
        let mut want = vec![0f64; (t * n * v) as usize];
        let mut want_lse = vec![0f64; (n * t) as usize];
        for ti in 0..t {
            for h in 0..n {
                let (a, b) = (lpv[(h * t + ti) as usize], lsv[(h * t + ti) as usize]);
                let (pe, se) = (a.is_infinite(), b.is_infinite());
                let lse = match (pe, se) {
                    (true, true) => f64::NEG_INFINITY,
                    (true, false) => b,
                    (false, true) => a,
                    (false, false) => a.max(b) + (-(a - b).abs()).exp().ln_1p(),
                };
                want_lse[(h * t + ti) as usize] = lse;
                for c in 0..v {
                    let i = at(&[t, n, v], &[ti, h, c]);
                    let wp = if pe { 0.0 } else { (a - lse).exp() };
                    let ws = if se { 0.0 } else { (b - lse).exp() };
                    want[i] = if pe && se { 0.0 } else { wp * pv[i] + ws * sv[i] };
                }
            }
        }
        let (got, got_lse) = (out.values(&q), out_lse.values(&q));
        assert_close(&format!("{what} out {dt}"), &got, &want, tol(dt));
        assert_lse_close(&format!("{what} lse {dt}"), &got_lse, &want_lse, 1e-5);
        out.assert_outside_untouched(&q);
        out_lse.assert_outside_untouched(&q);
        results.push((dt, got, got_lse));
    }
    results
}

#[test]
fn merge_attn_states_matches_reference() {
    merge_case("merge_attn_states_matches_reference", |_, _| (None, None));
}

#[test]
fn merge_attn_states_with_an_empty_prefix_returns_the_suffix() {
    // -inf on heads 0 and 1, +inf (also "empty" upstream) on head 2.
    let inf = |h: i64| if h == 2 { f64::INFINITY } else { f64::NEG_INFINITY };
    merge_case("merge_attn_states_with_an_empty_prefix_returns_the_suffix", |h, t| {
        (if t % 2 == 0 { Some(inf(h)) } else { None }, None)
    });
}

#[test]
fn merge_attn_states_with_an_empty_suffix_returns_the_prefix() {
    let inf = |h: i64| if h == 2 { f64::INFINITY } else { f64::NEG_INFINITY };
    merge_case("merge_attn_states_with_an_empty_suffix_returns_the_prefix", |h, t| {
        (None, if t % 2 == 1 { Some(inf(h)) } else { None })
    });
}

#[test]
fn merge_attn_states_with_both_sides_empty_gives_zero_and_minus_inf_lse() {
    let results =
        merge_case("merge_attn_states_with_both_sides_empty_gives_zero_and_minus_inf_lse", |h, t| {
            if t < 3 {
                (Some(f64::NEG_INFINITY), Some(if h == 0 { f64::INFINITY } else { f64::NEG_INFINITY }))
            } else {
                (None, None)
            }
        });
    let (t, n, v) = (6usize, 3usize, 8usize);
    for (dt, out, lse) in results {
        for ti in 0..3 {
            for h in 0..n {
                let o = &out[(ti * n + h) * v..(ti * n + h + 1) * v];
                assert!(o.iter().all(|&x| x == 0.0), "{dt}: both empty must give 0");
                assert_eq!(lse[h * t + ti], f64::NEG_INFINITY, "{dt}: both empty must give -inf");
            }
        }
    }
}

// ---------------------------------------------------------------- writes stay inside outputs

#[test]
fn ops_writing_into_a_slice_of_a_larger_buffer_leave_everything_outside_untouched() {
    let q = queue();
    let mut rng = rng("ops_writing_into_a_slice_of_a_larger_buffer_leave_everything_outside_untouched");
    for dt in FLOAT_DTYPES {
        // MatmulBT into columns 5..12 of rows 1..5 of a sentinel-filled [6, 15] buffer.
        let (m, k, n) = (4i64, 9i64, 7i64);
        let a = Pool::input(&q, &mut rng, dt, &[m, k], Layout::Contiguous);
        let b = Pool::input(&q, &mut rng, dt, &[n, k], Layout::Contiguous);
        let out = Pool::output(
            &q,
            dt,
            &[m, n],
            Layout::Strided { len: 6 * 15, offset: 15 + 5, strides: vec![15, 1] },
        );
        matmul_bt(&q, &MatmulBTArgs { out: out.view(), a: a.view(), b: b.view() }).unwrap();
        out.assert_outside_untouched(&q);
        assert!(out.values(&q).iter().all(|v| !v.is_nan()));

        // RmsNorm in place on columns 3..19 of a [4, 24] buffer of random values: the
        // other columns keep their values.
        let x = Pool::input(
            &q,
            &mut rng,
            dt,
            &[4, 16],
            Layout::Strided { len: 4 * 24, offset: 3, strides: vec![24, 1] },
        );
        let w = Pool::input(&q, &mut rng, dt, &[16], Layout::Contiguous);
        rms_norm(&q, &RmsNormArgs { out: x.view(), x: x.view(), weight: w.view(), eps: 1e-6 }).unwrap();
        x.assert_outside_untouched(&q);

        // ConcatMlaNopeRope into every other head of a [2, 6, 10] buffer.
        let nope = Pool::input(&q, &mut rng, dt, &[2, 3, 6], Layout::Contiguous);
        let rope = Pool::input(&q, &mut rng, dt, &[2, 1, 4], Layout::Contiguous);
        let out = Pool::output(
            &q,
            dt,
            &[2, 3, 10],
            Layout::Strided { len: 2 * 6 * 10, offset: 10, strides: vec![60, 20, 1] },
        );
        concat_mla_nope_rope(
            &q,
            &ConcatMlaNopeRopeArgs { out: out.view(), nope: nope.view(), rope: rope.view() },
        )
        .unwrap();
        out.assert_outside_untouched(&q);
        assert!(out.values(&q).iter().all(|v| !v.is_nan()));
    }
}
