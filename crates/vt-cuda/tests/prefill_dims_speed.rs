//! Speed of PrefillAttention at the non-MLA head dims of its fast paths, (qk, v) = (128, 128)
//! and (64, 64), and of the mma.sync kernel forced on this device, beside the MLA shape
//! (192, 128): single causal sequences of T = 4096 and 8192 at 128 heads and a chunk of 4096
//! queries over 16384 keys (non-causal, with lse). bf16, contiguous q/k/v, L2 flushed before
//! each run, median of CUDA-event times; FLOPs = 2 x visible pairs x heads x (qk + v). The
//! peer for the same shapes is `tools/peers/sdpa_dims.py` (torch SDPA, cuDNN), run in the
//! same device call; this test prints ours only.
//!
//! Ignored by default; on a GPU:
//! `cargo test --release -p vt-cuda --test prefill_dims_speed -- --ignored --nocapture`

use vt_core::{
    prefill_attention, Buffer, DType, Device, DeviceType, PrefillAttentionArgs, Probe, Queue, Result,
};
use vt_cuda::bench::{median, Bench};
use vt_cuda::prefill_attention::{prefill_attention_with, Kernel};

fn pairs(lq: i64, lk: i64, causal: bool) -> i64 {
    if !causal {
        return lq * lk;
    }
    (0..lq).map(|i| (lk - lq + i + 1).clamp(0, lk)).sum()
}

/// One shape: (qk, v) head dims, query and key lengths, causal.
#[derive(Clone, Copy)]
struct Shape {
    d: i64,
    dv: i64,
    lq: i64,
    lk: i64,
    causal: bool,
}

fn time(queue: &Queue, bench: &Bench<'_>, s: Shape, kernel: Kernel) -> Result<f64> {
    let Shape { d, dv, lq, lk, causal } = s;
    let h = 128;
    let q = Buffer::uninit(queue, DType::BF16, &[lq, h, d])?;
    let k = Buffer::uninit(queue, DType::BF16, &[lk, h, d])?;
    let v = Buffer::uninit(queue, DType::BF16, &[lk, h, dv])?;
    let out = Buffer::nan(queue, DType::BF16, &[lq, h, dv])?;
    let lse = Buffer::uninit(queue, DType::F32, &[h, lq])?;
    for (i, b) in [&q, &k, &v].into_iter().enumerate() {
        bench.fill(&b.view(), 40 + i as u64, 1.0)?;
    }
    let cu_q = Buffer::from_slice(queue, &[2], &[0i32, lq as i32])?;
    let cu_k = Buffer::from_slice(queue, &[2], &[0i32, lk as i32])?;
    let args = PrefillAttentionArgs {
        out: out.view(),
        lse: (!causal).then(|| lse.view()),
        query: q.view(),
        k: k.view(),
        v: v.view(),
        cu_seqlens_q: cu_q.view(),
        cu_seqlens_k: cu_k.view(),
        max_seqlen_q: lq,
        causal,
        scale: 1.0 / (d as f32).sqrt(),
    };
    prefill_attention(queue, &args)?; // validates the arguments once
    let mut us = bench.time_us(2, 10, true, || prefill_attention_with(queue, &args, kernel).map(|_| ()))?;
    let flops = 2.0 * pairs(lq, lk, causal) as f64 * h as f64 * (d + dv) as f64;
    Ok(flops / (median(&mut us) * 1e-6) / 1e12)
}

#[test]
#[ignore = "timing: run by hand on a GPU"]
fn prefill_other_head_dims_and_the_mma_kernel() -> Result<()> {
    if !matches!(vt_cuda::register(), Probe::Registered { .. }) {
        println!("SKIP: no CUDA device");
        return Ok(());
    }
    let queue = Queue::new(Device::new(DeviceType::Cuda, 0))?;
    let bench = Bench::new(&queue, 256 << 20)?;
    println!("PrefillAttention, 128 heads, bf16, TFLOP/s (median of 10, L2 flushed)");
    println!("| qk | v | kernel | causal T=4096 | causal T=8192 | chunk 4096 over 16384 |");
    println!("|---|---|---|---|---|---|");
    for (d, dv) in [(192, 128), (128, 128), (64, 64)] {
        for (kernel, name) in [(Kernel::Auto, "auto (wgmma)"), (Kernel::Mma, "mma.sync (sm_80 path)")] {
            let a = time(&queue, &bench, Shape { d, dv, lq: 4096, lk: 4096, causal: true }, kernel)?;
            let b = time(&queue, &bench, Shape { d, dv, lq: 8192, lk: 8192, causal: true }, kernel)?;
            let c = time(&queue, &bench, Shape { d, dv, lq: 4096, lk: 16384, causal: false }, kernel)?;
            println!("| {d} | {dv} | {name} | {a:.0} | {b:.0} | {c:.0} |");
        }
    }
    Ok(())
}
