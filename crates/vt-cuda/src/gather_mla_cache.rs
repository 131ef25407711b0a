//! GatherMlaCache: copies cached context rows into a contiguous workspace
//! (`kernels-cuda/gather_mla_cache.cu`). Each workspace row finds its sequence by binary
//! search in `cu_seq_lens` on the device; the grid covers every workspace row, so no
//! length is read back on the host.
//!
//! # Floor
//!
//! A pure copy: bytes read + written per call. DeepSeek-V3's prefill context (T = 8192
//! gathered rows, D = kv_lora 512 + rope 64 = 576, bf16, block size 64, so 128 blocks):
//! - cache rows read: T·D·2 = 9,437,184 B;
//! - workspace written: T·D·2 = 9,437,184 B;
//! - metadata read: the block table's 128 ids and cu_seq_lens, ~0.5 KB;
//! - total 18,874,368 B: 4.4 us at the H200's 4.25 TB/s copy ceiling, 5.6 us at the 80%
//!   target. A call this small is near launch and DRAM latency, so the timing test also
//!   reports a same-size device copy; the rate per row holds for longer contexts.
//!
//! # Kernels
//!
//! - `gather_mla_cache_v16` (fast path): rows of whole 16-byte vectors (D a multiple of 16
//!   bytes, row and block strides whole vectors, 16-byte aligned addresses; checked here).
//!   Pointers and strides go in 16-byte units, one byte copy for every dtype. One warp per
//!   row (fewer lanes for rows under 32 vectors): the lanes resolve the row's block id,
//!   then each keeps up to 3 independent 16-byte loads in flight. Row and position math is
//!   32-bit (rows, blocks and block size checked to fit here).
//! - `gather_mla_cache` (fallback, any other view): one block per row, one element per
//!   thread per step.

use vt_core::{DType, GatherMlaCacheArgs, OpId, Queue, Result};

use crate::rope_from_cache::int;
use crate::{grid_1d, kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("gather_mla_cache");

/// Bytes per vector access of the fast path.
const VEC_BYTES: i64 = 16;
/// Threads per block of the fast kernel (its `__launch_bounds__`).
const THREADS: i64 = 256;

/// The fast kernel's sizes: strides and row width in 16-byte vectors.
#[derive(Debug, PartialEq)]
struct VecPlan {
    o_s: i64,
    c_sb: i64,
    c_sr: i64,
    rows: i32,
    nb: i32,
    bs: i32,
    mb: i32,
    dv: i32,
    lpr_log2: i32,
    blocks: u32,
}

/// The fast path's plan, or `None` when the rows do not split into aligned 16-byte
/// vectors or a size would leave the kernel's 32-bit range.
fn vec_plan(a: &GatherMlaCacheArgs<'_>) -> Option<VecPlan> {
    let es = a.out.dtype().size_of() as i64;
    if es == 0 || VEC_BYTES % es != 0 {
        return None;
    }
    let e = VEC_BYTES / es;
    let (rows, nb, bs, d) = (a.out.dim(0), a.cache.dim(0), a.cache.dim(1), a.cache.dim(2));
    if d % e != 0
        || [a.out.data_addr(), a.cache.data_addr()].iter().any(|&x| !x.is_multiple_of(VEC_BYTES as u64))
    {
        return None;
    }
    // A dim with one index never uses its stride, so its stride must not block the path.
    let s = |t: &vt_core::Tensor<'_>, k: usize| if t.dim(k) == 1 { 0 } else { t.stride(k) };
    let strides = [s(&a.out, 0), s(&a.cache, 0), s(&a.cache, 1)];
    if strides.iter().any(|x| x % e != 0) {
        return None;
    }
    let [o_s, c_sb, c_sr] = strides.map(|x| x / e);
    let dv = d / e;
    // Lanes per row: a power of two up to a warp, no more than the row has vectors.
    let lpr = (dv.clamp(1, 32) as u32).next_power_of_two() as i64;
    let lpr_log2 = lpr.trailing_zeros() as i32;
    let rows_per_block = THREADS / lpr;
    Some(VecPlan {
        o_s,
        c_sb,
        c_sr,
        // Below 2^31, so the kernel's unsigned row loop and p = start + j cannot wrap.
        rows: i32::try_from(rows).ok()?,
        nb: i32::try_from(nb).ok()?,
        bs: i32::try_from(bs).ok()?,
        mb: i32::try_from(a.block_table.dim(1)).ok()?,
        dv: i32::try_from(dv).ok()?,
        lpr_log2,
        blocks: grid_1d((rows + rows_per_block - 1) / rows_per_block),
    })
}

const OP: OpId = OpId::GatherMlaCache;

pub(crate) fn run(q: &Queue, a: &GatherMlaCacheArgs<'_>) -> Result<()> {
    CudaQueue::of(q, OP)?.run(OP, &plan(a)?)
}

/// Both kernels skip rows whose sequence, block index or block id is out of range, so they
/// read only cache rows and write only rows below `rows` of the validated views.
pub(crate) fn plan(a: &GatherMlaCacheArgs<'_>) -> Result<Vec<Launch>> {
    let rows = a.out.dim(0);
    let (nb, bs, d) = (a.cache.dim(0), a.cache.dim(1), a.cache.dim(2));
    let nseq = a.block_table.dim(0);
    if rows == 0 || nseq == 0 || d == 0 || bs == 0 {
        return Ok(vec![]);
    }
    let (starts, st_s) = match &a.seq_starts {
        Some(s) => (s.data_addr(), s.stride(0)),
        None => (0, 0),
    };
    if a.cache.dtype() == DType::Fp8DsMla {
        // Dequantize on load, one block per workspace row (the scalar kernel's lookup);
        // cache strides are in bytes.
        let args: [Arg; 17] = [
            a.out.data_addr().into(),
            a.out.stride(0).into(),
            rows.into(),
            a.cache.data_addr().into(),
            a.cache.stride(0).into(),
            a.cache.stride(1).into(),
            nb.into(),
            bs.into(),
            a.block_table.data_addr().into(),
            a.block_table.stride(0).into(),
            a.block_table.stride(1).into(),
            a.block_table.dim(1).into(),
            a.cu_seq_lens.data_addr().into(),
            a.cu_seq_lens.stride(0).into(),
            int(OP, "block_table", nseq)?.into(),
            starts.into(),
            st_s.into(),
        ];
        let grid = (grid_1d(rows), 1, 1);
        return Ok(vec![Launch::new(&SRC, "gather_mla_cache_fp8", a.out.dtype(), grid, 128, args)]);
    }
    if let Some(v) = vec_plan(a) {
        // The kernel's `unsigned` parameters take these non-negative i32 values (same ABI).
        let args: [Arg; 19] = [
            a.out.data_addr().into(),
            v.o_s.into(),
            v.rows.into(),
            a.cache.data_addr().into(),
            v.c_sb.into(),
            v.c_sr.into(),
            v.nb.into(),
            v.bs.into(),
            v.dv.into(),
            a.block_table.data_addr().into(),
            a.block_table.stride(0).into(),
            a.block_table.stride(1).into(),
            v.mb.into(),
            a.cu_seq_lens.data_addr().into(),
            a.cu_seq_lens.stride(0).into(),
            int(OP, "block_table", nseq)?.into(),
            starts.into(),
            st_s.into(),
            v.lpr_log2.into(),
        ];
        // `vec_plan` checked the 16-byte alignment and whole-vector strides.
        let grid = (v.blocks, 1, 1);
        return Ok(vec![Launch::new(
            &SRC,
            "gather_mla_cache_v16",
            a.out.dtype(),
            grid,
            THREADS as u32,
            args,
        )]);
    }
    let args: [Arg; 18] = [
        a.out.data_addr().into(),
        a.out.stride(0).into(),
        rows.into(),
        a.cache.data_addr().into(),
        a.cache.stride(0).into(),
        a.cache.stride(1).into(),
        nb.into(),
        bs.into(),
        int(OP, "cache", d)?.into(),
        a.block_table.data_addr().into(),
        a.block_table.stride(0).into(),
        a.block_table.stride(1).into(),
        a.block_table.dim(1).into(),
        a.cu_seq_lens.data_addr().into(),
        a.cu_seq_lens.stride(0).into(),
        int(OP, "block_table", nseq)?.into(),
        starts.into(),
        st_s.into(),
    ];
    Ok(vec![Launch::new(&SRC, "gather_mla_cache", a.out.dtype(), (grid_1d(rows), 1, 1), 128, args)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::host_view as view;
    use vt_core::DType;

    fn args<'a>(mem: &'a [u128], dt: DType, d: i64, out_offset: i64, out_ld: i64) -> GatherMlaCacheArgs<'a> {
        let (rows, nb, bs) = (100, 4, 64);
        GatherMlaCacheArgs {
            out: view(mem, dt, out_offset, &[rows, d], &[out_ld, 1]),
            cache: view(mem, dt, 1 << 16, &[nb, bs, d], &[2 * bs * d, d, 1]),
            block_table: view(mem, DType::I32, 0, &[1, 4], &[4, 1]),
            cu_seq_lens: view(mem, DType::I32, 16, &[2], &[1]),
            seq_starts: None,
        }
    }

    #[test]
    fn v3_rows_take_the_vector_path() {
        let mem = vec![0u128; 1 << 16];
        let plan = vec_plan(&args(&mem, DType::BF16, 576, 4096, 576)).expect("vector path");
        // 72 vectors per row: a warp per row, 8 rows per block.
        assert_eq!((plan.dv, plan.lpr_log2, plan.o_s, plan.c_sb, plan.c_sr), (72, 5, 72, 2 * 64 * 72, 72));
        assert_eq!(plan.blocks, 13);
        // f32 rows of 64: 16 vectors, so 16 lanes per row.
        let narrow = vec_plan(&args(&mem, DType::F32, 64, 4096, 64)).expect("vector path in f32");
        assert_eq!((narrow.dv, narrow.lpr_log2), (16, 4));
    }

    /// The kernel's row and lane mapping, replayed on the host (3 loads per lane per pass,
    /// `kLoadsPerLane` in the .cu file): every vector of every row is copied exactly once.
    #[test]
    fn the_vector_mapping_copies_every_vector_once() {
        let mem = vec![0u128; 1 << 17];
        for d in [24, 48, 128, 576, 1600] {
            let v = vec_plan(&args(&mem, DType::BF16, d, 4096, d)).expect("vector path");
            let (lpr, rows) = (1i32 << v.lpr_log2, v.rows);
            let mut hits = vec![0u8; (rows * v.dv) as usize];
            for b in 0..v.blocks as i32 {
                for tid in 0..THREADS as i32 {
                    let (r, lane) = (b * (THREADS as i32 / lpr) + tid / lpr, tid % lpr);
                    if r >= rows {
                        continue;
                    }
                    for c0 in (0..v.dv).step_by((lpr * 3) as usize) {
                        for j in 0..3 {
                            let c = c0 + j * lpr + lane;
                            if c < v.dv {
                                hits[(r * v.dv + c) as usize] += 1;
                            }
                        }
                    }
                }
            }
            assert!(hits.iter().all(|&x| x == 1), "D {d}: {v:?}");
        }
    }

    #[test]
    fn unaligned_rows_fall_back() {
        let mem = vec![0u128; 1 << 16];
        // Row width not whole vectors, a row stride not whole vectors, an unaligned start.
        assert_eq!(vec_plan(&args(&mem, DType::BF16, 36, 4096, 36)), None);
        assert_eq!(vec_plan(&args(&mem, DType::BF16, 576, 4096, 580)), None);
        assert_eq!(vec_plan(&args(&mem, DType::BF16, 576, 4099, 576)), None);
    }
}
