//! Every entry point of `vt_core::ops`, fed malformed arguments on the CPU: each call
//! returns `Error::InvalidArgument` naming the op and the argument, never panics, and
//! leaves the (NaN-poisoned) outputs exactly as they were.

mod common;

use common::*;
use vt_core::*;

/// Asserts `r` is `InvalidArgument { op, arg }` ([`common::expect_invalid`]) with a message,
/// and that every pool in `untouched` is unchanged. `case` describes the malformation.
fn expect_invalid(case: &str, r: Result<()>, op: OpId, arg: &str, q: &Queue, untouched: &[&Pool]) {
    let msg = common::expect_invalid(case, r, op, arg);
    assert!(!msg.is_empty(), "{case}: empty message");
    for p in untouched {
        p.assert_unchanged(q);
    }
}

/// The same memory described as living on a CUDA device (never dereferenced: validation
/// rejects it first).
fn on_cuda<'a>(t: &Tensor<'a>) -> Tensor<'a> {
    let extent = t.elem_span().map_or(0, |s| s.1);
    // SAFETY: the view is only inspected by validation, which rejects it before any access.
    unsafe {
        Tensor::from_raw_parts(
            t.base_addr(),
            extent,
            t.dtype(),
            Device::new(DeviceType::Cuda, 0),
            t.shape(),
            t.strides(),
            t.offset(),
        )
    }
    .unwrap()
}

/// An f32 view of `shape` over the first bytes of an index buffer (to alias an output
/// with an index input).
fn f32_alias<'a>(b: &'a Buffer, shape: &[i64]) -> Tensor<'a> {
    let extent = (b.size_bytes() / 4) as i64;
    let strides = contiguous_strides(shape);
    // SAFETY: the f32 elements the view may reach lie inside `b`'s live allocation (checked
    // against `extent`), and `b` outlives the view.
    unsafe {
        Tensor::from_raw_parts(
            b.view().base_addr(),
            extent,
            F,
            Device::CPU,
            shape,
            &strides[..shape.len()],
            0,
        )
    }
    .unwrap()
}

fn zeros(q: &Queue, dt: DType, shape: &[i64]) -> Buffer {
    Buffer::zeros(q, dt, shape).unwrap()
}

fn nan_out(q: &Queue, dt: DType, shape: &[i64]) -> Pool {
    Pool::output(q, dt, shape, Layout::Contiguous)
}

const F: DType = DType::F32;

/// A change that makes a good argument struct `A` malformed.
type Edit<'a, A> = Box<dyn Fn(&mut A) + 'a>;

/// Runs `call` on `good` with each `(case, edit, arg)` applied to a copy and checks it with
/// [`expect_invalid`] (the pools in `untouched` unchanged); then `good` itself must run.
fn expect_edits_invalid<A: Copy>(
    q: &Queue,
    op: OpId,
    call: impl Fn(&Queue, &A) -> Result<()>,
    good: A,
    cases: Vec<(&str, Edit<'_, A>, &str)>,
    untouched: &[&Pool],
) {
    for (case, edit, arg) in cases {
        let mut a = good;
        edit(&mut a);
        expect_invalid(case, call(q, &a), op, arg, q, untouched);
    }
    call(q, &good).unwrap();
}

/// Runs each `(case, call, arg)` and checks it with [`expect_invalid`] before the next.
macro_rules! invalid_cases {
    ($q:expr, $op:expr, $pools:expr, [$(($case:expr, $call:expr, $arg:expr $(,)?)),* $(,)?]) => {
        $( expect_invalid($case, $call, $op, $arg, $q, $pools); )*
    };
}

#[test]
fn matmul_bt_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::MatmulBT;
    let (a, b) = (zeros(&q, F, &[4, 6]), zeros(&q, F, &[5, 6]));
    let out = nan_out(&q, F, &[4, 5]);
    let (av, bv, ov) = (a.view(), b.view(), out.view());
    let a3 = zeros(&q, F, &[1, 4, 6]);
    let b7 = zeros(&q, F, &[5, 7]);
    let b16 = zeros(&q, DType::F16, &[5, 6]);
    let ai = zeros(&q, DType::I32, &[4, 6]);
    let wide = zeros(&q, F, &[4, 11]); // a in columns 0..6, an overlapping out in 6..11
    invalid_cases!(
        &q,
        op,
        &[&out],
        [
            ("a of rank 3", matmul_bt(&q, &MatmulBTArgs { out: ov, a: a3.view(), b: bv }), "a"),
            ("K mismatch", matmul_bt(&q, &MatmulBTArgs { out: ov, a: av, b: b7.view() }), "b"),
            (
                "out of the wrong shape",
                matmul_bt(&q, &MatmulBTArgs { out: ov.slice(1, 0, 4).unwrap(), a: av, b: bv }),
                "out"
            ),
            ("mixed dtypes", matmul_bt(&q, &MatmulBTArgs { out: ov, a: av, b: b16.view() }), "b"),
            ("integer a", matmul_bt(&q, &MatmulBTArgs { out: ov, a: ai.view(), b: bv }), "a"),
            ("a on another device", matmul_bt(&q, &MatmulBTArgs { out: ov, a: on_cuda(&av), b: bv }), "a"),
            (
                "a transposed (inner stride != 1)",
                matmul_bt(
                    &q,
                    &MatmulBTArgs {
                        out: ov,
                        a: zeros(&q, F, &[6, 4]).view().transpose(0, 1).unwrap(),
                        b: bv
                    }
                ),
                "a"
            ),
            (
                "out overlapping itself",
                matmul_bt(
                    &q,
                    &MatmulBTArgs {
                        out: out.buf.view().as_strided(0, &[4, 5], &[0, 1]).unwrap(),
                        a: av,
                        b: bv
                    }
                ),
                "out"
            ),
            (
                "out overlapping a",
                matmul_bt(
                    &q,
                    &MatmulBTArgs {
                        out: wide.view().slice(1, 6, 11).unwrap(),
                        a: wide.view().slice(1, 0, 6).unwrap(),
                        b: bv
                    }
                ),
                "out",
            ),
        ]
    );
    matmul_bt(&q, &MatmulBTArgs { out: ov, a: av, b: bv }).unwrap(); // the well-formed call is accepted
}

#[test]
fn batched_matmul_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::BatchedMatmul;
    let (a, b) = (zeros(&q, F, &[2, 3, 4]), zeros(&q, F, &[2, 4, 5]));
    let out = nan_out(&q, F, &[2, 3, 5]);
    let (av, bv, ov) = (a.view(), b.view(), out.view());
    invalid_cases!(
        &q,
        op,
        &[&out],
        [
            (
                "a of rank 2",
                batched_matmul(&q, &BatchedMatmulArgs { out: ov, a: zeros(&q, F, &[3, 4]).view(), b: bv }),
                "a"
            ),
            (
                "G mismatch",
                batched_matmul(&q, &BatchedMatmulArgs { out: ov, a: av, b: zeros(&q, F, &[3, 4, 5]).view() }),
                "b"
            ),
            (
                "K mismatch",
                batched_matmul(&q, &BatchedMatmulArgs { out: ov, a: av, b: zeros(&q, F, &[2, 5, 5]).view() }),
                "b"
            ),
            (
                "out N mismatch",
                batched_matmul(&q, &BatchedMatmulArgs { out: ov.slice(2, 0, 4).unwrap(), a: av, b: bv }),
                "out"
            ),
            (
                "mixed dtypes",
                batched_matmul(
                    &q,
                    &BatchedMatmulArgs { out: ov, a: zeros(&q, DType::BF16, &[2, 3, 4]).view(), b: bv }
                ),
                "a"
            ),
            (
                "b on another device",
                batched_matmul(&q, &BatchedMatmulArgs { out: ov, a: av, b: on_cuda(&bv) }),
                "b"
            ),
            (
                "out overlapping itself",
                batched_matmul(
                    &q,
                    &BatchedMatmulArgs {
                        out: out.buf.view().as_strided(0, &[2, 3, 5], &[0, 5, 1]).unwrap(),
                        a: av,
                        b: bv
                    }
                ),
                "out"
            ),
            (
                "out overlapping b",
                batched_matmul(
                    &q,
                    &BatchedMatmulArgs { out: b.view().slice(1, 0, 3).unwrap(), a: av, b: bv }
                ),
                "out"
            ),
        ]
    );
    batched_matmul(&q, &BatchedMatmulArgs { out: ov, a: av, b: bv }).unwrap();
}

#[test]
fn rms_norm_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::RmsNorm;
    let x = zeros(&q, F, &[3, 8]);
    let w = zeros(&q, F, &[8]);
    let out = nan_out(&q, F, &[3, 8]);
    let (xv, wv, ov) = (x.view(), w.view(), out.view());
    let big = Pool::output(&q, F, &[4, 8], Layout::Contiguous); // x rows 0..3, out rows 1..4
    let bigv = big.view();
    invalid_cases!(
        &q,
        op,
        &[&out, &big],
        [
            (
                "x of rank 3",
                rms_norm(
                    &q,
                    &RmsNormArgs { out: ov, x: zeros(&q, F, &[1, 3, 8]).view(), weight: wv, eps: 1e-6 }
                ),
                "x"
            ),
            (
                "weight length mismatch",
                rms_norm(&q, &RmsNormArgs { out: ov, x: xv, weight: zeros(&q, F, &[7]).view(), eps: 1e-6 }),
                "weight"
            ),
            (
                "out shape mismatch",
                rms_norm(&q, &RmsNormArgs { out: ov.slice(0, 0, 2).unwrap(), x: xv, weight: wv, eps: 1e-6 }),
                "out"
            ),
            (
                "mixed dtypes",
                rms_norm(
                    &q,
                    &RmsNormArgs { out: ov, x: xv, weight: zeros(&q, DType::F16, &[8]).view(), eps: 1e-6 }
                ),
                "weight"
            ),
            (
                "x on another device",
                rms_norm(&q, &RmsNormArgs { out: ov, x: on_cuda(&xv), weight: wv, eps: 1e-6 }),
                "x"
            ),
            (
                "weight not unit-strided",
                rms_norm(
                    &q,
                    &RmsNormArgs {
                        out: ov,
                        x: xv,
                        weight: zeros(&q, F, &[8, 2]).view().select(1, 0).unwrap(),
                        eps: 1e-6
                    }
                ),
                "weight"
            ),
            (
                "out partly overlapping x",
                rms_norm(
                    &q,
                    &RmsNormArgs {
                        out: bigv.slice(0, 1, 4).unwrap(),
                        x: bigv.slice(0, 0, 3).unwrap(),
                        weight: wv,
                        eps: 1e-6
                    }
                ),
                "out"
            ),
            ("eps = 0", rms_norm(&q, &RmsNormArgs { out: ov, x: xv, weight: wv, eps: 0.0 }), "eps"),
            ("eps = NaN", rms_norm(&q, &RmsNormArgs { out: ov, x: xv, weight: wv, eps: f32::NAN }), "eps"),
            ("eps < 0", rms_norm(&q, &RmsNormArgs { out: ov, x: xv, weight: wv, eps: -1e-6 }), "eps"),
            (
                "eps = inf",
                rms_norm(&q, &RmsNormArgs { out: ov, x: xv, weight: wv, eps: f32::INFINITY }),
                "eps"
            ),
        ]
    );
    // out overlapping the weight
    let ww = Pool::output(&q, F, &[4, 8], Layout::Contiguous);
    let r = rms_norm(
        &q,
        &RmsNormArgs {
            out: ww.view().slice(0, 0, 3).unwrap(),
            x: xv,
            weight: ww.view().select(0, 2).unwrap(),
            eps: 1e-6,
        },
    );
    expect_invalid("out overlapping weight", r, op, "out", &q, &[&ww]);
    rms_norm(&q, &RmsNormArgs { out: ov, x: xv, weight: wv, eps: 1e-6 }).unwrap();
}

#[test]
fn layer_norm_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::LayerNorm;
    let x = zeros(&q, F, &[3, 8]);
    let (w, b) = (zeros(&q, F, &[8]), zeros(&q, F, &[8]));
    let out = nan_out(&q, F, &[3, 8]);
    let (xv, wv, bv, ov) = (x.view(), w.view(), b.view(), out.view());
    let a = LayerNormArgs { out: ov, x: xv, weight: wv, bias: bv, eps: 1e-6 };
    let big = Pool::output(&q, F, &[4, 8], Layout::Contiguous);
    let bigv = big.view();
    invalid_cases!(
        &q,
        op,
        &[&out, &big],
        [
            ("x of rank 3", layer_norm(&q, &LayerNormArgs { x: zeros(&q, F, &[1, 3, 8]).view(), ..a }), "x"),
            (
                "weight length mismatch",
                layer_norm(&q, &LayerNormArgs { weight: zeros(&q, F, &[7]).view(), ..a }),
                "weight"
            ),
            (
                "bias length mismatch",
                layer_norm(&q, &LayerNormArgs { bias: zeros(&q, F, &[9]).view(), ..a }),
                "bias"
            ),
            (
                "bias of another dtype",
                layer_norm(&q, &LayerNormArgs { bias: zeros(&q, DType::F16, &[8]).view(), ..a }),
                "bias"
            ),
            (
                "out shape mismatch",
                layer_norm(&q, &LayerNormArgs { out: ov.slice(0, 0, 2).unwrap(), ..a }),
                "out"
            ),
            ("x on another device", layer_norm(&q, &LayerNormArgs { x: on_cuda(&xv), ..a }), "x"),
            (
                "bias not unit-strided",
                layer_norm(
                    &q,
                    &LayerNormArgs { bias: zeros(&q, F, &[8, 2]).view().select(1, 0).unwrap(), ..a }
                ),
                "bias"
            ),
            (
                "out partly overlapping x",
                layer_norm(
                    &q,
                    &LayerNormArgs {
                        out: bigv.slice(0, 1, 4).unwrap(),
                        x: bigv.slice(0, 0, 3).unwrap(),
                        ..a
                    }
                ),
                "out"
            ),
            ("eps = 0", layer_norm(&q, &LayerNormArgs { eps: 0.0, ..a }), "eps"),
            ("eps = NaN", layer_norm(&q, &LayerNormArgs { eps: f32::NAN, ..a }), "eps"),
        ]
    );
    // out overlapping the bias
    let ww = Pool::output(&q, F, &[4, 8], Layout::Contiguous);
    let r = layer_norm(
        &q,
        &LayerNormArgs { out: ww.view().slice(0, 0, 3).unwrap(), bias: ww.view().select(0, 2).unwrap(), ..a },
    );
    expect_invalid("out overlapping bias", r, op, "out", &q, &[&ww]);
    layer_norm(&q, &a).unwrap();
}

#[test]
fn rope_from_cache_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::RopeFromCache;
    let (t, h, r) = (3i64, 2i64, 8i64);
    let qp = nan_out(&q, F, &[t, h, r]);
    let kp = nan_out(&q, F, &[t, 1, r]);
    let cache = cos_sin_cache(&q, 16, r as usize);
    let pos = i64_buf(&q, &[0, 5, 15]);
    let (qv, kv, cv, pv) = (qp.view(), kp.view(), cache.view(), pos.view());
    let odd = cos_sin_cache(&q, 16, 8);
    let oddv = odd.view().slice(1, 0, 7).unwrap().as_strided(0, &[16, 7], &[7, 1]).unwrap();
    let q7 = nan_out(&q, F, &[t, h, 7]);
    let both = Pool::output(&q, F, &[t, h + 1, r], Layout::Contiguous); // q and an overlapping k
                                                                        // q placed inside the cos/sin cache's own memory
    let cache_pool = Pool::with_values(&q, F, &[16, r], 16 * r, 0, vec![r, 1], &cache.to_f64(&q).unwrap());
    invalid_cases!(
        &q,
        op,
        &[&qp, &kp, &q7, &both, &cache_pool],
        [
            (
                "q of rank 2",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: qv.select(1, 0).unwrap(),
                        key: Some(kv),
                        positions: pv,
                        cos_sin_cache: cv,
                        is_neox: true
                    }
                ),
                "query"
            ),
            (
                "position == max_pos",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: qv,
                        key: Some(kv),
                        positions: i64_buf(&q, &[0, 16, 1]).view(),
                        cos_sin_cache: cv,
                        is_neox: true
                    }
                ),
                "positions"
            ),
            (
                "negative position",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: qv,
                        key: Some(kv),
                        positions: i64_buf(&q, &[0, -1, 1]).view(),
                        cos_sin_cache: cv,
                        is_neox: true
                    }
                ),
                "positions"
            ),
            (
                "positions i32",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: qv,
                        key: Some(kv),
                        positions: i32_buf(&q, &[3], &[0, 1, 2]).view(),
                        cos_sin_cache: cv,
                        is_neox: true
                    }
                ),
                "positions"
            ),
            (
                "positions length",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: qv,
                        key: Some(kv),
                        positions: i64_buf(&q, &[0, 1]).view(),
                        cos_sin_cache: cv,
                        is_neox: true
                    }
                ),
                "positions"
            ),
            (
                "cache in f16",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: qv,
                        key: Some(kv),
                        positions: pv,
                        cos_sin_cache: zeros(&q, DType::F16, &[16, r]).view(),
                        is_neox: true
                    }
                ),
                "cos_sin_cache"
            ),
            (
                "cache width != R",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: qv,
                        key: Some(kv),
                        positions: pv,
                        cos_sin_cache: zeros(&q, F, &[16, 6]).view(),
                        is_neox: true
                    }
                ),
                "cos_sin_cache"
            ),
            (
                "odd rotary dim",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: q7.view(),
                        key: None,
                        positions: pv,
                        cos_sin_cache: oddv,
                        is_neox: true
                    }
                ),
                "cos_sin_cache"
            ),
            (
                "k dtype",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: qv,
                        key: Some(zeros(&q, DType::BF16, &[t, 1, r]).view()),
                        positions: pv,
                        cos_sin_cache: cv,
                        is_neox: true
                    }
                ),
                "key"
            ),
            (
                "k T mismatch",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: qv,
                        key: Some(kv.slice(0, 0, 2).unwrap()),
                        positions: pv,
                        cos_sin_cache: cv,
                        is_neox: true
                    }
                ),
                "key"
            ),
            (
                "k overlapping q",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: both.view().slice(1, 0, h).unwrap(),
                        key: Some(both.view().slice(1, h, h + 1).unwrap()),
                        positions: pv,
                        cos_sin_cache: cv,
                        is_neox: true
                    }
                ),
                "key",
            ),
            (
                "q on another device",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: on_cuda(&qv),
                        key: Some(kv),
                        positions: pv,
                        cos_sin_cache: cv,
                        is_neox: true
                    }
                ),
                "query"
            ),
            (
                "positions on another device",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: qv,
                        key: Some(kv),
                        positions: on_cuda(&pv),
                        cos_sin_cache: cv,
                        is_neox: true
                    }
                ),
                "positions"
            ),
            (
                "q overlapping the cache",
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: cache_pool.view().as_strided(0, &[t, 1, r], &[r, r, 1]).unwrap(),
                        key: None,
                        positions: pv,
                        cos_sin_cache: cache_pool.view(),
                        is_neox: true
                    }
                ),
                "query",
            ),
        ]
    );
    rope_from_cache(
        &q,
        &RopeFromCacheArgs { query: qv, key: Some(kv), positions: pv, cos_sin_cache: cv, is_neox: true },
    )
    .unwrap();
}

#[test]
fn fused_norm_rope_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::FusedNormRope;
    let (t, l, r) = (3i64, 8i64, 4i64);
    let kv = zeros(&q, F, &[t, l + r]);
    let w = zeros(&q, F, &[l]);
    let lat = nan_out(&q, F, &[t, l]);
    let rope = nan_out(&q, F, &[t, r]);
    let cache = cos_sin_cache(&q, 16, r as usize);
    let pos = i64_buf(&q, &[0, 3, 15]);
    let (kvv, wv, lv, rv, cv, pv) = (kv.view(), w.view(), lat.view(), rope.view(), cache.view(), pos.view());
    let both = Pool::output(&q, F, &[t, l + r], Layout::Contiguous);
    let kv_pool = Pool::output(&q, F, &[t, l + r], Layout::Contiguous);
    let f = |lat: &Tensor, rope: &Tensor, kv: &Tensor, w: &Tensor, p: &Tensor, c: &Tensor, eps: f32| {
        fused_norm_rope(
            &q,
            &FusedNormRopeArgs {
                latent_out: *lat,
                rope_out: *rope,
                kv: *kv,
                weight: *w,
                positions: *p,
                cos_sin_cache: *c,
                eps,
                is_neox: false,
                query: None,
                cache_write: None,
            },
        )
    };
    invalid_cases!(
        &q,
        op,
        &[&lat, &rope, &both, &kv_pool],
        [
            ("kv of rank 3", f(&lv, &rv, &zeros(&q, F, &[1, t, l + r]).view(), &wv, &pv, &cv, 1e-6), "kv"),
            (
                "weight dtype",
                f(&lv, &rv, &kvv, &zeros(&q, DType::F16, &[l]).view(), &pv, &cv, 1e-6),
                "weight"
            ),
            (
                "latent_out shape",
                f(&lv.slice(1, 0, l - 1).unwrap(), &rv, &kvv, &wv, &pv, &cv, 1e-6),
                "latent_out"
            ),
            ("rope_out shape", f(&lv, &rv.slice(0, 0, 2).unwrap(), &kvv, &wv, &pv, &cv, 1e-6), "rope_out"),
            ("no rope part", f(&lv, &rv, &kvv.slice(1, 0, l).unwrap(), &wv, &pv, &cv, 1e-6), "kv"),
            (
                "rope width != cache width",
                f(&lv, &zeros(&q, F, &[t, 6]).view(), &zeros(&q, F, &[t, l + 6]).view(), &wv, &pv, &cv, 1e-6),
                "cos_sin_cache"
            ),
            (
                "position outside the cache",
                f(&lv, &rv, &kvv, &wv, &i64_buf(&q, &[0, 16, 1]).view(), &cv, 1e-6),
                "positions"
            ),
            ("eps = 0", f(&lv, &rv, &kvv, &wv, &pv, &cv, 0.0), "eps"),
            ("eps = NaN", f(&lv, &rv, &kvv, &wv, &pv, &cv, f32::NAN), "eps"),
            ("kv on another device", f(&lv, &rv, &on_cuda(&kvv), &wv, &pv, &cv, 1e-6), "kv"),
            (
                "rope_out overlapping latent_out",
                f(
                    &both.view().slice(1, 0, l).unwrap(),
                    &both.view().slice(1, l, l + r).unwrap(),
                    &kvv,
                    &wv,
                    &pv,
                    &cv,
                    1e-6
                ),
                "rope_out",
            ),
            (
                "latent_out overlapping kv",
                f(&kv_pool.view().slice(1, 0, l).unwrap(), &rv, &kv_pool.view(), &wv, &pv, &cv, 1e-6),
                "latent_out",
            ),
        ]
    );
    f(&lv, &rv, &kvv, &wv, &pv, &cv, 1e-6).unwrap();
}

#[test]
fn fused_norm_rope_rejects_a_malformed_query_or_cache_write() {
    let q = queue();
    let op = OpId::FusedNormRope;
    let (t, l, r, n) = (3i64, 8i64, 4i64, 2i64);
    let kv = zeros(&q, F, &[t, l + r]);
    let w = zeros(&q, F, &[l]);
    let lat = nan_out(&q, F, &[t, l]);
    let rope = nan_out(&q, F, &[t, r]);
    let cos_sin = cos_sin_cache(&q, 16, r as usize);
    let pos = i64_buf(&q, &[0, 3, 15]);
    let q_in = zeros(&q, F, &[t, n, r]);
    let q_out = nan_out(&q, F, &[t, n, r]);
    let kv_cache = nan_out(&q, F, &[2, 4, l + r]);
    let slots = i64_buf(&q, &[0, -1, 7]);
    let fp8_cache = Buffer::zeros(&q, DType::Fp8DsMla, &[2, 4, 656]).unwrap();
    let (qi, qo, kc, sl) = (q_in.view(), q_out.view(), kv_cache.view(), slots.view());
    let g = |query: Option<NormRopeQuery>, cache_write: Option<NormRopeCacheWrite>| {
        fused_norm_rope(
            &q,
            &FusedNormRopeArgs {
                latent_out: lat.view(),
                rope_out: rope.view(),
                kv: kv.view(),
                weight: w.view(),
                positions: pos.view(),
                cos_sin_cache: cos_sin.view(),
                eps: 1e-6,
                is_neox: false,
                query,
                cache_write,
            },
        )
    };
    let query = |input, out| Some(NormRopeQuery { input, out });
    let cw = |cache, slot_mapping| Some(NormRopeCacheWrite { cache, slot_mapping });
    let more_tokens = zeros(&q, F, &[t + 1, n, r]);
    let q_f16 = zeros(&q, DType::F16, &[t, n, r]);
    let slots_past = i64_buf(&q, &[0, 8, 1]);
    let slots_f32 = zeros(&q, F, &[t]);
    let out4 = nan_out(&q, F, &[t + 1, n, r]);
    invalid_cases!(
        &q,
        op,
        &[&lat, &rope, &q_out, &kv_cache],
        [
            ("query of more tokens than kv", g(query(more_tokens.view(), out4.view()), None), "query.input"),
            (
                "query rope width",
                g(query(qi.slice(2, 0, 2).unwrap(), qo.slice(2, 0, 2).unwrap()), None),
                "query.input"
            ),
            ("query out shape", g(query(qi, qo.slice(1, 0, 1).unwrap()), None), "query.out"),
            (
                "query out overlapping its input (not the same view)",
                g(query(qi.slice(0, 1, 3).unwrap(), qi.slice(0, 0, 2).unwrap()), None),
                "query.out"
            ),
            ("query out dtype", g(query(qi, q_f16.view()), None), "query.out"),
            ("an fp8_ds_mla cache", g(None, cw(fp8_cache.view(), sl)), "cache_write.cache"),
            ("cache row width", g(None, cw(kc.slice(2, 0, l).unwrap(), sl)), "cache_write.cache"),
            ("slot past the cache", g(None, cw(kc, slots_past.view())), "cache_write.slot_mapping"),
            ("slot_mapping dtype", g(None, cw(kc, slots_f32.view())), "cache_write.slot_mapping"),
            (
                "cache overlapping the query output",
                g(query(qi, kc.as_strided(0, &[t, n, r], &[n * r, r, 1]).unwrap()), cw(kc, sl)),
                "cache_write.cache"
            ),
        ]
    );
    // In place, out of place and with the cache write: accepted.
    g(query(qi, qi), cw(kc, sl)).unwrap();
    g(query(qi.slice(0, 0, 2).unwrap(), qo.slice(0, 0, 2).unwrap()), None).unwrap();
}

#[test]
fn concat_and_cache_mla_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::ConcatAndCacheMla;
    let (t, l, r, nb, bs) = (3i64, 6i64, 2i64, 2i64, 4i64);
    let kv_c = zeros(&q, F, &[t, l]);
    let k_pe = zeros(&q, F, &[t, r]);
    let cache = nan_out(&q, F, &[nb, bs, l + r]);
    let slots = i64_buf(&q, &[0, -1, 7]);
    let (kcv, kpv, cv, sv) = (kv_c.view(), k_pe.view(), cache.view(), slots.view());
    let bs0 = nan_out(&q, F, &[nb, 0, l + r]);
    let pad_slots = i64_buf(&q, &[-1; 8]);
    let shared = Pool::output(&q, F, &[nb * bs * (l + r) + t * l], Layout::Contiguous);
    invalid_cases!(
        &q,
        op,
        &[&cache, &bs0, &shared],
        [
            (
                "kv_c of rank 3",
                concat_and_cache_mla(
                    &q,
                    &ConcatAndCacheMlaArgs {
                        kv_c: zeros(&q, F, &[1, t, l]).view(),
                        k_pe: kpv,
                        cache: cv,
                        slot_mapping: sv
                    }
                ),
                "kv_c"
            ),
            (
                "k_pe T mismatch",
                concat_and_cache_mla(
                    &q,
                    &ConcatAndCacheMlaArgs {
                        kv_c: kcv,
                        k_pe: zeros(&q, F, &[2, r]).view(),
                        cache: cv,
                        slot_mapping: sv
                    }
                ),
                "k_pe"
            ),
            (
                "cache width mismatch",
                concat_and_cache_mla(
                    &q,
                    &ConcatAndCacheMlaArgs {
                        kv_c: kcv,
                        k_pe: zeros(&q, F, &[t, r + 1]).view(),
                        cache: cv,
                        slot_mapping: sv
                    }
                ),
                "cache"
            ),
            (
                "mixed dtypes",
                concat_and_cache_mla(
                    &q,
                    &ConcatAndCacheMlaArgs {
                        kv_c: zeros(&q, DType::BF16, &[t, l]).view(),
                        k_pe: kpv,
                        cache: cv,
                        slot_mapping: sv
                    }
                ),
                "kv_c"
            ),
            (
                "slot == NB*BS",
                concat_and_cache_mla(
                    &q,
                    &ConcatAndCacheMlaArgs {
                        kv_c: kcv,
                        k_pe: kpv,
                        cache: cv,
                        slot_mapping: i64_buf(&q, &[0, 1, nb * bs]).view()
                    }
                ),
                "slot_mapping"
            ),
            (
                "slots as i32",
                concat_and_cache_mla(
                    &q,
                    &ConcatAndCacheMlaArgs {
                        kv_c: kcv,
                        k_pe: kpv,
                        cache: cv,
                        slot_mapping: i32_buf(&q, &[t], &[0, 1, 2]).view()
                    }
                ),
                "slot_mapping"
            ),
            (
                "slot_mapping length",
                concat_and_cache_mla(
                    &q,
                    &ConcatAndCacheMlaArgs {
                        kv_c: kcv,
                        k_pe: kpv,
                        cache: cv,
                        slot_mapping: i64_buf(&q, &[0, 1]).view()
                    }
                ),
                "slot_mapping"
            ),
            (
                "block size 0",
                concat_and_cache_mla(
                    &q,
                    &ConcatAndCacheMlaArgs {
                        kv_c: kcv,
                        k_pe: kpv,
                        cache: bs0.view(),
                        slot_mapping: i64_buf(&q, &[-1, -1, -1]).view()
                    }
                ),
                "cache"
            ),
            (
                "cache on another device",
                concat_and_cache_mla(
                    &q,
                    &ConcatAndCacheMlaArgs { kv_c: kcv, k_pe: kpv, cache: on_cuda(&cv), slot_mapping: sv }
                ),
                "cache"
            ),
            (
                "cache overlapping slot_mapping",
                concat_and_cache_mla(
                    &q,
                    &ConcatAndCacheMlaArgs {
                        kv_c: kcv.slice(0, 0, 1).unwrap(),
                        k_pe: kpv.slice(0, 0, 1).unwrap(),
                        cache: f32_alias(&pad_slots, &[1, 1, l + r]),
                        slot_mapping: pad_slots.view().slice(0, 0, 1).unwrap()
                    }
                ),
                "cache"
            ),
            (
                "cache overlapping kv_c",
                {
                    let sh = shared.view();
                    let c = sh.as_strided(0, &[nb, bs, l + r], &[bs * (l + r), l + r, 1]).unwrap();
                    concat_and_cache_mla(
                        &q,
                        &ConcatAndCacheMlaArgs {
                            kv_c: sh.as_strided(l + r, &[t, l], &[l, 1]).unwrap(),
                            k_pe: kpv,
                            cache: c,
                            slot_mapping: sv,
                        },
                    )
                },
                "cache",
            ),
        ]
    );
    concat_and_cache_mla(&q, &ConcatAndCacheMlaArgs { kv_c: kcv, k_pe: kpv, cache: cv, slot_mapping: sv })
        .unwrap();
}

#[test]
fn gather_mla_cache_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::GatherMlaCache;
    let (nb, bs, d, b, mb) = (4i64, 4i64, 6i64, 2i64, 2i64);
    let cache = zeros(&q, F, &[nb, bs, d]);
    let out = nan_out(&q, F, &[10, d]);
    let bt = i32_buf(&q, &[b, mb], &[0, 1, 2, 3]);
    let cu = i32_buf(&q, &[b + 1], &[0, 5, 8]);
    let (ov, cv, btv, cuv) = (out.view(), cache.view(), bt.view(), cu.view());
    let g = |o: &Tensor, c: &Tensor, bt: &Tensor, cu: &Tensor, s: Option<&Tensor>| {
        gather_mla_cache(
            &q,
            &GatherMlaCacheArgs {
                out: *o,
                cache: *c,
                block_table: *bt,
                cu_seq_lens: *cu,
                seq_starts: s.copied(),
            },
        )
    };
    let cu_of = |v: &[i32]| i32_buf(&q, &[v.len() as i64], v);
    let bs0 = zeros(&q, F, &[nb, 0, d]);
    let cu_long = cu_of(&[0, 0, 1, 0, 0, 0]);
    let bt_wide = i32_buf(&q, &[b, 3], &[0, 1, 2, 3, 0, 0]);
    invalid_cases!(
        &q,
        op,
        &[&out],
        [
            ("out width mismatch", g(&ov.slice(1, 0, d - 1).unwrap(), &cv, &btv, &cuv, None), "out"),
            ("cache of rank 2", g(&ov, &zeros(&q, F, &[nb * bs, d]).view(), &btv, &cuv, None), "cache"),
            ("mixed dtypes", g(&ov, &zeros(&q, DType::F16, &[nb, bs, d]).view(), &btv, &cuv, None), "out"),
            (
                "block_table as i64",
                g(&ov, &cv, &Buffer::from_slice(&q, &[b, mb], &[0i64, 1, 2, 3]).unwrap().view(), &cuv, None),
                "block_table"
            ),
            ("cu_seq_lens length", g(&ov, &cv, &btv, &cu_of(&[0, 5]).view(), None), "cu_seq_lens"),
            (
                "cu_seq_lens not starting at 0",
                g(&ov, &cv, &btv, &cu_of(&[1, 5, 8]).view(), None),
                "cu_seq_lens"
            ),
            ("cu_seq_lens decreasing", g(&ov, &cv, &btv, &cu_of(&[0, 5, 3]).view(), None), "cu_seq_lens"),
            ("cu_seq_lens negative", g(&ov, &cv, &btv, &cu_of(&[0, -2, 3]).view(), None), "cu_seq_lens"),
            (
                "cu_seq_lens past the workspace",
                g(&ov, &cv, &btv, &cu_of(&[0, 5, 11]).view(), None),
                "cu_seq_lens"
            ),
            (
                "a sequence past its block table",
                g(&ov, &cv, &btv, &cu_of(&[0, 9, 10]).view(), None),
                "block_table"
            ),
            (
                "block id past the cache",
                g(&ov, &cv, &i32_buf(&q, &[b, mb], &[0, 4, 2, 3]).view(), &cuv, None),
                "block_table"
            ),
            (
                "negative block id",
                g(&ov, &cv, &i32_buf(&q, &[b, mb], &[0, 1, -1, 3]).view(), &cuv, None),
                "block_table"
            ),
            (
                "negative seq_starts",
                g(&ov, &cv, &btv, &cuv, Some(&i32_buf(&q, &[b], &[0, -1]).view())),
                "seq_starts"
            ),
            (
                "seq_starts past the block table",
                g(&ov, &cv, &btv, &cuv, Some(&i32_buf(&q, &[b], &[4, 0]).view())),
                "block_table"
            ),
            (
                "seq_starts length",
                g(&ov, &cv, &btv, &cuv, Some(&i32_buf(&q, &[3], &[0, 0, 0]).view())),
                "seq_starts"
            ),
            ("block size 0", g(&ov, &bs0.view(), &btv, &cuv, None), "cache"),
            (
                "out overlapping the cache",
                g(
                    &cache.view().reshape(&[nb * bs, d]).unwrap().slice(0, 0, 10).unwrap(),
                    &cv,
                    &btv,
                    &cuv,
                    None
                ),
                "out"
            ),
            ("block_table on another device", g(&ov, &cv, &on_cuda(&btv), &cuv, None), "block_table"),
            (
                "out overlapping cu_seq_lens",
                g(&f32_alias(&cu_long, &[1, d]), &cv, &btv, &cu_long.view().slice(0, 0, 3).unwrap(), None),
                "out"
            ),
            (
                "out overlapping block_table",
                g(&f32_alias(&bt_wide, &[1, d]), &cv, &bt_wide.view(), &cu_of(&[0, 0, 1]).view(), None),
                "out"
            ),
        ]
    );
    g(&ov, &cv, &btv, &cuv, None).unwrap();
}

#[test]
fn concat_mla_nope_rope_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::ConcatMlaNopeRope;
    let (t, n, p, r) = (2i64, 3i64, 4i64, 2i64);
    let nope = zeros(&q, F, &[t, n, p]);
    let rope = zeros(&q, F, &[t, 1, r]);
    let out = nan_out(&q, F, &[t, n, p + r]);
    let (nv, rv, ov) = (nope.view(), rope.view(), out.view());
    let c = |o: &Tensor, n: &Tensor, r: &Tensor| {
        concat_mla_nope_rope(&q, &ConcatMlaNopeRopeArgs { out: *o, nope: *n, rope: *r })
    };
    let big = Pool::output(&q, F, &[t, n, p + r], Layout::Contiguous);
    let bigv = big.view();
    invalid_cases!(
        &q,
        op,
        &[&out, &big],
        [
            ("nope of rank 2", c(&ov, &nv.select(1, 0).unwrap(), &rv), "nope"),
            ("rope with 2 of 3 heads", c(&ov, &nv, &zeros(&q, F, &[t, 2, r]).view()), "rope"),
            ("rope T mismatch", c(&ov, &nv, &zeros(&q, F, &[1, 1, r]).view()), "rope"),
            ("out width mismatch", c(&ov.slice(2, 0, p + r - 1).unwrap(), &nv, &rv), "out"),
            ("mixed dtypes", c(&ov, &nv, &zeros(&q, DType::F16, &[t, 1, r]).view()), "rope"),
            ("nope on another device", c(&ov, &on_cuda(&nv), &rv), "nope"),
            ("out overlapping nope", c(&bigv, &bigv.slice(2, 0, p).unwrap(), &rv), "out"),
        ]
    );
    c(&ov, &nv, &rv).unwrap();
}

#[test]
fn mla_decode_attention_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::MlaDecodeAttention;
    let (b, sq, n, d, dv, nb, bs, mb) = (2i64, 1i64, 2i64, 6i64, 4i64, 4i64, 4i64, 2i64);
    let qb = zeros(&q, F, &[b, sq, n, d]);
    let cache = zeros(&q, F, &[nb, bs, d]);
    let out = nan_out(&q, F, &[b, sq, n, dv]);
    let lse = nan_out(&q, F, &[b, n, sq]);
    let bt = i32_buf(&q, &[b, mb], &[0, 1, 2, 3]);
    let lens = i32_buf(&q, &[b], &[5, 0]);
    let (qv, cv, ov, lv, btv, lnv) =
        (qb.view(), cache.view(), out.view(), lse.view(), bt.view(), lens.view());
    let m =
        |o: &Tensor, l: Option<&Tensor>, qq: &Tensor, c: &Tensor, bt: &Tensor, sl: &Tensor, scale: f32| {
            mla_decode_attention(
                &q,
                &MlaDecodeAttentionArgs {
                    out: *o,
                    lse: l.copied(),
                    query: *qq,
                    cache: *c,
                    block_table: *bt,
                    seq_lens: *sl,
                    scale,
                },
            )
        };
    let lens_of = |v: &[i32]| i32_buf(&q, &[v.len() as i64], v);
    let both = Pool::output(&q, F, &[b * sq * n * dv + b * n * sq], Layout::Contiguous);
    let bothv = both.view();
    let o_in_both = bothv.as_strided(0, &[b, sq, n, dv], &[sq * n * dv, n * dv, dv, 1]).unwrap();
    let l_in_both = bothv.as_strided(b * sq * n * dv - 1, &[b, n, sq], &[n * sq, sq, 1]).unwrap();
    let bs0 = zeros(&q, F, &[nb, 0, d]);
    invalid_cases!(
        &q,
        op,
        &[&out, &lse, &both],
        [
            ("q of rank 3", m(&ov, Some(&lv), &qv.select(1, 0).unwrap(), &cv, &btv, &lnv, 0.5), "query"),
            (
                "cache head dim mismatch",
                m(&ov, Some(&lv), &qv, &zeros(&q, F, &[nb, bs, d + 1]).view(), &btv, &lnv, 0.5),
                "cache"
            ),
            (
                "Dv > D",
                m(&zeros(&q, F, &[b, sq, n, d + 1]).view(), Some(&lv), &qv, &cv, &btv, &lnv, 0.5),
                "out"
            ),
            ("Dv = 0", m(&ov.slice(3, 0, 0).unwrap(), Some(&lv), &qv, &cv, &btv, &lnv, 0.5), "out"),
            (
                "out s_q mismatch",
                m(&zeros(&q, F, &[b, 2, n, dv]).view(), Some(&lv), &qv, &cv, &btv, &lnv, 0.5),
                "out"
            ),
            (
                "mixed dtypes",
                m(&ov, Some(&lv), &qv, &zeros(&q, DType::BF16, &[nb, bs, d]).view(), &btv, &lnv, 0.5),
                "cache"
            ),
            (
                "lse in bf16",
                m(&ov, Some(&zeros(&q, DType::BF16, &[b, n, sq]).view()), &qv, &cv, &btv, &lnv, 0.5),
                "lse"
            ),
            (
                "lse s_q mismatch",
                m(&ov, Some(&zeros(&q, F, &[b, n, sq + 1]).view()), &qv, &cv, &btv, &lnv, 0.5),
                "lse"
            ),
            ("scale = 0", m(&ov, Some(&lv), &qv, &cv, &btv, &lnv, 0.0), "scale"),
            ("scale = NaN", m(&ov, Some(&lv), &qv, &cv, &btv, &lnv, f32::NAN), "scale"),
            ("scale = inf", m(&ov, Some(&lv), &qv, &cv, &btv, &lnv, f32::INFINITY), "scale"),
            (
                "negative seq_lens",
                m(&ov, Some(&lv), &qv, &cv, &btv, &lens_of(&[5, -1]).view(), 0.5),
                "seq_lens"
            ),
            (
                "seq_lens past the block table",
                m(&ov, Some(&lv), &qv, &cv, &btv, &lens_of(&[9, 0]).view(), 0.5),
                "seq_lens"
            ),
            ("seq_lens length", m(&ov, Some(&lv), &qv, &cv, &btv, &lens_of(&[5]).view(), 0.5), "seq_lens"),
            (
                "seq_lens as i64",
                m(&ov, Some(&lv), &qv, &cv, &btv, &i64_buf(&q, &[5, 0]).view(), 0.5),
                "seq_lens"
            ),
            (
                "block id past the cache",
                m(&ov, Some(&lv), &qv, &cv, &i32_buf(&q, &[b, mb], &[0, 4, 2, 3]).view(), &lnv, 0.5),
                "block_table"
            ),
            (
                "negative block id",
                m(&ov, Some(&lv), &qv, &cv, &i32_buf(&q, &[b, mb], &[-1, 1, 2, 3]).view(), &lnv, 0.5),
                "block_table"
            ),
            (
                "block_table B mismatch",
                m(&ov, Some(&lv), &qv, &cv, &i32_buf(&q, &[1, mb], &[0, 1]).view(), &lnv, 0.5),
                "block_table"
            ),
            (
                "block size 0",
                m(&ov, Some(&lv), &qv, &bs0.view(), &btv, &lens_of(&[0, 0]).view(), 0.5),
                "cache"
            ),
            ("q on another device", m(&ov, Some(&lv), &on_cuda(&qv), &cv, &btv, &lnv, 0.5), "query"),
            (
                "out overlapping seq_lens",
                m(
                    &f32_alias(&lens, &[1, 1, 1, 2]),
                    None,
                    &qv.slice(0, 0, 1).unwrap(),
                    &cv,
                    &btv.slice(0, 0, 1).unwrap(),
                    &lnv.slice(0, 0, 1).unwrap(),
                    0.5
                ),
                "out"
            ),
            (
                "lse overlapping block_table",
                m(&ov, Some(&f32_alias(&bt, &[b, n, sq])), &qv, &cv, &btv, &lnv, 0.5),
                "lse"
            ),
            ("lse overlapping out", m(&o_in_both, Some(&l_in_both), &qv, &cv, &btv, &lnv, 0.5), "lse"),
            (
                "out overlapping the cache",
                m(
                    &cache
                        .view()
                        .reshape(&[nb * bs * d])
                        .unwrap()
                        .as_strided(0, &[b, sq, n, dv], &[n * dv, n * dv, dv, 1])
                        .unwrap(),
                    None,
                    &qv,
                    &cv,
                    &btv,
                    &lnv,
                    0.5
                ),
                "out",
            ),
        ]
    );
    m(&ov, Some(&lv), &qv, &cv, &btv, &lnv, 0.5).unwrap();
}

#[test]
fn prefill_attention_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::PrefillAttention;
    let (tq, tk, n, d, dv) = (5i64, 6i64, 2i64, 4i64, 3i64);
    let qb = zeros(&q, F, &[tq, n, d]);
    let kb = zeros(&q, F, &[tk, n, d]);
    let vb = zeros(&q, F, &[tk, n, dv]);
    let out = nan_out(&q, F, &[tq, n, dv]);
    let lse = nan_out(&q, F, &[n, tq]);
    let cq = i32_buf(&q, &[3], &[0, 2, 5]);
    let ck = i32_buf(&q, &[3], &[0, 4, 6]);
    let good = PrefillAttentionArgs {
        out: out.view(),
        lse: Some(lse.view()),
        query: qb.view(),
        k: kb.view(),
        v: vb.view(),
        cu_seqlens_q: cq.view(),
        cu_seqlens_k: ck.view(),
        max_seqlen_q: 3,
        causal: true,
        scale: 0.5,
    };
    let cu = |v: &[i32]| i32_buf(&q, &[v.len() as i64], v);
    let (k5, v5, o4, l_bf, l_sh) = (
        zeros(&q, F, &[tk, 3, d]),
        zeros(&q, F, &[tk - 1, n, dv]),
        zeros(&q, F, &[tq, n, 4]),
        zeros(&q, DType::BF16, &[n, tq]),
        zeros(&q, F, &[tq, n]),
    );
    let v16 = zeros(&q, DType::F16, &[tk, n, dv]);
    let (unsorted, not0, neg, past, short, cq64) = (
        cu(&[0, 3, 2]),
        cu(&[1, 2, 5]),
        cu(&[0, -1, 6]),
        cu(&[0, 2, 6]),
        cu(&[0, 5]),
        Buffer::from_slice(&q, &[3], &[0i64, 2, 5]).unwrap(),
    );
    let empty = cu(&[]);
    let cq_long = cu(&[0, 2, 5, 0, 0, 0, 0, 0, 0, 0]);
    let kv_pool = Pool::output(&q, F, &[tk * n * (d + dv)], Layout::Contiguous);
    let kvp = kv_pool.view();
    let both = Pool::output(&q, F, &[tq * n * dv + n * tq], Layout::Contiguous);
    let bv = both.view();
    let cases: Vec<(&str, Edit<PrefillAttentionArgs>, &str)> = vec![
        ("k head count mismatch", Box::new(|a| a.k = k5.view()), "k"),
        ("v Tk mismatch", Box::new(|a| a.v = v5.view()), "v"),
        ("out Dv mismatch", Box::new(|a| a.out = o4.view()), "out"),
        ("query of rank 2", Box::new(|a| a.query = qb.view().select(1, 0).unwrap()), "query"),
        ("mixed dtypes", Box::new(|a| a.v = v16.view()), "v"),
        ("lse in bf16", Box::new(|a| a.lse = Some(l_bf.view())), "lse"),
        ("lse as [Tq, N]", Box::new(|a| a.lse = Some(l_sh.view())), "lse"),
        ("cu_seqlens_q decreasing", Box::new(|a| a.cu_seqlens_q = unsorted.view()), "cu_seqlens_q"),
        ("cu_seqlens_q not starting at 0", Box::new(|a| a.cu_seqlens_q = not0.view()), "cu_seqlens_q"),
        ("cu_seqlens_k negative", Box::new(|a| a.cu_seqlens_k = neg.view()), "cu_seqlens_k"),
        ("cu_seqlens_q past Tq", Box::new(|a| a.cu_seqlens_q = past.view()), "cu_seqlens_q"),
        ("cu_seqlens_k length mismatch", Box::new(|a| a.cu_seqlens_k = short.view()), "cu_seqlens_k"),
        ("cu_seqlens_q empty", Box::new(|a| a.cu_seqlens_q = empty.view()), "cu_seqlens_q"),
        ("cu_seqlens_q as i64", Box::new(|a| a.cu_seqlens_q = cq64.view()), "cu_seqlens_q"),
        ("max_seqlen_q too small", Box::new(|a| a.max_seqlen_q = 2), "max_seqlen_q"),
        ("max_seqlen_q negative", Box::new(|a| a.max_seqlen_q = -1), "max_seqlen_q"),
        ("scale = 0", Box::new(|a| a.scale = 0.0), "scale"),
        ("scale = NaN", Box::new(|a| a.scale = f32::NAN), "scale"),
        ("query on another device", Box::new(|a| a.query = on_cuda(&qb.view())), "query"),
        (
            "cu_seqlens_k on another device",
            Box::new(|a| a.cu_seqlens_k = on_cuda(&ck.view())),
            "cu_seqlens_k",
        ),
        (
            "lse overlapping cu_seqlens_q",
            Box::new(|a| {
                a.cu_seqlens_q = cq_long.view().slice(0, 0, 3).unwrap();
                a.lse = Some(f32_alias(&cq_long, &[n, tq]));
            }),
            "lse",
        ),
        (
            "out overlapping k",
            Box::new(|a| {
                a.k = kvp.as_strided(0, &[tk, n, d], &[n * (d + dv), d + dv, 1]).unwrap();
                a.out = kvp.as_strided(d, &[tq, n, dv], &[n * (d + dv), d + dv, 1]).unwrap();
            }),
            "out",
        ),
        (
            "lse overlapping out",
            Box::new(|a| {
                a.out = bv.as_strided(0, &[tq, n, dv], &[n * dv, dv, 1]).unwrap();
                a.lse = Some(bv.as_strided(tq * n * dv - 1, &[n, tq], &[tq, 1]).unwrap());
            }),
            "lse",
        ),
    ];
    expect_edits_invalid(&q, op, prefill_attention, good, cases, &[&out, &lse, &kv_pool, &both]);
}

#[test]
fn merge_attn_states_rejects_malformed_arguments() {
    let q = queue();
    let op = OpId::MergeAttnStates;
    let (t, n, v) = (3i64, 2i64, 4i64);
    let (pb, sb) = (zeros(&q, F, &[t, n, v]), zeros(&q, F, &[t, n, v]));
    let (plb, slb) = (zeros(&q, F, &[n, t]), zeros(&q, F, &[n, t]));
    let out = nan_out(&q, F, &[t, n, v]);
    let out_lse = nan_out(&q, F, &[n, t]);
    let good = MergeAttnStatesArgs {
        out: out.view(),
        out_lse: Some(out_lse.view()),
        prefix: pb.view(),
        prefix_lse: plb.view(),
        suffix: sb.view(),
        suffix_lse: slb.view(),
    };
    let (p_sh, s16, pl_sh, sl16, p2) = (
        zeros(&q, F, &[t, n, v + 1]),
        zeros(&q, DType::F16, &[t, n, v]),
        zeros(&q, F, &[t, n]),
        zeros(&q, DType::F16, &[n, t]),
        zeros(&q, F, &[t, n * v]),
    );
    let lse_pool = Pool::with_values(&q, F, &[n, t], n * t, 0, vec![t, 1], &vec![0.0; (n * t) as usize]);
    let io = Pool::output(&q, F, &[t, n, v], Layout::Contiguous);
    let cases: Vec<(&str, Edit<MergeAttnStatesArgs>, &str)> = vec![
        ("prefix shape mismatch", Box::new(|a| a.prefix = p_sh.view()), "prefix"),
        ("prefix of rank 2", Box::new(|a| a.prefix = p2.view()), "prefix"),
        ("suffix dtype", Box::new(|a| a.suffix = s16.view()), "suffix"),
        ("prefix_lse as [T, N]", Box::new(|a| a.prefix_lse = pl_sh.view()), "prefix_lse"),
        ("suffix_lse in f16", Box::new(|a| a.suffix_lse = sl16.view()), "suffix_lse"),
        ("out_lse as [T, N]", Box::new(|a| a.out_lse = Some(pl_sh.view())), "out_lse"),
        ("prefix on another device", Box::new(|a| a.prefix = on_cuda(&pb.view())), "prefix"),
        (
            "out_lse overlapping prefix_lse",
            Box::new(|a| {
                a.prefix_lse = lse_pool.view();
                a.out_lse = Some(lse_pool.view());
            }),
            "out_lse",
        ),
        (
            "out overlapping prefix",
            Box::new(|a| {
                a.prefix = io.view();
                a.out = io.view();
            }),
            "out",
        ),
        (
            "out overlapping itself",
            Box::new(|a| a.out = out.buf.view().as_strided(0, &[t, n, v], &[0, v, 1]).unwrap()),
            "out",
        ),
    ];
    expect_edits_invalid(&q, op, merge_attn_states, good, cases, &[&out, &out_lse, &lse_pool, &io]);
}

/// A view of `shape` whose every element is the first element of `b` (all strides 0).
fn broadcast<'a>(b: &'a Buffer, shape: &[i64]) -> Tensor<'a> {
    b.view().as_strided(0, shape, &vec![0; shape.len()]).unwrap()
}

#[test]
fn an_index_tensor_broadcast_past_host_memory_is_an_error_naming_it() {
    let q = queue();
    let op = OpId::ConcatAndCacheMla;
    // T = 2^60 - 1 tokens, every one the same element (stride 0): the views are valid, but
    // reading the slots for validation reserved T f64s (~8 EiB) and aborted the process.
    let t = (1i64 << 60) - 1;
    let one = zeros(&q, F, &[1]);
    let slot = i64_buf(&q, &[0]);
    let cache = nan_out(&q, F, &[1, 1, 2]);
    let r = concat_and_cache_mla(
        &q,
        &ConcatAndCacheMlaArgs {
            kv_c: broadcast(&one, &[t, 1]),
            k_pe: broadcast(&one, &[t, 1]),
            cache: cache.view(),
            slot_mapping: broadcast(&slot, &[t]),
        },
    );
    expect_invalid("slot_mapping of 2^60 - 1 broadcast slots", r, op, "slot_mapping", &q, &[&cache]);
    // The host read of a view does the same.
    let e = q.read_f64(&broadcast(&one, &[t])).unwrap_err().to_string();
    assert!(e.contains(&t.to_string()) && e.contains("host memory"), "{e}");
}

#[test]
fn a_block_table_times_block_size_past_i64_is_an_error_not_a_wrap() {
    let q = queue();
    let op = OpId::MlaDecodeAttention;
    // MB = 2^14 (a broadcast block table) and BS = 2^50 (a broadcast cache): MB * BS wrapped
    // i64 (a panic in debug builds) while the sequence lengths were checked.
    let (mb, bs) = (1i64 << 14, 1i64 << 50);
    let query = zeros(&q, F, &[1, 1, 1, 1]);
    let one = zeros(&q, F, &[1]);
    let out = nan_out(&q, F, &[1, 1, 1, 1]);
    let bt = i32_buf(&q, &[1], &[7]); // block 7 of a 1-block cache
    let lens = i32_buf(&q, &[1], &[5]);
    let r = mla_decode_attention(
        &q,
        &MlaDecodeAttentionArgs {
            out: out.view(),
            lse: None,
            query: query.view(),
            cache: broadcast(&one, &[1, bs, 1]),
            block_table: broadcast(&bt, &[1, mb]),
            seq_lens: lens.view(),
            scale: 1.0,
        },
    );
    expect_invalid("MB * BS past i64", r, op, "block_table", &q, &[&out]);
}
