//! The fp8 block-scaled ops on CUDA against the CPU reference on the same bytes, per kernel
//! (`vt_cuda::fp8_matmul::Kernel`): random e4m3 weights over the whole code range with
//! random per-block scales, NaN-poisoned outputs inside larger buffers (everything outside
//! must stay NaN), non-contiguous views (row-strided activations and outputs, a tensor-
//! parallel row slice of a weight with its scale rows), N and K not multiples of 128, and
//! M = 1, 7, 128 and 4096. QuantizeFp8 must match byte for byte. Each test prints a SKIP
//! line and passes when no CUDA device is present.

mod common;

use std::sync::OnceLock;

use common::Twin;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vt_core::fp8_block::blocks;
use vt_core::*;
use vt_cuda::fp8_matmul::{
    batched_matmul_fp8_with, matmul_bt_fp8_with, matmul_bt_fp8_with_options, Fp8Options, Kernel,
};

fn cuda() -> Option<(Queue, Queue)> {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    let probe = PROBE.get_or_init(|| {
        vt_cpu::register();
        vt_cuda::register()
    });
    match probe {
        Probe::Registered { .. } => {
            Some((Queue::new(Device::CPU).unwrap(), Queue::new(Device::new(DeviceType::Cuda, 0)).unwrap()))
        }
        other => {
            println!("SKIP: no CUDA device ({other})");
            None
        }
    }
}

fn sm(q: &Queue) -> u32 {
    q.downcast::<vt_cuda::CudaQueue>().map_or(0, |c| c.sm())
}

fn rng(test: &str) -> ChaCha8Rng {
    let seed = std::env::var("VT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(17u64);
    println!("{test}: seed {seed} (VT_SEED=N to change)");
    ChaCha8Rng::seed_from_u64(seed)
}

fn codes(rng: &mut ChaCha8Rng, n: i64) -> Vec<u8> {
    (0..n).map(|_| rng.gen_range(0u8..0x7f) | if rng.gen_bool(0.5) { 0x80 } else { 0 }).collect()
}

fn scale_bytes(rng: &mut ChaCha8Rng, n: i64) -> Vec<u8> {
    (0..n).flat_map(|_| 2f32.powf(rng.gen_range(-10.0..-4.0)).to_le_bytes()).collect()
}

fn floats(rng: &mut ChaCha8Rng, dt: DType, n: i64) -> Vec<u8> {
    let v: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    encode_f64(dt, &v)
}

/// Compares the whole output buffers: every element the op writes within `tol` (relative
/// Frobenius), no NaN there, and every other element still NaN on the GPU.
fn check(what: &str, c: &Queue, g: &Queue, out: &Twin, written: &Tensor<'_>, tol: f64) {
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
    let err = vt_check::rel_fro_error(&o, &w);
    println!("{what}: relative error {err:.3e} (tolerance {tol:.0e})");
    assert!(err <= tol, "{what}: relative error {err:.3e} > {tol:.0e}");
}

fn tol(dt: DType) -> f64 {
    vt_check::tolerance(OpId::MatmulBTFp8, dt).unwrap()
}

/// One MatmulBTFp8 problem: `a` rows `a_ld` wide (fp8 with transposed per-token scales when
/// `fp8_a`), `b` rows `row0..row0+N` of a weight `[row0 + N + 5, K]` (row0 a multiple of 128)
/// with the matching scale rows, `out` columns `3..3+N` of rows `N + 8` wide.
#[allow(clippy::too_many_arguments)]
fn matmul_case(kernel: Kernel, dt: DType, m: i64, n: i64, k: i64, a_ld: i64, row0: i64, fp8_a: bool) {
    matmul_case_split(kernel, None, dt, (m, n, k), a_ld, row0, fp8_a)
}

/// [`matmul_case`] with the K splits forced (`None`: the planner's choice).
fn matmul_case_split(
    kernel: Kernel,
    splits: Option<u32>,
    dt: DType,
    (m, n, k): (i64, i64, i64),
    a_ld: i64,
    row0: i64,
    fp8_a: bool,
) {
    let Some((c, g)) = cuda() else { return };
    if kernel == Kernel::Mma && sm(&g) < 89 {
        println!("SKIP: the Mma kernel needs sm_89+");
        return;
    }
    if kernel == Kernel::Wgmma && sm(&g) != 90 {
        println!("SKIP: the Wgmma kernel needs sm_90");
        return;
    }
    let what = format!(
        "MatmulBTFp8 {kernel:?} splits {splits:?} {dt} M {m} N {n} K {k} (a ld {a_ld}, b rows from {row0}, fp8 a {fp8_a})"
    );
    let mut r = rng(&what);
    let rows = row0 + n + 5;
    let (sr, sc) = (blocks(rows), blocks(k));
    let w = Twin::new(&c, &g, DType::F8E4M3, &codes(&mut r, rows * k));
    let ws = Twin::new(&c, &g, DType::F32, &scale_bytes(&mut r, sr * sc));
    let (a_t, as_t) = if fp8_a {
        let g_k = blocks(k);
        (
            Twin::new(&c, &g, DType::F8E4M3, &codes(&mut r, m * a_ld)),
            Some(Twin::new(&c, &g, DType::F32, &scale_bytes(&mut r, m * g_k))),
        )
    } else {
        (Twin::new(&c, &g, dt, &floats(&mut r, dt, m * a_ld)), None)
    };
    let o_ld = n + 8;
    let out = Twin::nan(&c, &g, dt, m * o_ld + 3);
    let (bc, bg) = w.views(row0 * k, &[n, k], &[k, 1]);
    let (sc_c, sc_g) = ws.views((row0 / 128) * sc, &[blocks(n), sc], &[sc, 1]);
    let (ac, ag) = a_t.views(0, &[m, k], &[a_ld, 1]);
    let ascale = as_t.as_ref().map(|s| s.views(0, &[m, blocks(k)], &[1, m]));
    let (oc, og) = out.views(3, &[m, n], &[o_ld, 1]);
    let args_c = MatmulBTFp8Args { out: oc, a: ac, a_scale: ascale.map(|s| s.0), b: bc, b_scale: sc_c };
    let args_g = MatmulBTFp8Args { out: og, a: ag, a_scale: ascale.map(|s| s.1), b: bg, b_scale: sc_g };
    matmul_bt_fp8(&c, &args_c).unwrap();
    let ran = matmul_bt_fp8_with_options(&g, &args_g, &Fp8Options { kernel, splits }).unwrap();
    if kernel != Kernel::Auto {
        assert_eq!(ran, kernel);
    }
    g.synchronize().unwrap();
    check(&what, &c, &g, &out, &oc, tol(dt));
}

/// K split over CTAs (f32 partials added by the combine kernel), forced: more splits than
/// 128-groups / K tiles, one split, uneven ones; the planner's choice at decode shapes.
#[test]
fn split_k_partials_add_up() {
    for splits in [1, 2, 3, 7, 64] {
        matmul_case_split(Kernel::Gemv, Some(splits), DType::BF16, (7, 264, 1024), 1024, 0, false);
        matmul_case_split(Kernel::Gemv, Some(splits), DType::F16, (33, 136, 400), 400, 128, false);
        matmul_case_split(Kernel::Wgmma, Some(splits), DType::BF16, (130, 256, 1024), 1024, 0, true);
        matmul_case_split(Kernel::Wgmma, Some(splits), DType::F32, (7, 200, 2048), 2064, 128, true);
    }
    for m in [1, 4, 8, 32] {
        matmul_case_split(Kernel::Auto, None, DType::BF16, (m, 2112, 7168), 7168, 0, false);
        matmul_case_split(Kernel::Auto, None, DType::BF16, (m, 512, 2048), 2048, 0, true);
    }
}

#[test]
fn gemv_decode_rows() {
    for dt in [DType::BF16, DType::F16] {
        matmul_case(Kernel::Gemv, dt, 1, 576, 512, 512, 0, false);
        matmul_case(Kernel::Gemv, dt, 7, 200, 400, 416, 128, false);
        matmul_case(Kernel::Gemv, dt, 16, 136, 272, 272, 0, false);
    }
}

#[test]
fn gemv_many_tokens_and_long_k() {
    matmul_case(Kernel::Gemv, DType::BF16, 128, 264, 1536, 1552, 256, false);
    matmul_case(Kernel::Gemv, DType::BF16, 33, 2112, 7168, 7168, 0, false);
    matmul_case(Kernel::Gemv, DType::F16, 4096, 136, 400, 400, 0, false);
}

#[test]
fn mma_both_fp8() {
    for dt in [DType::BF16, DType::F16, DType::F32] {
        matmul_case(Kernel::Mma, dt, 7, 200, 400, 400, 0, true);
        matmul_case(Kernel::Mma, dt, 128, 256, 512, 528, 128, true);
    }
    matmul_case(Kernel::Mma, DType::BF16, 4096, 136, 400, 400, 0, true);
    matmul_case(Kernel::Mma, DType::BF16, 130, 2112, 1024, 1024, 0, true);
}

#[test]
fn wgmma_both_fp8() {
    for dt in [DType::BF16, DType::F16, DType::F32] {
        matmul_case(Kernel::Wgmma, dt, 7, 200, 400, 400, 0, true);
        matmul_case(Kernel::Wgmma, dt, 128, 256, 512, 528, 128, true);
    }
    // More K tiles than stages (the ring wraps), partial M / N / K tiles.
    matmul_case(Kernel::Wgmma, DType::BF16, 4096, 136, 400, 400, 0, true);
    matmul_case(Kernel::Wgmma, DType::BF16, 130, 2112, 1024, 1024, 0, true);
    matmul_case(Kernel::Wgmma, DType::BF16, 512, 384, 2048, 2064, 128, true);
}

#[test]
fn generic_and_auto() {
    for dt in [DType::BF16, DType::F32] {
        matmul_case(Kernel::Generic, dt, 7, 70, 200, 203, 0, false);
        matmul_case(Kernel::Generic, dt, 5, 70, 200, 200, 128, true);
    }
    // Auto: f32 activations and K % 16 != 0 go to Generic, the rest to Gemv / Mma.
    matmul_case(Kernel::Auto, DType::F32, 3, 130, 256, 256, 0, false);
    matmul_case(Kernel::Auto, DType::BF16, 3, 130, 200, 200, 0, false);
    matmul_case(Kernel::Auto, DType::BF16, 1, 576, 512, 512, 0, false);
    matmul_case(Kernel::Auto, DType::BF16, 300, 256, 512, 512, 0, true);
}

#[test]
fn forced_kernels_refuse_views_they_cannot_take() {
    let Some((_c, g)) = cuda() else { return };
    let f8 = DType::F8E4M3;
    let (out, a, b, s) = (
        Buffer::nan(&g, DType::F32, &[2, 128]).unwrap(),
        Buffer::zeros(&g, DType::F32, &[2, 128]).unwrap(),
        Buffer::zeros(&g, f8, &[128, 128]).unwrap(),
        Buffer::zeros(&g, DType::F32, &[1, 1]).unwrap(),
    );
    let x = MatmulBTFp8Args { out: out.view(), a: a.view(), a_scale: None, b: b.view(), b_scale: s.view() };
    matmul_bt_fp8(&g, &x).unwrap();
    let e = matmul_bt_fp8_with(&g, &x, Kernel::Gemv).unwrap_err().to_string();
    assert!(e.contains("Gemv"), "{e}");
    let e = matmul_bt_fp8_with(&g, &x, Kernel::Mma).unwrap_err().to_string();
    assert!(e.contains("Mma"), "{e}");
}

/// A view's offset, shape and strides.
type Placed = (i64, [i64; 3], [i64; 3]);

/// BatchedMatmulFp8 on the absorbed decode weights: W_UV (`[G, L, V]`, rows 128..256 of
/// each head of an fp8 kv_b_proj read transposed, its odd scale rows) and W_UK_T in the
/// K-contiguous block layout (`[G, L, P]` storage read as `[G, P, L]`).
fn bmm_case(kernel: Kernel, dt: DType, heads: i64, m: i64, which: &str) {
    let Some((c, g)) = cuda() else { return };
    let what = format!("BatchedMatmulFp8 {kernel:?} {dt} {which} heads {heads} M {m}");
    let mut r = rng(&what);
    let l = 512;
    let (w, ws, k, n, b_view, s_view): (Twin, Twin, i64, i64, Placed, Placed) = if which == "w_uv" {
        let w = Twin::new(&c, &g, DType::F8E4M3, &codes(&mut r, heads * 256 * l));
        let ws = Twin::new(&c, &g, DType::F32, &scale_bytes(&mut r, 2 * heads * 4));
        (w, ws, l, 128, (128 * l, [heads, l, 128], [256 * l, 1, l]), (4, [heads, 4, 1], [8, 1, 1]))
    } else {
        let w = Twin::new(&c, &g, DType::F8E4M3, &codes(&mut r, heads * l * 128));
        let ws = Twin::new(&c, &g, DType::F32, &scale_bytes(&mut r, heads * 4));
        (w, ws, 128, l, (0, [heads, 128, l], [l * 128, 1, 128]), (0, [heads, 1, 4], [4, 4, 1]))
    };
    // a [G, M, K] as a view of [M, G, K]; out [G, M, N] as a view of [M, G, N].
    let a = Twin::new(&c, &g, dt, &floats(&mut r, dt, m * heads * k));
    let out = Twin::nan(&c, &g, dt, m * heads * n);
    let (bc, bg) = w.views(b_view.0, &b_view.1, &b_view.2);
    let (sc, sg) = ws.views(s_view.0, &s_view.1, &s_view.2);
    let (ac, ag) = a.views(0, &[heads, m, k], &[k, heads * k, 1]);
    let (oc, og) = out.views(0, &[heads, m, n], &[n, heads * n, 1]);
    let xc = BatchedMatmulFp8Args { out: oc, a: ac, a_scale: None, b: bc, b_scale: sc };
    let xg = BatchedMatmulFp8Args { out: og, a: ag, a_scale: None, b: bg, b_scale: sg };
    batched_matmul_fp8(&c, &xc).unwrap();
    let ran = batched_matmul_fp8_with(&g, &xg, kernel).unwrap();
    if kernel != Kernel::Auto {
        assert_eq!(ran, kernel);
    }
    g.synchronize().unwrap();
    check(&what, &c, &g, &out, &oc, tol(dt));
}

#[test]
fn absorbed_bmm() {
    for dt in [DType::BF16, DType::F16] {
        for m in [1, 7, 128] {
            bmm_case(Kernel::Gemv, dt, 16, m, "w_uv");
            bmm_case(Kernel::Gemv, dt, 16, m, "w_uk");
        }
    }
    bmm_case(Kernel::Generic, DType::BF16, 4, 3, "w_uv");
    bmm_case(Kernel::Auto, DType::F32, 4, 3, "w_uk");
}

#[test]
fn quantize_matches_the_cpu_byte_for_byte() {
    let Some((c, g)) = cuda() else { return };
    for dt in [DType::BF16, DType::F16, DType::F32] {
        for (m, k, ld) in [(1i64, 7168i64, 7168i64), (7, 200, 210), (4096, 512, 512), (3, 384, 384)] {
            let what = format!("QuantizeFp8 {dt} M {m} K {k}");
            let mut r = rng(&what);
            // Per-group magnitudes 2^-8..2^8, one zero group in row 0 when there are two.
            let mut v: Vec<f64> =
                (0..m * ld).map(|i| r.gen_range(-1.0..1.0) * 2f64.powi((i % 17) as i32 - 8)).collect();
            if k > 128 {
                v[128..256.min(k as usize)].iter_mut().for_each(|x| *x = 0.0);
            }
            let x = Twin::new(&c, &g, dt, &encode_f64(dt, &v));
            let out = Twin::nan(&c, &g, DType::F8E4M3, m * ld);
            let sc = Twin::nan(&c, &g, DType::F32, m * blocks(k));
            let (xc, xg) = x.views(0, &[m, k], &[ld, 1]);
            let (oc, og) = out.views(0, &[m, k], &[ld, 1]);
            let (sc_c, sc_g) = sc.views(0, &[m, blocks(k)], &[1, m]);
            quantize_fp8(&c, &QuantizeFp8Args { out: oc, scale: sc_c, x: xc }).unwrap();
            quantize_fp8(&g, &QuantizeFp8Args { out: og, scale: sc_g, x: xg }).unwrap();
            let (ob_c, ob_g) = (out.cpu.to_bytes(&c).unwrap(), out.gpu.to_bytes(&g).unwrap());
            let (sb_c, sb_g) = (sc.cpu.to_bytes(&c).unwrap(), sc.gpu.to_bytes(&g).unwrap());
            let bad = ob_c.iter().zip(&ob_g).position(|(a, b)| a != b);
            assert!(
                bad.is_none(),
                "{what}: code {bad:?} differs: cpu {:?} gpu {:?}",
                bad.map(|i| ob_c[i]),
                bad.map(|i| ob_g[i])
            );
            assert_eq!(sb_c, sb_g, "{what}: scales differ");
            println!("{what}: byte-exact");
        }
    }
}
