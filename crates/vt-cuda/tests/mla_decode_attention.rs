//! MlaDecodeAttention on CUDA against the CPU reference (vt-cpu) on fresh random inputs:
//! block sizes 1/16/64/128, head counts 8..128, mixed lengths up to 32k in one batch, one
//! and two query tokens, lse, bf16/f16/f32, strided views, every kernel variant, split and
//! unsplit schedules, and block ids outside the cache. Outputs are poisoned with NaN, cache
//! slots past each sequence's length hold NaN. Skips (with a line saying so) without a
//! CUDA device.

use rand::Rng;
use vt_core::{encode_f64, Buffer, DType, MlaDecodeAttentionArgs, Queue, Tensor};
use vt_cuda::mla_decode_attention::{mla_decode_attention_with, DecodeOptions, Kernel};

mod common;
use common::{assert_every_case_ran_on_sm90, cpu, gpu, rel_err, Paged};

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    lens: Vec<i32>,
    s_q: i64,
    n: i64,
    d: i64,
    dv: i64,
    bs: i64,
    scale: f32,
    /// Extra elements on the last dim of q, cache and out (row strides wider than rows).
    pad: i64,
    /// Element offset of the q view in its buffer (1 breaks 16-byte alignment).
    q_offset: i64,
    seed: u64,
}

impl Case {
    fn mla(lens: &[i32], n: i64, bs: i64) -> Case {
        Case {
            dtype: DType::BF16,
            lens: lens.to_vec(),
            s_q: 1,
            n,
            d: 576,
            dv: 512,
            bs,
            scale: 0.1,
            pad: 0,
            q_offset: 0,
            seed: 7,
        }
    }
}

/// Host-side inputs of a case (f64, already rounded to the dtype by the upload).
struct Inputs {
    q: Vec<f64>,
    cache: Vec<f64>,
    block_table: Vec<f64>,
    seq_lens: Vec<f64>,
    nb: i64,
    mb: i64,
}

fn inputs(c: &Case) -> Inputs {
    let mut rng = common::case_rng(c.seed);
    let b = c.lens.len() as i64;
    let paged = Paged::new(&mut rng, &c.lens, c.bs);
    let row = c.d + c.pad;
    // NaN everywhere no sequence's token lives: reading it would poison the output.
    let mut cache = vec![f64::NAN; (paged.nb * c.bs * row) as usize];
    for (i, &len) in c.lens.iter().enumerate() {
        for t in 0..len as i64 {
            let base = (paged.row(i, t) * row) as usize;
            for e in 0..c.d as usize {
                cache[base + e] = rng.gen_range(-1.0..1.0);
            }
        }
    }
    let qn = (b * c.s_q * c.n * row + c.q_offset) as usize;
    let q: Vec<f64> = (0..qn).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let seq_lens = c.lens.iter().map(|&l| l as f64).collect();
    Inputs { q, cache, block_table: paged.block_table, seq_lens, nb: paged.nb, mb: paged.mb }
}

/// Device buffers of one case on one queue, outputs poisoned with NaN.
struct Bufs {
    q: Buffer,
    cache: Buffer,
    block_table: Buffer,
    seq_lens: Buffer,
    out: Buffer,
    lse: Buffer,
}

fn upload(queue: &Queue, c: &Case, x: &Inputs) -> Bufs {
    let b = c.lens.len() as i64;
    let row = c.d + c.pad;
    let orow = c.dv + c.pad;
    let put = |dt: DType, shape: &[i64], v: &[f64]| {
        Buffer::from_bytes(queue, dt, shape, &encode_f64(dt, v)).unwrap()
    };
    Bufs {
        q: put(c.dtype, &[x.q.len() as i64], &x.q),
        cache: put(c.dtype, &[x.nb, c.bs, row], &x.cache),
        block_table: put(DType::I32, &[b, x.mb], &x.block_table),
        seq_lens: put(DType::I32, &[b], &x.seq_lens),
        out: Buffer::nan(queue, c.dtype, &[b, c.s_q, c.n, orow]).unwrap(),
        lse: Buffer::nan(queue, DType::F32, &[b, c.n, c.s_q]).unwrap(),
    }
}

/// The op's views of the buffers (strided when the case pads rows).
fn views<'a>(c: &Case, bf: &'a Bufs) -> (Tensor<'a>, Tensor<'a>, Tensor<'a>, Tensor<'a>) {
    let b = c.lens.len() as i64;
    let row = c.d + c.pad;
    let q =
        bf.q.view()
            .as_strided(c.q_offset, &[b, c.s_q, c.n, c.d], &[c.s_q * c.n * row, c.n * row, row, 1])
            .unwrap();
    let cache = bf.cache.view().slice(2, 0, c.d).unwrap();
    let out = bf.out.view().slice(3, 0, c.dv).unwrap();
    (q, cache, out, bf.lse.view())
}

fn tolerance(dt: DType) -> f64 {
    match dt {
        DType::BF16 => 1e-2,
        DType::F16 => 2e-3,
        _ => 1e-4,
    }
}

/// The CPU reference of a case: (out, lse) in logical order.
struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
}

fn reference(c: &Case, x: &Inputs) -> Reference {
    let cq = cpu();
    let cb = upload(&cq, c, x);
    let (q, cache, out, lse) = views(c, &cb);
    vt_core::mla_decode_attention(
        &cq,
        &vt_core::MlaDecodeAttentionArgs {
            out,
            lse: Some(lse),
            query: q,
            cache,
            block_table: cb.block_table.view(),
            seq_lens: cb.seq_lens.view(),
            scale: c.scale,
        },
    )
    .unwrap();
    Reference { out: cq.read_f64(&out).unwrap(), lse: cq.read_f64(&lse).unwrap() }
}

/// Runs the case on the GPU (the op's entry point for default options, else the kernel the
/// options force), compares out and lse with the reference, and checks that out's padding
/// lanes were not written. `None` when the forced kernel does not exist on this device.
fn run_gpu(g: &Queue, c: &Case, x: &Inputs, want: &Reference, opts: &DecodeOptions) -> Option<String> {
    let gb = upload(g, c, x);
    let (q, cache, out, lse) = views(c, &gb);
    let (bt, sl) = (gb.block_table.view(), gb.seq_lens.view());
    let plan = if opts.kernel == Kernel::Auto && opts.min_tiles.is_none() && opts.max_parts.is_none() {
        vt_core::mla_decode_attention(
            g,
            &vt_core::MlaDecodeAttentionArgs {
                out,
                lse: Some(lse),
                query: q,
                cache,
                block_table: bt,
                seq_lens: sl,
                scale: c.scale,
            },
        )
        .unwrap();
        "auto".to_string()
    } else {
        let args = MlaDecodeAttentionArgs {
            out,
            lse: Some(lse),
            query: q,
            cache,
            block_table: bt,
            seq_lens: sl,
            scale: c.scale,
        };
        match mla_decode_attention_with(g, &args, opts) {
            Ok(p) => format!("{} x{} parts {} min {}", p.kernel, p.row_blocks, p.parts, p.min_tiles),
            Err(e)
                if matches!(
                    opts.kernel,
                    Kernel::Wgmma
                        | Kernel::WgmmaNarrow
                        | Kernel::WgmmaSeesaw
                        | Kernel::Wgmma3
                        | Kernel::Wgmma3Paged
                ) =>
            {
                println!("wgmma kernel not available here: {e}");
                return None;
            }
            Err(e) => panic!("{opts:?}: {e}"),
        }
    };
    let got = g.read_f64(&out).unwrap();
    let got_lse = g.read_f64(&lse).unwrap();
    assert!(got.iter().all(|v| v.is_finite()), "{plan}: non-finite output (unwritten or NaN read) for {c:?}");
    let e = rel_err(&got, &want.out);
    assert!(e < tolerance(c.dtype), "{plan}: out rel error {e:.3e} for {c:?}");
    for (i, (gl, w)) in got_lse.iter().zip(&want.lse).enumerate() {
        let ok = if w.is_finite() { (gl - w).abs() <= 2e-3 * (1.0 + w.abs()) } else { *gl == *w };
        assert!(ok, "{plan}: lse[{i}] = {gl}, reference {w}, for {c:?}");
    }
    if c.pad > 0 {
        let all = g.read_f64(&gb.out.view()).unwrap();
        let orow = (c.dv + c.pad) as usize;
        assert!(
            all.chunks(orow).all(|r| r[c.dv as usize..].iter().all(|v| v.is_nan())),
            "{plan}: wrote outside out's view"
        );
    }
    println!("{plan}: out rel error {e:.2e} ({:?}, N {}, s_q {}, BS {})", c.dtype, c.n, c.s_q, c.bs);
    Some(plan)
}

/// Reference and GPU run of one case with the op's defaults.
fn check(g: &Queue, c: &Case) {
    let x = inputs(c);
    let want = reference(c, &x);
    run_gpu(g, c, &x, &want, &DecodeOptions::default());
}

const MIXED: [i32; 8] = [1, 17, 64, 65, 300, 1000, 0, 130];

#[test]
fn decode_attention_matches_reference_with_block_size_1() {
    let Some(g) = gpu() else { return };
    check(&g, &Case::mla(&MIXED, 16, 1));
}

#[test]
fn decode_attention_matches_reference_with_block_size_16() {
    let Some(g) = gpu() else { return };
    check(&g, &Case::mla(&MIXED, 16, 16));
}

#[test]
fn decode_attention_matches_reference_with_block_size_64() {
    let Some(g) = gpu() else { return };
    check(&g, &Case::mla(&MIXED, 16, 64));
}

#[test]
fn decode_attention_matches_reference_with_block_size_128() {
    let Some(g) = gpu() else { return };
    check(&g, &Case::mla(&MIXED, 16, 128));
}

#[test]
fn decode_attention_matches_reference_for_head_counts_8_to_128() {
    let Some(g) = gpu() else { return };
    for n in [8, 24, 32, 64, 128] {
        check(&g, &Case::mla(&[5, 200, 777, 64], n, 16));
    }
}

#[test]
fn decode_attention_matches_reference_for_a_large_batch() {
    let Some(g) = gpu() else { return };
    let mut rng = common::case_rng(3);
    let lens: Vec<i32> = (0..48).map(|_| rng.gen_range(0..700)).collect();
    for n in [16, 128] {
        check(&g, &Case::mla(&lens, n, 16));
    }
}

/// The split-KV workspace (partials, their lse, the per-sequence record the combine reads) is
/// kept per queue and reused: calls that cut, give whole sequences, cut one sequence over
/// every part (b1) and skip empty sequences follow one another on one queue, twice, with B
/// growing and shrinking, each checked against the reference (a stale record or partial from
/// an earlier call would show).
#[test]
fn decode_attention_matches_reference_when_calls_of_different_shapes_share_a_queue() {
    let Some(g) = gpu() else { return };
    let mut rng = common::case_rng(41);
    let long: Vec<i32> = (0..32).map(|_| rng.gen_range(700..1300)).collect();
    let cases = [
        Case::mla(&long, 64, 64),
        Case::mla(&[4000], 128, 64),
        Case::mla(&[333; 12], 16, 64),
        Case::mla(&MIXED, 128, 16),
        Case::mla(&long[..20], 16, 64),
        Case::mla(&long, 64, 64),
    ];
    let prepared: Vec<_> = cases
        .iter()
        .map(|c| {
            let x = inputs(c);
            let want = reference(c, &x);
            (x, want)
        })
        .collect();
    for _round in 0..2 {
        for (c, (x, want)) in cases.iter().zip(&prepared) {
            run_gpu(&g, c, x, want, &DecodeOptions::default());
        }
    }
}

/// The combine's strided form (`VT_MLA_COMBINE_STRIDE`: CTAs that loop over row groups, fewer
/// of them) on what the combine must do: merge cut sequences with a warp a row (200 short and
/// empty sequences over 7 parts: one CTA a sequence taking all 16 row groups at 128 heads, 2 at
/// 16), merge with eight warps a row (4 long sequences over every part: 128 one-row groups, 99
/// CTAs a sequence, some taking two), pass whole sequences (Auto's schedule) and write empty
/// ones. Where the strided grid would be the plain one (the long sequences at 7 parts: 16 row
/// groups, all in one wave) the plain kernel runs (`combine::form`). The flag is a process-wide
/// override while this test runs: tests running beside it may take either form, both of which
/// are checked here and elsewhere.
#[test]
fn decode_attention_matches_reference_with_the_strided_combine() {
    let Some(g) = gpu() else { return };
    let mut rng = common::case_rng(42);
    let short: Vec<i32> = (0..200).map(|i| if i % 17 == 3 { 0 } else { rng.gen_range(1..600) }).collect();
    let long = [3000, 0, 2500, 4000];
    vt_core::flags::set_override(vt_core::flags::Flag::MlaCombineStride, Some(true));
    for (lens, n) in [(&short[..], 128), (&short[..], 16), (&long[..], 128)] {
        let c = Case::mla(lens, n, 64);
        let x = inputs(&c);
        let want = reference(&c, &x);
        for max_parts in [None, Some(7)] {
            run_gpu(&g, &c, &x, &want, &DecodeOptions { kernel: Kernel::Auto, min_tiles: None, max_parts });
        }
    }
    vt_core::flags::set_override(vt_core::flags::Flag::MlaCombineStride, None);
}

/// Equal lengths with B a multiple of the parts take the whole-sequence schedule (every part's
/// load equals its even share, schedule.cuh), so nothing is cut and the combine only passes
/// through; empty sequences in between and a near-threshold batch (one long sequence) too.
#[test]
fn decode_attention_matches_reference_when_parts_hold_whole_sequences() {
    let Some(g) = gpu() else { return };
    let equal: Vec<i32> = vec![333; 12];
    let mut holes = equal.clone();
    holes[3] = 0;
    holes[8] = 0;
    let mut skewed = equal.clone();
    skewed[5] = 1400;
    for lens in [&equal, &holes, &skewed] {
        for (n, bs) in [(16, 64), (64, 64), (128, 64), (64, 16), (32, 128)] {
            let c = Case::mla(lens, n, bs);
            let x = inputs(&c);
            let want = reference(&c, &x);
            for max_parts in [Some(12), Some(4), None] {
                run_gpu(
                    &g,
                    &c,
                    &x,
                    &want,
                    &DecodeOptions { kernel: Kernel::Auto, min_tiles: None, max_parts },
                );
            }
        }
    }
}

/// The same schedule through each wgmma kernel forced (Auto takes the narrow one at <= 32
/// rows only), with the TMA (block size 64) and cp.async (16) loads.
#[test]
fn every_wgmma_kernel_gives_parts_whole_sequences() {
    let Some(g) = gpu() else { return };
    let lens: Vec<i32> = vec![200; 8];
    for (n, bs) in [(64, 64), (64, 16), (16, 64), (128, 16)] {
        let c = Case::mla(&lens, n, bs);
        let x = inputs(&c);
        let want = reference(&c, &x);
        for max_parts in [Some(8), Some(4), Some(2)] {
            for kernel in [Kernel::Wgmma, Kernel::WgmmaNarrow, Kernel::WgmmaSeesaw] {
                run_gpu(&g, &c, &x, &want, &DecodeOptions { kernel, min_tiles: None, max_parts });
            }
        }
    }
}

/// The seesaw kernel (TMA loads: block sizes 64 and 128) on segments of one to five tiles
/// (odd and even counts: warpgroup 1's last pair has no tile), rows past a sequence's last
/// token in a real page (NaN there), row counts that pad the 64-row block, two causal query
/// tokens, f16, strided out rows, and the whole-sequence, cut and one-part schedules.
#[test]
fn seesaw_kernel_matches_reference_for_odd_and_even_tile_counts() {
    let Some(g) = gpu() else { return };
    let cases = [
        (64, 64, 1, DType::BF16, 0),
        (128, 64, 1, DType::BF16, 8),
        (40, 128, 1, DType::BF16, 0),
        (64, 128, 2, DType::BF16, 0),
        (32, 64, 2, DType::F16, 0),
        (128, 64, 1, DType::F16, 0),
    ];
    tma_kernel_matches_reference_on_cases(&g, Kernel::WgmmaSeesaw, &cases);
}

/// The schedules the TMA 64-row kernels' tests run: whole-sequence, one part, seven parts, cut.
const TMA_SCHEDULES: [(Option<u32>, Option<u32>); 4] =
    [(None, None), (Some(1), Some(1)), (Some(1), Some(7)), (Some(1), Some(1000))];

/// `kernel` forced on each (heads, block size, s_q, dtype, row padding) case over mixed lengths
/// (one to many tiles, empty sequences, rows past a sequence's last token in a real page) and
/// every schedule of [`TMA_SCHEDULES`], against the CPU; returns the plans that ran.
fn tma_kernel_matches_reference_on_cases(
    g: &Queue,
    kernel: Kernel,
    cases: &[(i64, i64, i64, DType, i64)],
) -> Vec<String> {
    let lens = [1, 64, 65, 128, 200, 256, 300, 0, 129, 1000];
    let mut ran = Vec::new();
    for &(n, bs, s_q, dtype, pad) in cases {
        let mut c = Case::mla(&lens, n, bs);
        c.s_q = s_q;
        c.dtype = dtype;
        c.pad = pad;
        let x = inputs(&c);
        let want = reference(&c, &x);
        for (min_tiles, max_parts) in TMA_SCHEDULES {
            ran.extend(run_gpu(g, &c, &x, &want, &DecodeOptions { kernel, min_tiles, max_parts }));
        }
    }
    ran
}

/// The three-warpgroup kernel (TMA loads: block sizes 64 and 128; warpgroup 0 computes S and
/// the softmax, warpgroups 1 and 2 one half of P V each) on segments of one to many tiles, rows
/// past a sequence's last token in a real page (NaN there: its warpgroups zero them), row counts
/// that pad the 64-row block, causal query tokens, f16, strided rows, and the whole-sequence, cut
/// and one-part schedules (one part: the ring runs across every segment). The sanitizers run
/// over this test.
#[test]
fn three_warpgroup_kernel_matches_reference() {
    let Some(g) = gpu() else { return };
    let cases = [
        (64, 64, 1, DType::BF16, 0),
        (128, 64, 1, DType::BF16, 8),
        (40, 128, 1, DType::BF16, 0),
        (64, 128, 2, DType::BF16, 0),
        (32, 64, 4, DType::F16, 0),
        (128, 64, 1, DType::F16, 0),
    ];
    let ran = tma_kernel_matches_reference_on_cases(&g, Kernel::Wgmma3, &cases);
    assert!(ran.iter().all(|plan| plan.starts_with("wgmma_3wg")), "{ran:?}");
    // On sm_90 the kernel takes every case here: an error must not pass as a skip.
    assert_every_case_ran_on_sm90(&g, &ran, cases.len() * TMA_SCHEDULES.len(), "three-warpgroup kernel");
}

/// The three-warpgroup kernel's CTA pairs (`wgmma_3wg_x2`: the two row blocks of a cluster read
/// each tile once, every other column block multicast by each CTA) on row counts with an even
/// number of 64-row blocks: 128 heads, a padded second block (120 heads), 64 heads x 2 query
/// tokens, two clusters along the rows (128 heads x 2 tokens), f16 at 32 heads x 4 tokens,
/// block sizes 64 and 128, under the whole-sequence, cut and one-part schedules (one part: the
/// pair's ring runs across every segment).
#[test]
fn three_warpgroup_pair_kernel_matches_reference() {
    let Some(g) = gpu() else { return };
    let cases = [
        (128, 64, 1, DType::BF16, 8),
        (120, 64, 1, DType::BF16, 0),
        (64, 128, 2, DType::BF16, 0),
        (128, 64, 2, DType::BF16, 0),
        (32, 64, 4, DType::F16, 0),
    ];
    let ran = tma_kernel_matches_reference_on_cases(&g, Kernel::Wgmma3Pair, &cases);
    assert!(ran.iter().all(|plan| plan.starts_with("wgmma_3wg_x2 ")), "{ran:?}");
    assert_every_case_ran_on_sm90(&g, &ran, cases.len() * TMA_SCHEDULES.len(), "three-warpgroup pair kernel");
}

/// Block ids outside the cache on the three-warpgroup kernel: their pages take no part.
#[test]
fn three_warpgroup_kernel_skips_out_of_range_block_ids() {
    let Some(g) = gpu() else { return };
    tma_kernel_skips_blocks_2_and_5(&g, Kernel::Wgmma3);
}

/// The three-warpgroup kernel's gather form (forced `Wgmma3` on block sizes the TMA does not
/// take: 1, 16, 32): every row looked up and copied by cp.async from warpgroups 1 and 2, tiles
/// that span several blocks, rows past a sequence's last token, row counts that pad the 64-row
/// block, causal query tokens, f16, strided rows, the whole-sequence, cut and one-part schedules.
/// The sanitizers run over this test.
#[test]
fn three_warpgroup_gather_form_matches_reference_with_block_sizes_1_16_and_32() {
    let Some(g) = gpu() else { return };
    let cases = [
        (64, 1, 1, DType::BF16, 0),
        (128, 16, 1, DType::BF16, 8),
        (40, 16, 1, DType::BF16, 0),
        (64, 1, 2, DType::BF16, 0),
        (32, 16, 4, DType::F16, 0),
        (128, 32, 1, DType::F16, 0),
    ];
    let ran = tma_kernel_matches_reference_on_cases(&g, Kernel::Wgmma3, &cases);
    assert!(ran.iter().all(|plan| plan.starts_with("wgmma_3wg_cp ")), "{ran:?}");
    assert_every_case_ran_on_sm90(&g, &ran, cases.len() * TMA_SCHEDULES.len(), "three-warpgroup kernel");
}

/// Block ids outside the cache on the gather form (block size 16: a tile holds four blocks, two
/// of them bad): those rows are zero-filled and masked.
#[test]
fn three_warpgroup_gather_form_skips_out_of_range_block_ids() {
    let Some(g) = gpu() else { return };
    let (c, x, want) = blocks_2_and_5_out_of_range(&[128, 40], 64, 16);
    for max_parts in [Some(1), Some(3), None] {
        run_gpu(&g, &c, &x, &want, &DecodeOptions { kernel: Kernel::Wgmma3, min_tiles: Some(1), max_parts });
    }
}

/// The three-warpgroup kernel's paged TMA form (`wgmma_3wg_pg`: pages of 16 or 32 rows, a
/// tile 2-4 pages, one TMA box a page per column block) on segments of one to many tiles, rows
/// past a sequence's last token in a real page and pages past it, row counts that pad the
/// 64-row block, causal query tokens, f16, strided rows, and the whole-sequence, cut and
/// one-part schedules. The sanitizers run over this test.
#[test]
fn three_warpgroup_paged_form_matches_reference_with_block_sizes_16_and_32() {
    let Some(g) = gpu() else { return };
    let cases = [
        (64, 16, 1, DType::BF16, 0),
        (128, 16, 1, DType::BF16, 8),
        (40, 32, 1, DType::BF16, 0),
        (64, 16, 2, DType::BF16, 0),
        (32, 32, 4, DType::F16, 0),
        (128, 32, 1, DType::F16, 0),
    ];
    let ran = tma_kernel_matches_reference_on_cases(&g, Kernel::Wgmma3Paged, &cases);
    assert!(ran.iter().all(|plan| plan.starts_with("wgmma_3wg_pg ")), "{ran:?}");
    assert_every_case_ran_on_sm90(&g, &ran, cases.len() * TMA_SCHEDULES.len(), "three-warpgroup paged form");
}

/// The CTA pairs over pages of 16 or 32 rows (`wgmma_3wg_x2_pg`): each CTA issues every other
/// column block of each page multicast to both. The sanitizers run over this test.
#[test]
fn three_warpgroup_pair_paged_form_matches_reference_with_block_sizes_16_and_32() {
    let Some(g) = gpu() else { return };
    let cases = [
        (128, 16, 1, DType::BF16, 8),
        (120, 32, 1, DType::BF16, 0),
        (64, 16, 2, DType::BF16, 0),
        (128, 32, 2, DType::BF16, 0),
        (32, 16, 4, DType::F16, 0),
    ];
    let ran = tma_kernel_matches_reference_on_cases(&g, Kernel::Wgmma3Pair, &cases);
    assert!(ran.iter().all(|plan| plan.starts_with("wgmma_3wg_x2_pg ")), "{ran:?}");
    assert_every_case_ran_on_sm90(
        &g,
        &ran,
        cases.len() * TMA_SCHEDULES.len(),
        "three-warpgroup pair paged form",
    );
}

/// Block ids outside the cache on the paged forms (block sizes 16 and 32: a tile holds four or
/// two pages, one of them bad): those pages read zeros and are masked, single CTAs and pairs.
#[test]
fn three_warpgroup_paged_forms_skip_out_of_range_block_ids() {
    let Some(g) = gpu() else { return };
    for (lens, n, bs, kernel) in [
        (&[128, 40][..], 64, 16, Kernel::Wgmma3Paged),
        (&[256, 100][..], 64, 32, Kernel::Wgmma3Paged),
        (&[128, 40][..], 128, 16, Kernel::Wgmma3Pair),
    ] {
        let (c, x, want) = blocks_2_and_5_out_of_range(lens, n, bs);
        for max_parts in [Some(1), Some(3), None] {
            run_gpu(&g, &c, &x, &want, &DecodeOptions { kernel, min_tiles: Some(1), max_parts });
        }
    }
}

/// `kernel` (a 64-row kernel reading whole 64-token pages through the TMA) on
/// [`blocks_2_and_5_out_of_range`] at 64 heads, over one, three and every part.
fn tma_kernel_skips_blocks_2_and_5(g: &Queue, kernel: Kernel) {
    let (c, x, want) = blocks_2_and_5_out_of_range(&[512, 100], 64, 64);
    for max_parts in [Some(1), Some(3), None] {
        run_gpu(g, &c, &x, &want, &DecodeOptions { kernel, min_tiles: Some(1), max_parts });
    }
}

/// A batch of two sequences (the first 8 blocks long) whose first sequence has block ids
/// 2 (-1) and 5 (past the cache) out of range, and the reference: the same batch with those
/// two blocks left out of the first sequence's table and length.
fn blocks_2_and_5_out_of_range(lens: &[i32], n: i64, bs: i64) -> (Case, Inputs, Reference) {
    let mut c = Case::mla(lens, n, bs);
    c.pad = 8;
    let bad_x = inputs(&c);
    assert_eq!(bad_x.mb as usize, 8);
    let mut ref_c = c.clone();
    ref_c.lens[0] -= 2 * bs as i32;
    let mut ref_x = inputs(&c);
    let kept: Vec<f64> = (0..8).filter(|&j| j != 2 && j != 5).map(|j| bad_x.block_table[j]).collect();
    ref_x.block_table[..6].copy_from_slice(&kept);
    ref_x.seq_lens = ref_c.lens.iter().map(|&l| l as f64).collect();
    let want = reference(&ref_c, &ref_x);
    let mut x = inputs(&c);
    x.block_table[2] = -1.0;
    x.block_table[5] = (x.nb + 7) as f64;
    (c, x, want)
}

/// Block ids outside the cache on the seesaw kernel (TMA loads, whole 64-token pages): their
/// pages take no part, as in `out_of_range_block_ids_are_skipped`.
#[test]
fn seesaw_kernel_skips_out_of_range_block_ids() {
    let Some(g) = gpu() else { return };
    tma_kernel_skips_blocks_2_and_5(&g, Kernel::WgmmaSeesaw);
}

#[test]
fn decode_attention_matches_reference_with_two_query_tokens_causal() {
    let Some(g) = gpu() else { return };
    for n in [16, 32, 64, 128] {
        let mut c = Case::mla(&[1, 2, 3, 64, 65, 500, 0], n, 64);
        c.s_q = 2;
        check(&g, &c);
    }
}

#[test]
fn decode_attention_matches_reference_for_mixed_lengths_up_to_32k() {
    let Some(g) = gpu() else { return };
    let c = Case::mla(&[32768, 1, 4000, 0, 129, 16384], 8, 64);
    check(&g, &c);
}

#[test]
fn decode_attention_is_stable_with_peaked_softmax() {
    let Some(g) = gpu() else { return };
    let mut c = Case::mla(&[3000, 70, 5], 16, 16);
    c.scale = 0.6;
    check(&g, &c);
}

#[test]
fn small_ring_kernels_match_reference_for_every_block_size() {
    // The kernels an A100 (164 KB of shared memory per block) runs, forced on this device:
    // 16 rows (mma16s), 32 (mma32s) and 64 (mma64s).
    let Some(g) = gpu() else { return };
    for (n, s_q) in [(16, 1), (16, 2), (128, 1)] {
        for bs in [1, 16, 64, 128] {
            let mut c = Case::mla(&MIXED, n, bs);
            c.s_q = s_q;
            let x = inputs(&c);
            let want = reference(&c, &x);
            let plan =
                run_gpu(&g, &c, &x, &want, &DecodeOptions { kernel: Kernel::MmaSmall, ..Default::default() });
            assert!(plan.is_some_and(|p| p.starts_with("mma") && p.contains("s x")), "small ring kernel ran");
        }
    }
}

#[test]
fn narrow_wgmma_kernel_matches_reference_for_every_block_size_and_row_count() {
    // The transposed wgmma kernel (16 or 32 query rows per CTA, several row blocks beyond
    // 32), cp.async (BS 1, 16) and TMA loads (BS 64, 128), strided views (pad), a peaked
    // softmax.
    let Some(g) = gpu() else { return };
    for (n, s_q) in [(16, 1), (8, 1), (16, 2), (24, 1), (32, 1), (12, 3), (64, 1)] {
        for bs in [1, 16, 64, 128] {
            let mut c = Case::mla(&MIXED, n, bs);
            c.s_q = s_q;
            c.pad = if bs == 16 { 64 } else { 0 };
            c.scale = if bs == 64 { 0.6 } else { c.scale };
            let x = inputs(&c);
            let want = reference(&c, &x);
            let opts = DecodeOptions { kernel: Kernel::WgmmaNarrow, ..Default::default() };
            let Some(plan) = run_gpu(&g, &c, &x, &want, &opts) else { return };
            assert!(plan.starts_with("wgmma_n"), "the narrow kernel ran: {plan}");
        }
    }
}

#[test]
fn every_kernel_and_schedule_computes_the_same_function() {
    let Some(g) = gpu() else { return };
    for (n, s_q) in [(16, 1), (16, 2), (64, 1), (128, 1), (24, 2)] {
        let mut c = Case::mla(&[700, 1, 64, 2000, 0, 129], n, 16);
        c.s_q = s_q;
        let x = inputs(&c);
        let want = reference(&c, &x);
        for kernel in [Kernel::Generic, Kernel::Mma, Kernel::MmaSmall, Kernel::Wgmma, Kernel::WgmmaNarrow] {
            for (min_tiles, max_parts) in
                [(None, None), (Some(1), Some(1)), (Some(1), Some(1000)), (Some(4), None)]
            {
                run_gpu(&g, &c, &x, &want, &DecodeOptions { kernel, min_tiles, max_parts });
            }
        }
    }
}

#[test]
fn decode_attention_f16_and_f32_match_reference() {
    let Some(g) = gpu() else { return };
    for dtype in [DType::F16, DType::F32] {
        let mut c = Case::mla(&[100, 1500, 3], 32, 16);
        c.dtype = dtype;
        check(&g, &c);
    }
}

#[test]
fn decode_attention_handles_strided_views_other_head_dims_and_misalignment() {
    let Some(g) = gpu() else { return };
    // Wider rows than the views (strided q, cache and out): the fast kernels.
    let mut c = Case::mla(&[300, 64, 1], 16, 16);
    c.pad = 64;
    check(&g, &c);
    // q one element off 16-byte alignment: the generic kernel.
    c.q_offset = 1;
    check(&g, &c);
    // Other head dims, s_q = 3: the generic kernel.
    let mut c = Case::mla(&[90, 7, 0, 33], 12, 4);
    c.d = 80;
    c.dv = 48;
    c.s_q = 3;
    c.pad = 5;
    for dtype in [DType::BF16, DType::F32] {
        c.dtype = dtype;
        check(&g, &c);
    }
    // Dv = 601: not a multiple of 4 (the combine's scalar loads) and over two of its 512-column
    // CTAs; one long sequence cut into many parts (its 8-warps-a-row merge).
    let mut c = Case::mla(&[3000], 2, 16);
    c.d = 704;
    c.dv = 601;
    for dtype in [DType::F16, DType::F32] {
        c.dtype = dtype;
        check(&g, &c);
    }
}

/// Block ids outside the cache are skipped (their tokens take no part), on every kernel and
/// with sequences cut over several parts; nothing outside the output changes. The reference
/// is the same batch with those blocks left out of the table.
#[test]
fn out_of_range_block_ids_are_skipped() {
    let Some(g) = gpu() else { return };
    let (c, x, want) = blocks_2_and_5_out_of_range(&[128, 40], 16, 16);
    for kernel in [Kernel::Generic, Kernel::Mma, Kernel::MmaSmall, Kernel::Wgmma, Kernel::WgmmaNarrow] {
        for max_parts in [Some(1), Some(3)] {
            run_gpu(&g, &c, &x, &want, &DecodeOptions { kernel, min_tiles: Some(1), max_parts });
        }
    }
}
