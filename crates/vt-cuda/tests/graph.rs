//! `vt_core::Queue::capture` / `record_event` on CUDA: a captured sequence of ops replays
//! bit for bit, events time device work, and MlaDecodeAttention's per-queue split-KV
//! buffers stay valid for a captured graph after a later, larger call grows them. Skips
//! (with a line saying so) without a CUDA device.

use vt_core::{
    encode_f64, mla_decode_attention, rms_norm, Buffer, DType, Device, DeviceType, MlaDecodeAttentionArgs,
    Queue, RmsNormArgs,
};

mod common;
use common::gpu;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut z = seed;
    (0..n)
        .map(|_| {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((z >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn a_captured_sequence_of_ops_replays_bit_for_bit_and_events_time_it() {
    let Some(q) = gpu() else { return };
    assert!(q.supports_capture());
    let (rows, cols) = (512, 4096);
    let x = Buffer::from_f64(&q, DType::BF16, &[rows, cols], &values((rows * cols) as usize, 1)).unwrap();
    let w = Buffer::from_f64(&q, DType::BF16, &[cols], &values(cols as usize, 2)).unwrap();
    let (a, b) = (
        Buffer::nan(&q, DType::BF16, &[rows, cols]).unwrap(),
        Buffer::nan(&q, DType::BF16, &[rows, cols]).unwrap(),
    );
    let step = || -> vt_core::Result<()> {
        rms_norm(&q, &RmsNormArgs { out: a.view(), x: x.view(), weight: w.view(), eps: 1e-6 })?;
        rms_norm(&q, &RmsNormArgs { out: b.view(), x: a.view(), weight: w.view(), eps: 1e-6 })
    };
    step().unwrap(); // warm-up: modules loaded
    let want = b.to_bytes(&q).unwrap();
    b.fill_pattern(&q, DType::BF16.nan_bytes()).unwrap();
    let graph = q.capture(step).unwrap();
    assert_eq!(graph.device(), q.device());
    // Capturing ran nothing.
    assert!(q.read_f64(&b.view()).unwrap().iter().all(|v| v.is_nan()));
    let e0 = q.record_event().unwrap();
    for _ in 0..10 {
        graph.launch().unwrap();
    }
    let e1 = q.record_event().unwrap();
    assert_eq!(b.to_bytes(&q).unwrap(), want);
    let ms = e0.elapsed_ms(&e1).unwrap();
    assert!(ms > 0.0 && ms < 1e4, "{ms} ms");
    // New input in the same buffer, then only the graph.
    x.write_bytes(&q, &encode_f64(DType::BF16, &values((rows * cols) as usize, 3))).unwrap();
    graph.launch().unwrap();
    let replayed = b.to_bytes(&q).unwrap();
    step().unwrap();
    assert_eq!(replayed, b.to_bytes(&q).unwrap());
    // A capture that synchronizes fails, and the queue works afterwards.
    let err = q.capture(|| q.synchronize()).unwrap_err();
    eprintln!("capture with a synchronize: {err}");
    step().unwrap();
    q.synchronize().unwrap();
}

/// A decode attention of `b` sequences of `len` tokens (block 64, 128 heads, 576/512).
struct Decode {
    q: Buffer,
    cache: Buffer,
    bt: Buffer,
    lens: Buffer,
    out: Buffer,
}

impl Decode {
    fn new(queue: &Queue, b: i64, len: i32, seed: u64) -> Decode {
        let (n, d, dv, bs) = (128, 576, 512, 64);
        let mb = (len as i64 + bs - 1) / bs;
        let nb = b * mb;
        let dt = DType::BF16;
        let bt: Vec<i32> = (0..nb as i32).collect();
        Decode {
            q: Buffer::from_f64(queue, dt, &[b, 1, n, d], &values((b * n * d) as usize, seed)).unwrap(),
            cache: Buffer::from_f64(queue, dt, &[nb, bs, d], &values((nb * bs * d) as usize, seed + 1))
                .unwrap(),
            bt: Buffer::from_slice(queue, &[b, mb], &bt).unwrap(),
            lens: Buffer::from_slice(queue, &[b], &vec![len; b as usize]).unwrap(),
            out: Buffer::nan(queue, dt, &[b, 1, n, dv]).unwrap(),
        }
    }

    fn run(&self, queue: &Queue) -> vt_core::Result<()> {
        mla_decode_attention(
            queue,
            &MlaDecodeAttentionArgs {
                out: self.out.view(),
                lse: None,
                query: self.q.view(),
                cache: self.cache.view(),
                block_table: self.bt.view(),
                seq_lens: self.lens.view(),
                scale: 0.1,
            },
        )
    }
}

#[test]
fn decode_partials_outgrown_after_a_capture_stay_valid_for_the_graph() {
    let Some(_) = gpu() else { return };
    // A fresh queue: its partial buffers are sized by this test's calls only.
    let q = Queue::new(Device::new(DeviceType::Cuda, 0)).unwrap();
    let small = Decode::new(&q, 2, 3000, 10);
    small.run(&q).unwrap();
    let want = small.out.to_bytes(&q).unwrap();
    let graph = q.capture(|| small.run(&q)).unwrap();
    // A larger batch grows the queue's partial buffers (more parts + sequences).
    let big = Decode::new(&q, 96, 700, 20);
    big.run(&q).unwrap();
    q.synchronize().unwrap();
    small.out.fill_pattern(&q, DType::BF16.nan_bytes()).unwrap();
    graph.launch().unwrap();
    assert_eq!(small.out.to_bytes(&q).unwrap(), want, "the graph's partials were freed by the larger call");
    // The larger call's result is intact too (its buffers are not the graph's).
    let big_out = big.out.to_bytes(&q).unwrap();
    big.run(&q).unwrap();
    assert_eq!(big.out.to_bytes(&q).unwrap(), big_out);
}
