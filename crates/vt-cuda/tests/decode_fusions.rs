//! FusedNormRope's optional query rope and cache write (the MLA block's
//! `VT_FUSE_DECODE_QUERY` / `VT_FUSE_CACHE_WRITE`) against the launches they replace on the
//! same device, bit for bit: FusedNormRope without them, RopeFromCache in place on a copy of
//! the query, ConcatAndCacheMla. Every output starts NaN-poisoned; the decode query's latent
//! columns must stay untouched. On CUDA also an out-of-range position (copied unrotated) and
//! an out-of-range slot (skipped), which the CPU's validation rejects. The CUDA-vs-CPU check
//! of the same options is vt-check's FusedNormRope parity cases (`tests/ops.rs`,
//! `matches_reference::FusedNormRope`). Prints SKIP and passes without a CUDA device.

mod common;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vt_check::DTYPES;
use vt_core::{
    concat_and_cache_mla, fused_norm_rope, rope_from_cache, Buffer, ConcatAndCacheMlaArgs, DType, Device,
    DeviceType, FusedNormRopeArgs, NormRopeCacheWrite, NormRopeQuery, Probe, Queue, RopeFromCacheArgs,
};

fn random(rng: &mut ChaCha8Rng, n: i64) -> Vec<f64> {
    (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

#[test]
fn fused_query_and_cache_write_match_the_split_launches_on_cuda() {
    vt_cpu::register();
    match vt_cuda::register() {
        Probe::Registered { .. } => check(Device::new(DeviceType::Cuda, 0)),
        other => println!("SKIP: no CUDA device ({other})"),
    }
}

/// The same on the CPU reference (runs without a GPU; checks the test's own use of the API).
#[test]
fn fused_query_and_cache_write_match_the_split_launches_on_the_cpu() {
    vt_cpu::register();
    check(Device::CPU);
}

/// Token rows `0..tq` of the rope part of a `[T, N, P+R]` query buffer.
fn q_pe_view(b: &Buffer, (p, tq, n, r): (i64, i64, i64, i64)) -> vt_core::Tensor<'_> {
    b.view().as_strided(p, &[tq, n, r], &[n * (p + r), p + r, 1]).unwrap()
}

fn check(dev: Device) {
    let q = Queue::new(dev).unwrap();
    let gpu = dev.kind != DeviceType::Cpu;
    let mut rng = ChaCha8Rng::seed_from_u64(common::seed());
    // DeepSeek-V3's widths; 29 decode tokens of 37 take the query.
    let (t, tq, n, l, p, r, max_pos, nb, bs) =
        (37i64, 29i64, 128i64, 512i64, 128i64, 64i64, 64i64, 4i64, 16i64);
    let dqk = p + r;
    for dt in DTYPES {
        for neox in [false, true] {
            for in_place in [false, true] {
                let kv =
                    Buffer::from_f64(&q, dt, &[t, l + r + 8], &random(&mut rng, t * (l + r + 8))).unwrap();
                let kv_v = kv.view().slice(1, 0, l + r).unwrap();
                let w = Buffer::from_f64(&q, dt, &[l], &random(&mut rng, l)).unwrap();
                let mut pos: Vec<i64> = (0..t).map(|_| rng.gen_range(0..max_pos)).collect();
                let mut slots: Vec<i64> = (0..nb * bs).collect();
                slots.shuffle(&mut rng);
                slots.truncate(t as usize);
                slots[5] = -1;
                slots[30] = -1;
                if gpu {
                    // Outside the cos/sin cache (left unrotated) and past the cache (skipped):
                    // GPU kernels must handle what only the CPU's validation can reject.
                    pos[3] = max_pos;
                    slots[7] = nb * bs;
                }
                let pos_b = Buffer::from_slice(&q, &[t], &pos).unwrap();
                let slots_b = Buffer::from_slice(&q, &[t], &slots).unwrap();
                let cs =
                    Buffer::from_f64(&q, DType::F32, &[max_pos, r], &common::cos_sin(max_pos, r)).unwrap();
                let q_vals = random(&mut rng, t * n * dqk);
                let q_f = Buffer::from_f64(&q, dt, &[t, n, dqk], &q_vals).unwrap();
                let q_s = Buffer::from_f64(&q, dt, &[t, n, dqk], &q_vals).unwrap();
                let q_pe = q_pe_view;
                let what = format!("{dt} neox {neox} in place {in_place}");

                // Fused: one launch.
                let (lat_f, rope_f) =
                    (Buffer::nan(&q, dt, &[t, l]).unwrap(), Buffer::nan(&q, dt, &[t, r]).unwrap());
                let mqa = Buffer::nan(&q, dt, &[tq, n, l + r]).unwrap();
                let cache_f = Buffer::nan(&q, dt, &[nb, bs, l + r]).unwrap();
                let q_out = if in_place {
                    q_pe(&q_f, (p, tq, n, r))
                } else {
                    mqa.view().as_strided(l, &[tq, n, r], &[n * (l + r), l + r, 1]).unwrap()
                };
                let base = FusedNormRopeArgs {
                    latent_out: lat_f.view(),
                    rope_out: rope_f.view(),
                    kv: kv_v,
                    weight: w.view(),
                    positions: pos_b.view(),
                    cos_sin_cache: cs.view(),
                    eps: 1e-6,
                    is_neox: neox,
                    query: None,
                    cache_write: None,
                };
                fused_norm_rope(
                    &q,
                    &FusedNormRopeArgs {
                        query: Some(NormRopeQuery { input: q_pe(&q_f, (p, tq, n, r)), out: q_out }),
                        cache_write: Some(NormRopeCacheWrite {
                            cache: cache_f.view(),
                            slot_mapping: slots_b.view(),
                        }),
                        ..base
                    },
                )
                .unwrap();

                // Split: the three launches it replaces.
                let (lat_s, rope_s) =
                    (Buffer::nan(&q, dt, &[t, l]).unwrap(), Buffer::nan(&q, dt, &[t, r]).unwrap());
                let cache_s = Buffer::nan(&q, dt, &[nb, bs, l + r]).unwrap();
                fused_norm_rope(
                    &q,
                    &FusedNormRopeArgs { latent_out: lat_s.view(), rope_out: rope_s.view(), ..base },
                )
                .unwrap();
                rope_from_cache(
                    &q,
                    &RopeFromCacheArgs {
                        query: q_pe(&q_s, (p, tq, n, r)),
                        key: None,
                        positions: pos_b.view().slice(0, 0, tq).unwrap(),
                        cos_sin_cache: cs.view(),
                        is_neox: neox,
                    },
                )
                .unwrap();
                concat_and_cache_mla(
                    &q,
                    &ConcatAndCacheMlaArgs {
                        kv_c: lat_s.view(),
                        k_pe: rope_s.view(),
                        cache: cache_s.view(),
                        slot_mapping: slots_b.view(),
                    },
                )
                .unwrap();

                assert_eq!(lat_f.to_bytes(&q).unwrap(), lat_s.to_bytes(&q).unwrap(), "{what}: latent");
                assert_eq!(rope_f.to_bytes(&q).unwrap(), rope_s.to_bytes(&q).unwrap(), "{what}: rope");
                let (cf, cs_) = (cache_f.to_bytes(&q).unwrap(), cache_s.to_bytes(&q).unwrap());
                assert_eq!(cf, cs_, "{what}: cache (written rows and untouched NaN rows)");
                let es = dt.size_of();
                let nan = dt.nan_bytes();
                let written = slots.iter().filter(|&&s| s >= 0 && s < nb * bs).count();
                let nan_rows = cf.chunks(((l + r) as usize) * es).filter(|row| row.starts_with(nan)).count();
                assert_eq!(nan_rows, (nb * bs) as usize - written, "{what}: cache rows written");
                let qs = q_s.to_bytes(&q).unwrap();
                if in_place {
                    assert_eq!(q_f.to_bytes(&q).unwrap(), qs, "{what}: query in place");
                } else {
                    // Untouched input; rope columns = the split query's; latent columns still NaN.
                    let qin: Vec<u8> =
                        Buffer::from_f64(&q, dt, &[t, n, dqk], &q_vals).unwrap().to_bytes(&q).unwrap();
                    assert_eq!(q_f.to_bytes(&q).unwrap(), qin, "{what}: the query input was written");
                    let m = mqa.to_bytes(&q).unwrap();
                    for ti in 0..tq as usize {
                        for h in 0..n as usize {
                            let row = &m[((ti * n as usize + h) * (l + r) as usize) * es..]
                                [..(l + r) as usize * es];
                            let src = &qs[((ti * n as usize + h) * dqk as usize + p as usize) * es..]
                                [..r as usize * es];
                            assert_eq!(&row[l as usize * es..], src, "{what}: query token {ti} head {h}");
                            assert!(
                                row[..l as usize * es].chunks(es).all(|x| x == nan),
                                "{what}: the latent columns of token {ti} head {h} were written"
                            );
                        }
                    }
                }
            }
        }
        println!("{dt}: fused query + cache write = split launches bit for bit on {dev}");
    }
}
