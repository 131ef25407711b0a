//! Per-op timing of a block forward through the op registry: every op implementation of a
//! backend is re-registered wrapped in a timer (once per device type, for the rest of the
//! process). The wrapper passes calls straight through unless the calling thread is inside
//! [`profile`]; there, each launch is issued once (the forward's own call), then the queue is
//! synchronized and the same launch is rerun `op_iters` times back to back between two
//! synchronizations: its time is that span over `op_iters`. Only the profiling thread's
//! calls are timed, so other threads running ops at the same time are unaffected.
//!
//! Reruns repeat in-place ops (RmsNorm on q_c, RopeFromCache on q_pe) on their own output:
//! the values change, their finiteness and the work do not, so time the forward for its
//! output elsewhere (`bench_prefill` runs clean forwards for the total and the output check).
//!
//! [`profile_events`] instead records a queue event before and after each launch (the
//! forward runs once, unchanged): device time per launch without reruns or synchronizations,
//! which `vt-mla bench --graph` uses for a decode step. Issue it while the device is busy
//! with earlier work, so the launches queue up and run back to back: each pair of events
//! then brackets the op's device time alone, not the host's launch latency.

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mla_block::MlaBlockDims;
use vt_core::registry::register_op;
use vt_core::{op_registered, DeviceType, Error, Event, OpId, OpImpl, Queue, Result};

/// What a launch is, as far as naming it goes (see [`label`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `MatmulBT` with a weight `b` of `[rows, k]`.
    Matmul { rows: i64, k: i64 },
    /// `PrefillAttention`, causal or not.
    Attention { causal: bool },
    /// `BatchedMatmul` with a weight `b` of `[batch, k, n]`.
    Bmm { k: i64, n: i64 },
    /// `ConcatMlaNopeRope` writing rows of `width` per head.
    Concat { width: i64 },
    /// Any other op.
    Op(OpId),
}

/// The name of a launch in the block's prefill forward: GEMMs by their weight (checked
/// against the block's dims), attention as `attention` (causal, the new tokens) or
/// `attention (ctx)` (non-causal, a context chunk); `seen` counts earlier launches of the
/// same base name in this forward, which tells the context's `kv_b_proj` and `concat_k`
/// (every launch after the first: the block up-projects the new tokens first) from the
/// new tokens'.
pub fn label(d: &MlaBlockDims, call: Call, seen: usize) -> String {
    let (h, n, ql) = (d.hidden_size, d.num_heads, d.q_lora_rank);
    let (l, p, r, v) = (d.kv_lora_rank, d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim);
    let ctx = |base: &str| if seen == 0 { base.to_string() } else { format!("{base} (ctx)") };
    match call {
        Call::Matmul { rows, k } => {
            let named = [
                ((ql, h), "q_a_proj"),
                ((ql + l + r, h), "qkv_a_proj (merged)"),
                ((l + r, h), "kv_a_proj"),
                ((l, h), "kv_a_proj"),
                ((r, h), "kv_a_proj"),
                ((n * (p + r), ql), "q_b_proj"),
                ((n * (p + r), h), "q_proj"),
                ((h, n * v), "o_proj"),
            ];
            if (rows, k) == (n * (p + v), l) {
                return ctx("kv_b_proj");
            }
            // DeepSeek-V3.2's indexer projections (after the block's own, which win a tie).
            let indexer = d.indexer.map_or(Vec::new(), |ix| {
                vec![
                    ((ix.n_heads * ix.head_dim, ql), "indexer.wq_b"),
                    ((ix.head_dim, h), "indexer.wk"),
                    ((ix.n_heads, h), "indexer.weights_proj"),
                ]
            });
            match named.iter().chain(&indexer).find(|((a, b), _)| (*a, *b) == (rows, k) && *a > 0) {
                Some((_, name)) => name.to_string(),
                None => format!("MatmulBT [{rows}, {k}]"),
            }
        }
        Call::Bmm { k, n } if (k, n) == (p, l) => "q_absorb (bmm)".into(),
        Call::Bmm { k, n } if (k, n) == (l, v) => "v_up (bmm)".into(),
        Call::Bmm { k, n } => format!("BatchedMatmul [{k}, {n}]"),
        // The decode step's latent query [B, N, L+R]; the prefill key is [T, N, P+R].
        Call::Concat { width } if width == l + r && width != p + r => "concat_q".into(),
        Call::Concat { .. } => ctx("concat_k"),
        Call::Attention { causal: true } => "attention".into(),
        Call::Attention { causal: false } => "attention (ctx)".into(),
        Call::Op(op) => match op {
            OpId::RmsNorm => "rms_norm".into(),
            OpId::FusedNormRope => "kv_norm_rope".into(),
            OpId::RopeFromCache => "rope".into(),
            OpId::ConcatAndCacheMla => "cache_write".into(),
            OpId::ConcatMlaNopeRope => ctx("concat_k"),
            OpId::GatherMlaCache => "gather_ctx".into(),
            OpId::MergeAttnStates => "merge".into(),
            OpId::MlaDecodeAttention => "decode_attention".into(),
            other => other.name().into(),
        },
    }
}

/// The base name `label` counts occurrences under (`kv_b_proj`, `concat_k`, else the label).
fn base(call: Call, d: &MlaBlockDims) -> String {
    match call {
        Call::Matmul { rows, k }
            if (rows, k) == (d.num_heads * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank) =>
        {
            "kv_b_proj".into()
        }
        Call::Op(OpId::ConcatMlaNopeRope) => "concat_k".into(),
        Call::Concat { .. } if label(d, call, 0) == "concat_k" => "concat_k".into(),
        other => label(d, other, 0),
    }
}

/// How the launches of a profiled forward are timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Each launch rerun `n` times between two synchronizations.
    Rerun(usize),
    /// An event before and after each launch.
    Events,
}

struct Recording {
    dims: MlaBlockDims,
    mode: Mode,
    calls: Vec<(String, f64)>,
    events: Vec<(String, Event, Event)>,
    seen: Vec<(String, usize)>,
}

impl Recording {
    fn new(dims: &MlaBlockDims, mode: Mode) -> Recording {
        Recording { dims: *dims, mode, calls: Vec::new(), events: Vec::new(), seen: Vec::new() }
    }

    /// The label of the next launch of `call` (counting earlier launches of its base name).
    fn name(&mut self, call: Call) -> String {
        let b = base(call, &self.dims);
        let seen = match self.seen.iter_mut().find(|(name, _)| *name == b) {
            Some((_, c)) => {
                *c += 1;
                *c - 1
            }
            None => {
                self.seen.push((b, 1));
                0
            }
        };
        label(&self.dims, call, seen)
    }
}

thread_local! {
    static REC: RefCell<Option<Recording>> = const { RefCell::new(None) };
}

static INSTALLED: Mutex<Option<HashSet<DeviceType>>> = Mutex::new(None);

fn timed(q: &Queue, call: Call, run: impl Fn() -> Result<()>) -> Result<()> {
    let Some(mode) = REC.with(|r| r.borrow().as_ref().map(|rec| rec.mode)) else {
        return run();
    };
    match mode {
        Mode::Rerun(n) => {
            run()?;
            q.synchronize()?;
            let t0 = Instant::now();
            for _ in 0..n {
                run()?;
            }
            q.synchronize()?;
            let ms = t0.elapsed().as_secs_f64() * 1e3 / n as f64;
            REC.with(|r| {
                if let Some(rec) = r.borrow_mut().as_mut() {
                    let name = rec.name(call);
                    rec.calls.push((name, ms));
                }
            });
        }
        Mode::Events => {
            let before = q.record_event()?;
            run()?;
            let after = q.record_event()?;
            REC.with(|r| {
                if let Some(rec) = r.borrow_mut().as_mut() {
                    let name = rec.name(call);
                    rec.events.push((name, before, after));
                }
            });
        }
    }
    Ok(())
}

fn wrap(imp: OpImpl) -> OpImpl {
    match imp {
        OpImpl::MatmulBT(f) => OpImpl::MatmulBT(Arc::new(move |q: &Queue, a: &vt_core::MatmulBTArgs<'_>| {
            timed(q, Call::Matmul { rows: a.b.dim(0), k: a.b.dim(1) }, || f(q, a))
        })),
        OpImpl::PrefillAttention(f) => {
            OpImpl::PrefillAttention(Arc::new(move |q: &Queue, a: &vt_core::PrefillAttentionArgs<'_>| {
                timed(q, Call::Attention { causal: a.causal }, || f(q, a))
            }))
        }
        OpImpl::BatchedMatmul(f) => {
            OpImpl::BatchedMatmul(Arc::new(move |q: &Queue, a: &vt_core::BatchedMatmulArgs<'_>| {
                timed(q, Call::Bmm { k: a.b.dim(1), n: a.b.dim(2) }, || f(q, a))
            }))
        }
        OpImpl::RmsNorm(f) => OpImpl::RmsNorm(Arc::new(move |q: &Queue, a: &vt_core::RmsNormArgs<'_>| {
            timed(q, Call::Op(OpId::RmsNorm), || f(q, a))
        })),
        OpImpl::RopeFromCache(f) => {
            OpImpl::RopeFromCache(Arc::new(move |q: &Queue, a: &vt_core::RopeFromCacheArgs<'_>| {
                timed(q, Call::Op(OpId::RopeFromCache), || f(q, a))
            }))
        }
        OpImpl::FusedNormRope(f) => {
            OpImpl::FusedNormRope(Arc::new(move |q: &Queue, a: &vt_core::FusedNormRopeArgs<'_>| {
                timed(q, Call::Op(OpId::FusedNormRope), || f(q, a))
            }))
        }
        OpImpl::ConcatAndCacheMla(f) => {
            OpImpl::ConcatAndCacheMla(Arc::new(move |q: &Queue, a: &vt_core::ConcatAndCacheMlaArgs<'_>| {
                timed(q, Call::Op(OpId::ConcatAndCacheMla), || f(q, a))
            }))
        }
        OpImpl::GatherMlaCache(f) => {
            OpImpl::GatherMlaCache(Arc::new(move |q: &Queue, a: &vt_core::GatherMlaCacheArgs<'_>| {
                timed(q, Call::Op(OpId::GatherMlaCache), || f(q, a))
            }))
        }
        OpImpl::ConcatMlaNopeRope(f) => {
            OpImpl::ConcatMlaNopeRope(Arc::new(move |q: &Queue, a: &vt_core::ConcatMlaNopeRopeArgs<'_>| {
                timed(q, Call::Concat { width: a.out.dim(a.out.rank() - 1) }, || f(q, a))
            }))
        }
        OpImpl::MlaDecodeAttention(f) => {
            OpImpl::MlaDecodeAttention(Arc::new(move |q: &Queue, a: &vt_core::MlaDecodeAttentionArgs<'_>| {
                timed(q, Call::Op(OpId::MlaDecodeAttention), || f(q, a))
            }))
        }
        OpImpl::MergeAttnStates(f) => {
            OpImpl::MergeAttnStates(Arc::new(move |q: &Queue, a: &vt_core::MergeAttnStatesArgs<'_>| {
                timed(q, Call::Op(OpId::MergeAttnStates), || f(q, a))
            }))
        }
        OpImpl::MatmulBTFp8(f) => {
            OpImpl::MatmulBTFp8(Arc::new(move |q: &Queue, a: &vt_core::MatmulBTFp8Args<'_>| {
                timed(q, Call::Matmul { rows: a.b.dim(0), k: a.b.dim(1) }, || f(q, a))
            }))
        }
        OpImpl::BatchedMatmulFp8(f) => {
            OpImpl::BatchedMatmulFp8(Arc::new(move |q: &Queue, a: &vt_core::BatchedMatmulFp8Args<'_>| {
                // `b` is `[G, K, N]` as for BatchedMatmul: the absorbed weights get their names.
                timed(q, Call::Bmm { k: a.b.dim(1), n: a.b.dim(2) }, || f(q, a))
            }))
        }
        OpImpl::QuantizeFp8(f) => {
            OpImpl::QuantizeFp8(Arc::new(move |q: &Queue, a: &vt_core::QuantizeFp8Args<'_>| {
                timed(q, Call::Op(OpId::QuantizeFp8), || f(q, a))
            }))
        }
        OpImpl::SparseMlaAttention(f) => {
            OpImpl::SparseMlaAttention(Arc::new(move |q: &Queue, a: &vt_core::SparseMlaAttentionArgs<'_>| {
                timed(q, Call::Op(OpId::SparseMlaAttention), || f(q, a))
            }))
        }
        OpImpl::IndexerTopK(f) => {
            OpImpl::IndexerTopK(Arc::new(move |q: &Queue, a: &vt_core::IndexerTopKArgs<'_>| {
                timed(q, Call::Op(OpId::IndexerTopK), || f(q, a))
            }))
        }
        OpImpl::CacheIndexerKeys(f) => {
            OpImpl::CacheIndexerKeys(Arc::new(move |q: &Queue, a: &vt_core::CacheIndexerKeysArgs<'_>| {
                timed(q, Call::Op(OpId::CacheIndexerKeys), || f(q, a))
            }))
        }
        OpImpl::LayerNorm(f) => {
            OpImpl::LayerNorm(Arc::new(move |q: &Queue, a: &vt_core::LayerNormArgs<'_>| {
                timed(q, Call::Op(OpId::LayerNorm), || f(q, a))
            }))
        }
    }
}

/// The op implementations the backend of `kind` registers (its public op lists).
fn backend_ops(kind: DeviceType) -> Result<Vec<OpImpl>> {
    match kind {
        DeviceType::Cpu => Ok(vt_cpu::op_table()),
        #[cfg(feature = "cuda")]
        DeviceType::Cuda => Ok(vt_cuda::kernel_ops().into_iter().chain(vt_cuda::cublas_ops()).collect()),
        #[cfg(feature = "hip")]
        DeviceType::Hip => Ok(vt_hip::kernel_ops().into_iter().chain(vt_hip::gemm_ops()).collect()),
        #[allow(unreachable_patterns)] // every arm above is compiled in with both features
        other => {
            Err(Error::other("vt-mla bench-prefill", format!("no per-op timing for {other} in this build")))
        }
    }
}

/// Wraps every op registered on `kind` in the timer (once per device type; later calls do
/// nothing). Only ops already registered there are replaced.
pub fn install(kind: DeviceType) -> Result<()> {
    let mut guard = INSTALLED.lock().map_err(|_| Error::other("op_timer", "a profiling thread panicked"))?;
    let done = guard.get_or_insert_with(HashSet::new);
    if done.contains(&kind) {
        return Ok(());
    }
    for imp in backend_ops(kind)? {
        if op_registered(imp.id(), kind) {
            register_op(kind, wrap(imp));
        }
    }
    done.insert(kind);
    Ok(())
}

/// Runs `f` (one forward) with this thread's launches timed (see the module docs; call
/// [`install`] for the device first) and returns each launch's name (see [`label`]) and
/// milliseconds, in launch order.
pub fn profile(
    dims: &MlaBlockDims,
    op_iters: usize,
    f: impl FnOnce() -> Result<()>,
) -> Result<Vec<(String, f64)>> {
    REC.with(|r| *r.borrow_mut() = Some(Recording::new(dims, Mode::Rerun(op_iters.max(1)))));
    let res = f();
    let rec = REC.with(|r| r.borrow_mut().take());
    res?;
    Ok(rec.map(|r| r.calls).unwrap_or_default())
}

/// One launch timed by [`profile_events`].
#[derive(Clone, Debug, PartialEq)]
pub struct EventTiming {
    pub name: String,
    /// Device milliseconds from the event before the launch to the one after it.
    pub ms: f64,
    /// Milliseconds from the previous launch's closing event to this one's opening event (0
    /// for the first): the device's gap between the two launches.
    pub gap_ms: f64,
}

/// Runs `f` (one forward, its launches issued once and unchanged) with an event recorded on
/// the launch's queue before and after each of this thread's launches (see the module docs;
/// call [`install`] for the device first), then waits for the events and returns each
/// launch's name (see [`label`]), device time and the gap before it, in launch order.
pub fn profile_events(dims: &MlaBlockDims, f: impl FnOnce() -> Result<()>) -> Result<Vec<EventTiming>> {
    REC.with(|r| *r.borrow_mut() = Some(Recording::new(dims, Mode::Events)));
    let res = f();
    let rec = REC.with(|r| r.borrow_mut().take());
    res?;
    let Some(rec) = rec else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(rec.events.len());
    let mut prev: Option<&Event> = None;
    for (name, a, b) in &rec.events {
        let gap_ms = match prev {
            Some(p) => p.elapsed_ms(a)?,
            None => 0.0,
        };
        out.push(EventTiming { name: name.clone(), ms: a.elapsed_ms(b)?, gap_ms });
        prev = Some(b);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mla_block::tp::RandomLayerSpec;

    fn v3() -> MlaBlockDims {
        RandomLayerSpec::DEEPSEEK_V3.config().map(|c| c.dims).expect("v3 config")
    }

    #[test]
    fn gemms_are_named_by_their_weight() {
        let d = v3();
        let m = |rows, k| label(&d, Call::Matmul { rows, k }, 0);
        assert_eq!(m(1536, 7168), "q_a_proj");
        assert_eq!(m(2112, 7168), "qkv_a_proj (merged)");
        assert_eq!(m(576, 7168), "kv_a_proj");
        assert_eq!(m(512, 7168), "kv_a_proj");
        assert_eq!(m(64, 7168), "kv_a_proj");
        assert_eq!(m(128 * 192, 1536), "q_b_proj");
        assert_eq!(m(128 * 256, 512), "kv_b_proj");
        assert_eq!(label(&d, Call::Matmul { rows: 128 * 256, k: 512 }, 1), "kv_b_proj (ctx)");
        assert_eq!(m(7168, 128 * 128), "o_proj");
        assert_eq!(m(3, 5), "MatmulBT [3, 5]");
    }

    #[test]
    fn other_ops_and_context_launches_are_named() {
        let d = v3();
        assert_eq!(label(&d, Call::Attention { causal: true }, 0), "attention");
        assert_eq!(label(&d, Call::Attention { causal: false }, 3), "attention (ctx)");
        assert_eq!(label(&d, Call::Op(OpId::ConcatMlaNopeRope), 0), "concat_k");
        assert_eq!(label(&d, Call::Op(OpId::ConcatMlaNopeRope), 2), "concat_k (ctx)");
        assert_eq!(label(&d, Call::Op(OpId::FusedNormRope), 0), "kv_norm_rope");
        assert_eq!(base(Call::Matmul { rows: 128 * 256, k: 512 }, &d), "kv_b_proj");
    }

    #[test]
    fn decode_launches_are_named() {
        let d = v3();
        assert_eq!(label(&d, Call::Bmm { k: 128, n: 512 }, 0), "q_absorb (bmm)");
        assert_eq!(label(&d, Call::Bmm { k: 512, n: 128 }, 0), "v_up (bmm)");
        assert_eq!(label(&d, Call::Bmm { k: 3, n: 4 }, 0), "BatchedMatmul [3, 4]");
        // The decode step's latent query [B, N, 576]; the prefill key [T, N, 192].
        assert_eq!(label(&d, Call::Concat { width: 576 }, 0), "concat_q");
        assert_eq!(base(Call::Concat { width: 576 }, &d), "concat_q");
        assert_eq!(label(&d, Call::Concat { width: 192 }, 0), "concat_k");
        assert_eq!(label(&d, Call::Concat { width: 192 }, 1), "concat_k (ctx)");
        assert_eq!(base(Call::Concat { width: 192 }, &d), "concat_k");
        assert_eq!(label(&d, Call::Op(OpId::MlaDecodeAttention), 0), "decode_attention");
    }
}
