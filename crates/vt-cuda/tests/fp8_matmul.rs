//! The fp8 block-scaled ops on CUDA against the CPU reference on the same bytes, per kernel
//! (`vt_cuda::fp8_matmul::Kernel`): random e4m3 weights over the whole code range with
//! random per-block scales, NaN-poisoned outputs inside larger buffers (everything outside
//! must stay NaN), non-contiguous views (row-strided activations and outputs, a tensor-
//! parallel row slice of a weight with its scale rows), N and K not multiples of 128, and
//! M = 1, 7, 128 and 4096; cuBLASLt (`Kernel::Lt`) in its own layouts, its refusals, Auto
//! with `VT_FP8_LT` at its default (on), on and off, a graph replay, and `VT_LT_TUNE`'s
//! measured choice (tuned once per shape, never inside a capture). QuantizeFp8 must
//! match byte for byte. Each test prints a SKIP line and passes when no CUDA device is present.

mod common;

use std::sync::OnceLock;

use common::{named_rng as rng, Twin};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use vt_core::fp8_block::blocks;
use vt_core::*;
use vt_cuda::fp8_matmul::{
    batched_matmul_fp8_with, matmul_bt_fp8_with, matmul_bt_fp8_with_options, quantize_fp8_with, Fp8Options,
    Kernel, QuantKernel,
};

/// The CUDA graph test captures on its queue while no other test of this file runs: another
/// thread's allocation or free (an implicit device synchronization) during the capture would
/// invalidate it (the H200 call of 21:16 saw `lt_replays_in_a_cuda_graph` fail that way with
/// every test in parallel, after passing in the call before). Every other test holds the
/// shared side.
fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    GPU_TESTS.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    GPU_TESTS.write().unwrap_or_else(|e| e.into_inner())
}

static GPU_TESTS: std::sync::RwLock<()> = std::sync::RwLock::new(());

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
/// Frobenius, vt-check's NaN- and infinity-aware measure), no NaN there, and every other
/// element still NaN on the GPU.
fn check(what: &str, c: &Queue, g: &Queue, out: &Twin, written: &Tensor<'_>, tol: f64) {
    common::check_written(what, c, g, out, written, tol, vt_check::rel_fro_error)
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
    let _gpu = shared();
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
    let _gpu = shared();
    for dt in [DType::BF16, DType::F16] {
        matmul_case(Kernel::Gemv, dt, 1, 576, 512, 512, 0, false);
        matmul_case(Kernel::Gemv, dt, 7, 200, 400, 416, 128, false);
        matmul_case(Kernel::Gemv, dt, 16, 136, 272, 272, 0, false);
    }
}

#[test]
fn gemv_many_tokens_and_long_k() {
    let _gpu = shared();
    matmul_case(Kernel::Gemv, DType::BF16, 128, 264, 1536, 1552, 256, false);
    matmul_case(Kernel::Gemv, DType::BF16, 33, 2112, 7168, 7168, 0, false);
    matmul_case(Kernel::Gemv, DType::F16, 4096, 136, 400, 400, 0, false);
}

#[test]
fn mma_both_fp8() {
    let _gpu = shared();
    for dt in [DType::BF16, DType::F16, DType::F32] {
        matmul_case(Kernel::Mma, dt, 7, 200, 400, 400, 0, true);
        matmul_case(Kernel::Mma, dt, 128, 256, 512, 528, 128, true);
    }
    matmul_case(Kernel::Mma, DType::BF16, 4096, 136, 400, 400, 0, true);
    matmul_case(Kernel::Mma, DType::BF16, 130, 2112, 1024, 1024, 0, true);
}

#[test]
fn wgmma_both_fp8() {
    let _gpu = shared();
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
    let _gpu = shared();
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
    let _gpu = shared();
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
    let _gpu = shared();
    for dt in [DType::BF16, DType::F16] {
        for m in [1, 7, 128] {
            bmm_case(Kernel::Gemv, dt, 16, m, "w_uv");
            bmm_case(Kernel::Gemv, dt, 16, m, "w_uk");
        }
    }
    bmm_case(Kernel::Generic, DType::BF16, 4, 3, "w_uv");
    bmm_case(Kernel::Auto, DType::F32, 4, 3, "w_uk");
}

/// Both QuantizeFp8 kernels (`QuantKernel::Warp`, and `Wide`: `VT_QUANT_WIDE`) write the CPU's
/// codes and scales byte for byte.
#[test]
fn quantize_matches_the_cpu_byte_for_byte() {
    let _gpu = shared();
    let Some((c, g)) = cuda() else { return };
    for (dt, kernel) in [DType::BF16, DType::F16, DType::F32]
        .into_iter()
        .flat_map(|dt| [(dt, QuantKernel::Warp), (dt, QuantKernel::Wide)])
    {
        // K from 1 to 56 groups (1, 2-3, 4-7, 8-15 and 16+ groups a row take the kernels' CTA
        // shapes; K 100 and 2100 end inside a lane's eight, in group 0 and group 16; rows 210
        // and 2107 apart are not 16-byte aligned: the element-by-element path; 17 groups leave
        // most of the wide kernel's second CTA idle); bf16: 65543 rows of 8 groups and 9000 of
        // 17, past the wide grid's cap of 32 blocks an SM in y, so its row loop runs.
        let mut shapes = vec![
            (1i64, 7168i64, 7168i64),
            (7, 200, 210),
            (4096, 512, 512),
            (3, 384, 384),
            (5, 100, 101),
            (37, 2100, 2107),
        ];
        if dt == DType::BF16 {
            shapes.push((65543, 1024, 1024));
            shapes.push((9000, 2100, 2100));
        }
        for (m, k, ld) in shapes {
            let what = format!("QuantizeFp8 {dt} M {m} K {k} ({kernel:?})");
            let mut r = rng(&what);
            // Per-group magnitudes 2^-8..2^8, one zero group in row 0 when there are two.
            let mut v: Vec<f64> =
                (0..m * ld).map(|i| r.gen_range(-1.0..1.0) * 2f64.powi((i % 17) as i32 - 8)).collect();
            if k > 128 {
                v[128..256.min(k as usize)].iter_mut().for_each(|x| *x = 0.0);
            }
            // Row 0's third group: NaNs of both signs (0x7f, the max skips them) and, past 300,
            // infinities (the scale becomes inf: the group's finite values quantize to signed
            // zeros, inf / inf to NaN).
            if k > 384 {
                v[256] = f64::NAN;
                v[257] = -f64::NAN;
                v[300] = f64::INFINITY;
                v[301] = f64::NEG_INFINITY;
            }
            let x = Twin::new(&c, &g, dt, &encode_f64(dt, &v));
            let out = Twin::nan(&c, &g, DType::F8E4M3, m * ld);
            let sc = Twin::nan(&c, &g, DType::F32, m * blocks(k));
            let (xc, xg) = x.views(0, &[m, k], &[ld, 1]);
            let (oc, og) = out.views(0, &[m, k], &[ld, 1]);
            let (sc_c, sc_g) = sc.views(0, &[m, blocks(k)], &[1, m]);
            quantize_fp8(&c, &QuantizeFp8Args { out: oc, scale: sc_c, x: xc }).unwrap();
            quantize_fp8_with(&g, &QuantizeFp8Args { out: og, scale: sc_g, x: xg }, kernel).unwrap();
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

/// One MatmulBTFp8 problem in the layouts [`Kernel::Lt`] takes (cuBLASLt's block-scaled fp8
/// GEMM): `a` rows `a_ld` apart with its per-token scales stored transposed (`[KB, M]`),
/// `b` rows `row0..row0+N` of a weight `[row0 + N + 5, K]` (row0 a multiple of 128) with
/// the matching scale rows, the scale rows `round_up(KB, 4)` apart, `out` columns from 16
/// bytes in of rows `N + 16` wide (NaN everywhere else). `kernel` Lt or Auto (with
/// `VT_FP8_LT` as the caller set it); returns the kernel that ran.
fn lt_case(kernel: Kernel, dt: DType, (m, n, k): (i64, i64, i64), a_ld: i64, row0: i64) -> Option<Kernel> {
    let (c, g) = cuda()?;
    let what = format!(
        "MatmulBTFp8 {kernel:?} (Lt layouts) {dt} M {m} N {n} K {k} (a ld {a_ld}, b rows from {row0})"
    );
    let mut r = rng(&what);
    let rows = row0 + n + 5;
    let (kb, nb) = (blocks(k), blocks(n));
    let ld_s = (kb + 3) / 4 * 4;
    let w = Twin::new(&c, &g, DType::F8E4M3, &codes(&mut r, rows * k));
    let ws = Twin::new(&c, &g, DType::F32, &scale_bytes(&mut r, blocks(rows) * ld_s));
    let a = Twin::new(&c, &g, DType::F8E4M3, &codes(&mut r, m * a_ld));
    let a_s = Twin::new(&c, &g, DType::F32, &scale_bytes(&mut r, m * kb));
    let (o_off, o_ld) = (16 / dt.size_of() as i64, n + 16);
    let out = Twin::nan(&c, &g, dt, o_off + m * o_ld);
    let (bc, bg) = w.views(row0 * k, &[n, k], &[k, 1]);
    let (sc_c, sc_g) = ws.views((row0 / 128) * ld_s, &[nb, kb], &[ld_s, 1]);
    let (ac, ag) = a.views(0, &[m, k], &[a_ld, 1]);
    let (asc_c, asc_g) = a_s.views(0, &[m, kb], &[1, m]);
    let (oc, og) = out.views(o_off, &[m, n], &[o_ld, 1]);
    let args_c = MatmulBTFp8Args { out: oc, a: ac, a_scale: Some(asc_c), b: bc, b_scale: sc_c };
    let args_g = MatmulBTFp8Args { out: og, a: ag, a_scale: Some(asc_g), b: bg, b_scale: sc_g };
    matmul_bt_fp8(&c, &args_c).unwrap();
    matmul_bt_fp8(&g, &args_g).unwrap();
    // Poison again: the registered op (Auto) ran above; the kernel under test must write it all.
    g.write_bytes(&out.gpu.view(), &encode_f64(dt, &vec![f64::NAN; (o_off + m * o_ld) as usize])).unwrap();
    let ran = match matmul_bt_fp8_with(&g, &args_g, kernel) {
        Ok(k) => k,
        Err(e) => panic!("{what}: {e}"),
    };
    g.synchronize().unwrap();
    check(&format!("{what} ran {ran:?}"), &c, &g, &out, &oc, tol(dt));
    Some(ran)
}

fn lt_skip(g: &Queue) -> bool {
    if sm(g) != 90 {
        println!("SKIP: the Lt kernel (cuBLASLt block-scaled fp8) needs sm_90");
        return true;
    }
    false
}

/// cuBLASLt's block-scaled fp8 GEMM against the CPU reference: M 4 to 4096, the
/// DeepSeek-V3 projections' K (a_proj 2112 x 7168, q_b's K 1536), N and K not multiples of
/// 128 (K 400: 4 groups, the last 16 wide; K 1040: 9 groups, scale rows padded to 12),
/// weight row slices from row 128, activation rows wider than K. (The bench checks rows
/// of the full-size layer shapes.)
#[test]
fn lt_matches_the_cpu() {
    let _gpu = shared();
    let Some((_c, g)) = cuda() else { return };
    if lt_skip(&g) {
        return;
    }
    // Every shape runs (a failure is reported, then the next one runs) so that one GPU call
    // tells which rule, if any, is off. M is a multiple of 4 (cuBLASLt has no algorithm
    // for M 1, 7 or 130: the H200 call of 20:52, main at e0d3491).
    let mut failed = Vec::new();
    for (m, n, k, a_ld, row0) in [
        (4, 272, 1024, 1024, 0),
        (8, 128, 1024, 1024, 0),
        (4, 2112, 7168, 7168, 0),
        (8, 272, 400, 416, 128),
        (128, 1536, 1536, 1536, 0),
        (132, 144, 1040, 1040, 0),
        (4096, 272, 400, 400, 0),
        (64, 2112, 7168, 7168, 0),
        (300, 1024, 2048, 2064, 128),
    ] {
        let r = std::panic::catch_unwind(|| lt_case(Kernel::Lt, DType::BF16, (m, n, k), a_ld, row0));
        if !matches!(r, Ok(Some(Kernel::Lt))) {
            failed.push(format!("M {m} N {n} K {k} (a ld {a_ld}, b rows from {row0}): {r:?}"));
        }
    }
    assert!(failed.is_empty(), "Lt failed at {} shapes:\n{}", failed.len(), failed.join("\n"));
}

/// f16 and f32 outputs (cuBLASLt may have no algorithm for them: then the forced call must
/// fail with an error naming the op, never write garbage). Both run; failures are listed.
#[test]
fn lt_other_outputs() {
    let _gpu = shared();
    let Some((_c, g)) = cuda() else { return };
    if lt_skip(&g) {
        return;
    }
    let mut failed = Vec::new();
    for dt in [DType::F16, DType::F32] {
        let r = std::panic::catch_unwind(|| lt_case(Kernel::Lt, dt, (132, 272, 1024), 1024, 0));
        if !matches!(r, Ok(Some(Kernel::Lt))) {
            failed.push(format!("{dt}"));
        }
    }
    assert!(failed.is_empty(), "Lt failed for {} outputs", failed.join(", "));
}

/// Auto takes Lt where the layouts fit unless `VT_FP8_LT` is off (on by default); off, or
/// outside Lt's rules, it runs another kernel on the same views.
#[test]
fn auto_takes_lt_unless_the_flag_is_off() {
    let _gpu = shared();
    let Some((_c, g)) = cuda() else { return };
    if lt_skip(&g) {
        return;
    }
    use vt_core::flags::{parse_bool, set_override, Flag};
    // No override: the environment's value, else the default (on).
    set_override(Flag::Fp8Lt, None);
    let env = std::env::var("VT_FP8_LT").ok().and_then(|v| parse_bool(&v));
    let default = lt_case(Kernel::Auto, DType::BF16, (256, 512, 1024), 1024, 0);
    set_override(Flag::Fp8Lt, Some(false));
    let off = lt_case(Kernel::Auto, DType::BF16, (256, 512, 1024), 1024, 0);
    set_override(Flag::Fp8Lt, Some(true));
    let on = lt_case(Kernel::Auto, DType::BF16, (256, 512, 1024), 1024, 0);
    // The block's prefill layout (scales [KB, M]) at M 130, not a multiple of 4: Auto runs
    // Wgmma on the same views (no copy) and matches; at M 132 it takes Lt.
    let odd = lt_case(Kernel::Auto, DType::BF16, (130, 512, 1024), 1024, 0);
    let even = lt_case(Kernel::Auto, DType::BF16, (132, 512, 1024), 1024, 0);
    // Out of Lt's rules (N 200, the output 6 bytes off alignment): Auto runs another kernel
    // with the flag on, and matches.
    matmul_case(Kernel::Auto, DType::BF16, 7, 200, 400, 400, 0, true);
    set_override(Flag::Fp8Lt, None);
    let expect = if env.unwrap_or(true) { Kernel::Lt } else { Kernel::Wgmma };
    assert_eq!(default, Some(expect), "VT_FP8_LT from the environment: {env:?}");
    assert_eq!(off, Some(Kernel::Wgmma));
    assert_eq!(on, Some(Kernel::Lt));
    assert_eq!((odd, even), (Some(Kernel::Wgmma), Some(Kernel::Lt)));
}

/// A forced Lt on views outside its rules is an error naming the op and the argument, and
/// writes nothing.
#[test]
fn forced_lt_refuses_views_outside_its_rules() {
    let _gpu = shared();
    let Some((_c, g)) = cuda() else { return };
    let f8 = DType::F8E4M3;
    let (m, n, k) = (32i64, 256i64, 512i64);
    let out = Buffer::nan(&g, DType::BF16, &[m, n + 16]).unwrap();
    let a = Buffer::zeros(&g, f8, &[m, k]).unwrap();
    let b = Buffer::zeros(&g, f8, &[n, k]).unwrap();
    let bs = Buffer::zeros(&g, DType::F32, &[2, 4]).unwrap();
    let asc = Buffer::zeros(&g, DType::F32, &[4, m]).unwrap();
    let o = out.view().as_strided(0, &[m, n], &[n + 16, 1]).unwrap();
    let a_t = asc.view().as_strided(0, &[m, 4], &[1, m]).unwrap();
    let good = MatmulBTFp8Args { out: o, a: a.view(), a_scale: Some(a_t), b: b.view(), b_scale: bs.view() };
    let expect = |x: &MatmulBTFp8Args<'_>, arg: &str| {
        matmul_bt_fp8(&g, x).unwrap();
        let e = matmul_bt_fp8_with(&g, x, Kernel::Lt).unwrap_err().to_string();
        println!("forced Lt: {e}");
        assert!(e.contains("MatmulBTFp8") && e.contains("Lt"), "{e}");
        if sm(&g) == 90 {
            assert!(e.contains(&format!("`{arg}`")), "expected argument {arg}: {e}");
        }
    };
    // a_scale row-major [M, KB] (the layout the Wgmma kernel reads; not cuBLASLt's).
    let asr = Buffer::zeros(&g, DType::F32, &[m, 4]).unwrap();
    expect(&MatmulBTFp8Args { a_scale: Some(asr.view()), ..good }, "a_scale");
    // N not a multiple of 16.
    let o200 = out.view().as_strided(0, &[m, 200], &[n + 16, 1]).unwrap();
    let b200 = b.view().slice(0, 0, 200).unwrap();
    expect(&MatmulBTFp8Args { out: o200, b: b200, ..good }, "b");
    // M not a multiple of 4 (cuBLASLt has no algorithm): M 7.
    let o7 = out.view().as_strided(0, &[7, n], &[n + 16, 1]).unwrap();
    let a7 = a.view().slice(0, 0, 7).unwrap();
    let as7 = asc.view().as_strided(0, &[7, 4], &[1, 7]).unwrap();
    expect(&MatmulBTFp8Args { out: o7, a: a7, a_scale: Some(as7), ..good }, "a");
    // Weight-only (no a_scale).
    let a16 = Buffer::zeros(&g, DType::BF16, &[m, k]).unwrap();
    expect(&MatmulBTFp8Args { a: a16.view(), a_scale: None, ..good }, "a_scale");
    // Scale rows not round_up(KB, 4) apart: K 640 (5 groups) with rows 5 apart.
    let a640 = Buffer::zeros(&g, f8, &[m, 640]).unwrap();
    let b640 = Buffer::zeros(&g, f8, &[n, 640]).unwrap();
    let bs5 = Buffer::zeros(&g, DType::F32, &[2, 5]).unwrap();
    let as5 = Buffer::zeros(&g, DType::F32, &[5, m]).unwrap();
    let x = MatmulBTFp8Args {
        out: o,
        a: a640.view(),
        a_scale: Some(as5.view().as_strided(0, &[m, 5], &[1, m]).unwrap()),
        b: b640.view(),
        b_scale: bs5.view(),
    };
    expect(&x, "b_scale");
    // The output 6 bytes off 16-byte alignment.
    let o3 = out.view().as_strided(3, &[m, n], &[n + 16, 1]).unwrap();
    expect(&MatmulBTFp8Args { out: o3, ..good }, "out");
    // Nothing was written by the refused calls (the registered op wrote `out` each time
    // above; rows past N stay NaN).
    let v = out.to_f64(&g).unwrap();
    let w = (n + 16) as usize;
    assert!((0..m as usize).all(|r| v[r * w + n as usize + 10].is_nan()));
    // BatchedMatmulFp8 is not routed to cuBLASLt.
    let o3d = Buffer::nan(&g, DType::BF16, &[1, m, n]).unwrap();
    let b3 = b.view().as_strided(0, &[1, k, n], &[n * k, 1, k]).unwrap();
    let bs3 = bs.view().as_strided(0, &[1, 4, 2], &[8, 1, 4]).unwrap();
    let as3 = asc.view().as_strided(0, &[1, m, 4], &[4 * m, 1, m]).unwrap();
    let a3 = a.view().as_strided(0, &[1, m, k], &[m * k, k, 1]).unwrap();
    let xb = BatchedMatmulFp8Args { out: o3d.view(), a: a3, a_scale: Some(as3), b: b3, b_scale: bs3 };
    batched_matmul_fp8(&g, &xb).unwrap();
    let e = batched_matmul_fp8_with(&g, &xb, Kernel::Lt).unwrap_err().to_string();
    assert!(e.contains("BatchedMatmulFp8") && e.contains("Lt"), "{e}");
}

/// An Lt problem's buffers on one queue: `a` `[M, K]`, `b` `[N, K]`, `out` `[M, N]`
/// contiguous, `b_scale` `[ceil(N/128), ceil(K/128)]` (K a multiple of 512, so its rows are
/// already `round_up(KB, 4)` apart), `a_scale` stored `[KB, M]`.
struct LtProblem {
    m: i64,
    kb: i64,
    a: Buffer,
    b: Buffer,
    bs: Buffer,
    asc: Buffer,
    out: Buffer,
}

impl LtProblem {
    fn new(g: &Queue, r: &mut ChaCha8Rng, (m, n, k): (i64, i64, i64)) -> LtProblem {
        assert_eq!(k % 512, 0, "b_scale rows must be round_up(KB, 4) apart");
        let f8 = DType::F8E4M3;
        let (kb, nb) = (blocks(k), blocks(n));
        LtProblem {
            m,
            kb,
            a: Buffer::from_bytes(g, f8, &[m, k], &codes(r, m * k)).unwrap(),
            b: Buffer::from_bytes(g, f8, &[n, k], &codes(r, n * k)).unwrap(),
            bs: Buffer::from_bytes(g, DType::F32, &[nb, kb], &scale_bytes(r, nb * kb)).unwrap(),
            asc: Buffer::from_bytes(g, DType::F32, &[kb, m], &scale_bytes(r, kb * m)).unwrap(),
            out: Buffer::nan(g, DType::BF16, &[m, n]).unwrap(),
        }
    }

    fn args(&self) -> MatmulBTFp8Args<'_> {
        MatmulBTFp8Args {
            out: self.out.view(),
            a: self.a.view(),
            a_scale: Some(self.asc.view().as_strided(0, &[self.m, self.kb], &[1, self.m]).unwrap()),
            b: self.b.view(),
            b_scale: self.bs.view(),
        }
    }

    /// NaN over `out` again, waited for.
    fn poison(&self, g: &Queue) {
        let n = self.out.view().numel() as usize;
        g.write_bytes(&self.out.view(), &encode_f64(DType::BF16, &vec![f64::NAN; n])).unwrap();
        g.synchronize().unwrap();
    }
}

/// Sets `VT_LT_TUNE` from code for one test and returns it to the environment's value when
/// dropped (a failed assertion included).
struct LtTuneOverride;

impl LtTuneOverride {
    fn set(on: bool) -> LtTuneOverride {
        vt_core::flags::set_override(vt_core::flags::Flag::LtTune, Some(on));
        LtTuneOverride
    }
}

impl Drop for LtTuneOverride {
    fn drop(&mut self) {
        vt_core::flags::set_override(vt_core::flags::Flag::LtTune, None);
    }
}

/// `VT_LT_TUNE` (set from code: `flags::set_override`): off, an Lt call tunes nothing; on, a
/// shape's first call outside a capture times the heuristic's candidates (the shape counts
/// as tuned, once) and the tuned algorithm matches the CPU. A shape met untuned and then
/// called inside a graph capture with the flag on is not tuned there (tuning synchronizes,
/// which would fail the capture) and replays its untuned result bit for bit; its next eager
/// call tunes it, the result agrees with the untuned one within the op's tolerance, and a
/// new capture replays the tuned algorithm bit for bit. Holds the exclusive side: it
/// captures, and the flag is process-wide.
#[test]
fn lt_tune_times_candidates_at_the_first_eager_call() {
    let _gpu = exclusive();
    let Some((_c, g)) = cuda() else { return };
    if lt_skip(&g) {
        return;
    }
    use vt_cuda::fp8_matmul::lt_tuned_shapes;
    // Against the CPU, at a shape no other test uses (lt_case makes a fresh queue per call).
    let flag = LtTuneOverride::set(false);
    let shape = (256, 1152, 2048);
    let n0 = lt_tuned_shapes();
    assert_eq!(lt_case(Kernel::Lt, DType::BF16, shape, 2048, 0), Some(Kernel::Lt));
    assert_eq!(lt_tuned_shapes(), n0, "a shape was tuned with VT_LT_TUNE off");
    drop(flag);
    let flag = LtTuneOverride::set(true);
    assert_eq!(lt_case(Kernel::Lt, DType::BF16, shape, 2048, 0), Some(Kernel::Lt));
    assert_eq!(lt_tuned_shapes(), n0 + 1, "the first call with VT_LT_TUNE on did not tune its shape once");
    assert_eq!(lt_case(Kernel::Lt, DType::BF16, shape, 2048, 0), Some(Kernel::Lt));
    assert_eq!(lt_tuned_shapes(), n0 + 1, "a tuned shape was tuned again");
    drop(flag);

    // Graph capture on one queue: the shape met eagerly with the flag off (that call also
    // makes the queue's workspace), then captured with it on.
    let mut r = rng("Lt tune graph");
    let flag = LtTuneOverride::set(false);
    let p = LtProblem::new(&g, &mut r, (128, 768, 1536));
    let x = p.args();
    matmul_bt_fp8(&g, &x).unwrap();
    p.poison(&g);
    matmul_bt_fp8_with(&g, &x, Kernel::Lt).unwrap();
    let (untuned, u) = (p.out.to_bytes(&g).unwrap(), p.out.to_f64(&g).unwrap());
    drop(flag);
    let _flag = LtTuneOverride::set(true);
    let n1 = lt_tuned_shapes();
    p.poison(&g);
    let graph = g.capture(|| matmul_bt_fp8_with(&g, &x, Kernel::Lt).map(|_| ())).unwrap();
    graph.launch().unwrap();
    g.synchronize().unwrap();
    assert_eq!(lt_tuned_shapes(), n1, "a shape was tuned inside a capture");
    assert_eq!(p.out.to_bytes(&g).unwrap(), untuned, "the captured untuned call differs from the eager one");
    // The next eager call tunes the shape.
    p.poison(&g);
    matmul_bt_fp8_with(&g, &x, Kernel::Lt).unwrap();
    assert_eq!(lt_tuned_shapes(), n1 + 1, "the eager call after the capture did not tune its shape");
    let tuned = p.out.to_bytes(&g).unwrap();
    let t = p.out.to_f64(&g).unwrap();
    assert!(t.iter().all(|v| !v.is_nan()), "the tuned call left NaN in its output");
    let err = vt_check::rel_fro_error(&t, &u);
    println!("VT_LT_TUNE: tuned vs untuned relative error {err:.3e} (bit for bit: {})", tuned == untuned);
    assert!(err <= tol(DType::BF16), "tuned vs untuned: relative error {err:.3e}");
    // A new capture replays the tuned algorithm.
    p.poison(&g);
    let graph = g.capture(|| matmul_bt_fp8_with(&g, &x, Kernel::Lt).map(|_| ())).unwrap();
    graph.launch().unwrap();
    g.synchronize().unwrap();
    assert_eq!(p.out.to_bytes(&g).unwrap(), tuned, "the replayed tuned call differs from the eager one");
    assert_eq!(lt_tuned_shapes(), n1 + 1);
}

/// Lt inside a captured CUDA graph (after a warm-up call made the queue's workspace and
/// chose the algorithm) replays to the same output as the eager call, bit for bit.
#[test]
fn lt_replays_in_a_cuda_graph() {
    let _gpu = exclusive();
    let Some((_c, g)) = cuda() else { return };
    if lt_skip(&g) {
        return;
    }
    let mut r = rng("Lt graph");
    let (m, n, k) = (64i64, 512i64, 1024i64);
    let f8 = DType::F8E4M3;
    let a = Buffer::from_bytes(&g, f8, &[m, k], &codes(&mut r, m * k)).unwrap();
    let b = Buffer::from_bytes(&g, f8, &[n, k], &codes(&mut r, n * k)).unwrap();
    let bs = Buffer::from_bytes(&g, DType::F32, &[4, 8], &scale_bytes(&mut r, 32)).unwrap();
    let asc = Buffer::from_bytes(&g, DType::F32, &[8, m], &scale_bytes(&mut r, 8 * m)).unwrap();
    let out = Buffer::nan(&g, DType::BF16, &[m, n]).unwrap();
    let x = MatmulBTFp8Args {
        out: out.view(),
        a: a.view(),
        a_scale: Some(asc.view().as_strided(0, &[m, 8], &[1, m]).unwrap()),
        b: b.view(),
        b_scale: bs.view(),
    };
    matmul_bt_fp8(&g, &x).unwrap();
    matmul_bt_fp8_with(&g, &x, Kernel::Lt).unwrap();
    let eager = out.to_bytes(&g).unwrap();
    g.write_bytes(&out.view(), &encode_f64(DType::BF16, &vec![f64::NAN; (m * n) as usize])).unwrap();
    g.synchronize().unwrap();
    let graph = g.capture(|| matmul_bt_fp8_with(&g, &x, Kernel::Lt).map(|_| ())).unwrap();
    graph.launch().unwrap();
    g.synchronize().unwrap();
    assert_eq!(out.to_bytes(&g).unwrap(), eager, "the replayed Lt call differs from the eager one");
    println!("Lt graph replay: bit for bit ({} bytes)", eager.len());
}
