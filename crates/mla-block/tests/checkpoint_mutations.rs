//! Malformed checkpoints as files: the sharded and fp8 fixtures of `tests/fixtures/checkpoints`
//! copied to scratch, one file edited per round (the index's `weight_map` pointed elsewhere,
//! a shard's safetensors header edited field by field, or the raw bytes mutated as in
//! `random_inputs.rs`), then opened and loaded the ways `vt-mla run` loads (the weight store
//! with fp8 kept and dequantized, and the host weights). Every load must return, a value or an
//! error, and the fixtures themselves are never written.
//!
//! Bounded: a fixed seed, `CHECKPOINT_MUTATION_CASES` rounds (default 1500) and a 20 s cap.
//! A longer campaign by hand: `CHECKPOINT_MUTATION_SEED`, `CHECKPOINT_MUTATION_SECONDS`.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{checkpoint_fixtures, cpu_queue, mutate};
use mla_block::{layer_prefix, Checkpoint, HostWeights, MlaConfig, MlaWeightStore, WeightsDtype};
use rand::{Rng, SeedableRng};
use serde_json::Value;

/// Every file of `dir` (not recursive), sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut f: Vec<PathBuf> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
    f.sort();
    f
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in files(from) {
        std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
    }
}

/// The index with one `weight_map` entry pointed at another shard, a missing file, a path
/// outside the directory, a non-string, or removed; or a decoy entry added.
fn edit_index(rng: &mut impl Rng, bytes: &[u8], shards: &[String]) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<Value>(bytes) else { return bytes.to_vec() };
    let Some(map) = v.get_mut("weight_map").and_then(Value::as_object_mut) else { return bytes.to_vec() };
    let keys: Vec<String> = map.keys().cloned().collect();
    let key = keys[rng.gen_range(0..keys.len())].clone();
    let choice: Value = match rng.gen_range(0..8) {
        0 => Value::from(shards[rng.gen_range(0..shards.len())].clone()),
        1 => Value::from("missing.safetensors"),
        2 => Value::from(format!("../{}", shards[0])),
        3 => Value::from("/etc/hostname"),
        4 => Value::from(""),
        5 => Value::from(7),
        6 => {
            map.remove(&key);
            return serde_json::to_vec(&v).unwrap();
        }
        _ => {
            map.insert(format!("{key}.decoy"), Value::from(shards[0].clone()));
            return serde_json::to_vec(&v).unwrap();
        }
    };
    map.insert(key, choice);
    serde_json::to_vec(&v).unwrap()
}

/// A safetensors file with one tensor's header entry edited: its dtype, one dimension, or its
/// data offsets (the data itself unchanged; the 8-byte length re-written for the new header).
fn edit_header(rng: &mut impl Rng, bytes: &[u8]) -> Vec<u8> {
    let Some(n) = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap()) as usize) else {
        return bytes.to_vec();
    };
    let Some(Ok(mut h)) = bytes.get(8..8 + n).map(serde_json::from_slice::<Value>) else {
        return bytes.to_vec();
    };
    let Some(obj) = h.as_object_mut() else { return bytes.to_vec() };
    let names: Vec<String> = obj.keys().filter(|k| *k != "__metadata__").cloned().collect();
    if names.is_empty() {
        return bytes.to_vec();
    }
    let t = &mut obj[&names[rng.gen_range(0..names.len())]];
    match rng.gen_range(0..3) {
        0 => {
            let d = ["F8_E4M3", "F32", "BF16", "F16", "I64", "U8", "F64", "BOOL"];
            t["dtype"] = Value::from(d[rng.gen_range(0..d.len())]);
        }
        1 => {
            if let Some(shape) = t["shape"].as_array_mut() {
                if !shape.is_empty() {
                    let i = rng.gen_range(0..shape.len());
                    let old = shape[i].as_i64().unwrap_or(1);
                    let new = [0, 1, old + 1, old - 1, old * 2, 1 << 40, -1][rng.gen_range(0..7)];
                    shape[i] = Value::from(new);
                } else {
                    shape.push(Value::from(2));
                }
            }
        }
        _ => {
            if let Some(off) = t["data_offsets"].as_array_mut() {
                let i = rng.gen_range(0..off.len().max(1)).min(off.len().saturating_sub(1));
                if let Some(x) = off.get_mut(i) {
                    let old = x.as_u64().unwrap_or(0);
                    *x = Value::from(
                        [0, old + 1, old.saturating_sub(1), old + 4096, u64::MAX][rng.gen_range(0..5)],
                    );
                }
            }
        }
    }
    let header = serde_json::to_vec(&h).unwrap();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(&bytes[8 + n..]);
    out
}

/// Opens and loads `path` every way the CLI does; Ok(true) if any load succeeded.
fn load_all(q: &vt_core::Queue, cfg: &MlaConfig, path: &Path) -> bool {
    let Ok(ck) = Checkpoint::open(path) else { return false };
    let p = layer_prefix(0);
    let mut ok = false;
    for w in [WeightsDtype::Fp8, WeightsDtype::Dequantize] {
        ok |= MlaWeightStore::from_checkpoint_with(q, cfg, &ck, &p, None, w).is_ok();
    }
    ok |= HostWeights::from_checkpoint_with(&ck, &cfg.dims, &p, None, true).is_ok();
    ok
}

#[test]
fn loading_a_malformed_checkpoint_returns_an_error_and_never_writes_it() {
    let cases: usize =
        std::env::var("CHECKPOINT_MUTATION_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(1500);
    let env = |k: &str| std::env::var(k).ok().and_then(|s| s.parse::<u64>().ok());
    let cap = Duration::from_secs(env("CHECKPOINT_MUTATION_SECONDS").unwrap_or(20));
    let q = cpu_queue();
    let scratch = std::env::temp_dir().join(format!("vt-ckpt-mutations-{}", std::process::id()));
    // Two layouts: the sharded bf16 checkpoint (a directory: index + 3 shards) and the fp8
    // one (its weights file, with the 128x128 scales), each loaded as the CLI takes it.
    let kinds: Vec<(PathBuf, PathBuf, &str)> =
        [("qlora_yarn_neox_bf16/sharded", ""), ("qlora_yarn_neox_bf16/fp8", "weights.safetensors")]
            .iter()
            .map(|(k, file)| (checkpoint_fixtures().join(k), scratch.join(k), *file))
            .collect();
    let originals: Vec<Vec<(PathBuf, Vec<u8>)>> = kinds
        .iter()
        .map(|(from, to, _)| {
            copy_dir(from, to);
            files(from).into_iter().map(|f| (f.clone(), std::fs::read(&f).unwrap())).collect()
        })
        .collect();
    let cfgs: Vec<MlaConfig> =
        kinds.iter().map(|(from, _, _)| MlaConfig::from_file(&from.join("config.json")).unwrap()).collect();
    // The unedited copies load (the loop is not vacuous).
    for ((_, to, file), cfg) in kinds.iter().zip(&cfgs) {
        assert!(load_all(&q, cfg, &to.join(file)), "the unedited {} does not load", to.display());
    }

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(env("CHECKPOINT_MUTATION_SEED").unwrap_or(14));
    let start = Instant::now();
    let (mut done, mut loaded) = (0usize, 0usize);
    while done < cases && start.elapsed() < cap {
        let k = rng.gen_range(0..kinds.len());
        let (from, to, file) = &kinds[k];
        // config.json is the config loader's (random_inputs.rs); here the weights' files.
        let targets: Vec<PathBuf> = files(to)
            .into_iter()
            .filter(|f| !f.ends_with("config.json") && (file.is_empty() || f.ends_with(file)))
            .collect();
        let target = &targets[rng.gen_range(0..targets.len())];
        let orig = std::fs::read(from.join(target.file_name().unwrap())).unwrap();
        let name = target.file_name().unwrap().to_string_lossy().to_string();
        let shards: Vec<String> = targets
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".safetensors"))
            .collect();
        let edited = match (name.ends_with(".json"), rng.gen_range(0..2)) {
            (true, 0) => edit_index(&mut rng, &orig, &shards),
            (false, 0) => edit_header(&mut rng, &orig),
            _ => mutate(&mut rng, &orig),
        };
        std::fs::write(target, &edited).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| load_all(&q, &cfgs[k], &to.join(file))));
        match r {
            Ok(ok) => loaded += ok as usize,
            Err(_) => panic!(
                "loading panicked with {name} edited ({} bytes, was {}): {:?}",
                edited.len(),
                orig.len(),
                String::from_utf8_lossy(&edited[..edited.len().min(400)])
            ),
        }
        // Loading only reads (the files are mapped read-only): the edited file is as written.
        assert!(std::fs::read(target).unwrap() == edited, "loading changed {name}");
        std::fs::write(target, &orig).unwrap();
        done += 1;
    }
    eprintln!(
        "checkpoint mutations: {done} in {:.1} s, {loaded} still loaded one way",
        start.elapsed().as_secs_f64()
    );
    assert!(done >= 100, "only {done} rounds within {cap:?}");
    // And the unedited copies, loaded at the start, are byte for byte the fixtures.
    for ((_, to, _), files) in kinds.iter().zip(&originals) {
        for (f, bytes) in files {
            let copy = to.join(f.file_name().unwrap());
            assert!(std::fs::read(&copy).unwrap() == *bytes, "{} changed", copy.display());
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
