//! The parity cases of every op, and the input builders they share (rotary caches,
//! paged caches, block tables).
//!
//! Dims named like the MLA block: L = kv_lora_rank (512), R = rope dim (64), P = nope
//! head dim (128), V = value head dim (128), D = L + R (576) for the absorbed decode.
//! Cases mix those realistic sizes with small ones (cheap on the CPU, and odd enough to
//! hit tail handling in GPU kernels).

mod attention;
mod cache;
mod fp8_cache;
mod fp8_matmul;
mod matmul;
mod norm_rope;
mod sparse_mla;

use rand::seq::SliceRandom;
use rand::Rng;
use vt_core::OpId;

use crate::case::{Builder, Cases, Ty, View};
use crate::Case;

/// Every parity case of `op`, inputs drawn from `seed` (see [`crate::case_seed`]).
pub fn cases(op: OpId, seed: u64) -> Vec<Case> {
    let mut c = Cases::new(op, seed);
    match op {
        OpId::MatmulBT => matmul::matmul_bt(&mut c),
        OpId::BatchedMatmul => matmul::batched_matmul(&mut c),
        OpId::RmsNorm => norm_rope::rms_norm(&mut c),
        OpId::RopeFromCache => norm_rope::rope_from_cache(&mut c),
        OpId::FusedNormRope => norm_rope::fused_norm_rope(&mut c),
        OpId::ConcatAndCacheMla => {
            cache::concat_and_cache_mla(&mut c);
            fp8_cache::concat_and_cache_mla(&mut c)
        }
        OpId::GatherMlaCache => {
            cache::gather_mla_cache(&mut c);
            fp8_cache::gather_mla_cache(&mut c)
        }
        OpId::ConcatMlaNopeRope => cache::concat_mla_nope_rope(&mut c),
        OpId::MlaDecodeAttention => {
            attention::mla_decode_attention(&mut c);
            fp8_cache::mla_decode_attention(&mut c)
        }
        OpId::PrefillAttention => attention::prefill_attention(&mut c),
        OpId::MergeAttnStates => attention::merge_attn_states(&mut c),
        OpId::MatmulBTFp8 => fp8_matmul::matmul_bt_fp8(&mut c),
        OpId::BatchedMatmulFp8 => fp8_matmul::batched_matmul_fp8(&mut c),
        OpId::QuantizeFp8 => fp8_matmul::quantize_fp8(&mut c),
        OpId::SparseMlaAttention => sparse_mla::sparse_mla_attention(&mut c),
        OpId::IndexerTopK => sparse_mla::indexer_top_k(&mut c),
        OpId::CacheIndexerKeys => sparse_mla::cache_indexer_keys(&mut c),
        OpId::LayerNorm => norm_rope::layer_norm(&mut c),
    }
    c.list
}

/// `positions` `[T]` i64 in `0..max_pos` (the first is the last cache row, the second 0,
/// so both ends of the cache are read) and the f32 `cos_sin_cache` `[max_pos, R]` of
/// rotary base 10000: row p = `[cos(p * f_i) | sin(p * f_i)]`, `f_i = 10000^(-2i/R)`.
pub(crate) fn rotary_inputs(b: &mut Builder, t: i64, r: i64, max_pos: i64) -> (View, View) {
    let mut pos: Vec<f64> = (0..t).map(|_| b.rng.gen_range(0..max_pos) as f64).collect();
    if let Some(p) = pos.first_mut() {
        *p = (max_pos - 1) as f64;
    }
    if let Some(p) = pos.get_mut(1) {
        *p = 0.0;
    }
    let half = r / 2;
    let mut cache = Vec::with_capacity((max_pos * r) as usize);
    for p in 0..max_pos {
        let angle = |i: i64| p as f64 * 10000f64.powf(-2.0 * i as f64 / r as f64);
        cache.extend((0..half).map(|i| angle(i).cos()));
        cache.extend((0..half).map(|i| angle(i).sin()));
    }
    let positions = b.values("positions", Ty::I64, &[t], pos);
    let cos_sin = b.values("cos_sin_cache", Ty::F32, &[max_pos, r], cache);
    (positions, cos_sin)
}

/// A paged cache `[nb, bs, w]` that is layer `layer` of a pool `[nb, layers, bs, w]`
/// interleaving `layers` layers (so block stride != bs * w and the view starts inside
/// the pool). Random values, or NaN poison when it is an output.
pub(crate) fn paged_cache(
    b: &mut Builder,
    nb: i64,
    bs: i64,
    w: i64,
    (layers, layer): (i64, i64),
    poison: bool,
) -> View {
    let shape = [nb, layers, bs, w];
    let pool = if poison {
        b.poison("cache pool", Ty::Float, &shape)
    } else {
        b.uniform("cache pool", &shape, -1.0, 1.0)
    };
    pool.sub(layer * bs * w, &[nb, bs, w], &[layers * bs * w, w, 1])
}

/// A block table for sequences that need `needs[b]` cache rows each: every sequence gets
/// `ceil(needs[b] / bs)` distinct blocks, shuffled over a cache of that many blocks plus
/// `spare`. Table entries past a sequence's blocks hold other valid block ids, so a
/// kernel that reads past a sequence's end sees wrong rows (caught) rather than faulting.
/// Returns (num_blocks, max_blocks_per_seq, the table `[B, MB]` row-major).
pub(crate) fn block_table(b: &mut Builder, needs: &[i64], bs: i64, spare: i64) -> (i64, i64, Vec<f64>) {
    let counts: Vec<i64> = needs.iter().map(|&n| (n + bs - 1) / bs).collect();
    let nb = (counts.iter().sum::<i64>() + spare).max(1);
    let mb = counts.iter().copied().max().unwrap_or(0) + 1;
    let mut ids: Vec<i64> = (0..nb).collect();
    ids.shuffle(&mut b.rng);
    let mut next = ids.into_iter();
    let mut table = Vec::with_capacity(needs.len() * mb as usize);
    for &count in &counts {
        for j in 0..mb {
            let id = if j < count { next.next().unwrap_or(0) } else { b.rng.gen_range(0..nb) };
            table.push(id as f64);
        }
    }
    (nb, mb, table)
}

/// `[0, x0, x0 + x1, ...]`.
pub(crate) fn cumulative(xs: &[i64]) -> Vec<f64> {
    let mut acc = 0;
    std::iter::once(0.0)
        .chain(xs.iter().map(|&x| {
            acc += x;
            acc as f64
        }))
        .collect()
}

pub(crate) fn as_f64(xs: &[i64]) -> Vec<f64> {
    xs.iter().map(|&x| x as f64).collect()
}
