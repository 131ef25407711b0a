//! Helpers shared by the vt-cpu tests: queues, seeded random operands laid out as
//! strided views inside larger pools, NaN/sentinel-poisoned outputs, error measures.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vt_core::{
    contiguous_strides, encode_f64, for_each_offset, Buffer, DType, Device, Error, OpId, Queue, Result,
    Subject, Tensor,
};

pub const FLOAT_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The value every element outside an output view holds; exact in every float dtype.
pub const SENTINEL: f64 = -8.5;

pub fn queue() -> Queue {
    vt_cpu::register();
    Queue::new(Device::CPU).unwrap()
}

/// A fresh random generator; the seed is printed (shown on failure) and can be fixed
/// with `VT_SEED=<n>` to reproduce a run (the same variable as the GPU tests').
pub fn rng(test: &str) -> ChaCha8Rng {
    let seed = std::env::var("VT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    println!("{test}: seed {seed} (reproduce with VT_SEED={seed})");
    ChaCha8Rng::seed_from_u64(seed)
}

/// Relative Frobenius tolerance of the CPU backend against an f64 reference computed
/// from the same (rounded) inputs: f32 arithmetic plus one rounding to the storage dtype.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 1e-2,
        other => panic!("no tolerance for {other}"),
    }
}

/// Where a view lies in its pool.
#[derive(Clone, Debug)]
pub enum Layout {
    /// Row-major, the whole pool.
    Contiguous,
    /// Every dim padded (the last by 3, the others by 1) and a leading offset of 2: rows
    /// strided, nothing contiguous beyond the last dim.
    Padded,
    /// Explicit element offset and strides in a pool of `len` elements.
    Strided { len: i64, offset: i64, strides: Vec<i64> },
}

/// A 1-D buffer holding one operand as a strided view, with a snapshot of its contents
/// so that writes outside the view (or into an input) are detected.
pub struct Pool {
    pub buf: Buffer,
    pub offset: i64,
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    pub before: Vec<f64>,
}

fn place(shape: &[i64], layout: &Layout) -> (i64, i64, Vec<i64>) {
    match layout {
        Layout::Contiguous => {
            let s = contiguous_strides(shape);
            (shape.iter().product::<i64>().max(1), 0, s[..shape.len()].to_vec())
        }
        Layout::Padded => {
            let n = shape.len();
            let padded: Vec<i64> =
                shape.iter().enumerate().map(|(d, &s)| s + if d + 1 == n { 3 } else { 1 }).collect();
            let s = contiguous_strides(&padded);
            (2 + padded.iter().product::<i64>() + 1, 2, s[..n].to_vec())
        }
        Layout::Strided { len, offset, strides } => (*len, *offset, strides.clone()),
    }
}

impl Pool {
    /// An operand of random values in [-1, 1) (as stored in `dtype`), everywhere in the pool.
    pub fn input(q: &Queue, rng: &mut impl Rng, dtype: DType, shape: &[i64], layout: Layout) -> Pool {
        let (len, offset, strides) = place(shape, &layout);
        let vals: Vec<f64> = (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect();
        Pool::with_values(q, dtype, shape, len, offset, strides, &vals)
    }

    /// An operand with explicit pool contents.
    pub fn with_values(
        q: &Queue,
        dtype: DType,
        shape: &[i64],
        len: i64,
        offset: i64,
        strides: Vec<i64>,
        vals: &[f64],
    ) -> Pool {
        let buf = Buffer::from_f64(q, dtype, &[len], vals).unwrap();
        let before = buf.to_f64(q).unwrap();
        let p = Pool { buf, offset, shape: shape.to_vec(), strides, before };
        p.view(); // checks the layout fits
        p
    }

    /// An output: NaN everywhere the view reaches, [`SENTINEL`] everywhere else.
    pub fn output(q: &Queue, dtype: DType, shape: &[i64], layout: Layout) -> Pool {
        let (len, offset, strides) = place(shape, &layout);
        let nan = Buffer::nan(q, dtype, &[len]).unwrap();
        let inside = {
            let v = nan.view().as_strided(offset, shape, &strides).unwrap();
            let mut inside = vec![false; len as usize];
            for_each_offset(&v, |o| inside[o as usize] = true);
            inside
        };
        let vals: Vec<f64> = inside.iter().map(|&i| if i { f64::NAN } else { SENTINEL }).collect();
        let buf = Buffer::from_bytes(q, dtype, &[len], &encode_f64(dtype, &vals)).unwrap();
        let before = buf.to_f64(q).unwrap();
        Pool { buf, offset, shape: shape.to_vec(), strides, before }
    }

    pub fn view(&self) -> Tensor<'_> {
        self.buf.view().as_strided(self.offset, &self.shape, &self.strides).unwrap()
    }

    /// The view's elements in logical row-major order.
    pub fn values(&self, q: &Queue) -> Vec<f64> {
        q.read_f64(&self.view()).unwrap()
    }

    fn inside(&self) -> Vec<bool> {
        let mut inside = vec![false; self.before.len()];
        for_each_offset(&self.view(), |o| inside[o as usize] = true);
        inside
    }

    /// Every element outside the view still holds what it held at creation.
    pub fn assert_outside_untouched(&self, q: &Queue) {
        let now = self.buf.to_f64(q).unwrap();
        for (i, inside) in self.inside().into_iter().enumerate() {
            if !inside {
                assert!(
                    same(now[i], self.before[i]),
                    "element {i} outside the view changed: {} -> {}",
                    self.before[i],
                    now[i]
                );
            }
        }
    }

    /// Nothing in the pool changed (inputs, and outputs of a rejected call).
    pub fn assert_unchanged(&self, q: &Queue) {
        let now = self.buf.to_f64(q).unwrap();
        for (i, (a, b)) in now.iter().zip(&self.before).enumerate() {
            assert!(same(*a, *b), "element {i} changed: {b} -> {a}");
        }
    }
}

/// Equal, or both NaN.
pub fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// Asserts `r` is `Error::InvalidArgument` naming `op` and `arg` (`case` describes the
/// malformation); returns the error's message.
pub fn expect_invalid(case: &str, r: Result<()>, op: OpId, arg: &str) -> String {
    match r {
        Err(Error::InvalidArgument { op: o, arg: a, msg }) => {
            assert_eq!((o, a), (Subject::Op(op), arg), "{case}: wrong op/arg (message: {msg})");
            msg
        }
        other => panic!("{case}: expected InvalidArgument {{ op: {op}, arg: {arg} }}, got {other:?}"),
    }
}

/// e4m3fn from its bit fields, in f64 (naive: written from the format, not from vt-core).
pub fn e4m3(b: u8) -> f64 {
    let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (((b >> 3) & 0xf) as i32, (b & 7) as f64);
    if b & 0x7f == 0x7f {
        f64::NAN
    } else if e == 0 {
        s * m * 2f64.powi(-9)
    } else {
        s * (8.0 + m) * 2f64.powi(e - 10)
    }
}

/// An i64 index tensor.
pub fn i64_buf(q: &Queue, v: &[i64]) -> Buffer {
    Buffer::from_slice(q, &[v.len() as i64], v).unwrap()
}

/// An i32 index tensor of `shape`.
pub fn i32_buf(q: &Queue, shape: &[i64], v: &[i32]) -> Buffer {
    Buffer::from_slice(q, shape, v).unwrap()
}

/// `||got - want|| / ||want||` (absolute when `want` is zero).
pub fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum::<f64>().sqrt();
    let den: f64 = want.iter().map(|w| w * w).sum::<f64>().sqrt();
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

/// No NaN in `got`, and relative Frobenius error against `want` within `tol`.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    if let Some(i) = got.iter().position(|v| v.is_nan()) {
        panic!("{what}: element {i} is NaN (unwritten?)");
    }
    let e = rel_err(got, want);
    println!("{what}: relative error {e:.3e} (tolerance {tol:.0e})");
    assert!(e <= tol, "{what}: relative error {e:.3e} exceeds {tol:.0e}");
}

/// Log-sum-exp values: -inf exactly where the reference has -inf, the rest close.
pub fn assert_lse_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    let (mut g, mut w) = (Vec::new(), Vec::new());
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        if b == f64::NEG_INFINITY {
            assert_eq!(a, f64::NEG_INFINITY, "{what}: element {i} should be -inf (no keys), got {a}");
        } else {
            g.push(a);
            w.push(b);
        }
    }
    assert_close(what, &g, &w, tol);
}

/// The cos/sin cache of a rotary embedding: row p = [cos(p * f_i) | sin(p * f_i)], f32.
pub fn cos_sin_cache(q: &Queue, max_pos: usize, rot: usize) -> Buffer {
    let half = rot / 2;
    let mut v = Vec::with_capacity(max_pos * rot);
    for p in 0..max_pos {
        let freqs: Vec<f64> =
            (0..half).map(|i| p as f64 * 10000f64.powf(-(2.0 * i as f64) / rot as f64)).collect();
        v.extend(freqs.iter().map(|a| a.cos()));
        v.extend(freqs.iter().map(|a| a.sin()));
    }
    Buffer::from_f64(q, DType::F32, &[max_pos as i64, rot as i64], &v).unwrap()
}
