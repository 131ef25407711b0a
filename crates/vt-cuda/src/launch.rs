//! vt-cuda's one layer of unsafe kernel launches, as `vt-hip`'s `launch.rs` + `backend.rs`.
//!
//! Op files never call the driver. They build plain data — a [`Launch`] per kernel: the
//! kernel file, the kernel's base name and dtype, grid, block, dynamic shared memory and
//! the argument list ([`Arg`]: addresses, integers, floats and `#[repr(C)]` parameter
//! structs) — in a `plan` function that touches no device, and hand it to
//! [`CudaQueue::run`], which loads the kernel, raises its shared-memory limit where needed
//! and does the one unsafe launch. Because plans are plain data, a test without a GPU
//! (`ptx_check.rs`) compiles every kernel file to PTX with NVRTC and checks each op's
//! planned argument lists against the `.entry` parameter lists.
//!
//! The other driver calls an op needs are safe wrappers here too: the TMA descriptor
//! encode ([`TensorMap::encode`]) and the device limits ([`CudaQueue::sm_count`],
//! [`CudaQueue::smem_optin`]).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, LazyLock, Mutex};

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::sys;
use cudarc::driver::{result, CudaFunction};
use vt_core::{DType, Error, OpId, Result};

use crate::device::{drv, BACKEND};
use crate::kernels::KernelSource;
use crate::CudaQueue;

/// A `#[repr(C)]` struct passed by value as one kernel parameter (the attention kernels'
/// `Params`, the TMA maps).
///
/// # Safety
/// The type must be plain old data (no pointers to host memory, no references, no drop
/// glue) with exactly the size, alignment and field layout of the kernel parameter it is
/// passed as; any device address in it must be valid for the sizes and strides beside it.
pub(crate) unsafe trait KernelStruct: Copy + Send + Sync + 'static {}

/// A parameter struct behind a shared pointer (so [`Arg`] stays cheap to clone).
trait StructValue: Send + Sync {
    fn as_ptr(&self) -> *const c_void;
}

impl<T: KernelStruct> StructValue for T {
    fn as_ptr(&self) -> *const c_void {
        self as *const T as *const c_void
    }
}

/// A by-value struct argument: the value, and its size and alignment (checked against the
/// kernel's `.param .align A .b8 name[SIZE]`).
#[derive(Clone)]
pub(crate) struct StructArg {
    value: Arc<dyn StructValue>,
    pub size: usize,
    pub align: usize,
    pub name: &'static str,
}

impl std::fmt::Debug for StructArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} bytes, align {})", self.name, self.size, self.align)
    }
}

/// One kernel argument, as the kernel declares it. Device addresses are `u64` (the ABI of
/// a pointer); `I32` also serves the kernels' `unsigned` parameters (same ABI) for values
/// known to be non-negative.
#[derive(Clone, Debug)]
pub(crate) enum Arg {
    Ptr(u64),
    I64(i64),
    I32(i32),
    F32(f32),
    Struct(StructArg),
    /// A by-value struct of consecutive TMA descriptors (`CUtensorMap`, 128 bytes each,
    /// 64-byte aligned), encoded by the launch from these plain-data descriptions.
    TensorMaps(Vec<TensorMapSpec>),
}

impl Arg {
    /// A parameter struct passed by value.
    pub fn of_struct<T: KernelStruct>(v: T) -> Arg {
        Arg::Struct(StructArg {
            value: Arc::new(v),
            size: std::mem::size_of::<T>(),
            align: std::mem::align_of::<T>(),
            name: std::any::type_name::<T>(),
        })
    }

    /// The value's bytes in the low end of an 8-byte slot (little-endian), which is what
    /// the driver reads the parameter's size of; `None` for a struct.
    fn slot(&self) -> Option<u64> {
        match *self {
            Arg::Ptr(p) => Some(p),
            Arg::I64(v) => Some(v as u64),
            Arg::I32(v) => Some(v as u32 as u64),
            Arg::F32(v) => Some(v.to_bits() as u64),
            Arg::Struct(_) | Arg::TensorMaps(_) => None,
        }
    }
}

impl From<u64> for Arg {
    fn from(v: u64) -> Arg {
        Arg::Ptr(v)
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Arg {
        Arg::I64(v)
    }
}
impl From<i32> for Arg {
    fn from(v: i32) -> Arg {
        Arg::I32(v)
    }
}
impl From<f32> for Arg {
    fn from(v: f32) -> Arg {
        Arg::F32(v)
    }
}

/// One launch of the kernel `{base}_{dtype}` of one `kernels-cuda/` file.
#[derive(Clone, Debug)]
pub(crate) struct Launch {
    pub src: &'static KernelSource,
    pub base: &'static str,
    pub dtype: DType,
    pub grid: (u32, u32, u32),
    pub block: u32,
    /// Dynamic shared memory in bytes (the limit is raised at launch where static plus
    /// dynamic passes 48 KiB).
    pub smem: u32,
    pub args: Vec<Arg>,
    /// Programmatic dependent launch: the kernel may start before the previous kernel on
    /// the stream has finished, and executes `griddepcontrol.wait` before reading what it
    /// wrote.
    pub dependent: bool,
}

impl Launch {
    pub fn new(
        src: &'static KernelSource,
        base: &'static str,
        dtype: DType,
        grid: (u32, u32, u32),
        block: u32,
        args: impl Into<Vec<Arg>>,
    ) -> Launch {
        Launch { src, base, dtype, grid, block, smem: 0, args: args.into(), dependent: false }
    }

    pub fn with_smem(mut self, bytes: u32) -> Launch {
        self.smem = bytes;
        self
    }

    /// See [`Launch::dependent`].
    pub fn dependent(mut self) -> Launch {
        self.dependent = true;
        self
    }

    /// [`Launch::dependent`] on a device of compute capability `sm` (major x 10 + minor) that
    /// runs programmatic dependent launch (`griddepcontrol`: sm_90 and later); an ordinary
    /// launch elsewhere. The one place that rule lives.
    pub fn dependent_on(self, sm: u32) -> Launch {
        if sm >= 90 {
            self.dependent()
        } else {
            self
        }
    }

    /// The kernel's symbol (`rms_norm_bf16`).
    pub fn symbol(&self) -> String {
        format!("{}_{}", self.base, self.dtype.name())
    }
}

/// Functions whose dynamic shared-memory limit was raised, by CUfunction handle (a module
/// loaded again, e.g. after the backend registered again, has new handles).
static SMEM_SET: LazyLock<Mutex<HashMap<usize, u32>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

impl CudaQueue {
    /// Runs planned launches in order on this queue's stream (asynchronous: returns once
    /// they are queued). Errors name `op`.
    ///
    /// The plans come from the ops' `plan` functions, which take every address from views
    /// vt-core validated (inside live allocations of this device, outputs disjoint from
    /// inputs) or from workspaces sized for the call, and pass the sizes and strides that
    /// keep every kernel access inside them (index values read on the device are bounds-
    /// checked by the kernels). The argument lists are checked against the compiled
    /// kernels' parameters by `ptx_check.rs`.
    pub(crate) fn run(&self, op: OpId, launches: &[Launch]) -> Result<()> {
        for l in launches {
            if l.grid.0 == 0 || l.grid.1 == 0 || l.grid.2 == 0 {
                continue;
            }
            let f = self.kernel(op, l)?;
            self.launch_planned(op, &f, l)?;
        }
        Ok(())
    }

    /// The launch's kernel, with its dynamic shared-memory limit raised to `l.smem` where
    /// the kernel's static plus dynamic shared memory passes the 48 KiB default (checked
    /// against the device's opt-in limit first). The default bounds the sum, so a kernel
    /// with static shared memory needs the raise for a dynamic size under 48 KiB too.
    /// Raising the limit is not a stream operation: allowed between launches and during
    /// graph capture.
    fn kernel(&self, op: OpId, l: &Launch) -> Result<CudaFunction> {
        let f = self.function(l.src, l.base, l.dtype)?;
        if l.smem == 0 {
            return Ok(f);
        }
        let key = f.cu_function() as usize;
        let mut set = SMEM_SET
            .lock()
            .map_err(|_| Error::op_failed(op, BACKEND, "a cache lock was poisoned by a panic"))?;
        if set.get(&key).copied().unwrap_or(0) < l.smem {
            let stat = f.shared_size_bytes().map_err(drv("reading a kernel's static shared memory"))?;
            let total = l.smem.saturating_add(u32::try_from(stat).unwrap_or(u32::MAX));
            if total > 48 * 1024 {
                let max = self.smem_optin()?;
                if total > max {
                    return Err(Error::op_failed(
                        op,
                        BACKEND,
                        format!(
                            "{} needs {total} bytes of shared memory per block ({} dynamic, {stat} static), \
                             the device allows {max}",
                            l.symbol(),
                            l.smem
                        ),
                    ));
                }
                f.set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    l.smem as i32,
                )
                .map_err(drv("raising the shared-memory limit"))?;
            }
            set.insert(key, l.smem);
        }
        Ok(f)
    }

    fn launch_planned(&self, op: OpId, f: &CudaFunction, l: &Launch) -> Result<()> {
        self.raw_launch(f, l.grid, l.block, l.smem, &l.args, l.dependent)
            .map_err(|e| Error::op_failed(op, BACKEND, format!("{}: {e}", l.symbol())))
    }

    /// Launches a kernel loaded outside `kernels-cuda/` (the bench's fill kernel) with
    /// `args` on this queue's stream. The same contract as [`CudaQueue::run`]: `args` match
    /// the kernel's parameters and describe memory it may access.
    pub(crate) fn launch_loaded(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> std::result::Result<(), String> {
        self.raw_launch(f, grid, block, 0, args, false)
    }

    /// The one unsafe kernel launch of vt-cuda.
    fn raw_launch(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
        dependent: bool,
    ) -> std::result::Result<(), String> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let mut slots: Vec<u64> = args.iter().map(|a| a.slot().unwrap_or(0)).collect();
        // Encoded TMA descriptors, one vector (contiguous, 128 bytes apart) per argument.
        let mut maps: Vec<Vec<sys::CUtensorMap>> = Vec::new();
        for a in args {
            maps.push(match a {
                Arg::TensorMaps(specs) => {
                    specs.iter().map(TensorMapSpec::encode).collect::<Result<_, _>>()?
                }
                _ => Vec::new(),
            });
        }
        let mut params: Vec<*mut c_void> = args
            .iter()
            .zip(slots.iter_mut())
            .zip(maps.iter_mut())
            .map(|((a, slot), map)| match a {
                Arg::Struct(s) => s.value.as_ptr() as *mut c_void,
                Arg::TensorMaps(_) => map.as_mut_ptr() as *mut c_void,
                _ => slot as *mut u64 as *mut c_void,
            })
            .collect();
        let stream = self.stream.cu_stream();
        self.device.ctx.bind_to_thread().map_err(|e| format!("binding the context: {e}"))?;
        // Programmatic stream serialization, for a dependent launch.
        let mut value = sys::CUlaunchAttributeValue { pad: [0; 64] };
        value.programmaticStreamSerializationAllowed = 1;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `params` holds one pointer per kernel parameter, in order: to an 8-byte
        // slot whose low bytes are the scalar in the parameter's C type, to a `KernelStruct`
        // value with the parameter's layout, or to the parameter's consecutive encoded TMA
        // descriptors (the ops' lists are checked
        // against the compiled kernels' `.entry` parameters by `ptx_check.rs`). Every
        // address among them comes from a validated view or a workspace sized for the call,
        // with the sizes and strides that keep the kernel inside it (see `run`). The
        // function and the stream belong to this queue's context, which is current; `slots`,
        // the struct values, `maps`, `params`, `attr` and `config` outlive the call, which
        // copies them. A dependent launch's kernel waits (`griddepcontrol.wait`) before reading
        // what the previous kernel on the stream wrote.
        unsafe {
            if dependent {
                sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut())
                    .result()
            } else {
                result::launch_kernel(f.cu_function(), grid, (block, 1, 1), smem, stream, &mut params)
            }
        }
        .map_err(|e| format!("launch: {e}"))
    }

    /// How many clusters of `l`'s kernel can be resident at once, with `l`'s block size and
    /// dynamic shared memory (the kernel's compile-time cluster shape, `__cluster_dims__`;
    /// `l.grid` a multiple of it). A cluster's CTAs must share a GPC, so on a device whose GPCs
    /// hold odd SM counts fewer than SMs / cluster size fit: a kernel sized for one wave of
    /// clusters asks this first.
    pub(crate) fn max_active_clusters(&self, op: OpId, l: &Launch) -> Result<u32> {
        let f = self.kernel(op, l)?;
        let config = sys::CUlaunchConfig {
            gridDimX: l.grid.0,
            gridDimY: l.grid.1,
            gridDimZ: l.grid.2,
            blockDimX: l.block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: l.smem,
            hStream: self.stream.cu_stream(),
            attrs: std::ptr::null_mut(),
            numAttrs: 0,
        };
        let mut n: std::ffi::c_int = 0;
        self.device.ctx.bind_to_thread().map_err(drv("binding the context"))?;
        // SAFETY: `n` and `config` outlive the call, which only reads `config` (no attributes:
        // the kernel's own cluster shape applies) and writes `n`; the function belongs to this
        // queue's context, which is current. Nothing is launched.
        unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, f.cu_function(), &config) }
            .result()
            .map_err(|e| Error::op_failed(op, BACKEND, format!("{}: cluster occupancy: {e}", l.symbol())))?;
        Ok(n.max(0) as u32)
    }

    /// The device's streaming multiprocessor count.
    pub(crate) fn sm_count(&self) -> Result<u32> {
        let n = self
            .device
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("reading the SM count"))?;
        Ok(n.max(1) as u32)
    }

    /// The largest dynamic shared memory a block may opt into (227 KB on an H100/H200, 163
    /// KB on an A100).
    pub(crate) fn smem_optin(&self) -> Result<u32> {
        let n = self
            .device
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(drv("reading the shared-memory limit"))?;
        Ok(n.max(0) as u32)
    }
}

/// One operand of a [`BlasGemm`]: device address, leading dimension, batch stride (in
/// elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlasOperand {
    pub addr: u64,
    pub ld: i32,
    pub batch_stride: i64,
}

/// One `cublasGemmStridedBatchedEx` call in cuBLAS's column-major terms, as plain data:
/// `C[g] = op_a(A[g]) . op_b(B[g])` for g < batch, f32 compute, alpha 1, beta 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlasGemm {
    pub op_a: cublas_sys::cublasOperation_t,
    pub op_b: cublas_sys::cublasOperation_t,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub dtype: cublas_sys::cudaDataType,
    pub a: BlasOperand,
    pub b: BlasOperand,
    pub c: BlasOperand,
    pub batch: i32,
}

impl CudaQueue {
    /// Runs `g` on this queue's cuBLAS handle (bound to its stream). The matmul ops build
    /// `g` from validated views: its shapes, leading dimensions and batch strides describe
    /// exactly memory inside them.
    pub(crate) fn gemm(&self, op: OpId, g: &BlasGemm) -> Result<()> {
        let blas = self.blas.as_ref().ok_or_else(|| Error::op_failed(op, BACKEND, "cuBLAS is not loaded"))?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        self.device.ctx.bind_to_thread().map_err(drv("binding the context"))?;
        // SAFETY: `g`'s operands lie inside validated views (see above); alpha/beta are
        // host f32 values read during the call (host pointer mode, f32 compute); the handle
        // is bound to this queue's stream and has its own workspace, so the call neither
        // allocates nor syncs.
        unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                blas.handle,
                g.op_a,
                g.op_b,
                g.m,
                g.n,
                g.k,
                &alpha as *const f32 as *const c_void,
                g.a.addr as *const c_void,
                g.dtype,
                g.a.ld,
                g.a.batch_stride,
                g.b.addr as *const c_void,
                g.dtype,
                g.b.ld,
                g.b.batch_stride,
                &beta as *const f32 as *const c_void,
                g.c.addr as *mut c_void,
                g.dtype,
                g.c.ld,
                g.c.batch_stride,
                g.batch,
                cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| Error::op_failed(op, BACKEND, format!("cublasGemmStridedBatchedEx: {e}")))
    }
}

/// A TMA descriptor to encode at launch (`cuTensorMapEncodeTiled`), as plain data: the
/// 3-D tiled map of a 16-bit (or fp8) tensor at device address `addr` with `dims` (innermost first),
/// byte `strides` of dims 1 and 2 (multiples of 16), boxes of `boxes` elements, 128-byte
/// swizzle (what the sm_90 attention kernels' wgmma descriptors read) or none (`swizzle`
/// false), L2 promotion of 256 bytes, no interleave and zero fill out of bounds. An
/// fp8_ds_mla cache maps as 4-byte words (a 656-byte row is 164 of them, one box row).
/// `what` names the tensor in errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TensorMapSpec {
    pub what: &'static str,
    pub dtype: DType,
    pub addr: u64,
    pub dims: [u64; 3],
    pub strides: [u64; 2],
    pub boxes: [u32; 3],
    pub swizzle: bool,
}

impl TensorMapSpec {
    /// Bytes of one encoded descriptor in a kernel parameter, and its alignment there.
    #[cfg(test)]
    pub const BYTES: usize = 128;
    #[cfg(test)]
    pub const ALIGN: usize = 64;

    /// The safe wrapper of the driver's encode; the driver checks the values and errors on
    /// any it rejects.
    fn encode(&self) -> std::result::Result<sys::CUtensorMap, String> {
        let dt = match self.dtype {
            DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            // fp8 codes move as bytes (the fp8 matmuls' wgmma kernel reads them as e4m3).
            DType::F8E4M3 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            // fp8_ds_mla rows move as 4-byte words (656 bytes exceed a box's 256 elements).
            DType::Fp8DsMla => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT32,
            other => {
                return Err(format!(
                    "the TMA map of {} takes bf16, f16, f8e4m3 or fp8_ds_mla, not {other}",
                    self.what
                ))
            }
        };
        let elem = [1u32, 1, 1];
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        // SAFETY: every pointer refers to a live array of the length the rank (3) implies
        // (dims, boxes, element strides: 3; strides: 2); the driver only reads them and
        // writes the 128-byte map. The global address is only recorded in the map (the
        // driver does not access it); kernels read through the map within `dims`.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dt,
                3,
                self.addr as *mut c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.boxes.as_ptr(),
                elem.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                if self.swizzle {
                    sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B
                } else {
                    sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE
                },
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        r.result().map_err(|e| {
            format!(
                "encoding the TMA map of {} (dims {:?}, strides {:?}): {e}",
                self.what, self.dims, self.strides
            )
        })?;
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_source;

    static SRC: KernelSource = kernel_source!("rms_norm");

    #[test]
    fn dependent_on_marks_launches_dependent_from_sm_90_only() {
        let l = || Launch::new(&SRC, "rms_norm", DType::BF16, (1, 1, 1), 32, Vec::<Arg>::new());
        assert!(!l().dependent_on(80).dependent);
        assert!(!l().dependent_on(89).dependent);
        assert!(l().dependent_on(90).dependent);
        assert!(l().dependent_on(100).dependent);
    }
}
