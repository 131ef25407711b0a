//! Every op of vt-cuda against the CPU reference (MlaDecodeAttention's kernel variants
//! have their own file), through vt-check's parity cases (fresh random inputs, strided views, NaN-poisoned
//! outputs, untouched-memory checks) in bf16, f16 and f32; FusedNormRope bit-identical to
//! the split path; and a decode step captured into a CUDA graph (no sync, no allocation).
//! Each test prints a SKIP line and passes when no CUDA device is present.

mod common;

use std::sync::OnceLock;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vt_check::{run_cell, DTYPES};
use vt_core::{
    batched_matmul, concat_and_cache_mla, concat_mla_nope_rope, fused_norm_rope, gather_mla_cache, matmul_bt,
    merge_attn_states, prefill_attention, rms_norm, rope_from_cache, BatchedMatmulArgs, Buffer,
    ConcatAndCacheMlaArgs, ConcatMlaNopeRopeArgs, DType, Device, DeviceType, FusedNormRopeArgs,
    GatherMlaCacheArgs, MatmulBTArgs, MergeAttnStatesArgs, OpId, PrefillAttentionArgs, Probe, Queue, Result,
    RmsNormArgs, RopeFromCacheArgs,
};

fn cuda() -> Option<Device> {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    let probe = PROBE.get_or_init(|| {
        vt_cpu::register();
        vt_cuda::register()
    });
    match probe {
        Probe::Registered { .. } => Some(Device::new(DeviceType::Cuda, 0)),
        other => {
            println!("SKIP: no CUDA device ({other})");
            None
        }
    }
}

fn matches_reference(op: OpId) {
    let Some(dev) = cuda() else { return };
    let seed = common::seed();
    for dt in DTYPES {
        let cell = run_cell(op, dev, dt, seed).unwrap();
        println!("{cell}");
        assert!(cell.passed(), "{cell}");
    }
}

/// One test per op of `OpId::ALL` (`matches_reference::RmsNorm`, ...), so a new op is held
/// to the CPU reference without editing this file.
macro_rules! parity_tests {
    ($($op:ident),*) => {
        #[allow(non_snake_case)]
        mod matches_reference {
            $(
                #[test]
                fn $op() {
                    super::matches_reference(vt_core::OpId::$op);
                }
            )*
        }
    };
}

vt_core::for_each_op!(parity_tests);

fn random(rng: &mut ChaCha8Rng, n: i64) -> Vec<f64> {
    (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

#[test]
fn fused_norm_rope_is_bit_identical_to_rms_norm_then_rope_from_cache() {
    if let Some(dev) = cuda() {
        fused_matches_split_bitwise(dev);
    }
}

/// The same check on the CPU reference: it runs without a GPU, so the test's own use of
/// the API is checked here too.
#[test]
fn fused_norm_rope_is_bit_identical_to_the_split_path_on_the_cpu_too() {
    vt_cpu::register();
    fused_matches_split_bitwise(Device::CPU);
}

fn fused_matches_split_bitwise(dev: Device) {
    let q = Queue::new(dev).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(common::seed());
    let (t, l, r, max_pos) = (37, 512, 64, 64);
    for dt in DTYPES {
        for neox in [false, true] {
            // kv rows are strided (the merged A-projection output is wider than L + R).
            let kv = Buffer::from_f64(&q, dt, &[t, l + r + 8], &random(&mut rng, t * (l + r + 8))).unwrap();
            let kv_v = kv.view().slice(1, 0, l + r).unwrap();
            let w = Buffer::from_f64(&q, dt, &[l], &random(&mut rng, l)).unwrap();
            let pos: Vec<i64> = (0..t).map(|_| rng.gen_range(0..max_pos)).collect();
            let pos = Buffer::from_slice(&q, &[t], &pos).unwrap();
            let cache =
                Buffer::from_f64(&q, DType::F32, &[max_pos, r], &common::cos_sin(max_pos, r)).unwrap();

            let lat_f = Buffer::nan(&q, dt, &[t, l]).unwrap();
            let rope_f = Buffer::nan(&q, dt, &[t, r]).unwrap();
            fused_norm_rope(
                &q,
                &FusedNormRopeArgs {
                    latent_out: lat_f.view(),
                    rope_out: rope_f.view(),
                    kv: kv_v,
                    weight: w.view(),
                    positions: pos.view(),
                    cos_sin_cache: cache.view(),
                    eps: 1e-6,
                    is_neox: neox,
                    query: None,
                    cache_write: None,
                },
            )
            .unwrap();

            let lat_s = Buffer::nan(&q, dt, &[t, l]).unwrap();
            rms_norm(
                &q,
                &RmsNormArgs {
                    out: lat_s.view(),
                    x: kv_v.slice(1, 0, l).unwrap(),
                    weight: w.view(),
                    eps: 1e-6,
                },
            )
            .unwrap();
            // RoPE on a copy of the rope part: the same values uploaded again.
            let kv_host = kv.to_f64(&q).unwrap();
            let rope_part: Vec<f64> = (0..t)
                .flat_map(|i| kv_host[(i * (l + r + 8) + l) as usize..][..r as usize].to_vec())
                .collect();
            let rope_s = Buffer::from_f64(&q, dt, &[t, r], &rope_part).unwrap();
            let rope_s3 = rope_s.view().reshape(&[t, 1, r]).unwrap();
            rope_from_cache(
                &q,
                &RopeFromCacheArgs {
                    query: rope_s3,
                    key: None,
                    positions: pos.view(),
                    cos_sin_cache: cache.view(),
                    is_neox: neox,
                },
            )
            .unwrap();

            assert_eq!(lat_f.to_bytes(&q).unwrap(), lat_s.to_bytes(&q).unwrap(), "{dt} latent, neox {neox}");
            assert_eq!(rope_f.to_bytes(&q).unwrap(), rope_s.to_bytes(&q).unwrap(), "{dt} rope, neox {neox}");
        }
    }
}

/// Buffers of a small MLA decode step: two sequences, one new token each.
struct Step {
    x: Buffer,
    w_kv: Buffer,
    kv: Buffer,
    w_norm: Buffer,
    latent: Buffer,
    k_pe: Buffer,
    pos: Buffer,
    cos_sin: Buffer,
    cache: Buffer,
    slots: Buffer,
    w_q: Buffer,
    q: Buffer,
    w_uk: Buffer,
    q_lat: Buffer,
    q_cat: Buffer,
    block_table: Buffer,
    cu: Buffer,
    ws: Buffer,
    attn_o: Buffer,
    attn_lse: Buffer,
    merged: Buffer,
    merged_lse: Buffer,
    cu_q: Buffer,
    cu_k: Buffer,
    normed: Buffer,
}

const T: i64 = 2;
const H: i64 = 64;
const L: i64 = 32;
const R: i64 = 16;
const N: i64 = 4;
const P: i64 = 16;
const NB: i64 = 4;
const BS: i64 = 4;

impl Step {
    fn new(q: &Queue, dt: DType, rng: &mut ChaCha8Rng) -> Result<Step> {
        let f = |shape: &[i64], rng: &mut ChaCha8Rng| {
            Buffer::from_f64(q, dt, shape, &random(rng, shape.iter().product()))
        };
        Ok(Step {
            x: f(&[T, H], rng)?,
            w_kv: f(&[L + R, H], rng)?,
            kv: Buffer::nan(q, dt, &[T, L + R])?,
            w_norm: f(&[L], rng)?,
            latent: Buffer::nan(q, dt, &[T, L])?,
            k_pe: Buffer::nan(q, dt, &[T, R])?,
            pos: Buffer::from_slice(q, &[T], &[5i64, 2])?,
            cos_sin: Buffer::from_f64(q, DType::F32, &[16, R], &common::cos_sin(16, R))?,
            cache: f(&[NB, BS, L + R], rng)?,
            slots: Buffer::from_slice(q, &[T], &[5i64, 9])?,
            w_q: f(&[N * (P + R), H], rng)?,
            q: Buffer::nan(q, dt, &[T, N, P + R])?,
            w_uk: f(&[N, P, L], rng)?,
            q_lat: Buffer::nan(q, dt, &[N, T, L])?,
            q_cat: Buffer::nan(q, dt, &[T, N, P + R])?,
            block_table: Buffer::from_slice(q, &[2, 2], &[1i32, 0, 2, 3])?,
            cu: Buffer::from_slice(q, &[3], &[0i32, 6, 10])?,
            ws: Buffer::nan(q, dt, &[12, L + R])?,
            attn_o: Buffer::nan(q, dt, &[T, N, P])?,
            attn_lse: Buffer::nan(q, DType::F32, &[N, T])?,
            merged: Buffer::nan(q, dt, &[T, N, P])?,
            merged_lse: Buffer::nan(q, DType::F32, &[N, T])?,
            cu_q: Buffer::from_slice(q, &[3], &[0i32, 1, 2])?,
            cu_k: Buffer::from_slice(q, &[3], &[0i32, 6, 10])?,
            normed: Buffer::nan(q, dt, &[T, L])?,
        })
    }

    /// Every op but MlaDecodeAttention, as a decode step chains them.
    fn run(&self, q: &Queue) -> Result<()> {
        matmul_bt(q, &MatmulBTArgs { out: self.kv.view(), a: self.x.view(), b: self.w_kv.view() })?;
        fused_norm_rope(
            q,
            &FusedNormRopeArgs {
                latent_out: self.latent.view(),
                rope_out: self.k_pe.view(),
                kv: self.kv.view(),
                weight: self.w_norm.view(),
                positions: self.pos.view(),
                cos_sin_cache: self.cos_sin.view(),
                eps: 1e-6,
                is_neox: false,
                query: None,
                cache_write: None,
            },
        )?;
        concat_and_cache_mla(
            q,
            &ConcatAndCacheMlaArgs {
                kv_c: self.latent.view(),
                k_pe: self.k_pe.view(),
                cache: self.cache.view(),
                slot_mapping: self.slots.view(),
            },
        )?;
        let qv = self.q.view();
        matmul_bt(
            q,
            &MatmulBTArgs { out: qv.reshape(&[T, N * (P + R)])?, a: self.x.view(), b: self.w_q.view() },
        )?;
        rope_from_cache(
            q,
            &RopeFromCacheArgs {
                query: qv.slice(2, P, P + R)?,
                key: None,
                positions: self.pos.view(),
                cos_sin_cache: self.cos_sin.view(),
                is_neox: false,
            },
        )?;
        // q_nope as [N, T, P] (a transposed view) times W_UK [N, P, L].
        let q_nope = qv.slice(2, 0, P)?.transpose(0, 1)?;
        batched_matmul(q, &BatchedMatmulArgs { out: self.q_lat.view(), a: q_nope, b: self.w_uk.view() })?;
        concat_mla_nope_rope(
            q,
            &ConcatMlaNopeRopeArgs {
                out: self.q_cat.view(),
                nope: qv.slice(2, 0, P)?,
                rope: self.k_pe.view().unsqueeze(1)?,
            },
        )?;
        gather_mla_cache(
            q,
            &GatherMlaCacheArgs {
                out: self.ws.view(),
                cache: self.cache.view(),
                block_table: self.block_table.view(),
                cu_seq_lens: self.cu.view(),
                seq_starts: None,
            },
        )?;
        // Attention of the new tokens over the gathered context (keys: the workspace).
        let ws = self.ws.view().slice(0, 0, 10)?;
        let k = ws.as_strided(0, &[10, N, P], &[L + R, 0, 1])?;
        let v = ws.as_strided(P, &[10, N, P], &[L + R, 0, 1])?;
        prefill_attention(
            q,
            &PrefillAttentionArgs {
                out: self.attn_o.view(),
                lse: Some(self.attn_lse.view()),
                query: qv.slice(2, 0, P)?,
                k,
                v,
                cu_seqlens_q: self.cu_q.view(),
                cu_seqlens_k: self.cu_k.view(),
                max_seqlen_q: 1,
                causal: true,
                scale: 0.25,
            },
        )?;
        merge_attn_states(
            q,
            &MergeAttnStatesArgs {
                out: self.merged.view(),
                out_lse: Some(self.merged_lse.view()),
                prefix: self.attn_o.view(),
                prefix_lse: self.attn_lse.view(),
                suffix: self.attn_o.view(),
                suffix_lse: self.attn_lse.view(),
            },
        )?;
        rms_norm(
            q,
            &RmsNormArgs {
                out: self.normed.view(),
                x: self.latent.view(),
                weight: self.w_norm.view(),
                eps: 1e-6,
            },
        )
    }

    fn outputs(&self) -> [&Buffer; 13] {
        [
            &self.kv,
            &self.latent,
            &self.k_pe,
            &self.cache,
            &self.q,
            &self.q_lat,
            &self.q_cat,
            &self.ws,
            &self.attn_o,
            &self.attn_lse,
            &self.merged,
            &self.merged_lse,
            &self.normed,
        ]
    }
}

#[test]
fn a_decode_step_captures_into_a_cuda_graph_and_replays_the_same_results() {
    let Some(dev) = cuda() else { return };
    let q = Queue::new(dev).unwrap();
    let s = common::seed();
    for dt in DTYPES {
        let mut rng = ChaCha8Rng::seed_from_u64(s);
        let step = Step::new(&q, dt, &mut rng).unwrap();
        let cache0 = step.cache.to_bytes(&q).unwrap();
        // Warm-up: compiles and loads every module.
        step.run(&q).unwrap();
        let direct: Vec<Vec<u8>> = step.outputs().iter().map(|b| b.to_bytes(&q).unwrap()).collect();
        // Capture mode: any sync, allocation or read-back inside an op fails here.
        let graph = vt_cuda::graph::capture(&q, || step.run(&q)).unwrap();
        for b in step.outputs() {
            b.fill_pattern(&q, b.dtype().nan_bytes()).unwrap();
        }
        step.cache.write_bytes(&q, &cache0).unwrap();
        graph.launch().unwrap();
        let replayed: Vec<Vec<u8>> = step.outputs().iter().map(|b| b.to_bytes(&q).unwrap()).collect();
        for (i, (a, b)) in direct.iter().zip(&replayed).enumerate() {
            assert_eq!(a, b, "{dt}: output {i} differs between the direct run and the graph replay");
        }
    }
}

/// The step's arguments pass vt-core's validation (checked on the CPU, without a GPU).
#[test]
fn the_decode_step_of_the_capture_test_is_valid_on_the_cpu() {
    vt_cpu::register();
    let q = Queue::new(Device::CPU).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(common::seed());
    for dt in DTYPES {
        let step = Step::new(&q, dt, &mut rng).unwrap();
        step.run(&q).unwrap();
        for (i, b) in step.outputs().iter().enumerate() {
            let v = b.to_f64(&q).unwrap();
            let written = if i == 7 { &v[..(10 * (L + R)) as usize] } else { &v[..] };
            assert!(
                written.iter().all(|x| x.is_finite()),
                "{dt}: output {i} has unwritten or non-finite values"
            );
        }
    }
}

#[test]
fn a_synchronizing_call_inside_capture_is_an_error() {
    let Some(dev) = cuda() else { return };
    let q = Queue::new(dev).unwrap();
    let b = Buffer::zeros(&q, DType::F32, &[4]).unwrap();
    let r = vt_cuda::graph::capture(&q, || b.to_bytes(&q).map(|_| ()));
    assert!(r.is_err(), "a read-back inside capture must fail");
    // The queue still works afterwards.
    assert_eq!(b.to_vec::<f32>(&q).unwrap(), vec![0.0; 4]);
}
