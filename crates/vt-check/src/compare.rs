//! Comparing a backend's output with the reference's.

/// Relative Frobenius error `||out - reference|| / ||reference||`, NaN-aware.
///
/// - Any NaN in either slice, a length mismatch, or an infinity in one slice that the
///   other does not have at the same index (same sign) gives `f64::INFINITY`, so
///   `err <= tol` fails.
/// - Matching infinities (an lse of `-inf` on both sides) are exact and left out of both
///   norms.
/// - A reference of norm 0 makes the error absolute (`||out - reference||`), so two
///   all-zero results compare as 0 and a non-zero `out` still fails a small tolerance.
pub fn rel_fro_error(out: &[f64], reference: &[f64]) -> f64 {
    if out.len() != reference.len() {
        return f64::INFINITY;
    }
    let (mut diff2, mut ref2) = (0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        if o.is_nan() || r.is_nan() {
            return f64::INFINITY;
        }
        if o.is_infinite() || r.is_infinite() {
            if o != r {
                return f64::INFINITY;
            }
            continue;
        }
        diff2 += (o - r) * (o - r);
        ref2 += r * r;
    }
    if ref2 == 0.0 {
        diff2.sqrt()
    } else {
        (diff2 / ref2).sqrt()
    }
}

/// The result of comparing one output buffer with the reference's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Comparison {
    /// [`rel_fro_error`] over the written elements (infinite when one is NaN or an
    /// infinity does not match).
    pub rel_err: f64,
    /// What is wrong besides the size of the error: NaNs, mismatched infinities, elements
    /// outside the output that changed. Empty when nothing is.
    pub problems: Vec<String>,
}

impl Comparison {
    pub fn passed(&self, tolerance: f64) -> bool {
        self.problems.is_empty() && self.rel_err <= tolerance
    }
}

/// Compares a whole buffer read back from the backend (`out`) with the reference's.
///
/// `written[i]` says whether element i is one the op must write. Written elements are
/// compared by [`rel_fro_error`] and must not be NaN on either side (a NaN in `out` is
/// an element left at its poison or computed as NaN; one in `reference` is a broken
/// reference). Every other element must equal what the reference holds (NaN matching
/// NaN: both still poisoned, or both the unchanged input), so writes outside the output
/// fail.
pub fn compare(out: &[f64], reference: &[f64], written: &[bool]) -> Comparison {
    if out.len() != reference.len() || out.len() != written.len() {
        return Comparison {
            rel_err: f64::INFINITY,
            problems: vec![format!(
                "lengths differ: out {}, reference {}, mask {}",
                out.len(),
                reference.len(),
                written.len()
            )],
        };
    }
    let (mut sel_out, mut sel_ref) = (Vec::new(), Vec::new());
    let mut nan_out = Counter::new("NaN in the output (unwritten or computed as NaN)");
    let mut nan_ref = Counter::new("NaN in the reference");
    let mut inf = Counter::new("infinity that does not match the reference");
    let mut outside = Counter::new("element outside the output (or an input) changed");
    for (i, ((&o, &r), &w)) in out.iter().zip(reference).zip(written).enumerate() {
        if w {
            sel_out.push(o);
            sel_ref.push(r);
            if o.is_nan() {
                nan_out.hit(i, o, r);
            }
            if r.is_nan() {
                nan_ref.hit(i, o, r);
            }
            if (o.is_infinite() || r.is_infinite()) && o != r && !o.is_nan() && !r.is_nan() {
                inf.hit(i, o, r);
            }
        } else if !(o == r || (o.is_nan() && r.is_nan())) {
            outside.hit(i, o, r);
        }
    }
    let problems = [nan_out, nan_ref, inf, outside].into_iter().filter_map(Counter::report).collect();
    Comparison { rel_err: rel_fro_error(&sel_out, &sel_ref), problems }
}

/// A value for a message: plain when moderate, scientific when huge or tiny.
fn short(x: f64) -> String {
    let a = x.abs();
    if a != 0.0 && a.is_finite() && !(1e-4..1e6).contains(&a) {
        format!("{x:.6e}")
    } else {
        format!("{x}")
    }
}

/// Counts one kind of problem and remembers its first occurrence.
struct Counter {
    what: &'static str,
    count: usize,
    first: Option<(usize, f64, f64)>,
}

impl Counter {
    fn new(what: &'static str) -> Counter {
        Counter { what, count: 0, first: None }
    }

    fn hit(&mut self, i: usize, o: f64, r: f64) {
        self.count += 1;
        self.first.get_or_insert((i, o, r));
    }

    fn report(self) -> Option<String> {
        let (i, o, r) = self.first?;
        Some(format!(
            "{} x {} (first at buffer element {i}: got {}, reference {})",
            self.count,
            self.what,
            short(o),
            short(r)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f64 = f64::INFINITY;

    fn reference() -> Vec<f64> {
        vec![1.0, -2.0, 0.5, 3.0, -0.25, 4.0]
    }

    #[test]
    fn identical_outputs_have_zero_error() {
        let r = reference();
        assert_eq!(rel_fro_error(&r, &r), 0.0);
        assert!(compare(&r, &r, &[true; 6]).passed(0.0));
    }

    #[test]
    fn rel_fro_error_is_the_relative_frobenius_norm() {
        // ||(3, 4)|| = 5; out differs by (0.3, 0.4) -> 0.5 / 5.
        let err = rel_fro_error(&[3.3, 4.4], &[3.0, 4.0]);
        assert!((err - 0.1).abs() < 1e-12, "{err}");
    }

    #[test]
    fn a_perturbed_output_fails() {
        let r = reference();
        let mut out = r.clone();
        out[3] *= 1.01;
        let c = compare(&out, &r, &[true; 6]);
        assert!(c.problems.is_empty());
        assert!(c.rel_err > 1e-3 && !c.passed(1e-3), "{c:?}");
        assert!(c.passed(1e-2), "a 1% change of one element is within 1e-2: {c:?}");
    }

    #[test]
    fn a_nan_in_the_output_fails_at_any_tolerance() {
        let r = reference();
        let mut out = r.clone();
        out[2] = f64::NAN;
        assert_eq!(rel_fro_error(&out, &r), INF);
        let c = compare(&out, &r, &[true; 6]);
        assert!(!c.passed(f64::MAX), "{c:?}");
        assert!(c.problems[0].contains("NaN in the output"), "{c:?}");
    }

    #[test]
    fn an_unwritten_poisoned_element_fails() {
        // The reference wrote every element; the backend left element 4 at its poison.
        let r = reference();
        let mut out = r.clone();
        out[4] = f64::NAN;
        let mut written = [false; 6];
        written[2..].fill(true);
        let c = compare(&out, &r, &written);
        assert!(!c.passed(1.0), "{c:?}");
        assert!(c.problems.iter().any(|p| p.contains("first at buffer element 4")), "{c:?}");
    }

    #[test]
    fn a_nan_in_the_reference_fails() {
        let mut r = reference();
        r[0] = f64::NAN;
        let c = compare(&reference(), &r, &[true; 6]);
        assert!(!c.passed(1.0));
        assert!(c.problems[0].contains("NaN in the reference"), "{c:?}");
    }

    #[test]
    fn matching_neg_inf_lse_passes() {
        let r = vec![1.5, f64::NEG_INFINITY, 2.0, f64::NEG_INFINITY];
        let mut out = r.clone();
        out[0] = 1.5 + 1e-7;
        let c = compare(&out, &r, &[true; 4]);
        assert!(c.passed(1e-6), "{c:?}");
        assert!(c.rel_err > 0.0 && c.rel_err.is_finite());
    }

    #[test]
    fn mismatched_neg_inf_lse_fails() {
        let r = vec![1.5, f64::NEG_INFINITY, 2.0];
        // A query that saw no key must give -inf, not a large negative number ...
        let out = vec![1.5, -1e30, 2.0];
        let c = compare(&out, &r, &[true; 3]);
        assert!(!c.passed(f64::MAX), "{c:?}");
        assert!(c.problems[0].contains("infinity"), "{c:?}");
        // ... and a query that saw keys must not give -inf (or +inf).
        for bad in [f64::NEG_INFINITY, INF] {
            let out = vec![bad, f64::NEG_INFINITY, 2.0];
            assert!(!compare(&out, &r, &[true; 3]).passed(f64::MAX));
            assert_eq!(rel_fro_error(&out, &r), INF);
        }
    }

    #[test]
    fn a_write_outside_the_output_fails() {
        // Elements 0 and 5 are not part of the output: poison on both sides must stay.
        let nan = f64::NAN;
        let r = vec![nan, 1.0, 2.0, 3.0, 4.0, nan];
        let written = [false, true, true, true, true, false];
        assert!(compare(&r, &r, &written).passed(0.0), "NaN == NaN outside the output");
        let mut out = r.clone();
        out[5] = 0.0;
        let c = compare(&out, &r, &written);
        assert!(!c.passed(f64::MAX), "{c:?}");
        assert!(c.problems[0].contains("outside the output"), "{c:?}");
    }

    #[test]
    fn a_changed_input_fails() {
        let r = reference();
        let mut out = r.clone();
        out[1] = -2.0000001;
        assert!(!compare(&out, &r, &[false; 6]).passed(f64::MAX));
    }

    #[test]
    fn zero_reference_makes_the_error_absolute() {
        assert_eq!(rel_fro_error(&[0.0, 0.0], &[0.0, 0.0]), 0.0);
        assert!((rel_fro_error(&[0.0, 0.5], &[0.0, 0.0]) - 0.5).abs() < 1e-15);
        assert_eq!(rel_fro_error(&[], &[]), 0.0);
    }

    #[test]
    fn length_mismatch_fails() {
        assert_eq!(rel_fro_error(&[1.0], &[1.0, 2.0]), INF);
        assert!(!compare(&[1.0], &[1.0, 2.0], &[true, true]).passed(f64::MAX));
    }
}
