//! Element types.

use std::fmt;

/// The element type of a tensor.
///
/// `F8E4M3` is a storage type (one byte, OCP e4m3fn): only the block-scaled fp8 ops take
/// it (weights and quantized activations of `MatmulBTFp8` / `BatchedMatmulFp8`, the output
/// of `QuantizeFp8`, always beside their f32 scales; see [`crate::fp8_block`]); every other
/// entry point rejects it.
///
/// `Fp8DsMla` names the 656-byte `fp8_ds_mla` latent-cache row of FlashMLA and vLLM (see
/// [`crate::fp8_ds_mla`] for the byte layout). An element is one byte of a row, so an MLA
/// cache in this dtype is `[NB, BS, 656]`; only the MLA cache ops accept it (as their
/// `cache`), and the byte layout, not the element, carries the values. Reading an element
/// (`read_f64`) gives the byte (0..=255) and writing one stores `v as u8`, so parity
/// compares caches byte for byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    BF16,
    F16,
    F32,
    I32,
    I64,
    F8E4M3,
    Fp8DsMla,
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size_of(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
            DType::F8E4M3 | DType::Fp8DsMla => 1,
        }
    }

    /// The floating-point types the ops compute on (bf16, f16, f32).
    pub const fn is_compute_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32)
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F8E4M3 => "f8e4m3",
            DType::Fp8DsMla => "fp8_ds_mla",
        }
    }

    /// The bit pattern of a quiet NaN in this type, little-endian, used to poison outputs
    /// in tests. Integer types have no NaN and get an all-ones pattern (-1).
    pub fn nan_bytes(self) -> &'static [u8] {
        match self {
            DType::BF16 => &[0xc0, 0x7f],
            DType::F16 => &[0x00, 0x7e],
            DType::F32 => &[0x00, 0x00, 0xc0, 0x7f],
            DType::I32 => &[0xff; 4],
            DType::I64 => &[0xff; 8],
            DType::F8E4M3 => &[0x7f],
            // 0xff in every byte is NaN in every field of the row: e4m3 latent codes,
            // f32 scales and bf16 rope values.
            DType::Fp8DsMla => &[0xff],
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is stored as one of the [`DType`]s.
pub trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    /// Lossless for f32 and the 16-bit floats; integers convert as `as f64`.
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

/// Implements [`Element`]: `half`'s types through their own f64 conversions (lossless),
/// the primitives with `as`.
macro_rules! impl_element {
    (inherent: $($t:ty => $dtype:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
        }
    )*};
    (cast: $($t:ty => $dtype:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    )*};
}

impl_element!(inherent: half::bf16 => BF16, half::f16 => F16);
impl_element!(cast: f32 => F32, i32 => I32, i64 => I64);
