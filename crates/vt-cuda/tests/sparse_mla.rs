//! SparseMlaAttention and CacheIndexerKeys on CUDA against the CPU reference (vt-cpu) on the
//! same fresh random inputs.
//!
//! SparseMlaAttention: bf16/f16/f32 caches and the fp8_ds_mla cache, N in {8, 16, 64, 128},
//! topk in {1, 64, 2048}; index rows with -1 entries, repeated slots, slots past the cache
//! (the GPU skips them: the reference is run with -1 there) and a row with no valid index
//! (out 0, lse -inf); block sizes 1 and 64; strided q / out / lse views (lse stored
//! `[T, N]`, passed transposed), a cache that is a layer of a `[layers, NB, BS, W]` pool
//! (the decode kernels' block-size-1 view) and one of a `[NB, layers, BS, W]` pool (no such
//! view: the generic kernel), an unaligned q (the decode kernels' generic kernel); every
//! kernel forced (this op's generic kernel, each decode kernel, split and unsplit
//! schedules) besides the op's own choice. Outputs are poisoned with NaN, and every cache row
//! no index lists holds NaN (fp8: 0x7f codes, scales and rope), so a wrong gather shows.
//!
//! Skips (with a line saying so) without a CUDA device. Run on a GPU machine with
//! `cargo nextest run --release -p vt-cuda --test sparse_mla`.

use rand::seq::SliceRandom;
use rand::Rng;
use vt_core::fp8_ds_mla::{decode_row, DECODED, ROW_BYTES};
use vt_core::{encode_f64, Buffer, CacheIndexerKeysArgs, DType, Queue, SparseMlaAttentionArgs};
use vt_cuda::mla_decode_attention::Kernel as DK;
use vt_cuda::sparse_mla_attention::{sparse_mla_attention_with, Kernel, SparseOptions};

mod common;
use common::{cpu, gpu, rel_err};

/// Where the cache view lives in its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// A whole `[NB, BS, W]` buffer.
    Whole,
    /// Layer 1 of a `[2, NB, BS, W]` pool: slots still one stride apart.
    PoolLayer,
    /// Layer 1 of a `[NB, 2, BS, W]` pool: blocks 2 BS rows apart, no block-size-1 view.
    Interleaved,
}

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    fp8: bool,
    t: i64,
    n: i64,
    d: i64,
    dv: i64,
    topk: i64,
    nb: i64,
    bs: i64,
    layout: Layout,
    /// q / out rows padded by 8 elements, the cache's by 8 (16 bytes fp8), lse stored [T, N].
    strided: bool,
    /// Element offset of q in its buffer (1 breaks 16-byte alignment).
    q_offset: i64,
    /// Row 0 lists no valid slot.
    empty_row: bool,
    /// A few entries are slots >= NB * BS.
    past_cache: bool,
    /// Every listed row's first 64 entries are -1 (its first tile has no valid key).
    lead_invalid: bool,
    /// q in [0.5, 1) and 16-bit cache values in [-1, -0.5): every logit scale x q.k is far
    /// below zero (about -130 natural units at scale 0.3), under where exp2 of its negation
    /// overflows.
    negative_logits: bool,
    scale: f32,
    seed: u64,
}

impl Case {
    fn mla(t: i64, n: i64, topk: i64, (nb, bs): (i64, i64)) -> Case {
        Case {
            dtype: DType::BF16,
            fp8: false,
            t,
            n,
            d: 576,
            dv: 512,
            topk,
            nb,
            bs,
            layout: Layout::Whole,
            strided: false,
            q_offset: 0,
            empty_row: true,
            past_cache: true,
            lead_invalid: false,
            negative_logits: false,
            scale: 0.1,
            seed: 7,
        }
    }
    fn fp8(self) -> Case {
        Case { fp8: true, ..self }
    }
    fn slots(&self) -> i64 {
        self.nb * self.bs
    }
    /// Elements (bytes for fp8) of a cache row in the op's view, and of its stride.
    fn row(&self) -> (i64, i64) {
        let w = if self.fp8 { ROW_BYTES as i64 } else { self.d };
        let pad = if self.strided {
            if self.fp8 {
                16
            } else {
                8
            }
        } else {
            0
        };
        (w, w + pad)
    }
    fn pads(&self) -> (i64, i64) {
        if self.strided {
            (8, 8)
        } else {
            (0, 0)
        }
    }
}

/// Host inputs: q values, the cache's bytes (whole pool), indices as given to the GPU and
/// as given to the reference (past-the-cache entries as -1).
struct Inputs {
    q: Vec<f64>,
    cache: Vec<u8>,
    indices: Vec<f64>,
    ref_indices: Vec<f64>,
}

/// Physical row (in units of row strides) of slot s in the pool buffer.
fn phys_row(c: &Case, s: i64) -> i64 {
    let (blk, r) = (s / c.bs, s % c.bs);
    match c.layout {
        Layout::Whole => blk * c.bs + r,
        Layout::PoolLayer => (c.nb + blk) * c.bs + r,
        Layout::Interleaved => (blk * 2 + 1) * c.bs + r,
    }
}

fn pool_rows(c: &Case) -> i64 {
    match c.layout {
        Layout::Whole => c.slots(),
        _ => 2 * c.slots(),
    }
}

fn inputs(c: &Case) -> Inputs {
    let mut rng = common::case_rng(c.seed);
    let slots = c.slots();
    let k = c.topk as usize;
    let mut indices = Vec::with_capacity(c.t as usize * k);
    let mut ref_indices = Vec::with_capacity(c.t as usize * k);
    for ti in 0..c.t {
        if ti == 0 && c.empty_row {
            indices.extend(std::iter::repeat_n(-1.0, k));
            ref_indices.extend(std::iter::repeat_n(-1.0, k));
            continue;
        }
        let mut pool: Vec<i64> = (0..slots).collect();
        pool.shuffle(&mut rng);
        let mut row: Vec<i64> = (0..k).map(|i| pool[i % pool.len()]).collect();
        for i in 0..k {
            let u: f64 = rng.gen();
            if u < 1.0 / 6.0 && k > 1 {
                row[i] = -1;
            } else if u < 1.0 / 6.0 + 0.1 && k > 1 {
                row[i] = row[rng.gen_range(0..k)];
            } else if c.past_cache && u > 0.97 {
                row[i] = slots + rng.gen_range(0..3 * slots.max(1));
            }
        }
        if c.lead_invalid {
            row.iter_mut().take(64).for_each(|s| *s = -1);
        }
        for &s in &row {
            indices.push(s as f64);
            ref_indices.push(if s >= slots { -1.0 } else { s as f64 });
        }
    }
    let listed: std::collections::BTreeSet<i64> =
        ref_indices.iter().filter(|&&s| s >= 0.0).map(|&s| s as i64).collect();
    let (w, rw) = c.row();
    let rows = pool_rows(c);
    let cache = if c.fp8 {
        // 0x7f: e4m3 NaN codes, NaN scales and rope, on every row no index lists.
        let mut bytes = vec![0x7fu8; (rows * rw) as usize];
        for &s in &listed {
            let base = (phys_row(c, s) * rw) as usize;
            bytes[base..base + ROW_BYTES].copy_from_slice(&common::random_fp8_row(&mut rng, s as usize));
        }
        bytes
    } else {
        let mut vals = vec![f64::NAN; (rows * rw) as usize];
        for &s in &listed {
            let base = (phys_row(c, s) * rw) as usize;
            for v in &mut vals[base..base + w as usize] {
                *v = if c.negative_logits { rng.gen_range(-1.0..-0.5) } else { rng.gen_range(-1.0..1.0) };
            }
        }
        encode_f64(c.dtype, &vals)
    };
    let (qp, _) = c.pads();
    let qn = (c.t * c.n * (c.d + qp) + c.q_offset) as usize;
    let q = (0..qn)
        .map(|_| if c.negative_logits { rng.gen_range(0.5..1.0) } else { rng.gen_range(-1.0..1.0) })
        .collect();
    Inputs { q, cache, indices, ref_indices }
}

struct Bufs {
    q: Buffer,
    cache: Buffer,
    indices: Buffer,
    out: Buffer,
    lse: Buffer,
}

fn upload(queue: &Queue, c: &Case, x: &Inputs, indices: &[f64]) -> Bufs {
    let (_, rw) = c.row();
    let (_, op) = c.pads();
    let cache_dt = if c.fp8 { DType::Fp8DsMla } else { c.dtype };
    Bufs {
        q: Buffer::from_f64(queue, c.dtype, &[x.q.len() as i64], &x.q).unwrap(),
        cache: Buffer::from_bytes(queue, cache_dt, &[pool_rows(c), rw], &x.cache).unwrap(),
        indices: Buffer::from_f64(queue, DType::I32, &[c.t, c.topk], indices).unwrap(),
        out: Buffer::nan(queue, c.dtype, &[c.t, c.n, c.dv + op]).unwrap(),
        lse: Buffer::nan(queue, DType::F32, &[c.t * c.n]).unwrap(),
    }
}

fn args<'a>(c: &Case, b: &'a Bufs) -> SparseMlaAttentionArgs<'a> {
    let (qp, _) = c.pads();
    let (w, rw) = c.row();
    let query =
        b.q.view().as_strided(c.q_offset, &[c.t, c.n, c.d], &[c.n * (c.d + qp), c.d + qp, 1]).unwrap();
    let out = b.out.view().slice(2, 0, c.dv).unwrap();
    let lse = if c.strided {
        b.lse.view().as_strided(0, &[c.n, c.t], &[1, c.n]).unwrap()
    } else {
        b.lse.view().as_strided(0, &[c.n, c.t], &[c.t, 1]).unwrap()
    };
    let (nb, bs) = (c.nb, c.bs);
    let cache = match c.layout {
        Layout::Whole => b.cache.view().as_strided(0, &[nb, bs, w], &[bs * rw, rw, 1]),
        Layout::PoolLayer => b.cache.view().as_strided(nb * bs * rw, &[nb, bs, w], &[bs * rw, rw, 1]),
        Layout::Interleaved => b.cache.view().as_strided(bs * rw, &[nb, bs, w], &[2 * bs * rw, rw, 1]),
    }
    .unwrap();
    SparseMlaAttentionArgs { out, lse: Some(lse), query, cache, indices: b.indices.view(), scale: c.scale }
}

fn tolerance(c: &Case) -> f64 {
    match c.dtype {
        DType::BF16 => 1e-2,
        DType::F16 if c.fp8 => 1e-2,
        DType::F16 => 3e-3,
        _ => 1e-4,
    }
}

/// (out, lse [N, T] in logical order) of the CPU reference.
fn reference(c: &Case, x: &Inputs) -> (Vec<f64>, Vec<f64>) {
    let q = cpu();
    let b = upload(&q, c, x, &x.ref_indices);
    let a = args(c, &b);
    vt_core::sparse_mla_attention(&q, &a).unwrap();
    (q.read_f64(&a.out).unwrap(), q.read_f64(&a.lse.unwrap()).unwrap())
}

/// Per lse entry (logical order [N, T]), how far the GPU's may sit from the reference's: over
/// an fp8 cache the rounding bound of [`common::fp8_lse_bound`] (the CPU scores the exact keys,
/// the kernels bf16-rounded keys or a split query); over a 16-bit cache, where both score the
/// same values, 2e-3 (1 + |lse|).
fn lse_tolerances(c: &Case, x: &Inputs, want_lse: &[f64]) -> Vec<f64> {
    let tol16 = |w: f64| 2e-3 * (1.0 + w.abs());
    if !c.fp8 {
        return want_lse.iter().map(|&w| tol16(w)).collect();
    }
    let (_, rw) = c.row();
    let (qp, _) = c.pads();
    let key = |s: i64| {
        let base = (phys_row(c, s) * rw) as usize;
        let mut row = [0u8; ROW_BYTES];
        row.copy_from_slice(&x.cache[base..base + ROW_BYTES]);
        let mut k = [0f32; DECODED];
        decode_row(&row, &mut k);
        k
    };
    let mut tol = vec![0f64; (c.n * c.t) as usize];
    for ti in 0..c.t {
        let ids = &x.ref_indices[(ti * c.topk) as usize..((ti + 1) * c.topk) as usize];
        let keys: Vec<[f32; DECODED]> = ids.iter().filter(|&&s| s >= 0.0).map(|&s| key(s as i64)).collect();
        for h in 0..c.n {
            let q0 = (c.q_offset + ti * c.n * (c.d + qp) + h * (c.d + qp)) as usize;
            let i = (h * c.t + ti) as usize;
            let q = &x.q[q0..q0 + c.d as usize];
            tol[i] = common::fp8_lse_bound(q, keys.iter().map(|k| &k[..]), c.scale as f64, want_lse[i]);
        }
    }
    tol
}

/// The kernel choices a case must run under: the op's own (None) and every forced one that
/// exists for it.
fn kernels(c: &Case) -> Vec<Option<SparseOptions>> {
    let o = |kernel| Some(SparseOptions { kernel, ..SparseOptions::default() });
    let mut v = vec![None, o(Kernel::Generic)];
    if c.layout == Layout::Interleaved {
        return v;
    }
    v.push(o(Kernel::Decode(DK::Generic)));
    // Split into many short parts and not split at all.
    let d = SparseOptions::default();
    v.push(Some(SparseOptions { min_tiles: Some(1), max_parts: Some(1000), ..d }));
    v.push(Some(SparseOptions { min_tiles: Some(1), max_parts: Some(1), ..d }));
    // Tokens in several decode-kernel calls (7 at a time: chunk boundaries inside rows of
    // every kind).
    v.push(Some(SparseOptions { tokens_per_call: Some(7), ..d }));
    let fast = c.d == 576 && c.dv == 512 && c.dtype != DType::F32 && c.q_offset == 0;
    if fast {
        v.push(o(Kernel::Decode(DK::Mma)));
        // No small-ring kernel for 64 rows a CTA over an fp8 cache.
        if !(c.fp8 && c.n > 32) {
            v.push(o(Kernel::Decode(DK::MmaSmall)));
        }
        v.push(o(Kernel::Decode(DK::Wgmma)));
        // The three-warpgroup kernel's gather form over a 16-bit cache (the sparse view has
        // block size 1; the op's choice where slots are listed many times, at 64+ heads).
        if !c.fp8 {
            v.push(o(Kernel::Decode(DK::Wgmma3)));
        }
        // Over an fp8 cache with bf16 queries: the raw-ring kernel's gather form.
        if c.fp8 && c.dtype == DType::BF16 {
            v.push(o(Kernel::Decode(DK::WgmmaFp8Raw)));
        }
        // Over a 16-bit cache at a multiple of 64 heads: this op's prefill kernel.
        if !c.fp8 && c.n % 64 == 0 {
            v.push(o(Kernel::Prefill));
        }
        // Over an fp8 cache at 128 heads (two row blocks a token): the CTA-pair kernel.
        if c.fp8 && c.n % 128 == 0 {
            v.push(o(Kernel::Decode(DK::WgmmaFp8Pair)));
        }
        // The narrow wgmma kernels (16 / 32 heads a CTA, several CTAs per token beyond 32),
        // over both caches; the op does not use them (docs/perf.md, Sparse MLA), so only with
        // VT_SPARSE_TEST_NARROW=1 (they are the decode kernels' to test).
        if std::env::var_os("VT_SPARSE_TEST_NARROW").is_some_and(|v| v == "1") {
            v.push(o(Kernel::Decode(DK::WgmmaNarrow)));
        }
    }
    v
}

/// Runs the case under every kernel choice and compares with the reference; returns the
/// kernels that ran.
fn check(g: &Queue, c: &Case) -> Vec<String> {
    check_under(g, c, kernels(c))
}

/// [`check`] under the given kernel choices only.
fn check_under(g: &Queue, c: &Case, choices: Vec<Option<SparseOptions>>) -> Vec<String> {
    let x = inputs(c);
    let (want, want_lse) = reference(c, &x);
    let lse_tol = lse_tolerances(c, &x, &want_lse);
    let mut ran = Vec::new();
    for opts in choices {
        let b = upload(g, c, &x, &x.indices);
        let a = args(c, &b);
        let what = match &opts {
            None => {
                vt_core::sparse_mla_attention(g, &a).unwrap();
                "op".to_string()
            }
            Some(o) => match sparse_mla_attention_with(g, &a, o) {
                Ok(p) => {
                    let k = match o.tokens_per_call {
                        Some(c) => format!("{:?} ({c} tokens a call)", o.kernel),
                        None => format!("{:?}", o.kernel),
                    };
                    match p.decode {
                        Some(d) => format!("{k}: {} x{} parts {}", p.kernel, d.row_blocks, d.parts),
                        None => format!("{k}: {}", p.kernel),
                    }
                }
                Err(e) if o.kernel == Kernel::Prefill && e.to_string().contains("needs an sm_90 device") => {
                    println!("prefill kernel not on this device: {e}");
                    continue;
                }
                Err(e)
                    if matches!(
                        o.kernel,
                        Kernel::Decode(
                            DK::Wgmma | DK::WgmmaNarrow | DK::Wgmma3 | DK::WgmmaFp8Raw | DK::WgmmaFp8Pair
                        )
                    ) && e.to_string().contains("no sm_90a") =>
                {
                    println!("wgmma not on this device: {e}");
                    continue;
                }
                Err(e) => panic!("{o:?}: {e} for {c:?}"),
            },
        };
        let got = g.read_f64(&a.out).unwrap();
        let got_lse = g.read_f64(&a.lse.unwrap()).unwrap();
        assert!(
            got.iter().all(|v| v.is_finite()),
            "{what}: non-finite output (unwritten or NaN read) for {c:?}"
        );
        let e = rel_err(&got, &want);
        assert!(e < tolerance(c), "{what}: out rel error {e:.3e} for {c:?}");
        for (i, (gl, w)) in got_lse.iter().zip(&want_lse).enumerate() {
            let ok = if w.is_finite() { (gl - w).abs() <= lse_tol[i] } else { *gl == *w };
            assert!(ok, "{what}: lse[{i}] = {gl}, reference {w} (tolerance {:.2e}), for {c:?}", lse_tol[i]);
        }
        if c.empty_row {
            // Row 0 lists no valid slot: out 0 and lse -inf exactly.
            let row0 = (c.n * c.dv) as usize;
            assert!(got[..row0].iter().all(|&v| v == 0.0), "{what}: token 0 (no valid slot) out != 0");
            for h in 0..c.n as usize {
                assert_eq!(got_lse[h * c.t as usize], f64::NEG_INFINITY, "{what}: token 0 head {h} lse");
            }
        }
        if c.strided {
            let all = g.read_f64(&b.out.view()).unwrap();
            let orow = (c.dv + c.pads().1) as usize;
            assert!(
                all.chunks(orow).all(|r| r[c.dv as usize..].iter().all(|v| v.is_nan())),
                "{what}: wrote outside out's view"
            );
        }
        println!(
            "{what}: out rel error {e:.2e} ({:?}{}, T {}, N {}, topk {}, BS {}, {:?})",
            c.dtype,
            if c.fp8 { " fp8 cache" } else { "" },
            c.t,
            c.n,
            c.topk,
            c.bs,
            c.layout
        );
        ran.push(what);
    }
    ran
}

/// This op's prefill kernel on its own (the sanitizers run over this test): 64 and 128 heads,
/// topk 1, 64, 100 (a partial last tile), 2048 (32 tiles: 16 pairs), 2047, 3 and 4 tiles (pairs
/// with and without the odd tile), bf16 and f16, strided q / out / cache rows and a pool
/// layer; rows with -1 entries, repeated slots, slots past the cache and an empty row; rows
/// whose first tile has no valid key before tiles of very negative logits (the softmax's
/// rescale of an empty tile A must be 0, not exp2(-m_B) = inf).
#[test]
fn sparse_prefill_kernel_matches_reference() {
    let Some(g) = gpu() else { return };
    let prefill = vec![Some(SparseOptions { kernel: Kernel::Prefill, ..SparseOptions::default() })];
    let mut ran = Vec::new();
    for n in [64, 128] {
        for (topk, nb, bs) in [
            (1, 40, 1),
            (64, 3, 64),
            (100, 40, 16),
            (2048, 40, 64),
            (2047, 40, 64),
            (192, 9, 64),
            (256, 9, 64),
        ] {
            ran.extend(check_under(&g, &Case::mla(5, n, topk, (nb, bs)), prefill.clone()));
        }
    }
    let mut c = Case::mla(7, 64, 300, (12, 64));
    c.dtype = DType::F16;
    ran.extend(check_under(&g, &c, prefill.clone()));
    let mut c = Case::mla(3, 128, 512, (12, 64));
    c.layout = Layout::PoolLayer;
    c.strided = true;
    ran.extend(check_under(&g, &c, prefill.clone()));
    for topk in [128, 192, 300] {
        let mut c = Case::mla(4, 64, topk, (12, 64));
        (c.lead_invalid, c.negative_logits, c.scale) = (true, true, 0.3);
        ran.extend(check_under(&g, &c, prefill.clone()));
    }
    assert!(ran.iter().all(|r| r.contains("sparse_prefill")), "{ran:?}");
}

#[test]
fn sparse_mla_matches_reference_for_head_counts_and_topk() {
    let Some(g) = gpu() else { return };
    for n in [8, 16, 64, 128] {
        for (topk, nb, bs) in [(1, 40, 1), (64, 3, 64), (2048, 40, 64)] {
            check(&g, &Case::mla(3, n, topk, (nb, bs)));
        }
    }
}

#[test]
fn sparse_mla_fp8_cache_matches_reference_for_head_counts_and_topk() {
    let Some(g) = gpu() else { return };
    for n in [8, 16, 64, 128] {
        for (topk, nb, bs) in [(1, 40, 1), (64, 100, 1), (2048, 40, 64)] {
            check(&g, &Case::mla(3, n, topk, (nb, bs)).fp8());
        }
    }
}

#[test]
fn sparse_mla_matches_reference_with_block_size_1_and_f16() {
    let Some(g) = gpu() else { return };
    for fp8 in [false, true] {
        let mut c = Case::mla(4, 16, 2048, (3000, 1));
        c.fp8 = fp8;
        check(&g, &c);
        c.dtype = DType::F16;
        c.n = 64;
        check(&g, &c);
    }
}

#[test]
fn sparse_mla_matches_reference_with_strided_views_and_pool_layers() {
    let Some(g) = gpu() else { return };
    for fp8 in [false, true] {
        for layout in [Layout::PoolLayer, Layout::Interleaved] {
            for n in [16, 128] {
                let mut c = Case::mla(3, n, 512, (12, 64));
                c.fp8 = fp8;
                c.layout = layout;
                c.strided = true;
                let ran = check(&g, &c);
                if layout == Layout::Interleaved {
                    assert!(ran.iter().all(|r| r == "op" || r.contains("sparse_generic")), "{ran:?}");
                }
            }
        }
    }
}

#[test]
fn sparse_mla_matches_reference_for_many_tokens_a_large_batch() {
    // T x head groups above the SM count (no split) and a peaked softmax.
    let Some(g) = gpu() else { return };
    let mut c = Case::mla(200, 64, 256, (64, 64));
    c.scale = 0.5;
    check(&g, &c);
    let mut c = Case::mla(150, 128, 128, (32, 64)).fp8();
    c.scale = 0.3;
    check(&g, &c);
}

#[test]
fn sparse_mla_matches_reference_for_more_tokens_than_a_cta_has_threads() {
    // T > 256: the decode kernels' schedule scans the sequences in several passes.
    let Some(g) = gpu() else { return };
    check(&g, &Case::mla(600, 16, 64, (20, 64)));
    check(&g, &Case::mla(300, 64, 32, (20, 64)).fp8());
}

#[test]
fn sparse_mla_generic_kernels_take_any_dims_dtypes_and_unaligned_views() {
    let Some(g) = gpu() else { return };
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for (n, d, dv) in [(4, 80, 64), (3, 33, 7), (16, 576, 512)] {
            let mut c = Case::mla(5, n, 70, (10, 16));
            c.dtype = dtype;
            c.d = d;
            c.dv = dv;
            c.scale = 1.0 / (d as f32).sqrt();
            check(&g, &c);
        }
    }
    // An unaligned q: the decode kernels' generic kernel under Auto.
    let mut c = Case::mla(3, 64, 300, (8, 64));
    c.q_offset = 1;
    let ran = check(&g, &c);
    assert!(ran.iter().any(|r| r.starts_with("Auto: generic")), "{ran:?}");
}

#[test]
fn sparse_mla_picks_the_tensor_core_kernels_for_deepseek_shapes() {
    let Some(g) = gpu() else { return };
    let ran = check(&g, &Case::mla(2, 128, 2048, (40, 64)));
    // The op's own choice is the decode kernels' Auto (its plan is printed by the Auto rows).
    assert!(ran.iter().any(|r| r.starts_with("Auto: wgmma") || r.starts_with("Auto: mma")), "{ran:?}");
    // An fp8_ds_mla cache at 64 heads: the 64-row wgmma kernel's fp8 form (sm_90; mma64_fp8
    // where there is no wgmma).
    let ran = check(&g, &Case::mla(2, 64, 2048, (40, 64)).fp8());
    assert!(
        ran.iter().any(|r| r.starts_with("Auto: wgmma_fp8") || r.starts_with("Auto: mma64_fp8")),
        "{ran:?}"
    );
    // A 16-bit cache listed about once per slot, T x N >= 4096 rows: the mma.sync kernel.
    let ran = check(&g, &Case::mla(64, 64, 64, (40, 64)));
    assert!(ran.iter().any(|r| r.starts_with("Auto: mma64")), "{ran:?}");
    // Slots listed many times (a prefill re-reading a small kv): on sm_90 the op's own prefill
    // kernel (the three-warpgroup gather form with VT_SPARSE_PREFILL=0), else the decode
    // kernels' Auto; never the mma.sync kernel.
    let ran = check(&g, &Case::mla(64, 64, 512, (2, 64)));
    assert!(ran.iter().all(|r| !r.starts_with("Auto: mma")), "{ran:?}");
    if g.downcast::<vt_cuda::CudaQueue>().is_some_and(|c| c.sm() == 90) {
        let want =
            if vt_core::flags::sparse_prefill() { "Auto: sparse_prefill" } else { "Auto: wgmma_3wg_cp" };
        assert!(ran.iter().any(|r| r.starts_with(want)), "want {want}: {ran:?}");
    }
}

/// CacheIndexerKeys: bf16/f16/f32, block sizes 1/16/64, a strided k (a column slice of a
/// wider projection) into layer 1 of a 2-layer pool, padding, repeated and past-the-cache
/// slots (the GPU skips those; the reference is run with -1 there), compared exactly; every
/// cache element no token writes must keep its NaN poison.
#[test]
fn cache_indexer_keys_matches_reference() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = common::case_rng(11);
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for (t, nb, bs) in [(7i64, 9i64, 1i64), (40, 4, 16), (100, 3, 64)] {
            let di = 128i64;
            let slots = nb * bs;
            let mut sm: Vec<i64> = (0..slots).collect();
            sm.shuffle(&mut rng);
            let mut sm: Vec<i64> = (0..t as usize).map(|i| sm[i % sm.len()]).collect();
            sm[0] = -1;
            sm[1] = slots + 5;
            let gpu_slots: Vec<f64> = sm.iter().map(|&s| s as f64).collect();
            // Repeated slots (from t > slots) race on the GPU: keep them out of the comparison.
            let mut seen = std::collections::HashMap::new();
            for &s in &sm {
                *seen.entry(s).or_insert(0) += 1;
            }
            let ref_slots: Vec<f64> =
                sm.iter().map(|&s| if s >= slots || seen[&s] > 1 { -1.0 } else { s as f64 }).collect();
            let k: Vec<f64> = (0..t * 192).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let run = |q: &Queue, slots_v: &[f64]| -> Vec<f64> {
                let kb = Buffer::from_f64(q, dtype, &[t, 192], &k).unwrap();
                let cache = Buffer::nan(q, dtype, &[2, nb, bs, di]).unwrap();
                let sb = Buffer::from_f64(q, DType::I64, &[t], slots_v).unwrap();
                let cv = cache.view().select(0, 1).unwrap();
                let a = CacheIndexerKeysArgs {
                    k: kb.view().slice(1, 64, 192).unwrap(),
                    cache: cv,
                    slot_mapping: sb.view(),
                };
                vt_core::cache_indexer_keys(q, &a).unwrap();
                q.read_f64(&cache.view()).unwrap()
            };
            let want = run(&c, &ref_slots);
            // The GPU also writes the repeated slots: compare only rows the reference left NaN
            // where a repeated slot lives.
            let got = run(&g, &gpu_slots);
            let half = (nb * bs * di) as usize;
            assert!(got[..half].iter().all(|v| v.is_nan()), "{dtype:?}: layer 0 of the pool written");
            for s in 0..slots {
                let r = half + (s * di) as usize..half + ((s + 1) * di) as usize;
                if seen.get(&s).copied().unwrap_or(0) > 1 {
                    // One of the tokens' keys, whole.
                    let row = &got[r];
                    let ok = sm.iter().enumerate().filter(|(_, &x)| x == s).any(|(ti, _)| {
                        let src = &k[ti * 192 + 64..ti * 192 + 192];
                        row.iter().zip(src).all(|(a, b)| (*a as f32) == half_round(dtype, *b))
                    });
                    assert!(ok, "{dtype:?}: repeated slot {s} holds no token's whole key");
                    continue;
                }
                let (gr, wr) = (&got[r.clone()], &want[r]);
                assert!(
                    gr.iter().zip(wr).all(|(a, b)| a == b || (a.is_nan() && b.is_nan())),
                    "{dtype:?} T {t} BS {bs}: slot {s} differs"
                );
            }
            println!("CacheIndexerKeys {dtype:?} T {t} NB {nb} BS {bs}: exact");
        }
    }
}

/// `v` rounded to `dtype` as the upload rounds it.
fn half_round(dtype: DType, v: f64) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_f64(v).to_f32(),
        DType::F16 => half::f16::from_f64(v).to_f32(),
        _ => v as f32,
    }
}

/// After a warm-up call, the op (decode-kernel path with a split and the combine, fp8 and
/// bf16 caches, and the generic kernel) captures into a CUDA graph whose replay writes the
/// direct call's bytes; new indices in the same buffer are picked up by the replay.
#[test]
fn sparse_mla_captures_into_a_cuda_graph() {
    let Some(g) = gpu() else { return };
    if !g.supports_capture() {
        println!("SKIP: the queue cannot capture");
        return;
    }
    let mut cases = vec![Case::mla(3, 128, 2048, (40, 64)), Case::mla(2, 16, 300, (12, 64)).fp8()];
    let mut c = Case::mla(3, 16, 64, (12, 16));
    c.layout = Layout::Interleaved;
    cases.push(c);
    for c in &cases {
        let x = inputs(c);
        let b = upload(&g, c, &x, &x.indices);
        let a = args(c, &b);
        vt_core::sparse_mla_attention(&g, &a).unwrap(); // warm-up: modules, workspaces
        let want = b.out.to_bytes(&g).unwrap();
        b.out.fill_pattern(&g, c.dtype.nan_bytes()).unwrap();
        let graph = g.capture(|| vt_core::sparse_mla_attention(&g, &a)).unwrap();
        assert!(g.read_f64(&a.out).unwrap().iter().all(|v| v.is_nan()), "capturing ran nothing");
        graph.launch().unwrap();
        assert_eq!(b.out.to_bytes(&g).unwrap(), want, "replay = direct call for {c:?}");
        // Other indices (every row reversed) in the same buffer: the replay reads them.
        let mut rev = x.indices.clone();
        for row in rev.chunks_mut(c.topk as usize) {
            row.reverse();
        }
        b.indices.write_bytes(&g, &encode_f64(DType::I32, &rev)).unwrap();
        graph.launch().unwrap();
        let replayed = b.out.to_bytes(&g).unwrap();
        vt_core::sparse_mla_attention(&g, &a).unwrap();
        assert_eq!(replayed, b.out.to_bytes(&g).unwrap(), "replay with new indices for {c:?}");
        println!(
            "graph capture ok ({:?}{}, N {}, topk {}, {:?})",
            c.dtype,
            if c.fp8 { " fp8" } else { "" },
            c.n,
            c.topk,
            c.layout
        );
    }
}
