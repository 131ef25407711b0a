//! RmsNorm, LayerNorm, RopeFromCache and FusedNormRope.

use rand::seq::SliceRandom;

use super::{as_f64, paged_cache, rotary_inputs};
use crate::case::{Builder, Cases, Exec, Ty};

const EPS: f32 = 1e-6;

/// `out = RmsNorm(x)` for `x` = columns `x_off..x_off+D` of rows `x_ld` wide; `out` the
/// same inside rows `out_ld` wide at `out_off`, or `x` itself (`out = None`: in place).
struct RmsNorm {
    t: i64,
    d: i64,
    x: (i64, i64),
    out: Option<(i64, i64)>,
}

impl RmsNorm {
    fn build(self, b: &mut Builder) -> Exec {
        let RmsNorm { t, d, x: (x_ld, x_off), out } = self;
        let x = b.uniform("x", &[t, x_ld], -1.0, 1.0).sub(x_off, &[t, d], &[x_ld, 1]);
        let weight = b.uniform("weight", &[d], 0.5, 1.5);
        let out = match out {
            Some((ld, off)) => b.poison("out", Ty::Float, &[t, ld]).sub(off, &[t, d], &[ld, 1]),
            None => x.clone(),
        };
        b.output("out", &out);
        Box::new(move |q, bufs| {
            vt_core::rms_norm(
                q,
                &vt_core::RmsNormArgs {
                    out: out.tensor(bufs)?,
                    x: x.tensor(bufs)?,
                    weight: weight.tensor(bufs)?,
                    eps: EPS,
                },
            )
        })
    }
}

pub(super) fn rms_norm(c: &mut Cases) {
    c.add("contiguous T 4, D 512", |b| RmsNorm { t: 4, d: 512, x: (512, 0), out: Some((512, 0)) }.build(b));
    c.add("kv_c = latent slice of kv rows [T 6, 512+64], out = cols 8..520 of rows of 520", |b| {
        RmsNorm { t: 6, d: 512, x: (576, 0), out: Some((520, 8)) }.build(b)
    });
    c.add("in place (out = x), T 3, D 1536 = q_lora slice of the merged A-proj rows (stride 2112)", |b| {
        RmsNorm { t: 3, d: 1536, x: (2112, 0), out: None }.build(b)
    });
    c.add("odd width D 100 at column 3 of rows of 104, T 5", |b| {
        RmsNorm { t: 5, d: 100, x: (104, 3), out: Some((100, 0)) }.build(b)
    });
    c.add("no tokens: T 0, D 64", |b| RmsNorm { t: 0, d: 64, x: (64, 0), out: Some((64, 0)) }.build(b));
}

/// In-place rope of `q` = the trailing R columns of each of `hq` heads `q_w` wide, and
/// optionally `k` = the trailing R columns of `hk` heads `k_w` wide.
struct Rope {
    t: i64,
    hq: i64,
    q_w: i64,
    r: i64,
    k: Option<(i64, i64)>,
    neox: bool,
}

impl Rope {
    fn build(self, b: &mut Builder) -> Exec {
        let Rope { t, hq, q_w, r, k, neox } = self;
        let q = b.uniform("q", &[t, hq, q_w], -1.0, 1.0).sub(q_w - r, &[t, hq, r], &[hq * q_w, q_w, 1]);
        b.output("q", &q);
        let k = k.map(|(hk, k_w)| {
            let k = b.uniform("k", &[t, hk, k_w], -1.0, 1.0).sub(k_w - r, &[t, hk, r], &[hk * k_w, k_w, 1]);
            b.output("k", &k);
            k
        });
        let (positions, cos_sin) = rotary_inputs(b, t, r, 300);
        Box::new(move |queue, bufs| {
            let k = k.as_ref().map(|k| k.tensor(bufs)).transpose()?;
            vt_core::rope_from_cache(
                queue,
                &vt_core::RopeFromCacheArgs {
                    query: q.tensor(bufs)?,
                    key: (k.as_ref()).copied(),
                    positions: positions.tensor(bufs)?,
                    cos_sin_cache: cos_sin.tensor(bufs)?,
                    is_neox: neox,
                },
            )
        })
    }
}

pub(super) fn rope_from_cache(c: &mut Cases) {
    fn mla(neox: bool) -> Rope {
        Rope { t: 5, hq: 16, q_w: 192, r: 64, k: Some((1, 576)), neox }
    }
    c.add("neox, q_pe = cols 128..192 of 16 heads of q [T 5, 16, 192], k_pe = cols 512.. of kv rows [T, 1, 576]", |b| {
        mla(true).build(b)
    });
    c.add("GPT-J pairs, same views as above", |b| mla(false).build(b));
    c.add("neox, q only, T 1, 4 heads of R 32 (whole head)", |b| {
        Rope { t: 1, hq: 4, q_w: 32, r: 32, k: None, neox: true }.build(b)
    });
    c.add("GPT-J, k with as many heads as q (4), R 16, T 9, heads 24 / 40 wide", |b| {
        Rope { t: 9, hq: 4, q_w: 24, r: 16, k: Some((4, 40)), neox: false }.build(b)
    });
    c.add("no tokens: T 0", |b| Rope { t: 0, hq: 2, q_w: 16, r: 16, k: Some((1, 16)), neox: true }.build(b));
}

/// FusedNormRope of `kv` = columns `lead..lead+L+R` of rows `lead+L+R` wide (the merged
/// A-projection output); with `strided_out` the outputs are views into wider rows.
/// `query`: also rotate the first `tq` tokens' query `[tq, heads, R]`; `cache`: also write
/// the rows into a paged cache (see [`NormRopeQueryCase`], [`NormRopeCacheCase`]).
struct NormRope {
    t: i64,
    l: i64,
    r: i64,
    lead: i64,
    neox: bool,
    strided_out: bool,
    query: Option<NormRopeQueryCase>,
    cache: Option<NormRopeCacheCase>,
}

/// The optional query of a FusedNormRope case: `tq` tokens of `heads` heads, the rope part
/// of rows `lead + R` wide (the block's q_raw rows). `in_place`: the output is the input;
/// else a view into rows `heads * (lat + R)` wide at column `lat` (the block's decode query
/// `[B, N, L+R]`, its rope columns).
struct NormRopeQueryCase {
    tq: i64,
    heads: i64,
    lead: i64,
    in_place: bool,
    lat: i64,
}

/// The optional cache write: `nb` blocks of `bs` rows, layer `pool.1` of `pool.0`,
/// distinct random slots, `padding` of them -1 (as ConcatAndCacheMla's cases).
struct NormRopeCacheCase {
    bs: i64,
    nb: i64,
    padding: usize,
    pool: (i64, i64),
}

impl NormRope {
    fn build(self, b: &mut Builder) -> Exec {
        let NormRope { t, l, r, lead, neox, strided_out, query, cache } = self;
        let w = lead + l + r;
        let kv = b.uniform("kv", &[t, w], -1.0, 1.0).sub(lead, &[t, l + r], &[w, 1]);
        let weight = b.uniform("weight", &[l], 0.5, 1.5);
        let (latent, rope) = if strided_out {
            let latent = b.poison("latent_out", Ty::Float, &[t, l + 8]).sub(4, &[t, l], &[l + 8, 1]);
            let rope = b.poison("rope_out", Ty::Float, &[t, r + 16]).sub(16, &[t, r], &[r + 16, 1]);
            (latent, rope)
        } else {
            (b.poison("latent_out", Ty::Float, &[t, l]), b.poison("rope_out", Ty::Float, &[t, r]))
        };
        b.output("latent_out", &latent);
        b.output("rope_out", &rope);
        let query = query.map(|c| {
            let qw = c.lead + r;
            let input = b.uniform("query.input", &[t, c.heads, qw], -1.0, 1.0).sub(
                c.lead,
                &[c.tq, c.heads, r],
                &[c.heads * qw, qw, 1],
            );
            let out = if c.in_place {
                input.clone()
            } else {
                let ow = c.lat + r;
                b.poison("query.out", Ty::Float, &[c.tq, c.heads, ow]).sub(
                    c.lat,
                    &[c.tq, c.heads, r],
                    &[c.heads * ow, ow, 1],
                )
            };
            b.output("query.out", &out);
            (input, out)
        });
        let cache = cache.map(|c| {
            let mut slots: Vec<i64> = (0..c.nb * c.bs).collect();
            slots.shuffle(&mut b.rng);
            slots.truncate(t as usize);
            let mut order: Vec<usize> = (0..slots.len()).collect();
            order.shuffle(&mut b.rng);
            for &i in order.iter().take(c.padding) {
                slots[i] = -1;
            }
            let kv_cache = paged_cache(b, c.nb, c.bs, l + r, c.pool, true);
            let mut mask = vec![false; b.len_of(kv_cache.buf)];
            for &s in slots.iter().filter(|&&s| s >= 0) {
                kv_cache.slice(0, s / c.bs, s / c.bs + 1).slice(1, s % c.bs, s % c.bs + 1).mark(&mut mask);
            }
            b.output_mask("cache_write.cache", kv_cache.buf, mask);
            let slot_mapping = b.values("cache_write.slot_mapping", Ty::I64, &[t], as_f64(&slots));
            (kv_cache, slot_mapping)
        });
        let (positions, cos_sin) = rotary_inputs(b, t, r, 300);
        Box::new(move |q, bufs| {
            let query = match &query {
                Some((i, o)) => Some(vt_core::NormRopeQuery { input: i.tensor(bufs)?, out: o.tensor(bufs)? }),
                None => None,
            };
            let cache_write = match &cache {
                Some((c, s)) => Some(vt_core::NormRopeCacheWrite {
                    cache: c.tensor(bufs)?,
                    slot_mapping: s.tensor(bufs)?,
                }),
                None => None,
            };
            vt_core::fused_norm_rope(
                q,
                &vt_core::FusedNormRopeArgs {
                    latent_out: latent.tensor(bufs)?,
                    rope_out: rope.tensor(bufs)?,
                    kv: kv.tensor(bufs)?,
                    weight: weight.tensor(bufs)?,
                    positions: positions.tensor(bufs)?,
                    cos_sin_cache: cos_sin.tensor(bufs)?,
                    eps: EPS,
                    is_neox: neox,
                    query,
                    cache_write,
                },
            )
        })
    }
}

pub(super) fn fused_norm_rope(c: &mut Cases) {
    let plain = |t, l, r, lead, neox, strided_out| NormRope {
        t,
        l,
        r,
        lead,
        neox,
        strided_out,
        query: None,
        cache: None,
    };
    c.add("L 512, R 64, neox, kv = cols 1536.. of the merged A-proj rows (stride 2112), T 5", move |b| {
        plain(5, 512, 64, 1536, true, false).build(b)
    });
    c.add("L 512, R 64, GPT-J, same views, T 3", move |b| plain(3, 512, 64, 1536, false, false).build(b));
    c.add("L 32, R 16, GPT-J, outputs = views into wider rows, T 7", move |b| {
        plain(7, 32, 16, 0, false, true).build(b)
    });
    c.add("L 512, R 64, neox, contiguous kv, T 1", move |b| plain(1, 512, 64, 0, true, false).build(b));
    c.add(
        "V3 decode step fused: L 512, R 64, GPT-J, T 6; query of the first 4 tokens (16 heads, \
         q_raw rows 192 wide) into the decode query's rope columns [4, 16, 576]; cache write, bs 16, \
         1 padding slot, layer 1 of 2",
        move |b| {
            NormRope {
                query: Some(NormRopeQueryCase { tq: 4, heads: 16, lead: 128, in_place: false, lat: 512 }),
                cache: Some(NormRopeCacheCase { bs: 16, nb: 2, padding: 1, pool: (2, 1) }),
                ..plain(6, 512, 64, 1536, false, false)
            }
            .build(b)
        },
    );
    c.add("neox, L 32, R 16, T 5, query in place for all 5 tokens (3 heads), no cache write", move |b| {
        NormRope {
            query: Some(NormRopeQueryCase { tq: 5, heads: 3, lead: 8, in_place: true, lat: 0 }),
            ..plain(5, 32, 16, 0, true, true)
        }
        .build(b)
    });
    c.add("GPT-J, L 32, R 16, T 9, cache write only, bs 1, 3 padding slots", move |b| {
        NormRope {
            cache: Some(NormRopeCacheCase { bs: 1, nb: 12, padding: 3, pool: (1, 0) }),
            ..plain(9, 32, 16, 0, false, false)
        }
        .build(b)
    });
}

/// `out = LayerNorm(x)` (weight and bias), laid out as [`RmsNorm`]'s cases; `x` is drawn
/// in `[lo, hi]`, so a case with a large offset tells a missing centering apart.
struct LayerNorm {
    t: i64,
    d: i64,
    x: (i64, i64),
    out: Option<(i64, i64)>,
    range: (f64, f64),
}

impl LayerNorm {
    fn build(self, b: &mut Builder) -> Exec {
        let LayerNorm { t, d, x: (x_ld, x_off), out, range: (lo, hi) } = self;
        let x = b.uniform("x", &[t, x_ld], lo, hi).sub(x_off, &[t, d], &[x_ld, 1]);
        let weight = b.uniform("weight", &[d], 0.5, 1.5);
        let bias = b.uniform("bias", &[d], -0.5, 0.5);
        let out = match out {
            Some((ld, off)) => b.poison("out", Ty::Float, &[t, ld]).sub(off, &[t, d], &[ld, 1]),
            None => x.clone(),
        };
        b.output("out", &out);
        Box::new(move |q, bufs| {
            vt_core::layer_norm(
                q,
                &vt_core::LayerNormArgs {
                    out: out.tensor(bufs)?,
                    x: x.tensor(bufs)?,
                    weight: weight.tensor(bufs)?,
                    bias: bias.tensor(bufs)?,
                    eps: EPS,
                },
            )
        })
    }
}

pub(super) fn layer_norm(c: &mut Cases) {
    c.add("contiguous T 5, D 128 (DeepSeek-V3.2's k_norm)", |b| {
        LayerNorm { t: 5, d: 128, x: (128, 0), out: Some((128, 0)), range: (-1.0, 1.0) }.build(b)
    });
    c.add(
        "in place (out = x), T 7, D 128 inside rows of 128 + 64 (k beside the weights_proj columns)",
        |b| LayerNorm { t: 7, d: 128, x: (192, 0), out: None, range: (-1.0, 1.0) }.build(b),
    );
    c.add("offset inputs in [2, 4] (the mean dominates), D 128 at column 8 of rows of 200", |b| {
        LayerNorm { t: 4, d: 128, x: (200, 8), out: Some((136, 4)), range: (2.0, 4.0) }.build(b)
    });
    c.add("odd width D 100 at column 3 of rows of 104, T 3", |b| {
        LayerNorm { t: 3, d: 100, x: (104, 3), out: Some((100, 0)), range: (-1.0, 1.0) }.build(b)
    });
    c.add("D 1000 (several elements a thread), T 2", |b| {
        LayerNorm { t: 2, d: 1000, x: (1000, 0), out: Some((1000, 0)), range: (-1.0, 1.0) }.build(b)
    });
    c.add("no tokens: T 0, D 128", |b| {
        LayerNorm { t: 0, d: 128, x: (128, 0), out: Some((128, 0)), range: (-1.0, 1.0) }.build(b)
    });
}
