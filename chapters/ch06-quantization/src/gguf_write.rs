//! Writing GGUF: the first file this project writes.
//!
//! The layout is chapter 1's, written instead of read (all integers little-endian):
//!
//! ```text
//! magic "GGUF" | version 3 u32 | n_tensors u64 | n_kv u64
//! n_kv × (key: string, type: u32, value)
//! n_tensors × (name: string, n_dims: u32, dims: n_dims × u64, ggml type: u32, offset: u64)
//! zeros up to general.alignment (default 32)
//! each tensor's bytes, followed by zeros up to the alignment
//! ```
//!
//! A [`GgufWriter`] collects the metadata and the tensor infos, checks them the way a reader
//! will (duplicate keys or names, the alignment's type, whole blocks per row), and knows every
//! tensor's offset before a byte of data exists. The data is then streamed, one tensor at a
//! time, from a closure: a model is quantized tensor by tensor without holding the new file in
//! memory. [`GgufWriter::write_file`] writes to `OUT.tmp` and renames it to `OUT` only when
//! everything was written, so an error never leaves a half-written `OUT`.

use ch01::gguf::{GGML_MAX_DIMS, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC};
use ch01::{GgmlType, TensorInfo, Value};
use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The GGUF version written; llama.cpp writes 3 too.
pub const GGUF_VERSION: u32 = 3;
/// ggml's `GGML_MAX_NAME`: llama.cpp refuses a tensor name of this many bytes or more.
pub const GGML_MAX_NAME: usize = 64;

/// Why a GGUF file could not be written.
#[derive(Debug)]
pub enum WriteError {
    /// A metadata entry a reader would refuse.
    Key { key: String, reason: String },
    /// A tensor info a reader would refuse.
    Tensor { name: String, reason: String },
    /// The data given for a tensor, or the error met while producing it.
    Data { name: String, reason: String },
    /// Writing or renaming the file failed.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteError::Key { key, reason } => write!(f, "metadata key {key:?}: {reason}"),
            WriteError::Tensor { name, reason } => write!(f, "tensor {name:?}: {reason}"),
            WriteError::Data { name, reason } => write!(f, "data of tensor {name:?}: {reason}"),
            WriteError::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WriteError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn key_error(key: &str, reason: impl Into<String>) -> WriteError {
    WriteError::Key {
        key: key.to_string(),
        reason: reason.into(),
    }
}

fn tensor_error(name: &str, reason: impl Into<String>) -> WriteError {
    WriteError::Tensor {
        name: name.to_string(),
        reason: reason.into(),
    }
}

// ANCHOR: writer
/// A GGUF file being put together: metadata in order, tensor infos with their offsets.
#[derive(Debug, Clone, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    /// Bytes of the data section so far: every tensor padded to the alignment.
    data_len: u64,
}
// ANCHOR_END: writer

impl GgufWriter {
    /// An empty file.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// The metadata, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The tensor infos, in file order, with the offsets they will be written at.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// `general.alignment`, or 32.
    pub fn alignment(&self) -> u64 {
        match self.get("general.alignment") {
            Some(Value::U32(a)) => u64::from(*a),
            _ => GGUF_DEFAULT_ALIGNMENT,
        }
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    // ANCHOR: writer_set
    /// Set `key` as ggml's `gguf_set_val_*` does: an existing entry is removed and the new one
    /// goes last. (This is why llama.cpp's quantized files end with `general.file_type`.)
    pub fn set(&mut self, key: &str, value: Value) -> Result<(), WriteError> {
        check_value(key, &value)?;
        if key.is_empty() {
            return Err(key_error(key, "empty key"));
        }
        if key == "general.alignment" {
            if !self.tensors.is_empty() {
                return Err(key_error(
                    key,
                    "set before adding tensors: offsets depend on it",
                ));
            }
            match value {
                Value::U32(a) if a.is_power_of_two() => {}
                Value::U32(a) => return Err(key_error(key, format!("{a} is not a power of two"))),
                ref v => {
                    return Err(key_error(
                        key,
                        format!("must be a u32, not {}", v.describe()),
                    ));
                }
            }
        }
        self.remove(key);
        self.metadata.push((key.to_string(), value));
        Ok(())
    }

    /// Remove `key`, if present.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.metadata.iter().position(|(k, _)| k == key)?;
        Some(self.metadata.remove(i).1)
    }
    // ANCHOR_END: writer_set

    // ANCHOR: add_tensor
    /// Add a tensor of shape `dims` (ggml order: `dims[0]` is a row) and type `ty`; its data
    /// goes after the previous tensor's, at the next multiple of the alignment.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType) -> Result<(), WriteError> {
        if name.len() >= GGML_MAX_NAME {
            return Err(tensor_error(
                name,
                format!(
                    "name of {} bytes; llama.cpp reads at most {}",
                    name.len(),
                    GGML_MAX_NAME - 1
                ),
            ));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(tensor_error(name, "added twice"));
        }
        if dims.len() > GGML_MAX_DIMS as usize {
            return Err(tensor_error(
                name,
                format!("{} dimensions, at most {GGML_MAX_DIMS}", dims.len()),
            ));
        }
        if let Some(d) = dims.iter().find(|&&d| d > i64::MAX as u64) {
            return Err(tensor_error(
                name,
                format!("dimension {d} does not fit in ggml's int64_t"),
            ));
        }
        let info = TensorInfo {
            name: name.to_string(),
            dims: dims.to_vec(),
            ggml_type: ty,
            offset: self.data_len,
        };
        let row = dims.first().copied().unwrap_or(1);
        if ty.row_bytes(row).is_none() {
            return Err(tensor_error(
                name,
                format!(
                    "rows of {row} elements are not a whole number of {} blocks ({} elements)",
                    ty.name(),
                    ty.block_size()
                ),
            ));
        }
        let n_bytes = info.n_bytes();
        let end = (n_bytes != u64::MAX)
            .then(|| {
                self.data_len
                    .checked_add(n_bytes.next_multiple_of(self.alignment()))
            })
            .flatten()
            .ok_or_else(|| tensor_error(name, format!("shape {dims:?} of {ty} is too large")))?;
        self.data_len = end;
        self.tensors.push(info);
        Ok(())
    }
    // ANCHOR_END: add_tensor

    // ANCHOR: header
    /// The header: everything before the data section, padding included (ggml's
    /// `gguf_get_meta_data`).
    pub fn header(&self) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&GGUF_MAGIC);
        h.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut h, key);
            h.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            put_value(&mut h, value);
        }
        for t in &self.tensors {
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            h.extend_from_slice(&t.offset.to_le_bytes());
        }
        h.resize(h.len().next_multiple_of(self.alignment() as usize), 0);
        h
    }

    /// Size of the whole file.
    pub fn file_size(&self) -> u64 {
        self.header().len() as u64 + self.data_len
    }
    // ANCHOR_END: header

    // ANCHOR: write
    /// Write the file to `w`: the header, then each tensor's bytes as `data` returns them (in
    /// the order the tensors were added), each padded to the alignment. A tensor whose bytes
    /// are not exactly its size is an error. Returns the bytes written.
    pub fn write<W, F, D, E>(&self, w: &mut W, mut data: F) -> Result<u64, WriteError>
    where
        W: Write,
        F: FnMut(&TensorInfo) -> Result<D, E>,
        D: AsRef<[u8]>,
        E: fmt::Display,
    {
        let io = |source| WriteError::Io {
            path: PathBuf::from("(output)"),
            source,
        };
        let header = self.header();
        w.write_all(&header).map_err(io)?;
        let mut written = header.len() as u64;
        let zeros = vec![0u8; self.alignment() as usize];
        for t in &self.tensors {
            let d = data(t).map_err(|e| WriteError::Data {
                name: t.name.clone(),
                reason: e.to_string(),
            })?;
            let d = d.as_ref();
            if d.len() as u64 != t.n_bytes() {
                return Err(WriteError::Data {
                    name: t.name.clone(),
                    reason: format!(
                        "{} bytes given, but {:?} of {} takes {}",
                        d.len(),
                        t.dims,
                        t.ggml_type,
                        t.n_bytes()
                    ),
                });
            }
            let pad = t.n_bytes().next_multiple_of(self.alignment()) - t.n_bytes();
            w.write_all(d).map_err(io)?;
            w.write_all(&zeros[..pad as usize]).map_err(io)?;
            written += d.len() as u64 + pad;
        }
        Ok(written)
    }
    // ANCHOR_END: write

    // ANCHOR: write_file
    /// Write the file at `path`, through `path` + `.tmp`, renamed to `path` once complete and
    /// flushed to disk. On any error the temporary file is removed and `path` is untouched.
    pub fn write_file<F, D, E>(&self, path: impl AsRef<Path>, data: F) -> Result<u64, WriteError>
    where
        F: FnMut(&TensorInfo) -> Result<D, E>,
        D: AsRef<[u8]>,
        E: fmt::Display,
    {
        let path = path.as_ref();
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let result = self.write_tmp(&tmp, data);
        let result = result.and_then(|n| {
            std::fs::rename(&tmp, path).map_err(|source| WriteError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            Ok(n)
        });
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    fn write_tmp<F, D, E>(&self, tmp: &Path, data: F) -> Result<u64, WriteError>
    where
        F: FnMut(&TensorInfo) -> Result<D, E>,
        D: AsRef<[u8]>,
        E: fmt::Display,
    {
        let io = |source| WriteError::Io {
            path: tmp.to_path_buf(),
            source,
        };
        let file = File::create(tmp).map_err(io)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let n = self.write(&mut w, data).map_err(|e| match e {
            WriteError::Io { source, .. } => io(source),
            e => e,
        })?;
        let file = w.into_inner().map_err(|e| io(e.into_error()))?;
        // Data first on disk, then the rename: a crash leaves the old file or the whole new one.
        file.sync_all().map_err(io)?;
        Ok(n)
    }
    // ANCHOR_END: write_file
}

/// Arrays must hold values of their element type, and an array of arrays is written without
/// knowing its elements' element type, so each inner array is checked the same way.
fn check_value(key: &str, value: &Value) -> Result<(), WriteError> {
    if let Value::Array(ty, items) = value {
        if let Some(bad) = items.iter().find(|v| v.value_type() != *ty) {
            return Err(key_error(
                key,
                format!("array of {ty} holds a {}", bad.value_type()),
            ));
        }
        for item in items {
            check_value(key, item)?;
        }
    }
    Ok(())
}

// ANCHOR: put_value
fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => h.push(u8::from(*x)),
        Value::String(s) => put_str(h, s),
        Value::Array(ty, items) => {
            h.extend_from_slice(&(*ty as u32).to_le_bytes());
            h.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(h, item);
            }
        }
    }
}
// ANCHOR_END: put_value

#[cfg(test)]
mod tests {
    use super::*;
    use ch01::Gguf;
    use ch01::gguf::ValueType;

    fn every_value_type() -> Vec<(String, Value)> {
        let s = |x: &str| Value::String(x.to_string());
        vec![
            ("general.architecture".into(), s("llama")),
            ("t.u8".into(), Value::U8(200)),
            ("t.i8".into(), Value::I8(-100)),
            ("t.u16".into(), Value::U16(60000)),
            ("t.i16".into(), Value::I16(-30000)),
            ("t.u32".into(), Value::U32(4_000_000_000)),
            ("t.i32".into(), Value::I32(-2_000_000_000)),
            ("t.u64".into(), Value::U64(u64::MAX - 1)),
            ("t.i64".into(), Value::I64(i64::MIN + 1)),
            ("t.f32".into(), Value::F32(-1.5e-7)),
            ("t.f64".into(), Value::F64(std::f64::consts::PI)),
            ("t.bool".into(), Value::Bool(true)),
            ("t.string".into(), s("héllo, ☃")),
            ("t.empty_string".into(), s("")),
            (
                "t.arr_i32".into(),
                Value::Array(ValueType::I32, vec![Value::I32(-1), Value::I32(7)]),
            ),
            (
                "t.arr_str".into(),
                Value::Array(ValueType::String, vec![s("a"), s(""), s("ccc")]),
            ),
            ("t.arr_empty".into(), Value::Array(ValueType::F32, vec![])),
            (
                "t.arr_arr".into(),
                Value::Array(
                    ValueType::Array,
                    vec![
                        Value::Array(ValueType::U8, vec![Value::U8(1), Value::U8(2)]),
                        Value::Array(ValueType::Bool, vec![Value::Bool(false)]),
                    ],
                ),
            ),
        ]
    }

    fn writer() -> GgufWriter {
        let mut w = GgufWriter::new();
        for (k, v) in every_value_type() {
            w.set(&k, v).unwrap();
        }
        w.add_tensor("a", &[5], GgmlType::F32).unwrap();
        w.add_tensor("b", &[64, 3], GgmlType::Q8_0).unwrap();
        w.add_tensor("c", &[256, 2, 1], GgmlType::Q4_K).unwrap();
        w
    }

    fn data(t: &TensorInfo) -> Result<Vec<u8>, String> {
        Ok((0..t.n_bytes())
            .map(|i| (i as u8) ^ t.name.as_bytes()[0])
            .collect())
    }

    #[test]
    fn written_files_parse_back_to_the_same_metadata_and_tensors() {
        let w = writer();
        let mut bytes = vec![];
        let n = w.write(&mut bytes, data).unwrap();
        assert_eq!(n, bytes.len() as u64);
        assert_eq!(n, w.file_size());
        let g = Gguf::parse(&bytes).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.metadata, every_value_type());
        assert_eq!(g.tensors, w.tensors());
        assert_eq!(g.data_offset % 32, 0);
        for t in &g.tensors {
            assert_eq!(t.offset % 32, 0, "{}", t.name);
            let at = (g.data_offset + t.offset) as usize;
            assert_eq!(&bytes[at..at + t.n_bytes() as usize], &data(t).unwrap()[..]);
        }
        // The last tensor is padded too, as llama.cpp pads it.
        assert_eq!(bytes.len() % 32, 0);
    }

    #[test]
    fn alignment_is_honoured() {
        let mut w = GgufWriter::new();
        w.set("general.alignment", Value::U32(64)).unwrap();
        w.add_tensor("x", &[3], GgmlType::F32).unwrap();
        w.add_tensor("y", &[1], GgmlType::F32).unwrap();
        let mut bytes = vec![];
        w.write(&mut bytes, data).unwrap();
        let g = Gguf::parse(&bytes).unwrap();
        assert_eq!(g.alignment, 64);
        assert_eq!(g.data_offset % 64, 0);
        assert_eq!(g.tensors[1].offset, 64);
        assert_eq!(bytes.len() as u64, g.data_offset + 128);
    }

    #[test]
    fn set_replaces_and_moves_a_key_last() {
        let mut w = GgufWriter::new();
        w.set("a", Value::U32(1)).unwrap();
        w.set("b", Value::U32(2)).unwrap();
        w.set("a", Value::U32(3)).unwrap();
        let keys: Vec<_> = w
            .metadata()
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        assert_eq!(keys, [("b", Value::U32(2)), ("a", Value::U32(3))]);
    }

    #[test]
    fn what_a_reader_would_refuse_is_refused_with_its_name() {
        let mut w = GgufWriter::new();
        let e = w.set("general.alignment", Value::U32(48)).unwrap_err();
        assert!(
            e.to_string().contains("general.alignment") && e.to_string().contains("48"),
            "{e}"
        );
        let e = w.set("general.alignment", Value::U64(64)).unwrap_err();
        assert!(e.to_string().contains("u32"), "{e}");
        let e = w
            .set("bad.array", Value::Array(ValueType::U8, vec![Value::I8(1)]))
            .unwrap_err();
        assert!(e.to_string().contains("bad.array"), "{e}");
        let e = w.add_tensor("q", &[576, 4], GgmlType::Q4_K).unwrap_err();
        assert!(
            e.to_string().contains("\"q\"") && e.to_string().contains("576"),
            "{e}"
        );
        w.add_tensor("t", &[4], GgmlType::F32).unwrap();
        let e = w.add_tensor("t", &[4], GgmlType::F32).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        let e = w
            .add_tensor(&"n".repeat(64), &[4], GgmlType::F32)
            .unwrap_err();
        assert!(e.to_string().contains("64 bytes"), "{e}");
        let e = w
            .add_tensor("big", &[1 << 40, 1 << 40], GgmlType::F32)
            .unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
        let e = w
            .add_tensor("d5", &[1, 1, 1, 1, 1], GgmlType::F32)
            .unwrap_err();
        assert!(e.to_string().contains("5 dimensions"), "{e}");
        let e = w.set("general.alignment", Value::U32(64)).unwrap_err();
        assert!(e.to_string().contains("before adding tensors"), "{e}");
    }

    #[test]
    fn a_failed_write_leaves_no_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let out = dir.join("out.gguf");
        let w = writer();

        // The data source fails in the middle: neither OUT nor OUT.tmp remains.
        let e = w
            .write_file(&out, |t| {
                if t.name == "b" {
                    Err("no data for b")
                } else {
                    data(t).map_err(|_| "")
                }
            })
            .unwrap_err();
        assert!(
            e.to_string().contains("\"b\"") && e.to_string().contains("no data for b"),
            "{e}"
        );
        assert!(!out.exists());
        assert!(!dir.join("out.gguf.tmp").exists());

        // A tensor of the wrong size is caught before it is written.
        let e = w
            .write_file(&out, |_| Ok::<_, String>(vec![0u8; 3]))
            .unwrap_err();
        assert!(e.to_string().contains("3 bytes given"), "{e}");
        assert!(!out.exists());

        // A complete write replaces an existing file only at the end.
        std::fs::write(&out, b"old").unwrap();
        let n = w.write_file(&out, data).unwrap();
        assert_eq!(std::fs::metadata(&out).unwrap().len(), n);
        assert!(!dir.join("out.gguf.tmp").exists());
        let g = Gguf::parse(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(g.tensors.len(), 3);

        // A directory that does not exist: an I/O error naming the path.
        let e = w
            .write_file(dir.join("missing").join("x.gguf"), data)
            .unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
