//! The absorbed decode weights `W_UK_T` / `W_UV` of a block with fp8 weights under
//! `VT_FP8_ABSORBED` off (dequantized in the compute dtype, the float BMM, every projection
//! still fp8) and `VT_FP8_ABSORBED_BY_STEP` on (both forms held, the float one from
//! `ABSORBED_FLOAT_MIN_TOKENS` tokens a step): the stores hold what they say, and their decode
//! steps match the same layer with the absorbed weights in fp8. A test binary of its own with
//! one test: the flags are process-wide overrides, which concurrent tests would race.

mod common;

use common::*;
use mla_block::fp8::ABSORBED_FLOAT_MIN_TOKENS;
use mla_block::MlaWeightStore;
use vt_core::flags::{set_override, Flag};
use vt_core::{DType, DeviceType};

#[test]
fn absorbed_weights_dequantized_or_held_both_ways_match_the_fp8_ones() {
    let q = test_queue();
    for dt in [DType::F32, DType::BF16] {
        let (cfg, w) = ALIGNED.layer(dt, 5).unwrap();
        let w8 = mla_block::fp8::quantize_host_weights(&w).unwrap();
        let store = |absorbed: bool, by_step: bool| {
            set_override(Flag::Fp8Absorbed, Some(absorbed));
            set_override(Flag::Fp8AbsorbedByStep, Some(by_step));
            let s = MlaWeightStore::from_host(&q, &cfg, &w8).unwrap();
            set_override(Flag::Fp8Absorbed, None);
            set_override(Flag::Fp8AbsorbedByStep, None);
            s
        };
        let (kept, deq, both) = (store(true, false), store(false, false), store(true, true));
        // q_a, kv_a, q_b, kv_b, o_proj in each; the W_UK_T copy where the fp8 form is held.
        assert_eq!(kept.fp8_weights(), 6, "{dt}");
        assert_eq!(deq.fp8_weights(), 5, "{dt}");
        assert_eq!(both.fp8_weights(), 6, "{dt}");
        assert!(
            deq.device_bytes() > kept.device_bytes(),
            "{dt}: dequantized absorbed weights take more memory"
        );
        assert!(both.device_bytes() > deq.device_bytes(), "{dt}: both forms take the most");
        let (vk, vd, vb) = (kept.views(), deq.views(), both.views());
        assert!(vk.fp8.w_uk_t.is_some() && vk.fp8.w_uv.is_some() && vk.w_uk_t.is_none(), "{dt}");
        assert!(
            vd.fp8.w_uk_t.is_none() && vd.fp8.w_uv.is_none(),
            "{dt}: no fp8 view of the absorbed weights"
        );
        assert!(vd.w_uk_t.is_some() && vd.w_uv.is_some() && vd.fp8.kv_b_proj.is_some(), "{dt}");
        assert!(vb.fp8.w_uk_t.is_some() && vb.fp8.w_uv.is_some(), "{dt}");
        assert!(vb.w_uk_t.is_some() && vb.w_uv.is_some(), "{dt}");
        // Decode steps of 2 sequences (the fp8 form under BY_STEP) and of 36 (its float form,
        // at least ABSORBED_FLOAT_MIN_TOKENS), 16-bit activations (below FP8_QUANT_MIN_TOKENS):
        // the same dequantized values either way, so f32 agrees to rounding; bf16 rounds the
        // dequantized weights once more (2^-9).
        const _: () = assert!(36 >= ABSORBED_FLOAT_MIN_TOKENS && 36 < mla_block::fp8::FP8_QUANT_MIN_TOKENS);
        for (s, t, sch) in [(2, 24, "prefill:8,decode:4,prefill:4,decode:8"), (36, 4, "prefill:2,decode:2")] {
            let hidden = ALIGNED.hidden(s, t, dt, 9);
            let pos: Vec<i64> = (0..s).flat_map(|i| (0..t).map(move |p| p + 40 * i)).collect();
            let a = run_store_schedule(&q, &cfg, &kept, &hidden, &pos, sch, None);
            // On the CPU the choice shows bit for bit: BY_STEP's store runs the fp8 form at 2
            // sequences and the float form at 36 (in bf16 the two differ by rounding).
            if q.device().kind == DeviceType::Cpu {
                let b = run_store_schedule(&q, &cfg, &both, &hidden, &pos, sch, None);
                let same = if s >= ABSORBED_FLOAT_MIN_TOKENS {
                    run_store_schedule(&q, &cfg, &deq, &hidden, &pos, sch, None)
                } else {
                    a.clone()
                };
                assert_eq!(b.bytes, same.bytes, "{dt} {s} seqs: BY_STEP took the other form");
            }
            for (form, st) in [("dequantized", &deq), ("both", &both)] {
                let b = run_store_schedule(&q, &cfg, st, &hidden, &pos, sch, None);
                let e = rel_frobenius(&a.to_f64(), &b.to_f64());
                let bound = if dt == DType::F32 { 1e-4 } else { 2e-2 };
                eprintln!("{dt} {s} seqs: absorbed fp8 vs {form} {e:.3e} (bound {bound:.0e})");
                assert!(e <= bound, "{dt} {s} seqs {form}: {e}");
                assert!(b.to_f64().iter().all(|v| v.is_finite()), "{dt} {form}: non-finite output");
            }
        }
    }
}
