//! Work split over the machine's threads, for the ops whose reference cost grows with the
//! model (the matmuls, attention over long contexts).
//!
//! Each output row is computed by exactly one call, so a result never depends on how many
//! threads ran. The rows land in an f32 buffer the caller owns and then stores through its
//! views on one thread: the views' raw-pointer writes are never made from two threads.

/// Multiply-adds a thread should have before another thread is worth starting.
const MACS_PER_THREAD: usize = 1 << 22;

/// Fills `out`, rows of `width` values, by `fill(first_row, rows)` over contiguous ranges of
/// rows, one range a thread, with as many threads as the machine has and `macs_per_row`
/// multiply-adds a row justify. `fill` gets whole rows (`rows.len()` a multiple of `width`).
pub(crate) fn fill_rows<F>(out: &mut [f32], width: usize, macs_per_row: usize, fill: F)
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    let rows = out.len().checked_div(width).unwrap_or(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(rows.saturating_mul(macs_per_row) / MACS_PER_THREAD);
    fill_rows_on(threads, out, width, fill);
}

/// [`fill_rows`] on `threads` threads (at least 1, at most one a row).
fn fill_rows_on<F>(threads: usize, out: &mut [f32], width: usize, fill: F)
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    let rows = out.len().checked_div(width).unwrap_or(0);
    if rows == 0 {
        return;
    }
    let threads = threads.clamp(1, rows);
    if threads == 1 {
        fill(0, out);
        return;
    }
    let per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        for (t, chunk) in out.chunks_mut(per * width).enumerate() {
            let fill = &fill;
            s.spawn(move || fill(t * per, chunk));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row r gets a value that depends on r and on nothing else, so any split must give
    /// the same bits; here with 1 to 7 threads over a row count no split divides evenly.
    #[test]
    fn fill_rows_gives_the_same_rows_on_any_number_of_threads() {
        let row = |r: usize, out: &mut [f32]| {
            for (c, v) in out.iter_mut().enumerate() {
                *v = ((r * 31 + c) as f32).sqrt();
            }
        };
        let run = |threads| {
            let mut out = vec![f32::NAN; 37 * 3];
            fill_rows_on(threads, &mut out, 3, |r0, chunk| {
                for (i, rowv) in chunk.chunks_exact_mut(3).enumerate() {
                    row(r0 + i, rowv);
                }
            });
            out
        };
        let one = run(1);
        assert!(one.iter().all(|v| v.is_finite()));
        for t in [2, 3, 5, 7, 37, 100] {
            assert!(run(t).iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{t} threads");
        }
    }

    #[test]
    fn fill_rows_calls_each_row_once_with_its_index() {
        for (rows, width, macs) in
            [(0, 3, 1 << 30), (1, 3, 1 << 30), (37, 5, 1 << 30), (1000, 2, 1), (7, 1, 1 << 30)]
        {
            let mut out = vec![f32::NAN; rows * width];
            fill_rows(&mut out, width, macs, |r0, chunk| {
                assert_eq!(chunk.len() % width, 0);
                for (i, row) in chunk.chunks_exact_mut(width).enumerate() {
                    row.iter_mut().enumerate().for_each(|(c, v)| *v = ((r0 + i) * width + c) as f32);
                }
            });
            assert!(out.iter().enumerate().all(|(i, &v)| v == i as f32), "rows {rows} width {width}");
        }
    }
}
