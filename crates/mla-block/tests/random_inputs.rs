//! A bounded random-input loop over the loaders (`mla_block::loaders`), CI's deterministic
//! stand-in for the cargo-fuzz targets in `fuzz/` (which need nightly or `RUSTC_BOOTSTRAP=1`
//! and are run by hand; see `fuzz/README.md`). Valid config, checkpoint, input and schedule
//! files are mutated (bit flips, byte overwrites, truncation, growth, header-length edits,
//! digits replaced by huge numbers) and random bytes are added; every call must return a value
//! or an error.
//!
//! Bounded: a fixed seed, `RANDOM_INPUT_CASES` inputs (default 20000) and a 20 s wall-clock
//! cap, whichever ends first.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use common::{mutate, safetensors_bytes, synthetic, synthetic_checkpoint, synthetic_config_json};
use mla_block::{loaders, HostTensor, MlaConfig, DEFAULT_LAYER_PREFIX};
use rand::{Rng, SeedableRng};
use vt_core::DType;

#[test]
fn loaders_return_on_random_and_mutated_inputs() {
    let cases: usize =
        std::env::var("RANDOM_INPUT_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let cap = Duration::from_secs(20);
    let (cfg, host) = synthetic(false, DType::F32);
    let config = synthetic_config_json(false).into_bytes();
    let yarn_config = r#"{"hidden_size": 16, "num_attention_heads": 2, "q_lora_rank": 8, "kv_lora_rank": 8,
        "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4, "max_position_embeddings": 64,
        "rope_theta": 10000.0, "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
        "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 16}}"#
        .as_bytes()
        .to_vec();
    let weights = safetensors_bytes(&synthetic_checkpoint(&host, DEFAULT_LAYER_PREFIX));
    let hidden = HostTensor {
        dtype: DType::F32,
        shape: vec![2, 3, 16],
        bytes: vt_core::encode_f64(DType::F32, &[0.25; 96]),
    };
    let pos = HostTensor {
        dtype: DType::I64,
        shape: vec![2, 3],
        bytes: vt_core::encode_f64(DType::I64, &[0., 1., 2., 0., 1., 2.]),
    };
    let input = safetensors_bytes(&[("hidden_states".into(), hidden), ("positions".into(), pos)]);
    let schedule = b"prefill:2,decode:1".to_vec();
    let seeds = [&config, &yarn_config, &weights, &input, &schedule];

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(15);
    let start = Instant::now();
    let (mut done, mut accepted) = (0usize, [0usize; 4]);
    while done < cases && start.elapsed() < cap {
        let data = if rng.gen_range(0..8) == 0 {
            (0..rng.gen_range(0..200)).map(|_| rng.gen::<u8>()).collect()
        } else {
            let seed = seeds[rng.gen_range(0..seeds.len())];
            mutate(&mut rng, seed)
        };
        let t = *[3i64, 0, -1, i64::MAX].get(rng.gen_range(0..4)).unwrap_or(&3);
        let r = catch_unwind(AssertUnwindSafe(|| {
            let c = loaders::config_from_bytes(&data);
            if let Ok(c) = &c {
                assert!(c.dims.validate().is_ok() && c.dims.scale.is_finite());
            }
            let w = loaders::weights_from_bytes(&data, &cfg, DEFAULT_LAYER_PREFIX);
            let i = loaders::input_from_bytes(&data);
            let s = loaders::schedule_from_bytes(&data, t);
            let _ = mla_block::check_safetensors_header(&data, "random");
            [c.is_ok(), w.is_ok(), i.is_ok(), s.is_ok()]
        }));
        match r {
            Ok(ok) => {
                for (a, o) in accepted.iter_mut().zip(ok) {
                    *a += o as usize;
                }
            }
            Err(_) => panic!(
                "a loader panicked on {} bytes: {:?}",
                data.len(),
                String::from_utf8_lossy(&data[..data.len().min(300)])
            ),
        }
        done += 1;
    }
    eprintln!(
        "random inputs: {done} in {:.1} s; accepted as config {}, weights {}, input {}, schedule {}",
        start.elapsed().as_secs_f64(),
        accepted[0],
        accepted[1],
        accepted[2],
        accepted[3]
    );
    assert!(done >= 200, "only {done} inputs within {cap:?}");
    // The unmutated seeds still load (the loop is not vacuous).
    assert!(loaders::config_from_bytes(&config).is_ok());
    assert!(MlaConfig::from_json_str(std::str::from_utf8(&yarn_config).unwrap_or("")).is_ok());
    assert!(loaders::weights_from_bytes(&weights, &cfg, DEFAULT_LAYER_PREFIX).is_ok());
    assert!(loaders::input_from_bytes(&input).is_ok());
    assert!(loaders::schedule_from_bytes(&schedule, 3).is_ok());
}
