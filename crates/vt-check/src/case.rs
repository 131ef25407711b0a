//! One parity case: host-side inputs, which elements are outputs, and how to call the op.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vt_core::{for_each_strided_offset, Buffer, DType, Error, OpId, Queue, Result, Tensor};

/// How a case calls its op on one queue, given the case's buffers uploaded there.
pub(crate) type Exec = Box<dyn Fn(&Queue, &[Buffer]) -> Result<()> + Send + Sync>;

/// The element type of a case buffer: the dtype under test, or a fixed one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    /// The floating-point dtype the case runs in (bf16, f16 or f32).
    Float,
    F32,
    I32,
    I64,
    /// Raw bytes of an fp8_ds_mla cache (`DType::Fp8DsMla`: values 0..=255, poison 0xff).
    Fp8DsMla,
    /// fp8 e4m3 values (`DType::F8E4M3`: uploaded rounded to e4m3, poison 0x7f = NaN).
    F8E4M3,
}

impl Ty {
    fn resolve(self, dtype: DType) -> DType {
        match self {
            Ty::Float => dtype,
            Ty::F32 => DType::F32,
            Ty::I32 => DType::I32,
            Ty::I64 => DType::I64,
            Ty::Fp8DsMla => DType::Fp8DsMla,
            Ty::F8E4M3 => DType::F8E4M3,
        }
    }
}

pub(crate) enum Init {
    /// Uploaded through `Buffer::from_f64` (rounded once to the buffer's dtype).
    Values(Vec<f64>),
    /// `Buffer::nan`: poison.
    Poison,
}

pub(crate) struct BufSpec {
    pub name: String,
    pub ty: Ty,
    pub len: usize,
    pub init: Init,
}

/// An output of a case: the elements of one buffer the op must write.
pub(crate) struct Output {
    pub name: String,
    pub buf: usize,
    pub written: Vec<bool>,
}

/// A strided view of one of a case's (flat) buffers, described on the host.
#[derive(Clone, Debug)]
pub(crate) struct View {
    pub buf: usize,
    pub offset: i64,
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
}

impl View {
    /// A view of the same buffer, `offset` elements after this one's first element.
    pub fn sub(&self, offset: i64, shape: &[i64], strides: &[i64]) -> View {
        View { buf: self.buf, offset: self.offset + offset, shape: shape.to_vec(), strides: strides.to_vec() }
    }

    /// Elements `start..end` of dim `d`.
    pub fn slice(&self, d: usize, start: i64, end: i64) -> View {
        let mut v = self.clone();
        v.offset += start * self.strides[d];
        v.shape[d] = end - start;
        v
    }

    /// The vt-core view of this on `bufs` (the case's buffers on one queue).
    pub fn tensor<'a>(&self, bufs: &'a [Buffer]) -> Result<Tensor<'a>> {
        let b = bufs
            .get(self.buf)
            .ok_or_else(|| Error::other("vt-check", format!("view of missing buffer {}", self.buf)))?;
        b.view().as_strided(self.offset, &self.shape, &self.strides)
    }

    /// Marks every element of the view in `mask` (a mask over its whole buffer).
    pub fn mark(&self, mask: &mut [bool]) {
        let walked = for_each_strided_offset(self.offset, &self.shape, &self.strides, |off| {
            if let Some(m) = usize::try_from(off).ok().and_then(|o| mask.get_mut(o)) {
                *m = true;
            }
        });
        // Views come from Builder::push and slicing, inside a buffer of `mask.len()` elements.
        debug_assert!(walked.is_ok(), "{walked:?}");
    }
}

/// Row-major strides of `shape`.
pub(crate) fn strides_of(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Collects a case's buffers and outputs; holds the case's RNG.
pub(crate) struct Builder {
    pub rng: ChaCha8Rng,
    bufs: Vec<BufSpec>,
    outputs: Vec<Output>,
}

impl Builder {
    pub fn new(seed: u64) -> Builder {
        Builder { rng: ChaCha8Rng::seed_from_u64(seed), bufs: Vec::new(), outputs: Vec::new() }
    }

    /// A buffer holding `values`; returns its contiguous view as `shape` (a count that
    /// does not match the shape surfaces as a view error when the case runs).
    pub fn values(&mut self, name: &str, ty: Ty, shape: &[i64], values: Vec<f64>) -> View {
        let len = values.len();
        self.push(name, ty, shape, len, Init::Values(values))
    }

    /// A buffer of the dtype under test with values uniform in `[lo, hi)`.
    pub fn uniform(&mut self, name: &str, shape: &[i64], lo: f64, hi: f64) -> View {
        let len = shape.iter().product::<i64>() as usize;
        let v = (0..len).map(|_| self.rng.gen_range(lo..hi)).collect();
        self.values(name, Ty::Float, shape, v)
    }

    /// A buffer poisoned with NaN (all-ones for integers).
    pub fn poison(&mut self, name: &str, ty: Ty, shape: &[i64]) -> View {
        let len = shape.iter().product::<i64>() as usize;
        self.push(name, ty, shape, len, Init::Poison)
    }

    fn push(&mut self, name: &str, ty: Ty, shape: &[i64], len: usize, init: Init) -> View {
        self.bufs.push(BufSpec { name: name.to_string(), ty, len, init });
        View { buf: self.bufs.len() - 1, offset: 0, shape: shape.to_vec(), strides: strides_of(shape) }
    }

    /// Declares every element of `view` an output.
    pub fn output(&mut self, name: &str, view: &View) {
        let mut mask = vec![false; self.bufs[view.buf].len];
        view.mark(&mut mask);
        self.output_mask(name, view.buf, mask);
    }

    /// Declares the elements of buffer `buf` marked in `written` an output. Two outputs
    /// in one buffer become one (their masks joined).
    pub fn output_mask(&mut self, name: &str, buf: usize, written: Vec<bool>) {
        if let Some(o) = self.outputs.iter_mut().find(|o| o.buf == buf) {
            o.name = format!("{}+{name}", o.name);
            o.written.iter_mut().zip(&written).for_each(|(a, &b)| *a |= b);
            return;
        }
        self.outputs.push(Output { name: name.to_string(), buf, written });
    }

    /// The length of buffer `buf`, for building masks.
    pub fn len_of(&self, buf: usize) -> usize {
        self.bufs[buf].len
    }
}

/// How a case declares its buffers and outputs on a [`Builder`] and returns its call.
pub(crate) type Build = Box<dyn Fn(&mut Builder) -> Exec + Send + Sync>;

/// One parity case of one op: a name, a seed, and how to build its inputs. Cheap to
/// hold: inputs are drawn only when the case runs, and do not depend on the dtype or
/// the backend (every column sees the same values; [`crate::run_case`] picks the dtype).
pub struct Case {
    op: OpId,
    name: String,
    seed: u64,
    long: bool,
    build: Build,
}

/// A case's inputs drawn: the buffers with their initial contents, the outputs, the call.
pub(crate) struct Built {
    pub bufs: Vec<BufSpec>,
    pub outputs: Vec<Output>,
    pub exec: Exec,
}

impl Case {
    pub fn op(&self) -> OpId {
        self.op
    }

    /// What the case covers (shapes, views, block size, flags).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The seed the case's inputs are drawn from ([`case_seed`] of the run's seed).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// A case too slow for the CPU reference in a debug build (a few thousand cached
    /// tokens); debug-build tests skip these, `cargo xtask parity` (release) runs them.
    pub fn is_long(&self) -> bool {
        self.long
    }

    /// Draws the inputs, uploads them to `queue` in `dtype` (outputs poisoned) and
    /// returns them ready to run, for benches and for tests that inspect results.
    pub fn prepare(&self, queue: &Queue, dtype: DType) -> Result<Prepared> {
        let built = self.build();
        let bufs = built.upload(queue, dtype)?;
        Ok(Prepared { queue: queue.clone(), bufs, built })
    }

    /// Draws the inputs from the case's seed.
    pub(crate) fn build(&self) -> Built {
        let mut b = Builder::new(self.seed);
        let exec = (self.build)(&mut b);
        Built { bufs: b.bufs, outputs: b.outputs, exec }
    }
}

/// A case uploaded to one queue ([`Case::prepare`]).
pub struct Prepared {
    queue: Queue,
    bufs: Vec<Buffer>,
    built: Built,
}

impl Prepared {
    /// Issues the op once on the queue (asynchronously on GPUs). Running it again reruns
    /// it on the current buffer contents: ops that work in place (RopeFromCache, an
    /// in-place RmsNorm, ConcatAndCacheMla's cache) see their previous results.
    pub fn run(&self) -> Result<()> {
        (self.built.exec)(&self.queue, &self.bufs)
    }

    /// The case's buffers on the queue, in declaration order.
    pub fn buffers(&self) -> &[Buffer] {
        &self.bufs
    }

    pub fn queue(&self) -> &Queue {
        &self.queue
    }
}

impl Built {
    /// Uploads the buffers to `queue` in `dtype`.
    pub fn upload(&self, queue: &Queue, dtype: DType) -> Result<Vec<Buffer>> {
        self.bufs
            .iter()
            .map(|b| {
                let dt = b.ty.resolve(dtype);
                let shape = [b.len as i64];
                match &b.init {
                    Init::Values(v) => Buffer::from_f64(queue, dt, &shape, v),
                    Init::Poison => Buffer::nan(queue, dt, &shape),
                }
            })
            .collect()
    }
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Case({} / {}, seed {})", self.op, self.name, self.seed)
    }
}

/// The seed of case `index` of `op` in a run with `seed`: a SplitMix64 mix, so cases
/// draw independent inputs and the run's one printed seed replays all of them. It does
/// not depend on the backend or the dtype: every column sees the same values.
pub fn case_seed(seed: u64, op: OpId, index: usize) -> u64 {
    let op_index = OpId::ALL.iter().position(|&o| o == op).unwrap_or(OpId::ALL.len()) as u64;
    splitmix64(seed ^ splitmix64((op_index << 32) | index as u64))
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The case list of one op being built.
pub(crate) struct Cases {
    op: OpId,
    seed: u64,
    pub list: Vec<Case>,
}

impl Cases {
    pub fn new(op: OpId, seed: u64) -> Cases {
        Cases { op, seed, list: Vec::new() }
    }

    /// Adds a case; `build` declares its buffers and outputs and returns the call.
    pub fn add<F>(&mut self, name: impl Into<String>, build: F)
    where
        F: Fn(&mut Builder) -> Exec + Send + Sync + 'static,
    {
        self.push(name.into(), false, Box::new(build));
    }

    /// Adds a case that [`Case::is_long`].
    pub fn add_long<F>(&mut self, name: impl Into<String>, build: F)
    where
        F: Fn(&mut Builder) -> Exec + Send + Sync + 'static,
    {
        self.push(name.into(), true, Box::new(build));
    }

    fn push(&mut self, name: String, long: bool, build: Build) {
        let seed = case_seed(self.seed, self.op, self.list.len());
        self.list.push(Case { op: self.op, name, seed, long, build });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_marks_exactly_its_elements() {
        // A [2,3] view with row stride 5 at offset 1 of a 10-element buffer.
        let v = View { buf: 0, offset: 1, shape: vec![2, 3], strides: vec![5, 1] };
        let mut m = vec![false; 10];
        v.mark(&mut m);
        let got: Vec<usize> = (0..10).filter(|&i| m[i]).collect();
        assert_eq!(got, vec![1, 2, 3, 6, 7, 8]);
        let mut m = vec![false; 10];
        v.slice(1, 1, 3).slice(0, 1, 2).mark(&mut m);
        assert_eq!((0..10).filter(|&i| m[i]).collect::<Vec<_>>(), vec![7, 8]);
    }

    #[test]
    fn case_seeds_differ_by_op_and_index_and_replay() {
        let a = case_seed(1, OpId::RmsNorm, 0);
        assert_eq!(a, case_seed(1, OpId::RmsNorm, 0));
        assert_ne!(a, case_seed(1, OpId::RmsNorm, 1));
        assert_ne!(a, case_seed(1, OpId::MatmulBT, 0));
        assert_ne!(a, case_seed(2, OpId::RmsNorm, 0));
    }
}
