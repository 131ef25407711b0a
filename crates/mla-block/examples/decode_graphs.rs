//! An engine's decode loop over `DecodeGraphs` (docs/engine.md, section 4): random layers,
//! one cache allocator for all of them, sequences that arrive (prefilled eagerly) and
//! finish between decode steps, every decode step padded to its batch-size bucket and
//! replayed from that bucket's CUDA graph. On a device whose queues cannot capture (the CPU,
//! HIP) the same loop runs every step eagerly and says so.
//!
//! ```text
//! cargo run --release -p mla-block --example decode_graphs                 # best device
//! cargo run --release -p mla-block --example decode_graphs -- cpu small 2  # DEVICE LAYER LAYERS
//! cargo run --release -p mla-block --example decode_graphs -- cuda v3 4
//! ```
//!
//! LAYER is `small` (default) or `v3` (DeepSeek-V3's sizes); LAYERS the number of layers (2).

use std::process::ExitCode;
use std::time::Instant;

use mla_block::layers::forward_layers;
use mla_block::tp::RandomLayerSpec;
use mla_block::{
    DecodeGraphConfig, DecodeGraphs, LayeredKvCache, MlaBatchMetadata, MlaBlock, MlaLimits, MlaWeightStore,
    MlaWorkspace, SeqId, StepMode, StepSeq,
};
use vt_core::{Buffer, DType, Device, DeviceType, Queue, Result};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let kind = match args.first().map(|s| s.as_str()) {
        None | Some("auto") => None,
        Some(s) => match DeviceType::parse(s) {
            Some(k) => Some(k),
            None => {
                eprintln!("usage: decode_graphs [auto|cpu|cuda|hip] [small|v3] [LAYERS]");
                return ExitCode::from(2);
            }
        },
    };
    let spec = match args.get(1).map(|s| s.as_str()) {
        None | Some("small") => RandomLayerSpec::SMALL_FP8,
        Some("v3") => RandomLayerSpec::DEEPSEEK_V3,
        Some(other) => {
            eprintln!("decode_graphs: unknown layer `{other}` (small or v3)");
            return ExitCode::from(2);
        }
    };
    let layers = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2usize).max(1);
    match run(kind, spec, layers) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("decode_graphs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(kind: Option<DeviceType>, spec: RandomLayerSpec, layers: usize) -> Result<()> {
    vt_backends::init();
    let kind = kind.unwrap_or_else(vt_backends::best_device);
    let q = Queue::new(Device::new(kind, 0))?;
    let dt = DType::BF16;

    // 1. The layers (random weights here; `MlaWeightStore::from_checkpoint` in an engine).
    let stores = (0..layers)
        .map(|i| {
            let (cfg, w) = spec.layer(dt, i as u64)?;
            MlaWeightStore::from_host(&q, &cfg, &w)
        })
        .collect::<Result<Vec<_>>>()?;
    let cfg = spec.config()?;
    let blocks = stores
        .iter()
        .map(|s| MlaBlock::new(cfg.dims, s.views(), cfg.rope.is_neox))
        .collect::<Result<Vec<_>>>()?;
    let h = cfg.dims.hidden_size;

    // 2. One cache allocator for all layers: up to 16 sequences of up to 256 tokens.
    let (bs, max_len, max_live) = (64, 256, 16);
    let max_blocks = max_len / bs;
    let mut cache =
        LayeredKvCache::new(&q, dt, layers as i64, max_live * max_blocks, bs, cfg.dims.cache_row_dim())?;

    // 3. The decode graphs: one per bucket, captured now (largest first).
    let t0 = Instant::now();
    let mut graphs = DecodeGraphs::new(
        &q,
        &blocks,
        &cache,
        DecodeGraphConfig::new(max_blocks).with_buckets(&[1, 2, 4, 8, 16]),
    )?;
    match graphs.mode() {
        StepMode::Graph => println!(
            "{kind}: captured {} decode graphs of {layers} layers (buckets {:?}) in {:.0} ms",
            graphs.buckets().len(),
            graphs.buckets(),
            t0.elapsed().as_secs_f64() * 1e3
        ),
        StepMode::Eager { why } => println!("{kind}: no graphs, every decode step runs eagerly: {why}"),
    }

    // Prefill steps run eagerly, with the engine's own workspace and buffers.
    let prompt = 48;
    let rows = max_live * prompt;
    let mut ws = MlaWorkspace::new(MlaLimits {
        max_tokens: rows,
        max_seqs: max_live,
        max_blocks_per_seq: max_blocks,
        chunk_workspace_tokens: rows,
    })?;
    let [x, s0, s1, y] = [0; 4].map(|_| Buffer::zeros(&q, dt, &[rows, h]));
    let (x, s0, s1, y) = (x?, s0?, s1?, y?);
    let mut meta = MlaBatchMetadata::default();
    let mut live: Vec<SeqId> = Vec::new();
    let mut step_us = Vec::new();

    for step in 0..48 {
        // Sequences finish (at the longest length, or now and then) ...
        let mut kept = Vec::with_capacity(live.len());
        for (i, &s) in live.iter().enumerate() {
            if cache.seq_len(s)? + 1 >= max_len || (step % 7 == 3 && i % 3 == 0) {
                cache.free_sequence(s)?;
            } else {
                kept.push(s);
            }
        }
        live = kept;
        // ... and new ones arrive: one prefill step for all of them.
        let arriving = if step % 5 == 0 { (max_live as usize - live.len()).min(3 + step % 4) } else { 0 };
        if arriving > 0 {
            let new: Vec<SeqId> = (0..arriving).map(|_| cache.add_sequence()).collect();
            let pos: Vec<i64> = (0..prompt).collect();
            let parts: Vec<StepSeq<'_>> =
                new.iter().map(|&seq| StepSeq { seq, positions: &pos, decode: false }).collect();
            meta.plan(&mut cache, &parts, rows)?;
            let t = meta.num_tokens();
            let (xv, av, bv, yv) = (
                x.view().slice(0, 0, t)?,
                s0.view().slice(0, 0, t)?,
                s1.view().slice(0, 0, t)?,
                y.view().slice(0, 0, t)?,
            );
            forward_layers(&q, &blocks, &mut ws, &meta, &cache, &xv, [&av, &bv], &yv)?;
            live.extend(new);
        }
        // A decode step of every live sequence: plan, prepare (pad + upload), write the
        // hidden rows, replay.
        let t1 = Instant::now();
        let pos: Vec<[i64; 1]> =
            live.iter().map(|&s| cache.seq_len(s).map(|n| [n])).collect::<Result<_>>()?;
        let parts: Vec<StepSeq<'_>> =
            live.iter().zip(&pos).map(|(&seq, p)| StepSeq { seq, positions: p, decode: true }).collect();
        meta.plan(&mut cache, &parts, 1)?;
        let b = graphs.prepare(&meta)?;
        let hidden = spec.hidden(1, b, dt, step as u64).bytes;
        q.write_bytes(&graphs.input()?, &hidden)?;
        graphs.run(&cache)?;
        let out = q.read_f64(&graphs.output()?)?; // synchronizes: a real engine would not
        step_us.push(t1.elapsed().as_secs_f64() * 1e6);
        if !out.iter().all(|v| v.is_finite()) {
            return Err(vt_core::Error::other("decode_graphs", format!("step {step}: non-finite output")));
        }
        if step % 8 == 0 {
            let (_, bucket) = graphs.prepared_rows().unwrap_or((b, b));
            println!(
                "step {step:2}: {b:2} sequences in bucket {bucket:2}, free blocks {}",
                cache.free_blocks()
            );
        }
    }
    step_us.sort_by(f64::total_cmp);
    println!(
        "48 decode steps of {layers} layers: median {:.0} us per step (plan + prepare + run + read-back)",
        step_us[step_us.len() / 2]
    );
    Ok(())
}
