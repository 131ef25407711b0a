//! DeepSeek-V3.2's sparse MLA ops: SparseMlaAttention (attention over listed cache slots,
//! float and fp8_ds_mla caches), IndexerTopK (the lightning indexer's top-k slots) and
//! CacheIndexerKeys (the indexer key cache's writer, compared exactly).
//!
//! SparseMlaAttention's index rows mix valid slots in random order with -1 entries and
//! repeated slots (a repeat counts twice), and one row lists no valid slot (out 0, lse
//! -inf). IndexerTopK's output is i32 slots compared exactly; it starts filled with -7
//! rather than the all-ones integer poison (-1, a value the op writes as padding), so a
//! row left unwritten fails. Its inputs are multiples of 1/8 in [-1, 1], so every score is
//! exact in f32 in any summation order and a GPU's selection (tensor cores included) must
//! equal the CPU's exactly. Its ties come from that grid, from cache rows that repeat one key
//! (equal scores, bit for bit) and from tokens every head's relu zeroes.

use rand::seq::SliceRandom;
use rand::Rng;

use super::fp8_cache::fp8_cache;
use super::{as_f64, block_table, paged_cache};
use crate::case::{Builder, Cases, Exec, Ty, View};

const Q_AMP: f64 = 4.5;

/// Sparse attention over `t` query tokens with `n` heads, D / Dv, a cache of `nb` blocks of
/// `bs`, `topk` indices per token.
#[derive(Clone, Copy)]
struct Sparse {
    t: i64,
    n: i64,
    d: i64,
    dv: i64,
    nb: i64,
    bs: i64,
    topk: i64,
    fp8: bool,
    lse: bool,
    /// q / out / lse / indices are views into wider buffers (lse stored `[T, N]` and
    /// passed transposed), the cache is layer 1 of a 2-layer pool.
    strided: bool,
}

impl Sparse {
    fn new(t: i64, n: i64, (d, dv): (i64, i64), (nb, bs): (i64, i64), topk: i64) -> Sparse {
        Sparse { t, n, d, dv, nb, bs, topk, fp8: false, lse: true, strided: false }
    }

    /// Row 0: no valid slot. Other rows: distinct random slots, then about a sixth of the
    /// entries set to -1 and a tenth to a copy of another entry of the row.
    fn indices(&self, b: &mut Builder) -> Vec<f64> {
        let slots = self.nb * self.bs;
        let k = self.topk as usize;
        let mut all = Vec::with_capacity(self.t as usize * k);
        for ti in 0..self.t {
            if ti == 0 {
                all.extend(std::iter::repeat_n(-1.0, k));
                continue;
            }
            let mut pool: Vec<i64> = (0..slots).collect();
            pool.shuffle(&mut b.rng);
            let mut row: Vec<i64> = (0..k).map(|i| pool[i % pool.len()]).collect();
            for i in 0..k {
                let u: f64 = b.rng.gen();
                if u < 1.0 / 6.0 {
                    row[i] = -1;
                } else if u < 1.0 / 6.0 + 0.1 && k > 1 {
                    row[i] = row[b.rng.gen_range(0..k)];
                }
            }
            all.extend(row.into_iter().map(|s| s as f64));
        }
        all
    }

    fn build(self, b: &mut Builder) -> Exec {
        let Sparse { t, n, d, dv, nb, bs, topk, fp8, lse, strided } = self;
        let pool = if strided { (2, 1) } else { (1, 0) };
        let cache =
            if fp8 { fp8_cache(b, nb, bs, pool, false) } else { paged_cache(b, nb, bs, d, pool, false) };
        let (q_pad, o_pad, i_pad) = if strided { (8, 4, 3) } else { (0, 0, 0) };
        let (qw, ow) = (d + q_pad, dv + o_pad);
        let q = b.uniform("q", &[t, n, qw], -Q_AMP, Q_AMP).sub(q_pad / 2, &[t, n, d], &[n * qw, qw, 1]);
        let out = b.poison("out", Ty::Float, &[t, n, ow]).sub(0, &[t, n, dv], &[n * ow, ow, 1]);
        b.output("out", &out);
        let lse = lse.then(|| {
            let l = if strided {
                b.poison("lse", Ty::F32, &[t, n]).sub(0, &[n, t], &[1, n])
            } else {
                b.poison("lse", Ty::F32, &[n, t])
            };
            b.output("lse", &l);
            l
        });
        let idx = self.indices(b);
        let iw = topk + i_pad;
        let mut wide = vec![0.0; (t * iw) as usize];
        for ti in 0..t as usize {
            for k in 0..topk as usize {
                wide[ti * iw as usize + k] = idx[ti * topk as usize + k];
            }
        }
        let indices = b.values("indices", Ty::I32, &[t, iw], wide).sub(0, &[t, topk], &[iw, 1]);
        let scale = 1.0 / (d as f32).sqrt();
        Box::new(move |queue, bufs| {
            let lse = lse.as_ref().map(|l| l.tensor(bufs)).transpose()?;
            vt_core::sparse_mla_attention(
                queue,
                &vt_core::SparseMlaAttentionArgs {
                    out: out.tensor(bufs)?,
                    lse: (lse.as_ref()).copied(),
                    query: q.tensor(bufs)?,
                    cache: cache.tensor(bufs)?,
                    indices: indices.tensor(bufs)?,
                    scale,
                },
            )
        })
    }
}

pub(super) fn sparse_mla_attention(c: &mut Cases) {
    const MLA: (i64, i64) = (576, 512);
    const SMALL: (i64, i64) = (80, 64);
    c.add("MLA dims (N 16, D 576, Dv 512), bs 64, 4 blocks, T 5, topk 64", |b| {
        Sparse::new(5, 16, MLA, (4, 64), 64).build(b)
    });
    c.add("small dims (N 4, D 80, Dv 64), bs 1, 40 blocks, T 7, topk 9", |b| {
        Sparse::new(7, 4, SMALL, (40, 1), 9).build(b)
    });
    c.add("small dims, bs 16, 3 blocks, T 6, topk 64 (more entries than slots: repeats)", |b| {
        Sparse::new(6, 4, SMALL, (3, 16), 64).build(b)
    });
    c.add(
        "small dims, bs 16, T 5, topk 12, q / out / lse / indices = views into wider buffers \
         (lse stored [T, N]), cache = layer 1 of a 2-layer pool",
        |b| Sparse { strided: true, ..Sparse::new(5, 4, SMALL, (5, 16), 12) }.build(b),
    );
    c.add("MLA dims, bs 64, T 3, topk 32, no lse", |b| {
        Sparse { lse: false, ..Sparse::new(3, 16, MLA, (2, 64), 32) }.build(b)
    });
    c.add("128 heads (DeepSeek-V3.2), D 576, Dv 512, bs 64, T 2, topk 128", |b| {
        Sparse::new(2, 128, MLA, (4, 64), 128).build(b)
    });
    c.add("fp8_ds_mla cache, N 4, bs 1, 48 blocks, T 5, topk 16", |b| {
        Sparse { fp8: true, ..Sparse::new(5, 4, MLA, (48, 1), 16) }.build(b)
    });
    c.add(
        "fp8_ds_mla cache, N 16, bs 64, T 4, topk 96, q / out / lse / indices strided, 2-layer pool",
        |b| Sparse { fp8: true, strided: true, ..Sparse::new(4, 16, MLA, (3, 64), 96) }.build(b),
    );
}

/// The indexer over sequences of `lens` cached tokens, the last `queries[b]` of each being
/// this step's queries (decode: 1), plus one padding query (position -1) at the end.
#[derive(Clone)]
struct Indexer {
    lens: Vec<i64>,
    queries: Vec<i64>,
    h: i64,
    di: i64,
    bs: i64,
    topk: i64,
    /// Every cache row repeats one of this many keys (exact ties); 0: all random.
    distinct_keys: usize,
    /// Positions as i64 (the block's rotary positions) instead of i32.
    i64_positions: bool,
    /// Weights in f32 instead of the op's dtype.
    f32_weights: bool,
    /// query / weights / out are views into wider buffers, the cache is layer 1 of a
    /// 2-layer pool.
    strided: bool,
}

impl Indexer {
    fn new(lens: &[i64], queries: &[i64], (h, di): (i64, i64), bs: i64, topk: i64) -> Indexer {
        Indexer {
            lens: lens.to_vec(),
            queries: queries.to_vec(),
            h,
            di,
            bs,
            topk,
            distinct_keys: 0,
            i64_positions: false,
            f32_weights: false,
            strided: false,
        }
    }

    fn build(self, b: &mut Builder) -> Exec {
        let Indexer { lens, queries, h, di, bs, topk, distinct_keys, i64_positions, f32_weights, strided } =
            self;
        let nseq = lens.len() as i64;
        let (nb, mb, table) = block_table(b, &lens, bs, 2);
        let pool = if strided { (2, 1) } else { (1, 0) };
        // Values on the 1/8 grid: every score is exact in f32 whatever the summation order,
        // so a backend's selection (tensor cores included) equals the CPU's exactly.
        let rows = (nb * pool.0 * bs) as usize;
        let vals = if distinct_keys == 0 {
            grid_values(b, rows * di as usize)
        } else {
            let keys: Vec<Vec<f64>> = (0..distinct_keys).map(|_| grid_values(b, di as usize)).collect();
            (0..rows).flat_map(|_| keys[b.rng.gen_range(0..distinct_keys)].clone()).collect()
        };
        let full = b.values("cache pool", Ty::Float, &[nb, pool.0, bs, di], vals);
        let cache = full.sub(pool.1 * bs * di, &[nb, bs, di], &[pool.0 * bs * di, di, 1]);
        let (mut seq_ids, mut positions) = (Vec::new(), Vec::new());
        for (s, (&len, &nq)) in lens.iter().zip(&queries).enumerate() {
            for i in 0..nq {
                seq_ids.push(s as f64);
                positions.push((len - nq + i) as f64);
            }
        }
        seq_ids.push(0.0);
        positions.push(-1.0);
        let t = seq_ids.len() as i64;
        let pad = if strided { 4 } else { 0 };
        let qw = di + pad;
        let qv = grid_values(b, (t * h * qw) as usize);
        let query = b.values("query", Ty::Float, &[t, h, qw], qv).sub(pad / 2, &[t, h, di], &[h * qw, qw, 1]);
        let wty = if f32_weights { Ty::F32 } else { Ty::Float };
        let wv = grid_values(b, (t * (h + pad)) as usize);
        let weights = b.values("weights", wty, &[t, h + pad], wv).sub(0, &[t, h], &[h + pad, 1]);
        let ow = topk + pad;
        let out =
            b.values("out", Ty::I32, &[t, ow], vec![-7.0; (t * ow) as usize]).sub(0, &[t, topk], &[ow, 1]);
        b.output("out", &out);
        let block_table = b.values("block_table", Ty::I32, &[nseq, mb], table);
        let seq_ids: View = b.values("seq_ids", Ty::I32, &[t], seq_ids);
        let pty = if i64_positions { Ty::I64 } else { Ty::I32 };
        let positions = b.values("positions", pty, &[t], positions);
        let scale = 1.0 / (di as f32).sqrt();
        Box::new(move |queue, bufs| {
            vt_core::indexer_top_k(
                queue,
                &vt_core::IndexerTopKArgs {
                    out: out.tensor(bufs)?,
                    query: query.tensor(bufs)?,
                    weights: weights.tensor(bufs)?,
                    cache: cache.tensor(bufs)?,
                    block_table: block_table.tensor(bufs)?,
                    seq_ids: seq_ids.tensor(bufs)?,
                    positions: positions.tensor(bufs)?,
                    scale,
                },
            )
        })
    }
}

/// `n` values k / 8, k uniform in -8..=8: exact in every float dtype, and sums of their
/// products stay exact in f32 at the indexer's sizes.
fn grid_values(b: &mut Builder, n: usize) -> Vec<f64> {
    (0..n).map(|_| b.rng.gen_range(-8..=8) as f64 / 8.0).collect()
}

pub(super) fn indexer_top_k(c: &mut Cases) {
    const V32: (i64, i64) = (64, 128);
    const SMALL: (i64, i64) = (4, 16);
    c.add("DeepSeek-V3.2 dims (H 64, Di 128), bs 64, decode: lens [1, 70, 200], topk 64", |b| {
        Indexer::new(&[1, 70, 200], &[1, 1, 1], V32, 64, 64).build(b)
    });
    c.add("H 64, Di 128, bs 64, prefill: lens [40, 90] with 40 and 9 queries, topk 32, i64 positions", |b| {
        Indexer { i64_positions: true, ..Indexer::new(&[40, 90], &[40, 9], V32, 64, 32) }.build(b)
    });
    c.add("small dims (H 4, Di 16), bs 1, lens [5, 23, 0], queries [5, 2, 0], topk 8", |b| {
        Indexer::new(&[5, 23, 0], &[5, 2, 0], SMALL, 1, 8).build(b)
    });
    c.add("small dims, bs 16, lens [33, 50], 3 distinct keys (exact ties), topk 20", |b| {
        Indexer { distinct_keys: 3, ..Indexer::new(&[33, 50], &[4, 3], SMALL, 16, 20) }.build(b)
    });
    c.add(
        "small dims, bs 16, lens [17, 64], f32 weights, query / weights / out = views into wider \
         buffers, cache = layer 1 of a 2-layer pool, topk 16",
        |b| {
            Indexer { strided: true, f32_weights: true, ..Indexer::new(&[17, 64], &[2, 5], SMALL, 16, 16) }
                .build(b)
        },
    );
    c.add("H 64, Di 128, bs 64, lens [300], 4 queries, topk 2048 (more than visible: -1 padding)", |b| {
        Indexer::new(&[300], &[4], V32, 64, 2048).build(b)
    });
}

/// Writes `t` tokens' indexer keys (a column slice of a wider `[T, Di + 8]` buffer when
/// `strided`, the cache then layer 1 of a 2-layer pool) into distinct random slots of a
/// poisoned cache, `padding` of them -1.
fn cache_keys(b: &mut Builder, t: i64, di: i64, (nb, bs): (i64, i64), padding: usize, strided: bool) -> Exec {
    let pad = if strided { 8 } else { 0 };
    let k = b.uniform("k", &[t, di + pad], -1.0, 1.0).sub(pad / 2, &[t, di], &[di + pad, 1]);
    let mut slots: Vec<i64> = (0..nb * bs).collect();
    slots.shuffle(&mut b.rng);
    slots.truncate(t as usize);
    let mut order: Vec<usize> = (0..slots.len()).collect();
    order.shuffle(&mut b.rng);
    for &i in order.iter().take(padding) {
        slots[i] = -1;
    }
    let pool = if strided { (2, 1) } else { (1, 0) };
    let cache = paged_cache(b, nb, bs, di, pool, true);
    let mut mask = vec![false; b.len_of(cache.buf)];
    for &s in slots.iter().filter(|&&s| s >= 0) {
        cache.slice(0, s / bs, s / bs + 1).slice(1, s % bs, s % bs + 1).mark(&mut mask);
    }
    b.output_mask("cache", cache.buf, mask);
    let slot_mapping = b.values("slot_mapping", Ty::I64, &[t], as_f64(&slots));
    Box::new(move |q, bufs| {
        vt_core::cache_indexer_keys(
            q,
            &vt_core::CacheIndexerKeysArgs {
                k: k.tensor(bufs)?,
                cache: cache.tensor(bufs)?,
                slot_mapping: slot_mapping.tensor(bufs)?,
            },
        )
    })
}

pub(super) fn cache_indexer_keys(c: &mut Cases) {
    c.add("Di 16, bs 1, T 5 with 1 padding slot", |b| cache_keys(b, 5, 16, (8, 1), 1, false));
    c.add(
        "Di 128, bs 16, T 9 with 2 padding slots, k = column slice, cache = layer 1 of a 2-layer pool",
        |b| cache_keys(b, 9, 128, (4, 16), 2, true),
    );
    c.add("Di 128 (DeepSeek-V3.2), bs 64, T 70 over 3 blocks", |b| cache_keys(b, 70, 128, (3, 64), 0, false));
    c.add("Di 32, bs 16, T 16 filling every slot of one block", |b| cache_keys(b, 16, 32, (1, 16), 0, false));
    c.add("Di 16, bs 4, T 3 all padding (nothing written)", |b| cache_keys(b, 3, 16, (2, 4), 3, false));
}
