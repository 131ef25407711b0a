//! Weight loading and absorption.

mod common;

use common::{cpu_queue, safetensors_bytes, synthetic, synthetic_checkpoint};
use mla_block::{absorb_bytes, absorb_kv_b_proj, HostWeights, MlaWeightStore, DEFAULT_LAYER_PREFIX};
use vt_core::DType;

/// `W_UK_T` [N,P,L] and `W_UV` [N,L,V] hold exactly the elements of `kv_b_proj`
/// [N*(P+V), L] at `W_UK_T[n,p,l] = kv_b[n*(P+V)+p, l]`, `W_UV[n,l,v] = kv_b[n*(P+V)+P+v, l]`,
/// for bf16, f16 and f32: checked against zero-copy strided views of the uploaded kv_b_proj.
#[test]
fn absorption_equals_strided_views_of_kv_b_proj_for_bf16_f16_f32() {
    let q = cpu_queue();
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        let (cfg, host) = synthetic(true, dtype);
        let d = cfg.dims;
        let (n, p, l, v) = (d.num_heads, d.qk_nope_head_dim, d.kv_lora_rank, d.v_head_dim);
        let store = MlaWeightStore::from_host(&q, &cfg, &host).unwrap();
        let w = store.views();
        let kv_b = w.kv_b_proj.unwrap();
        let uk_view = kv_b.as_strided(0, &[n, p, l], &[(p + v) * l, l, 1]).unwrap();
        let uv_view = kv_b.as_strided(p * l, &[n, l, v], &[(p + v) * l, 1, l]).unwrap();
        let uk = w.w_uk_t.unwrap();
        let uv = w.w_uv.unwrap();
        assert_eq!((uk.shape(), uv.shape(), uk.dtype()), (&[n, p, l][..], &[n, l, v][..], dtype));
        assert_eq!(q.read_f64(&uk).unwrap(), q.read_f64(&uk_view).unwrap(), "{dtype} W_UK_T");
        assert_eq!(q.read_f64(&uv).unwrap(), q.read_f64(&uv_view).unwrap(), "{dtype} W_UV");
        // The byte-level and typed entry points agree.
        let kvb_host = host.get("kv_b_proj").unwrap();
        let (uk_bytes, _) = absorb_bytes(kvb_host, &d).unwrap();
        assert_eq!(mla_block::decode_f64(dtype, &uk_bytes), q.read_f64(&uk).unwrap());
    }
    let d = synthetic(true, DType::F32).0.dims;
    assert!(absorb_kv_b_proj(&[0f32; 3], &d).is_err());
}

/// The q_lora branch's fused A-projection is `q_a_proj` stacked over
/// `kv_a_proj_with_mqa`; a bf16 checkpoint loads exactly into f32 on request.
#[test]
fn loading_builds_the_fused_a_projection_and_converts_dtypes() {
    let q = cpu_queue();
    let (cfg, host) = synthetic(true, DType::BF16);
    let bytes = safetensors_bytes(&synthetic_checkpoint(&host, DEFAULT_LAYER_PREFIX));
    let f32w =
        HostWeights::from_safetensors_bytes(&bytes, &cfg.dims, DEFAULT_LAYER_PREFIX, Some(DType::F32), "w")
            .unwrap();
    assert_eq!(f32w.dtype, DType::F32);
    for (name, t) in &host.tensors {
        assert_eq!(f32w.get(name).unwrap().to_f64(), t.to_f64(), "{name} widened exactly");
    }
    let same =
        HostWeights::from_safetensors_bytes(&bytes, &cfg.dims, DEFAULT_LAYER_PREFIX, None, "w").unwrap();
    assert_eq!(same.dtype, DType::BF16, "default: the checkpoint's dtype");
    let store = MlaWeightStore::from_host(&q, &cfg, &f32w).unwrap();
    let fused = q.read_f64(&store.views().fused_qkv_a_proj.unwrap()).unwrap();
    let mut want = host.get("q_a_proj").unwrap().to_f64();
    want.extend(host.get("kv_a_proj_with_mqa").unwrap().to_f64());
    assert_eq!(fused, want);
    let cache = store.views().rope_cos_sin_cache.unwrap();
    assert_eq!((cache.dtype(), cache.shape()), (DType::F32, &[64, 4][..]));
}
