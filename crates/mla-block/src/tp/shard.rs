//! The per-rank weights of a tensor-parallel MLA layer, split on the host as vLLM shards
//! `DeepseekV2MLAAttention`:
//!
//! | weight | split | rank r holds |
//! |---|---|---|
//! | `q_b_proj` [N(P+R), Q] / `q_proj` [N(P+R), H] | column-parallel (output rows) | rows of heads `r*N/tp .. (r+1)*N/tp` |
//! | `kv_b_proj` [N(P+V), L] | column-parallel | rows of its heads; `W_UK_T` / `W_UV` absorbed from them |
//! | `o_proj` `[H, NV]` | row-parallel (input columns) | columns of its heads; partial sums all-reduced |
//! | `q_a_proj`, `kv_a_proj_with_mqa`, `q_a_layernorm`, `kv_a_layernorm` | replicated | all |
//!
//! Heads are contiguous row blocks because every per-head weight is laid out head-major
//! (row `n*(P+R) + i` belongs to head n), so a rank's rows are one contiguous range.

use std::ops::Range;

use vt_core::{Error, Result};

use crate::config::MlaConfig;
use crate::dims::MlaBlockDims;
use crate::weights::{hf_weight_shapes, HostTensor, HostWeights};

const OP: &str = "tensor parallelism";

/// `tp` ranks can split `dims`' heads evenly: `tp >= 1` and `num_heads % tp == 0`.
pub fn check_tp(dims: &MlaBlockDims, tp: usize) -> Result<()> {
    if tp == 0 {
        return Err(Error::invalid(OP, "tp", "must be >= 1"));
    }
    if dims.num_heads % tp as i64 != 0 {
        return Err(Error::invalid(
            OP,
            "tp",
            format!(
                "num_attention_heads = {} is not divisible by tp = {tp}: every rank must hold the same \
                 number of whole heads",
                dims.num_heads
            ),
        ));
    }
    Ok(())
}

/// One rank's dims: `num_heads / tp` heads, everything else (the softmax scale included,
/// which depends on the head dims only) unchanged.
pub fn rank_dims(dims: &MlaBlockDims, tp: usize) -> Result<MlaBlockDims> {
    check_tp(dims, tp)?;
    let mut d = *dims;
    d.num_heads /= tp as i64;
    d.validate()?;
    Ok(d)
}

/// The heads rank `rank` of `tp` computes.
pub fn head_range(dims: &MlaBlockDims, tp: usize, rank: usize) -> Result<Range<i64>> {
    check_tp(dims, tp)?;
    if rank >= tp {
        return Err(Error::invalid(OP, "rank", format!("{rank} is not below tp = {tp}")));
    }
    let per = dims.num_heads / tp as i64;
    Ok(rank as i64 * per..(rank as i64 + 1) * per)
}

/// Rank `rank`'s config (its dims) and checkpoint weights (see the module docs), from the
/// full layer's. fp8 weights (codes beside their scales, [`HostWeights::from_checkpoint_with`])
/// keep their scale rows / columns when every rank's slice starts a 128-block, and are
/// dequantized for every rank otherwise. The result loads with [`crate::MlaWeightStore::from_host`], which derives
/// the rank's fused A-projection, `W_UK_T` / `W_UV` and cos/sin cache from it.
pub fn shard_weights(
    cfg: &MlaConfig,
    w: &HostWeights,
    tp: usize,
    rank: usize,
) -> Result<(MlaConfig, HostWeights)> {
    let d = cfg.dims;
    let heads = head_range(&d, tp, rank)?;
    let per = heads.end - heads.start;
    let (p, r, v) = (d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim);
    let mut tensors = Vec::new();
    for (name, shape) in hf_weight_shapes(&d) {
        let t = w
            .get(name)
            .ok_or_else(|| Error::invalid("HostWeights", name, format!("weight `{name}` is missing")))?;
        let fp8 = w.is_fp8(name);
        if t.shape != shape || (t.dtype != w.dtype && !fp8) {
            return Err(Error::invalid(
                "HostWeights",
                name,
                format!("is {} {:?}, expected {} {shape:?}", t.dtype, t.shape, w.dtype),
            ));
        }
        // The rank's rows or columns: (per-rank width, where this rank's start).
        let cut = match name {
            "q_b_proj" | "q_proj" => Some((false, per * (p + r), heads.start * (p + r))),
            "kv_b_proj" => Some((false, per * (p + v), heads.start * (p + v))),
            "o_proj" => Some((true, per * v, heads.start * v)),
            _ => None,
        };
        // An fp8 weight keeps its scale rows (columns) when every rank's slice starts a
        // 128-block; otherwise it is dequantized for every rank (issue 17).
        let b = vt_core::fp8_block::BLOCK as i64;
        let sname = crate::fp8::scale_name(name);
        let keep = fp8 && cut.is_none_or(|(_, width, _)| width % b == 0);
        let t = if fp8 && !keep { w.float(name)? } else { t.clone() };
        let part = match cut {
            None => t,
            Some((false, width, a)) => rows(&t, a, a + width),
            Some((true, width, a)) => columns(&t, a, a + width),
        };
        tensors.push((name, part));
        if let (true, Some(sname)) = (keep, sname) {
            let st = w.get(sname).ok_or_else(|| {
                Error::invalid("HostWeights", sname, format!("scales `{sname}` are missing"))
            })?;
            let spart = match cut {
                None => st.clone(),
                Some((false, width, a)) => rows(st, a / b, vt_core::fp8_block::blocks(a + width)),
                Some((true, width, a)) => columns(st, a / b, vt_core::fp8_block::blocks(a + width)),
            };
            tensors.push((sname, spart));
        }
    }
    let mut rank_cfg = *cfg;
    rank_cfg.dims = rank_dims(&d, tp)?;
    Ok((rank_cfg, HostWeights { dtype: w.dtype, tensors }))
}

/// Rows `a..b` of a 2-D host tensor.
fn rows(t: &HostTensor, a: i64, b: i64) -> HostTensor {
    let row = t.shape[1] as usize * t.dtype.size_of();
    HostTensor {
        dtype: t.dtype,
        shape: vec![b - a, t.shape[1]],
        bytes: t.bytes[a as usize * row..b as usize * row].to_vec(),
    }
}

/// Columns `a..b` of a 2-D host tensor.
fn columns(t: &HostTensor, a: i64, b: i64) -> HostTensor {
    let es = t.dtype.size_of();
    let row = t.shape[1] as usize * es;
    let (a, b) = (a as usize * es, b as usize * es);
    let bytes = t.bytes.chunks_exact(row).flat_map(|r| &r[a..b]).copied().collect();
    HostTensor { dtype: t.dtype, shape: vec![t.shape[0], ((b - a) / es) as i64], bytes }
}
