//! MlaDecodeAttention over an fp8_ds_mla cache on CUDA against the CPU reference on the
//! same fp8 bytes: every kernel that reads the fp8 cache (the mma.sync kernels with the
//! full and the small ring, the narrow and the 64-row wgmma kernels and the raw-ring one, the
//! generic kernel), block sizes 1/16/64, head counts 8..128,
//! one to four query tokens, mixed lengths, split and unsplit schedules, strided cache views
//! and bad block ids. Outputs are poisoned with NaN; cache rows no sequence owns hold bytes
//! that decode to NaN (code 0x7f). bf16 tolerances: the fast kernels round the dequantized
//! values to the query dtype before the products (the narrow kernel's S^T instead splits each
//! query row into two e4m3 parts: exact for bf16 values near the row's largest, 2^-8 for f16).
//! Skips without a CUDA device (the host check of that split runs everywhere).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vt_core::fp8_ds_mla::{LATENT, ROW_BYTES};
use vt_core::{Buffer, DType, Device, MlaDecodeAttentionArgs, Queue};
use vt_cuda::mla_decode_attention::{mla_decode_attention_with, DecodeOptions, Kernel};

mod common;
use common::{assert_every_case_ran_on_sm90, gpu, random_fp8_row, rel_err, Paged};

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    lens: Vec<i32>,
    s_q: i64,
    n: i64,
    bs: i64,
    /// Extra bytes per cache row (a row stride wider than 656, kept a multiple of 16).
    row_pad: i64,
    seed: u64,
}

impl Case {
    fn new(lens: &[i32], n: i64, bs: i64) -> Case {
        Case { dtype: DType::BF16, lens: lens.to_vec(), s_q: 1, n, bs, row_pad: 0, seed: 7 }
    }
}

struct Inputs {
    q: Vec<f64>,
    cache: Vec<u8>,
    block_table: Vec<f64>,
    seq_lens: Vec<f64>,
    nb: i64,
    mb: i64,
}

fn inputs(c: &Case) -> Inputs {
    let mut rng = common::case_rng(c.seed);
    let b = c.lens.len() as i64;
    let paged = Paged::new(&mut rng, &c.lens, c.bs);
    let row = ROW_BYTES as i64 + c.row_pad;
    // 0x7f everywhere no token lives: e4m3 NaN codes (and NaN scales / rope), so reading an
    // unowned row poisons the output.
    let mut cache = vec![0x7fu8; (paged.nb * c.bs * row) as usize];
    for (i, &len) in c.lens.iter().enumerate() {
        for t in 0..len as i64 {
            let base = (paged.row(i, t) * row) as usize;
            cache[base..base + ROW_BYTES].copy_from_slice(&random_fp8_row(&mut rng, t as usize));
        }
    }
    let qn = (b * c.s_q * c.n * 576) as usize;
    let q: Vec<f64> = (0..qn).map(|_| rng.gen_range(-0.3..0.3)).collect();
    let seq_lens = c.lens.iter().map(|&l| l as f64).collect();
    Inputs { q, cache, block_table: paged.block_table, seq_lens, nb: paged.nb, mb: paged.mb }
}

/// Runs the op on `queue` (the entry point for default options on the CPU; the forced kernel
/// on CUDA) and returns (out, lse, what ran).
fn run(
    queue: &Queue,
    c: &Case,
    x: &Inputs,
    opts: Option<&DecodeOptions>,
) -> Option<(Vec<f64>, Vec<f64>, String)> {
    let b = c.lens.len() as i64;
    let row = ROW_BYTES as i64 + c.row_pad;
    let q = Buffer::from_f64(queue, c.dtype, &[b, c.s_q, c.n, 576], &x.q).unwrap();
    let cache_buf = Buffer::from_bytes(queue, DType::Fp8DsMla, &[x.nb, c.bs, row], &x.cache).unwrap();
    let bt = Buffer::from_f64(queue, DType::I32, &[b, x.mb], &x.block_table).unwrap();
    let sl = Buffer::from_f64(queue, DType::I32, &[b], &x.seq_lens).unwrap();
    let nan_out = vec![f64::NAN; (b * c.s_q * c.n * 512) as usize];
    let out = Buffer::from_f64(queue, c.dtype, &[b, c.s_q, c.n, 512], &nan_out).unwrap();
    let nan_lse = vec![f64::NAN; (b * c.n * c.s_q) as usize];
    let lse = Buffer::from_f64(queue, DType::F32, &[b, c.n, c.s_q], &nan_lse).unwrap();
    let cache = cache_buf.view().slice(2, 0, ROW_BYTES as i64).unwrap();
    let args = MlaDecodeAttentionArgs {
        out: out.view(),
        lse: Some(lse.view()),
        query: q.view(),
        cache,
        block_table: bt.view(),
        seq_lens: sl.view(),
        scale: 1.0 / 576f32.sqrt(),
    };
    let what = match opts {
        None => {
            vt_core::mla_decode_attention(queue, &args).unwrap();
            "reference".to_string()
        }
        Some(o) => match mla_decode_attention_with(queue, &args, o) {
            Ok(p) => format!("{} x{} parts {} min {}", p.kernel, p.row_blocks, p.parts, p.min_tiles),
            Err(e)
                if matches!(
                    o.kernel,
                    Kernel::MmaSmall | Kernel::WgmmaNarrow | Kernel::Wgmma | Kernel::WgmmaFp8Raw
                ) =>
            {
                println!("{o:?}: {e}");
                return None;
            }
            // The CTA pairs need sm_90a; on such a device they must run.
            Err(e) if o.kernel == Kernel::WgmmaFp8Pair && e.to_string().contains("no sm_90a") => {
                println!("{o:?}: {e}");
                return None;
            }
            Err(e) => panic!("{o:?}: {e}"),
        },
    };
    Some((queue.read_f64(&out.view()).unwrap(), queue.read_f64(&lse.view()).unwrap(), what))
}

/// The case on every fp8 kernel and the given schedules against the CPU reference; returns
/// the plans that ran (kernel name first).
fn check(g: &Queue, c: &Case, kernels: &[Kernel], schedules: &[(Option<u32>, Option<u32>)]) -> Vec<String> {
    let mut ran = Vec::new();
    let x = inputs(c);
    let cpu = Queue::new(Device::CPU).unwrap();
    let (want, want_lse, _) = run(&cpu, c, &x, None).unwrap();
    for &kernel in kernels {
        for &(min_tiles, max_parts) in schedules {
            let opts = DecodeOptions { kernel, min_tiles, max_parts };
            let Some((got, got_lse, what)) = run(g, c, &x, Some(&opts)) else { continue };
            assert!(got.iter().all(|v| v.is_finite()), "{what}: non-finite output for {c:?}");
            let e = rel_err(&got, &want);
            assert!(e < 1e-2, "{what}: out rel error {e:.3e} for {c:?}");
            for (i, (gl, w)) in got_lse.iter().zip(&want_lse).enumerate() {
                let ok = if w.is_finite() { (gl - w).abs() <= 3e-3 * (1.0 + w.abs()) } else { *gl == *w };
                assert!(ok, "{what}: lse[{i}] = {gl}, reference {w}, for {c:?}");
            }
            println!("{what}: out rel error {e:.2e} ({:?}, N {}, s_q {}, BS {})", c.dtype, c.n, c.s_q, c.bs);
            ran.push(what);
        }
    }
    ran
}

const MIXED: [i32; 8] = [1, 17, 64, 65, 300, 1000, 0, 130];
const ALL: [Kernel; 6] =
    [Kernel::Auto, Kernel::Mma, Kernel::MmaSmall, Kernel::WgmmaNarrow, Kernel::Wgmma, Kernel::Generic];
const SCHEDULES: [(Option<u32>, Option<u32>); 4] =
    [(None, None), (Some(1), Some(1)), (Some(1), Some(1000)), (Some(3), None)];

#[test]
fn fp8_decode_matches_reference_with_block_sizes_1_16_64() {
    let Some(g) = gpu() else { return };
    for bs in [1, 16, 64] {
        check(&g, &Case::new(&MIXED, 16, bs), &ALL, &SCHEDULES);
    }
}

#[test]
fn fp8_decode_matches_reference_for_head_counts_8_to_128_and_query_lengths_1_to_4() {
    let Some(g) = gpu() else { return };
    for (n, s_q) in [(8, 1), (16, 2), (24, 1), (32, 1), (64, 1), (128, 1), (16, 4), (128, 2)] {
        let mut c = Case::new(&[5, 200, 777, 64, 1], n, 64);
        c.s_q = s_q;
        check(&g, &c, &ALL, &SCHEDULES[..2]);
    }
}

#[test]
fn fp8_decode_matches_reference_for_long_sequences_f16_and_strided_rows() {
    let Some(g) = gpu() else { return };
    check(&g, &Case::new(&[32768, 1, 4000, 0, 129, 16384], 16, 64), &[Kernel::Auto], &SCHEDULES[..1]);
    let mut c = Case::new(&[100, 1500, 3], 32, 16);
    c.dtype = DType::F16;
    check(&g, &c, &ALL, &SCHEDULES[..2]);
    let mut c = Case::new(&[300, 64, 1], 16, 16);
    c.row_pad = 48;
    check(&g, &c, &ALL, &SCHEDULES[..2]);
}

/// Block ids outside the cache at the given (sequence, block) places (alternately -1 and
/// NB + 7) on every fp8 kernel, split over one and three parts: the reference is the batch
/// without those blocks (s_q = 1, so the keys' order does not matter).
fn check_skips_bad_blocks(g: &Queue, c: &Case, places: &[(usize, usize)]) {
    let x = inputs(c);
    let (mb, bs) = (x.mb as usize, c.bs as usize);
    let mut bad = inputs(c);
    for (k, &(i, j)) in places.iter().enumerate() {
        bad.block_table[i * mb + j] = if k % 2 == 0 { -1.0 } else { (bad.nb + 7) as f64 };
    }
    let (mut ref_c, mut ref_x) = (c.clone(), inputs(c));
    for (i, &len) in c.lens.iter().enumerate() {
        let len = len as usize;
        let kept: Vec<usize> = (0..len.div_ceil(bs)).filter(|&j| !places.contains(&(i, j))).collect();
        for (n, &j) in kept.iter().enumerate() {
            ref_x.block_table[i * mb + n] = x.block_table[i * mb + j];
        }
        // Only a sequence's last block may be partial, and it stays last.
        let tokens: usize = kept.iter().map(|&j| (len - j * bs).min(bs)).sum();
        ref_c.lens[i] = tokens as i32;
        ref_x.seq_lens[i] = tokens as f64;
    }
    let cpu = Queue::new(Device::CPU).unwrap();
    let (want, _, _) = run(&cpu, &ref_c, &ref_x, None).unwrap();
    for kernel in [
        Kernel::Mma,
        Kernel::MmaSmall,
        Kernel::WgmmaNarrow,
        Kernel::Wgmma,
        Kernel::WgmmaFp8Raw,
        Kernel::Generic,
    ] {
        for max_parts in [Some(1), Some(3)] {
            let opts = DecodeOptions { kernel, min_tiles: Some(1), max_parts };
            let Some((got, _, what)) = run(g, c, &bad, Some(&opts)) else { continue };
            let e = rel_err(&got, &want);
            assert!(e < 1e-2, "{what}: out rel error {e:.3e} with bad block ids at BS {bs}");
            println!("{what}: bad block ids at BS {bs}, out rel error {e:.2e}");
        }
    }
}

/// Block ids outside the cache are skipped on every fp8 kernel.
#[test]
fn fp8_decode_skips_out_of_range_block_ids() {
    let Some(g) = gpu() else { return };
    check_skips_bad_blocks(&g, &Case::new(&[128, 40], 16, 16), &[(0, 2), (0, 5)]);
}

/// The same at block size 64, where the narrow kernel loads a tile as one TMA box (a bad id
/// reads zeros; its tokens are masked).
#[test]
fn fp8_decode_skips_out_of_range_block_ids_with_block_size_64() {
    let Some(g) = gpu() else { return };
    check_skips_bad_blocks(&g, &Case::new(&[256, 100], 16, 64), &[(0, 1), (1, 1)]);
}

/// The 64-row wgmma kernel's fp8 form (a third warpgroup dequantizing into the 16-bit
/// stages) on its own: block sizes 1/16/64/128, 64 and 128 heads, one and two query tokens,
/// mixed lengths, split and unsplit schedules (the sanitizer runs over this test).
#[test]
fn fp8_decode_on_the_64_row_wgmma_kernel_matches_reference() {
    let Some(g) = gpu() else { return };
    for bs in [1, 16, 64, 128] {
        check(&g, &Case::new(&MIXED, 64, bs), &[Kernel::Wgmma], &SCHEDULES);
    }
    for (n, s_q) in [(128, 1), (64, 2), (16, 1)] {
        let mut c = Case::new(&[3, 700, 64, 129, 2000], n, 64);
        c.s_q = s_q;
        check(&g, &c, &[Kernel::Wgmma], &SCHEDULES[..2]);
    }
    let mut c = Case::new(&[100, 1500, 3], 64, 16);
    c.dtype = DType::F16;
    c.row_pad = 48;
    check(&g, &c, &[Kernel::Wgmma], &SCHEDULES[..2]);
}

/// The 64-row fp8 kernel as CTA pairs (clusters of two CTAs along the row blocks, each
/// gathering and dequantizing half of every tile into both CTAs' stages): block sizes
/// 1/16/64/128; 128 heads, 64 heads x 2 query tokens (one cluster: the same cache rows for
/// different query tokens) and 128 heads x 2 tokens (two clusters a part); mixed lengths with
/// empty and single-tile sequences and sequences cut over several parts, so that a cluster
/// runs segment after segment and the stages change hands at each; every schedule; f16
/// queries and padded cache rows. The sanitizers run over this test.
#[test]
fn fp8_decode_on_the_cta_pair_kernel_matches_reference() {
    let Some(g) = gpu() else { return };
    let mut ran = Vec::new();
    for bs in [1, 16, 64, 128] {
        ran.extend(check(&g, &Case::new(&MIXED, 128, bs), &[Kernel::WgmmaFp8Pair], &SCHEDULES));
    }
    for (n, s_q, bs) in [(64, 2, 1), (128, 2, 16), (128, 1, 1)] {
        let mut c = Case::new(&[3, 700, 64, 129, 2000, 0, 1, 4100], n, bs);
        c.s_q = s_q;
        ran.extend(check(&g, &c, &[Kernel::WgmmaFp8Pair], &SCHEDULES));
    }
    let mut c = Case::new(&[100, 1500, 3], 128, 16);
    c.dtype = DType::F16;
    c.row_pad = 48;
    ran.extend(check(&g, &c, &[Kernel::WgmmaFp8Pair], &SCHEDULES[..2]));
    // On sm_90 every case here is one the kernel takes: a refusal (a cluster launch or
    // occupancy error) must not pass as a skip.
    assert_every_case_ran_on_sm90(&g, &ran, 4 * SCHEDULES.len() + 3 * SCHEDULES.len() + 2, "CTA-pair kernel");
    assert!(ran.iter().all(|w| w.starts_with("wgmma_fp8x2 ")), "{ran:?}");
}

/// The raw-ring kernel (S as an e4m3 product on the codes as the TMA delivers them, a two-slot
/// ring of raw tiles, V^T built in registers from the codes by the two warpgroups that multiply
/// it) on its own: block sizes 64 and 128 (it reads a tile as one set of TMA boxes), 16 to 128
/// heads (rows past the heads are padding), one to four query tokens, mixed lengths
/// (single-tile sequences, empty ones, and sequences cut over several parts, so the ring runs
/// across segments), every schedule, padded rows. It takes bf16 queries only; its refusals are host-tested
/// (choice_tests.rs). The sanitizers run over this test.
#[test]
fn fp8_decode_on_the_raw_ring_kernel_matches_reference() {
    let Some(g) = gpu() else { return };
    let mut ran = Vec::new();
    for bs in [64, 128] {
        ran.extend(check(&g, &Case::new(&MIXED, 64, bs), &[Kernel::WgmmaFp8Raw], &SCHEDULES));
    }
    for (n, s_q) in [(128, 1), (16, 1), (64, 2), (32, 4)] {
        let mut c = Case::new(&[3, 700, 64, 129, 2000, 0, 1], n, 64);
        c.s_q = s_q;
        ran.extend(check(&g, &c, &[Kernel::WgmmaFp8Raw], &SCHEDULES));
    }
    let mut c = Case::new(&[300, 64, 1, 4100], 64, 64);
    c.row_pad = 48;
    ran.extend(check(&g, &c, &[Kernel::WgmmaFp8Raw], &SCHEDULES[..2]));
    // On sm_90 every case here is one the kernel takes: a launch or map-encoding error (which
    // `run` reports as a refusal) must not pass as a skip.
    assert_every_case_ran_on_sm90(&g, &ran, 2 * SCHEDULES.len() + 4 * SCHEDULES.len() + 2, "raw-ring kernel");
    assert!(ran.iter().all(|w| w.starts_with("wgmma_fp8r")), "{ran:?}");
}

/// The raw-ring kernel's gather form (forced `WgmmaFp8Raw` on block sizes the TMA does not take:
/// every row looked up and its code groups, rope and scales copied by cp.async from warpgroups
/// 1 and 2): block sizes 1 and 16 (tiles spanning 64 and 4 blocks), 16 to 128 heads, one to four
/// query tokens, mixed lengths, every schedule, padded rows. The sanitizers run over this test.
#[test]
fn fp8_decode_on_the_raw_ring_kernel_gather_form_matches_reference() {
    let Some(g) = gpu() else { return };
    let mut ran = Vec::new();
    for bs in [1, 16] {
        ran.extend(check(&g, &Case::new(&MIXED, 64, bs), &[Kernel::WgmmaFp8Raw], &SCHEDULES));
    }
    for (n, s_q, bs) in [(128, 1, 16), (16, 1, 1), (64, 2, 16), (32, 4, 1)] {
        let mut c = Case::new(&[3, 700, 64, 129, 2000, 0, 1], n, bs);
        c.s_q = s_q;
        ran.extend(check(&g, &c, &[Kernel::WgmmaFp8Raw], &SCHEDULES[..2]));
    }
    let mut c = Case::new(&[300, 64, 1, 4100], 64, 16);
    c.row_pad = 48;
    ran.extend(check(&g, &c, &[Kernel::WgmmaFp8Raw], &SCHEDULES[..2]));
    assert_every_case_ran_on_sm90(&g, &ran, 2 * SCHEDULES.len() + 5 * 2, "raw-ring kernel");
    assert!(ran.iter().all(|w| w.starts_with("wgmma_fp8r_cp ")), "{ran:?}");
}

/// The narrow wgmma kernel's fp8 form (a producer warp's bulk copies into a ring of raw
/// rows, the cache operand dequantized into registers) on its own: block sizes 1/16/64/128,
/// 8 to 32 query rows, one and two query tokens, mixed lengths (sequences of one tile and
/// sequences cut over several parts, so the ring runs across segments), split and unsplit
/// schedules, f16 with padded rows (the sanitizer runs over this test).
#[test]
fn fp8_decode_on_the_narrow_wgmma_kernel_matches_reference() {
    let Some(g) = gpu() else { return };
    let mut ran = Vec::new();
    for bs in [1, 16, 64, 128] {
        ran.extend(check(&g, &Case::new(&MIXED, 16, bs), &[Kernel::WgmmaNarrow], &SCHEDULES));
    }
    for (n, s_q) in [(8, 1), (32, 1), (16, 2), (8, 4)] {
        let mut c = Case::new(&[3, 700, 64, 129, 2000, 0, 1], n, 64);
        c.s_q = s_q;
        ran.extend(check(&g, &c, &[Kernel::WgmmaNarrow], &SCHEDULES));
    }
    let mut c = Case::new(&[100, 1500, 3], 32, 16);
    c.dtype = DType::F16;
    c.row_pad = 48;
    ran.extend(check(&g, &c, &[Kernel::WgmmaNarrow], &SCHEDULES[..2]));
    // Padded rows through the TMA form (BS 64: the map's row stride is 704 bytes).
    let mut c = Case::new(&[300, 64, 1], 16, 64);
    c.row_pad = 48;
    ran.extend(check(&g, &c, &[Kernel::WgmmaNarrow], &SCHEDULES[..2]));
    if ran.is_empty() {
        println!("SKIP: no sm_90a device, the narrow kernel does not run here");
    }
    assert!(ran.iter().all(|w| w.starts_with("wgmma_n16_fp8") || w.starts_with("wgmma_n32_fp8")), "{ran:?}");
}

/// The narrow kernel's S^T splits each query row into two e4m3 parts (`nf8_load_q` in
/// `kernels-cuda/mla_decode_attention/wgmma_narrow_fp8_sm90.cuh`): e puts the row's largest
/// latent value in [128, 256), hi = e4m3(q 2^e), lo = e4m3(q 2^e - hi), both round to
/// nearest even. This host check runs the same arithmetic (vt-core's e4m3 encoder, tested
/// against every code) and pins what the docs state: a bf16 value (8 significant bits) is
/// carried exactly when |q 2^e| >= 2^-2 (within 2^-9 of the row's largest), to 2^-10 absolute
/// below; an f16 value (11 bits) to 2^-8 relative + 2^-10 absolute. Rows span 2^-30..2^30.
/// It checks the arithmetic, not the kernel (the GPU test above does that).
#[test]
fn query_split_into_two_e4m3_parts_is_exact_for_bf16_and_within_2_pow_minus_8_for_f16() {
    use vt_core::{f32_to_f8e4m3, f8e4m3_to_f32};
    let mut rng = ChaCha8Rng::seed_from_u64(0x5917);
    let split = |x: f32| {
        let hi = f8e4m3_to_f32(f32_to_f8e4m3(x));
        hi + f8e4m3_to_f32(f32_to_f8e4m3(x - hi))
    };
    let mut f16_worst = 0.0f64;
    for row in 0..400 {
        let is_bf16 = row % 2 == 0;
        let round = |x: f32| {
            if is_bf16 {
                half::bf16::from_f32(x).to_f32()
            } else {
                half::f16::from_f32(x).to_f32()
            }
        };
        // Magnitudes and spreads vary widely; some rows hold tiny values beside large ones
        // (f16 rows stay inside f16's range).
        let base = if is_bf16 { 2f32.powi(rng.gen_range(-30..30)) } else { 2f32.powi(rng.gen_range(-4..12)) };
        let spread = if row % 4 < 2 { 20 } else { 6 };
        let q: Vec<f32> = (0..LATENT)
            .map(|_| round(rng.gen_range(-1.0f32..1.0) * base * 2f32.powi(-rng.gen_range(0..spread))))
            .collect();
        let amax = q.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let e = if amax == 0.0 { 0 } else { (7 - ((amax.to_bits() >> 23) as i32 - 127)).clamp(-120, 120) };
        let sc = 2f32.powi(e);
        assert!(
            amax == 0.0 || (128.0..256.0).contains(&(amax * sc)),
            "row {row}: amax x 2^e = {}",
            amax * sc
        );
        for &v in &q {
            let x = v * sc; // exact: a power of two
            let err = (x - split(x)).abs() as f64;
            if is_bf16 {
                let bound = if x.abs() >= 0.25 { 0.0 } else { 2f64.powi(-10) };
                assert!(err <= bound, "bf16 row {row}: x {x}, error {err:e} > {bound:e}");
            } else {
                let bound = 2f64.powi(-8) * (x.abs() as f64) + 2f64.powi(-10);
                assert!(err <= bound, "f16 row {row}: x {x}, error {err:e} > {bound:e}");
                if x.abs() >= 1.0 {
                    f16_worst = f16_worst.max(err / x.abs() as f64);
                }
            }
        }
    }
    assert!(f16_worst > 0.0, "f16 values must round somewhere, or the f16 check is vacuous");
    println!("largest relative error of hi + lo over f16 values >= 1 (x 2^e): {f16_worst:.3e}");
}
