//! What the GPU test files share: the CUDA queue (or a skip), the CPU queue, the error measure,
//! paged cache layouts and random fp8_ds_mla rows.
// Each test file uses what it needs of this module.
#![allow(dead_code)]

use std::sync::OnceLock;

use rand::seq::SliceRandom;
use rand::Rng;
use vt_core::fp8_ds_mla::{encode_row, LATENT, ROPE, ROW_BYTES};
use vt_core::{for_each_offset, Buffer, DType, Device, DeviceType, Probe, Queue, Tensor};

/// This run's seed: VT_SEED (to replay a failure) or the clock (fresh inputs every run),
/// drawn once per test binary and printed at every call (so each test's output holds it).
pub fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    let s = *SEED.get_or_init(|| {
        std::env::var("VT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(7)
        })
    });
    println!("seed {s} (replay with VT_SEED={s})");
    s
}

/// A generator for one case: the run's seed (fresh each run) mixed with the case's own
/// number, so cases in one run draw different inputs and a printed VT_SEED replays them all.
pub fn case_rng(case_seed: u64) -> rand_chacha::ChaCha8Rng {
    use rand::SeedableRng;
    rand_chacha::ChaCha8Rng::seed_from_u64(seed() ^ case_seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// [`case_rng`] for a case named by a string (its bytes hashed into the case's number).
pub fn named_rng(case: &str) -> rand_chacha::ChaCha8Rng {
    case_rng(case.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64)))
}

/// A queue on CUDA device 0 (the CPU and CUDA backends registered once per process), or
/// `None` with a line saying why the test is skipped.
pub fn gpu() -> Option<Queue> {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    let probe = PROBE.get_or_init(|| {
        vt_cpu::register();
        vt_cuda::register()
    });
    match probe {
        Probe::Registered { .. } => Some(Queue::new(Device::new(DeviceType::Cuda, 0)).unwrap()),
        other => {
            println!("SKIP: no CUDA device ({other})");
            None
        }
    }
}

/// The CPU reference's queue.
pub fn cpu() -> Queue {
    Queue::new(Device::CPU).unwrap()
}

/// Relative Frobenius error ||got - want|| / ||want||.
pub fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (g, w) in got.iter().zip(want) {
        num += (g - w) * (g - w);
        den += w * w;
    }
    (num / den.max(1e-30)).sqrt()
}

/// On sm_90, where the kernel a test forces takes every case the test gives it, asserts that
/// `want` cases ran (a refusal or launch error, which the tests' runners report as a skip,
/// must not pass as one); elsewhere prints a SKIP line naming `kernel`.
pub fn assert_every_case_ran_on_sm90(g: &Queue, ran: &[String], want: usize, kernel: &str) {
    if g.downcast::<vt_cuda::CudaQueue>().map_or(0, |c| c.sm()) == 90 {
        assert_eq!(ran.len(), want, "every case ran: {ran:?}");
    } else {
        println!("SKIP: no sm_90a device, the {kernel} does not run here");
    }
}

/// A paged cache for sequences of `lens` tokens in blocks of `bs` tokens: each sequence's
/// blocks at distinct ids, shuffled over a cache of all their blocks plus 3 no sequence owns.
pub struct Paged {
    /// `[B, MB]` block ids (f64, for upload as i32); entries past a sequence's blocks hold 0.
    pub block_table: Vec<f64>,
    /// Blocks in the cache.
    pub nb: i64,
    /// Block table columns: the longest sequence's blocks, at least 1.
    pub mb: i64,
    bs: i64,
}

impl Paged {
    pub fn new(rng: &mut impl Rng, lens: &[i32], bs: i64) -> Paged {
        let blocks: Vec<i64> = lens.iter().map(|&l| (l as i64 + bs - 1) / bs).collect();
        let mb = blocks.iter().copied().max().unwrap_or(0).max(1);
        let nb = blocks.iter().sum::<i64>() + 3;
        let mut ids: Vec<i64> = (0..nb).collect();
        ids.shuffle(rng);
        let mut next = ids.into_iter();
        let mut block_table = vec![0f64; (lens.len() as i64 * mb) as usize];
        for (i, &count) in blocks.iter().enumerate() {
            for j in 0..count {
                block_table[(i as i64 * mb + j) as usize] = next.next().unwrap() as f64;
            }
        }
        Paged { block_table, nb, mb, bs }
    }

    /// The cache row (block id x BS + offset in the block) of token `t` of sequence `i`.
    pub fn row(&self, i: usize, t: i64) -> i64 {
        let blk = self.block_table[(i as i64 * self.mb + t / self.bs) as usize] as i64;
        blk * self.bs + t % self.bs
    }
}

/// A random fp8_ds_mla cache row: latent values in groups of 128 of different magnitudes
/// (one all zero, so the scales matter; `shift` rotates which group has which), rope values
/// in [-1, 1).
pub fn random_fp8_row(rng: &mut impl Rng, shift: usize) -> [u8; ROW_BYTES] {
    let mut latent = [0f32; LATENT];
    for (k, v) in latent.iter_mut().enumerate() {
        let mag = [1.0f32, 0.05, 0.0, 7.0][(k / 128 + shift) % 4];
        *v = rng.gen_range(-1.0f32..1.0) * mag;
    }
    let mut rope = [0f32; ROPE];
    for v in rope.iter_mut() {
        *v = rng.gen_range(-1.0f32..1.0);
    }
    let mut bytes = [0u8; ROW_BYTES];
    encode_row(&latent, &rope, &mut bytes);
    bytes
}

/// A rotary cos/sin cache `[max_pos, r]`: row p = [cos(p f_i) | sin(p f_i)], f_i = 10000^(-2i/r).
pub fn cos_sin(max_pos: i64, r: i64) -> Vec<f64> {
    let half = r / 2;
    let mut v = Vec::new();
    for p in 0..max_pos {
        let ang: Vec<f64> = (0..half).map(|i| p as f64 / 10000f64.powf(2.0 * i as f64 / r as f64)).collect();
        v.extend(ang.iter().map(|a| a.cos()));
        v.extend(ang.iter().map(|a| a.sin()));
    }
    v
}

/// The same host bytes on the CPU and on the GPU.
pub struct Twin {
    pub cpu: Buffer,
    pub gpu: Buffer,
}

impl Twin {
    pub fn new(c: &Queue, g: &Queue, dt: DType, bytes: &[u8]) -> Twin {
        let n = (bytes.len() / dt.size_of()) as i64;
        Twin {
            cpu: Buffer::from_bytes(c, dt, &[n], bytes).unwrap(),
            gpu: Buffer::from_bytes(g, dt, &[n], bytes).unwrap(),
        }
    }
    pub fn nan(c: &Queue, g: &Queue, dt: DType, n: i64) -> Twin {
        Twin { cpu: Buffer::nan(c, dt, &[n]).unwrap(), gpu: Buffer::nan(g, dt, &[n]).unwrap() }
    }
    pub fn views(&self, offset: i64, shape: &[i64], strides: &[i64]) -> (Tensor<'_>, Tensor<'_>) {
        (
            self.cpu.view().as_strided(offset, shape, strides).unwrap(),
            self.gpu.view().as_strided(offset, shape, strides).unwrap(),
        )
    }
}

/// Compares a [`Twin`] output's whole buffers, shared by the GEMM tests (fp8_matmul.rs,
/// skinny_gemm.rs): every element of `written` not NaN on the GPU and, together, within `tol`
/// of the CPU's by `err` (each file keeps its own relative Frobenius measure: they differ on a
/// zero or infinite reference); every other element still NaN on the GPU.
pub fn check_written(
    what: &str,
    c: &Queue,
    g: &Queue,
    out: &Twin,
    written: &Tensor<'_>,
    tol: f64,
    err: fn(&[f64], &[f64]) -> f64,
) {
    let (want, got) = (out.cpu.to_f64(c).unwrap(), out.gpu.to_f64(g).unwrap());
    let mut inside = vec![false; want.len()];
    for_each_offset(written, |o| inside[o as usize] = true);
    let (mut w, mut o) = (Vec::new(), Vec::new());
    for i in 0..want.len() {
        if inside[i] {
            assert!(!got[i].is_nan(), "{what}: element {i} is NaN (unwritten?)");
            w.push(want[i]);
            o.push(got[i]);
        } else {
            assert!(got[i].is_nan(), "{what}: element {i} outside the output was written ({})", got[i]);
        }
    }
    let err = err(&o, &w);
    println!("{what}: relative error {err:.3e} (tolerance {tol:.0e})");
    assert!(err <= tol, "{what}: relative error {err:.3e} > {tol:.0e}");
}

/// How far a token's lse over an fp8_ds_mla cache may sit from the CPU's by rounding alone,
/// given its query row `q` and the exactly dequantized rows `keys` it attends (576 values
/// each), at softmax scale `scale`. The CPU scores the exact keys; the GPU kernels round each
/// dequantized key value to bf16 once (relative error up to 2^-9, uniform: e4m3 x an f32 scale
/// has more bits than bf16 holds) or split the query row into two e4m3 parts (within 2^-9 of
/// the row's largest value). A score's error then has standard deviation at most
/// scale 2^-9 / sqrt(3) sqrt(sum (q_d k_d)^2 + max|q|^2 sum k_d^2), and the lse, a soft maximum
/// of the scores, moves by a convex mix of theirs. The bound is six of the largest such
/// deviation over the keys (a worst case that sums every rounding one way is ~sqrt(576) looser
/// and would let real errors through), plus 1e-4 (1 + |lse|) for the f32 arithmetic.
pub fn fp8_lse_bound<'a>(q: &[f64], keys: impl Iterator<Item = &'a [f32]>, scale: f64, lse: f64) -> f64 {
    let qmax = q.iter().fold(0f64, |m, v| m.max(v.abs()));
    let sd = keys
        .map(|k| {
            let (qk, kk) = q.iter().zip(k).fold((0f64, 0f64), |(a, b), (&qd, &kd)| {
                let kd = kd as f64;
                (a + (qd * kd).powi(2), b + kd * kd)
            });
            (qk + qmax * qmax * kk).sqrt()
        })
        .fold(0f64, f64::max);
    6.0 * scale.abs() * 2f64.powi(-9) / 3f64.sqrt() * sd + 1e-4 * (1.0 + lse.abs())
}
