//! IndexerTopK on CUDA against the CPU reference (vt-cpu) on fresh random inputs: decode (one
//! query per sequence) and prefill (causal, many queries per sequence) in varlen batches,
//! contexts up to 32k, block sizes 1/16/64, topk above the visible count (-1 padding) and
//! above the select's one-round capacity (4096), exact ties, DeepSeek-V3.2's dims and odd
//! ones, bf16/f16/f32, strided views, the tensor-core and the generic score kernels forced,
//! and the device-side index checks (out-of-range sequence ids and block ids). Outputs start
//! filled with -7 and the columns past `out`'s view must keep it.
//!
//! Selection is compared exactly (same slots, same order) where the GPU's scores equal the
//! CPU's bit for bit: values on a 1/8 grid (every product and sum of the score is exact in
//! f32, whatever the order: this is what the tensor-core kernel is checked with, and it makes
//! many exact ties), or the generic kernel (the CPU's arithmetic order, any values). With
//! random values the tensor-core kernel's scores differ from the CPU's in rounding (another
//! summation order), so there the check is on the selection itself, against f64 scores: the
//! right count, distinct visible slots, scores non-increasing and no unselected token above
//! the last selected, each within a bound on the f32 rounding. Skips (with a line saying so)
//! without a CUDA device.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use vt_core::{Buffer, DType, IndexerTopKArgs, Queue};
use vt_cuda::indexer_top_k::{indexer_top_k_with, Kernel};

mod common;
use common::{cpu, gpu};

const GARBAGE: f64 = -7.0;

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    h: i64,
    di: i64,
    bs: i64,
    /// Cached tokens per sequence; the last `queries[b]` of sequence b are this call's queries.
    lens: Vec<i64>,
    queries: Vec<i64>,
    topk: i64,
    /// Values on the 1/8 grid in [-1, 1] (exact scores) instead of uniform ones.
    grid: bool,
    /// Every cache row repeats one of this many keys (exact ties); 0: all distinct.
    distinct_keys: usize,
    f32_weights: bool,
    i64_positions: bool,
    /// Extra elements on the rows of query, weights and out; the cache is layer 1 of a
    /// 2-layer pool. A pad of 8 keeps 16-byte rows (tensor cores), 4 does not.
    pad: i64,
    /// Shuffle the query rows (sequences interleaved in the batch) and add a padding query.
    shuffle: bool,
    seed: u64,
}

impl Case {
    fn new(lens: &[i64], queries: &[i64], (h, di): (i64, i64), bs: i64, topk: i64) -> Case {
        Case {
            dtype: DType::BF16,
            h,
            di,
            bs,
            lens: lens.to_vec(),
            queries: queries.to_vec(),
            topk,
            grid: true,
            distinct_keys: 0,
            f32_weights: false,
            i64_positions: false,
            pad: 0,
            shuffle: true,
            seed: 1,
        }
    }
    fn decode(lens: &[i64], dims: (i64, i64), bs: i64, topk: i64) -> Case {
        Case::new(lens, &vec![1; lens.len()], dims, bs, topk)
    }
}

const V32: (i64, i64) = (64, 128);

/// Host inputs (f64, values exact in the dtype).
struct Inputs {
    q: Vec<f64>,
    w: Vec<f64>,
    cache: Vec<f64>,
    table: Vec<f64>,
    seq_ids: Vec<f64>,
    positions: Vec<f64>,
    nb: i64,
    mb: i64,
    t: i64,
}

fn value(rng: &mut ChaCha8Rng, grid: bool) -> f64 {
    if grid {
        rng.gen_range(-8..=8) as f64 / 8.0
    } else {
        rng.gen_range(-1.0..1.0)
    }
}

fn inputs(c: &Case) -> Inputs {
    let mut rng = common::case_rng(c.seed);
    let counts: Vec<i64> = c.lens.iter().map(|&n| (n + c.bs - 1) / c.bs).collect();
    let nb = counts.iter().sum::<i64>().max(1) + 2;
    let mb = counts.iter().copied().max().unwrap_or(0) + 1;
    let mut ids: Vec<i64> = (0..nb).collect();
    ids.shuffle(&mut rng);
    let mut next = ids.into_iter();
    let mut table = Vec::new();
    for &count in &counts {
        for j in 0..mb {
            // Entries past a sequence's blocks hold other valid ids: reading past the end
            // picks up wrong tokens (caught) rather than faulting.
            let id = if j < count { next.next().unwrap_or(0) } else { rng.gen_range(0..nb) };
            table.push(id as f64);
        }
    }
    let (row, pool) = (c.di + c.pad, if c.pad > 0 { 2 } else { 1 });
    let keys: Vec<Vec<f64>> =
        (0..c.distinct_keys).map(|_| (0..c.di).map(|_| value(&mut rng, c.grid)).collect()).collect();
    let mut cache = vec![f64::NAN; (nb * pool * c.bs * row) as usize];
    for blk in 0..nb {
        for r in 0..c.bs {
            let key: Vec<f64> = if keys.is_empty() {
                (0..c.di).map(|_| value(&mut rng, c.grid)).collect()
            } else {
                keys[rng.gen_range(0..keys.len())].clone()
            };
            let at = (((blk * pool + pool - 1) * c.bs + r) * row) as usize;
            cache[at..at + c.di as usize].copy_from_slice(&key);
        }
    }
    let mut rows: Vec<(f64, f64)> = Vec::new();
    for (s, (&len, &nq)) in c.lens.iter().zip(&c.queries).enumerate() {
        for i in 0..nq {
            rows.push((s as f64, (len - nq + i) as f64));
        }
    }
    if c.shuffle {
        rows.shuffle(&mut rng);
        rows.insert(rows.len() / 2, (0.0, -1.0));
    }
    let t = rows.len() as i64;
    let q: Vec<f64> = (0..t * c.h * row).map(|_| value(&mut rng, c.grid)).collect();
    let w: Vec<f64> = (0..t * (c.h + c.pad)).map(|_| value(&mut rng, c.grid)).collect();
    let wdt = if c.f32_weights { DType::F32 } else { c.dtype };
    Inputs {
        q: rounded(c.dtype, &q),
        w: rounded(wdt, &w),
        cache: rounded(c.dtype, &cache),
        table,
        seq_ids: rows.iter().map(|r| r.0).collect(),
        positions: rows.iter().map(|r| r.1).collect(),
        nb,
        mb,
        t,
    }
}

/// `v` rounded to `dt` (what an upload stores), so f64 scores see the op's inputs.
fn rounded(dt: DType, v: &[f64]) -> Vec<f64> {
    let q = cpu();
    Buffer::from_f64(&q, dt, &[v.len() as i64], v).unwrap().to_f64(&q).unwrap()
}

struct Bufs {
    q: Buffer,
    w: Buffer,
    cache: Buffer,
    table: Buffer,
    seq_ids: Buffer,
    positions: Buffer,
    out: Buffer,
}

fn upload(queue: &Queue, c: &Case, x: &Inputs) -> Bufs {
    let put = |dt: DType, v: &[f64]| Buffer::from_f64(queue, dt, &[v.len() as i64], v).unwrap();
    let ow = c.topk + c.pad;
    Bufs {
        q: put(c.dtype, &x.q),
        w: put(if c.f32_weights { DType::F32 } else { c.dtype }, &x.w),
        cache: put(c.dtype, &x.cache),
        table: Buffer::from_f64(queue, DType::I32, &[c.lens.len() as i64, x.mb], &x.table).unwrap(),
        seq_ids: put(DType::I32, &x.seq_ids),
        positions: put(if c.i64_positions { DType::I64 } else { DType::I32 }, &x.positions),
        out: put(DType::I32, &vec![GARBAGE; (x.t * ow) as usize]),
    }
}

fn args<'a>(c: &Case, x: &Inputs, b: &'a Bufs) -> IndexerTopKArgs<'a> {
    let (t, h, di, p) = (x.t, c.h, c.di, c.pad);
    let (row, pool) = (di + p, if p > 0 { 2 } else { 1 });
    IndexerTopKArgs {
        out: b.out.view().as_strided(0, &[t, c.topk], &[c.topk + p, 1]).unwrap(),
        query: b.q.view().as_strided(p / 2, &[t, h, di], &[h * row, row, 1]).unwrap(),
        weights: b.w.view().as_strided(0, &[t, h], &[h + p, 1]).unwrap(),
        cache: b
            .cache
            .view()
            .as_strided((pool - 1) * c.bs * row, &[x.nb, c.bs, di], &[pool * c.bs * row, row, 1])
            .unwrap(),
        block_table: b.table.view(),
        seq_ids: b.seq_ids.view(),
        positions: b.positions.view(),
        scale: 1.0 / (di as f32).sqrt(),
    }
}

/// The CPU reference's selection, `[T, topk]`.
fn reference(c: &Case, x: &Inputs) -> Vec<i64> {
    let q = cpu();
    let b = upload(&q, c, x);
    let a = args(c, x, &b);
    vt_core::indexer_top_k(&q, &a).unwrap();
    q.read_f64(&a.out).unwrap().iter().map(|&v| v as i64).collect()
}

/// Runs the GPU (the op's entry point for `Auto`, else the forced kernel): the selection,
/// `[T, topk]`, after checking the columns past the view kept their fill. `None` when the
/// forced kernel does not apply to the case.
fn run_gpu(g: &Queue, c: &Case, x: &Inputs, kernel: Kernel) -> Option<(Vec<i64>, &'static str)> {
    let b = upload(g, c, x);
    let a = args(c, x, &b);
    let name = if kernel == Kernel::Auto {
        vt_core::indexer_top_k(g, &a).unwrap();
        "auto"
    } else {
        match indexer_top_k_with(g, &a, kernel) {
            Ok(n) => n,
            Err(e) if kernel == Kernel::Mma => {
                println!("tensor-core kernel does not apply: {e}");
                return None;
            }
            Err(e) => panic!("{kernel:?}: {e}"),
        }
    };
    let all = g.read_f64(&b.out.view()).unwrap();
    let ow = (c.topk + c.pad) as usize;
    assert!(
        all.chunks(ow).all(|r| r[c.topk as usize..].iter().all(|&v| v == GARBAGE)),
        "{name}: wrote outside out's view"
    );
    Some((g.read_f64(&a.out).unwrap().iter().map(|&v| v as i64).collect(), name))
}

/// f64 scores of query t over its visible tokens: (slot, score, rounding bound).
fn scores(c: &Case, x: &Inputs, t: usize) -> Vec<(i64, f64, f64)> {
    let (h, di, row) = (c.h as usize, c.di as usize, (c.di + c.pad) as usize);
    let (s, p) = (x.seq_ids[t] as usize, x.positions[t] as i64);
    let pool = if c.pad > 0 { 2 } else { 1 };
    let scale = 1.0 / (c.di as f64).sqrt();
    let mut out = Vec::new();
    for j in 0..=p {
        let blk = x.table[s * x.mb as usize + (j / c.bs) as usize] as i64;
        let at = (((blk * pool + pool - 1) * c.bs + j % c.bs) * row as i64) as usize;
        let k = &x.cache[at..at + di];
        let (mut sum, mut mag) = (0.0, 0.0);
        for hi in 0..h {
            let qa = (t * h + hi) * row + c.pad as usize / 2;
            let qh = &x.q[qa..qa + di];
            let dot: f64 = qh.iter().zip(k).map(|(a, b)| a * b).sum();
            let abs: f64 = qh.iter().zip(k).map(|(a, b)| (a * b).abs()).sum();
            let wh = x.w[t * (h + c.pad as usize) + hi];
            sum += wh * dot.max(0.0);
            mag += wh.abs() * abs;
        }
        // f32 rounding of every partial sum, either order: a few ulps of the magnitude.
        out.push((blk * c.bs + j % c.bs, scale * sum, scale * mag * 5e-5));
    }
    out
}

/// The selection checks that hold whatever the summation order (random values on tensor
/// cores): count, distinct visible slots, order and threshold within rounding.
fn check_selection(c: &Case, x: &Inputs, got: &[i64], name: &str) {
    let k = c.topk as usize;
    for t in 0..x.t as usize {
        let row = &got[t * k..(t + 1) * k];
        if x.positions[t] < 0.0 {
            assert!(row.iter().all(|&v| v == -1), "{name}: padding query {t} got {row:?}");
            continue;
        }
        let sc = scores(c, x, t);
        let n = sc.len().min(k);
        assert!(row[n..].iter().all(|&v| v == -1), "{name}: query {t}: no -1 padding after {n}");
        let mut seen = std::collections::HashSet::new();
        let mut chosen = Vec::with_capacity(n);
        for &slot in &row[..n] {
            assert!(seen.insert(slot), "{name}: query {t}: slot {slot} twice");
            let s = sc.iter().find(|e| e.0 == slot);
            let s = s.unwrap_or_else(|| panic!("{name}: query {t}: slot {slot} is not visible"));
            chosen.push(*s);
        }
        for w in chosen.windows(2) {
            assert!(w[1].1 <= w[0].1 + w[0].2 + w[1].2, "{name}: query {t}: {w:?} out of order");
        }
        if let Some(last) = chosen.last() {
            for e in sc.iter().filter(|e| !seen.contains(&e.0)) {
                assert!(e.1 <= last.1 + last.2 + e.2, "{name}: query {t}: unselected {e:?} above {last:?}");
            }
        }
    }
}

/// The case on the GPU with the op's choice and with each kernel forced; exact against the
/// reference where scores are bit-equal (grid values, or the generic kernel).
fn check(g: &Queue, c: &Case) {
    let x = inputs(c);
    let want = reference(c, &x);
    let visible: i64 = x.positions.iter().map(|&p| (p as i64 + 1).max(0)).sum();
    for kernel in [Kernel::Auto, Kernel::Mma, Kernel::Generic] {
        let Some((got, name)) = run_gpu(g, c, &x, kernel) else { continue };
        let exact = c.grid || kernel == Kernel::Generic || (c.dtype == DType::F32 && kernel == Kernel::Auto);
        if exact {
            if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
                let k = c.topk as usize;
                let t = i / k;
                panic!(
                    "{kernel:?} ({name}): query {t} (seq {}, position {}) column {}: got {}, want {}\n\
                     got  {:?}\nwant {:?}\n{c:?}",
                    x.seq_ids[t],
                    x.positions[t],
                    i % k,
                    got[i],
                    want[i],
                    &got[t * k..(t * k + 24).min((t + 1) * k)],
                    &want[t * k..(t * k + 24).min((t + 1) * k)],
                );
            }
        } else {
            check_selection(c, &x, &got, name);
        }
        println!(
            "{kernel:?} ({name}): {} queries, {visible} (query, token) pairs, topk {}, {}: OK",
            x.t,
            c.topk,
            if exact { "exact" } else { "within rounding" }
        );
    }
}

#[test]
fn decode_deepseek_dims_block_size_64_contexts_to_32k() {
    let Some(g) = gpu() else { return };
    check(&g, &Case::decode(&[1, 70, 200, 2047, 2048, 2049, 5000, 32768], V32, 64, 2048));
}

/// Rows longer than the general select's shared memory holds (48,896 keys on sm_90): the fast
/// select's sampled bound (with 2 distinct keys half the row ties at it: the first positions
/// of those are taken), or for topk above 4096 the general select in rounds (4 distinct keys),
/// reading the workspace.
#[test]
fn decode_rows_longer_than_the_select_shared_memory() {
    let Some(g) = gpu() else { return };
    check(&g, &Case::decode(&[60_000, 50_001, 70], V32, 64, 2048));
    check(&g, &Case { distinct_keys: 2, ..Case::decode(&[60_000], V32, 64, 1000) });
    check(&g, &Case { distinct_keys: 4, ..Case::decode(&[52_000], V32, 64, 5000) });
}

/// The select's fast path: rows of up to 4096 keys take every valid key, longer ones a
/// sampled bound; at the boundary, with every score equal (all of them tie at the bound: the
/// first positions follow those above it), and with few distinct scores at the bound.
#[test]
fn rows_at_the_fast_select_boundary_and_ties_at_its_sampled_bound() {
    let Some(g) = gpu() else { return };
    check(&g, &Case::decode(&[4096, 4097, 4095, 8200], V32, 64, 2048));
    check(&g, &Case { distinct_keys: 1, ..Case::decode(&[20_000, 4097], V32, 64, 2048) });
    check(&g, &Case { distinct_keys: 3, ..Case::decode(&[9000, 30_000], V32, 16, 2048) });
    check(&g, &Case { distinct_keys: 40, grid: false, ..Case::decode(&[12_000], V32, 64, 1500) });
}

/// topk above 2/3 of 4096 on rows longer than 4096 keys takes the general select (no room
/// for the sample's error); at most 4096 on shorter rows, the fast one.
#[test]
fn topk_near_the_select_capacity() {
    let Some(g) = gpu() else { return };
    check(&g, &Case::decode(&[20_000, 4096, 3000], V32, 64, 3000));
    check(&g, &Case::decode(&[4096, 2000], V32, 64, 4096));
}

#[test]
fn decode_block_size_1() {
    let Some(g) = gpu() else { return };
    check(&g, &Case::decode(&[1, 5, 2049, 700, 3000], V32, 1, 2048));
}

#[test]
fn decode_random_values_within_rounding() {
    let Some(g) = gpu() else { return };
    check(&g, &Case { grid: false, seed: 3, ..Case::decode(&[90, 3000, 9000], V32, 64, 2048) });
    check(&g, &Case { grid: false, dtype: DType::F16, seed: 4, ..Case::decode(&[3000, 100], V32, 16, 512) });
}

#[test]
fn prefill_causal_varlen() {
    let Some(g) = gpu() else { return };
    // Whole prompts and a chunk after cached context, interleaved, i64 positions.
    let c = Case { i64_positions: true, ..Case::new(&[300, 520, 64], &[300, 40, 64], V32, 64, 256) };
    check(&g, &c);
    check(&g, &Case { grid: false, seed: 5, ..Case::new(&[400], &[400], V32, 16, 128) });
}

#[test]
fn topk_above_the_visible_count_pads_with_minus_one() {
    let Some(g) = gpu() else { return };
    check(&g, &Case::new(&[10, 100, 0], &[10, 2, 0], V32, 64, 2048));
    check(&g, &Case::new(&[1, 3], &[1, 3], (4, 16), 1, 7));
}

#[test]
fn exact_ties_break_by_lower_position() {
    let Some(g) = gpu() else { return };
    // Three distinct keys: long runs of equal scores, across tiles and blocks.
    check(&g, &Case { distinct_keys: 3, ..Case::new(&[700, 5000], &[3, 2], V32, 64, 1000) });
    check(&g, &Case { distinct_keys: 1, ..Case::decode(&[300], V32, 16, 100) });
    // Random values too (ties bit for bit: identical keys give identical scores).
    check(&g, &Case { distinct_keys: 5, grid: false, ..Case::decode(&[3000], V32, 64, 64) });
}

#[test]
fn topk_above_one_select_round() {
    let Some(g) = gpu() else { return };
    // 4096 per round: 2 and 3 rounds, with ties across the round boundary.
    check(&g, &Case::new(&[10_000, 6000], &[2, 1], V32, 64, 9000));
    check(&g, &Case { distinct_keys: 7, ..Case::decode(&[10_000], V32, 64, 5000) });
}

#[test]
fn strided_views_and_dtypes() {
    let Some(g) = gpu() else { return };
    // Rows padded by 8 (still 16-byte rows: tensor cores) and by 4 (generic), f32 weights.
    check(&g, &Case { pad: 8, f32_weights: true, ..Case::new(&[500, 80], &[2, 3], V32, 64, 300) });
    check(&g, &Case { pad: 4, ..Case::new(&[500, 80], &[2, 3], V32, 16, 300) });
    check(&g, &Case { dtype: DType::F16, f32_weights: true, ..Case::decode(&[1000, 3], V32, 64, 256) });
    // f32: the generic kernel, random values still exact (the CPU's arithmetic order).
    check(&g, &Case { dtype: DType::F32, grid: false, ..Case::decode(&[1000, 3], V32, 64, 256) });
}

#[test]
fn other_head_counts_and_dims() {
    let Some(g) = gpu() else { return };
    // Heads padded to 64 (4, 80), two head passes (128), Di not a multiple of 16 (generic).
    for (dims, bs) in [((4, 16), 16), ((80, 64), 64), ((128, 64), 1), ((3, 40), 16), ((1, 8), 64)] {
        check(&g, &Case::new(&[333, 65], &[3, 65], dims, bs, 100));
    }
}

/// Sequence ids and block ids are device data the contract cannot check on the host: an
/// out-of-range sequence gives an all -1 row, a block id outside the cache hides its tokens.
#[test]
fn out_of_range_ids_on_the_device_are_skipped() {
    let Some(g) = gpu() else { return };
    let c = Case { shuffle: false, ..Case::decode(&[200, 50], V32, 64, 256) };
    let mut x = inputs(&c);
    // Sequence 0's second block id is outside the cache; query 1 names sequence 5.
    x.table[1] = (x.nb + 3) as f64;
    x.seq_ids[1] = 5.0;
    for kernel in [Kernel::Mma, Kernel::Generic] {
        let Some((got, name)) = run_gpu(&g, &c, &x, kernel) else { continue };
        let k = c.topk as usize;
        assert!(got[k..2 * k].iter().all(|&v| v == -1), "{name}: sequence 5 selected {:?}", &got[k..k + 8]);
        // Tokens 64..128 of sequence 0 are hidden: 200 - 64 selected, each a slot of a
        // mapped block, then -1.
        let row = &got[..k];
        let mapped: Vec<i64> = [0usize, 2, 3].iter().map(|&i| x.table[i] as i64).collect();
        assert!(row[..136].iter().all(|&s| mapped.contains(&(s / c.bs))), "{name}: {row:?}");
        assert!(row[136..].iter().all(|&s| s == -1), "{name}: {row:?}");
    }
}

#[test]
fn malformed_arguments_are_errors() {
    let Some(g) = gpu() else { return };
    let c = Case { shuffle: false, ..Case::decode(&[100], V32, 64, 16) };
    let x = inputs(&c);
    let b = upload(&g, &c, &x);
    let good = args(&c, &x, &b);
    let wide = Buffer::from_f64(&g, DType::I64, &[2, 16], &[0.0; 32]).unwrap();
    let bad_out = wide.view();
    let cases: Vec<(&str, IndexerTopKArgs<'_>)> = vec![
        ("out", IndexerTopKArgs { out: bad_out, ..good }),
        ("out", IndexerTopKArgs { out: b.out.view().as_strided(0, &[1, 0], &[16, 1]).unwrap(), ..good }),
        ("cache", IndexerTopKArgs { cache: good.cache.slice(2, 0, 64).unwrap(), ..good }),
        ("weights", IndexerTopKArgs { weights: good.weights.slice(1, 0, 32).unwrap(), ..good }),
        ("scale", IndexerTopKArgs { scale: 0.0, ..good }),
        // Positions in the query's dtype (bf16), not i32/i64.
        ("positions", IndexerTopKArgs { positions: b.q.view().as_strided(0, &[1], &[1]).unwrap(), ..good }),
        ("seq_ids", IndexerTopKArgs { seq_ids: b.table.view().as_strided(0, &[2], &[1]).unwrap(), ..good }),
    ];
    for (field, a) in cases {
        let e = vt_core::indexer_top_k(&g, &a).expect_err(field).to_string();
        assert!(e.contains("IndexerTopK") && e.contains(field), "{field}: {e}");
    }
}

/// After a first call (modules loaded, workspace sized), the op captures into a CUDA graph
/// (no allocation, no host sync) and the replay selects what an eager call does, also after
/// new inputs are written into the same buffers; a later, larger call grows the workspace
/// without invalidating the graph.
#[test]
fn a_captured_call_replays_the_eager_selection() {
    let Some(g) = gpu() else { return };
    let c = Case { shuffle: false, ..Case::new(&[3000, 700], &[4, 2], V32, 64, 512) };
    let x = inputs(&c);
    let b = upload(&g, &c, &x);
    let a = args(&c, &x, &b);
    vt_core::indexer_top_k(&g, &a).unwrap();
    let want = b.out.to_bytes(&g).unwrap();
    b.out.fill_pattern(&g, &(GARBAGE as i32).to_le_bytes()).unwrap();
    let graph = g.capture(|| vt_core::indexer_top_k(&g, &a)).unwrap();
    graph.launch().unwrap();
    assert_eq!(b.out.to_bytes(&g).unwrap(), want, "replay differs from the eager call");
    // New queries in the same buffer: the replay follows them.
    let x2 = inputs(&Case { seed: 9, ..c.clone() });
    b.q.write_bytes(&g, &vt_core::encode_f64(c.dtype, &x2.q)).unwrap();
    graph.launch().unwrap();
    let replayed = b.out.to_bytes(&g).unwrap();
    vt_core::indexer_top_k(&g, &a).unwrap();
    assert_eq!(replayed, b.out.to_bytes(&g).unwrap(), "replay after new inputs differs");
    // A larger call grows the workspace; the graph keeps its own (retired, not freed).
    let big = Case { shuffle: false, ..Case::decode(&[40_000, 9000], V32, 64, 64) };
    let xb = inputs(&big);
    let bb = upload(&g, &big, &xb);
    vt_core::indexer_top_k(&g, &args(&big, &xb, &bb)).unwrap();
    graph.launch().unwrap();
    assert_eq!(b.out.to_bytes(&g).unwrap(), replayed, "replay after the workspace grew differs");
}
