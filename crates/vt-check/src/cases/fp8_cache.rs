//! The fp8_ds_mla cache cases of ConcatAndCacheMla, GatherMlaCache and
//! MlaDecodeAttention (block sizes 1, 16, 64).
//!
//! The cache is raw row bytes (`Ty::Fp8DsMla`), so the copies compare byte for byte (a
//! backend must encode and decode exactly as `vt_core::fp8_ds_mla` does) and the
//! attention compares with its usual tolerance over the same decoded keys. Output caches
//! are poisoned with 0xff (NaN in every field); a row left unwritten differs from the
//! reference's bytes.

use rand::seq::SliceRandom;
use rand::Rng;
use vt_core::fp8_ds_mla::{encode_row, GROUP, GROUPS, LATENT, ROPE, ROW_BYTES};

use super::cache::{concat_exec, gather_exec};
use super::{as_f64, block_table, cumulative};
use crate::case::{Builder, Cases, Exec, Ty, View};

const W: i64 = ROW_BYTES as i64;
/// Decoded row width D = L + R.
const D: i64 = (LATENT + ROPE) as i64;
const L: i64 = LATENT as i64;
const R: i64 = ROPE as i64;

/// One token's latent values: U(-1, 1) times a per-group magnitude (2^-3 .. 2^3), so the
/// four scales differ; with `zero_group`, group 1 is all zero (scale 0).
fn latent_values(b: &mut Builder, zero_group: bool) -> Vec<f64> {
    let mags: Vec<f64> = (0..GROUPS).map(|_| 2f64.powi(b.rng.gen_range(-3..=3))).collect();
    (0..LATENT)
        .map(|i| {
            let g = i / GROUP;
            if zero_group && g == 1 {
                0.0
            } else {
                b.rng.gen_range(-1.0..1.0) * mags[g]
            }
        })
        .collect()
}

/// A pool `[nb, layers, bs, 656]` of fp8 rows viewed as layer `layer` `[nb, bs, 656]`:
/// poisoned, or rows encoded from random values (every fifth with a zero group).
pub(super) fn fp8_cache(
    b: &mut Builder,
    nb: i64,
    bs: i64,
    (layers, layer): (i64, i64),
    poison: bool,
) -> View {
    let shape = [nb, layers, bs, W];
    let pool = if poison {
        b.poison("fp8 cache pool", Ty::Fp8DsMla, &shape)
    } else {
        let rows = (nb * layers * bs) as usize;
        let mut bytes = Vec::with_capacity(rows * ROW_BYTES);
        for i in 0..rows {
            let lat = latent_values(b, i % 5 == 3);
            let rope: Vec<f64> = (0..ROPE).map(|_| b.rng.gen_range(-1.0..1.0)).collect();
            let mut l32 = [0f32; LATENT];
            let mut r32 = [0f32; ROPE];
            l32.iter_mut().zip(&lat).for_each(|(d, &v)| *d = v as f32);
            r32.iter_mut().zip(&rope).for_each(|(d, &v)| *d = v as f32);
            let mut row = [0u8; ROW_BYTES];
            encode_row(&l32, &r32, &mut row);
            bytes.extend(row.iter().map(|&x| x as f64));
        }
        b.values("fp8 cache pool", Ty::Fp8DsMla, &shape, bytes)
    };
    pool.sub(layer * bs * W, &[nb, bs, W], &[layers * bs * W, W, 1])
}

/// Writes `t` tokens (kv_c / k_pe slices of `[T, 576]` kv rows; token 0 has a zero
/// group) into distinct random slots of an fp8 cache, `padding` of them -1.
fn concat(b: &mut Builder, t: i64, bs: i64, nb: i64, padding: usize, pool: (i64, i64)) -> Exec {
    let mut kv = Vec::with_capacity((t * D) as usize);
    for ti in 0..t {
        kv.extend(latent_values(b, ti == 0));
        kv.extend((0..R).map(|_| b.rng.gen_range(-1.0..1.0)));
    }
    let kv = b.values("kv", Ty::Float, &[t, D], kv);
    let (kv_c, k_pe) = (kv.sub(0, &[t, L], &[D, 1]), kv.sub(L, &[t, R], &[D, 1]));
    let mut slots: Vec<i64> = (0..nb * bs).collect();
    slots.shuffle(&mut b.rng);
    slots.truncate(t as usize);
    // Token 0 (the zero group) keeps its slot.
    let mut order: Vec<usize> = (1..slots.len()).collect();
    order.shuffle(&mut b.rng);
    for &i in order.iter().take(padding) {
        slots[i] = -1;
    }
    let cache = fp8_cache(b, nb, bs, pool, true);
    concat_exec(b, kv_c, k_pe, cache, bs, t, &slots)
}

pub(super) fn concat_and_cache_mla(c: &mut Cases) {
    c.add("fp8_ds_mla cache, bs 1, T 5 with 1 padding slot, a zero group", |b| concat(b, 5, 1, 8, 1, (1, 0)));
    c.add("fp8_ds_mla cache, bs 16, T 9 with 2 padding slots, cache = layer 1 of a 2-layer pool", |b| {
        concat(b, 9, 16, 4, 2, (2, 1))
    });
    c.add("fp8_ds_mla cache, bs 64, T 70 over 3 blocks", |b| concat(b, 70, 64, 3, 0, (1, 0)));
}

/// Gathers `lens[b]` rows from `starts[b]` of an fp8 cache into a float workspace
/// `[sum + spare, 576]` (spare rows untouched).
fn gather(
    b: &mut Builder,
    lens: &[i64],
    starts: Option<&[i64]>,
    bs: i64,
    spare: i64,
    pool: (i64, i64),
) -> Exec {
    let nseq = lens.len() as i64;
    let from: Vec<i64> = starts.map_or_else(|| vec![0; lens.len()], |s| s.to_vec());
    let needs: Vec<i64> = lens.iter().zip(&from).map(|(l, s)| l + s).collect();
    let (nb, mb, table) = block_table(b, &needs, bs, 2);
    let cache = fp8_cache(b, nb, bs, pool, false);
    let block_table = b.values("block_table", Ty::I32, &[nseq, mb], table);
    let cu = b.values("cu_seq_lens", Ty::I32, &[nseq + 1], cumulative(lens));
    let seq_starts = starts.map(|s| b.values("seq_starts", Ty::I32, &[nseq], as_f64(s)));
    let total: i64 = lens.iter().sum();
    let out = b.poison("out", Ty::Float, &[total + spare, D]);
    b.output("out", &out.slice(0, 0, total));
    gather_exec(out, cache, block_table, cu, seq_starts)
}

pub(super) fn gather_mla_cache(c: &mut Cases) {
    c.add("fp8_ds_mla cache, bs 1, seq_starts [3, 0], lens [4, 7], 2 spare rows", |b| {
        gather(b, &[4, 7], Some(&[3, 0]), 1, 2, (1, 0))
    });
    c.add("fp8_ds_mla cache, bs 16, lens [5, 0, 40], cache = layer 1 of a 2-layer pool", |b| {
        gather(b, &[5, 0, 40], None, 16, 1, (2, 1))
    });
    c.add("fp8_ds_mla cache, bs 64, seq_starts [64, 0], lens [130, 1]", |b| {
        gather(b, &[130, 1], Some(&[64, 0]), 64, 0, (1, 0))
    });
}

/// Decode (D 576, Dv 512, `n` heads, `s_q` query tokens) over an fp8 cache.
fn decode(b: &mut Builder, lens: &[i64], s_q: i64, n: i64, bs: i64) -> Exec {
    let nseq = lens.len() as i64;
    let (nb, mb, table) = block_table(b, lens, bs, 2);
    let cache = fp8_cache(b, nb, bs, (1, 0), false);
    // Queries as in the float cases (U(-4.5, 4.5)): logits spread, softmax not flat.
    let q = b.uniform("q", &[nseq, s_q, n, D], -4.5, 4.5);
    let out = b.poison("out", Ty::Float, &[nseq, s_q, n, L]);
    b.output("out", &out);
    let lse = b.poison("lse", Ty::F32, &[nseq, n, s_q]);
    b.output("lse", &lse);
    let block_table = b.values("block_table", Ty::I32, &[nseq, mb], table);
    let seq_lens = b.values("seq_lens", Ty::I32, &[nseq], as_f64(lens));
    let scale = 1.0 / (D as f32).sqrt();
    Box::new(move |queue, bufs| {
        vt_core::mla_decode_attention(
            queue,
            &vt_core::MlaDecodeAttentionArgs {
                out: out.tensor(bufs)?,
                lse: Some(lse.tensor(bufs)?),
                query: q.tensor(bufs)?,
                cache: cache.tensor(bufs)?,
                block_table: block_table.tensor(bufs)?,
                seq_lens: seq_lens.tensor(bufs)?,
                scale,
            },
        )
    })
}

pub(super) fn mla_decode_attention(c: &mut Cases) {
    c.add("fp8_ds_mla cache, N 4, bs 1, lens [5, 1, 23], s_q 1", |b| decode(b, &[5, 1, 23], 1, 4, 1));
    c.add("fp8_ds_mla cache, N 4, bs 16, lens [2, 17, 40, 0], s_q 2 (empty and keyless queries)", |b| {
        decode(b, &[2, 17, 40, 0], 2, 4, 16)
    });
    c.add("fp8_ds_mla cache, N 16, bs 64, lens [1, 37, 130], s_q 1", |b| decode(b, &[1, 37, 130], 1, 16, 64));
}
