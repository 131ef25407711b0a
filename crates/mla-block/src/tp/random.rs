//! Random MLA layers of given sizes (DeepSeek-V3's, and a scaled-down one for CI), for
//! tensor-parallel parity and benches where no checkpoint is at hand.

use vt_core::{DType, Result};

use crate::config::MlaConfig;
use crate::weights::{hf_weight_shapes, HostTensor, HostWeights};

/// A small deterministic generator (SplitMix64): the same seed gives the same layer on
/// every machine, with no dependency.
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `n` values uniform in `[-a, a)` as little-endian bytes of `dtype` (bf16/f16/f32),
/// generated straight into bytes so a DeepSeek-V3-sized weight needs no f64 copy.
pub(crate) fn uniform_bytes(rng: &mut SplitMix64, dtype: DType, n: usize, a: f32) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size_of());
    for _ in 0..n {
        let v = rng.uniform() * a;
        match dtype {
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            _ => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
    out
}

/// The sizes of a random MLA layer. The rope is DeepSeek-V3's YaRN (factor 40 over 4096
/// original positions, mscale = mscale_all_dim = 1, GPT-J pairing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RandomLayerSpec {
    pub hidden_size: i64,
    pub num_heads: i64,
    /// 0: the q_proj branch.
    pub q_lora_rank: i64,
    pub kv_lora_rank: i64,
    pub qk_nope_head_dim: i64,
    pub qk_rope_head_dim: i64,
    pub v_head_dim: i64,
    /// Rows of the cos/sin cache.
    pub max_position_embeddings: i64,
    /// DeepSeek-V3.2's indexer (`model_type: deepseek_v32`): `None` for a dense layer.
    pub indexer: Option<crate::IndexerDims>,
}

impl RandomLayerSpec {
    /// DeepSeek-V3 / R1: hidden 7168, 128 heads, q_lora 1536, kv_lora 512, rope 64, nope
    /// 128, v 128 (about 187M weights per layer's attention).
    pub const DEEPSEEK_V3: RandomLayerSpec = RandomLayerSpec {
        hidden_size: 7168,
        num_heads: 128,
        q_lora_rank: 1536,
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        max_position_embeddings: 163840,
        indexer: None,
    };

    /// DeepSeek-V3's proportions scaled down for CPU tests: 16 heads (so tp 2, 4, 8 and 16
    /// split them), hidden 128, q_lora 48, kv_lora 64, rope 16, nope 32, v 32.
    pub const SMALL: RandomLayerSpec = RandomLayerSpec {
        hidden_size: 128,
        num_heads: 16,
        q_lora_rank: 48,
        kv_lora_rank: 64,
        qk_nope_head_dim: 32,
        qk_rope_head_dim: 16,
        v_head_dim: 32,
        max_position_embeddings: 4096,
        indexer: None,
    };

    /// A small layer with DeepSeek-V3's latent and rope widths (kv_lora 512, rope 64), the
    /// ones an fp8_ds_mla cache row holds, small elsewhere for CPU tests: 8 heads (tp 2, 4
    /// and 8 split them), hidden 128, q_lora 48, nope 16, v 16.
    pub const SMALL_FP8: RandomLayerSpec = RandomLayerSpec {
        hidden_size: 128,
        num_heads: 8,
        q_lora_rank: 48,
        kv_lora_rank: 512,
        qk_nope_head_dim: 16,
        qk_rope_head_dim: 64,
        v_head_dim: 16,
        max_position_embeddings: 4096,
        indexer: None,
    };

    /// DeepSeek-V3.2: V3's attention plus its lightning indexer (64 heads of 128, top 2048).
    pub const DEEPSEEK_V32: RandomLayerSpec = RandomLayerSpec {
        indexer: Some(crate::IndexerDims { n_heads: 64, head_dim: 128, topk: 2048 }),
        ..RandomLayerSpec::DEEPSEEK_V3
    };

    /// [`RandomLayerSpec::SMALL`] with an indexer of 4 heads of 32 and top 16, for CPU tests.
    pub const SMALL_V32: RandomLayerSpec = RandomLayerSpec {
        indexer: Some(crate::IndexerDims { n_heads: 4, head_dim: 32, topk: 16 }),
        ..RandomLayerSpec::SMALL
    };

    /// `v3`, `v32`, `small`, `small-v32`, `small-fp8`.
    pub fn by_name(name: &str) -> Option<RandomLayerSpec> {
        match name {
            "v3" | "deepseek-v3" => Some(RandomLayerSpec::DEEPSEEK_V3),
            "v32" | "deepseek-v3.2" => Some(RandomLayerSpec::DEEPSEEK_V32),
            "small" => Some(RandomLayerSpec::SMALL),
            "small-v32" => Some(RandomLayerSpec::SMALL_V32),
            "small-fp8" => Some(RandomLayerSpec::SMALL_FP8),
            _ => None,
        }
    }

    /// The Hugging Face `config.json` of this layer.
    pub fn config_json(&self) -> String {
        let q = if self.q_lora_rank > 0 { self.q_lora_rank.to_string() } else { "null".into() };
        let v32 = self.indexer.map_or(String::new(), |ix| {
            format!(
                r#""model_type": "deepseek_v32", "index_n_heads": {}, "index_head_dim": {}, "index_topk": {},"#,
                ix.n_heads, ix.head_dim, ix.topk
            )
        });
        format!(
            r#"{{{v32} "hidden_size": {}, "num_attention_heads": {}, "q_lora_rank": {q}, "kv_lora_rank": {},
                "qk_nope_head_dim": {}, "qk_rope_head_dim": {}, "v_head_dim": {}, "rms_norm_eps": 1e-6,
                "max_position_embeddings": {}, "rope_theta": 10000,
                "rope_scaling": {{"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}}}"#,
            self.hidden_size,
            self.num_heads,
            self.kv_lora_rank,
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            self.v_head_dim,
            self.max_position_embeddings
        )
    }

    pub fn config(&self) -> Result<MlaConfig> {
        MlaConfig::from_json_str(&self.config_json())
    }

    /// The layer's config and random checkpoint weights in `dtype`: projections uniform
    /// with variance 1/fan_in (activations keep unit scale through the layer), norm weights
    /// `1 +- 0.1`. The same seed gives the same weights.
    pub fn layer(&self, dtype: DType, seed: u64) -> Result<(MlaConfig, HostWeights)> {
        let cfg = self.config()?;
        let mut rng = SplitMix64::new(seed);
        let tensors = hf_weight_shapes(&cfg.dims)
            .into_iter()
            .map(|(name, shape)| {
                let n = shape.iter().product::<i64>() as usize;
                let bytes = if shape.len() == 1 {
                    let mut r = SplitMix64::new(rng.next_u64());
                    let vals: Vec<f64> = (0..n).map(|_| 1.0 + 0.1 * r.uniform() as f64).collect();
                    vt_core::encode_f64(dtype, &vals)
                } else {
                    let a = (3.0 / shape[1] as f32).sqrt();
                    uniform_bytes(&mut SplitMix64::new(rng.next_u64()), dtype, n, a)
                };
                (name, HostTensor { dtype, shape, bytes })
            })
            .collect();
        Ok((cfg, HostWeights { dtype, tensors }))
    }

    /// `hidden_states` `[s, t, hidden_size]`, uniform with unit variance.
    pub fn hidden(&self, s: i64, t: i64, dtype: DType, seed: u64) -> HostTensor {
        let n = (s * t * self.hidden_size) as usize;
        let bytes = uniform_bytes(&mut SplitMix64::new(seed), dtype, n, 3f32.sqrt());
        HostTensor { dtype, shape: vec![s, t, self.hidden_size], bytes }
    }
}
