//! TP = N against TP = 1: the same layer and input through the tensor-parallel runner and
//! through the ordinary single-device runner, compared by relative Frobenius error.

use std::path::Path;

use safetensors::SafeTensors;
use vt_core::{DType, Device, Error, Queue, Result};

use super::dcp::run_schedule_dcp_with_cache;
use super::group::TpGroup;
use super::random::RandomLayerSpec;
use super::run::{TpModel, TpRunStats};
use crate::block::MlaBlock;
use crate::config::MlaConfig;
use crate::kv_cache::KvCacheDtype;
use crate::runner::{positions_or_default, run_schedule_with_cache, RunOptions, Schedule};
use crate::weights::{HostTensor, HostWeights, MlaWeightStore};
use crate::DEFAULT_LAYER_PREFIX;

/// A layer, an input and (for goldens) the expected output.
#[derive(Clone, Debug)]
pub struct TpCase {
    pub name: String,
    pub cfg: MlaConfig,
    pub weights: HostWeights,
    /// `[S, T, H]`.
    pub hidden: HostTensor,
    /// `[S*T]`.
    pub positions: Vec<i64>,
    /// `out` of the golden, `[S, T, H]`.
    pub expected: Option<HostTensor>,
    /// The KV cache of both runs (TP = N and TP = 1): `Auto` (the activation dtype) unless
    /// set with [`TpCase::with_kv_cache`].
    pub kv_cache: KvCacheDtype,
}

fn read_safetensors(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::other(path.display().to_string(), format!("cannot read: {e}")))
}

impl TpCase {
    /// A golden case directory (tests/golden/NAME: `config.json`, `weights.safetensors`
    /// under the default layer prefix, `input.safetensors` with `hidden_states` and optional
    /// `positions`, `expected.safetensors` with `out`).
    pub fn from_golden_dir(dir: &Path) -> Result<TpCase> {
        let cfg = MlaConfig::from_file(&dir.join("config.json"))?;
        let weights =
            HostWeights::from_file(&dir.join("weights.safetensors"), &cfg.dims, DEFAULT_LAYER_PREFIX, None)?;
        let input_path = dir.join("input.safetensors");
        let ctx = input_path.display().to_string();
        let bytes = read_safetensors(&input_path)?;
        let st = SafeTensors::deserialize(&bytes)
            .map_err(|e| Error::other(ctx.clone(), format!("not a safetensors file: {e}")))?;
        let hidden = HostTensor::from_safetensors(&st, "hidden_states", &ctx)?;
        if hidden.shape.len() != 3 || !hidden.dtype.is_compute_float() {
            return Err(Error::other(ctx, format!("`hidden_states` is {} {:?}", hidden.dtype, hidden.shape)));
        }
        let pos = match st.tensor("positions") {
            Ok(_) => Some(HostTensor::from_safetensors(&st, "positions", &ctx)?),
            Err(_) => None,
        };
        let positions = positions_or_default(pos.as_ref(), hidden.shape[0], hidden.shape[1])?;
        let exp_path = dir.join("expected.safetensors");
        let expected = if exp_path.is_file() {
            let bytes = read_safetensors(&exp_path)?;
            let st = SafeTensors::deserialize(&bytes).map_err(|e| {
                Error::other(exp_path.display().to_string(), format!("not a safetensors file: {e}"))
            })?;
            Some(HostTensor::from_safetensors(&st, "out", &exp_path.display().to_string())?)
        } else {
            None
        };
        let weights = if weights.dtype == hidden.dtype {
            weights
        } else {
            HostWeights {
                dtype: hidden.dtype,
                tensors: weights.tensors.iter().map(|(n, t)| (*n, t.converted(hidden.dtype))).collect(),
            }
        };
        let name =
            dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        Ok(TpCase { name, cfg, weights, hidden, positions, expected, kv_cache: KvCacheDtype::Auto })
    }

    /// A random layer of `spec`'s sizes in `dtype` with `s` sequences of `t` tokens at
    /// positions `0..t`.
    pub fn random(
        spec: &RandomLayerSpec,
        name: &str,
        dtype: DType,
        s: i64,
        t: i64,
        seed: u64,
    ) -> Result<TpCase> {
        let (cfg, weights) = spec.layer(dtype, seed)?;
        let hidden = spec.hidden(s, t, dtype, seed ^ 0x5eed);
        let positions = positions_or_default(None, s, t)?;
        Ok(TpCase {
            name: name.to_string(),
            cfg,
            weights,
            hidden,
            positions,
            expected: None,
            kv_cache: KvCacheDtype::Auto,
        })
    }

    /// The case with both runs' KV cache in `kv_cache` (e.g. `Fp8DsMla`, for layers with
    /// L = 512 and R = 64).
    pub fn with_kv_cache(self, kv_cache: KvCacheDtype) -> TpCase {
        TpCase { kv_cache, ..self }
    }

    /// An fp8_ds_mla cache holds this case's rows: L = 512 and R = 64.
    pub fn fits_fp8_cache(&self) -> bool {
        let d = &self.cfg.dims;
        d.kv_lora_rank == vt_core::fp8_ds_mla::LATENT as i64
            && d.qk_rope_head_dim == vt_core::fp8_ds_mla::ROPE as i64
    }

    pub fn dtype(&self) -> DType {
        self.hidden.dtype
    }

    /// Tokens per sequence.
    pub fn t(&self) -> i64 {
        self.hidden.shape[1]
    }

    /// TP = N vs TP = 1 tolerance (relative Frobenius): 1e-5 for f32, 2e-2 for bf16/f16.
    /// The ranks' partial `o_proj` outputs are rounded to the dtype before they are summed,
    /// where TP = 1 rounds the full sum once, so 16-bit dtypes differ by their rounding.
    pub fn tp_tolerance(&self) -> f64 {
        if self.dtype() == DType::F32 {
            1e-5
        } else {
            2e-2
        }
    }

    /// The golden tolerance against `expected`: 1e-4 for f32, 2e-2 for bf16/f16; 6e-2 with
    /// an fp8_ds_mla cache (e4m3's half ulp, 2^-4: docs/mla.md, "The fp8_ds_mla cache").
    /// TP = N vs TP = 1 keeps [`TpCase::tp_tolerance`]: both runs read the same fp8 bytes.
    pub fn golden_tolerance(&self) -> f64 {
        if self.kv_cache == KvCacheDtype::Fp8DsMla {
            6e-2
        } else if self.dtype() == DType::F32 {
            1e-4
        } else {
            2e-2
        }
    }
}

/// The outcome of [`compare_tp`].
#[derive(Clone, Debug)]
pub struct TpComparison {
    pub tp: usize,
    /// `||out(TP=N) - out(TP=1)|| / ||out(TP=1)||`.
    pub err_vs_tp1: f64,
    /// Both against the golden's expected output, when there is one.
    pub tp1_vs_expected: Option<f64>,
    pub tpn_vs_expected: Option<f64>,
    pub stats: TpRunStats,
    pub tp1_out: HostTensor,
    pub tpn_out: HostTensor,
}

impl TpComparison {
    /// Within `case`'s tolerances, every rank with the same output.
    pub fn passed(&self, case: &TpCase) -> bool {
        self.err_vs_tp1 <= case.tp_tolerance()
            && self.stats.ranks_identical
            && self.tpn_vs_expected.is_none_or(|e| e <= case.golden_tolerance())
    }
}

/// Runs `case` through `group` (TP = its size, DCP = [`TpGroup::dcp`]) and through the ordinary block on a fresh
/// queue of rank 0's device (TP = 1, no communicator), under `schedule`.
pub fn compare_tp(
    case: &TpCase,
    group: &TpGroup,
    schedule: &Schedule,
    opts: &RunOptions,
) -> Result<TpComparison> {
    let tp1 = tp1_reference(case, group.queues()[0].device(), schedule, opts)?;
    compare_tp_against(case, group, schedule, opts, tp1)
}

/// The TP = 1 output of `case` on `device`: the ordinary block, no communicator, with the
/// case's KV cache dtype.
pub fn tp1_reference(
    case: &TpCase,
    device: Device,
    schedule: &Schedule,
    opts: &RunOptions,
) -> Result<HostTensor> {
    let q = Queue::new(device)?;
    let store = MlaWeightStore::from_host(&q, &case.cfg, &case.weights)?;
    let block = MlaBlock::new(case.cfg.dims, store.views(), case.cfg.rope.is_neox)?;
    let none = &|_: usize, _: usize| {};
    Ok(run_schedule_with_cache(
        &q,
        &block,
        &case.hidden,
        &case.positions,
        schedule,
        opts,
        case.kv_cache,
        none,
    )?
    .0)
}

/// [`compare_tp`] against a TP = 1 output computed before ([`tp1_reference`]), so several
/// group sizes can share it.
pub fn compare_tp_against(
    case: &TpCase,
    group: &TpGroup,
    schedule: &Schedule,
    opts: &RunOptions,
    tp1: HostTensor,
) -> Result<TpComparison> {
    let model = TpModel::load(group, &case.cfg, &case.weights)?;
    let blocks = model.blocks(None)?;
    // Under DCP (group.dcp() > 1) the ranks' caches hold their shares; dcp = 1 is the TP run.
    let (tpn, stats) = run_schedule_dcp_with_cache(
        group,
        &blocks,
        &case.hidden,
        &case.positions,
        schedule,
        opts,
        case.kv_cache,
    )?;
    let expected = case.expected.as_ref().map(|e| e.to_f64());
    let vs = |out: &HostTensor| expected.as_ref().map(|e| rel_frobenius(&out.to_f64(), e));
    Ok(TpComparison {
        tp: group.tp(),
        err_vs_tp1: rel_frobenius(&tpn.to_f64(), &tp1.to_f64()),
        tp1_vs_expected: vs(&tp1),
        tpn_vs_expected: vs(&tpn),
        stats,
        tp1_out: tp1,
        tpn_out: tpn,
    })
}

/// `||out - reference|| / ||reference||`; infinite if anything is NaN (an unwritten element
/// must fail) or the lengths differ.
pub fn rel_frobenius(out: &[f64], reference: &[f64]) -> f64 {
    if out.len() != reference.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0.0, 0.0);
    for (a, b) in out.iter().zip(reference) {
        num += (a - b) * (a - b);
        den += b * b;
    }
    if num.is_nan() || den.is_nan() {
        return f64::INFINITY;
    }
    if den == 0.0 {
        return if num == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (num / den).sqrt()
}
