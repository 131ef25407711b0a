//! Tensor parallelism: the per-rank weight split, the host communicator, and TP = N against
//! TP = 1 on every golden and on a scaled-down DeepSeek-V3 layer, through the library
//! (`vt-mla run --tp N` / `vt-mla bench` are tested in crates/vt-mla).
//!
//! Ranks run on the CPU with the host communicator. `MLA_TEST_DEVICE=cuda` runs the same
//! comparisons on CUDA: NCCL when there is a GPU per rank, else the host communicator with
//! several ranks sharing a GPU (which still runs every rank's sharded block on the GPU).

mod common;

use common::{golden_case, CASES};
use mla_block::runner::{run_schedule, RunOptions, Schedule};
use mla_block::tp::{
    bench_decode, check_tp, compare_tp_against, device_count, head_range, rank_dims, run_schedule_tp,
    shard_weights, tp1_reference, Communicator, DecodeBenchOptions, RandomLayerSpec, TpCase, TpGroup,
    TpModel, Transport, ABORTED,
};
use mla_block::{absorb_kv_b_proj, HostTensor, MlaBlock, MlaWeightStore};
use vt_core::{Buffer, DType, Device, DeviceType, Queue, Result, Tensor};
use vt_cpu::HostCommunicator;

/// The device type the tests run on (`MLA_TEST_DEVICE`, default cpu).
fn test_kind() -> DeviceType {
    vt_backends::init();
    match std::env::var("MLA_TEST_DEVICE") {
        Ok(s) => DeviceType::parse(&s).unwrap_or_else(|| panic!("MLA_TEST_DEVICE={s:?} is not cpu/cuda/hip")),
        Err(_) => DeviceType::Cpu,
    }
}

/// `tp` ranks on the test device: NCCL when CUDA has a GPU per rank, else the host
/// communicator.
fn group(tp: usize) -> TpGroup {
    let kind = test_kind();
    let transport =
        if kind == DeviceType::Cuda && device_count(kind) >= tp { Transport::Nccl } else { Transport::Host };
    TpGroup::open(kind, tp, transport).unwrap_or_else(|e| panic!("tp {tp} on {kind}: {e}"))
}

fn f32s(t: &HostTensor) -> Vec<f32> {
    t.to_f64().into_iter().map(|v| v as f32).collect()
}

/// Rows `a..b` of a 2-D host tensor as f32.
fn rows(t: &HostTensor, a: i64, b: i64) -> Vec<f32> {
    let c = t.shape[1] as usize;
    f32s(t)[a as usize * c..b as usize * c].to_vec()
}

#[test]
fn shards_split_heads_column_and_row_parallel_and_replicate_the_rest() {
    for q_lora in [48, 0] {
        let spec = RandomLayerSpec { q_lora_rank: q_lora, ..RandomLayerSpec::SMALL };
        let (cfg, w) = spec.layer(DType::F32, 3).unwrap();
        let d = cfg.dims;
        let (p, r, v, l) = (d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim, d.kv_lora_rank);
        let tp = 4;
        let full_abs = absorb_kv_b_proj(&f32s(w.get("kv_b_proj").unwrap()), &d).unwrap();
        let mut o_cols: Vec<Vec<f32>> = Vec::new();
        for rank in 0..tp {
            let (rc, rw) = shard_weights(&cfg, &w, tp, rank).unwrap();
            let heads = head_range(&d, tp, rank).unwrap();
            let nl = d.num_heads / tp as i64;
            assert_eq!(heads, rank as i64 * nl..(rank as i64 + 1) * nl);
            assert_eq!(rc.dims.num_heads, nl);
            assert_eq!(rc.dims.scale, d.scale, "the softmax scale does not depend on the head count");
            assert_eq!(rc.dims, rank_dims(&d, tp).unwrap());
            // Column-parallel: the rows of the rank's heads.
            let qname = if q_lora > 0 { "q_b_proj" } else { "q_proj" };
            assert_eq!(
                f32s(rw.get(qname).unwrap()),
                rows(w.get(qname).unwrap(), heads.start * (p + r), heads.end * (p + r)),
                "{qname} rank {rank}"
            );
            let kv_b = rw.get("kv_b_proj").unwrap();
            assert_eq!(
                f32s(kv_b),
                rows(w.get("kv_b_proj").unwrap(), heads.start * (p + v), heads.end * (p + v))
            );
            // The absorbed weights of the rank's kv_b_proj are the full absorption's heads.
            let a = absorb_kv_b_proj(&f32s(kv_b), &rc.dims).unwrap();
            let (h0, h1) = (heads.start as usize, heads.end as usize);
            let (pl, lv) = ((p * l) as usize, (l * v) as usize);
            assert_eq!(a.w_uk_t, full_abs.w_uk_t[h0 * pl..h1 * pl]);
            assert_eq!(a.w_uv, full_abs.w_uv[h0 * lv..h1 * lv]);
            // Row-parallel o_proj: the input columns of the rank's heads.
            let o = rw.get("o_proj").unwrap();
            assert_eq!(o.shape, vec![d.hidden_size, nl * v]);
            o_cols.push(f32s(o));
            // Replicated.
            for name in ["q_a_proj", "q_a_layernorm", "kv_a_proj_with_mqa", "kv_a_layernorm"] {
                assert_eq!(rw.get(name).map(|t| &t.bytes), w.get(name).map(|t| &t.bytes), "{name}");
            }
        }
        // Side by side, the ranks' o_proj columns are the full o_proj.
        let cols = (d.num_heads / tp as i64 * v) as usize;
        let full = f32s(w.get("o_proj").unwrap());
        for row in 0..d.hidden_size as usize {
            let joined: Vec<f32> =
                o_cols.iter().flat_map(|c| c[row * cols..(row + 1) * cols].to_vec()).collect();
            assert_eq!(joined, full[row * cols * tp..(row + 1) * cols * tp], "o_proj row {row}");
        }
    }
}

#[test]
fn heads_must_split_evenly_over_the_ranks() {
    let Some(dir) = golden_case("qlora_yarn_neox_bf16") else { return };
    let case = TpCase::from_golden_dir(&dir).unwrap();
    assert_eq!(case.cfg.dims.num_heads, 6);
    let e = check_tp(&case.cfg.dims, 4).unwrap_err().to_string();
    assert!(e.contains("num_attention_heads = 6 is not divisible by tp = 4"), "{e}");
    assert!(check_tp(&case.cfg.dims, 0).unwrap_err().to_string().contains(">= 1"));
    assert!(shard_weights(&case.cfg, &case.weights, 3, 3).unwrap_err().to_string().contains("rank"));
    let e = TpModel::load(&group(4), &case.cfg, &case.weights).err().unwrap().to_string();
    assert!(e.contains("not divisible"), "{e}");
    assert!(TpGroup::open(DeviceType::Cpu, 0, Transport::Auto).unwrap_err().to_string().contains(">= 1"));
}

/// `tp` = N on a GPU backend with fewer than N devices is an error that says how many were
/// found (CI has none).
#[test]
fn nccl_group_names_the_gpus_it_found() {
    vt_backends::init();
    let found = device_count(DeviceType::Cuda);
    let e = TpGroup::open(DeviceType::Cuda, found + 1, Transport::Auto).unwrap_err().to_string();
    assert!(e.contains(&format!("found {found}")), "{e}");
    let e = TpGroup::open(DeviceType::Cpu, 2, Transport::Nccl).unwrap_err().to_string();
    assert!(e.contains("NCCL runs on CUDA"), "{e}");
}

fn schedules(t: i64) -> Vec<(String, RunOptions)> {
    vec![
        (format!("prefill:{t}"), RunOptions { block_size: 64, chunk_workspace_tokens: None }),
        // prefill, chunked context (4-row workspace), decode, prefill over context, decode
        (
            format!("prefill:5,decode:3,prefill:9,decode:{}", t - 17),
            RunOptions { block_size: 16, chunk_workspace_tokens: Some(4) },
        ),
    ]
}

fn check_tp_case(case: &TpCase, tps: &[usize]) {
    let kind = test_kind();
    for (schedule, opts) in schedules(case.t()) {
        let sch: Schedule = schedule.parse().unwrap();
        let tp1 = tp1_reference(case, Device::new(kind, 0), &sch, &opts).unwrap();
        for &tp in tps {
            let g = group(tp);
            let c = compare_tp_against(case, &g, &sch, &opts, tp1.clone())
                .unwrap_or_else(|e| panic!("{} tp {tp}: {e}", case.name));
            eprintln!(
                "tp {:26} {:4} tp {tp} ({}) | {schedule:34} | vs tp1 {:.3e} | vs expected tp1 {} tpN {}",
                case.name,
                case.dtype(),
                g.describe(),
                c.err_vs_tp1,
                c.tp1_vs_expected.map_or("-".into(), |e| format!("{e:.3e}")),
                c.tpn_vs_expected.map_or("-".into(), |e| format!("{e:.3e}")),
            );
            assert!(c.stats.ranks_identical, "{} tp {tp}: ranks ended with different outputs", case.name);
            assert_eq!(c.stats.all_reduces, c.stats.run.forwards);
            assert!(
                c.passed(case),
                "{} tp {tp} {schedule}: vs tp1 {:.3e} (tol {:.0e}), vs expected {:?}",
                case.name,
                c.err_vs_tp1,
                case.tp_tolerance(),
                c.tpn_vs_expected
            );
        }
    }
}

/// Every golden at TP 2 and 4 where the heads split (TP 3 and 6 for the 6-head ones), and
/// one head per rank for the 8-head case.
#[test]
fn tp_matches_tp1_on_every_golden() {
    for name in CASES {
        let Some(dir) = golden_case(name) else { return };
        let case = TpCase::from_golden_dir(&dir).unwrap();
        let n = case.cfg.dims.num_heads as usize;
        let mut tps: Vec<usize> =
            [2, 3, 4].into_iter().filter(|&tp| check_tp(&case.cfg.dims, tp).is_ok()).collect();
        if n >= 6 {
            tps.push(n);
        }
        check_tp_case(&case, &tps);
    }
}

/// DeepSeek-V3.2's sparse goldens at TP 2 and 4: each rank runs the replicated indexer
/// (same selection everywhere) and its heads' sparse attention.
#[test]
fn tp_matches_tp1_on_the_v32_sparse_goldens() {
    for name in ["v32_sparse_f32", "v32_sparse_mscale_bf16"] {
        let Some(dir) = golden_case(name) else { return };
        let case = TpCase::from_golden_dir(&dir).unwrap();
        assert!(case.cfg.dims.is_sparse());
        check_tp_case(&case, &[2, 4]);
    }
}

/// DeepSeek-V3's proportions at a CPU-friendly size (16 heads): TP 2, 4, 8 and 16 (one
/// head per rank) in bf16 and f32, the q_lora and the q_proj branch.
#[test]
fn tp_matches_tp1_on_a_scaled_down_v3_layer() {
    for (dtype, q_lora, tps) in
        [(DType::BF16, 48, &[2usize, 4, 16][..]), (DType::F32, 48, &[2, 8][..]), (DType::BF16, 0, &[4][..])]
    {
        let spec = RandomLayerSpec { q_lora_rank: q_lora, ..RandomLayerSpec::SMALL };
        let case = TpCase::random(&spec, &format!("small_q{q_lora}_{dtype}"), dtype, 2, 20, 11).unwrap();
        check_tp_case(&case, tps);
    }
}

/// A group of one rank (on CUDA: a single-rank NCCL communicator) gives exactly the plain
/// block's bits.
#[test]
fn a_single_rank_group_reproduces_the_plain_block_bit_for_bit() {
    let Some(dir) = golden_case("qlora_yarn_interleave_f32") else { return };
    let case = TpCase::from_golden_dir(&dir).unwrap();
    let g = group(1);
    let q = Queue::new(g.queues()[0].device()).unwrap();
    let store = MlaWeightStore::from_host(&q, &case.cfg, &case.weights).unwrap();
    let block = MlaBlock::new(case.cfg.dims, store.views(), case.cfg.rope.is_neox).unwrap();
    let sch: Schedule = format!("prefill:9,decode:{}", case.t() - 9).parse().unwrap();
    let opts = RunOptions { block_size: 4, chunk_workspace_tokens: None };
    let (plain, _) = run_schedule(&q, &block, &case.hidden, &case.positions, &sch, &opts).unwrap();
    let model = TpModel::load(&g, &case.cfg, &case.weights).unwrap();
    let (tp1, stats) =
        run_schedule_tp(&g, &model.blocks(None).unwrap(), &case.hidden, &case.positions, &sch, &opts)
            .unwrap();
    eprintln!("single rank ({}): {} forwards", g.describe(), stats.run.forwards);
    assert!(plain.bytes == tp1.bytes, "a one-rank group changed the output");
}

/// Each of `n` threads runs `f(rank, queue, comm)` on a CPU queue.
fn on_cpu_ranks<T: Send>(n: usize, f: impl Fn(usize, &Queue, &HostCommunicator) -> T + Sync) -> Vec<T> {
    vt_backends::init();
    let comms = HostCommunicator::group(n).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let f = &f;
                s.spawn(move || f(r, &Queue::new(Device::CPU).unwrap(), c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn host_communicator_sums_every_rank_in_place() {
    for dt in [DType::F32, DType::BF16, DType::F16] {
        let got = on_cpu_ranks(3, |r, q, c| {
            let vals: Vec<f64> = (0..50).map(|i| (i as f64) * 0.25 + r as f64).collect();
            // A middle slice of a bigger buffer: the elements around it must stay untouched.
            let b = Buffer::from_f64(q, dt, &[70], &vec![-7.0; 70]).unwrap();
            let x = b.view().slice(0, 10, 60).unwrap();
            let staged = Buffer::from_f64(q, dt, &[50], &vals).unwrap();
            copy(q, &staged.view(), &x);
            c.all_reduce_sum(q, &x).unwrap();
            b.to_f64(q).unwrap()
        });
        for (r, g) in got.iter().enumerate() {
            for (i, v) in g.iter().enumerate() {
                let want = if (10..60).contains(&i) { 3.0 * ((i - 10) as f64 * 0.25) + 3.0 } else { -7.0 };
                assert_eq!(*v, want, "{dt} rank {r} element {i}");
            }
        }
    }
}

/// Copies a CPU view into another of the same size (test helper; host memory).
fn copy(q: &Queue, src: &Tensor<'_>, dst: &Tensor<'_>) {
    let vals = q.read_f64(src).unwrap();
    let bytes = vt_core::encode_f64(src.dtype(), &vals);
    // SAFETY: CPU views are host memory; `dst` is contiguous and holds `bytes.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.data_addr() as *mut u8, bytes.len()) };
}

#[test]
fn host_communicator_rejects_bad_views_and_mismatched_ranks() {
    let errs = on_cpu_ranks(2, |r, q, c| {
        let b = Buffer::from_f64(q, DType::F32, &[4, 4], &[1.0; 16]).unwrap();
        let strided = b.view().transpose(0, 1).unwrap();
        let e1 = c.all_reduce_sum(q, &strided).unwrap_err().to_string();
        let i = Buffer::from_f64(q, DType::I32, &[4], &[1.0; 4]).unwrap();
        let e2 = c.all_reduce_sum(q, &i.view()).unwrap_err().to_string();
        // Rank 1 reduces fewer elements than rank 0: both ranks get an error naming it.
        let x = b.view().slice(0, 0, 4 - r as i64).unwrap();
        let e3 = c.all_reduce_sum(q, &x).unwrap_err().to_string();
        (e1, e2, e3)
    });
    for (e1, e2, e3) in errs {
        assert!(e1.contains("contiguous"), "{e1}");
        assert!(e2.contains("i32"), "{e2}");
        assert!(
            e3.contains("reduces 16 elements, rank 1 12") || e3.contains("reduces 12 elements, rank 0 16"),
            "{e3}"
        );
    }
}

#[test]
fn an_aborted_group_errors_instead_of_waiting() {
    let res = on_cpu_ranks(3, |r, q, c| {
        let b = Buffer::from_f64(q, DType::F32, &[8], &[1.0; 8]).unwrap();
        if r == 2 {
            c.abort();
            return Ok(());
        }
        c.all_reduce_sum(q, &b.view())
    });
    for r in &res[..2] {
        let e = r.as_ref().unwrap_err().to_string();
        assert!(e.contains(ABORTED), "{e}");
    }
}

/// A communicator that fails on one rank's `k`-th all-reduce.
struct FailingComm {
    inner: HostCommunicator,
    fail_rank: usize,
    fail_at: usize,
    calls: std::sync::atomic::AtomicUsize,
}

impl Communicator for FailingComm {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn transport(&self) -> &'static str {
        "failing"
    }
    fn all_reduce_sum(&self, queue: &Queue, x: &Tensor<'_>) -> Result<()> {
        let k = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.rank() == self.fail_rank && k == self.fail_at {
            return Err(vt_core::Error::other("FailingComm", "injected failure"));
        }
        self.inner.all_reduce_sum(queue, x)
    }
    fn abort(&self) {
        self.inner.abort()
    }
}

/// One rank failing mid-run ends the whole run with that rank's error; the other ranks
/// do not wait for it forever, and the aborted group refuses later runs by name.
#[test]
fn a_failing_rank_ends_the_run_with_its_error() {
    vt_backends::init();
    let (cfg, w) = RandomLayerSpec::SMALL.layer(DType::F32, 5).unwrap();
    let comms: Vec<Box<dyn Communicator>> = HostCommunicator::group(2)
        .unwrap()
        .into_iter()
        .map(|inner| {
            Box::new(FailingComm { inner, fail_rank: 1, fail_at: 2, calls: Default::default() })
                as Box<dyn Communicator>
        })
        .collect();
    let queues = vec![Queue::new(Device::CPU).unwrap(), Queue::new(Device::CPU).unwrap()];
    let g = TpGroup::new(queues, comms).unwrap();
    let model = TpModel::load(&g, &cfg, &w).unwrap();
    let hidden = RandomLayerSpec::SMALL.hidden(1, 8, DType::F32, 1);
    let sch: Schedule = "prefill:4,decode:4".parse().unwrap();
    let run = |g: &TpGroup, model: &TpModel| {
        let pos: Vec<i64> = (0..8).collect();
        run_schedule_tp(g, &model.blocks(None).unwrap(), &hidden, &pos, &sch, &RunOptions::default())
    };
    let e = run(&g, &model).unwrap_err().to_string();
    assert!(e.contains("rank 1") && e.contains("injected failure"), "{e}");
    // The failure aborted the group's communicators: a later run says so at once (instead of
    // every rank failing with the peers' ABORTED, as it did before), and a new group works.
    assert!(g.is_aborted());
    let again = run(&g, &model).unwrap_err().to_string();
    assert!(again.contains("aborted by an earlier failed run") && again.contains("new TpGroup"), "{again}");
    let fresh = group(2);
    assert!(!fresh.is_aborted());
    run(&fresh, &TpModel::load(&fresh, &cfg, &w).unwrap()).unwrap();
}

#[test]
fn decode_bench_runs_at_tp_1_and_2() {
    let (cfg, w) = RandomLayerSpec::SMALL.layer(DType::BF16, 2).unwrap();
    let o = DecodeBenchOptions {
        batch: 3,
        context: 10,
        warmup: 1,
        steps: 2,
        rounds: 2,
        block_size: 4,
        prefill_tokens: 20,
    };
    for tp in [1, 2] {
        let g = group(tp);
        let model = TpModel::load(&g, &cfg, &w).unwrap();
        let r = bench_decode(&g, &model.blocks(None).unwrap(), &o, 9).unwrap();
        eprintln!("bench tp {tp} ({}): {:.3} ms/step", g.describe(), r.ms_per_step);
        assert_eq!(r.tp, tp);
        assert_eq!(r.rounds_ms.len(), 2);
        assert!(r.ms_per_step > 0.0 && r.min_ms_per_step <= r.ms_per_step);
    }
}
