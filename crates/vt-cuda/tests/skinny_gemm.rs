//! The skinny (decode-shaped) GEMM kernel (`kernels-cuda/skinny_gemm.cu`) against the CPU
//! reference on the same bytes: MatmulBT and BatchedMatmul with bf16/f16 weights (forced
//! `GemmKernel::Skinny` and the ops' Auto choice), MatmulBTFp8 / BatchedMatmulFp8 weight-only
//! with e4m3 weights and 128 x 128 block scales (`fp8_matmul::Kernel::Skinny`), at every M in
//! 1..=16 and 31, 32, 64, 100, 128; N and K not multiples of the tiles (64 rows, 128-wide K
//! chunks, fp8 scale blocks), row-strided activations and outputs (views into wider NaN-
//! poisoned buffers: everything outside the output must stay NaN), forced K splits (the
//! last-arriver reduction) and a bit-for-bit repeat of a split launch. Each test prints a
//! SKIP line and passes when no CUDA device is present.

mod common;

use common::{named_rng as rng, Twin};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use vt_core::fp8_block::blocks;
use vt_core::*;
use vt_cuda::fp8_matmul::{batched_matmul_fp8_with_options, matmul_bt_fp8_with_options, Fp8Options, Kernel};
use vt_cuda::skinny_gemm::{auto_max_m, batched_matmul_with, matmul_bt_with, GemmKernel, GemmOptions};

const MS: [i64; 21] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 31, 32, 64, 100, 128];

fn floats(r: &mut ChaCha8Rng, dt: DType, n: i64) -> Vec<u8> {
    let v: Vec<f64> = (0..n).map(|_| r.gen_range(-1.0..1.0)).collect();
    encode_f64(dt, &v)
}

/// e4m3 codes over the whole range, NaN codes left out.
fn codes(r: &mut ChaCha8Rng, n: i64) -> Vec<u8> {
    (0..n).map(|_| r.gen_range(0u8..0x7f) | if r.gen_bool(0.5) { 0x80 } else { 0 }).collect()
}

fn scale_bytes(r: &mut ChaCha8Rng, n: i64) -> Vec<u8> {
    (0..n).flat_map(|_| 2f32.powf(r.gen_range(-10.0..-4.0)).to_le_bytes()).collect()
}

/// Every element the op writes within `tol` (relative Frobenius, `common::rel_err`) and not
/// NaN; every other element of the buffer still NaN on the GPU.
fn check(what: &str, c: &Queue, g: &Queue, out: &Twin, written: &Tensor<'_>, tol: f64) {
    common::check_written(what, c, g, out, written, tol, common::rel_err)
}

/// The kernel Auto must pick: the skinny one up to the measured M limit (unless
/// `VT_SKINNY_GEMM=0`).
fn auto_expects_skinny(w8: bool, m: i64, n: i64, k: i64) -> bool {
    vt_core::flags::skinny_gemm() && m <= auto_max_m(w8, n, k)
}

/// MatmulBT: `a` `[M, K]` rows `K + 8` wide, `b` rows 1..1+N of a `[N + 3, K]` weight, `out`
/// columns 3..3+N of rows N + 8 wide.
fn matmul16(kernel: GemmKernel, splits: Option<u32>, dt: DType, (m, n, k): (i64, i64, i64)) {
    let Some(g) = common::gpu() else { return };
    let c = common::cpu();
    let what = format!("MatmulBT {kernel:?} splits {splits:?} {dt} M {m} N {n} K {k}");
    let mut r = rng(&what);
    let a_ld = k + 8;
    let a = Twin::new(&c, &g, dt, &floats(&mut r, dt, m * a_ld));
    let w = Twin::new(&c, &g, dt, &floats(&mut r, dt, (n + 3) * k));
    let o_ld = n + 8;
    let out = Twin::nan(&c, &g, dt, m * o_ld + 3);
    let (ac, ag) = a.views(0, &[m, k], &[a_ld, 1]);
    let (bc, bg) = w.views(k, &[n, k], &[k, 1]);
    let (oc, og) = out.views(3, &[m, n], &[o_ld, 1]);
    matmul_bt(&c, &MatmulBTArgs { out: oc, a: ac, b: bc }).unwrap();
    let xg = MatmulBTArgs { out: og, a: ag, b: bg };
    matmul_bt(&g, &xg).unwrap(); // the op itself (validation, Auto) ...
    out.gpu.fill_pattern(&g, dt.nan_bytes()).unwrap(); // ... then poisoned again
    let ran = matmul_bt_with(&g, &xg, &GemmOptions { kernel, splits }).unwrap();
    match kernel {
        GemmKernel::Auto => {
            let want =
                if auto_expects_skinny(false, m, n, k) { GemmKernel::Skinny } else { GemmKernel::Cublas };
            assert_eq!(ran, want, "{what}");
        }
        k => assert_eq!(ran, k),
    }
    g.synchronize().unwrap();
    check(&what, &c, &g, &out, &oc, vt_check::tolerance(OpId::MatmulBT, dt).unwrap());
}

/// MatmulBTFp8 weight-only: `b` rows 128..128+N of an fp8 weight with the matching scale
/// rows; activations and output row-strided as in [`matmul16`].
fn matmul8(kernel: Kernel, splits: Option<u32>, dt: DType, (m, n, k): (i64, i64, i64)) {
    let Some(g) = common::gpu() else { return };
    let c = common::cpu();
    let what = format!("MatmulBTFp8 {kernel:?} splits {splits:?} {dt} M {m} N {n} K {k}");
    let mut r = rng(&what);
    let row0 = 128;
    let rows = row0 + n + 5;
    let kb = blocks(k);
    let w = Twin::new(&c, &g, DType::F8E4M3, &codes(&mut r, rows * k));
    let ws = Twin::new(&c, &g, DType::F32, &scale_bytes(&mut r, blocks(rows) * kb));
    let a_ld = k + 16;
    let a = Twin::new(&c, &g, dt, &floats(&mut r, dt, m * a_ld));
    let o_ld = n + 8;
    let out = Twin::nan(&c, &g, dt, m * o_ld + 3);
    let (bc, bg) = w.views(row0 * k, &[n, k], &[k, 1]);
    let (sc, sg) = ws.views((row0 / 128) * kb, &[blocks(n), kb], &[kb, 1]);
    let (ac, ag) = a.views(0, &[m, k], &[a_ld, 1]);
    let (oc, og) = out.views(3, &[m, n], &[o_ld, 1]);
    matmul_bt_fp8(&c, &MatmulBTFp8Args { out: oc, a: ac, a_scale: None, b: bc, b_scale: sc }).unwrap();
    let xg = MatmulBTFp8Args { out: og, a: ag, a_scale: None, b: bg, b_scale: sg };
    matmul_bt_fp8(&g, &xg).unwrap();
    out.gpu.fill_pattern(&g, dt.nan_bytes()).unwrap();
    let ran = matmul_bt_fp8_with_options(&g, &xg, &Fp8Options { kernel, splits }).unwrap();
    if kernel == Kernel::Auto {
        if auto_expects_skinny(true, m, n, k) {
            assert_eq!(ran, Kernel::Skinny, "{what}");
        }
    } else {
        assert_eq!(ran, kernel);
    }
    g.synchronize().unwrap();
    check(&what, &c, &g, &out, &oc, vt_check::tolerance(OpId::MatmulBTFp8, dt).unwrap());
}

#[test]
fn matmul_bt_16bit_every_m() {
    for dt in [DType::BF16, DType::F16] {
        for m in MS {
            // N not a multiple of 64, K not a multiple of 128 (a partial last chunk).
            matmul16(GemmKernel::Skinny, None, dt, (m, 200, 712));
        }
        for m in [1, 7, 16, 32, 64, 100, 128] {
            matmul16(GemmKernel::Auto, None, dt, (m, 136, 1024));
        }
    }
}

#[test]
fn matmul_bt_fp8_every_m() {
    for dt in [DType::BF16, DType::F16] {
        for m in MS {
            // N and K not multiples of 128: partial scale blocks in both directions.
            matmul8(Kernel::Skinny, None, dt, (m, 200, 720));
        }
        for m in [1, 7, 16, 32, 64, 100, 128] {
            matmul8(Kernel::Auto, None, dt, (m, 136, 1024));
        }
    }
}

/// The TMA form (sm_90: fp8 weights, up to 32 tokens, K of 8+ chunks; the cp.async form
/// elsewhere and with VT_SKINNY_TMA=0): a partial last chunk (K 1040 = 8 x 128 + 16) and rows
/// past N read as zeros through the maps, tokens past M, and forced splits whose CTAs hold
/// fewer chunks than the ring.
#[test]
fn fp8_tma_form_handles_tails_and_short_splits() {
    for dt in [DType::BF16, DType::F16] {
        for m in [1, 5, 9, 16, 17, 32] {
            matmul8(Kernel::Skinny, None, dt, (m, 200, 1040));
        }
    }
    for splits in [2, 3, 9] {
        matmul8(Kernel::Skinny, Some(splits), DType::BF16, (3, 136, 1040));
        matmul8(Kernel::Skinny, Some(splits), DType::F16, (30, 72, 1040));
    }
}

/// K split over CTAs and reduced by the last CTA to arrive: forced splits (one, uneven,
/// more than the chunks) and the planner's choice on decode shapes (a_proj's 2112 x 7168,
/// o_proj's K = 16384 on fewer rows).
#[test]
fn split_k_reduces_in_the_same_launch() {
    for splits in [1, 2, 3, 7, 64] {
        matmul16(GemmKernel::Skinny, Some(splits), DType::BF16, (5, 264, 1032));
        matmul8(Kernel::Skinny, Some(splits), DType::F16, (33, 136, 1040));
    }
    for m in [1, 4, 8, 32, 64] {
        matmul16(GemmKernel::Skinny, None, DType::BF16, (m, 2112, 7168));
        matmul8(Kernel::Skinny, None, DType::BF16, (m, 2112, 7168));
    }
    matmul16(GemmKernel::Skinny, None, DType::BF16, (3, 520, 16384));
    matmul8(Kernel::Skinny, None, DType::BF16, (128, 520, 16384));
}

/// One split over many chunks: each kind's ring wraps (4 stages; 3 at 33-64 tokens; 6 for fp8
/// at up to 16 tokens; the fp8 TMA form's planned depth).
#[test]
fn rings_wrap_over_long_k() {
    for (m, dt) in [(5, DType::BF16), (12, DType::F16), (20, DType::BF16), (40, DType::F16)] {
        matmul16(GemmKernel::Skinny, Some(1), dt, (m, 136, 2048));
        matmul8(Kernel::Skinny, Some(1), dt, (m, 136, 2048));
        bmm16_split(GemmKernel::Skinny, Some(1), dt, 2, m, (136, 2048), true);
    }
    // The planner's shallower rings of the fp8 TMA form wrap too: o_proj's 7168 x 16384 at 1
    // and 9 tokens takes rings of 4 with 5 / 4 K splits of 26 / 32 chunks on a 132-SM device.
    for m in [1, 9] {
        matmul8(Kernel::Skinny, None, DType::BF16, (m, 7168, 16384));
    }
}

/// The same split launch twice gives the same bits (the splits are added in split order,
/// whichever CTA arrives last), and again after a call of another shape reused the counters.
#[test]
fn split_k_is_deterministic() {
    let Some(g) = common::gpu() else { return };
    let mut r = rng("determinism");
    let (m, n, k, dt) = (4, 2112, 7168, DType::BF16);
    let a = Buffer::from_bytes(&g, dt, &[m, k], &floats(&mut r, dt, m * k)).unwrap();
    let w = Buffer::from_bytes(&g, dt, &[n, k], &floats(&mut r, dt, n * k)).unwrap();
    let opts = GemmOptions { kernel: GemmKernel::Skinny, splits: Some(8) };
    let mut runs = Vec::new();
    for i in 0..3 {
        let out = Buffer::nan(&g, dt, &[m, n]).unwrap();
        let x = MatmulBTArgs { out: out.view(), a: a.view(), b: w.view() };
        matmul_bt(&g, &x).unwrap();
        matmul_bt_with(&g, &x, &opts).unwrap();
        if i == 1 {
            // Another split shape in between.
            let o2 = Buffer::nan(&g, dt, &[m, 200]).unwrap();
            let x2 = MatmulBTArgs { out: o2.view(), a: a.view(), b: w.view().slice(0, 0, 200).unwrap() };
            matmul_bt(&g, &x2).unwrap();
            matmul_bt_with(&g, &x2, &GemmOptions { kernel: GemmKernel::Skinny, splits: Some(5) }).unwrap();
        }
        runs.push(out.to_bytes(&g).unwrap());
    }
    assert!(runs[1] == runs[0] && runs[2] == runs[0], "split-K results differ between runs");
    println!("split-K bit for bit over 3 runs");
}

/// BatchedMatmul over 128 heads in the absorbed decode forms: `a` `[G, M, K]` as a view of
/// `[M, G, K]`, `out` `[G, M, N]` as a view of `[M, G, N]`, the weight `[G, K, N]` either
/// K-contiguous (a view of the second N rows of each head's 2N rows of kv_b_proj-like
/// storage) or N-contiguous with a padded head stride (as the block keeps W_UK_T / W_UV).
fn bmm16(kernel: GemmKernel, dt: DType, heads: i64, m: i64, (n, k): (i64, i64), n_contiguous: bool) {
    bmm16_split(kernel, None, dt, heads, m, (n, k), n_contiguous)
}

/// [`bmm16`] with the K splits forced.
fn bmm16_split(
    kernel: GemmKernel,
    splits: Option<u32>,
    dt: DType,
    heads: i64,
    m: i64,
    (n, k): (i64, i64),
    n_contiguous: bool,
) {
    let Some(g) = common::gpu() else { return };
    let c = common::cpu();
    let what = format!(
        "BatchedMatmul {kernel:?} splits {splits:?} {dt} heads {heads} M {m} N {n} K {k} n-contiguous {n_contiguous}"
    );
    let mut r = rng(&what);
    let w = Twin::new(&c, &g, dt, &floats(&mut r, dt, heads * 2 * n * k));
    let a = Twin::new(&c, &g, dt, &floats(&mut r, dt, m * heads * k));
    let out = Twin::nan(&c, &g, dt, m * heads * n);
    let (bc, bg) = if n_contiguous {
        w.views(8, &[heads, k, n], &[2 * n * k, n, 1])
    } else {
        w.views(n * k, &[heads, k, n], &[2 * n * k, 1, k])
    };
    let (ac, ag) = a.views(0, &[heads, m, k], &[k, heads * k, 1]);
    let (oc, og) = out.views(0, &[heads, m, n], &[n, heads * n, 1]);
    batched_matmul(&c, &BatchedMatmulArgs { out: oc, a: ac, b: bc }).unwrap();
    let xg = BatchedMatmulArgs { out: og, a: ag, b: bg };
    batched_matmul(&g, &xg).unwrap();
    out.gpu.fill_pattern(&g, dt.nan_bytes()).unwrap();
    let ran = batched_matmul_with(&g, &xg, &GemmOptions { kernel, splits }).unwrap();
    if kernel == GemmKernel::Auto {
        let want = if auto_expects_skinny(false, m, n, k) { GemmKernel::Skinny } else { GemmKernel::Cublas };
        assert_eq!(ran, want, "{what}");
    }
    g.synchronize().unwrap();
    check(&what, &c, &g, &out, &oc, vt_check::tolerance(OpId::BatchedMatmul, dt).unwrap());
}

/// BatchedMatmulFp8 weight-only on W_UV / W_UK_T in the block's K-contiguous layout.
fn bmm8(kernel: Kernel, dt: DType, heads: i64, m: i64, (n, k): (i64, i64)) {
    let Some(g) = common::gpu() else { return };
    let c = common::cpu();
    let what = format!("BatchedMatmulFp8 {kernel:?} {dt} heads {heads} M {m} N {n} K {k}");
    let mut r = rng(&what);
    let (nb, kb) = (blocks(n), blocks(k));
    let w = Twin::new(&c, &g, DType::F8E4M3, &codes(&mut r, heads * n * k));
    let ws = Twin::new(&c, &g, DType::F32, &scale_bytes(&mut r, heads * nb * kb));
    let a = Twin::new(&c, &g, dt, &floats(&mut r, dt, m * heads * k));
    let out = Twin::nan(&c, &g, dt, m * heads * n);
    let (bc, bg) = w.views(0, &[heads, k, n], &[n * k, 1, k]);
    let (sc, sg) = ws.views(0, &[heads, kb, nb], &[nb * kb, 1, kb]);
    let (ac, ag) = a.views(0, &[heads, m, k], &[k, heads * k, 1]);
    let (oc, og) = out.views(0, &[heads, m, n], &[n, heads * n, 1]);
    batched_matmul_fp8(&c, &BatchedMatmulFp8Args { out: oc, a: ac, a_scale: None, b: bc, b_scale: sc })
        .unwrap();
    let xg = BatchedMatmulFp8Args { out: og, a: ag, a_scale: None, b: bg, b_scale: sg };
    batched_matmul_fp8(&g, &xg).unwrap();
    out.gpu.fill_pattern(&g, dt.nan_bytes()).unwrap();
    let ran = batched_matmul_fp8_with_options(&g, &xg, &Fp8Options { kernel, splits: None }).unwrap();
    if kernel != Kernel::Auto {
        assert_eq!(ran, kernel);
    }
    g.synchronize().unwrap();
    check(&what, &c, &g, &out, &oc, vt_check::tolerance(OpId::BatchedMatmulFp8, dt).unwrap());
}

#[test]
fn absorbed_bmm_128_heads() {
    for dt in [DType::BF16, DType::F16] {
        for m in [1, 5, 9, 17, 32, 64, 100, 128] {
            bmm16(GemmKernel::Skinny, dt, 128, m, (128, 512), true); // v_up, W_UV [G, L, V]
            bmm16(GemmKernel::Skinny, dt, 128, m, (512, 128), true); // q_absorb, W_UK_T [G, P, L]
            bmm16(GemmKernel::Skinny, dt, 128, m, (128, 512), false); // W_UV as a view of kv_b
            bmm8(Kernel::Skinny, dt, 128, m, (128, 512)); // v_up, fp8
            bmm8(Kernel::Skinny, dt, 128, m, (512, 128)); // q_absorb, fp8 (K-contiguous copy)
        }
        // N-contiguous with N not a multiple of the 64-row CTA, K of a partial chunk.
        bmm16(GemmKernel::Skinny, dt, 3, 7, (200, 712), true);
        bmm16(GemmKernel::Auto, dt, 128, 8, (128, 512), true);
        bmm16(GemmKernel::Auto, dt, 128, 100, (512, 128), true);
        bmm8(Kernel::Auto, dt, 128, 8, (512, 128));
    }
}

#[test]
fn forced_skinny_refuses_views_it_cannot_take() {
    let Some(g) = common::gpu() else { return };
    // K % 8 != 0 for 16-bit weights; f32.
    for (dt, k) in [(DType::BF16, 100), (DType::F32, 128)] {
        let out = Buffer::nan(&g, dt, &[2, 64]).unwrap();
        let a = Buffer::zeros(&g, dt, &[2, k]).unwrap();
        let b = Buffer::zeros(&g, dt, &[64, k]).unwrap();
        let x = MatmulBTArgs { out: out.view(), a: a.view(), b: b.view() };
        matmul_bt(&g, &x).unwrap();
        let e = matmul_bt_with(&g, &x, &GemmOptions { kernel: GemmKernel::Skinny, splits: None })
            .unwrap_err()
            .to_string();
        assert!(e.contains("skinny"), "{e}");
        // Auto takes cuBLAS instead.
        let ran = matmul_bt_with(&g, &x, &GemmOptions { kernel: GemmKernel::Auto, splits: None }).unwrap();
        assert_eq!(ran, GemmKernel::Cublas);
    }
}
