//! Parsing GGUF, llama.cpp's model file format (versions 2 and 3).
//!
//! A GGUF file is, in order (all integers little-endian):
//!
//! ```text
//! magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
//! n_kv × (key: string, type: u32, value)
//! n_tensors × (name: string, n_dims: u32, dims: n_dims × u64, ggml type: u32, offset: u64)
//! padding to general.alignment (default 32)
//! data section: each tensor's bytes at data_offset + offset
//! ```
//!
//! [`Gguf::parse`] reads everything but the data section into [`Gguf`], validating as it goes;
//! [`GgufFile`] keeps the bytes next to it and hands out each tensor's slice.

mod error;
mod file;
mod reader;
mod value;

pub use error::{Context, GgufError, ParseError, ParseErrorKind};
pub use file::GgufFile;
pub use value::{Value, ValueType};

use crate::ggml_type::GgmlType;
use reader::Reader;
use std::collections::{HashMap, HashSet};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Data alignment when `general.alignment` is absent.
pub const GGUF_DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const GGML_MAX_DIMS: u32 = 4;
/// How deep arrays of arrays may nest. GGUF allows nesting, llama.cpp reads none, real files
/// use one level; the limit keeps a hostile file from exhausting the stack through recursion.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Smallest metadata entry: key length (8) + a 1-byte key + value type (4) + a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest tensor info: name length (8) + empty name + n_dims (4) + no dims + type (4) +
/// offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

// ANCHOR: structs
/// Everything in a GGUF file except the tensor data.
#[derive(Debug, Clone, PartialEq)]
pub struct Gguf {
    pub version: u32,
    /// Key-value pairs in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensor descriptions in file order.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of the data section and of every tensor in it (`general.alignment`).
    pub alignment: u64,
    /// Where the data section starts, from the start of the file.
    pub data_offset: u64,
    /// Tensor name → index in `tensors`, built once so that a lookup by name is not a scan of
    /// hundreds of names (the loader looks up several per layer).
    tensor_index: HashMap<String, usize>,
}

/// Name, shape, type and position of one tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml's `ne` order: `dims[0]` is the innermost, contiguous dimension. A matrix with
    /// `rows` rows of `cols` elements has `dims == [cols, rows]`.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Start of the tensor's bytes, relative to [`Gguf::data_offset`].
    pub offset: u64,
}
// ANCHOR_END: structs

impl TensorInfo {
    /// Number of elements: the product of the dimensions (1 for no dimensions). Saturates at
    /// `u64::MAX` for a hand-built shape that overflows; parsed tensors never do.
    pub fn n_elements(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Size of the tensor's data in bytes. Saturates at `u64::MAX` for a hand-built shape
    /// that overflows or splits a block; parsed tensors never do.
    pub fn n_bytes(&self) -> u64 {
        self.ggml_type
            .row_bytes(self.n_elements())
            .unwrap_or(u64::MAX)
    }

    /// Dimensions as llama.cpp and PyTorch print them, outermost first: `[rows, cols]`.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

impl ParseError {
    fn in_key(mut self, key: &str) -> ParseError {
        self.context.get_or_insert_with(|| Context::Key(key.into()));
        self
    }

    fn in_tensor(mut self, name: &str) -> ParseError {
        self.context
            .get_or_insert_with(|| Context::Tensor(name.into()));
        self
    }
}

fn error_at(offset: u64, kind: ParseErrorKind) -> ParseError {
    Reader::error_at(offset, kind)
}

// ANCHOR: read_value
/// One value of type `ty`; `depth` counts the arrays around it.
fn read_value(r: &mut Reader, ty: ValueType, depth: usize) -> Result<Value, ParseError> {
    Ok(match ty {
        ValueType::U8 => Value::U8(r.u8("a u8 value")?),
        ValueType::I8 => Value::I8(r.i8("an i8 value")?),
        ValueType::U16 => Value::U16(r.u16("a u16 value")?),
        ValueType::I16 => Value::I16(r.i16("an i16 value")?),
        ValueType::U32 => Value::U32(r.u32("a u32 value")?),
        ValueType::I32 => Value::I32(r.i32("an i32 value")?),
        ValueType::U64 => Value::U64(r.u64("a u64 value")?),
        ValueType::I64 => Value::I64(r.i64("an i64 value")?),
        ValueType::F32 => Value::F32(r.f32("an f32 value")?),
        ValueType::F64 => Value::F64(r.f64("an f64 value")?),
        // llama.cpp reads a bool as one byte and takes any non-zero byte as true.
        ValueType::Bool => Value::Bool(r.u8("a bool value")? != 0),
        ValueType::String => Value::String(r.string("a string value")?),
        ValueType::Array => {
            let at = r.pos();
            if depth >= MAX_ARRAY_DEPTH {
                return Err(error_at(
                    at,
                    ParseErrorKind::NestingTooDeep(MAX_ARRAY_DEPTH),
                ));
            }
            let elem = read_value_type(r, "an array element type")?;
            // Each element takes at least elem.min_size() bytes, so this bounds the Vec below.
            let n = r.count("array elements", elem.min_size())?;
            let mut items = Vec::with_capacity(n as usize);
            for _ in 0..n {
                items.push(read_value(r, elem, depth + 1)?);
            }
            Value::Array(elem, items)
        }
    })
}

fn read_value_type(r: &mut Reader, what: &'static str) -> Result<ValueType, ParseError> {
    let at = r.pos();
    let id = r.u32(what)?;
    ValueType::from_id(id).ok_or_else(|| error_at(at, ParseErrorKind::UnknownValueType(id)))
}
// ANCHOR_END: read_value

impl Gguf {
    /// Parse a whole GGUF file image: header, metadata and tensor infos, checking that every
    /// tensor's bytes lie inside `bytes`, aligned and without overlapping another tensor.
    pub fn parse(bytes: &[u8]) -> Result<Gguf, GgufError> {
        Ok(parse(bytes)?)
    }

    /// A `Gguf` from its parts (for files made in memory: tests, writers). Tensor names must be
    /// unique; the first of a repeated name is the one [`Gguf::tensor`] finds.
    pub fn new(
        version: u32,
        metadata: Vec<(String, Value)>,
        tensors: Vec<TensorInfo>,
        alignment: u64,
        data_offset: u64,
    ) -> Gguf {
        let mut tensor_index = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            tensor_index.entry(t.name.clone()).or_insert(i);
        }
        Gguf {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            tensor_index,
        }
    }

    /// The value of metadata `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong_type(key: &str, expected: &'static str, found: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: found.describe(),
        }
    }

    fn integer<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T, GgufError> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|i| T::try_from(i).ok())
            .ok_or_else(|| Self::wrong_type(key, expected, v))
    }

    /// Metadata `key` as a u32: any integer type whose value fits.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.integer(key, "an integer that fits in u32")
    }

    /// Metadata `key` as a u64: any integer type whose value fits.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.integer(key, "an integer that fits in u64")
    }

    /// Metadata `key` as an f32: an f32, or an f64 rounded to f32.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match *self.require(key)? {
            Value::F32(x) => Ok(x),
            Value::F64(x) => Ok(x as f32),
            ref v => Err(Self::wrong_type(key, "f32", v)),
        }
    }

    /// Metadata `key` as a bool.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| Self::wrong_type(key, "bool", v))
    }

    /// Metadata `key` as a string.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong_type(key, "string", v))
    }

    /// Metadata `key` as an array, of any element type.
    pub fn get_array(&self, key: &str) -> Result<&[Value], GgufError> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| Self::wrong_type(key, "array", v))
    }

    /// Metadata `key` as an array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let v = self.require(key)?;
        match v {
            Value::Array(ValueType::String, items) => Ok(items
                .iter()
                .map(|s| s.as_str().expect("element type is string"))
                .collect()),
            _ => Err(Self::wrong_type(key, "array of string", v)),
        }
    }

    /// Metadata `key` as an array of f32 (f64 elements are rounded to f32).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        let v = self.require(key)?;
        match v {
            Value::Array(ValueType::F32 | ValueType::F64, items) => Ok(items
                .iter()
                .map(|x| x.as_f64().expect("element type is float") as f32)
                .collect()),
            _ => Err(Self::wrong_type(key, "array of f32", v)),
        }
    }

    /// Metadata `key` as an array of i32: an array of any integer type whose elements all fit.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        let v = self.require(key)?;
        let items = v
            .as_array()
            .ok_or_else(|| Self::wrong_type(key, "array of i32", v))?;
        items
            .iter()
            .map(|x| x.as_i128().and_then(|i| i32::try_from(i).ok()))
            .collect::<Option<Vec<i32>>>()
            .ok_or_else(|| Self::wrong_type(key, "array of integers that fit in i32", v))
    }

    /// `general.architecture`: `"llama"`, `"qwen2"`, …
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        match self
            .tensor_index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
        {
            Some(t) if t.name == name => Some(t),
            // `tensors` is public and may have been changed after parsing: scan.
            _ => self.tensors.iter().find(|t| t.name == name),
        }
    }
}

// ANCHOR: parse
fn parse(bytes: &[u8]) -> Result<Gguf, ParseError> {
    let mut r = Reader::new(bytes);

    let magic = r.take(4, "the magic")?;
    if magic != GGUF_MAGIC {
        let found = magic.try_into().expect("4 bytes");
        return Err(error_at(0, ParseErrorKind::BadMagic(found)));
    }
    let version = r.u32("the version")?;
    if version != 2 && version != 3 {
        return Err(error_at(4, ParseErrorKind::UnsupportedVersion(version)));
    }
    let n_tensors = r.u64("the tensor count")?;
    let n_kv = r.u64("the metadata count")?;
    // Check both counts against what is left before allocating anything for them.
    r.check_count(8, "tensor infos", n_tensors, MIN_TENSOR_INFO_BYTES)?;
    r.check_count(16, "metadata entries", n_kv, MIN_KV_BYTES)?;

    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut key_offsets = Vec::with_capacity(n_kv as usize);
    let mut seen_keys = HashSet::with_capacity(n_kv as usize);
    for _ in 0..n_kv {
        let at = r.pos();
        let key = r.string("a metadata key")?;
        if key.is_empty() {
            return Err(error_at(at, ParseErrorKind::EmptyKey));
        }
        if !seen_keys.insert(key.clone()) {
            return Err(error_at(at, ParseErrorKind::DuplicateKey(key.clone())).in_key(&key));
        }
        let value = read_value_type(&mut r, "a metadata value type")
            .and_then(|ty| read_value(&mut r, ty, 0))
            .map_err(|e| e.in_key(&key))?;
        metadata.push((key, value));
        key_offsets.push(at);
    }
    drop(seen_keys);
    // ANCHOR_END: parse

    // ANCHOR: parse_tensors
    let alignment = alignment(&metadata, &key_offsets)?;

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut offset_fields = Vec::with_capacity(n_tensors as usize);
    let mut seen_names = HashSet::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let at = r.pos();
        let name = r.string("a tensor name")?;
        if !seen_names.insert(name.clone()) {
            let e = error_at(at, ParseErrorKind::DuplicateTensor(name.clone()));
            return Err(e.in_tensor(&name));
        }
        let (info, offset_field) =
            tensor_info(&mut r, name.clone()).map_err(|e| e.in_tensor(&name))?;
        tensors.push(info);
        offset_fields.push(offset_field);
    }
    drop(seen_names);

    // The data section starts at the next multiple of the alignment. Like llama.cpp, a file
    // without tensors (a vocabulary-only file) has no padding: its data section is empty and
    // starts where the header ends.
    let end_of_infos = r.pos();
    let file_len = bytes.len() as u64;
    let data_offset = if tensors.is_empty() {
        end_of_infos
    } else {
        // alignment <= 2^31 and end_of_infos <= file_len, so this cannot overflow.
        let data_offset = end_of_infos.next_multiple_of(alignment);
        if data_offset > file_len {
            let kind = ParseErrorKind::DataSectionPastEnd {
                data_offset,
                file_len,
            };
            return Err(error_at(end_of_infos, kind));
        }
        data_offset
    };
    check_extents(
        &tensors,
        &offset_fields,
        alignment,
        file_len.saturating_sub(data_offset),
    )?;

    Ok(Gguf::new(
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    ))
}
// ANCHOR_END: parse_tensors

/// `general.alignment`: a u32 power of two, 32 when absent.
fn alignment(metadata: &[(String, Value)], key_offsets: &[u64]) -> Result<u64, ParseError> {
    let Some(i) = metadata.iter().position(|(k, _)| k == "general.alignment") else {
        return Ok(GGUF_DEFAULT_ALIGNMENT);
    };
    let (key, value) = &metadata[i];
    let at = key_offsets[i];
    match *value {
        Value::U32(a) if a.is_power_of_two() => Ok(a.into()),
        Value::U32(a) => Err(error_at(at, ParseErrorKind::BadAlignment(a.into())).in_key(key)),
        ref v => Err(error_at(at, ParseErrorKind::AlignmentType(v.describe())).in_key(key)),
    }
}

// ANCHOR: tensor_info
/// The rest of a tensor info after its name; also returns where its offset field is, for
/// errors found later.
fn tensor_info(r: &mut Reader, name: String) -> Result<(TensorInfo, u64), ParseError> {
    let dims_at = r.pos();
    let n_dims = r.u32("the dimension count")?;
    if n_dims > GGML_MAX_DIMS {
        return Err(error_at(dims_at, ParseErrorKind::TooManyDims(n_dims)));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        let at = r.pos();
        let d = r.u64("a dimension")?;
        // ggml keeps dimensions in an int64_t.
        if d > i64::MAX as u64 {
            return Err(error_at(at, ParseErrorKind::DimTooLarge(d)));
        }
        dims.push(d);
    }
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64);
    let Some(n_elements) = n_elements else {
        return Err(error_at(dims_at, ParseErrorKind::ShapeOverflow(dims)));
    };

    let type_at = r.pos();
    let type_id = r.u32("the tensor type")?;
    let ggml_type = GgmlType::from_id(type_id)
        .ok_or_else(|| error_at(type_at, ParseErrorKind::UnknownGgmlType(type_id)))?;
    // Blocks never straddle rows, so each row must hold whole blocks.
    let ne0 = dims.first().copied().unwrap_or(1);
    if !ne0.is_multiple_of(ggml_type.block_size()) {
        return Err(error_at(
            type_at,
            ParseErrorKind::PartialBlock { ne0, ggml_type },
        ));
    }
    if ggml_type
        .row_bytes(n_elements)
        .is_none_or(|b| b > i64::MAX as u64)
    {
        return Err(error_at(dims_at, ParseErrorKind::ShapeOverflow(dims)));
    }

    let offset_at = r.pos();
    let offset = r.u64("the tensor data offset")?;
    let info = TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
    };
    Ok((info, offset_at))
}
// ANCHOR_END: tensor_info

// ANCHOR: check_extents
/// Every tensor must start on an alignment boundary, end inside the data section, and share no
/// byte with another tensor.
fn check_extents(
    tensors: &[TensorInfo],
    offset_fields: &[u64],
    alignment: u64,
    data_len: u64,
) -> Result<(), ParseError> {
    // ANCHOR: yours_extents
    for (t, &at) in tensors.iter().zip(offset_fields) {
        let fail = |kind| Err(error_at(at, kind).in_tensor(&t.name));
        if !t.offset.is_multiple_of(alignment) {
            let kind = ParseErrorKind::Misaligned {
                offset: t.offset,
                alignment,
            };
            return fail(kind);
        }
        if t.offset
            .checked_add(t.n_bytes())
            .is_none_or(|end| end > data_len)
        {
            let kind = ParseErrorKind::OutOfBounds {
                offset: t.offset,
                n_bytes: t.n_bytes(),
                data_len,
            };
            return fail(kind);
        }
    }
    // ANCHOR_END: yours_extents
    // Sorted by start, a tensor overlaps another exactly when it starts before the end of the
    // one just before it. Empty tensors occupy no bytes and overlap nothing.
    // ANCHOR: yours_overlap
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].n_bytes() > 0)
        .collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for pair in order.windows(2) {
        let (prev, t) = (&tensors[pair[0]], &tensors[pair[1]]);
        if t.offset < prev.offset + prev.n_bytes() {
            let kind = ParseErrorKind::Overlap {
                other: prev.name.clone(),
                other_offset: prev.offset,
                other_bytes: prev.n_bytes(),
                offset: t.offset,
            };
            return Err(error_at(offset_fields[pair[1]], kind).in_tensor(&t.name));
        }
    }
    Ok(())
    // ANCHOR_END: yours_overlap
}
// ANCHOR_END: check_extents
