//! DeepSeek-V3.2's sparse MLA ops on the CPU against naive f64 code: SparseMlaAttention
//! (float and fp8_ds_mla caches, -1 entries, repeated slots, a row with no slot, strided
//! views) and IndexerTopK (scores, order, ties, padding, causal visibility), plus
//! CacheIndexerKeys (rows by slot, padding, a repeated slot), and malformed arguments for
//! the three entry points.

mod common;

use common::*;
use rand::seq::SliceRandom;
use rand::Rng;
use vt_core::fp8_ds_mla::{decode_row, encode_row, DECODED, LATENT, ROPE, ROW_BYTES};
use vt_core::*;

/// Logical (row-major) index into a flat vector of `shape`.
fn at(shape: &[i64], idx: &[i64]) -> usize {
    let mut off = 0;
    for (s, i) in shape.iter().zip(idx) {
        off = off * s + i;
    }
    off as usize
}

/// The f64 attention of one query row over the keys `rows` (each listed once per entry).
fn naive_attend(q: &[f64], rows: &[&[f64]], scale: f64, dv: usize) -> (Vec<f64>, f64) {
    if rows.is_empty() {
        return (vec![0.0; dv], f64::NEG_INFINITY);
    }
    let logits: Vec<f64> =
        rows.iter().map(|k| scale * q.iter().zip(*k).map(|(a, b)| a * b).sum::<f64>()).collect();
    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let denom: f64 = logits.iter().map(|l| (l - m).exp()).sum();
    let out =
        (0..dv).map(|c| rows.iter().zip(&logits).map(|(k, l)| (l - m).exp() * k[c]).sum::<f64>() / denom);
    (out.collect(), m + denom.ln())
}

/// Index rows `[T, topk]` over `slots` slots: row 0 all -1, the others random slots with
/// some -1 entries and some repeats.
fn random_indices(rng: &mut impl Rng, t: i64, topk: i64, slots: i64) -> Vec<i32> {
    let mut v = Vec::new();
    for ti in 0..t {
        let mut row: Vec<i32> = (0..topk).map(|_| rng.gen_range(0..slots) as i32).collect();
        if ti == 0 {
            row.fill(-1);
        } else {
            for i in 0..topk as usize {
                match rng.gen_range(0..6) {
                    0 => row[i] = -1,
                    1 => row[i] = row[rng.gen_range(0..topk as usize)],
                    _ => {}
                }
            }
        }
        v.extend(row);
    }
    v
}

/// A float cache `[nb, bs, d]` as blocks 1..=nb of a pool with rows of d + 4.
fn float_cache(q: &Queue, rng: &mut impl Rng, dt: DType, nb: i64, bs: i64, d: i64) -> Pool {
    let strides = vec![bs * (d + 4), d + 4, 1];
    Pool::input(
        q,
        rng,
        dt,
        &[nb, bs, d],
        Layout::Strided { len: (nb + 1) * bs * (d + 4), offset: bs * (d + 4), strides },
    )
}

/// The naive reference of SparseMlaAttention: `keys(s)` is slot s's decoded row.
fn sparse_reference(
    qv: &[f64],
    (t, n, d, dv): (i64, i64, i64, i64),
    idx: &[i32],
    topk: i64,
    keys: &dyn Fn(i64) -> Vec<f64>,
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0f64; (t * n * dv) as usize];
    let mut lse = vec![0f64; (n * t) as usize];
    for ti in 0..t {
        let listed: Vec<Vec<f64>> = (0..topk)
            .map(|k| idx[(ti * topk + k) as usize])
            .filter(|&s| s >= 0)
            .map(|s| keys(s as i64))
            .collect();
        let rows: Vec<&[f64]> = listed.iter().map(|r| r.as_slice()).collect();
        for h in 0..n {
            let qrow = &qv[at(&[t, n, d], &[ti, h, 0])..][..d as usize];
            let (o, l) = naive_attend(qrow, &rows, scale, dv as usize);
            out[at(&[t, n, dv], &[ti, h, 0])..][..dv as usize].copy_from_slice(&o);
            lse[at(&[n, t], &[h, ti])] = l;
        }
    }
    (out, lse)
}

#[test]
fn sparse_mla_attention_matches_reference_on_a_float_cache() {
    let q = queue();
    let mut rng = rng("sparse_mla_attention_matches_reference_on_a_float_cache");
    let (t, n, d, dv, topk) = (6i64, 4i64, 24i64, 16i64, 11i64);
    for dt in FLOAT_DTYPES {
        for bs in [1, 16] {
            let nb = 40 / bs + 1;
            let cache = float_cache(&q, &mut rng, dt, nb, bs, d);
            let qp = Pool::input(&q, &mut rng, dt, &[t, n, d], Layout::Padded);
            let out = Pool::output(&q, dt, &[t, n, dv], Layout::Padded);
            // lse stored [T, N] and passed as the contract's [N, T].
            let lse = Pool::output(
                &q,
                DType::F32,
                &[n, t],
                Layout::Strided { len: t * n + 3, offset: 3, strides: vec![1, n] },
            );
            let idx = random_indices(&mut rng, t, topk, nb * bs);
            let indices = i32_buf(&q, &[t, topk], &idx);
            let scale = 1.5 / (d as f32).sqrt();
            sparse_mla_attention(
                &q,
                &SparseMlaAttentionArgs {
                    out: out.view(),
                    lse: Some(lse.view()),
                    query: qp.view(),
                    cache: cache.view(),
                    indices: indices.view(),
                    scale,
                },
            )
            .unwrap();
            out.assert_outside_untouched(&q);
            lse.assert_outside_untouched(&q);
            cache.assert_unchanged(&q);
            let cv = cache.values(&q);
            let keys = |s: i64| cv[at(&[nb, bs, d], &[s / bs, s % bs, 0])..][..d as usize].to_vec();
            let (want, want_lse) =
                sparse_reference(&qp.values(&q), (t, n, d, dv), &idx, topk, &keys, scale as f64);
            let got = out.values(&q);
            assert!(got[..(n * dv) as usize].iter().all(|&v| v == 0.0), "row 0 lists no slot: out must be 0");
            assert_close(&format!("sparse out {dt} bs {bs}"), &got, &want, tol(dt));
            assert_lse_close(&format!("sparse lse {dt} bs {bs}"), &lse.values(&q), &want_lse, 1e-5);
        }
    }
}

#[test]
fn sparse_mla_attention_matches_reference_on_an_fp8_cache() {
    let q = queue();
    let mut rng = rng("sparse_mla_attention_matches_reference_on_an_fp8_cache");
    let (t, n, topk, nb, bs) = (4i64, 4i64, 20i64, 3i64, 16i64);
    let (d, dv, w) = (DECODED as i64, LATENT as i64, ROW_BYTES as i64);
    let mut bytes = Vec::new();
    let mut decoded = Vec::new();
    for _ in 0..nb * bs {
        let mag = 2f32.powi(rng.gen_range(-3..=3));
        let lat: [f32; LATENT] = std::array::from_fn(|_| rng.gen_range(-1.0..1.0) * mag);
        let rope: [f32; ROPE] = std::array::from_fn(|_| rng.gen_range(-1.0..1.0));
        let mut row = [0u8; ROW_BYTES];
        encode_row(&lat, &rope, &mut row);
        let mut vals = [0f32; DECODED];
        decode_row(&row, &mut vals);
        bytes.extend(row.iter().map(|&b| b as f64));
        decoded.push(vals.map(|v| v as f64).to_vec());
    }
    let cache =
        Pool::with_values(&q, DType::Fp8DsMla, &[nb, bs, w], nb * bs * w, 0, vec![bs * w, w, 1], &bytes);
    let idx = random_indices(&mut rng, t, topk, nb * bs);
    let indices = i32_buf(&q, &[t, topk], &idx);
    for dt in FLOAT_DTYPES {
        let qp = Pool::input(&q, &mut rng, dt, &[t, n, d], Layout::Padded);
        let out = Pool::output(&q, dt, &[t, n, dv], Layout::Padded);
        let lse = Pool::output(&q, DType::F32, &[n, t], Layout::Contiguous);
        let scale = 1.0 / (d as f32).sqrt();
        let args = SparseMlaAttentionArgs {
            out: out.view(),
            lse: Some(lse.view()),
            query: qp.view(),
            cache: cache.view(),
            indices: indices.view(),
            scale,
        };
        sparse_mla_attention(&q, &args).unwrap();
        out.assert_outside_untouched(&q);
        cache.assert_unchanged(&q);
        let keys = |s: i64| decoded[s as usize].clone();
        let (want, want_lse) =
            sparse_reference(&qp.values(&q), (t, n, d, dv), &idx, topk, &keys, scale as f64);
        assert_close(&format!("sparse fp8 out {dt}"), &out.values(&q), &want, tol(dt));
        assert_lse_close(&format!("sparse fp8 lse {dt}"), &lse.values(&q), &want_lse, 1e-5);
    }
}

/// Listing every slot of a sequence once, in order, is MlaDecodeAttention over that
/// sequence, bit for bit (same keys, same f32 order); listing each twice keeps `out` and
/// adds ln 2 to `lse` (a repeat counts twice).
#[test]
fn sparse_over_all_slots_is_decode_and_repeats_count_twice() {
    let q = queue();
    let mut rng = rng("sparse_over_all_slots_is_decode_and_repeats_count_twice");
    let (n, d, dv, bs, len) = (4i64, 24i64, 16i64, 16i64, 37i64);
    let mb = (len + bs - 1) / bs;
    let nb = mb + 2;
    let dt = DType::F32;
    let cache = float_cache(&q, &mut rng, dt, nb, bs, d);
    let mut ids: Vec<i32> = (0..nb as i32).collect();
    ids.shuffle(&mut rng);
    let table: Vec<i32> = ids[..mb as usize].to_vec();
    let bt = i32_buf(&q, &[1, mb], &table);
    let seq_lens = i32_buf(&q, &[1], &[len as i32]);
    let qp = Pool::input(&q, &mut rng, dt, &[1, 1, n, d], Layout::Contiguous);
    let scale = 1.0 / (d as f32).sqrt();
    let run_decode = {
        let out = Buffer::nan(&q, dt, &[1, 1, n, dv]).unwrap();
        let lse = Buffer::nan(&q, DType::F32, &[1, n, 1]).unwrap();
        mla_decode_attention(
            &q,
            &MlaDecodeAttentionArgs {
                out: out.view(),
                lse: Some(lse.view()),
                query: qp.view(),
                cache: cache.view(),
                block_table: bt.view(),
                seq_lens: seq_lens.view(),
                scale,
            },
        )
        .unwrap();
        (out.to_f64(&q).unwrap(), lse.to_f64(&q).unwrap())
    };
    let slots: Vec<i32> = (0..len).map(|j| table[(j / bs) as usize] * bs as i32 + (j % bs) as i32).collect();
    let query = qp.view().reshape(&[1, n, d]).unwrap();
    let run_sparse = |idx: &[i32]| {
        let indices = i32_buf(&q, &[1, idx.len() as i64], idx);
        let out = Buffer::nan(&q, dt, &[1, n, dv]).unwrap();
        let lse = Buffer::nan(&q, DType::F32, &[n, 1]).unwrap();
        sparse_mla_attention(
            &q,
            &SparseMlaAttentionArgs {
                out: out.view(),
                lse: Some(lse.view()),
                query,
                cache: cache.view(),
                indices: indices.view(),
                scale,
            },
        )
        .unwrap();
        (out.to_f64(&q).unwrap(), lse.to_f64(&q).unwrap())
    };
    let once = run_sparse(&slots);
    assert_eq!(once, run_decode, "every slot once, in order = MlaDecodeAttention bit for bit");
    let twice: Vec<i32> = slots.iter().flat_map(|&s| [s, -1, s]).collect();
    let (out2, lse2) = run_sparse(&twice);
    assert_close("out with every slot twice", &out2, &once.0, 1e-6);
    for (a, b) in lse2.iter().zip(&once.1) {
        assert!(
            (a - b - std::f64::consts::LN_2).abs() < 1e-5,
            "lse with every slot twice: {a} vs {b} + ln 2"
        );
    }
}

// ---------------------------------------------------------------- IndexerTopK

struct IndexerRun {
    /// `[T, topk]` slots as written.
    got: Vec<i64>,
    /// Per query: the visible tokens' (f64 score, slot), by position.
    scored: Vec<Vec<(f64, i64)>>,
}

/// Runs IndexerTopK over sequences of `lens` tokens with queries at `positions` (of
/// sequence `seq_ids`), and scores every visible token in f64.
#[allow(clippy::too_many_arguments)]
fn indexer_run(
    q: &Queue,
    rng: &mut impl Rng,
    dt: DType,
    (h, di, bs, topk): (i64, i64, i64, i64),
    lens: &[i64],
    seq_ids: &[i32],
    positions: &[i64],
    distinct_keys: usize,
) -> IndexerRun {
    let b = lens.len() as i64;
    let mb = lens.iter().map(|l| (l + bs - 1) / bs).max().unwrap().max(1);
    let nb = b * mb + 1;
    let mut ids: Vec<i32> = (0..nb as i32).collect();
    ids.shuffle(rng);
    let table: Vec<i32> = ids[..(b * mb) as usize].to_vec();
    let bt = i32_buf(q, &[b, mb], &table);
    let cache = if distinct_keys == 0 {
        float_cache(q, rng, dt, nb, bs, di)
    } else {
        let keys: Vec<Vec<f64>> =
            (0..distinct_keys).map(|_| (0..di).map(|_| rng.gen_range(-1.0..1.0)).collect()).collect();
        let vals: Vec<f64> =
            (0..nb * bs).flat_map(|_| keys[rng.gen_range(0..distinct_keys)].clone()).collect();
        Pool::with_values(q, dt, &[nb, bs, di], nb * bs * di, 0, vec![bs * di, di, 1], &vals)
    };
    let t = seq_ids.len() as i64;
    let qp = Pool::input(q, rng, dt, &[t, h, di], Layout::Padded);
    let wp = Pool::input(q, rng, DType::F32, &[t, h], Layout::Padded);
    let out = Pool::output(q, DType::I32, &[t, topk], Layout::Padded);
    let sid = i32_buf(q, &[t], seq_ids);
    let pos = i64_buf(q, positions);
    let scale = 1.0 / (di as f32).sqrt();
    indexer_top_k(
        q,
        &IndexerTopKArgs {
            out: out.view(),
            query: qp.view(),
            weights: wp.view(),
            cache: cache.view(),
            block_table: bt.view(),
            seq_ids: sid.view(),
            positions: pos.view(),
            scale,
        },
    )
    .unwrap();
    out.assert_outside_untouched(q);
    cache.assert_unchanged(q);
    let (cv, qv, wv) = (cache.values(q), qp.values(q), wp.values(q));
    let mut scored = Vec::new();
    for ti in 0..t {
        let (s, p) = (seq_ids[ti as usize] as i64, positions[ti as usize]);
        let mut row = Vec::new();
        for j in 0..=p {
            let blk = table[(s * mb + j / bs) as usize] as i64;
            let key = &cv[at(&[nb, bs, di], &[blk, j % bs, 0])..][..di as usize];
            let mut score = 0f64;
            for hh in 0..h {
                let qrow = &qv[at(&[t, h, di], &[ti, hh, 0])..][..di as usize];
                let dot: f64 = qrow.iter().zip(key).map(|(a, b)| a * b).sum();
                score += wv[at(&[t, h], &[ti, hh])] * dot.max(0.0);
            }
            row.push((scale as f64 * score, blk * bs + j % bs));
        }
        scored.push(row);
    }
    IndexerRun { got: out.values(q).iter().map(|&v| v as i64).collect(), scored }
}

/// Each row: the `min(topk, visible)` first entries are distinct visible slots in
/// nonincreasing f64 score (within `eps`), the rest -1, and no unselected visible token
/// scores above the last selected one (within `eps`).
fn check_top_k(what: &str, r: &IndexerRun, topk: usize, eps: f64) {
    for (ti, row) in r.scored.iter().enumerate() {
        let got = &r.got[ti * topk..(ti + 1) * topk];
        let want_len = row.len().min(topk);
        assert!(got[want_len..].iter().all(|&s| s == -1), "{what}: query {ti}: padding {got:?}");
        let score = |slot: i64| {
            row.iter()
                .find(|x| x.1 == slot)
                .unwrap_or_else(|| panic!("{what}: query {ti}: slot {slot} not visible"))
                .0
        };
        let chosen: Vec<f64> = got[..want_len].iter().map(|&s| score(s)).collect();
        let mut distinct = got[..want_len].to_vec();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), want_len, "{what}: query {ti}: a slot chosen twice: {got:?}");
        for w in chosen.windows(2) {
            assert!(w[0] >= w[1] - eps, "{what}: query {ti}: scores out of order {chosen:?}");
        }
        let last = chosen.last().copied().unwrap_or(f64::INFINITY);
        for &(s, slot) in row {
            if !got[..want_len].contains(&slot) {
                assert!(
                    s <= last + eps,
                    "{what}: query {ti}: slot {slot} scores {s} above the last chosen {last}"
                );
            }
        }
    }
}

#[test]
fn indexer_top_k_matches_reference() {
    let q = queue();
    let mut rng = rng("indexer_top_k_matches_reference");
    for dt in FLOAT_DTYPES {
        for bs in [1, 16, 64] {
            // Two sequences: a prefill chunk of 5 queries at the end of 40 tokens, and a
            // decode query of a 70-token one; a padding query (position -1) last.
            let lens = [40, 70];
            let seq_ids = [0, 0, 0, 0, 0, 1, 0];
            let positions = [35, 36, 37, 38, 39, 69, -1];
            let topk = 24;
            let r = indexer_run(&q, &mut rng, dt, (4, 32, bs, topk), &lens, &seq_ids, &positions, 0);
            check_top_k(&format!("indexer {dt} bs {bs}"), &r, topk as usize, 1e-4);
            assert!(r.got[6 * topk as usize..].iter().all(|&s| s == -1), "the padding query selects nothing");
        }
    }
}

#[test]
fn indexer_top_k_pads_with_minus_one_past_the_visible_tokens() {
    let q = queue();
    let mut rng = rng("indexer_top_k_pads_with_minus_one_past_the_visible_tokens");
    let topk = 16;
    let r = indexer_run(&q, &mut rng, DType::F32, (4, 32, 16, topk), &[9], &[0, 0, 0], &[0, 4, 8], 0);
    check_top_k("indexer padding", &r, topk as usize, 1e-4);
    for (ti, visible) in [1usize, 5, 9].into_iter().enumerate() {
        let row = &r.got[ti * topk as usize..(ti + 1) * topk as usize];
        assert!(row[..visible].iter().all(|&s| s >= 0) && row[visible..].iter().all(|&s| s == -1), "{row:?}");
    }
}

/// Keys repeated across the cache give bit-equal scores: those must come out in
/// increasing token position. So must tokens whose every head's relu is 0 (score 0).
#[test]
fn indexer_top_k_breaks_ties_by_lower_position() {
    let q = queue();
    let mut rng = rng("indexer_top_k_breaks_ties_by_lower_position");
    for dt in FLOAT_DTYPES {
        let topk = 40;
        let r = indexer_run(&q, &mut rng, dt, (2, 8, 16, topk), &[33, 50], &[0, 1, 1], &[32, 20, 49], 3);
        check_top_k(&format!("indexer ties {dt}"), &r, topk as usize, 1e-4);
        for (ti, row) in r.scored.iter().enumerate() {
            let got = &r.got[ti * topk as usize..(ti + 1) * topk as usize];
            let position = |slot: i64| row.iter().position(|x| x.1 == slot).unwrap();
            let chosen: Vec<(f64, usize)> =
                got.iter().filter(|&&s| s >= 0).map(|&s| (row[position(s)].0, position(s))).collect();
            for w in chosen.windows(2) {
                // Equal keys (exact f64 ties here) are equal in f32 as well.
                if w[0].0 == w[1].0 {
                    assert!(
                        w[0].1 < w[1].1,
                        "indexer ties {dt}: query {ti}: equal scores out of position order"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------- malformed arguments

#[test]
fn sparse_mla_attention_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::SparseMlaAttention;
    let dt = DType::F32;
    let (t, n, d, dv) = (3i64, 2i64, 8i64, 4i64);
    let cache = Buffer::zeros(&q, dt, &[2, 4, d]).unwrap();
    let query = Buffer::zeros(&q, dt, &[t, n, d]).unwrap();
    let out = Buffer::nan(&q, dt, &[t, n, dv]).unwrap();
    let lse = Buffer::nan(&q, DType::F32, &[n, t]).unwrap();
    let indices = i32_buf(&q, &[t, 2], &[0, 7, -1, 3, 5, 5]);
    let ok = SparseMlaAttentionArgs {
        out: out.view(),
        lse: Some(lse.view()),
        query: query.view(),
        cache: cache.view(),
        indices: indices.view(),
        scale: 0.5,
    };
    sparse_mla_attention(&q, &ok).unwrap();
    let rejects = |case: &str, args: SparseMlaAttentionArgs, arg: &str| {
        expect_invalid(case, sparse_mla_attention(&q, &args), op, arg);
    };
    let past = i32_buf(&q, &[t, 2], &[0, 8, -1, 3, 5, 5]);
    rejects("slot = NB * BS", SparseMlaAttentionArgs { indices: past.view(), ..ok }, "indices");
    let i64s = Buffer::zeros(&q, DType::I64, &[t, 2]).unwrap();
    rejects("i64 indices", SparseMlaAttentionArgs { indices: i64s.view(), ..ok }, "indices");
    let short = i32_buf(&q, &[2, 2], &[0, 1, 2, 3]);
    rejects("indices rows != T", SparseMlaAttentionArgs { indices: short.view(), ..ok }, "indices");
    let empty = Buffer::zeros(&q, DType::I32, &[t, 0]).unwrap();
    rejects("topk 0", SparseMlaAttentionArgs { indices: empty.view(), ..ok }, "indices");
    let wide = Buffer::zeros(&q, dt, &[2, 4, d + 1]).unwrap();
    rejects("cache D != query D", SparseMlaAttentionArgs { cache: wide.view(), ..ok }, "cache");
    let f16 = Buffer::zeros(&q, DType::F16, &[2, 4, d]).unwrap();
    rejects("cache dtype", SparseMlaAttentionArgs { cache: f16.view(), ..ok }, "cache");
    let big = Buffer::nan(&q, dt, &[t, n, d + 1]).unwrap();
    rejects("Dv > D", SparseMlaAttentionArgs { out: big.view(), ..ok }, "out");
    let lse_tn = Buffer::nan(&q, DType::F32, &[t, n]).unwrap();
    rejects("lse [T, N]", SparseMlaAttentionArgs { lse: Some(lse_tn.view()), ..ok }, "lse");
    let lse16 = Buffer::nan(&q, DType::F16, &[n, t]).unwrap();
    rejects("f16 lse", SparseMlaAttentionArgs { lse: Some(lse16.view()), ..ok }, "lse");
    let col = Buffer::zeros(&q, dt, &[t, n, 2 * d]).unwrap();
    let strided_q = col.view().as_strided(0, &[t, n, d], &[n * 2 * d, 2 * d, 2]).unwrap();
    rejects("query inner stride 2", SparseMlaAttentionArgs { query: strided_q, ..ok }, "query");
    let alias = query.view().slice(2, 0, dv).unwrap();
    rejects("out = part of query", SparseMlaAttentionArgs { out: alias, ..ok }, "out");
    rejects("scale 0", SparseMlaAttentionArgs { scale: 0.0, ..ok }, "scale");
    rejects("scale NaN", SparseMlaAttentionArgs { scale: f32::NAN, ..ok }, "scale");
    let fp8 = Buffer::zeros(&q, DType::Fp8DsMla, &[2, 4, ROW_BYTES as i64]).unwrap();
    rejects("fp8 cache with D != 576", SparseMlaAttentionArgs { cache: fp8.view(), ..ok }, "query");
}

#[test]
fn indexer_top_k_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::IndexerTopK;
    let dt = DType::BF16;
    let (t, h, di, bs) = (3i64, 2i64, 8i64, 4i64);
    let cache = Buffer::zeros(&q, dt, &[3, bs, di]).unwrap();
    let query = Buffer::zeros(&q, dt, &[t, h, di]).unwrap();
    let weights = Buffer::zeros(&q, DType::F32, &[t, h]).unwrap();
    let out = Buffer::zeros(&q, DType::I32, &[t, 4]).unwrap();
    let bt = i32_buf(&q, &[2, 2], &[2, 0, 1, -1]);
    let sid = i32_buf(&q, &[t], &[0, 1, 0]);
    let pos = i32_buf(&q, &[t], &[7, 3, -1]);
    let ok = IndexerTopKArgs {
        out: out.view(),
        query: query.view(),
        weights: weights.view(),
        cache: cache.view(),
        block_table: bt.view(),
        seq_ids: sid.view(),
        positions: pos.view(),
        scale: 0.25,
    };
    indexer_top_k(&q, &ok).unwrap();
    let rejects = |case: &str, args: IndexerTopKArgs, arg: &str| {
        expect_invalid(case, indexer_top_k(&q, &args), op, arg);
    };
    let bad_seq = i32_buf(&q, &[t], &[0, 2, 0]);
    rejects("seq_ids past B", IndexerTopKArgs { seq_ids: bad_seq.view(), ..ok }, "seq_ids");
    let far = i32_buf(&q, &[t], &[8, 3, -1]);
    rejects("position past MB * BS", IndexerTopKArgs { positions: far.view(), ..ok }, "positions");
    let unmapped = i32_buf(&q, &[t], &[7, 4, -1]);
    rejects(
        "position in an unmapped block",
        IndexerTopKArgs { positions: unmapped.view(), ..ok },
        "block_table",
    );
    let fpos = Buffer::zeros(&q, DType::F32, &[t]).unwrap();
    rejects("f32 positions", IndexerTopKArgs { positions: fpos.view(), ..ok }, "positions");
    let w16 = Buffer::zeros(&q, DType::F16, &[t, h]).unwrap();
    rejects("f16 weights with bf16 query", IndexerTopKArgs { weights: w16.view(), ..ok }, "weights");
    let wh = Buffer::zeros(&q, DType::F32, &[t, h + 1]).unwrap();
    rejects("weights H", IndexerTopKArgs { weights: wh.view(), ..ok }, "weights");
    let c2 = Buffer::zeros(&q, dt, &[3, bs, di + 1]).unwrap();
    rejects("cache Di", IndexerTopKArgs { cache: c2.view(), ..ok }, "cache");
    let o64 = Buffer::zeros(&q, DType::I64, &[t, 4]).unwrap();
    rejects("i64 out", IndexerTopKArgs { out: o64.view(), ..ok }, "out");
    let o0 = Buffer::zeros(&q, DType::I32, &[t, 0]).unwrap();
    rejects("topk 0", IndexerTopKArgs { out: o0.view(), ..ok }, "out");
    let o_on_bt = bt.view().as_strided(0, &[1, 3], &[3, 1]).unwrap();
    let sid1 = i32_buf(&q, &[1], &[0]);
    let pos1 = i32_buf(&q, &[1], &[0]);
    let q1 = query.view().slice(0, 0, 1).unwrap();
    let w1 = weights.view().slice(0, 0, 1).unwrap();
    let aliased = IndexerTopKArgs {
        out: o_on_bt,
        query: q1,
        weights: w1,
        seq_ids: sid1.view(),
        positions: pos1.view(),
        ..ok
    };
    rejects("out over block_table", aliased, "out");
    rejects("scale -1", IndexerTopKArgs { scale: -1.0, ..ok }, "scale");
}

// ---------------------------------------------------------------- CacheIndexerKeys

#[test]
fn cache_indexer_keys_writes_rows_by_slot() {
    let q = queue();
    let mut rng = rng("cache_indexer_keys_writes_rows_by_slot");
    let (t, di) = (7i64, 24i64);
    for dt in FLOAT_DTYPES {
        for bs in [1, 16, 64] {
            let nb = (t + bs - 1) / bs + 2;
            let kp = Pool::input(&q, &mut rng, dt, &[t, di], Layout::Padded);
            let cache = Pool::output(
                &q,
                dt,
                &[nb, bs, di],
                Layout::Strided { len: (nb + 1) * bs * di, offset: bs * di, strides: vec![bs * di, di, 1] },
            );
            let mut slots: Vec<i64> = (0..nb * bs).collect();
            slots.shuffle(&mut rng);
            slots.truncate(t as usize);
            slots[2] = -1;
            // Token 5 repeats token 4's slot: the last one wins.
            slots[5] = slots[4];
            let sm = i64_buf(&q, &slots);
            cache_indexer_keys(
                &q,
                &CacheIndexerKeysArgs { k: kp.view(), cache: cache.view(), slot_mapping: sm.view() },
            )
            .unwrap();
            cache.assert_outside_untouched(&q);
            kp.assert_unchanged(&q);
            let (kv, cv) = (kp.values(&q), cache.values(&q));
            let mut want: Vec<Option<usize>> = vec![None; (nb * bs) as usize];
            for (ti, &s) in slots.iter().enumerate() {
                if s >= 0 {
                    want[s as usize] = Some(ti);
                }
            }
            for (s, w) in want.iter().enumerate() {
                let row = &cv[s * di as usize..][..di as usize];
                match w {
                    Some(ti) => {
                        assert_eq!(row, &kv[ti * di as usize..][..di as usize], "{dt} bs {bs}: slot {s}")
                    }
                    None => assert!(row.iter().all(|v| v.is_nan()), "{dt} bs {bs}: slot {s} was written"),
                }
            }
        }
    }
}

#[test]
fn cache_indexer_keys_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::CacheIndexerKeys;
    let dt = DType::BF16;
    let k = Buffer::zeros(&q, dt, &[3, 8]).unwrap();
    let cache = Buffer::nan(&q, dt, &[2, 4, 8]).unwrap();
    let sm = i64_buf(&q, &[0, -1, 7]);
    let ok = CacheIndexerKeysArgs { k: k.view(), cache: cache.view(), slot_mapping: sm.view() };
    cache_indexer_keys(&q, &ok).unwrap();
    let rejects = |case: &str, args: CacheIndexerKeysArgs, arg: &str| {
        expect_invalid(case, cache_indexer_keys(&q, &args), op, arg);
    };
    let past = i64_buf(&q, &[0, 8, 1]);
    rejects("slot = NB * BS", CacheIndexerKeysArgs { slot_mapping: past.view(), ..ok }, "slot_mapping");
    let i32s = i32_buf(&q, &[3], &[0, 1, 2]);
    rejects("i32 slot_mapping", CacheIndexerKeysArgs { slot_mapping: i32s.view(), ..ok }, "slot_mapping");
    let short = i64_buf(&q, &[0, 1]);
    rejects("slot_mapping length", CacheIndexerKeysArgs { slot_mapping: short.view(), ..ok }, "slot_mapping");
    let wide = Buffer::nan(&q, dt, &[2, 4, 9]).unwrap();
    rejects("cache Di", CacheIndexerKeysArgs { cache: wide.view(), ..ok }, "cache");
    let k32 = Buffer::zeros(&q, DType::F32, &[3, 8]).unwrap();
    rejects("f32 k into a bf16 cache", CacheIndexerKeysArgs { k: k32.view(), ..ok }, "k");
    let fp8 = Buffer::zeros(&q, DType::Fp8DsMla, &[2, 4, 8]).unwrap();
    rejects("fp8 cache", CacheIndexerKeysArgs { cache: fp8.view(), ..ok }, "cache");
    let alias = cache.view().reshape(&[8, 8]).unwrap().slice(0, 0, 3).unwrap();
    rejects("k inside the cache", CacheIndexerKeysArgs { k: alias, ..ok }, "cache");
}
