//! `config.json` bytes: an error or a usable config, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(cfg) = mla_block::loaders::config_from_bytes(data) {
        assert!(cfg.dims.validate().is_ok());
        assert!(cfg.dims.scale.is_finite() && cfg.dims.scale > 0.0);
    }
});
