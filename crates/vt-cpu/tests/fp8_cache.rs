//! The fp8_ds_mla cache on the CPU against naive f64 code written from the format's
//! description (not from `vt_core::fp8_ds_mla`): ConcatAndCacheMla's bytes,
//! GatherMlaCache's dequantized rows and MlaDecodeAttention over the decoded keys, at
//! block sizes 1, 16 and 64.

mod common;

use common::*;
use rand::seq::SliceRandom;
use rand::Rng;
use vt_core::*;

const W: i64 = 656;

/// A row's 576 values, decoded naively: `e4m3(byte i) * scale (i / 128)`, the product
/// rounded to f32 as the contract says (exact in f64, so rounding it once to f32 is the
/// f32 multiply), bf16 rope.
fn decode(row: &[u8]) -> Vec<f64> {
    let scale = |g: usize| f32::from_le_bytes(row[512 + 4 * g..516 + 4 * g].try_into().unwrap()) as f64;
    let mut v: Vec<f64> = (0..512).map(|i| (e4m3(row[i]) * scale(i / 128)) as f32 as f64).collect();
    v.extend((0..64).map(|i| half::bf16::from_le_bytes([row[528 + 2 * i], row[529 + 2 * i]]).to_f64()));
    v
}

/// Rounds an f32 to `dt` (from f32, not through `half`'s f64 conversions, which disagree
/// with the f32 ones on some bf16 roundings).
fn round_f32(dt: DType, v: f32) -> f64 {
    match dt {
        DType::BF16 => half::bf16::from_f32(v).to_f64(),
        DType::F16 => half::f16::from_f32(v).to_f64(),
        _ => v as f64,
    }
}

/// An fp8 cache `[nb, bs, 656]` inside a pool one block longer (the view starts at block 1).
fn cache_pool(q: &Queue, nb: i64, bs: i64, bytes: &[f64]) -> Pool {
    let strides = vec![bs * W, W, 1];
    Pool::with_values(q, DType::Fp8DsMla, &[nb, bs, W], (nb + 1) * bs * W, bs * W, strides, bytes)
}

fn row_bytes(q: &Queue, cache: &Pool, blk: i64, r: i64) -> Vec<u8> {
    let v = cache.view().select(0, blk).unwrap().select(0, r).unwrap();
    q.read_f64(&v).unwrap().iter().map(|&b| b as u8).collect()
}

fn concat_case(bs: i64) {
    let q = queue();
    let mut rng = rng(&format!("fp8 concat bs {bs}"));
    let t = 12i64;
    let nb = (t + bs - 1) / bs + 1;
    for dt in FLOAT_DTYPES {
        let mut kv: Vec<f64> = (0..t * 576).map(|_| rng.gen_range(-1.0..1.0) * 3.0).collect();
        // Token 2: group 1 all zero (scale 0); token 3: all zero.
        kv[2 * 576 + 128..2 * 576 + 256].fill(0.0);
        kv[3 * 576..4 * 576].fill(0.0);
        let kv = Pool::with_values(&q, dt, &[t, 576], t * 576, 0, vec![576, 1], &kv);
        let kv_vals = kv.values(&q);
        let kv_c = kv.view().slice(1, 0, 512).unwrap();
        let k_pe = kv.view().slice(1, 512, 576).unwrap();
        let cache = cache_pool(&q, nb, bs, &vec![255.0; ((nb + 1) * bs * W) as usize]);
        let mut slots: Vec<i64> = (0..nb * bs).collect();
        slots.shuffle(&mut rng);
        slots.truncate(t as usize);
        slots[5] = -1;
        let slot_buf = i64_buf(&q, &slots);
        let args = ConcatAndCacheMlaArgs { kv_c, k_pe, cache: cache.view(), slot_mapping: slot_buf.view() };
        concat_and_cache_mla(&q, &args).unwrap();
        for (ti, &s) in slots.iter().enumerate().filter(|(_, &s)| s >= 0) {
            let row = row_bytes(&q, &cache, s / bs, s % bs);
            let x = &kv_vals[ti * 576..(ti + 1) * 576];
            for g in 0..4 {
                let grp = &x[g * 128..(g + 1) * 128];
                let amax = grp.iter().fold(0f64, |m, v| m.max(v.abs()));
                let scale = f32::from_le_bytes(row[512 + 4 * g..516 + 4 * g].try_into().unwrap());
                assert_eq!(scale, (amax as f32) / 448.0, "{dt} bs {bs} token {ti} group {g}: scale");
                for (i, &v) in grp.iter().enumerate() {
                    let code = row[g * 128 + i];
                    if scale == 0.0 {
                        assert_eq!(code, 0, "zero group: zero codes");
                        continue;
                    }
                    // The code is a nearest e4m3 value to v / scale (f32 division).
                    let y = ((v as f32) / scale) as f64;
                    let err = (e4m3(code) - y).abs();
                    let best = (0..=255u8).filter(|&c| !e4m3(c).is_nan()).map(|c| (e4m3(c) - y).abs());
                    assert_eq!(
                        err,
                        best.fold(f64::INFINITY, f64::min),
                        "{dt} token {ti} value {}",
                        g * 128 + i
                    );
                }
            }
            let dec = decode(&row);
            for i in 0..64 {
                assert_eq!(dec[512 + i], half::bf16::from_f32(x[512 + i] as f32).to_f64(), "rope {i}");
            }
            assert!(dec.iter().all(|v| v.is_finite()), "a written row decodes finite");
            let e = rel_err(&dec[..512], &x[..512]);
            // e4m3 keeps 3 mantissa bits: ~2^-5 relative RMS for values near their amax.
            assert!(e < 4e-2, "{dt} token {ti}: latent round trip error {e:.2e}");
        }
        cache.assert_outside_untouched(&q);
    }
}

#[test]
fn fp8_concat_and_cache_mla_matches_naive_code_bs_1() {
    concat_case(1);
}

#[test]
fn fp8_concat_and_cache_mla_matches_naive_code_bs_16() {
    concat_case(16);
}

#[test]
fn fp8_concat_and_cache_mla_matches_naive_code_bs_64() {
    concat_case(64);
}

/// Random valid rows: random codes (no NaN), random positive scales, random bf16 rope.
fn random_cache_bytes(rng: &mut impl Rng, rows: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * W as usize);
    for _ in 0..rows {
        let mut row = vec![0u8; W as usize];
        for b in row[..512].iter_mut() {
            // 0x00..0x7e (0x7f is NaN), either sign.
            *b = rng.gen_range(0..0x7fu8) | if rng.gen_bool(0.5) { 0x80 } else { 0 };
        }
        for g in 0..4 {
            let s = rng.gen_range(0.001f32..0.01);
            row[512 + 4 * g..516 + 4 * g].copy_from_slice(&s.to_le_bytes());
        }
        for i in 0..64 {
            row[528 + 2 * i..530 + 2 * i]
                .copy_from_slice(&half::bf16::from_f64(rng.gen_range(-1.0..1.0)).to_le_bytes());
        }
        out.extend(row.iter().map(|&b| b as f64));
    }
    out
}

fn gather_case(bs: i64) {
    let q = queue();
    let mut rng = rng(&format!("fp8 gather bs {bs}"));
    let (lens, starts) = (vec![7i64, 0, bs + 3], vec![2i64, 0, 1]);
    let mb = lens.iter().zip(&starts).map(|(l, s)| (l + s + bs - 1) / bs).max().unwrap();
    let nb = 3 * mb + 1;
    let mut ids: Vec<i32> = (0..nb as i32).collect();
    ids.shuffle(&mut rng);
    let table: Vec<i32> = ids[..(3 * mb) as usize].to_vec();
    let cu = [0, 7, 7, 7 + bs as i32 + 3];
    let bytes = random_cache_bytes(&mut rng, ((nb + 1) * bs) as usize);
    let cache = cache_pool(&q, nb, bs, &bytes);
    let (bt, cu_buf) = (i32_buf(&q, &[3, mb], &table), i32_buf(&q, &[4], &cu));
    let st = i32_buf(&q, &[3], &starts.iter().map(|&s| s as i32).collect::<Vec<_>>());
    for dt in FLOAT_DTYPES {
        let t_ws = cu[3] as i64 + 2;
        let out = Pool::output(&q, dt, &[t_ws, 576], Layout::Padded);
        let args = GatherMlaCacheArgs {
            out: out.view(),
            cache: cache.view(),
            block_table: bt.view(),
            cu_seq_lens: cu_buf.view(),
            seq_starts: Some(st.view()),
        };
        gather_mla_cache(&q, &args).unwrap();
        let got = out.values(&q);
        for b in 0..3 {
            for j in 0..lens[b] {
                let p = starts[b] + j;
                let blk = table[b * mb as usize + (p / bs) as usize] as i64;
                let want = decode(&row_bytes(&q, &cache, blk, p % bs));
                let row = (cu[b] as i64 + j) as usize;
                for (i, &w) in want.iter().enumerate() {
                    // One rounding of the f32 product to the workspace dtype.
                    let w = round_f32(dt, w as f32);
                    assert_eq!(got[row * 576 + i], w, "{dt} bs {bs} seq {b} row {j} value {i}");
                }
            }
        }
        // Spare rows stay poisoned; nothing outside the view changes.
        assert!(got[cu[3] as usize * 576..].iter().all(|v| v.is_nan()), "rows past cu[B] untouched");
        out.assert_outside_untouched(&q);
    }
}

#[test]
fn fp8_gather_mla_cache_dequantizes_bs_1() {
    gather_case(1);
}

#[test]
fn fp8_gather_mla_cache_dequantizes_bs_16() {
    gather_case(16);
}

#[test]
fn fp8_gather_mla_cache_dequantizes_bs_64() {
    gather_case(64);
}

fn decode_case(bs: i64) {
    let q = queue();
    let mut rng = rng(&format!("fp8 decode bs {bs}"));
    let (n, sq) = (3i64, 2i64);
    let lens = [1i64, bs + 5, 0];
    let b = lens.len() as i64;
    let mb = lens.iter().map(|l| (l + bs - 1) / bs).max().unwrap().max(1);
    let nb = b * mb;
    let mut ids: Vec<i32> = (0..nb as i32).collect();
    ids.shuffle(&mut rng);
    let bytes = random_cache_bytes(&mut rng, ((nb + 1) * bs) as usize);
    let cache = cache_pool(&q, nb, bs, &bytes);
    let bt = i32_buf(&q, &[b, mb], &ids);
    let sl = i32_buf(&q, &[b], &lens.iter().map(|&l| l as i32).collect::<Vec<_>>());
    let scale = 1.0 / 576f32.sqrt();
    for dt in FLOAT_DTYPES {
        let query = Pool::input(&q, &mut rng, dt, &[b, sq, n, 576], Layout::Contiguous);
        let out = Pool::output(&q, dt, &[b, sq, n, 512], Layout::Contiguous);
        let lse = Pool::output(&q, DType::F32, &[b, n, sq], Layout::Contiguous);
        let args = MlaDecodeAttentionArgs {
            out: out.view(),
            lse: Some(lse.view()),
            query: query.view(),
            cache: cache.view(),
            block_table: bt.view(),
            seq_lens: sl.view(),
            scale,
        };
        mla_decode_attention(&q, &args).unwrap();
        let qv = query.values(&q);
        let (mut want, mut want_lse) = (Vec::new(), vec![0.0; (b * n * sq) as usize]);
        for bi in 0..b as usize {
            let len = lens[bi] as usize;
            let keys: Vec<Vec<f64>> = (0..len)
                .map(|j| {
                    let blk = ids[bi * mb as usize + j / bs as usize] as i64;
                    decode(&row_bytes(&q, &cache, blk, j as i64 % bs))
                })
                .collect();
            for s in 0..sq as usize {
                let vis = (len + s + 1).saturating_sub(sq as usize);
                for h in 0..n as usize {
                    let qr = &qv[((bi * sq as usize + s) * n as usize + h) * 576..][..576];
                    let logits: Vec<f64> = keys[..vis]
                        .iter()
                        .map(|k| scale as f64 * k.iter().zip(qr).map(|(a, b)| a * b).sum::<f64>())
                        .collect();
                    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = logits.iter().map(|l| (l - m).exp()).sum();
                    want_lse[(bi * n as usize + h) * sq as usize + s] =
                        if vis == 0 { f64::NEG_INFINITY } else { m + sum.ln() };
                    for c in 0..512 {
                        let o: f64 = if vis == 0 {
                            0.0
                        } else {
                            logits.iter().zip(&keys).map(|(l, k)| (l - m).exp() / sum * k[c]).sum()
                        };
                        want.push(o);
                    }
                }
            }
        }
        assert_close(&format!("fp8 decode {dt} bs {bs} out"), &out.values(&q), &want, tol(dt));
        assert_lse_close(&format!("fp8 decode {dt} bs {bs} lse"), &lse.values(&q), &want_lse, 1e-5);
    }
}

#[test]
fn fp8_mla_decode_attention_matches_naive_code_bs_1() {
    decode_case(1);
}

#[test]
fn fp8_mla_decode_attention_matches_naive_code_bs_16() {
    decode_case(16);
}

#[test]
fn fp8_mla_decode_attention_matches_naive_code_bs_64() {
    decode_case(64);
}

#[test]
fn fp8_cache_arguments_are_checked() {
    let q = queue();
    let kv = Buffer::zeros(&q, DType::BF16, &[2, 576]).unwrap();
    let slots = i64_buf(&q, &[0, 1]);
    // 576 wide rows of the wrong byte count, and a 32 + 16 split at the right width.
    let bad = Buffer::zeros(&q, DType::Fp8DsMla, &[1, 4, 576]).unwrap();
    let args = ConcatAndCacheMlaArgs {
        kv_c: kv.view().slice(1, 0, 512).unwrap(),
        k_pe: kv.view().slice(1, 512, 576).unwrap(),
        cache: bad.view(),
        slot_mapping: slots.view(),
    };
    let e = concat_and_cache_mla(&q, &args).unwrap_err().to_string();
    assert!(e.contains("cache") && e.contains("656"), "{e}");
    let good = Buffer::zeros(&q, DType::Fp8DsMla, &[1, 4, 656]).unwrap();
    let args = ConcatAndCacheMlaArgs {
        kv_c: kv.view().slice(1, 0, 500).unwrap(),
        k_pe: kv.view().slice(1, 500, 576).unwrap(),
        cache: good.view(),
        slot_mapping: slots.view(),
    };
    let e = concat_and_cache_mla(&q, &args).unwrap_err().to_string();
    assert!(e.contains("kv_c") && e.contains("512"), "{e}");
}
