//! Buffers whose sizes come from input data (issue 15): a shape whose byte size wraps is
//! an error naming the shape, never a wrongly sized allocation; a huge but valid size is
//! an error with the bytes it needs, never an abort; filling a buffer needs no host copy of
//! its size.

use vt_core::{Buffer, DType, Device, Queue};

fn q() -> Queue {
    vt_cpu::register();
    Queue::new(Device::CPU).unwrap()
}

fn err_msg<T: std::fmt::Debug>(r: vt_core::Result<T>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_shape_whose_byte_size_wraps_is_an_error_naming_it() {
    let q = q();
    // 2^62 elements of 4 bytes: the byte count wraps u64 to 0.
    let m = err_msg(Buffer::uninit(&q, DType::F32, &[1 << 62]));
    assert!(m.contains("Buffer") && m.contains("[4611686018427387904]") && m.contains("overflow"), "{m}");
    // A product that wraps i64 to a small positive count.
    let m = err_msg(Buffer::nan(&q, DType::BF16, &[1 << 32, 1 << 32, 2]));
    assert!(m.contains("overflow"), "{m}");
    let m = err_msg(Buffer::zeros(&q, DType::F32, &[-1, 4]));
    assert!(m.contains("[-1, 4]"), "{m}");
}

#[test]
fn a_huge_valid_buffer_is_an_error_with_its_bytes_not_an_abort() {
    let q = q();
    // 2^46 f32 = 256 TiB: valid arithmetic, no machine has it.
    let m = err_msg(Buffer::nan(&q, DType::F32, &[1 << 40, 64]));
    assert!(m.contains(&(1u64 << 48).to_string()) && m.contains("bytes"), "{m}");
    let m = err_msg(Buffer::zeros(&q, DType::F32, &[1 << 45]));
    assert!(m.contains(&(1u64 << 47).to_string()), "{m}");
}

#[test]
fn fill_pattern_writes_every_element_and_checks_the_pattern() {
    let q = q();
    // Larger than one 1 MiB piece, not a multiple of it.
    let b = Buffer::uninit(&q, DType::F32, &[300_001]).unwrap();
    b.fill_pattern(&q, &1.5f32.to_le_bytes()).unwrap();
    assert!(b.to_vec::<f32>(&q).unwrap().iter().all(|&v| v == 1.5));
    let m = err_msg(b.fill_pattern(&q, &[0u8; 3]));
    assert!(m.contains("pattern"), "{m}");
    let e = Buffer::nan(&q, DType::BF16, &[0, 7]).unwrap();
    assert!(e.to_bytes(&q).unwrap().is_empty());
}
