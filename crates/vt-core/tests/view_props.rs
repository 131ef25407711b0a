//! View and extent arithmetic on sizes from input data (issue 15): every view either
//! lies inside its allocation or is an error, never a wrapped offset or a panic. Fixed
//! cases for each overflow, then proptest over shapes, strides and offsets mixing small and
//! huge values. No memory is touched (views are only described), so a fake base address
//! is enough.
//!
//! Case budget: 256 per property, or `PROPTEST_CASES`.

use proptest::prelude::*;
use vt_core::{
    checked_bytes, checked_numel, contiguous_strides, for_each_offset, for_each_strided_offset, DType,
    Device, Tensor,
};

/// A root view of `extent` f32 elements at a fake address (never dereferenced).
fn root(extent: i64) -> Tensor<'static> {
    // SAFETY: the tests only describe views of this "allocation"; none is read or written.
    unsafe { Tensor::from_raw_parts(0x1000, extent, DType::F32, Device::CPU, &[extent], &[1], 0) }.unwrap()
}

fn err_msg<T: std::fmt::Debug>(r: vt_core::Result<T>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_view_whose_span_wraps_i64_is_an_error() {
    let r = root(16);
    // (2^62) * 4 wraps i64; before the fix the span wrapped negative and passed the check.
    let m = err_msg(r.as_strided(0, &[1 << 62, 2], &[4, 1]));
    assert!(m.contains("overflows"), "{m}");
    let m = err_msg(r.as_strided(0, &[3, 3], &[i64::MAX, 1]));
    assert!(m.contains("overflows"), "{m}");
    let m = err_msg(r.as_strided(i64::MAX, &[2], &[1]));
    assert!(m.contains("overflow") || m.contains("outside"), "{m}");
    // A broadcast (stride 0) view whose element count wraps: its span is small, its size not.
    let m = err_msg(r.as_strided(0, &[1 << 31, 1 << 31, 4], &[0, 0, 1]));
    assert!(m.contains("byte size overflows"), "{m}");
    // Empty dims do not hide a product of the others that wraps.
    let m = err_msg(r.as_strided(0, &[0, 1 << 40, 1 << 40], &[0, 0, 0]));
    assert!(m.contains("overflows"), "{m}");
}

#[test]
fn contiguous_views_of_overflowing_shapes_are_errors() {
    // SAFETY: as in `root`.
    let m =
        err_msg(unsafe { Tensor::from_raw_contiguous(0x1000, DType::F32, Device::CPU, &[1 << 32, 1 << 32]) });
    assert!(m.contains("overflows"), "{m}");
    let m = err_msg(root(16).reshape(&[1 << 32, 1 << 32, 0]));
    assert!(m.contains("overflows") || m.contains("cannot view"), "{m}");
    // A reshape whose product wraps to the right count must not pass.
    let m = err_msg(root(16).reshape(&[1 << 62, 4, 16]));
    assert!(m.contains("overflows"), "{m}");
    let m = err_msg(root(16).reshape(&[-4, -4]));
    assert!(m.contains("cannot view"), "{m}");
    assert!(checked_numel(&[i64::MAX, 2]).is_err());
    assert!(checked_bytes(DType::F32, &[1 << 62]).is_err());
    assert_eq!(checked_bytes(DType::BF16, &[3, 5]).unwrap(), 30);
    // Strides of a shape whose full product wraps saturate instead of panicking.
    let s = contiguous_strides(&[i64::MAX, 4]);
    assert_eq!(&s[..2], &[4, 1]);
}

#[test]
fn slices_and_unsqueezes_of_huge_strides_do_not_wrap() {
    let r = root(1 << 40);
    let v = r.as_strided(0, &[2, 2], &[1 << 39, 1]).unwrap();
    // An empty slice at the end: start * stride is in range here, but a huge stride is not.
    assert_eq!(v.slice(0, 2, 2).unwrap().numel(), 0);
    // A size-1 dim may carry any stride; slicing past it or unsqueezing in front of it
    // must not overflow.
    let w = r.as_strided(0, &[1, 2], &[i64::MAX, 1]).unwrap();
    assert_eq!(w.slice(0, 1, 1).unwrap().numel(), 0);
    assert!(w.unsqueeze(0).is_ok());
    assert!(w.unsqueeze(1).is_ok());
}

#[test]
fn an_empty_view_with_huge_strides_is_non_overlapping_without_wrapping() {
    let r = root(16);
    // An empty view reaches no element, so `as_strided` leaves its strides unbounded; the
    // overlap test summed `stride * (size - 1)` and wrapped i64 (a panic in debug builds).
    let e = r.as_strided(0, &[0, 2, 2], &[0, i64::MAX, i64::MAX]).unwrap();
    assert!(e.is_non_overlapping());
    let e = r.as_strided(0, &[2, 0, 3], &[i64::MAX / 2, 1, i64::MAX / 3]).unwrap();
    assert!(e.is_non_overlapping());
    // Non-empty views keep their answers.
    assert!(!r.as_strided(0, &[2, 2], &[1, 1]).unwrap().is_non_overlapping());
    assert!(r.as_strided(0, &[2, 2], &[2, 1]).unwrap().is_non_overlapping());
}

#[test]
fn selecting_index_i64_max_is_an_error_naming_the_index() {
    let r = root(16);
    let v = r.as_strided(0, &[4, 4], &[4, 1]).unwrap();
    // `i + 1` wrapped (a panic in debug builds) before the range check could run.
    let m = err_msg(v.select(0, i64::MAX));
    assert!(m.contains(&i64::MAX.to_string()) && m.contains("dim 0"), "{m}");
    let m = err_msg(v.select(2, 0));
    assert!(m.contains("dim 2"), "{m}");
    assert_eq!(v.select(1, 3).unwrap().shape(), &[4]);
}

/// Sizes that stress the arithmetic: small ones, and ones near the powers where products wrap.
#[test]
fn strided_offsets_walk_row_major_with_negative_and_zero_strides() {
    let mut got = Vec::new();
    for_each_strided_offset(10, &[2, 3], &[-5, 0], |o| got.push(o)).unwrap();
    assert_eq!(got, vec![10, 10, 10, 5, 5, 5]);
    got.clear();
    for_each_strided_offset(1, &[2, 0, 3], &[1, 1, 1], |o| got.push(o)).unwrap();
    assert!(got.is_empty(), "an empty view visits nothing: {got:?}");
}

#[test]
fn strided_offsets_that_overflow_i64_are_an_error_before_f_sees_them() {
    let mut got = Vec::new();
    let m = err_msg(for_each_strided_offset(i64::MAX - 1, &[3], &[1], |o| got.push(o)));
    assert!(m.contains("overflows i64") && m.contains("for_each_strided_offset"), "{m}");
    assert_eq!(got, vec![i64::MAX - 1, i64::MAX], "only the offsets that fit were visited");
    let m = err_msg(for_each_strided_offset(0, &[2, 2], &[1], |_| ()));
    assert!(m.contains("strides"), "{m}");
}

fn size() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => 0i64..5,
        1 => Just(1i64 << 31),
        1 => Just(1i64 << 32),
        1 => Just(1i64 << 62),
        1 => Just(i64::MAX),
        1 => Just(-1i64),
    ]
}

fn offset() -> impl Strategy<Value = i64> {
    prop_oneof![4 => 0i64..64, 1 => Just(i64::MAX), 1 => Just(i64::MIN), 1 => Just(1i64 << 62), 1 => Just(-3i64)]
}

/// The rule in exact (i128) arithmetic: the view is valid iff it is well formed, every
/// size fits i64 and (unless empty) it lies inside the allocation.
fn expected_ok(extent: i64, base_off: i64, off: i64, shape: &[i64], strides: &[i64]) -> bool {
    if shape.iter().chain(strides).any(|&x| x < 0) {
        return false;
    }
    let max = i64::MAX as i128;
    let bytes = shape.iter().fold(4i128, |a, &d| (a * d.max(1) as i128).min(max + 1));
    if bytes > max || extent as i128 * 4 > max {
        return false;
    }
    let start = base_off as i128 + off as i128;
    if start > max || start < i64::MIN as i128 {
        return false;
    }
    if shape.contains(&0) {
        return true;
    }
    let last = start + shape.iter().zip(strides).map(|(&d, &s)| (d as i128 - 1) * s as i128).sum::<i128>();
    last < max && start >= 0 && last < extent as i128
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn as_strided_accepts_exactly_the_views_inside_the_allocation(
        extent in prop_oneof![0i64..200, Just(1i64 << 40), Just(i64::MAX / 4)],
        off in offset(),
        shape in prop::collection::vec(size(), 0..=4),
        strides_seed in prop::collection::vec(size(), 4),
    ) {
        let strides = &strides_seed[..shape.len()];
        let r = root(extent);
        let got = r.as_strided(off, &shape, strides);
        let want = expected_ok(extent, 0, off, &shape, strides);
        prop_assert_eq!(got.is_ok(), want, "shape {:?} strides {:?} off {} extent {}: {:?}", shape, strides, off, extent, got);
        if let Ok(v) = got {
            // Small views: every element's offset, enumerated, lies inside.
            if v.numel() > 0 && v.numel() <= 4096 {
                let mut inside = true;
                for_each_offset(&v, |o| inside &= (0..extent).contains(&o));
                prop_assert!(inside);
            }
            if let Some((lo, hi)) = v.elem_span() {
                prop_assert!(lo >= 0 && hi <= extent);
            }
        }
    }

    #[test]
    fn derived_views_of_a_valid_view_stay_inside_or_fail(
        shape in prop::collection::vec(1i64..6, 1..=4),
        start in 0i64..8,
        len in 0i64..8,
        dim in 0usize..4,
        new_shape in prop::collection::vec(size(), 0..=4),
        perm_seed in 0usize..24,
    ) {
        let n: i64 = shape.iter().product();
        let r = root(n + 3);
        let strides = contiguous_strides(&shape);
        let v = r.as_strided(3, &shape, &strides[..shape.len()]).unwrap();
        let d = dim % shape.len();
        let check = |t: &Tensor<'_>| {
            t.elem_span().is_none_or(|(lo, hi)| lo >= 0 && hi <= n + 3)
        };
        if let Ok(s) = v.slice(d, start, start + len) { prop_assert!(check(&s)); }
        if let Ok(s) = v.select(d, start) { prop_assert!(check(&s)); }
        if let Ok(s) = v.reshape(&new_shape) {
            prop_assert!(check(&s));
            prop_assert_eq!(s.numel(), v.numel());
        }
        if let Ok(s) = v.unsqueeze(d) { prop_assert!(check(&s)); }
        let mut perm: Vec<usize> = (0..shape.len()).collect();
        let mut k = perm_seed;
        for i in (1..perm.len()).rev() { perm.swap(i, k % (i + 1)); k /= i + 1; }
        let p = v.permute(&perm).unwrap();
        prop_assert!(check(&p));
        prop_assert_eq!(p.numel(), v.numel());
    }
}
