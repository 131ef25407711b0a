//! Reads the kernel descriptions out of an AMDGPU code object (what hiprtc produces): the
//! `NT_AMDGPU_METADATA` note of the ELF file, a MessagePack map whose `amdhsa.kernels`
//! lists every kernel with its arguments (size, kind), its largest workgroup and its
//! static shared memory. Used by `selfcheck` to compare the host's launch arguments with
//! the compiled kernels, without a GPU. Only what that needs is parsed.

/// One kernel argument as the compiler laid it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgMeta {
    pub size: u64,
    /// `global_buffer` for pointers, `by_value` for scalars, `hidden_*` for the
    /// runtime's own arguments.
    pub value_kind: String,
}

/// One kernel of a code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelMeta {
    pub name: String,
    pub args: Vec<ArgMeta>,
    pub max_flat_workgroup_size: u64,
    /// Static shared memory (LDS) in bytes.
    pub group_segment_fixed_size: u64,
    pub wavefront_size: u64,
}

impl KernelMeta {
    /// The arguments the host passes (the runtime fills the hidden ones).
    pub fn explicit_args(&self) -> impl Iterator<Item = &ArgMeta> {
        self.args.iter().filter(|a| !a.value_kind.starts_with("hidden"))
    }
}

/// The kernels described by the metadata note of an ELF code object.
pub fn kernels(elf: &[u8]) -> Result<Vec<KernelMeta>, String> {
    let note = metadata_note(elf)?;
    let mut r = Reader { b: note, at: 0 };
    let root = r.value()?;
    let list = root.get("amdhsa.kernels").and_then(Value::as_array).ok_or("no amdhsa.kernels")?;
    list.iter()
        .map(|k| {
            let name = k.get(".name").and_then(Value::as_str).ok_or("kernel without .name")?.to_string();
            let args = match k.get(".args").and_then(Value::as_array) {
                Some(a) => a
                    .iter()
                    .map(|a| {
                        Ok(ArgMeta {
                            size: a.get(".size").and_then(Value::as_u64).ok_or("argument without .size")?,
                            value_kind: a
                                .get(".value_kind")
                                .and_then(Value::as_str)
                                .ok_or("argument without .value_kind")?
                                .to_string(),
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?,
                None => Vec::new(),
            };
            let num = |key: &str| k.get(key).and_then(Value::as_u64).unwrap_or(0);
            Ok(KernelMeta {
                name,
                args,
                max_flat_workgroup_size: num(".max_flat_workgroup_size"),
                group_segment_fixed_size: num(".group_segment_fixed_size"),
                wavefront_size: num(".wavefront_size"),
            })
        })
        .collect()
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, String> {
    b.get(at..at + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or_else(|| "truncated ELF".into())
}
fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| "truncated ELF".into())
}
fn u64_at(b: &[u8], at: usize) -> Result<u64, String> {
    let s = b.get(at..at + 8).ok_or("truncated ELF")?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_le_bytes(a))
}

/// The descriptor of the `AMDGPU` note of type 32 (NT_AMDGPU_METADATA).
fn metadata_note(elf: &[u8]) -> Result<&[u8], String> {
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return Err("not a little-endian ELF64 file".into());
    }
    let shoff = u64_at(elf, 0x28)? as usize;
    let shentsize = u16_at(elf, 0x3a)? as usize;
    let shnum = u16_at(elf, 0x3c)? as usize;
    for i in 0..shnum {
        let sh = shoff + i * shentsize;
        if u32_at(elf, sh + 4)? != 7 {
            continue; // not SHT_NOTE
        }
        let (off, size) = (u64_at(elf, sh + 0x18)? as usize, u64_at(elf, sh + 0x20)? as usize);
        let notes = elf.get(off..off + size).ok_or("note section outside the file")?;
        let mut at = 0;
        while at + 12 <= notes.len() {
            let (namesz, descsz, ty) =
                (u32_at(notes, at)? as usize, u32_at(notes, at + 4)? as usize, u32_at(notes, at + 8)?);
            let name_at = at + 12;
            let desc_at = name_at + namesz.div_ceil(4) * 4;
            let name = notes.get(name_at..name_at + namesz).ok_or("truncated note")?;
            let desc = notes.get(desc_at..desc_at + descsz).ok_or("truncated note")?;
            if name == b"AMDGPU\0" && ty == 32 {
                return Ok(desc);
            }
            at = desc_at + descsz.div_ceil(4) * 4;
        }
    }
    Err("no NT_AMDGPU_METADATA note".into())
}

/// The MessagePack values the metadata uses.
#[derive(Debug)]
enum Value {
    /// nil, booleans, floats and binary: present in the metadata, never needed here.
    Other,
    Int(i128),
    Str(String),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

impl Value {
    fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(m) => m.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v),
            _ => None,
        }
    }
    fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }
    fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let s = self.b.get(self.at..self.at + n).ok_or("truncated MessagePack")?;
        self.at += n;
        Ok(s)
    }
    fn uint(&mut self, n: usize) -> Result<u64, String> {
        Ok(self.take(n)?.iter().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    }
    fn str(&mut self, n: usize) -> Result<Value, String> {
        Ok(Value::Str(String::from_utf8_lossy(self.take(n)?).into_owned()))
    }
    fn array(&mut self, n: usize) -> Result<Value, String> {
        (0..n).map(|_| self.value()).collect::<Result<Vec<_>, _>>().map(Value::Array)
    }
    fn map(&mut self, n: usize) -> Result<Value, String> {
        (0..n).map(|_| Ok((self.value()?, self.value()?))).collect::<Result<Vec<_>, String>>().map(Value::Map)
    }
    fn value(&mut self) -> Result<Value, String> {
        let t = self.take(1)?[0];
        Ok(match t {
            0x00..=0x7f => Value::Int(t as i128),
            0x80..=0x8f => self.map((t & 0x0f) as usize)?,
            0x90..=0x9f => self.array((t & 0x0f) as usize)?,
            0xa0..=0xbf => self.str((t & 0x1f) as usize)?,
            0xc0 | 0xc2 | 0xc3 => Value::Other,
            0xc4..=0xc6 => {
                let n = self.uint(1 << (t - 0xc4))? as usize;
                self.take(n)?;
                Value::Other
            }
            0xca => {
                self.take(4)?;
                Value::Other
            }
            0xcb => {
                self.take(8)?;
                Value::Other
            }
            0xcc..=0xcf => Value::Int(self.uint(1 << (t - 0xcc))? as i128),
            0xd0 => Value::Int(self.uint(1)? as u8 as i8 as i128),
            0xd1 => Value::Int(self.uint(2)? as u16 as i16 as i128),
            0xd2 => Value::Int(self.uint(4)? as u32 as i32 as i128),
            0xd3 => Value::Int(self.uint(8)? as i64 as i128),
            0xd9..=0xdb => {
                let n = self.uint(1 << (t - 0xd9))? as usize;
                self.str(n)?
            }
            0xdc | 0xdd => {
                let n = self.uint(if t == 0xdc { 2 } else { 4 })? as usize;
                self.array(n)?
            }
            0xde | 0xdf => {
                let n = self.uint(if t == 0xde { 2 } else { 4 })? as usize;
                self.map(n)?
            }
            0xe0..=0xff => Value::Int((t as i8) as i128),
            other => return Err(format!("unsupported MessagePack type byte {other:#04x}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messagepack_reader_decodes_the_types_the_metadata_uses() {
        // {"amdhsa.kernels": [{".name": "k", ".args": [{".size": 8, ".value_kind": "by_value"}],
        //   ".max_flat_workgroup_size": 256 (u16), ".wavefront_size": 64}]}
        let mut b = vec![0x81, 0xae];
        b.extend_from_slice(b"amdhsa.kernels");
        b.extend_from_slice(&[0x91, 0x84, 0xa5]);
        b.extend_from_slice(b".name");
        b.extend_from_slice(&[0xa1, b'k', 0xa5]);
        b.extend_from_slice(b".args");
        b.extend_from_slice(&[0x91, 0x82, 0xa5]);
        b.extend_from_slice(b".size");
        b.push(0x08);
        b.push(0xab);
        b.extend_from_slice(b".value_kind");
        b.push(0xa8);
        b.extend_from_slice(b"by_value");
        b.push(0xb8);
        b.extend_from_slice(b".max_flat_workgroup_size");
        b.extend_from_slice(&[0xcd, 0x01, 0x00]);
        b.push(0xaf);
        b.extend_from_slice(b".wavefront_size");
        b.push(0x40);
        let mut r = Reader { b: &b, at: 0 };
        let v = r.value().unwrap();
        assert_eq!(r.at, b.len());
        let k = &v.get("amdhsa.kernels").unwrap().as_array().unwrap()[0];
        assert_eq!(k.get(".name").unwrap().as_str(), Some("k"));
        assert_eq!(k.get(".max_flat_workgroup_size").unwrap().as_u64(), Some(256));
        assert_eq!(k.get(".wavefront_size").unwrap().as_u64(), Some(64));
        let arg = &k.get(".args").unwrap().as_array().unwrap()[0];
        assert_eq!(arg.get(".size").unwrap().as_u64(), Some(8));
        assert_eq!(arg.get(".value_kind").unwrap().as_str(), Some("by_value"));
    }

    #[test]
    fn truncated_or_foreign_input_is_an_error_not_a_panic() {
        assert!(kernels(b"not an elf").is_err());
        assert!(kernels(&[0u8; 200]).is_err());
        let mut r = Reader { b: &[0xdc, 0x00], at: 0 };
        assert!(r.value().is_err());
        let mut r = Reader { b: &[0xc7, 0x01, 0x00, 0x00], at: 0 };
        assert!(r.value().is_err());
    }
}
