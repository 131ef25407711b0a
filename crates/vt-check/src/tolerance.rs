//! The one table of tolerances: max relative Frobenius error per op and dtype.

use vt_core::{DType, OpId};

/// `(op, [bf16, f16, f32])`: the largest relative Frobenius error a backend may show
/// against the CPU reference on the same inputs.
///
/// Why these numbers:
/// - bf16 2e-2, f16 3e-3: a few units in the last place of the storage type (bf16 keeps
///   8 mantissa bits, f16 11); two correct implementations differ by rounding the same
///   f32 result differently and by f32 accumulation order, which stays well inside.
/// - f32 1e-5 for elementwise ops and the merge; 1e-4 for the matmuls and the
///   attentions, whose reductions run over thousands of terms in whatever order the
///   kernel picks (TF32 or other reduced-precision math on f32 does not fit in 1e-4).
/// - 0 for the copies: moving bytes must not change them, and for QuantizeFp8, whose codes
///   and scales every backend computes bit for bit (IEEE division, round to nearest even).
/// - 0 for IndexerTopK: its output is cache slots, right or wrong. Only the CPU runs it so
///   far; a GPU whose f32 sums run in another order can swap two near-equal scores, so its
///   parity will need a comparison that accepts swaps within a score tolerance.
/// - f32 5e-4 for the fp8 matmuls: their inputs are exact in every dtype (e4m3 codes times
///   f32 scales), but fp8 tensor cores add up a 128-wide K group's products with about 14
///   bits (Hopper) before the group's scale is applied in f32.
///
/// A bug small enough to hide inside the bf16 tolerance (one key of a long softmax
/// dropped, a wrong eps) still shows in the f32 column, which every cell also runs.
pub const TOLERANCES: &[(OpId, [f64; 3])] = &[
    (OpId::MatmulBT, [2e-2, 3e-3, 1e-4]),
    (OpId::BatchedMatmul, [2e-2, 3e-3, 1e-4]),
    (OpId::RmsNorm, [2e-2, 3e-3, 1e-5]),
    (OpId::RopeFromCache, [2e-2, 3e-3, 1e-5]),
    (OpId::FusedNormRope, [2e-2, 3e-3, 1e-5]),
    (OpId::ConcatAndCacheMla, [0.0, 0.0, 0.0]),
    (OpId::GatherMlaCache, [0.0, 0.0, 0.0]),
    (OpId::ConcatMlaNopeRope, [0.0, 0.0, 0.0]),
    (OpId::MlaDecodeAttention, [2e-2, 3e-3, 1e-4]),
    (OpId::PrefillAttention, [2e-2, 3e-3, 1e-4]),
    (OpId::MergeAttnStates, [2e-2, 3e-3, 1e-5]),
    (OpId::MatmulBTFp8, [2e-2, 3e-3, 5e-4]),
    (OpId::BatchedMatmulFp8, [2e-2, 3e-3, 5e-4]),
    (OpId::QuantizeFp8, [0.0, 0.0, 0.0]),
    (OpId::SparseMlaAttention, [2e-2, 3e-3, 1e-4]),
    (OpId::IndexerTopK, [0.0, 0.0, 0.0]),
    (OpId::CacheIndexerKeys, [0.0, 0.0, 0.0]),
    (OpId::LayerNorm, [2e-2, 3e-3, 1e-5]),
];

/// The tolerance of `op` in `dtype` from [`TOLERANCES`]; `None` for a dtype no op
/// computes in (integers, fp8) or an op missing from the table.
pub fn tolerance(op: OpId, dtype: DType) -> Option<f64> {
    let col = match dtype {
        DType::BF16 => 0,
        DType::F16 => 1,
        DType::F32 => 2,
        _ => return None,
    };
    TOLERANCES.iter().find(|(o, _)| *o == op).map(|(_, t)| t[col])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_has_a_tolerance_for_every_compute_dtype() {
        for &op in OpId::ALL {
            for dt in [DType::BF16, DType::F16, DType::F32] {
                let t = tolerance(op, dt);
                assert!(t.is_some_and(|t| (0.0..0.05).contains(&t)), "{op} {dt}: {t:?}");
            }
        }
        assert_eq!(TOLERANCES.len(), OpId::ALL.len(), "one row per op");
    }

    #[test]
    fn integer_dtypes_have_no_tolerance() {
        assert_eq!(tolerance(OpId::MatmulBT, DType::I32), None);
    }
}
