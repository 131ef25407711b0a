//! ConcatMlaNopeRope: `out[t, n, :] = [nope[t, n, :] | rope[t, n or 0, :]]`
//! (`kernels-cuda/concat_mla_nope_rope.cu`).
//!
//! # Floor
//!
//! A pure copy: bytes read + written per call. DeepSeek-V3's prefill key (T = 8192 tokens,
//! N = 128 heads, P = qk_nope 128, R = rope 64, bf16, rope broadcast over heads):
//! - `nope` read: T·N·P·2 = 268,435,456 B (the k_nope half of the kv_b_proj rows; the
//!   128-element runs are whole 32-byte sectors, so the value half is never fetched);
//! - `rope` read: T·R·2 = 1,048,576 B (once per token: the broadcast k_pe);
//! - `out` written: T·N·(P+R)·2 = 402,653,184 B;
//! - total 672,137,216 B: 158 us at the H200's 4.25 TB/s copy ceiling, 198 us at the 80%
//!   target. The scalar kernel took 677 us (~1 TB/s).
//!
//! # Kernels
//!
//! - `concat_mla_nope_rope_v16` (fast path): every access is one 16-byte vector. Taken when
//!   P and R are multiples of 16 bytes, every stride (in elements) is a multiple of the
//!   vector's elements, the three first-element addresses are 16-byte aligned, and the
//!   in-token offsets fit in i32 (checked here); then pointers and strides go to the kernel
//!   in 16-byte units, one byte copy for every dtype. A block owns one token and a chunk of
//!   heads; each thread owns one vector column of U = 8 heads (8 independent loads in
//!   flight). A broadcast rope vector is loaded once per thread and stored for its 8 heads:
//!   N/8 loads per vector and token (16 at V3, hits in L1/L2) instead of N, once from DRAM.
//! - `concat_mla_nope_rope` (fallback, any other view): one block per (token, head) row,
//!   one element per thread per step; a broadcast rope has head stride 0.

use vt_core::{ConcatMlaNopeRopeArgs, OpId, Queue, Result, Tensor};

use crate::rope_from_cache::int;
use crate::{grid_1d, kernel_source, Arg, CudaQueue, KernelSource, Launch};

static SRC: KernelSource = kernel_source!("concat_mla_nope_rope");

/// Bytes per vector access of the fast path.
const VEC_BYTES: i64 = 16;
/// Heads per thread in the fast kernel (`kHeadsPerThread` in the .cu file).
const HEADS_PER_THREAD: i64 = 8;
/// Most threads per block of the fast kernel (its `__launch_bounds__`).
const MAX_THREADS: i64 = 256;

/// The fast kernel's launch: strides and widths in 16-byte vectors.
#[derive(Debug, PartialEq)]
struct VecPlan {
    o_st: i64,
    o_sh: i32,
    n_st: i64,
    n_sh: i32,
    r_st: i64,
    r_sh: i32,
    nblk: u32,
    heads: i32,
    pv: i32,
    rv: i32,
    hg: i32,
    chunks: i32,
    threads: u32,
}

/// The stride of dim `d`, 0 when the dim has one index (the stride then addresses
/// nothing, so it must not keep a view off the fast path).
fn eff_stride(x: &Tensor<'_>, d: usize) -> i64 {
    if x.dim(d) == 1 {
        0
    } else {
        x.stride(d)
    }
}

/// The fast path's plan, or `None` when the views do not split into aligned 16-byte
/// vectors or an index would leave the kernel's 32-bit range.
fn vec_plan(a: &ConcatMlaNopeRopeArgs<'_>) -> Option<VecPlan> {
    let es = a.out.dtype().size_of() as i64;
    if es == 0 || VEC_BYTES % es != 0 {
        return None;
    }
    let e = VEC_BYTES / es;
    let (t, n, p, r) = (a.nope.dim(0), a.nope.dim(1), a.nope.dim(2), a.rope.dim(2));
    if p % e != 0 || r % e != 0 {
        return None;
    }
    if [a.out.data_addr(), a.nope.data_addr(), a.rope.data_addr()]
        .iter()
        .any(|&x| !x.is_multiple_of(VEC_BYTES as u64))
    {
        return None;
    }
    // A one-head rope is the broadcast: head stride 0.
    let r_sh = if a.rope.dim(1) == 1 { 0 } else { eff_stride(&a.rope, 1) };
    let strides = [
        eff_stride(&a.out, 0),
        eff_stride(&a.out, 1),
        eff_stride(&a.nope, 0),
        eff_stride(&a.nope, 1),
        eff_stride(&a.rope, 0),
        r_sh,
    ];
    if strides.iter().any(|s| s % e != 0) {
        return None;
    }
    let [o_st, o_sh, n_st, n_sh, r_st, r_sh] = strides.map(|s| s / e);
    let (pv, rv) = (p / e, r / e);
    let w = pv + rv;
    // The kernel's in-token offsets `h * head_stride + column` are i32.
    let fits = |sh: i64, width: i64| -> Option<i32> {
        let span = (n - 1).checked_mul(sh.checked_abs()?)?.checked_add(width)?;
        i32::try_from(span).ok()?;
        i32::try_from(sh).ok()
    };
    let (o_sh, n_sh, r_sh) = (fits(o_sh, w)?, fits(n_sh, pv)?, fits(r_sh, rv)?);
    // Heads in parallel: fill up to MAX_THREADS with whole rows of w columns, no more
    // head groups than U-head chunks exist; then even the chunks out so the last one is
    // not mostly idle.
    let ceil = |x: i64, y: i64| (x + y - 1) / y; // both positive here
    let (cw, hg0) = if w >= MAX_THREADS {
        (MAX_THREADS, 1)
    } else {
        (w, (MAX_THREADS / w).min(ceil(n, HEADS_PER_THREAD)).max(1))
    };
    let chunks = ceil(n, hg0 * HEADS_PER_THREAD);
    let hg = ceil(n, chunks * HEADS_PER_THREAD).max(1);
    let nblk = t.checked_mul(chunks)?;
    Some(VecPlan {
        o_st,
        o_sh,
        n_st,
        n_sh,
        r_st,
        r_sh,
        nblk: u32::try_from(i32::try_from(nblk).ok()?).ok()?,
        heads: i32::try_from(n).ok()?,
        pv: i32::try_from(pv).ok()?,
        rv: i32::try_from(rv).ok()?,
        hg: i32::try_from(hg).ok()?,
        chunks: i32::try_from(chunks).ok()?,
        threads: u32::try_from(cw * hg).ok()?,
    })
}

const OP: OpId = OpId::ConcatMlaNopeRope;

pub(crate) fn run(q: &Queue, a: &ConcatMlaNopeRopeArgs<'_>) -> Result<()> {
    CudaQueue::of(q, OP)?.run(OP, &plan(a)?)
}

/// Both kernels write only heads < N and columns < P+R of tokens < T of the validated views.
pub(crate) fn plan(a: &ConcatMlaNopeRopeArgs<'_>) -> Result<Vec<Launch>> {
    let (t, n, p, r) = (a.nope.dim(0), a.nope.dim(1), a.nope.dim(2), a.rope.dim(2));
    if t == 0 || n == 0 || p + r == 0 {
        return Ok(vec![]);
    }
    if let Some(v) = vec_plan(a) {
        let args: [Arg; 15] = [
            a.out.data_addr().into(),
            v.o_st.into(),
            v.o_sh.into(),
            a.nope.data_addr().into(),
            v.n_st.into(),
            v.n_sh.into(),
            a.rope.data_addr().into(),
            v.r_st.into(),
            v.r_sh.into(),
            // `unsigned` in the kernel: same ABI as a non-negative i32.
            (v.nblk as i32).into(),
            v.heads.into(),
            v.pv.into(),
            v.rv.into(),
            v.hg.into(),
            v.chunks.into(),
        ];
        // The addresses are 16-byte aligned and the strides whole vectors of the validated
        // views (checked by `vec_plan`).
        let grid = (grid_1d(v.nblk as i64), 1, 1);
        return Ok(vec![Launch::new(&SRC, "concat_mla_nope_rope_v16", a.out.dtype(), grid, v.threads, args)]);
    }
    let rope_head_stride = if a.rope.dim(1) == 1 { 0 } else { a.rope.stride(1) };
    let args: [Arg; 13] = [
        a.out.data_addr().into(),
        a.out.stride(0).into(),
        a.out.stride(1).into(),
        a.nope.data_addr().into(),
        a.nope.stride(0).into(),
        a.nope.stride(1).into(),
        a.rope.data_addr().into(),
        a.rope.stride(0).into(),
        rope_head_stride.into(),
        t.into(),
        int(OP, "nope", n)?.into(),
        int(OP, "nope", p)?.into(),
        int(OP, "rope", r)?.into(),
    ];
    Ok(vec![Launch::new(&SRC, "concat_mla_nope_rope", a.out.dtype(), (grid_1d(t * n), 1, 1), 128, args)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::host_view as view;
    use vt_core::DType;

    /// The block's prefill key at V3 shapes: k_nope a slice of kv_b_proj rows, k_pe the
    /// tail of the kv rows, broadcast.
    fn v3_key(mem: &[u128], t: i64, dt: DType, rope_offset: i64) -> ConcatMlaNopeRopeArgs<'_> {
        let (n, p, v, r, l) = (128, 128, 128, 64, 512);
        ConcatMlaNopeRopeArgs {
            out: view(mem, dt, 0, &[t, n, p + r], &[n * (p + r), p + r, 1]),
            nope: view(mem, dt, t * n * (p + r), &[t, n, p], &[n * (p + v), p + v, 1]),
            rope: view(mem, dt, l + rope_offset, &[t, 1, r], &[l + r, r, 1]),
        }
    }

    #[test]
    fn v3_key_takes_the_vector_path() {
        let mem = vec![0u128; 1 << 17];
        let plan = vec_plan(&v3_key(&mem, 8, DType::BF16, 0)).expect("vector path");
        // 24 vectors per row (16 nope + 8 rope), 8 head groups of 8 heads: 2 chunks per token.
        assert_eq!((plan.pv, plan.rv, plan.hg, plan.chunks, plan.threads), (16, 8, 8, 2, 192));
        assert_eq!(
            (plan.o_st, plan.o_sh, plan.n_st, plan.n_sh, plan.r_st, plan.r_sh),
            (3072, 24, 4096, 32, 72, 0)
        );
        assert_eq!(plan.nblk, 8 * 2);
        let f32_plan = vec_plan(&v3_key(&mem, 4, DType::F32, 0)).expect("vector path in f32");
        assert_eq!((f32_plan.pv, f32_plan.rv), (32, 16));
    }

    /// The kernel's block and thread mapping, replayed on the host: every output vector
    /// (token, head, column) is written exactly once.
    #[test]
    fn the_vector_mapping_writes_every_output_vector_once() {
        let mem = vec![0u128; 1 << 17];
        for (t, n, p, r) in
            [(3, 100, 128, 64), (2, 3, 2048, 64), (2, 1, 64, 64), (4, 128, 512, 64), (1, 16, 8, 8)]
        {
            let a = ConcatMlaNopeRopeArgs {
                out: view(&mem, DType::BF16, 0, &[t, n, p + r], &[n * (p + r), p + r, 1]),
                nope: view(&mem, DType::BF16, 0, &[t, n, p], &[n * p, p, 1]),
                rope: view(&mem, DType::BF16, 0, &[t, 1, r], &[r, r, 1]),
            };
            let v = vec_plan(&a).expect("vector path");
            let w = v.pv + v.rv;
            let mut hits = vec![0u8; (t * n * w as i64) as usize];
            let cw = v.threads as i32 / v.hg;
            assert!(v.threads <= MAX_THREADS as u32 && cw * v.hg == v.threads as i32);
            for b in 0..v.nblk as i32 {
                let (tt, chunk) = (b / v.chunks, b % v.chunks);
                for tid in 0..v.threads as i32 {
                    let (cx, hy) = (tid % cw, tid / cw);
                    let h0 = chunk * v.hg * HEADS_PER_THREAD as i32 + hy;
                    for c in (cx..w).step_by(cw as usize) {
                        for j in 0..HEADS_PER_THREAD as i32 {
                            let h = h0 + j * v.hg;
                            if h < v.heads {
                                hits[((tt as i64 * n + h as i64) * w as i64 + c as i64) as usize] += 1;
                            }
                        }
                    }
                }
            }
            assert!(hits.iter().all(|&x| x == 1), "T {t} N {n} P {p} R {r}: {v:?}");
        }
    }

    #[test]
    fn unaligned_views_fall_back() {
        let mem = vec![0u128; 1 << 17];
        // The rope starts 2 bf16 elements off a 16-byte boundary.
        assert_eq!(vec_plan(&v3_key(&mem, 4, DType::BF16, 2)), None);
        // A rope width that is not whole vectors.
        let (t, n, p, r) = (3, 4, 32, 12);
        let odd = ConcatMlaNopeRopeArgs {
            out: view(&mem, DType::BF16, 0, &[t, n, p + r], &[n * (p + r), p + r, 1]),
            nope: view(&mem, DType::BF16, 4096, &[t, n, p], &[n * p, p, 1]),
            rope: view(&mem, DType::BF16, 8192, &[t, 1, r], &[r, r, 1]),
        };
        assert_eq!(vec_plan(&odd), None);
    }

    #[test]
    fn one_index_dims_ignore_their_strides() {
        let mem = vec![0u128; 1 << 12];
        // T = 1 with an odd token stride, and a one-head rope with an odd head stride.
        let (n, p, r) = (16, 64, 64);
        let a = ConcatMlaNopeRopeArgs {
            out: view(&mem, DType::F16, 0, &[1, n, p + r], &[3, p + r, 1]),
            nope: view(&mem, DType::F16, 8192, &[1, n, p], &[5, p, 1]),
            rope: view(&mem, DType::F16, 16384, &[1, 1, r], &[7, 9, 1]),
        };
        let plan = vec_plan(&a).expect("vector path");
        assert_eq!((plan.o_st, plan.n_st, plan.r_st, plan.r_sh), (0, 0, 0, 0));
        // 16 heads over 8-head threads: two head groups, one chunk.
        assert_eq!((plan.hg, plan.chunks, plan.threads), (2, 1, 32));
    }
}
