//! `VT_FP8_ABSORBED` off (`vt_core::flags::Flag::Fp8Absorbed`): a block with fp8 weights keeps
//! its absorbed decode weights `W_UK_T` / `W_UV` dequantized in the compute dtype (the float
//! BMM) while every projection stays fp8, and its decode steps match the same layer with
//! them in fp8. A test binary of its own: the flag is a process-wide override, which other
//! tests in one binary would race.

mod common;

use common::*;
use mla_block::runner::{run_schedule, RunOptions, Schedule};
use mla_block::{HostTensor, MlaBlock, MlaConfig, MlaWeightStore};
use vt_core::flags::{set_override, Flag};
use vt_core::{DType, Queue};

fn run(
    q: &Queue,
    cfg: &MlaConfig,
    store: &MlaWeightStore,
    hidden: &HostTensor,
    pos: &[i64],
    sch: &str,
) -> HostTensor {
    let block = MlaBlock::new(cfg.dims, store.views(), cfg.rope.is_neox).unwrap();
    let sch: Schedule = sch.parse().unwrap();
    let opts = RunOptions { block_size: 16, chunk_workspace_tokens: Some(8) };
    run_schedule(q, &block, hidden, pos, &sch, &opts).unwrap().0
}

#[test]
fn absorbed_weights_dequantized_when_the_flag_is_off_match_the_fp8_ones() {
    let q = test_queue();
    for dt in [DType::F32, DType::BF16] {
        let (cfg, w) = ALIGNED.layer(dt, 5).unwrap();
        let w8 = mla_block::fp8::quantize_host_weights(&w).unwrap();
        set_override(Flag::Fp8Absorbed, Some(true));
        let kept = MlaWeightStore::from_host(&q, &cfg, &w8).unwrap();
        set_override(Flag::Fp8Absorbed, Some(false));
        let deq = MlaWeightStore::from_host(&q, &cfg, &w8).unwrap();
        set_override(Flag::Fp8Absorbed, None);
        // q_a, kv_a, q_b, kv_b, o_proj in both; the W_UK_T copy only in the first.
        assert_eq!(kept.fp8_weights(), 6, "{dt}");
        assert_eq!(deq.fp8_weights(), 5, "{dt}");
        assert!(
            deq.device_bytes() > kept.device_bytes(),
            "{dt}: dequantized absorbed weights take more memory"
        );
        let (vk, vd) = (kept.views(), deq.views());
        assert!(vk.fp8.w_uk_t.is_some() && vk.fp8.w_uv.is_some() && vk.w_uk_t.is_none(), "{dt}");
        assert!(
            vd.fp8.w_uk_t.is_none() && vd.fp8.w_uv.is_none(),
            "{dt}: no fp8 view of the absorbed weights"
        );
        assert!(vd.w_uk_t.is_some() && vd.w_uv.is_some() && vd.fp8.kv_b_proj.is_some(), "{dt}");
        // Decode-sized steps (16-bit activations): the same dequantized values either way, so
        // f32 agrees to rounding; bf16 rounds the dequantized weights once more (2^-9).
        let (s, t) = (2, 24);
        let hidden = ALIGNED.hidden(s, t, dt, 9);
        let pos: Vec<i64> = (0..s).flat_map(|i| (0..t).map(move |p| p + 40 * i)).collect();
        let sch = "prefill:8,decode:4,prefill:4,decode:8";
        let a = run(&q, &cfg, &kept, &hidden, &pos, sch);
        let b = run(&q, &cfg, &deq, &hidden, &pos, sch);
        let e = rel_frobenius(&a.to_f64(), &b.to_f64());
        let bound = if dt == DType::F32 { 1e-4 } else { 2e-2 };
        eprintln!("{dt}: absorbed fp8 vs dequantized {e:.3e} (bound {bound:.0e})");
        assert!(e <= bound, "{dt}: {e}");
        assert!(b.to_f64().iter().all(|v| v.is_finite()), "{dt}: non-finite output");
    }
}
