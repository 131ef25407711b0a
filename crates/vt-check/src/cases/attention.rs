//! MlaDecodeAttention, PrefillAttention and MergeAttnStates.
//!
//! Queries are drawn from U(-4.5, 4.5) and keys from U(-1, 1) so that with the usual
//! scale 1/sqrt(D) the logits spread (std ~1.5) and the softmax is neither uniform nor
//! one-hot: a wrong scale, a dropped key or a misplaced causal edge moves the output.

use rand::Rng;
use vt_core::PrefillAttentionArgs;

use super::{as_f64, block_table, cumulative, paged_cache};
use crate::case::{Builder, Cases, Exec, Ty};

const Q_AMP: f64 = 4.5;

/// The MLA absorbed-decode dims: N heads, D = L + R, Dv = L.
const MLA: (i64, i64, i64) = (16, 576, 512);
/// MLA's D and Dv with fewer heads, for the long sequences (keeps the CPU side cheap).
const MLA_4_HEADS: (i64, i64, i64) = (4, 576, 512);
/// Small dims for the block-size sweep: cheap on the CPU, not multiples of 64.
const SMALL: (i64, i64, i64) = (4, 80, 64);

/// Decode over `lens` cached tokens per sequence with `s_q` query tokens each, in a
/// paged cache of block size `bs`. With `strided`, q / out / lse are views into wider
/// buffers and the cache is layer 1 of a 2-layer pool.
struct Decode {
    lens: Vec<i64>,
    s_q: i64,
    dims: (i64, i64, i64),
    bs: i64,
    lse: bool,
    strided: bool,
}

impl Decode {
    fn new(lens: &[i64], s_q: i64, dims: (i64, i64, i64), bs: i64) -> Decode {
        Decode { lens: lens.to_vec(), s_q, dims, bs, lse: true, strided: false }
    }

    fn build(self, b: &mut Builder) -> Exec {
        let Decode { lens, s_q, dims: (n, d, dv), bs, lse, strided } = self;
        let nseq = lens.len() as i64;
        let (nb, mb, table) = block_table(b, &lens, bs, 2);
        let pool = if strided { (2, 1) } else { (1, 0) };
        let cache = paged_cache(b, nb, bs, d, pool, false);
        let (q_pad, o_pad) = if strided { (16, 8) } else { (0, 0) };
        let (qw, ow) = (d + q_pad, dv + o_pad);
        let q = b.uniform("q", &[nseq, s_q, n, qw], -Q_AMP, Q_AMP).sub(
            q_pad / 2,
            &[nseq, s_q, n, d],
            &[s_q * n * qw, n * qw, qw, 1],
        );
        let out = b.poison("out", Ty::Float, &[nseq, s_q, n, ow]).sub(
            0,
            &[nseq, s_q, n, dv],
            &[s_q * n * ow, n * ow, ow, 1],
        );
        b.output("out", &out);
        let lse = lse.then(|| {
            let l = if strided {
                // Stored [B, s_q, N], viewed as the contract's [B, N, s_q].
                b.poison("lse", Ty::F32, &[nseq, s_q, n]).sub(0, &[nseq, n, s_q], &[s_q * n, 1, n])
            } else {
                b.poison("lse", Ty::F32, &[nseq, n, s_q])
            };
            b.output("lse", &l);
            l
        });
        let block_table = b.values("block_table", Ty::I32, &[nseq, mb], table);
        let seq_lens = b.values("seq_lens", Ty::I32, &[nseq], as_f64(&lens));
        let scale = 1.0 / (d as f32).sqrt();
        Box::new(move |queue, bufs| {
            let lse = lse.as_ref().map(|l| l.tensor(bufs)).transpose()?;
            vt_core::mla_decode_attention(
                queue,
                &vt_core::MlaDecodeAttentionArgs {
                    out: out.tensor(bufs)?,
                    lse: (lse.as_ref()).copied(),
                    query: q.tensor(bufs)?,
                    cache: cache.tensor(bufs)?,
                    block_table: block_table.tensor(bufs)?,
                    seq_lens: seq_lens.tensor(bufs)?,
                    scale,
                },
            )
        })
    }
}

pub(super) fn mla_decode_attention(c: &mut Cases) {
    c.add("MLA dims (N 16, D 576, Dv 512), bs 64, lens [1, 37, 130], s_q 1", |b| {
        Decode::new(&[1, 37, 130], 1, MLA, 64).build(b)
    });
    c.add("small dims (N 4, D 80, Dv 64), bs 1, lens [5, 1, 23], s_q 1", |b| {
        Decode::new(&[5, 1, 23], 1, SMALL, 1).build(b)
    });
    c.add("small dims, bs 16, lens [2, 17, 40, 0, 1], s_q 2 (len 1: first query sees no key)", |b| {
        Decode::new(&[2, 17, 40, 0, 1], 2, SMALL, 16).build(b)
    });
    c.add("D 576, Dv 512, 4 heads, bs 128, lens [129, 300, 7], s_q 1", |b| {
        Decode::new(&[129, 300, 7], 1, MLA_4_HEADS, 128).build(b)
    });
    c.add_long("D 576, Dv 512, 4 heads, bs 64, long and empty: lens [3000, 0, 17], s_q 1", |b| {
        Decode::new(&[3000, 0, 17], 1, MLA_4_HEADS, 64).build(b)
    });
    c.add(
        "small dims, bs 16, lens [33, 8], s_q 2, q / out / lse = views into wider buffers, \
         cache = layer 1 of a 2-layer pool",
        |b| Decode { strided: true, ..Decode::new(&[33, 8], 2, SMALL, 16) }.build(b),
    );
    c.add("MLA dims, bs 64, lens [65, 2], s_q 2, no lse", |b| {
        Decode { lse: false, ..Decode::new(&[65, 2], 2, MLA, 64) }.build(b)
    });
    c.add("128 heads (DeepSeek-V3), D 576, Dv 512, bs 64, lens [24, 3], s_q 1", |b| {
        Decode::new(&[24, 3], 1, (128, 576, 512), 64).build(b)
    });
}

/// Varlen attention over `seqs` = (query rows, key rows) per sequence. With `strided`,
/// q is a head-strided view, k / v are column slices of one `[Tk, N, D+Dv]` buffer, out
/// is a view into wider rows, and 3 query rows past the last sequence stay untouched.
struct Prefill {
    seqs: Vec<(i64, i64)>,
    dims: (i64, i64, i64),
    causal: bool,
    lse: bool,
    strided: bool,
}

impl Prefill {
    fn new(seqs: &[(i64, i64)], dims: (i64, i64, i64), causal: bool) -> Prefill {
        Prefill { seqs: seqs.to_vec(), dims, causal, lse: true, strided: false }
    }

    fn build(self, b: &mut Builder) -> Exec {
        let Prefill { seqs, dims: (n, d, dv), causal, lse, strided } = self;
        let lq: Vec<i64> = seqs.iter().map(|s| s.0).collect();
        let lk: Vec<i64> = seqs.iter().map(|s| s.1).collect();
        let total_q: i64 = lq.iter().sum();
        let tk: i64 = lk.iter().sum();
        let tq = total_q + if strided { 3 } else { 0 };
        let q = if strided {
            let w = d + 8;
            b.uniform("q", &[tq, n, w], -Q_AMP, Q_AMP).sub(8, &[tq, n, d], &[n * w, w, 1])
        } else {
            b.uniform("q", &[tq, n, d], -Q_AMP, Q_AMP)
        };
        let (k, v) = if strided {
            let w = d + dv;
            let kv = b.uniform("kv", &[tk, n, w], -1.0, 1.0);
            (kv.sub(0, &[tk, n, d], &[n * w, w, 1]), kv.sub(d, &[tk, n, dv], &[n * w, w, 1]))
        } else {
            (b.uniform("k", &[tk, n, d], -1.0, 1.0), b.uniform("v", &[tk, n, dv], -1.0, 1.0))
        };
        let out = if strided {
            let w = dv + 8;
            b.poison("out", Ty::Float, &[tq, n, w]).sub(0, &[tq, n, dv], &[n * w, w, 1])
        } else {
            b.poison("out", Ty::Float, &[tq, n, dv])
        };
        b.output("out", &out.slice(0, 0, total_q));
        let lse = lse.then(|| {
            let l = b.poison("lse", Ty::F32, &[n, tq]);
            b.output("lse", &l.slice(1, 0, total_q));
            l
        });
        let cu_q = b.values("cu_seqlens_q", Ty::I32, &[lq.len() as i64 + 1], cumulative(&lq));
        let cu_k = b.values("cu_seqlens_k", Ty::I32, &[lk.len() as i64 + 1], cumulative(&lk));
        let max_seqlen_q = lq.iter().copied().max().unwrap_or(0);
        let scale = 1.0 / (d as f32).sqrt();
        Box::new(move |queue, bufs| {
            let args = PrefillAttentionArgs {
                out: out.tensor(bufs)?,
                lse: lse.as_ref().map(|l| l.tensor(bufs)).transpose()?,
                query: q.tensor(bufs)?,
                k: k.tensor(bufs)?,
                v: v.tensor(bufs)?,
                cu_seqlens_q: cu_q.tensor(bufs)?,
                cu_seqlens_k: cu_k.tensor(bufs)?,
                max_seqlen_q,
                causal,
                scale,
            };
            vt_core::prefill_attention(queue, &args)
        })
    }
}

/// Small prefill dims (N 4, D 24, Dv 16) and the MLA prefill dims (D = P + R = 192, V 128).
const P_SMALL: (i64, i64, i64) = (4, 24, 16);
const P_MLA: (i64, i64, i64) = (4, 192, 128);

pub(super) fn prefill_attention(c: &mut Cases) {
    c.add("causal, lse, lq = lk: [5, 9, 1], small dims (N 4, D 24, Dv 16)", |b| {
        Prefill::new(&[(5, 5), (9, 9), (1, 1)], P_SMALL, true).build(b)
    });
    c.add("non-causal, lse, (lq, lk) [(3, 10), (0, 4), (6, 6), (2, 0)]", |b| {
        Prefill::new(&[(3, 10), (0, 4), (6, 6), (2, 0)], P_SMALL, false).build(b)
    });
    c.add(
        "causal bottom-right, lse, (lq, lk) [(4, 9), (5, 2), (1, 1), (3, 0)]: some queries see no key",
        |b| Prefill::new(&[(4, 9), (5, 2), (1, 1), (3, 0)], P_SMALL, true).build(b),
    );
    c.add(
        "MLA dims (N 4, D 192, Dv 128), causal, lse, head-strided q, k / v = slices of one \
         kv_b output, 3 spare query rows untouched, (lq, lk) [(7, 7), (12, 20)]",
        |b| Prefill { strided: true, ..Prefill::new(&[(7, 7), (12, 20)], P_MLA, true) }.build(b),
    );
    c.add("MLA dims, non-causal, no lse, strided views, (lq, lk) [(5, 8)]", |b| {
        Prefill { strided: true, lse: false, ..Prefill::new(&[(5, 8)], P_MLA, false) }.build(b)
    });
    c.add("MLA dims, causal, lse, one sequence of 200 tokens, N 2", |b| {
        Prefill::new(&[(200, 200)], (2, 192, 128), true).build(b)
    });
    // The tensor-core kernels' tiles (128 query rows, 128 keys on sm_90; 64 on sm_80):
    // lengths across tile edges, chunks with Tq < Tk, and every fast head-dim pair.
    c.add(
        "MLA dims, causal, lse, strided, varlen (lq, lk) [(129, 129), (1, 1), (0, 0), (300, 300), (64, 64)]",
        |b| {
            Prefill {
                strided: true,
                ..Prefill::new(&[(129, 129), (1, 1), (0, 0), (300, 300), (64, 64)], P_MLA, true)
            }
            .build(b)
        },
    );
    c.add("MLA dims, causal bottom-right chunk, lse, (lq, lk) [(100, 357), (130, 129), (200, 70)]", |b| {
        Prefill::new(&[(100, 357), (130, 129), (200, 70)], P_MLA, true).build(b)
    });
    c.add("MLA dims, non-causal chunk over context, lse, strided, (lq, lk) [(257, 700), (3, 1000)]", |b| {
        Prefill { strided: true, ..Prefill::new(&[(257, 700), (3, 1000)], P_MLA, false) }.build(b)
    });
    c.add("head dims (128, 128), causal, lse, (lq, lk) [(250, 250), (17, 300)], N 3", |b| {
        Prefill::new(&[(250, 250), (17, 300)], (3, 128, 128), true).build(b)
    });
    c.add("head dims (64, 64), non-causal, no lse, strided, (lq, lk) [(190, 190), (5, 260)], N 3", |b| {
        Prefill { strided: true, lse: false, ..Prefill::new(&[(190, 190), (5, 260)], (3, 64, 64), false) }
            .build(b)
    });
    c.add("MLA dims, causal, lse, one sequence of 1000 tokens, N 2 (8 query tiles, 8 key tiles)", |b| {
        Prefill::new(&[(1000, 1000)], (2, 192, 128), true).build(b)
    });
}

/// Which sides of a merge are empty (lse of -inf or +inf).
#[derive(Clone, Copy, PartialEq)]
enum Empty {
    None,
    /// Query tokens 0..5 get: prefix -inf, suffix -inf, both -inf, prefix +inf, suffix
    /// +inf with prefix -inf.
    FirstTokens,
    /// Both sides of every token: out = 0, out_lse = -inf.
    All,
}

/// Merges two partial results `[T, N, V]` by their lse, drawn uniform in `+-lse_range`.
/// With `strided`, prefix / suffix / out are views into wider rows and the lse tensors
/// are transposed views of `[T, N]` buffers.
struct Merge {
    t: i64,
    n: i64,
    v: i64,
    out_lse: bool,
    strided: bool,
    empty: Empty,
    lse_range: f64,
}

impl Merge {
    fn new(t: i64, n: i64, v: i64) -> Merge {
        Merge { t, n, v, out_lse: true, strided: false, empty: Empty::None, lse_range: 4.0 }
    }

    fn build(self, b: &mut Builder) -> Exec {
        let Merge { t, n, v, out_lse, strided, empty, lse_range } = self;
        let part = |b: &mut Builder, name: &str| {
            if strided {
                let w = v + 8;
                b.uniform(name, &[t, n, w], -1.0, 1.0).sub(8, &[t, n, v], &[n * w, w, 1])
            } else {
                b.uniform(name, &[t, n, v], -1.0, 1.0)
            }
        };
        // Element (head h, token i) of an lse tensor [N, T] in its buffer.
        let at = |h: i64, i: i64| (if strided { i * n + h } else { h * t + i }) as usize;
        let lse_view = |b: &mut Builder, name: &str, values: Option<Vec<f64>>| {
            let shape = if strided { [t, n] } else { [n, t] };
            let whole = match values {
                Some(vals) => b.values(name, Ty::F32, &shape, vals),
                None => b.poison(name, Ty::F32, &shape),
            };
            if strided {
                whole.sub(0, &[n, t], &[1, n])
            } else {
                whole
            }
        };
        let prefix = part(b, "prefix");
        let suffix = part(b, "suffix");
        let mut lp: Vec<f64> = (0..n * t).map(|_| b.rng.gen_range(-lse_range..lse_range)).collect();
        let mut ls: Vec<f64> = (0..n * t).map(|_| b.rng.gen_range(-lse_range..lse_range)).collect();
        let (ninf, inf) = (f64::NEG_INFINITY, f64::INFINITY);
        if empty == Empty::All {
            lp.fill(ninf);
            ls.fill(ninf);
        }
        if empty == Empty::FirstTokens {
            for h in 0..n {
                let cols: [(Option<f64>, Option<f64>); 5] = [
                    (Some(ninf), None),
                    (None, Some(ninf)),
                    (Some(ninf), Some(ninf)),
                    (Some(inf), None),
                    (Some(ninf), Some(inf)),
                ];
                for (i, (p, s)) in cols.into_iter().enumerate().take(t as usize) {
                    if let Some(p) = p {
                        lp[at(h, i as i64)] = p;
                    }
                    if let Some(s) = s {
                        ls[at(h, i as i64)] = s;
                    }
                }
            }
        }
        let prefix_lse = lse_view(b, "prefix_lse", Some(lp));
        let suffix_lse = lse_view(b, "suffix_lse", Some(ls));
        let out = if strided {
            let w = v + 4;
            b.poison("out", Ty::Float, &[t, n, w]).sub(0, &[t, n, v], &[n * w, w, 1])
        } else {
            b.poison("out", Ty::Float, &[t, n, v])
        };
        b.output("out", &out);
        let out_lse = out_lse.then(|| {
            let l = lse_view(b, "out_lse", None);
            b.output("out_lse", &l);
            l
        });
        Box::new(move |q, bufs| {
            let args = vt_core::MergeAttnStatesArgs {
                out: out.tensor(bufs)?,
                out_lse: out_lse.as_ref().map(|l| l.tensor(bufs)).transpose()?,
                prefix: prefix.tensor(bufs)?,
                prefix_lse: prefix_lse.tensor(bufs)?,
                suffix: suffix.tensor(bufs)?,
                suffix_lse: suffix_lse.tensor(bufs)?,
            };
            vt_core::merge_attn_states(q, &args)
        })
    }
}

pub(super) fn merge_attn_states(c: &mut Cases) {
    c.add("T 7, N 4, V 128, out_lse, empty sides (-inf / +inf lse on either or both)", |b| {
        Merge { empty: Empty::FirstTokens, ..Merge::new(7, 4, 128) }.build(b)
    });
    c.add("T 6, N 4, V 32, strided parts and out, transposed lse views, no out_lse, empty sides", |b| {
        Merge { empty: Empty::FirstTokens, strided: true, out_lse: false, ..Merge::new(6, 4, 32) }.build(b)
    });
    c.add("T 33, N 16, V 128, all finite, out_lse", |b| Merge::new(33, 16, 128).build(b));
    c.add("lse far apart (uniform in +-60: exp of the gap overflows f32 unless the max is taken)", |b| {
        Merge { lse_range: 60.0, ..Merge::new(5, 3, 64) }.build(b)
    });
    c.add("every side empty: T 2, N 2, V 16 (out = 0, out_lse = -inf)", |b| {
        Merge { empty: Empty::All, ..Merge::new(2, 2, 16) }.build(b)
    });
}
