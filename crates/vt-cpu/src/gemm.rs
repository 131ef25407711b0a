//! The CPU matmuls' shared core: f32 dot products in one fixed order, and a row-block loop
//! over the weight's rows that runs on several threads ([`crate::par`]).
//!
//! The order of every sum is fixed by the data's shape alone (never by the thread count or
//! the blocking), so the reference gives the same bits on any machine with IEEE f32
//! arithmetic. Rust does not contract `a * b + c` into an FMA, so the order written here is
//! the order computed.

use crate::par;

/// Partial sums of [`dot`]: element `i` goes into sum `i % LANES`.
const LANES: usize = 8;

/// Rows of the weight converted to f32 at a time per thread ([`rows_times_rows`]): 16 rows
/// of K = 7168 are 448 KiB, which stay in L2 while every row of `a` meets them.
const ROW_BLOCK: usize = 16;

/// f32 dot product of `x` and `y[..x.len()]`: element `i` is added into partial sum
/// `i % 8` in index order, and the eight sums are added pairwise,
/// `((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))`. Eight independent sums let the
/// compiler use vector registers (a single running sum is one dependent add per element).
pub(crate) fn dot(x: &[f32], y: &[f32]) -> f32 {
    let y = &y[..x.len()];
    let mut s = [0f32; LANES];
    let (xc, yc) = (x.chunks_exact(LANES), y.chunks_exact(LANES));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (xs, ys) in xc.zip(yc) {
        for l in 0..LANES {
            s[l] += xs[l] * ys[l];
        }
    }
    for (l, (a, b)) in xr.iter().zip(yr).enumerate() {
        s[l] += a * b;
    }
    ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
}

/// `m` rows of `k` values packed in one f32 buffer, row `i` written by `read(i, row)` (a
/// matmul's left operand, converted or dequantized once).
pub(crate) fn packed_rows(m: usize, k: usize, mut read: impl FnMut(usize, &mut [f32])) -> Vec<f32> {
    let mut rows = vec![0f32; m * k];
    if k > 0 {
        rows.chunks_exact_mut(k).enumerate().for_each(|(i, row)| read(i, row));
    }
    rows
}

/// `out_t[j * m + i] = dot(a[i], b[j])` for the `m` rows of `a` (each `k` long, packed) and
/// the `n` rows of `b`, which `load_b(j, row)` writes into a `k`-long f32 row on demand (the
/// caller converts or dequantizes them there, so no f32 copy of the whole weight is made).
/// The result is transposed (column `j` of the product is `out_t[j * m..(j + 1) * m]`) so
/// that threads own disjoint slices. Threads take contiguous ranges of `b`'s rows; each
/// value is one [`dot`], so the result does not depend on how many threads ran.
pub(crate) fn rows_times_rows<F>(a: &[f32], m: usize, k: usize, n: usize, load_b: F) -> Vec<f32>
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    let mut out_t = vec![0f32; n * m];
    if k == 0 {
        return out_t; // empty sums are 0
    }
    par::fill_rows(&mut out_t, m, m.saturating_mul(k), |j0, dst| {
        let mut rows = vec![0f32; ROW_BLOCK * k];
        for (jb, dst_b) in dst.chunks_mut(ROW_BLOCK * m).enumerate() {
            let nb = dst_b.len() / m;
            for r in 0..nb {
                load_b(j0 + jb * ROW_BLOCK + r, &mut rows[r * k..(r + 1) * k]);
            }
            for (i, ai) in a.chunks_exact(k).enumerate() {
                for r in 0..nb {
                    dst_b[r * m + i] = dot(ai, &rows[r * k..(r + 1) * k]);
                }
            }
        }
    });
    out_t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order the contract states, written out longhand.
    fn dot_longhand(x: &[f32], y: &[f32]) -> f32 {
        let mut s = [0f32; 8];
        for (i, (a, b)) in x.iter().zip(y).enumerate() {
            s[i % 8] += a * b;
        }
        ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        // Small odd fractions of mixed magnitude: sums that round differently in other orders.
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 997.0 - 1.0)
            .collect()
    }

    #[test]
    fn dot_sums_in_eight_interleaved_lanes_for_every_length() {
        for n in [0, 1, 7, 8, 9, 63, 64, 65, 576, 7168] {
            let (x, y) = (values(n, 1), values(n, 2));
            assert_eq!(dot(&x, &y).to_bits(), dot_longhand(&x, &y).to_bits(), "n = {n}");
        }
    }

    #[test]
    fn rows_times_rows_is_every_dot_whatever_the_thread_split() {
        // n not a multiple of the row block, m = 1 (decode) and m > 1, work above and below
        // the threading threshold.
        for (m, k, n) in [(1, 7, 5), (3, 576, 37), (1, 4096, 2049), (5, 1024, 1031)] {
            let a = values(m * k, 3);
            let b = values(n * k, 4);
            let out_t = rows_times_rows(&a, m, k, n, |j, row| row.copy_from_slice(&b[j * k..(j + 1) * k]));
            for j in 0..n {
                for i in 0..m {
                    let want = dot_longhand(&a[i * k..(i + 1) * k], &b[j * k..(j + 1) * k]);
                    assert_eq!(out_t[j * m + i].to_bits(), want.to_bits(), "m {m} k {k} n {n}: ({i}, {j})");
                }
            }
        }
    }
}
