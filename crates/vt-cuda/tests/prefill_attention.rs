//! PrefillAttention on CUDA against the CPU reference (vt-cpu), one test per kernel
//! (mma.sync, wgmma, the op's automatic choice) and case: every head-dim pair of
//! `FAST_DIMS` in bf16 and f16, 16 and 128 heads, empty and length-1 sequences, mixed varlen
//! batches, causal with Tq < Tk and with rows that see no key, non-causal chunks with lse,
//! lse off, k and v as column slices of one wider buffer, query tiles cut at 63/64/65/127/
//! 128/129 rows, long sequences.
//!
//! Fresh random inputs each run (seed printed; VT_SEED replays). Every output buffer
//! starts as NaN and is wider than its view; q/k/v padding columns and rows outside every
//! sequence hold NaN, so a read outside the sequences' rows poisons the result. The
//! comparison covers whole buffers: NaN exactly where the reference left NaN (nothing
//! written outside the sequences' rows and the views' columns), relative Frobenius error
//! of out, lse within 2e-3 (and -inf where no key is visible). Skips (with a line saying
//! so) without a CUDA device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vt_core::{encode_f64, Buffer, DType, PrefillAttentionArgs, Queue, Tensor};
use vt_cuda::prefill_attention::{prefill_attention_with, Kernel, FAST_DIMS};

mod common;
use common::{cpu, gpu};

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    /// (lq, lk) per sequence.
    lens: Vec<(i64, i64)>,
    n: i64,
    d: i64,
    dv: i64,
    causal: bool,
    lse: bool,
    /// Softmax scale times sqrt(d): 2 is a moderate softmax, 8 a peaked one.
    sharpness: f32,
    /// k and v as column slices [0, d) and [d, d + dv) of one [Tk, N, d + dv + 8] buffer
    /// (as the MLA block passes the kv up-projection); else separate padded buffers.
    fused_kv: bool,
    /// Rows after the last sequence in q/out/lse and in k/v (never read, never written).
    tail: i64,
}

impl Case {
    fn new(lens: &[(i64, i64)], n: i64, (d, dv): (i64, i64)) -> Case {
        Case {
            dtype: DType::BF16,
            lens: lens.to_vec(),
            n,
            d,
            dv,
            causal: true,
            lse: true,
            sharpness: 2.0,
            fused_kv: false,
            tail: 3,
        }
    }

    fn self_attn(lens: &[i64], n: i64, dims: (i64, i64)) -> Case {
        Case::new(&lens.iter().map(|&l| (l, l)).collect::<Vec<_>>(), n, dims)
    }

    fn tq(&self) -> i64 {
        self.lens.iter().map(|l| l.0).sum::<i64>() + self.tail
    }

    fn tk(&self) -> i64 {
        self.lens.iter().map(|l| l.1).sum::<i64>() + self.tail
    }

    fn scale(&self) -> f32 {
        self.sharpness / (self.d as f32).sqrt()
    }
}

/// Padding columns of q, k, v and out (keeps rows 16-byte aligned for 16-bit types).
const PAD: i64 = 8;

/// Host-side inputs of a case, row-major over the padded buffers.
struct Inputs {
    q: Vec<f64>,
    /// Separate k and v buffers, or (fused_kv) the one kv buffer in `k`.
    k: Vec<f64>,
    v: Vec<f64>,
    cu_q: Vec<f64>,
    cu_k: Vec<f64>,
}

/// Random values for rows `0..rows` and columns `0..width` of `[total, n, width + pad]`,
/// NaN elsewhere (padding and the tail rows).
fn fill(rng: &mut ChaCha8Rng, total: i64, rows: i64, n: i64, width: i64, pad: i64) -> Vec<f64> {
    let w = width + pad;
    let mut v = vec![f64::NAN; (total * n * w) as usize];
    for t in 0..rows {
        for h in 0..n {
            for e in 0..width {
                v[((t * n + h) * w + e) as usize] = rng.gen_range(-1.0..1.0);
            }
        }
    }
    v
}

fn inputs(c: &Case, seed: u64) -> Inputs {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (tq, tk) = (c.tq(), c.tk());
    let (rq, rk) = (tq - c.tail, tk - c.tail);
    let q = fill(&mut rng, tq, rq, c.n, c.d, PAD);
    let (k, v) = if c.fused_kv {
        (fill(&mut rng, tk, rk, c.n, c.d + c.dv, PAD), Vec::new())
    } else {
        (fill(&mut rng, tk, rk, c.n, c.d, PAD), fill(&mut rng, tk, rk, c.n, c.dv, PAD))
    };
    let prefix = |f: fn(&(i64, i64)) -> i64| {
        let mut acc = vec![0f64];
        for l in &c.lens {
            acc.push(acc[acc.len() - 1] + f(l) as f64);
        }
        acc
    };
    Inputs { q, k, v, cu_q: prefix(|l| l.0), cu_k: prefix(|l| l.1) }
}

/// Device buffers of one case on one queue; outputs poisoned with NaN.
struct Bufs {
    q: Buffer,
    k: Buffer,
    v: Option<Buffer>,
    cu_q: Buffer,
    cu_k: Buffer,
    out: Buffer,
    lse: Buffer,
}

fn upload(queue: &Queue, c: &Case, x: &Inputs) -> Bufs {
    let (tq, tk) = (c.tq(), c.tk());
    let put = |dt: DType, shape: &[i64], v: &[f64]| {
        Buffer::from_bytes(queue, dt, shape, &encode_f64(dt, v)).unwrap()
    };
    let b = c.lens.len() as i64;
    let (k, v) = if c.fused_kv {
        (put(c.dtype, &[tk, c.n, c.d + c.dv + PAD], &x.k), None)
    } else {
        (put(c.dtype, &[tk, c.n, c.d + PAD], &x.k), Some(put(c.dtype, &[tk, c.n, c.dv + PAD], &x.v)))
    };
    Bufs {
        q: put(c.dtype, &[tq, c.n, c.d + PAD], &x.q),
        k,
        v,
        cu_q: put(DType::I32, &[b + 1], &x.cu_q),
        cu_k: put(DType::I32, &[b + 1], &x.cu_k),
        out: Buffer::nan(queue, c.dtype, &[tq, c.n, c.dv + PAD]).unwrap(),
        lse: Buffer::nan(queue, DType::F32, &[c.n, tq]).unwrap(),
    }
}

fn args<'a>(c: &Case, bf: &'a Bufs) -> PrefillAttentionArgs<'a> {
    let (k, v): (Tensor<'a>, Tensor<'a>) = match &bf.v {
        None => {
            let kv = bf.k.view();
            (kv.slice(2, 0, c.d).unwrap(), kv.slice(2, c.d, c.d + c.dv).unwrap())
        }
        Some(v) => (bf.k.view().slice(2, 0, c.d).unwrap(), v.view().slice(2, 0, c.dv).unwrap()),
    };
    PrefillAttentionArgs {
        out: bf.out.view().slice(2, 0, c.dv).unwrap(),
        lse: c.lse.then(|| bf.lse.view()),
        query: bf.q.view().slice(2, 0, c.d).unwrap(),
        k,
        v,
        cu_seqlens_q: bf.cu_q.view(),
        cu_seqlens_k: bf.cu_k.view(),
        max_seqlen_q: c.lens.iter().map(|l| l.0).max().unwrap_or(0),
        causal: c.causal,
        scale: c.scale(),
    }
}

/// Whole output buffers (out with its padding, lse), as the queue left them.
struct Outputs {
    out: Vec<f64>,
    lse: Vec<f64>,
}

/// The CPU reference. Its call also validates the arguments, which the forced-kernel entry
/// point on the GPU expects.
fn reference(c: &Case, x: &Inputs) -> Outputs {
    let q = cpu();
    let bf = upload(&q, c, x);
    vt_core::prefill_attention(&q, &args(c, &bf)).unwrap();
    Outputs { out: q.read_f64(&bf.out.view()).unwrap(), lse: q.read_f64(&bf.lse.view()).unwrap() }
}

fn tolerance(dt: DType) -> f64 {
    match dt {
        DType::BF16 => 1e-2,
        DType::F16 => 2e-3,
        _ => 1e-4,
    }
}

/// Runs the case with `kernel` on the GPU and compares with the reference. Returns false
/// (with a line saying why) only for the wgmma kernel on a device that is not sm_90.
fn run_gpu(g: &Queue, kernel: Kernel, c: &Case, x: &Inputs, want: &Outputs) -> bool {
    let bf = upload(g, c, x);
    let ran = match prefill_attention_with(g, &args(c, &bf), kernel) {
        Ok(k) => k,
        Err(e) if kernel == Kernel::Wgmma && e.to_string().contains("needs sm_90") => {
            println!("SKIP wgmma: {e}");
            return false;
        }
        Err(e) => panic!("{kernel:?}: {e} for {c:?}"),
    };
    let out = g.read_f64(&bf.out.view()).unwrap();
    let lse = g.read_f64(&bf.lse.view()).unwrap();
    let (mut num, mut den) = (0.0, 0.0);
    for (i, (o, w)) in out.iter().zip(&want.out).enumerate() {
        assert_eq!(
            o.is_nan(),
            w.is_nan(),
            "{ran:?}: out[{i}] = {o}, reference {w} (unwritten, written outside the sequences, or NaN read) for {c:?}"
        );
        if !w.is_nan() {
            num += (o - w) * (o - w);
            den += w * w;
        }
    }
    let e = (num / f64::max(den, 1e-30)).sqrt();
    assert!(e < tolerance(c.dtype), "{ran:?}: out rel error {e:.3e} for {c:?}");
    for (i, (l, w)) in lse.iter().zip(&want.lse).enumerate() {
        let ok = if w.is_nan() {
            l.is_nan()
        } else if w.is_finite() {
            (l - w).abs() <= 2e-3 * (1.0 + w.abs())
        } else {
            l == w
        };
        assert!(ok, "{ran:?}: lse[{i}] = {l}, reference {w}, for {c:?}");
    }
    println!(
        "{kernel:?} ran {ran:?}: out rel error {e:.2e} ({:?}, N {}, dims ({}, {}), causal {}, lse {}, lens {:?})",
        c.dtype, c.n, c.d, c.dv, c.causal, c.lse, c.lens
    );
    true
}

/// A list of cases with their inputs and reference outputs, computed once per process and
/// shared by the three kernels' tests (the CPU reference dominates the run time).
struct Prepared {
    items: Vec<(Case, Inputs, Outputs)>,
}

fn prepare(cases: Vec<Case>) -> Prepared {
    let seed = common::seed();
    let items = cases
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let x = inputs(&c, seed.wrapping_add(i as u64));
            let want = reference(&c, &x);
            (c, x, want)
        })
        .collect();
    Prepared { items }
}

fn prepared(name: &'static str, cases: fn() -> Vec<Case>) -> Arc<Prepared> {
    type Cell = Arc<OnceLock<Arc<Prepared>>>;
    static CACHE: OnceLock<Mutex<HashMap<&'static str, Cell>>> = OnceLock::new();
    let cell = {
        let mut map = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        map.entry(name).or_default().clone()
    };
    cell.get_or_init(|| Arc::new(prepare(cases()))).clone()
}

/// Every case of the list with `kernel`.
fn check(kernel: Kernel, name: &'static str, cases: fn() -> Vec<Case>) {
    let Some(g) = gpu() else { return };
    let p = prepared(name, cases);
    for (c, x, want) in &p.items {
        if !run_gpu(&g, kernel, c, x, want) {
            return;
        }
    }
}

/// One test per kernel for a list of cases.
macro_rules! per_kernel {
    ($cases:ident: $mma:ident, $wgmma:ident, $auto:ident) => {
        #[test]
        fn $mma() {
            check(Kernel::Mma, stringify!($cases), $cases);
        }
        #[test]
        fn $wgmma() {
            check(Kernel::Wgmma, stringify!($cases), $cases);
        }
        #[test]
        fn $auto() {
            check(Kernel::Auto, stringify!($cases), $cases);
        }
    };
}

/// Every FAST_DIMS pair in bf16 and f16, causal self-attention over a small varlen batch.
fn every_fast_dim_pair() -> Vec<Case> {
    let mut v = Vec::new();
    for dims in FAST_DIMS {
        for dtype in [DType::BF16, DType::F16] {
            let mut c = Case::self_attn(&[70, 1, 150], 4, dims);
            c.dtype = dtype;
            v.push(c);
        }
    }
    v
}
per_kernel!(every_fast_dim_pair:
    prefill_mma_matches_reference_for_every_fast_dim_pair,
    prefill_wgmma_matches_reference_for_every_fast_dim_pair,
    prefill_auto_matches_reference_for_every_fast_dim_pair);

/// 16 and 128 heads at small T.
fn heads_16_and_128() -> Vec<Case> {
    [16, 128].into_iter().map(|n| Case::self_attn(&[20, 70], n, (192, 128))).collect()
}
per_kernel!(heads_16_and_128:
    prefill_mma_matches_reference_with_16_and_128_heads,
    prefill_wgmma_matches_reference_with_16_and_128_heads,
    prefill_auto_matches_reference_with_16_and_128_heads);

/// Mixed varlen batches with empty and length-1 sequences, Tq < Tk (a prefix of cached
/// keys), Tq > Tk (early rows see no key), empty key sets.
fn causal_varlen() -> Vec<Case> {
    let lens =
        [(0, 0), (1, 1), (200, 200), (1, 300), (57, 500), (130, 70), (0, 9), (5, 0), (129, 400), (64, 64)];
    let mut v = Vec::new();
    for dims in FAST_DIMS {
        for dtype in [DType::BF16, DType::F16] {
            let mut c = Case::new(&lens, 4, dims);
            c.dtype = dtype;
            v.push(c);
        }
    }
    v
}
per_kernel!(causal_varlen:
    prefill_mma_matches_reference_causal_varlen,
    prefill_wgmma_matches_reference_causal_varlen,
    prefill_auto_matches_reference_causal_varlen);

/// Non-causal chunks (a chunk's queries over the gathered context), with lse for the merge.
fn non_causal_chunk_with_lse() -> Vec<Case> {
    let mut v = Vec::new();
    for dims in FAST_DIMS {
        let mut c = Case::new(&[(200, 700), (1, 77), (64, 0), (129, 129), (0, 40)], 4, dims);
        c.causal = false;
        v.push(c);
    }
    v
}
per_kernel!(non_causal_chunk_with_lse:
    prefill_mma_matches_reference_non_causal_chunk_with_lse,
    prefill_wgmma_matches_reference_non_causal_chunk_with_lse,
    prefill_auto_matches_reference_non_causal_chunk_with_lse);

/// lse off, causal and not (lse's buffer must stay NaN).
fn without_lse() -> Vec<Case> {
    let mut v = Vec::new();
    for causal in [true, false] {
        let mut c = Case::new(&[(100, 250), (17, 17)], 4, (192, 128));
        c.causal = causal;
        c.lse = false;
        v.push(c);
    }
    v
}
per_kernel!(without_lse:
    prefill_mma_matches_reference_without_lse,
    prefill_wgmma_matches_reference_without_lse,
    prefill_auto_matches_reference_without_lse);

/// k and v as column slices of one wider buffer (the MLA block's kv up-projection).
fn strided_kv_slices() -> Vec<Case> {
    let mut v = Vec::new();
    for dims in FAST_DIMS {
        for causal in [true, false] {
            let mut c = Case::new(&[(90, 90), (40, 333), (1, 1)], 4, dims);
            c.fused_kv = true;
            c.causal = causal;
            v.push(c);
        }
    }
    v
}
per_kernel!(strided_kv_slices:
    prefill_mma_matches_reference_for_strided_kv_slices,
    prefill_wgmma_matches_reference_for_strided_kv_slices,
    prefill_auto_matches_reference_for_strided_kv_slices);

/// Sequence lengths around the query tile sizes (64 / 128) and key tile sizes.
fn tile_boundaries() -> Vec<Case> {
    let lens = [63, 64, 65, 127, 128, 129, 191, 257];
    let mut v = vec![Case::self_attn(&lens, 2, (128, 128))];
    let mut c = Case::new(&lens.iter().map(|&l| (l, l + 63)).collect::<Vec<_>>(), 2, (64, 64));
    c.causal = false;
    v.push(c);
    let mut c = Case::new(&lens.iter().map(|&l| (l, 2 * l + 1)).collect::<Vec<_>>(), 2, (192, 128));
    c.dtype = DType::F16;
    v.push(c);
    v
}
per_kernel!(tile_boundaries:
    prefill_mma_matches_reference_at_query_tile_boundaries,
    prefill_wgmma_matches_reference_at_query_tile_boundaries,
    prefill_auto_matches_reference_at_query_tile_boundaries);

/// A single batch whose whole buffers are larger than the sequences (many tail rows of NaN
/// in q, k, v and the outputs): rows outside the sequences stay NaN.
fn rows_outside_untouched() -> Vec<Case> {
    let mut v = Vec::new();
    for causal in [true, false] {
        let mut c = Case::new(&[(77, 77), (3, 50)], 4, (192, 128));
        c.tail = 200;
        c.causal = causal;
        v.push(c);
    }
    v
}
per_kernel!(rows_outside_untouched:
    prefill_mma_leaves_rows_outside_the_sequences_untouched,
    prefill_wgmma_leaves_rows_outside_the_sequences_untouched,
    prefill_auto_leaves_rows_outside_the_sequences_untouched);

/// Long sequences (many key tiles through the ring, many query tiles) and a peaked softmax
/// (the running maximum moves often).
fn long_and_peaked() -> Vec<Case> {
    let mut v = Vec::new();
    for dims in FAST_DIMS {
        let mut c = Case::new(&[(700, 700), (300, 1200)], 1, dims);
        c.sharpness = 8.0;
        v.push(c);
    }
    v
}
per_kernel!(long_and_peaked:
    prefill_mma_matches_reference_for_long_sequences_and_a_peaked_softmax,
    prefill_wgmma_matches_reference_for_long_sequences_and_a_peaked_softmax,
    prefill_auto_matches_reference_for_long_sequences_and_a_peaked_softmax);

/// The forced tensor-core kernels refuse arguments they are not built for (f32, other head
/// dims) with an error instead of computing something else; Auto falls back to generic.
#[test]
fn prefill_tensor_core_kernels_refuse_other_dtypes_and_head_dims() {
    let Some(g) = gpu() else { return };
    for (dtype, dims) in [(DType::F32, (128, 128)), (DType::BF16, (96, 64))] {
        let mut c = Case::self_attn(&[20], 2, dims);
        c.dtype = dtype;
        let x = inputs(&c, 1);
        let want = reference(&c, &x);
        for kernel in [Kernel::Mma, Kernel::Wgmma] {
            let bf = upload(&g, &c, &x);
            assert!(prefill_attention_with(&g, &args(&c, &bf), kernel).is_err(), "{kernel:?} took {c:?}");
        }
        assert!(run_gpu(&g, Kernel::Auto, &c, &x, &want));
    }
}
