//! Which kernel `Kernel::Auto` takes, without a GPU: `choose` on views of host memory for the
//! devices the dispatch distinguishes (an H200: sm_90 with the wgmma kernels and 227 KB of
//! shared memory per block; an sm_80 with as much; an A100's 163 KB).

use vt_core::{contiguous_strides, DType, MlaDecodeAttentionArgs, Tensor};

use super::{choose, wgmma_sm90, CacheMaps, ChoiceFlags, DecodeOptions, DeviceInfo, Plan, MAX_SMEM};

const H200: DeviceInfo =
    DeviceInfo { sm: 90, sms: 132, wgmma: true, smem_optin: MAX_SMEM, pair_clusters: 66 };
const SM80_LARGE: DeviceInfo =
    DeviceInfo { sm: 80, sms: 108, wgmma: false, smem_optin: MAX_SMEM, pair_clusters: 0 };
const A100: DeviceInfo = DeviceInfo { sm: 80, sms: 108, wgmma: false, smem_optin: 166_912, pair_clusters: 0 };

/// (kernel name, rows per CTA, row blocks, threads) of Auto for `heads` query heads, s_q 1,
/// a bf16 query and a cache of `cache_dt` with block size `bs`.
fn auto(info: &DeviceInfo, heads: i64, cache_dt: DType, bs: i64) -> (&'static str, u32, u32, u32) {
    auto_with(info, heads, cache_dt, bs, 2, true)
}

/// [`auto`] with `b` sequences and the `VT_MLA_SEESAW` flag given.
fn auto_with(
    info: &DeviceInfo,
    heads: i64,
    cache_dt: DType,
    bs: i64,
    b: i64,
    seesaw: bool,
) -> (&'static str, u32, u32, u32) {
    auto_flags(info, heads, cache_dt, bs, b, ChoiceFlags::new(true, seesaw))
}

/// Auto's plan for the views `a` on `info` with `flags`.
fn auto_plan(a: &MlaDecodeAttentionArgs<'_>, info: &DeviceInfo, flags: ChoiceFlags) -> Plan {
    choose(a, info, &DecodeOptions::default(), flags).expect("a plan").plan
}

/// [`auto`] with `b` sequences and every flag given.
fn auto_flags(
    info: &DeviceInfo,
    heads: i64,
    cache_dt: DType,
    bs: i64,
    b: i64,
    flags: ChoiceFlags,
) -> (&'static str, u32, u32, u32) {
    let w = if cache_dt == DType::Fp8DsMla { 656 } else { 576 };
    // Room for the largest view (the query, or the cache) as 16-bit elements.
    let elems = (b * heads * 576).max(8 * bs * w) as usize;
    let mem = vec![0u128; elems / 8 + 1];
    let view = |dt: DType, shape: &[i64]| -> Tensor<'_> {
        let s = contiguous_strides(shape);
        crate::test_util::host_view(&mem, dt, 0, shape, &s[..shape.len()])
    };
    let a = MlaDecodeAttentionArgs {
        out: view(DType::BF16, &[b, 1, heads, 512]),
        lse: None,
        query: view(DType::BF16, &[b, 1, heads, 576]),
        cache: view(cache_dt, &[8, bs, w]),
        block_table: view(DType::I32, &[b, 4]),
        seq_lens: view(DType::I32, &[b]),
        scale: 0.5,
    };
    let c = choose(&a, info, &DecodeOptions::default(), flags).expect("a plan");
    (c.plan.kernel, c.plan.rows_per_cta, c.plan.row_blocks, c.main.threads)
}

#[test]
fn auto_over_an_fp8_cache_takes_the_narrow_kernel_up_to_32_rows_and_the_64_row_kernel_above_on_sm90() {
    // Block sizes that 64 divides load a tile as one TMA box (the flag is on here).
    for (heads, want) in
        [(8, "wgmma_n16_fp8"), (16, "wgmma_n16_fp8"), (24, "wgmma_n32_fp8"), (32, "wgmma_n32_fp8")]
    {
        assert_eq!(auto(&H200, heads, DType::Fp8DsMla, 64).0, format!("{want}_tma"), "{heads} heads");
        assert_eq!(auto(&H200, heads, DType::Fp8DsMla, 16).0, want, "{heads} heads, BS 16");
    }
    // Above 32 rows: the raw-ring kernel where the TMA reads the cache, else the dequantizing
    // warpgroup's kernel.
    for (heads, blocks) in [(64, 1), (128, 2)] {
        for (bs, want) in [(1, "wgmma_fp8"), (16, "wgmma_fp8"), (64, "wgmma_fp8r"), (128, "wgmma_fp8r")] {
            let got = auto(&H200, heads, DType::Fp8DsMla, bs);
            assert_eq!(got, (want, 64, blocks, wgmma_sm90::FP8_THREADS), "{heads} heads, block size {bs}");
        }
    }
}

#[test]
fn auto_over_an_fp8_cache_without_wgmma_takes_the_mma_kernels() {
    assert_eq!(auto(&SM80_LARGE, 128, DType::Fp8DsMla, 64).0, "mma64_fp8");
    assert_eq!(auto(&SM80_LARGE, 16, DType::Fp8DsMla, 64).0, "mma16_fp8");
    // An A100's shared memory holds the small ring at 16 rows; 64 rows of fp8 have no
    // small-ring kernel and take the generic kernel.
    assert_eq!(auto(&A100, 16, DType::Fp8DsMla, 64).0, "mma16s_fp8");
    assert_eq!(auto(&A100, 128, DType::Fp8DsMla, 64).0, "generic_fp8");
}

#[test]
fn auto_over_a_16_bit_cache_keeps_the_wgmma_kernels_on_sm90() {
    // More than 32 rows through the TMA: the three-warpgroup kernel.
    assert_eq!(auto(&H200, 128, DType::BF16, 64), ("wgmma_3wg", 64, 2, 384));
    assert_eq!(auto(&H200, 40, DType::BF16, 128), ("wgmma_3wg", 64, 1, 384));
    // Two or more row blocks of a batch of 64+ through the TMA: the seesaw form, unless its
    // flag is off; one row block and smaller batches keep the three-warpgroup kernel, cp.async
    // loads the two-warpgroup one.
    assert_eq!(auto_with(&H200, 128, DType::BF16, 64, 64, true), ("wgmma_ss", 64, 2, 256));
    assert_eq!(auto_with(&H200, 128, DType::BF16, 128, 128, true), ("wgmma_ss", 64, 2, 256));
    assert_eq!(auto_with(&H200, 128, DType::BF16, 64, 128, false), ("wgmma_3wg", 64, 2, 384));
    assert_eq!(auto_with(&H200, 128, DType::BF16, 64, 63, true), ("wgmma_3wg", 64, 2, 384));
    assert_eq!(auto_with(&H200, 64, DType::BF16, 64, 128, true), ("wgmma_3wg", 64, 1, 384));
    // Pages of 16 or 32 rows: the three-warpgroup kernel's paged TMA form; of 1 row, cp.async.
    assert_eq!(auto_with(&H200, 128, DType::BF16, 16, 128, true), ("wgmma_3wg_pg", 64, 2, 384));
    assert_eq!(auto_with(&H200, 128, DType::BF16, 32, 2, true), ("wgmma_3wg_pg", 64, 2, 384));
    assert_eq!(auto_with(&H200, 128, DType::BF16, 1, 128, true), ("wgmma", 64, 2, 256));
    assert_eq!(auto_with(&H200, 128, DType::Fp8DsMla, 64, 128, true).0, "wgmma_fp8r");
    assert_eq!(auto(&H200, 64, DType::BF16, 16).0, "wgmma_3wg_pg");
    assert_eq!(auto(&H200, 64, DType::BF16, 8).0, "wgmma");
    assert_eq!(auto(&H200, 16, DType::BF16, 64).0, "wgmma_n16_tma");
}

/// At most 16 rows over a 16-bit cache the TMA does not read (block sizes 1 and 16), Auto takes
/// the three-warpgroup kernel's gather form; above 16 rows, over an fp8 cache, without wgmma or
/// with `VT_MLA_3WG` off it keeps what it took before (cp.async wgmma, the narrow fp8 kernel,
/// mma16).
#[test]
fn auto_takes_the_gather_form_at_most_16_rows_where_the_tma_does_not_read() {
    for heads in [1, 8, 16] {
        for bs in [1, 16] {
            let got = auto(&H200, heads, DType::BF16, bs);
            assert_eq!(got, ("wgmma_3wg_cp", 64, 1, wgmma_sm90::FP8_THREADS), "{heads} heads, BS {bs}");
            assert_eq!(auto(&H200, heads, DType::F16, bs).0, "wgmma_3wg_cp", "f16, {heads} heads, BS {bs}");
        }
    }
    assert_eq!(auto(&H200, 24, DType::BF16, 16).0, "wgmma");
    assert_eq!(auto(&H200, 16, DType::Fp8DsMla, 16).0, "wgmma_n16_fp8");
    assert_eq!(auto(&SM80_LARGE, 16, DType::BF16, 16).0, "mma16");
    let off = ChoiceFlags { three_wg: false, ..ChoiceFlags::new(true, false) };
    assert_eq!(auto_flags(&H200, 16, DType::BF16, 1, 2, off).0, "mma16", "VT_MLA_3WG off");
}

/// The cache's TMA map per cache dtype: 64-feature swizzled boxes of a bf16 cache; whole
/// 656-byte rows as 164 four-byte words, unswizzled, for an fp8_ds_mla cache (padded rows
/// keep their byte stride).
#[test]
fn cache_map_takes_64_feature_boxes_of_a_bf16_cache_and_whole_rows_of_an_fp8_cache() {
    let mem = vec![0u128; 1 << 16];
    let bf16 = crate::test_util::host_view(&mem, DType::BF16, 0, &[8, 64, 576], &[64 * 576, 576, 1]);
    let m = wgmma_sm90::cache_map(&bf16);
    assert_eq!((m.dims, m.strides, m.boxes, m.swizzle), ([576, 64, 8], [1152, 73728], [64, 64, 1], true));
    let fp8 = crate::test_util::host_view(&mem, DType::Fp8DsMla, 0, &[8, 128, 656], &[128 * 704, 704, 1]);
    let m = wgmma_sm90::cache_map(&fp8);
    assert_eq!((m.dims, m.strides, m.boxes, m.swizzle), ([164, 128, 8], [704, 90112], [164, 64, 1], false));
}

/// The raw-ring kernel's two maps: the rows' 4-byte words in 32-word swizzled boxes (a code
/// group or the rope) and 4-word unswizzled boxes (the scales), of 64 rows, at the cache's
/// byte strides.
#[test]
fn fp8_raw_maps_take_swizzled_32_word_boxes_and_4_word_scale_boxes() {
    let mem = vec![0u128; 1 << 16];
    let fp8 = crate::test_util::host_view(&mem, DType::Fp8DsMla, 0, &[8, 128, 656], &[128 * 704, 704, 1]);
    let [rows, scales] = wgmma_sm90::fp8_raw_maps(&fp8);
    assert_eq!(
        (rows.dims, rows.strides, rows.boxes, rows.swizzle),
        ([164, 128, 8], [704, 90112], [32, 64, 1], true)
    );
    assert_eq!(
        (scales.dims, scales.strides, scales.boxes, scales.swizzle),
        ([164, 128, 8], [704, 90112], [4, 64, 1], false)
    );
}

/// Views over `mem` of a call with 2 sequences, s_q 1, 128 heads, `qdt` query and out, a cache
/// of `cdt` (656-byte rows for fp8_ds_mla, else D = 576) with 8 blocks of `bs` tokens.
fn heads_128_args(mem: &[u128], qdt: DType, cdt: DType, bs: i64) -> MlaDecodeAttentionArgs<'_> {
    heads_128_batch_args(mem, qdt, cdt, bs, 2)
}

/// [`heads_128_args`] with `b` sequences (`mem` holds b x 128 x 576 16-bit values or more).
fn heads_128_batch_args(mem: &[u128], qdt: DType, cdt: DType, bs: i64, b: i64) -> MlaDecodeAttentionArgs<'_> {
    let view = |dt: DType, shape: &[i64]| -> Tensor<'_> {
        let s = contiguous_strides(shape);
        crate::test_util::host_view(mem, dt, 0, shape, &s[..shape.len()])
    };
    MlaDecodeAttentionArgs {
        out: view(qdt, &[b, 1, 128, 512]),
        lse: None,
        query: view(qdt, &[b, 1, 128, 576]),
        cache: view(cdt, &[8, bs, if cdt == DType::Fp8DsMla { 656 } else { 576 }]),
        block_table: view(DType::I32, &[b, 4]),
        seq_lens: view(DType::I32, &[b]),
        scale: 0.5,
    }
}

/// The raw-ring kernel is what Auto takes above 32 rows over an fp8 cache the TMA reads; forced,
/// it runs its gather form where the TMA cannot read the cache (block sizes that 64 does not
/// divide, the TMA flag off), which Auto never takes, and refuses f16 queries, naming itself.
#[test]
fn raw_ring_kernel_is_autos_choice_over_a_tma_fp8_cache_and_gathers_small_blocks_when_forced() {
    use super::Kernel;
    let mem = vec![0u128; 1 << 16];
    let args = |qdt: DType, bs: i64| heads_128_args(&mem, qdt, DType::Fp8DsMla, bs);
    let forced = DecodeOptions { kernel: Kernel::WgmmaFp8Raw, ..DecodeOptions::default() };
    let c = choose(&args(DType::BF16, 64), &H200, &forced, ChoiceFlags::new(true, true))
        .expect("bf16, BS 64, TMA");
    assert_eq!((c.plan.kernel, c.plan.rows_per_cta, c.plan.row_blocks), ("wgmma_fp8r", 64, 2));
    assert_eq!((c.main.threads, c.main.smem), (wgmma_sm90::FP8_THREADS, wgmma_sm90::w3_smem(true)));
    assert_eq!(c.main.maps, CacheMaps::Fp8Rows);
    for (qdt, bs, tma, want) in [
        (DType::BF16, 64, true, "wgmma_fp8r"),
        (DType::BF16, 128, true, "wgmma_fp8r"),
        (DType::F16, 64, true, "wgmma_fp8"),
        (DType::BF16, 16, true, "wgmma_fp8"),
        (DType::BF16, 64, false, "wgmma_fp8"),
    ] {
        let auto = choose(&args(qdt, bs), &H200, &DecodeOptions::default(), ChoiceFlags::new(tma, true))
            .expect("a plan");
        assert_eq!(auto.plan.kernel, want, "Auto, {qdt:?} BS {bs} TMA {tma}");
    }
    for (bs, tma) in [(1, true), (16, true), (64, false)] {
        let c = choose(&args(DType::BF16, bs), &H200, &forced, ChoiceFlags::new(tma, true))
            .expect("the gather form");
        assert_eq!((c.plan.kernel, c.plan.rows_per_cta, c.plan.row_blocks), ("wgmma_fp8r_cp", 64, 2));
        assert_eq!((c.main.threads, c.main.smem), (wgmma_sm90::FP8_THREADS, wgmma_sm90::w3_cp_smem(true)));
        assert_eq!(c.main.maps, CacheMaps::None, "BS {bs} TMA {tma}: no tensor map");
    }
    let e = choose(&args(DType::F16, 64), &H200, &forced, ChoiceFlags::new(true, true))
        .expect_err("refused")
        .to_string();
    assert!(e.contains("raw-ring fp8 kernel needs bf16 queries"), "{e}");
    let e = choose(&args(DType::BF16, 64), &SM80_LARGE, &forced, ChoiceFlags::new(true, true))
        .expect_err("no wgmma")
        .to_string();
    assert!(e.contains("no sm_90a wgmma kernel"), "{e}");
}

/// The three-warpgroup kernel over a 16-bit cache: Auto's choice above 32 rows through the TMA;
/// forced, its gather form where the TMA cannot read the cache (block sizes that 64 does not
/// divide, the TMA flag off), which Auto does not take at 128 heads; an fp8_ds_mla cache is
/// refused (the raw-ring kernel is its fp8 form).
#[test]
fn three_warpgroup_kernel_gathers_small_blocks_and_refuses_fp8() {
    use super::Kernel;
    let mem = vec![0u128; 1 << 16];
    let args = |qdt: DType, cdt: DType, bs: i64| heads_128_args(&mem, qdt, cdt, bs);
    let forced = DecodeOptions { kernel: Kernel::Wgmma3, ..DecodeOptions::default() };
    for dt in [DType::BF16, DType::F16] {
        let c = choose(&args(dt, dt, 64), &H200, &forced, ChoiceFlags::new(true, true))
            .expect("16-bit, BS 64, TMA");
        assert_eq!((c.plan.kernel, c.plan.rows_per_cta, c.plan.row_blocks), ("wgmma_3wg", 64, 2));
        assert_eq!((c.main.threads, c.main.smem), (wgmma_sm90::FP8_THREADS, wgmma_sm90::w3_smem(false)));
        assert_eq!(c.main.maps, CacheMaps::Tiles);
        let auto = choose(&args(dt, dt, 64), &H200, &DecodeOptions::default(), ChoiceFlags::new(true, false))
            .expect("a plan");
        assert_eq!(auto.plan.kernel, "wgmma_3wg", "Auto, {dt:?}");
        for (bs, tma) in [(1, true), (16, true), (64, false)] {
            let c = choose(&args(dt, dt, bs), &H200, &forced, ChoiceFlags::new(tma, true))
                .expect("the gather form");
            assert_eq!((c.plan.kernel, c.plan.rows_per_cta, c.plan.row_blocks), ("wgmma_3wg_cp", 64, 2));
            assert_eq!(
                (c.main.threads, c.main.smem),
                (wgmma_sm90::FP8_THREADS, wgmma_sm90::w3_cp_smem(false))
            );
            assert_eq!(c.main.maps, CacheMaps::None, "BS {bs} TMA {tma}: no tensor map");
            let auto =
                choose(&args(dt, dt, bs), &H200, &DecodeOptions::default(), ChoiceFlags::new(tma, false))
                    .expect("a plan");
            assert_ne!(auto.plan.kernel, "wgmma_3wg_cp", "Auto keeps the cp.async kernel at 128 heads");
        }
    }
    let e = choose(&args(DType::BF16, DType::Fp8DsMla, 64), &H200, &forced, ChoiceFlags::new(true, true))
        .expect_err("refused")
        .to_string();
    assert!(e.contains("three-warpgroup kernel needs a 16-bit cache"), "{e}");
}

/// `VT_MLA_GATHER` on: above 32 rows over a cache the TMA does not read, Auto takes the
/// three-warpgroup kernels' gather forms (the fp8 one with bf16 queries only); at 32 rows and
/// below, over a TMA cache, and with `VT_MLA_3WG` off, nothing changes.
#[test]
fn gather_flag_makes_auto_take_the_gather_forms_where_the_tma_does_not_read() {
    let mem = vec![0u128; 1 << 16];
    let on = ChoiceFlags { gather: true, ..ChoiceFlags::new(true, false) };
    let auto = |qdt: DType, cdt: DType, bs: i64, flags: ChoiceFlags| {
        choose(&heads_128_args(&mem, qdt, cdt, bs), &H200, &DecodeOptions::default(), flags)
            .expect("a plan")
            .plan
            .kernel
    };
    for (qdt, cdt, bs, want) in [
        (DType::BF16, DType::BF16, 1, "wgmma_3wg_cp"),
        (DType::F16, DType::F16, 8, "wgmma_3wg_cp"),
        // Pages of 16 rows: the TMA reads them (the paged form).
        (DType::F16, DType::F16, 16, "wgmma_3wg_pg"),
        (DType::BF16, DType::BF16, 64, "wgmma_3wg"),
        (DType::BF16, DType::Fp8DsMla, 16, "wgmma_fp8r_cp"),
        (DType::BF16, DType::Fp8DsMla, 64, "wgmma_fp8r"),
        (DType::F16, DType::Fp8DsMla, 16, "wgmma_fp8"),
    ] {
        assert_eq!(auto(qdt, cdt, bs, on), want, "{qdt:?} over {cdt:?}, BS {bs}");
        let off = auto(qdt, cdt, bs, ChoiceFlags::new(true, false));
        assert!(!off.ends_with("_cp"), "flag off: {off}");
    }
    let no_tma = ChoiceFlags { gather: true, ..ChoiceFlags::new(false, false) };
    assert_eq!(auto(DType::BF16, DType::BF16, 64, no_tma), "wgmma_3wg_cp");
    let no_3wg = ChoiceFlags { three_wg: false, ..on };
    assert_eq!(auto(DType::BF16, DType::BF16, 16, no_3wg), "wgmma");
}

/// `VT_MLA_3WG` off restores the two-warpgroup kernels above 32 rows, over both caches.
#[test]
fn three_warpgroup_flag_off_restores_the_two_warpgroup_kernels() {
    let mem = vec![0u128; 1 << 16];
    let off = ChoiceFlags { three_wg: false, ..ChoiceFlags::new(true, false) };
    for (qdt, cdt, want) in [
        (DType::BF16, DType::BF16, "wgmma_tma"),
        (DType::F16, DType::F16, "wgmma_tma"),
        (DType::BF16, DType::Fp8DsMla, "wgmma_fp8"),
    ] {
        let c = choose(&heads_128_args(&mem, qdt, cdt, 64), &H200, &DecodeOptions::default(), off)
            .expect("a plan");
        assert_eq!(c.plan.kernel, want, "{qdt:?} over {cdt:?}");
    }
}

/// `VT_MLA_FP8_PAIR` on: where Auto takes the dequantizing fp8 kernel (a cache the TMA does not
/// read) with row blocks in pairs, it takes the CTA-pair form instead, its parts capped by the
/// clusters the device holds at once; an odd number of row blocks, a 16-bit cache, a TMA-read
/// cache (the raw-ring kernel's) and a device that reports no clusters keep their kernels, and
/// forcing the pair where it cannot run is an error naming what it needs.
#[test]
fn pair_flag_makes_auto_take_the_cta_pair_form_of_the_fp8_kernel_over_paired_row_blocks() {
    use super::Kernel;
    let mem = vec![0u128; 1 << 16];
    let on = ChoiceFlags { pair: true, ..ChoiceFlags::new(true, false) };
    let h128 = heads_128_args(&mem, DType::BF16, DType::Fp8DsMla, 1);
    let p = auto_plan(&h128, &H200, on);
    assert_eq!((p.kernel, p.row_blocks, p.parts), ("wgmma_fp8x2", 2, 66));
    assert_eq!(auto_plan(&h128, &H200, ChoiceFlags::new(true, false)).kernel, "wgmma_fp8");
    // Fewer clusters resident than SMs / 2: one wave of them.
    let odd_gpcs = DeviceInfo { pair_clusters: 60, ..H200 };
    assert_eq!(auto_plan(&h128, &odd_gpcs, on).parts, 60);
    let none = DeviceInfo { pair_clusters: 0, ..H200 };
    assert_eq!(auto_plan(&h128, &none, on).kernel, "wgmma_fp8");
    // The TMA reads block size 64: the raw-ring kernel stays Auto's choice.
    assert_eq!(
        auto_plan(&heads_128_args(&mem, DType::BF16, DType::Fp8DsMla, 64), &H200, on).kernel,
        "wgmma_fp8r"
    );
    assert_eq!(auto_plan(&heads_128_args(&mem, DType::BF16, DType::BF16, 1), &H200, on).kernel, "wgmma");
    // 64 heads, s_q 1: one row block.
    assert_eq!(auto_flags(&H200, 64, DType::Fp8DsMla, 16, 2, on).0, "wgmma_fp8");
    let forced = DecodeOptions { kernel: Kernel::WgmmaFp8Pair, ..DecodeOptions::default() };
    let mem64 = vec![0u128; 1 << 16];
    let view = |dt: DType, shape: &[i64]| -> Tensor<'_> {
        let s = contiguous_strides(shape);
        crate::test_util::host_view(&mem64, dt, 0, shape, &s[..shape.len()])
    };
    let h64 = MlaDecodeAttentionArgs {
        out: view(DType::BF16, &[2, 1, 64, 512]),
        lse: None,
        query: view(DType::BF16, &[2, 1, 64, 576]),
        cache: view(DType::Fp8DsMla, &[8, 16, 656]),
        block_table: view(DType::I32, &[2, 4]),
        seq_lens: view(DType::I32, &[2]),
        scale: 0.5,
    };
    let e = choose(&h64, &H200, &forced, ChoiceFlags::new(true, false)).expect_err("refused").to_string();
    assert!(e.contains("pair kernel needs") && e.contains("s_q * N = 64"), "{e}");
    let p = choose(&h128, &H200, &forced, ChoiceFlags::new(true, false)).expect("forced").plan;
    assert_eq!(p.kernel, "wgmma_fp8x2");
}

/// `VT_MLA_3WG_PAIR` on: where Auto takes the three-warpgroup kernel's TMA form with row blocks
/// in pairs and 32+ sequences, it takes its CTA-pair form, parts capped by the clusters the
/// device holds; fewer sequences, an odd number of row blocks, a cache the TMA does not read, an
/// fp8_ds_mla cache and a device with no clusters keep their kernels, and forcing the pair where
/// it cannot run is an error naming what it needs.
#[test]
fn three_wg_pair_flag_makes_auto_take_the_cta_pair_form_over_paired_row_blocks() {
    use super::Kernel;
    let mem = vec![0u128; 1 << 16];
    let on = ChoiceFlags { three_wg_pair: true, ..ChoiceFlags::new(true, false) };
    // 32 sequences at 128 heads, block size 64.
    let mem32 = vec![0u128; (32 * 128 * 576) / 8 + 1];
    let b32 = heads_128_batch_args(&mem32, DType::BF16, DType::BF16, 64, 32);
    let p = auto_plan(&b32, &H200, on);
    assert_eq!((p.kernel, p.row_blocks, p.parts), ("wgmma_3wg_x2", 2, 66));
    assert_eq!(auto_plan(&b32, &H200, ChoiceFlags::new(true, false)).kernel, "wgmma_3wg");
    let odd_gpcs = DeviceInfo { pair_clusters: 60, ..H200 };
    assert_eq!(auto_plan(&b32, &odd_gpcs, on).parts, 60);
    let none = DeviceInfo { pair_clusters: 0, ..H200 };
    assert_eq!(auto_plan(&b32, &none, on).kernel, "wgmma_3wg");
    // Two sequences: below THREE_WG_PAIR_MIN_BATCH.
    let h128 = heads_128_args(&mem, DType::BF16, DType::BF16, 64);
    assert_eq!(auto_plan(&h128, &H200, on).kernel, "wgmma_3wg");
    // Block size 1: no TMA form, so no pair.
    assert_ne!(
        auto_plan(&heads_128_args(&mem, DType::BF16, DType::BF16, 1), &H200, on).kernel,
        "wgmma_3wg_x2"
    );
    assert_eq!(
        auto_plan(&heads_128_args(&mem, DType::BF16, DType::Fp8DsMla, 64), &H200, on).kernel,
        "wgmma_fp8r"
    );
    // 64 heads, s_q 1: one row block.
    assert_eq!(auto_flags(&H200, 64, DType::BF16, 64, 32, on).0, "wgmma_3wg");
    let forced = DecodeOptions { kernel: Kernel::Wgmma3Pair, ..DecodeOptions::default() };
    let p = choose(&h128, &H200, &forced, ChoiceFlags::new(true, false)).expect("forced").plan;
    assert_eq!(p.kernel, "wgmma_3wg_x2");
    let e = choose(&h128, &none, &forced, ChoiceFlags::new(true, false)).expect_err("refused").to_string();
    assert!(e.contains("pair kernel needs") && e.contains("0 resident"), "{e}");
    let bs1 = heads_128_args(&mem, DType::BF16, DType::BF16, 1);
    let e = choose(&bs1, &H200, &forced, ChoiceFlags::new(true, false)).expect_err("refused").to_string();
    assert!(e.contains("read through the TMA"), "{e}");
    // Pages of 16 or 32 rows: the pairs' paged form, Auto's and forced.
    for bs in [16, 32] {
        let paged = heads_128_batch_args(&mem32, DType::BF16, DType::BF16, bs, 32);
        assert_eq!(auto_plan(&paged, &H200, on).kernel, "wgmma_3wg_x2_pg", "BS {bs}");
        let p = choose(&paged, &H200, &forced, ChoiceFlags::new(true, false)).expect("forced").plan;
        assert_eq!(p.kernel, "wgmma_3wg_x2_pg", "BS {bs}");
    }
}

/// The paged form forced on a cache it does not take names the block size.
#[test]
fn the_paged_form_refuses_other_block_sizes_and_fp8_caches() {
    use super::Kernel;
    let mem = vec![0u128; 1 << 16];
    let forced = DecodeOptions { kernel: Kernel::Wgmma3Paged, ..DecodeOptions::default() };
    for (cdt, bs) in [(DType::BF16, 64), (DType::BF16, 8), (DType::BF16, 1), (DType::Fp8DsMla, 16)] {
        let a = heads_128_args(&mem, DType::BF16, cdt, bs);
        let e = choose(&a, &H200, &forced, ChoiceFlags::new(true, false)).expect_err("refused").to_string();
        assert!(e.contains("paged form needs a 16-bit cache of block size 16 or 32"), "{cdt:?} BS {bs}: {e}");
    }
    let a = heads_128_args(&mem, DType::BF16, DType::BF16, 16);
    let p = choose(&a, &H200, &forced, ChoiceFlags::new(true, false)).expect("BS 16").plan;
    assert_eq!((p.kernel, p.row_blocks), ("wgmma_3wg_pg", 2));
    let no_tma = choose(&a, &H200, &forced, ChoiceFlags::new(false, false)).expect_err("no TMA").to_string();
    assert!(no_tma.contains("VT_MLA_DECODE_TMA on"), "{no_tma}");
}
