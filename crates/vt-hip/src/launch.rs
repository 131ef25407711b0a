//! What an op asks the device to do, as plain data: kernel launches (file, kernel, grid,
//! block, shared memory, arguments) and rocBLAS GEMMs. Ops build these in a `plan`
//! function that touches no device, so the argument lists can be checked against the
//! compiled kernels' metadata on a machine without a GPU (see `selfcheck.rs`).

use vt_core::{DType, Error, Result, Tensor};

use crate::gemm::RocblasGemm;

/// Threads per block of every kernel (`VT_BLOCK` in kernels-hip/common.h).
pub(crate) const BLOCK: u32 = 256;
/// The most blocks a launch asks for; the kernels loop (grid-stride) over the rest.
pub(crate) const MAX_GRID: i64 = 65_535;
/// Keys per tile of the attention kernels (`VT_KEY_TILE` in kernels-hip/attention.h).
pub(crate) const KEY_TILE: i64 = 128;
/// Shared memory one block may use (64 KiB on every AMD GPU HIP supports).
pub(crate) const MAX_SHARED_BYTES: i64 = 64 * 1024;

/// One kernel argument, as the kernel declares it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A device address (`T*`, `const int*`, ...); 0 for an absent optional tensor.
    Ptr(u64),
    I64(i64),
    I32(i32),
    F32(f32),
}

impl Arg {
    /// Size in bytes of the C parameter.
    pub fn size(self) -> usize {
        match self {
            Arg::Ptr(_) | Arg::I64(_) => 8,
            Arg::I32(_) | Arg::F32(_) => 4,
        }
    }

    /// The value's bytes in the low end of an 8-byte slot (little-endian), which is what
    /// `hipModuleLaunchKernel` reads `size()` bytes of.
    fn slot(self) -> u64 {
        match self {
            Arg::Ptr(p) => p,
            Arg::I64(v) => v as u64,
            Arg::I32(v) => v as u32 as u64,
            Arg::F32(v) => v.to_bits() as u64,
        }
    }
}

/// A kernel's argument list, in declaration order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelArgs(pub Vec<Arg>);

impl KernelArgs {
    pub fn new() -> KernelArgs {
        KernelArgs(Vec::new())
    }
    /// The address of a view's first element.
    pub fn tensor(mut self, t: &Tensor<'_>) -> Self {
        self.0.push(Arg::Ptr(t.data_addr()));
        self
    }
    /// An optional view: its address, or a null pointer.
    pub fn opt_tensor(mut self, t: Option<&Tensor<'_>>) -> Self {
        self.0.push(Arg::Ptr(t.map_or(0, |t| t.data_addr())));
        self
    }
    /// A raw device address.
    pub fn ptr(mut self, addr: u64) -> Self {
        self.0.push(Arg::Ptr(addr));
        self
    }
    pub fn i64(mut self, v: i64) -> Self {
        self.0.push(Arg::I64(v));
        self
    }
    pub fn i32(mut self, v: i32) -> Self {
        self.0.push(Arg::I32(v));
        self
    }
    pub fn f32(mut self, v: f32) -> Self {
        self.0.push(Arg::F32(v));
        self
    }
    /// Several i64 values (strides, sizes).
    pub fn i64s(mut self, vs: &[i64]) -> Self {
        self.0.extend(vs.iter().map(|&v| Arg::I64(v)));
        self
    }

    /// One 8-byte slot per argument; the launch passes a pointer to each.
    pub(crate) fn slots(&self) -> Vec<u64> {
        self.0.iter().map(|a| a.slot()).collect()
    }
}

/// One launch of a kernel from one kernels-hip file.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// The source file in kernels-hip/ (`"rms_norm.hip"`).
    pub file: &'static str,
    /// The exported kernel (`"rms_norm_bf16"`).
    pub kernel: String,
    /// Blocks (1-D; the kernels loop over what does not fit).
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    pub args: KernelArgs,
}

impl Launch {
    /// A launch of `<op>_<dtype>` from `<op>.hip` over `items` grid-stride items (blocks);
    /// `None` when there is nothing to do.
    pub(crate) fn new(
        op: &'static str,
        file: &'static str,
        dtype: DType,
        items: i64,
        args: KernelArgs,
    ) -> Result<Option<Launch>> {
        if items <= 0 {
            return Ok(None);
        }
        Ok(Some(Launch {
            file,
            kernel: format!("{op}_{}", dtype_suffix(op, dtype)?),
            grid: items.min(MAX_GRID) as u32,
            block: BLOCK,
            shared_bytes: 0,
            args,
        }))
    }

    pub(crate) fn with_shared_bytes(mut self, bytes: u32) -> Launch {
        self.shared_bytes = bytes;
        self
    }
}

/// Grid size for a kernel with one thread per item.
pub(crate) fn blocks_for_threads(items: i64) -> i64 {
    (items + BLOCK as i64 - 1) / BLOCK as i64
}

/// The kernel-name suffix of a float dtype (`VT_FOR_EACH_DTYPE` in common.h).
pub(crate) fn dtype_suffix(op: &'static str, dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::F16 => Ok("f16"),
        DType::BF16 => Ok("bf16"),
        other => Err(Error::invalid(op, "dtype", format!("{other} has no HIP kernel"))),
    }
}

/// One step of an op on the device.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Kernel(Launch),
    Gemm(RocblasGemm),
}

/// Wraps optional launches as steps, dropping the empty ones.
pub(crate) fn kernels(launches: impl IntoIterator<Item = Option<Launch>>) -> Vec<Step> {
    launches.into_iter().flatten().map(Step::Kernel).collect()
}
