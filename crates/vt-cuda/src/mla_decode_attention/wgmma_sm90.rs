//! The wgmma MlaDecodeAttention kernel (`kernels-cuda/mla_decode_attention/wgmma_sm90.cuh`,
//! sm_90a): D = 576, Dv = 512, 64 query rows per CTA, a consumer and a producer warpgroup,
//! two 72 KB KV stages loaded by cp.async or, when the block size is a multiple of 64 and
//! `VT_MLA_DECODE_TMA` is on, by the tensor memory accelerator (`mla_decode_wgmma_tma`).

use vt_core::{DType, MlaDecodeAttentionArgs, Tensor};

use super::{CacheMaps, MainKernel, THREADS, TILE_TOKENS};
use crate::launch::TensorMapSpec;

/// Query rows per CTA (`mla::WGMMA_ROWS`).
pub(super) const ROWS: u32 = 64;
/// Whole KV tiles in shared memory (`mla::Layout<MT>::STAGES`).
pub(super) const STAGES: u32 = 2;
/// mbarriers of the layout (`mla::Layout<MT>::MBARS`): one per 64-column box and stage (the
/// seesaw kernel).
const MBARS: u32 = 2 * 9;

/// Dynamic shared memory with `mt` query rows per CTA (`mla::Layout<MT>::SMEM`: Q, the KV
/// stages, P, reductions, token and bad-block flags, schedule, mbarriers, alignment).
pub(super) const fn smem(mt: u32) -> u32 {
    let tile = 9 * 64 * 128;
    9 * mt * 128
        + STAGES * tile
        + mt * 128
        + 2 * 128 * 4
        + STAGES * 64
        + STAGES * 8
        + 40 * 4
        + MBARS * 8
        + 1024
}

/// The kernel's dynamic shared memory.
pub(super) const SMEM: u32 = smem(ROWS);
const _: () = assert!(SMEM <= super::MAX_SMEM, "the layout fits a Hopper block");

/// Whether the kernel loads the cache through the TMA: a tile of 64 tokens is one box of 64
/// rows of one block (64 divides BS) and the block count fits the map's 32-bit coordinates
/// (one past the last block reads zeros). Smaller blocks take the cp.async loads: with one
/// box per block per 64 features, BS = 1 and 16 measured 5.1x and 1.07x slower through the
/// TMA on the H200 (docs/perf.md). The kernel handles any BS dividing 64.
fn tma_ok(cache: &Tensor<'_>) -> bool {
    let bs = cache.dim(1);
    bs > 0 && (bs as u64).is_multiple_of(TILE_TOKENS as u64) && cache.dim(0) < i32::MAX as i64
}

/// The cache's tensor map, (element, row in block, block) with boxes of min(BS, 64) rows of
/// one block. A 16-bit cache: 64-feature boxes, 128-byte swizzle (`vt::tc::swz`), what the
/// wgmma kernels' descriptors read. An fp8_ds_mla cache (the narrow fp8 kernel): 4-byte words,
/// a box holding whole 656-byte rows (164 words), no swizzle (the kernel reads rows as they
/// lie). The caller checked the rows (16-byte aligned start and strides) and `tma_ok`.
pub(super) fn cache_map(cache: &Tensor<'_>) -> TensorMapSpec {
    let (nb, bs, d) = (cache.dim(0) as u64, cache.dim(1) as u64, cache.dim(2) as u64);
    let elem = cache.dtype().size_of() as u64;
    // A dim of size 1 may carry any stride; the map wants a positive multiple of 16 bytes.
    let row_bytes = if bs == 1 { d * elem } else { cache.stride(1) as u64 * elem };
    let blk_bytes = if nb == 1 { bs * row_bytes } else { cache.stride(0) as u64 * elem };
    let rows = bs.min(TILE_TOKENS as u64) as u32;
    let (dims0, box0, swizzle) =
        if cache.dtype() == DType::Fp8DsMla { (d / 4, (d / 4) as u32, false) } else { (d, 64, true) };
    TensorMapSpec {
        what: "cache",
        dtype: cache.dtype(),
        addr: cache.data_addr(),
        dims: [dims0, bs, nb],
        strides: [row_bytes, blk_bytes],
        boxes: [box0, rows, 1],
        swizzle,
    }
}

/// The main launch; `tma_flag`: the `VT_MLA_DECODE_TMA` flag (the TMA loads also need
/// [`tma_ok`]).
pub(super) fn main(a: &MlaDecodeAttentionArgs<'_>, tma_flag: bool) -> MainKernel {
    let tma = tma_ok(&a.cache) && tma_flag;
    let (base, name) =
        if tma { ("mla_decode_wgmma_tma", "wgmma_tma") } else { ("mla_decode_wgmma", "wgmma") };
    MainKernel {
        base,
        name,
        rows: ROWS as i64,
        smem: SMEM,
        threads: THREADS,
        maps: CacheMaps::tiles(tma),
        ctas_per_sm: 1,
        cluster_y: 1,
    }
}

/// Fewest sequences for which Auto takes the seesaw kernel (with more than 64 query rows).
pub(super) const SEESAW_MIN_BATCH: i64 = 64;

/// Whether the seesaw kernel takes this call: a 16-bit cache read through the TMA.
pub(super) fn seesaw_ok(a: &MlaDecodeAttentionArgs<'_>, tma_flag: bool) -> bool {
    tma_flag && a.cache.dtype() != DType::Fp8DsMla && tma_ok(&a.cache)
}

/// The seesaw form of the 64-row kernel (`mla_decode_wgmma_ss`, TMA loads only): the same
/// rows, threads and layout as [`main`].
pub(super) fn seesaw() -> MainKernel {
    MainKernel {
        base: "mla_decode_wgmma_ss",
        name: "wgmma_ss",
        rows: ROWS as i64,
        smem: SMEM,
        threads: THREADS,
        maps: CacheMaps::Tiles,
        ctas_per_sm: 1,
        cluster_y: 1,
    }
}

/// Threads of the 64-row kernels with three warpgroups (`mla::FP8_WG_THREADS`,
/// `mla::W3_THREADS`): over an fp8_ds_mla cache the two compute warpgroups and one that
/// dequantizes the rows into the 16-bit stages; the three-warpgroup kernels' S warpgroup and
/// two P V warpgroups.
pub(super) const FP8_THREADS: u32 = 384;

/// The 64-row kernel over an fp8_ds_mla cache (`mla_decode_wgmma_fp8`,
/// `kernels-cuda/mla_decode_attention/wgmma_fp8_sm90.cuh`): the 16-bit kernel's layout, the
/// rows read into registers by a third warpgroup, dequantized and stored as 16-bit tiles.
pub(super) fn fp8() -> MainKernel {
    MainKernel {
        base: "mla_decode_wgmma_fp8",
        name: "wgmma_fp8",
        rows: ROWS as i64,
        smem: SMEM,
        threads: FP8_THREADS,
        maps: CacheMaps::None,
        ctas_per_sm: 1,
        cluster_y: 1,
    }
}

/// CTAs per cluster of the pair kernel, along grid.y (`mla::PAIR_CTAS`).
pub(super) const PAIR_CTAS: u32 = 2;

/// The 64-row kernel over an fp8_ds_mla cache as CTA pairs (`mla_decode_wgmma_fp8x2`,
/// `kernels-cuda/mla_decode_attention/wgmma_fp8_pair_sm90.cuh`): clusters of two CTAs along
/// the row blocks, each dequantizing half of every tile into both CTAs' stages. The row
/// blocks must come in pairs ([`pair_ok`]).
pub(super) fn fp8_pair() -> MainKernel {
    MainKernel { base: "mla_decode_wgmma_fp8x2", name: "wgmma_fp8x2", cluster_y: PAIR_CTAS, ..fp8() }
}

/// Whether the pair kernel can take `m_total` query rows: an even number of 64-row blocks
/// (the two CTAs of a cluster are consecutive row blocks of the same parts).
pub(super) fn pair_ok(m_total: i64) -> bool {
    let blocks = (m_total + ROWS as i64 - 1) / ROWS as i64;
    blocks > 0 && blocks % PAIR_CTAS as i64 == 0
}

/// Tiles in the ring of the three-warpgroup kernels (`mla::W3_SLOTS`): the 16-bit forms and the
/// gather forms.
pub(super) const W3_SLOTS: u32 = 2;

/// Tiles in the raw ring of the fp8 TMA form (`mla::W3Layout<true>::SLOTS`, the kernel's
/// `F8R_RING`): its 41 KB raw slots leave room for more than two once V is built in registers.
pub(super) const F8R_RING: u32 = 3;

/// Dynamic shared memory of a three-warpgroup kernel (`mla::W3Layout<RAW, CP>::SMEM`) with
/// `slots` tiles in its ring: the ring (16-bit: 9 column blocks of 64 x 128 bytes a slot; fp8:
/// four code boxes and a rope box of 64 x 128 bytes, then 64 x 16 bytes of scales), over an fp8
/// cache the 16-bit V stage (8 column blocks; with more than two slots only the factor tables, 1
/// KB a slot), Q (16-bit: 9 column blocks; fp8: e4m3 hi / lo parts, 4 groups x 2 x 64 x 128
/// bytes), P, the reductions (256 floats), the slots' token counts (8-byte aligned), the
/// schedule, the mbarriers (full and empty per slot, P free), the gather form's flags per slot,
/// alignment.
const fn w3_layout(fp8: bool, cp: bool, slots: u32) -> u32 {
    let block = 64 * 128;
    let (slot, v, q) = if fp8 {
        (5 * block + 64 * 16, if slots > W3_SLOTS { slots * 1024 } else { 8 * block }, 8 * block)
    } else {
        (9 * block, 0, 9 * block)
    };
    let flags = if cp { slots * W3_FLAG_BYTES } else { 0 };
    slots * slot
        + v
        + q
        + ROWS * 128
        + 256 * 4
        + (slots * 4).div_ceil(8) * 8
        + 40 * 4
        + (2 * slots + 1) * 8
        + flags
        + 1024
}

/// Tiles in the ring of a three-warpgroup kernel's TMA form (`mla::W3Layout<fp8>::SLOTS`).
pub(super) const fn w3_slots(fp8: bool) -> u32 {
    if fp8 {
        F8R_RING
    } else {
        W3_SLOTS
    }
}

/// Dynamic shared memory of the three-warpgroup kernels' TMA forms (`mla::W3Layout<fp8>::SMEM`).
pub(super) const fn w3_smem(fp8: bool) -> u32 {
    w3_layout(fp8, false, w3_slots(fp8))
}
const _: () = assert!(
    w3_smem(true) <= super::MAX_SMEM && w3_smem(false) <= super::MAX_SMEM,
    "the three-warpgroup layouts fit a Hopper block"
);

/// Whether the three-warpgroup kernel takes this call over a 16-bit cache: read through the
/// TMA (64 divides the block size, `VT_MLA_DECODE_TMA` on).
pub(super) fn three_wg_ok(a: &MlaDecodeAttentionArgs<'_>, tma_flag: bool) -> bool {
    tma_flag && a.cache.dtype() != DType::Fp8DsMla && tma_ok(&a.cache)
}

/// Whether the cache's pages are 16 or 32 rows (a tile is 4 or 2 whole pages, one TMA box of
/// BS rows each per 64 features; the bad-block mask of the paged forms is per 16 tokens) and
/// the block count fits the map's 32-bit coordinates.
fn paged_tma_ok(cache: &Tensor<'_>) -> bool {
    matches!(cache.dim(1), 16 | 32) && cache.dim(0) < i32::MAX as i64
}

/// Whether the three-warpgroup kernel's paged TMA form (`wgmma_3wg_pg`, [`three_wg_paged`])
/// takes this call: a 16-bit cache of 16- or 32-row pages, `VT_MLA_DECODE_TMA` on.
pub(super) fn three_wg_paged_ok(a: &MlaDecodeAttentionArgs<'_>, tma_flag: bool) -> bool {
    tma_flag && a.cache.dtype() != DType::Fp8DsMla && paged_tma_ok(&a.cache)
}

/// Whether either TMA form of the three-warpgroup kernel ([`three_wg_ok`]'s 64-row pages or
/// [`three_wg_paged_ok`]'s 16- and 32-row pages) takes this call: what its CTA pairs need.
pub(super) fn three_wg_tma_ok(a: &MlaDecodeAttentionArgs<'_>, tma_flag: bool) -> bool {
    three_wg_ok(a, tma_flag) || three_wg_paged_ok(a, tma_flag)
}

/// Token and bad-block flags per ring slot of the three-warpgroup kernel's gather form
/// (`mla::W3Layout<false, true>::VALID_BYTES`).
const W3_FLAG_BYTES: u32 = 64 + 8;

/// Dynamic shared memory of the three-warpgroup kernels' gather forms
/// (`mla::W3Layout<fp8, true>::SMEM`): two slots, and each slot's flags.
pub(super) const fn w3_cp_smem(fp8: bool) -> u32 {
    w3_layout(fp8, true, W3_SLOTS)
}
const _: () = assert!(
    w3_cp_smem(false) <= super::MAX_SMEM && w3_cp_smem(true) <= super::MAX_SMEM,
    "the gather forms fit a Hopper block"
);

/// A three-warpgroup 64-row kernel (`kernels-cuda/mla_decode_attention/wgmma_3wg_sm90.cuh`):
/// over a 16-bit cache (`mla_decode_wgmma_3wg`) or, `fp8`, an fp8_ds_mla cache
/// (`mla_decode_wgmma_fp8r`), read through the TMA or, without it, in its gather form (`_cp`: any
/// block size, each row looked up and copied by cp.async from warpgroups 1 and 2; no tensor map,
/// each slot's token flags in shared memory).
fn w3_kernel(fp8: bool, tma: bool) -> MainKernel {
    let (base, name) = match (fp8, tma) {
        (false, true) => ("mla_decode_wgmma_3wg", "wgmma_3wg"),
        (false, false) => ("mla_decode_wgmma_3wg_cp", "wgmma_3wg_cp"),
        (true, true) => ("mla_decode_wgmma_fp8r", "wgmma_fp8r"),
        (true, false) => ("mla_decode_wgmma_fp8r_cp", "wgmma_fp8r_cp"),
    };
    let (smem, maps) = match (fp8, tma) {
        (_, false) => (w3_cp_smem(fp8), CacheMaps::None),
        (false, true) => (w3_smem(false), CacheMaps::Tiles),
        (true, true) => (w3_smem(true), CacheMaps::Fp8Rows),
    };
    MainKernel {
        base,
        name,
        rows: ROWS as i64,
        smem,
        threads: FP8_THREADS,
        maps,
        ctas_per_sm: 1,
        cluster_y: 1,
    }
}

/// The three-warpgroup 64-row kernel over a 16-bit cache: warpgroup 0 computes S and the
/// softmax, warpgroups 1 and 2 one half of P V each, a two-slot ring ([`w3_kernel`]). Read
/// through the TMA when [`three_wg_ok`]; else its gather form, Auto's choice at most 16 query
/// rows (above, a forced [`super::Kernel::Wgmma3`] or `VT_MLA_GATHER`; docs/perf.md,
/// "Twenty-fourth session").
pub(super) fn three_wg(a: &MlaDecodeAttentionArgs<'_>, tma_flag: bool) -> MainKernel {
    w3_kernel(false, three_wg_ok(a, tma_flag))
}

/// The three-warpgroup kernel's TMA form over pages of 16 or 32 rows (`mla_decode_wgmma_3wg_pg`,
/// [`three_wg_paged_ok`]): a tile is 2-4 pages, each 64-feature column block one TMA box of BS
/// rows a page (the cache's map, [`cache_map`], has boxes of BS rows), pages with a block id
/// outside the cache read as zeros and masked by a per-16-token bit beside the tile's count.
/// The same ring, barriers and warpgroups as the 64-row pages' form.
pub(super) fn three_wg_paged() -> MainKernel {
    MainKernel { base: "mla_decode_wgmma_3wg_pg", name: "wgmma_3wg_pg", ..w3_kernel(false, true) }
}

/// Fewest sequences for which Auto takes [`three_wg_pair`] (at one sequence the two cluster
/// barriers cost an H100 3-4%; at 32 and more the pair was as fast or faster on both cards).
pub(super) const THREE_WG_PAIR_MIN_BATCH: i64 = 32;

/// The three-warpgroup kernel's TMA form as CTA pairs (`mla_decode_wgmma_3wg_x2`, clusters of
/// [`PAIR_CTAS`] along the row blocks, each tile read once for both; [`pair_ok`] rows); `paged`:
/// over pages of 16 or 32 rows (`mla_decode_wgmma_3wg_x2_pg`, as [`three_wg_paged`]).
pub(super) fn three_wg_pair(paged: bool) -> MainKernel {
    let (base, name) = if paged {
        ("mla_decode_wgmma_3wg_x2_pg", "wgmma_3wg_x2_pg")
    } else {
        ("mla_decode_wgmma_3wg_x2", "wgmma_3wg_x2")
    };
    MainKernel { base, name, cluster_y: PAIR_CTAS, ..w3_kernel(false, true) }
}

/// Whether the raw-ring kernel can take this call at all: bf16 queries (its rope product takes
/// the cache's bf16 rope as it lies) over an fp8_ds_mla cache.
pub(super) fn fp8_raw_dtypes(a: &MlaDecodeAttentionArgs<'_>) -> bool {
    a.query.dtype() == DType::BF16 && a.cache.dtype() == DType::Fp8DsMla
}

/// Whether the raw-ring kernel takes this call through the TMA (Auto's condition): its dtypes
/// ([`fp8_raw_dtypes`]) and a cache the TMA reads (64 divides the block size,
/// `VT_MLA_DECODE_TMA` on).
pub(super) fn fp8_raw_ok(a: &MlaDecodeAttentionArgs<'_>, tma_flag: bool) -> bool {
    tma_flag && fp8_raw_dtypes(a) && tma_ok(&a.cache)
}

/// The three-warpgroup 64-row kernel over an fp8_ds_mla cache ([`w3_kernel`]): a two-slot ring
/// of raw tiles, S as an e4m3 product against the query's hi / lo parts, V^T built in registers
/// from the codes by the two warpgroups that multiply it. Through the TMA when [`fp8_raw_ok`];
/// else its gather form, which only a forced [`super::Kernel::WgmmaFp8Raw`] or `VT_MLA_GATHER`
/// takes.
pub(super) fn fp8_raw(a: &MlaDecodeAttentionArgs<'_>, tma_flag: bool) -> MainKernel {
    w3_kernel(true, fp8_raw_ok(a, tma_flag))
}

/// The raw-ring kernel's two maps of the cache's rows, as 4-byte words (164 a row): 32-word
/// boxes of 64 rows with the 128-byte swizzle (a code group, or the rope: wgmma's K-major
/// operand layout), and 4-word boxes of 64 rows, unswizzled (the scales). The caller checked
/// [`fp8_raw_ok`] and the rows' alignment.
pub(super) fn fp8_raw_maps(cache: &Tensor<'_>) -> [TensorMapSpec; 2] {
    let rows = TensorMapSpec { boxes: [32, TILE_TOKENS as u32, 1], swizzle: true, ..cache_map(cache) };
    let scales = TensorMapSpec {
        what: "cache (scales)",
        boxes: [4, TILE_TOKENS as u32, 1],
        swizzle: false,
        ..rows.clone()
    };
    [rows, scales]
}

/// Query rows per CTA of the narrow kernel (`mla_decode_wgmma_n{16,32}`,
/// `kernels-cuda/mla_decode_attention/wgmma_narrow_sm90.cuh`): the fewer of 16 and 32 that
/// holds `m_total` = s_q * N rows (more take several row blocks of 32).
pub(super) fn narrow_rows(m_total: i64) -> u32 {
    if m_total <= 16 {
        16
    } else {
        32
    }
}

/// Dynamic shared memory of the narrow kernel with `mt` query rows per CTA
/// (`mla::NarrowLayout<MT>::SMEM`: Q, the KV stages, P^T, the cross-warp reductions, token and
/// bad-block flags, schedule, mbarriers, alignment).
pub(super) const fn narrow_smem(mt: u32) -> u32 {
    let tile = 9 * 64 * 128;
    9 * mt * 128
        + STAGES * tile
        + mt * 128
        + 16 * mt * 4
        + STAGES * 64
        + STAGES * 8
        + 40 * 4
        + STAGES * 8
        + 1024
}
const _: () = assert!(narrow_smem(32) <= super::MAX_SMEM, "the narrow layout fits a Hopper block");

/// Tiles of raw 656-byte rows in the ring of the narrow kernel over an fp8_ds_mla cache
/// (`mla::NarrowFp8Layout<MT>::RAWS`): four at 16 rows per CTA, three at 32.
pub(super) const fn narrow_fp8_raws(mt: u32) -> u32 {
    if mt == 16 {
        4
    } else {
        3
    }
}

/// Threads of the narrow kernel over an fp8_ds_mla cache (`mla::NF8_THREADS`): the softmax
/// warpgroup, the output warpgroup and a third whose first warp is the producer.
pub(super) const NARROW_FP8_THREADS: u32 = 384;

/// Dynamic shared memory of the narrow kernel over an fp8_ds_mla cache with `mt` query rows
/// (`mla::NarrowFp8Layout<MT>::SMEM`: Q, the ring of raw tiles, two buffers of four P^T, the
/// reductions, token flags per ring slot, schedule, mbarriers (ring full / empty, P^T free),
/// alignment).
pub(super) const fn narrow_fp8_smem(mt: u32) -> u32 {
    let raws = narrow_fp8_raws(mt);
    9 * mt * 128
        + raws * 64 * 656
        + 2 * 4 * mt * 128
        + 20 * mt * 4
        + raws * 64
        + raws * 8
        + 40 * 4
        + (2 * raws + 2) * 8
        + 1024
}
const _: () = assert!(narrow_fp8_smem(16) <= super::MAX_SMEM && narrow_fp8_smem(32) <= super::MAX_SMEM);

/// The narrow kernel's main launch (both products transposed: the tile's tokens on wgmma's M,
/// the query rows on N); loads as [`main`]. Over an fp8_ds_mla cache: a producer warp fills a
/// ring of raw rows (one TMA box a tile where [`tma_ok`] and the flag allow, else a bulk copy
/// per row), and both products take the cache operand from registers.
pub(super) fn narrow(a: &MlaDecodeAttentionArgs<'_>, m_total: i64, tma_flag: bool) -> MainKernel {
    let mt = narrow_rows(m_total);
    if a.cache.dtype() == DType::Fp8DsMla {
        // One TMA box a tile (a whole 64-row page piece) where 64 divides BS, else a bulk
        // copy per row.
        let tma = tma_ok(&a.cache) && tma_flag;
        let (base, name) = match (mt, tma) {
            (16, false) => ("mla_decode_wgmma_n16_fp8", "wgmma_n16_fp8"),
            (16, true) => ("mla_decode_wgmma_n16_fp8_tma", "wgmma_n16_fp8_tma"),
            (_, false) => ("mla_decode_wgmma_n32_fp8", "wgmma_n32_fp8"),
            (_, true) => ("mla_decode_wgmma_n32_fp8_tma", "wgmma_n32_fp8_tma"),
        };
        let smem = narrow_fp8_smem(mt);
        return MainKernel {
            base,
            name,
            rows: mt as i64,
            smem,
            threads: NARROW_FP8_THREADS,
            maps: CacheMaps::tiles(tma),
            ctas_per_sm: 1,
            cluster_y: 1,
        };
    }
    let tma = tma_ok(&a.cache) && tma_flag;
    let (base, name) = match (mt, tma) {
        (16, false) => ("mla_decode_wgmma_n16", "wgmma_n16"),
        (16, true) => ("mla_decode_wgmma_n16_tma", "wgmma_n16_tma"),
        (_, false) => ("mla_decode_wgmma_n32", "wgmma_n32"),
        (_, true) => ("mla_decode_wgmma_n32_tma", "wgmma_n32_tma"),
    };
    MainKernel {
        base,
        name,
        rows: mt as i64,
        smem: narrow_smem(mt),
        threads: THREADS,
        maps: CacheMaps::tiles(tma),
        ctas_per_sm: 1,
        cluster_y: 1,
    }
}
