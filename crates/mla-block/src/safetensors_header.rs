//! A checked reading of a safetensors file's header, so that a malformed file is an error
//! naming the file and the tensor at fault (the `safetensors` crate's own errors, such as
//! `TensorInvalidInfo`, name neither).
//!
//! The rules are the format's, as `safetensors` 0.4 applies them: an 8-byte little-endian
//! header length `n`, `n` bytes of a JSON object, then the data. Every entry but the
//! optional `__metadata__` (an object of strings) is `{"dtype", "shape", "data_offsets"}`;
//! the offsets are relative to the data, `start <= end`, and `end - start` is exactly
//! `prod(shape) * size_of(dtype)`. Sorted by offset, the entries tile the data from 0 to
//! its end without gaps. All arithmetic is checked.

use serde_json::Value;
use vt_core::{Error, Result};

/// The largest header `safetensors` accepts (100 MB).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor of a checked header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafetensorsEntry {
    pub name: String,
    /// The dtype as the file spells it (`"BF16"`, `"F32"`, ...).
    pub dtype: String,
    pub shape: Vec<usize>,
    /// `[start, end)` in the data, after the header.
    pub data_offsets: (usize, usize),
}

/// Bytes per element of a safetensors dtype name; `None` for a name the format lacks.
pub fn dtype_size(name: &str) -> Option<usize> {
    Some(match name {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

/// The first key written twice in one JSON object of `text`, at any depth, as a dotted path
/// from the top (`weight_map.x.weight`); `None` when every object's keys are distinct, or
/// when `text` is not JSON (its parse reports that). serde_json's `Value` keeps the last of
/// two equal keys without a word, so a file saying two things about one name would be read
/// as saying only the second.
pub(crate) fn first_duplicate_key(text: &str) -> Option<String> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

    struct Walk;
    impl<'de> DeserializeSeed<'de> for Walk {
        type Value = Option<String>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Walk {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(d) = seq.next_element_seed(Walk)? {
                found = found.or(d);
            }
            Ok(found)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
            let mut seen = std::collections::HashSet::new();
            let mut found = None;
            while let Some(key) = map.next_key::<String>()? {
                let inner = map.next_value_seed(Walk)?;
                if found.is_none() {
                    found = match inner {
                        Some(d) => Some(format!("{key}.{d}")),
                        None if !seen.insert(key.clone()) => Some(key),
                        None => None,
                    };
                }
            }
            Ok(found)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    Walk.deserialize(&mut de).ok().flatten()
}

/// Checks the header of the safetensors bytes `bytes` (of the file `context`) and returns
/// its tensors in file order. Every error names `context`, and the tensor where one is at
/// fault.
pub fn check_safetensors_header(bytes: &[u8], context: &str) -> Result<Vec<SafetensorsEntry>> {
    let err = |msg: String| Error::other(context, format!("not a safetensors file: {msg}"));
    let Some(len) = bytes.get(..8) else {
        return Err(err(format!("{} bytes, shorter than the 8-byte header length", bytes.len())));
    };
    let mut n = [0u8; 8];
    n.copy_from_slice(len);
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER_BYTES {
        return Err(err(format!("the header length {n} exceeds the format's {MAX_HEADER_BYTES} bytes")));
    }
    let n = n as usize;
    let Some(header) = bytes.get(8..8 + n) else {
        return Err(err(format!("the header length {n} runs past the file's {} bytes", bytes.len())));
    };
    let data_len = bytes.len() - 8 - n;
    let text = std::str::from_utf8(header).map_err(|e| err(format!("the header is not UTF-8 ({e})")))?;
    let v: Value = serde_json::from_str(text).map_err(|e| err(format!("the header is not JSON ({e})")))?;
    let Value::Object(map) = v else {
        return Err(err("the header is not a JSON object".into()));
    };
    if let Some(key) = first_duplicate_key(text) {
        return Err(err(format!("`{key}` is listed twice in the header (each name must appear once)")));
    }
    let mut entries = Vec::with_capacity(map.len());
    for (name, info) in &map {
        if name == "__metadata__" {
            let ok = info.as_object().is_some_and(|m| m.values().all(Value::is_string));
            if !ok {
                return Err(err(format!("`__metadata__` must be an object of strings, got {info}")));
            }
            continue;
        }
        let bad = |msg: String| err(format!("tensor `{name}`: {msg}"));
        let Value::Object(info) = info else {
            return Err(bad(format!("its entry must be an object, got {info}")));
        };
        let dtype = match info.get("dtype") {
            Some(Value::String(s)) => s.clone(),
            other => return Err(bad(format!("`dtype` must be a string, got {other:?}"))),
        };
        let Some(size) = dtype_size(&dtype) else {
            return Err(bad(format!("dtype {dtype:?} is not a safetensors dtype")));
        };
        let Some(Value::Array(dims)) = info.get("shape") else {
            return Err(bad(format!("`shape` must be an array, got {:?}", info.get("shape"))));
        };
        let shape = dims
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| bad(format!("`shape` {dims:?} must hold integers >= 0")))?;
        let offsets = match info.get("data_offsets") {
            Some(Value::Array(o)) if o.len() == 2 => {
                o.iter().map(|x| x.as_u64().and_then(|x| usize::try_from(x).ok())).collect::<Option<Vec<_>>>()
            }
            _ => None,
        };
        let Some([start, end]) = offsets.as_deref().and_then(|o| <[usize; 2]>::try_from(o).ok()) else {
            return Err(bad(format!(
                "`data_offsets` must be [start, end] integers >= 0, got {:?}",
                info.get("data_offsets")
            )));
        };
        if start > end {
            return Err(bad(format!("data_offsets [{start}, {end}] run backwards")));
        }
        let need = shape
            .iter()
            .try_fold(size, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(format!("the byte size of shape {shape:?} of {dtype} overflows")))?;
        // The element count must also fit the i64 shapes of the rest of the code.
        if shape.iter().any(|&d| i64::try_from(d).is_err()) || i64::try_from(need).is_err() {
            return Err(bad(format!("shape {shape:?} of {dtype} overflows i64")));
        }
        if end - start != need {
            return Err(bad(format!(
                "data_offsets [{start}, {end}] hold {} bytes, but shape {shape:?} of {dtype} needs {need} bytes",
                end - start
            )));
        }
        if end > data_len {
            return Err(bad(format!(
                "data_offsets [{start}, {end}] run past the end of the data ({data_len} bytes after the header)"
            )));
        }
        entries.push(SafetensorsEntry { name: name.clone(), dtype, shape, data_offsets: (start, end) });
    }
    let mut order: Vec<&SafetensorsEntry> = entries.iter().collect();
    order.sort_by_key(|e| e.data_offsets);
    let mut at = 0usize;
    for e in &order {
        let (start, end) = e.data_offsets;
        if start != at {
            return Err(err(format!(
                "tensor `{}`: data_offsets [{start}, {end}] {} the previous tensor's end at byte {at}",
                e.name,
                if start < at { "overlap" } else { "leave a gap after" }
            )));
        }
        at = end;
    }
    if at != data_len {
        return Err(err(format!(
            "the tensors cover {at} of the {data_len} data bytes after the header{}",
            order.last().map(|e| format!(" (the last is `{}`)", e.name)).unwrap_or_default()
        )));
    }
    Ok(entries)
}

/// [`check_safetensors_header`], then `safetensors`' own parse: the file's tensors, or an
/// error naming `context` (and the tensor at fault).
pub fn deserialize_safetensors<'a>(bytes: &'a [u8], context: &str) -> Result<safetensors::SafeTensors<'a>> {
    check_safetensors_header(bytes, context)?;
    safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| Error::other(context, format!("not a safetensors file: {e}")))
}
