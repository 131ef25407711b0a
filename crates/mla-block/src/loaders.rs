//! The loaders of the block's input files, as plain functions of bytes: the entry points
//! that the fuzz targets (`fuzz/`, cargo-fuzz) and the bounded random-input test
//! (`tests/random_inputs.rs`) drive. Each returns a value or an error, never panics, for
//! any input.

use vt_core::{Error, Result};

use crate::config::MlaConfig;
use crate::runner::{positions_or_default, Schedule};
use crate::weights::{HostTensor, HostWeights};

/// `config.json` bytes -> the config (UTF-8 and JSON errors included).
pub fn config_from_bytes(bytes: &[u8]) -> Result<MlaConfig> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| Error::other("config.json", format!("not UTF-8 text: {e}")))?;
    MlaConfig::from_json_str(text)
}

/// A checkpoint's bytes -> the layer's host weights for `cfg` under `prefix`.
pub fn weights_from_bytes(bytes: &[u8], cfg: &MlaConfig, prefix: &str) -> Result<HostWeights> {
    HostWeights::from_safetensors_bytes(bytes, &cfg.dims, prefix, None, "weights.safetensors")
}

/// An input file's bytes -> `hidden_states` `[S, T, H]` (f32/bf16/f16, S and T > 0) and
/// the positions (`positions` `[S, T]` i64, default `0..T`), as `vt-mla run` reads them.
pub fn input_from_bytes(bytes: &[u8]) -> Result<(HostTensor, Vec<i64>)> {
    const CTX: &str = "input.safetensors";
    let st = crate::safetensors_header::deserialize_safetensors(bytes, CTX)?;
    let hidden = HostTensor::from_safetensors(&st, "hidden_states", CTX)?;
    let [s, t, h] = hidden.shape[..] else {
        return Err(Error::other(
            CTX,
            format!("`hidden_states` has shape {:?}, expected [S, T, H]", hidden.shape),
        ));
    };
    // H > 0 as well: `[S, T, 0]` holds no bytes whatever S * T claims, and the default
    // positions would be S * T entries.
    if !hidden.dtype.is_compute_float() || s <= 0 || t <= 0 || h <= 0 {
        return Err(Error::other(
            CTX,
            format!(
                "`hidden_states` is {} {:?}, expected f32/bf16/f16 [S, T, H] with S, T, H > 0",
                hidden.dtype, hidden.shape
            ),
        ));
    }
    let positions = match st.tensor("positions") {
        Ok(_) => Some(HostTensor::from_safetensors(&st, "positions", CTX)?),
        Err(_) => None,
    };
    let positions = positions_or_default(positions.as_ref(), s, t)?;
    Ok((hidden, positions))
}

/// `--schedule` text -> the schedule, checked against `t` tokens per sequence.
pub fn schedule_from_bytes(bytes: &[u8], t: i64) -> Result<Schedule> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| Error::invalid("Schedule", "schedule", format!("not UTF-8: {e}")))?;
    let s: Schedule = text.parse()?;
    s.check(t)?;
    Ok(s)
}
