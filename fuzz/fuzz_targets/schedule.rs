//! `--schedule` text against a token count taken from the input's first bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (t, text) = match data.split_first_chunk::<8>() {
        Some((t, rest)) => (i64::from_le_bytes(*t), rest),
        None => (6, data),
    };
    let _ = mla_block::loaders::schedule_from_bytes(text, t);
});
