//! ConcatAndCacheMla, GatherMlaCache and ConcatMlaNopeRope: the copies.

use rand::seq::SliceRandom;

use super::{as_f64, block_table, cumulative, paged_cache};
use crate::case::{Builder, Cases, Exec, Ty, View};

/// Writes `t` tokens' `[kv_c | k_pe]` rows into a paged cache of `nb` blocks of `bs`
/// rows (layer `pool.1` of a pool of `pool.0` layers) at distinct random slots, `padding`
/// of them -1. With `one_row`, kv_c and k_pe are slices of one kv row buffer `[T, L+R]`.
struct Concat {
    t: i64,
    l: i64,
    r: i64,
    bs: i64,
    nb: i64,
    padding: usize,
    pool: (i64, i64),
    one_row: bool,
}

impl Concat {
    fn build(self, b: &mut Builder) -> Exec {
        let Concat { t, l, r, bs, nb, padding, pool, one_row } = self;
        let w = l + r;
        let (kv_c, k_pe) = if one_row {
            let kv = b.uniform("kv", &[t, w], -1.0, 1.0);
            (kv.sub(0, &[t, l], &[w, 1]), kv.sub(l, &[t, r], &[w, 1]))
        } else {
            (b.uniform("kv_c", &[t, l], -1.0, 1.0), b.uniform("k_pe", &[t, r], -1.0, 1.0))
        };
        let mut slots: Vec<i64> = (0..nb * bs).collect();
        slots.shuffle(&mut b.rng);
        slots.truncate(t as usize);
        let mut order: Vec<usize> = (0..slots.len()).collect();
        order.shuffle(&mut b.rng);
        for &i in order.iter().take(padding) {
            slots[i] = -1;
        }
        let cache = paged_cache(b, nb, bs, w, pool, true);
        concat_exec(b, kv_c, k_pe, cache, bs, t, &slots)
    }
}

/// The output and the call of a ConcatAndCacheMla case, shared with the fp8_ds_mla cases
/// (which differ only in their inputs and cache): the cache rows of `slots` (block `s / bs`,
/// row `s % bs`; -1 is padding, nothing written) are the output; `t` tokens.
pub(super) fn concat_exec(
    b: &mut Builder,
    kv_c: View,
    k_pe: View,
    cache: View,
    bs: i64,
    t: i64,
    slots: &[i64],
) -> Exec {
    let mut mask = vec![false; b.len_of(cache.buf)];
    for &s in slots.iter().filter(|&&s| s >= 0) {
        cache.slice(0, s / bs, s / bs + 1).slice(1, s % bs, s % bs + 1).mark(&mut mask);
    }
    b.output_mask("cache", cache.buf, mask);
    let slot_mapping = b.values("slot_mapping", Ty::I64, &[t], as_f64(slots));
    Box::new(move |q, bufs| {
        vt_core::concat_and_cache_mla(
            q,
            &vt_core::ConcatAndCacheMlaArgs {
                kv_c: kv_c.tensor(bufs)?,
                k_pe: k_pe.tensor(bufs)?,
                cache: cache.tensor(bufs)?,
                slot_mapping: slot_mapping.tensor(bufs)?,
            },
        )
    })
}

pub(super) fn concat_and_cache_mla(c: &mut Cases) {
    c.add(
        "bs 16, L 512, R 64, T 9 with 2 padding slots, cache = layer 1 of a 2-layer pool, \
         kv_c / k_pe = slices of kv rows",
        |b| Concat { t: 9, l: 512, r: 64, bs: 16, nb: 4, padding: 2, pool: (2, 1), one_row: true }.build(b),
    );
    c.add("bs 1, L 32, R 16, T 5 with 1 padding slot", |b| {
        Concat { t: 5, l: 32, r: 16, bs: 1, nb: 8, padding: 1, pool: (1, 0), one_row: false }.build(b)
    });
    c.add("bs 64, L 512, R 64, T 70 over 3 blocks, slices of kv rows", |b| {
        Concat { t: 70, l: 512, r: 64, bs: 64, nb: 3, padding: 0, pool: (1, 0), one_row: true }.build(b)
    });
    c.add("bs 16, every slot padding (nothing written), cache = layer 0 of a 3-layer pool", |b| {
        Concat { t: 3, l: 32, r: 16, bs: 16, nb: 2, padding: 3, pool: (3, 0), one_row: false }.build(b)
    });
}

/// Gathers `lens[b]` cached rows of each sequence, from `starts[b]` on (chunked context)
/// when given, into a workspace with `spare` rows past the end (left untouched) whose
/// rows are `d + out_pad` wide. The cache is layer `pool.1` of a pool of `pool.0`.
struct Gather {
    lens: Vec<i64>,
    starts: Option<Vec<i64>>,
    bs: i64,
    d: i64,
    spare: i64,
    out_pad: i64,
    pool: (i64, i64),
}

impl Gather {
    fn build(self, b: &mut Builder) -> Exec {
        let Gather { lens, starts, bs, d, spare, out_pad, pool } = self;
        let nseq = lens.len() as i64;
        let from = starts.clone().unwrap_or_else(|| vec![0; lens.len()]);
        let needs: Vec<i64> = lens.iter().zip(&from).map(|(l, s)| l + s).collect();
        let (nb, mb, table) = block_table(b, &needs, bs, 2);
        let cache = paged_cache(b, nb, bs, d, pool, false);
        let block_table = b.values("block_table", Ty::I32, &[nseq, mb], table);
        let cu = b.values("cu_seq_lens", Ty::I32, &[nseq + 1], cumulative(&lens));
        let seq_starts = starts.map(|s| b.values("seq_starts", Ty::I32, &[nseq], as_f64(&s)));
        let total: i64 = lens.iter().sum();
        let ld = d + out_pad;
        let out = b.poison("out", Ty::Float, &[total + spare, ld]).sub(0, &[total + spare, d], &[ld, 1]);
        b.output("out", &out.slice(0, 0, total));
        gather_exec(out, cache, block_table, cu, seq_starts)
    }
}

/// The call of a GatherMlaCache case, shared with the fp8_ds_mla cases (which differ only
/// in their cache and workspace).
pub(super) fn gather_exec(
    out: View,
    cache: View,
    block_table: View,
    cu_seq_lens: View,
    seq_starts: Option<View>,
) -> Exec {
    Box::new(move |q, bufs| {
        let seq_starts = seq_starts.as_ref().map(|s| s.tensor(bufs)).transpose()?;
        vt_core::gather_mla_cache(
            q,
            &vt_core::GatherMlaCacheArgs {
                out: out.tensor(bufs)?,
                cache: cache.tensor(bufs)?,
                block_table: block_table.tensor(bufs)?,
                cu_seq_lens: cu_seq_lens.tensor(bufs)?,
                seq_starts: (seq_starts.as_ref()).copied(),
            },
        )
    })
}

pub(super) fn gather_mla_cache(c: &mut Cases) {
    c.add("bs 16, D 576, lens [5, 0, 40], 4 spare workspace rows", |b| {
        Gather { lens: vec![5, 0, 40], starts: None, bs: 16, d: 576, spare: 4, out_pad: 0, pool: (1, 0) }
            .build(b)
    });
    c.add("bs 1, D 64, chunked context: seq_starts [3, 0, 10], lens [4, 2, 7]", |b| {
        Gather {
            lens: vec![4, 2, 7],
            starts: Some(vec![3, 0, 10]),
            bs: 1,
            d: 64,
            spare: 0,
            out_pad: 0,
            pool: (1, 0),
        }
        .build(b)
    });
    c.add(
        "bs 64, D 576, seq_starts [64, 0], lens [130, 1], cache = layer 1 of a 2-layer pool, \
         out rows 600 wide",
        |b| {
            Gather {
                lens: vec![130, 1],
                starts: Some(vec![64, 0]),
                bs: 64,
                d: 576,
                spare: 2,
                out_pad: 24,
                pool: (2, 1),
            }
            .build(b)
        },
    );
    c.add("bs 16, D 64, seq_starts off block boundaries [5, 17, 30], lens [20, 3, 2]", |b| {
        Gather {
            lens: vec![20, 3, 2],
            starts: Some(vec![5, 17, 30]),
            bs: 16,
            d: 64,
            spare: 1,
            out_pad: 0,
            pool: (1, 0),
        }
        .build(b)
    });
    c.add(
        "vector path over many blocks: bs 64, D 576, seq_starts [0, 130, 64], lens [200, 77, 64], \
         out rows 584 wide",
        |b| {
            Gather {
                lens: vec![200, 77, 64],
                starts: Some(vec![0, 130, 64]),
                bs: 64,
                d: 576,
                spare: 3,
                out_pad: 8,
                pool: (2, 1),
            }
            .build(b)
        },
    );
    c.add("narrow rows (lanes per row < 32): bs 4, D 24, lens [9, 30], seq_starts [2, 0]", |b| {
        Gather {
            lens: vec![9, 30],
            starts: Some(vec![2, 0]),
            bs: 4,
            d: 24,
            spare: 1,
            out_pad: 0,
            pool: (1, 0),
        }
        .build(b)
    });
    c.add("D 36: whole 16-byte vectors in f32 only (16-bit dtypes take the scalar fallback)", |b| {
        Gather { lens: vec![7, 12], starts: None, bs: 8, d: 36, spare: 2, out_pad: 0, pool: (2, 0) }.build(b)
    });
    c.add("scalar fallback: out rows 67 wide (row stride not whole vectors), bs 16, D 64", |b| {
        Gather {
            lens: vec![3, 20],
            starts: Some(vec![1, 0]),
            bs: 16,
            d: 64,
            spare: 1,
            out_pad: 3,
            pool: (1, 0),
        }
        .build(b)
    });
    c.add("bs 16, every sequence empty: lens [0, 0], 3 spare rows", |b| {
        Gather { lens: vec![0, 0], starts: None, bs: 16, d: 32, spare: 3, out_pad: 0, pool: (1, 0) }.build(b)
    });
}

pub(super) fn concat_mla_nope_rope(c: &mut Cases) {
    c.add(
        "broadcast rope: k_pe [T 5, 1, 64] = cols 512.. of kv rows [T, 576]; nope = k_nope \
         [T, N 16, 128] = slice of kv_b output [T, N, 128+128]",
        |b| {
            let (t, n, p, r, v, l) = (5, 16, 128, 64, 128, 512);
            let nope =
                b.uniform("kv_b out", &[t, n, p + v], -1.0, 1.0).sub(0, &[t, n, p], &[n * (p + v), p + v, 1]);
            let rope = b.uniform("kv rows", &[t, l + r], -1.0, 1.0).sub(l, &[t, 1, r], &[l + r, r, 1]);
            let out = b.poison("out", Ty::Float, &[t, n, p + r]);
            concat(b, out, nope, rope)
        },
    );
    c.add("per-head rope: q_pe [T 4, N 4, 16] = cols 32.. of q [T, N, 48]; contiguous nope", |b| {
        let (t, n, p, r) = (4, 4, 32, 16);
        let nope = b.uniform("nope", &[t, n, p], -1.0, 1.0);
        let rope = b.uniform("q", &[t, n, p + r], -1.0, 1.0).sub(p, &[t, n, r], &[n * (p + r), p + r, 1]);
        let out = b.poison("out", Ty::Float, &[t, n, p + r]);
        concat(b, out, nope, rope)
    });
    c.add("transposed nope [T 3, N 4, 32] = view of [N, T, 32]; out = view into rows 8 wider", |b| {
        let (t, n, p, r) = (3, 4, 32, 16);
        let nope = b.uniform("nope [N, T, P]", &[n, t, p], -1.0, 1.0).sub(0, &[t, n, p], &[p, t * p, 1]);
        let rope = b.uniform("rope", &[t, 1, r], -1.0, 1.0);
        let w = p + r + 8;
        let out = b.poison("out", Ty::Float, &[t, n, w]).sub(0, &[t, n, p + r], &[n * w, w, 1]);
        concat(b, out, nope, rope)
    });
    c.add("decode: T 1, N 128, P 128, broadcast rope R 64", |b| {
        let (t, n, p, r) = (1, 128, 128, 64);
        let nope = b.uniform("nope", &[t, n, p], -1.0, 1.0);
        let rope = b.uniform("rope", &[t, 1, r], -1.0, 1.0);
        let out = b.poison("out", Ty::Float, &[t, n, p + r]);
        concat(b, out, nope, rope)
    });
    // The CUDA vector path (16-byte accesses) in chunks of heads: 100 heads split into
    // chunks of 7 or 5 head groups x 8 heads, the last chunk part empty.
    c.add(
        "vector path: T 9, N 100 (a part-empty last head chunk), P 128, broadcast R 64 = kv row tail",
        |b| {
            let (t, n, p, r, v, l) = (9, 100, 128, 64, 128, 512);
            let nope =
                b.uniform("kv_b out", &[t, n, p + v], -1.0, 1.0).sub(0, &[t, n, p], &[n * (p + v), p + v, 1]);
            let rope = b.uniform("kv rows", &[t, l + r], -1.0, 1.0).sub(l, &[t, 1, r], &[l + r, r, 1]);
            let out = b.poison("out", Ty::Float, &[t, n, p + r]);
            concat(b, out, nope, rope)
        },
    );
    c.add("vector path, rows over 256 vectors (column loop): T 2, N 3, P 2048, per-head R 64", |b| {
        let (t, n, p, r) = (2, 3, 2048, 64);
        let nope = b.uniform("nope", &[t, n, p], -1.0, 1.0);
        let rope = b.uniform("rope", &[t, n, r], -1.0, 1.0);
        let out = b.poison("out", Ty::Float, &[t, n, p + r]);
        concat(b, out, nope, rope)
    });
    c.add(
        "vector path, transposed views: out and per-head rope [T 6, N 10, .] over [N, T, .] buffers",
        |b| {
            let (t, n, p, r) = (6, 10, 64, 32);
            let nope = b.uniform("nope [N, T, P]", &[n, t, p], -1.0, 1.0).sub(0, &[t, n, p], &[p, t * p, 1]);
            let rope = b.uniform("rope [N, T, R]", &[n, t, r], -1.0, 1.0).sub(0, &[t, n, r], &[r, t * r, 1]);
            let w = p + r;
            let out = b.poison("out [N, T, P+R]", Ty::Float, &[n, t, w]).sub(0, &[t, n, w], &[w, t * w, 1]);
            concat(b, out, nope, rope)
        },
    );
    c.add(
        "scalar fallback: rope at an odd column (kv rows 579 wide), T 4, N 8, P 128, broadcast R 64",
        |b| {
            let (t, n, p, r, l) = (4, 8, 128, 64, 515);
            let nope = b.uniform("nope", &[t, n, p], -1.0, 1.0);
            let rope = b.uniform("kv rows", &[t, l + r], -1.0, 1.0).sub(l, &[t, 1, r], &[l + r, r, 1]);
            let out = b.poison("out", Ty::Float, &[t, n, p + r]);
            concat(b, out, nope, rope)
        },
    );
    c.add("P 20, R 12: whole 16-byte vectors in f32 only (16-bit dtypes take the scalar fallback)", |b| {
        let (t, n, p, r) = (5, 6, 20, 12);
        let nope = b.uniform("nope", &[t, n, p], -1.0, 1.0);
        let rope = b.uniform("rope", &[t, 1, r], -1.0, 1.0);
        let out = b.poison("out", Ty::Float, &[t, n, p + r]);
        concat(b, out, nope, rope)
    });
    c.add("scalar fallback: out starts one element into its buffer, T 3, N 4, P 64, R 64", |b| {
        let (t, n, p, r) = (3, 4, 64, 64);
        let nope = b.uniform("nope", &[t, n, p], -1.0, 1.0);
        let rope = b.uniform("rope", &[t, 1, r], -1.0, 1.0);
        let w = p + r;
        let out = b.poison("out", Ty::Float, &[t * n * w + 1]).sub(1, &[t, n, w], &[n * w, w, 1]);
        concat(b, out, nope, rope)
    });
}

fn concat(b: &mut Builder, out: crate::case::View, nope: crate::case::View, rope: crate::case::View) -> Exec {
    b.output("out", &out);
    Box::new(move |q, bufs| {
        vt_core::concat_mla_nope_rope(
            q,
            &vt_core::ConcatMlaNopeRopeArgs {
                out: out.tensor(bufs)?,
                nope: nope.tensor(bufs)?,
                rope: rope.tensor(bufs)?,
            },
        )
    })
}
