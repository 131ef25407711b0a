//! Speed of the copy kernels at DeepSeek-V3 prefill shapes against the device copy ceiling:
//! ConcatMlaNopeRope (the key `[k_nope | k_pe]`, T = 8192, 128 heads, nope 128 + rope 64,
//! nope a slice of the kv_b_proj rows, k_pe the tail of the kv rows broadcast over heads)
//! and GatherMlaCache (T rows of kv_lora 512 + rope 64 from a paged cache of block size 64,
//! shuffled blocks). Each line gives bytes read + written, the median time over L2-flushed
//! runs (CUDA events), GB/s, and the share of two ceilings measured in the same run: a
//! 1 GiB device-to-device copy, and a copy of the op's own byte count (same launch and
//! latency overheads, also L2-flushed). The target is 80% of the 1 GiB ceiling. The
//! scalar fallback (forced with an output one element off alignment) is timed beside the
//! vector path. Sampled rows are checked against the inputs before timing.
//!
//! Ignored by default; on a GPU:
//! `cargo test --release -p vt-cuda --test copy_kernels_speed -- --ignored --nocapture`

use std::sync::OnceLock;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use vt_core::{
    concat_mla_nope_rope, gather_mla_cache, Buffer, ConcatMlaNopeRopeArgs, DType, Device, DeviceType, Error,
    GatherMlaCacheArgs, Probe, Queue, Result, Tensor,
};
use vt_cuda::bench::{filled_value, median, Bench};
use vt_cuda::CudaQueue;

const WARMUP: usize = 3;
const ITERS: usize = 30;
const TARGET: f64 = 0.8;

fn cuda() -> Option<Device> {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    let probe = PROBE.get_or_init(vt_cuda::register);
    match probe {
        Probe::Registered { .. } => Some(Device::new(DeviceType::Cuda, 0)),
        other => {
            println!("SKIP: no CUDA device ({other})");
            None
        }
    }
}

/// Ceilings of one run: the 1 GiB copy rate, and a way to time a copy of any size.
struct Ceiling<'q> {
    bench: &'q Bench<'q>,
    queue: &'q Queue,
    big: f64,
}

impl Ceiling<'_> {
    /// Median microseconds of an L2-flushed device-to-device copy moving `bytes` in all
    /// (bytes / 2 read, bytes / 2 written), as the ops' times are taken.
    fn same_size_us(&self, bytes: usize) -> Result<f64> {
        let n = (bytes / 2).div_ceil(4) as i64;
        let src = Buffer::uninit(self.queue, DType::F32, &[n])?;
        let dst = Buffer::uninit(self.queue, DType::F32, &[n])?;
        let (s, d) = (src.view().data_addr(), dst.view().data_addr());
        let stream = self
            .queue
            .downcast::<CudaQueue>()
            .ok_or_else(|| Error::backend("cuda", "the queue is not a CUDA queue"))?
            .cu_stream();
        let mut t = self.bench.time_us(WARMUP, ITERS, true, || {
            // SAFETY: both buffers are live allocations of n * 4 bytes on this device, and
            // the stream is this queue's.
            unsafe { cudarc::driver::result::memcpy_dtod_async(d, s, n as usize * 4, stream) }
                .map_err(|e| Error::backend("cuda", format!("copy: {e}")))
        })?;
        Ok(median(&mut t))
    }

    fn report(&self, what: &str, bytes: usize, times: &mut [f64]) -> Result<()> {
        let us = median(times);
        let rate = bytes as f64 / (us * 1e-6);
        let same = self.same_size_us(bytes)?;
        let share = rate / self.big;
        println!(
            "{what}: {:.1} MB in {us:.1} us = {:.0} GB/s, {:.1}% of the copy ceiling ({}), {:.1}% of a \
             same-size copy ({same:.1} us)",
            bytes as f64 / 1e6,
            rate / 1e9,
            100.0 * share,
            if share >= TARGET { "target met" } else { "below the 80% target" },
            100.0 * same / us,
        );
        Ok(())
    }
}

/// Elements of `t` (a view of a buffer filled by `Bench::fill` with `seed`, element i of
/// the buffer = `filled_value(i)`) at `offsets` (buffer offsets) equal `got`.
fn check_values(dt: DType, seed: u64, got: &[f64], offsets: impl Iterator<Item = i64>, what: &str) {
    for (k, (g, off)) in got.iter().zip(offsets).enumerate() {
        let want = filled_value(dt, seed, 1.0, off as u64) as f64;
        assert_eq!(*g, want, "{what}: element {k} is {g}, expected {want} (buffer offset {off})");
    }
}

/// One row of `out` read back (synchronizes).
fn row(q: &Queue, out: &Tensor<'_>, offset: i64, len: i64) -> Vec<f64> {
    let v = out.as_strided(offset, &[len], &[1]).and_then(|r| q.read_f64(&r));
    v.expect("reading a row back")
}

fn concat_speed(q: &Queue, b: &Bench<'_>, c: &Ceiling<'_>, dt: DType) -> Result<()> {
    let (t, n, p, v, r, l) = (8192i64, 128i64, 128i64, 128i64, 64i64, 512i64);
    let es = dt.size_of();
    let kv_b = Buffer::uninit(q, dt, &[t, n * (p + v)])?;
    let kv = Buffer::uninit(q, dt, &[t, l + r])?;
    // One spare element so the fallback's output can start off alignment.
    let out_buf = Buffer::uninit(q, dt, &[t * n * (p + r) + 1])?;
    b.fill(&kv_b.view(), 11, 1.0)?;
    b.fill(&kv.view(), 12, 1.0)?;
    let nope = kv_b.view().as_strided(0, &[t, n, p], &[n * (p + v), p + v, 1])?;
    let rope = kv.view().as_strided(l, &[t, 1, r], &[l + r, r, 1])?;
    let bytes = (t * n * p + t * r + t * n * (p + r)) as usize * es;
    for (label, shift) in [("vector path", 0i64), ("scalar fallback", 1)] {
        let out = out_buf.view().as_strided(shift, &[t, n, p + r], &[n * (p + r), p + r, 1])?;
        concat_mla_nope_rope(q, &ConcatMlaNopeRopeArgs { out, nope, rope })?;
        for (tt, h) in [(0, 0), (1, 127), (4095, 77), (t - 1, n - 1)] {
            let got = row(q, &out, (tt * n + h) * (p + r), p + r);
            let (nope_got, rope_got) = got.split_at(p as usize);
            let what = format!("concat {label} row ({tt}, {h})");
            check_values(dt, 11, nope_got, (0..p).map(|i| tt * n * (p + v) + h * (p + v) + i), &what);
            check_values(dt, 12, rope_got, (0..r).map(|i| tt * (l + r) + l + i), &what);
        }
        let mut times = b.time_us(WARMUP, ITERS, true, || {
            concat_mla_nope_rope(q, &ConcatMlaNopeRopeArgs { out, nope, rope })
        })?;
        c.report(
            &format!("ConcatMlaNopeRope {dt} T {t} N {n} P {p} R {r} broadcast, {label}"),
            bytes,
            &mut times,
        )?;
    }
    Ok(())
}

fn gather_speed(q: &Queue, b: &Bench<'_>, c: &Ceiling<'_>, dt: DType, t: i64, fallback: bool) -> Result<()> {
    let (d, bs) = (576i64, 64i64);
    let es = dt.size_of();
    let blocks = (t + bs - 1) / bs;
    let nb = blocks + 16;
    let cache = Buffer::uninit(q, dt, &[nb, bs, d])?;
    b.fill(&cache.view(), 21, 1.0)?;
    let mut ids: Vec<i32> = (0..nb as i32).collect();
    ids.shuffle(&mut ChaCha8Rng::seed_from_u64(5));
    ids.truncate(blocks as usize);
    let table = Buffer::from_slice(q, &[1, blocks], &ids)?;
    let cu = Buffer::from_slice(q, &[2], &[0i32, t as i32])?;
    let out_buf = Buffer::uninit(q, dt, &[t * d + 1])?;
    let out = out_buf.view().as_strided(i64::from(fallback), &[t, d], &[d, 1])?;
    let (cv, tv, cuv) = (cache.view(), table.view(), cu.view());
    gather_mla_cache(
        q,
        &GatherMlaCacheArgs { out, cache: cv, block_table: tv, cu_seq_lens: cuv, seq_starts: None },
    )?;
    for j in [0, 1, bs - 1, bs, t / 2 + 3, t - 1] {
        let got = row(q, &out, j * d, d);
        let src = i64::from(ids[(j / bs) as usize]) * bs * d + (j % bs) * d;
        check_values(dt, 21, &got, src..src + d, &format!("gather row {j}"));
    }
    let bytes = (2 * t * d) as usize * es;
    let mut times = b.time_us(WARMUP, ITERS, true, || {
        gather_mla_cache(
            q,
            &GatherMlaCacheArgs { out, cache: cv, block_table: tv, cu_seq_lens: cuv, seq_starts: None },
        )
    })?;
    let label = if fallback { "scalar fallback" } else { "vector path" };
    c.report(&format!("GatherMlaCache {dt} T {t} D {d} bs {bs}, {label}"), bytes, &mut times)
}

#[test]
#[ignore = "timing on a CUDA device: run with --ignored --nocapture"]
fn copy_kernels_against_the_copy_ceiling() {
    let Some(dev) = cuda() else { return };
    let run = || -> Result<()> {
        let q = Queue::new(dev)?;
        let b = Bench::new(&q, 256 << 20)?;
        let big = b.copy_bandwidth(1 << 30, 20)?;
        println!("copy ceiling (1 GiB device-to-device, read + write): {:.0} GB/s", big / 1e9);
        let c = Ceiling { bench: &b, queue: &q, big };
        concat_speed(&q, &b, &c, DType::BF16)?;
        for t in [8192, 65536] {
            gather_speed(&q, &b, &c, DType::BF16, t, false)?;
        }
        gather_speed(&q, &b, &c, DType::BF16, 8192, true)?;
        Ok(())
    };
    run().expect("timing run");
}
