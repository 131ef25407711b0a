//! Timing helpers for benchmarks on a CUDA queue: CUDA events, an L2 flush between runs,
//! deterministic random fills (with a host twin, so references need no read-back), and the
//! two ceilings every result is measured against: device-to-device copy bandwidth and a
//! cuBLAS bf16 GEMM on random data.
//!
//! ```ignore
//! let b = Bench::new(&queue, 256 << 20)?;           // 256 MB flush buffer
//! let copy = b.copy_bandwidth(1 << 30, 20)?;         // bytes read + written per second
//! let us = b.time_us(3, 50, true, || run_op())?;     // per-run microseconds, L2 flushed
//! ```

use std::sync::Arc;

use cudarc::cublas::sys as blas;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{result, CudaEvent, CudaFunction, CudaModule};
use vt_core::{Buffer, DType, Error, Queue, Result, Tensor};

use crate::device::{drv, BACKEND};
use crate::{nvrtc, Arg, CudaQueue};

const FILL_SRC: &str = r#"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
// Element i of a fill is hash(seed, i) as a uniform value in [-1, 1), times scale, rounded
// once to the element type. `vt_cuda::bench::uniform` is the host twin.
__device__ __forceinline__ float vt_uniform(unsigned long long seed, unsigned long long i) {
    unsigned long long z = seed + (i + 1ull) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = __int2float_rn((int)(z >> 40)) * (1.0f / 16777216.0f);
    return __fsub_rn(__fmul_rn(2.0f, u), 1.0f);
}
// Reads n16 16-byte words (the clean L2 flush: the L2 ends up holding clean lines, so the
// timed kernel pays no write-back of the flush's dirty lines). Writes only if the xor of all
// the words is a value it never is for the flush buffer's 0x5a bytes (keeps the loads alive).
extern "C" __global__ void vt_bench_read(const uint4* p, unsigned long long n16, unsigned* sink) {
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += step) {
        const uint4 v = __ldcg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345679u) sink[0] = acc;
}
extern "C" __global__ void vt_bench_fill(void* out, unsigned long long n, unsigned long long seed, float scale,
                                         int kind) {
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const float v = __fmul_rn(vt_uniform(seed, i), scale);
        if (kind == 0) ((__nv_bfloat16*)out)[i] = __float2bfloat16_rn(v);
        else if (kind == 1) ((__half*)out)[i] = __float2half_rn(v);
        else ((float*)out)[i] = v;
    }
}
"#;

/// Host twin of the device fill: element `i` of a fill with `seed`, before `scale` and the
/// rounding to the element type (`round(uniform(seed, i) * scale)`).
pub fn uniform(seed: u64, i: u64) -> f32 {
    let mut z = seed.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let u = (z >> 40) as f32 * (1.0 / 16_777_216.0);
    2.0 * u - 1.0
}

/// The value the device fill stores at element `i`, as f32.
pub fn filled_value(dtype: DType, seed: u64, scale: f32, i: u64) -> f32 {
    let v = uniform(seed, i) * scale;
    match dtype {
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        DType::F16 => half::f16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// The median of `v` (sorted in place); NaN for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Benchmark tools bound to one CUDA queue.
pub struct Bench<'q> {
    queue: &'q Queue,
    cq: &'q CudaQueue,
    _module: Arc<CudaModule>,
    fill: CudaFunction,
    read: CudaFunction,
    flush: Buffer,
    clean_flush: bool,
}

fn berr(what: &'static str) -> impl Fn(result::DriverError) -> Error {
    drv(what)
}

impl<'q> Bench<'q> {
    /// Tools for `queue` (a CUDA queue) with an L2 flush buffer of `flush_bytes` (use at
    /// least twice the L2: 100 MB or more on an H100/H200).
    pub fn new(queue: &'q Queue, flush_bytes: usize) -> Result<Bench<'q>> {
        let cq = CudaQueue::of(queue, "Bench")?;
        let target = nvrtc::target_for(cq.sm())?;
        let image = nvrtc::compile("vt_bench_fill.cu", FILL_SRC, &[], target)?;
        let module = match target {
            nvrtc::Target::Cubin(_) => {
                cq.device.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(image.bytes))
            }
            nvrtc::Target::Ptx(_) | nvrtc::Target::PtxArchSpecific(_) => {
                let text = String::from_utf8_lossy(&image.bytes).trim_end_matches('\0').to_string();
                cq.device.ctx.load_module(cudarc::nvrtc::Ptx::from_src(text))
            }
        }
        .map_err(berr("loading the bench fill kernel"))?;
        let fill = module.load_function("vt_bench_fill").map_err(berr("vt_bench_fill"))?;
        let read = module.load_function("vt_bench_read").map_err(berr("vt_bench_read"))?;
        // A multiple of 16 bytes (the clean flush reads 16-byte words), filled once.
        let flush = Buffer::uninit(queue, DType::I32, &[(flush_bytes / 16).max(1) as i64 * 4])?;
        flush.fill_pattern(queue, &[0x5a; 4])?;
        Ok(Bench { queue, cq, _module: module, fill, read, flush, clean_flush: false })
    }

    /// The L2 flush as a read of the flush buffer instead of a write (`on`), so that the L2
    /// holds clean lines when the timed call starts. The default write flush leaves the L2
    /// full of dirty lines, whose write-back (up to the L2's 50 MB on an H100/H200) the timed
    /// call then pays: a 30 MB weight read costs like 80 MB.
    pub fn with_clean_flush(mut self, on: bool) -> Bench<'q> {
        self.clean_flush = on;
        self
    }

    /// Fills a contiguous view with `filled_value(dtype, seed, scale, i)` for its elements
    /// i = 0.. in order. Asynchronous.
    pub fn fill(&self, t: &Tensor<'_>, seed: u64, scale: f32) -> Result<()> {
        if !t.is_contiguous() {
            return Err(Error::invalid("Bench::fill", "t", "must be contiguous"));
        }
        let kind: i32 = match t.dtype() {
            DType::BF16 => 0,
            DType::F16 => 1,
            DType::F32 => 2,
            other => return Err(Error::invalid("Bench::fill", "t", format!("dtype {other} is not a float"))),
        };
        let n = t.numel() as u64;
        if n == 0 {
            return Ok(());
        }
        let addr = t.data_addr();
        let blocks = n.div_ceil(256).min(132 * 32) as u32;
        // The kernel writes elements 0..n of `dtype` from `addr`, which is the contiguous
        // view's memory; the argument types match its parameters.
        let args = [Arg::Ptr(addr), Arg::Ptr(n), Arg::Ptr(seed), Arg::F32(scale), Arg::I32(kind)];
        self.cq
            .launch_loaded(&self.fill, (blocks, 1, 1), 256, &args)
            .map_err(|e| Error::backend(BACKEND, format!("vt_bench_fill: {e}")))
    }

    /// Overwrites the flush buffer (evicting the L2), or reads it with
    /// [`Bench::with_clean_flush`]. Asynchronous.
    pub fn flush_l2(&self) -> Result<()> {
        let v = self.flush.view();
        if self.clean_flush {
            let n16 = self.flush.size_bytes() as u64 / 16;
            let args = [Arg::Ptr(v.data_addr()), Arg::Ptr(n16), Arg::Ptr(v.data_addr())];
            // The kernel reads n16 16-byte words of the flush buffer (and writes at most its
            // first word); the arguments match its parameters.
            return self
                .cq
                .launch_loaded(&self.read, (132 * 8, 1, 1), 256, &args)
                .map_err(|e| Error::backend(BACKEND, format!("vt_bench_read: {e}")));
        }
        // SAFETY: the flush buffer is a live allocation of exactly this many bytes.
        unsafe {
            result::memset_d8_async(v.data_addr(), 0x5a, self.flush.size_bytes(), self.cq.stream.cu_stream())
        }
        .map_err(berr("flushing the L2"))
    }

    fn event(&self) -> Result<CudaEvent> {
        self.cq.device.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(berr("creating an event"))
    }

    /// Runs `f` `warmup` times, then `iters` times between two CUDA events each (after an
    /// L2 flush when `flush`), and returns each timed run's microseconds. Synchronizes.
    pub fn time_us(
        &self,
        warmup: usize,
        iters: usize,
        flush: bool,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<Vec<f64>> {
        for _ in 0..warmup {
            if flush {
                self.flush_l2()?;
            }
            f()?;
        }
        let mut evs = Vec::with_capacity(iters);
        for _ in 0..iters {
            evs.push((self.event()?, self.event()?));
        }
        for (s, e) in &evs {
            if flush {
                self.flush_l2()?;
            }
            s.record(&self.cq.stream).map_err(berr("recording an event"))?;
            f()?;
            e.record(&self.cq.stream).map_err(berr("recording an event"))?;
        }
        self.queue.synchronize()?;
        evs.iter()
            .map(|(s, e)| s.elapsed_ms(e).map(|ms| ms as f64 * 1e3).map_err(berr("reading an event")))
            .collect()
    }

    /// Device-to-device copy bandwidth over two `bytes`-byte buffers, counting bytes read
    /// plus bytes written, median of `iters` copies; bytes per second.
    pub fn copy_bandwidth(&self, bytes: usize, iters: usize) -> Result<f64> {
        let n = (bytes / 4) as i64;
        let src = Buffer::uninit(self.queue, DType::F32, &[n])?;
        let dst = Buffer::uninit(self.queue, DType::F32, &[n])?;
        self.fill(&src.view(), 1, 1.0)?;
        let (s, d) = (src.view().data_addr(), dst.view().data_addr());
        let stream = self.cq.stream.cu_stream();
        let mut t = self.time_us(2, iters, false, || {
            // SAFETY: both buffers are live allocations of n * 4 bytes on this device.
            unsafe { result::memcpy_dtod_async(d, s, n as usize * 4, stream) }.map_err(berr("copying"))
        })?;
        Ok(2.0 * (n as f64 * 4.0) / (median(&mut t) * 1e-6))
    }

    /// cuBLAS bf16 GEMM (f32 accumulation) of n x n x n on random data, median of `iters`;
    /// FLOP per second (2 n^3 per product).
    pub fn gemm_bf16_flops(&self, n: usize, iters: usize) -> Result<f64> {
        let blas_h = match &self.cq.blas {
            Some(b) => b.handle,
            None => return Err(Error::backend(BACKEND, "cuBLAS is not available")),
        };
        let len = (n * n) as i64;
        let a = Buffer::uninit(self.queue, DType::BF16, &[len])?;
        let b = Buffer::uninit(self.queue, DType::BF16, &[len])?;
        let c = Buffer::uninit(self.queue, DType::BF16, &[len])?;
        self.fill(&a.view(), 2, 1.0)?;
        self.fill(&b.view(), 3, 1.0)?;
        let (pa, pb, pc) = (a.view().data_addr(), b.view().data_addr(), c.view().data_addr());
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ni = n as i32;
        let mut t = self.time_us(3, iters, false, || {
            // SAFETY: the handle is bound to this queue's stream; the three buffers hold
            // n * n bf16 values each, the leading dimensions are n, and alpha/beta are f32
            // as the f32 compute type requires.
            let st = unsafe {
                blas::cublasGemmEx(
                    blas_h,
                    blas::cublasOperation_t::CUBLAS_OP_N,
                    blas::cublasOperation_t::CUBLAS_OP_N,
                    ni,
                    ni,
                    ni,
                    &alpha as *const f32 as *const _,
                    pa as *const _,
                    blas::cudaDataType_t::CUDA_R_16BF,
                    ni,
                    pb as *const _,
                    blas::cudaDataType_t::CUDA_R_16BF,
                    ni,
                    &beta as *const f32 as *const _,
                    pc as *mut _,
                    blas::cudaDataType_t::CUDA_R_16BF,
                    ni,
                    blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            };
            st.result().map_err(|e| Error::backend(BACKEND, format!("cublasGemmEx: {e:?}")))
        })?;
        Ok(2.0 * (n as f64).powi(3) / (median(&mut t) * 1e-6))
    }
}
