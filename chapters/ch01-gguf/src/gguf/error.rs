//! What can go wrong reading a GGUF file, said so that the reader can find the bad byte.

use crate::dequant::DequantError;
use crate::ggml_type::GgmlType;
use std::fmt;
use std::path::PathBuf;

/// Any error from the `gguf` module.
#[derive(Debug)]
pub enum GgufError {
    /// The file could not be read.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file was read but is not a valid GGUF file.
    InFile {
        path: PathBuf,
        source: Box<GgufError>,
    },
    /// The bytes are not a valid GGUF file.
    Parse(ParseError),
    /// A metadata key the caller asked for is not in the file.
    MissingKey(String),
    /// A metadata value has another type than the caller asked for, or does not fit in it.
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    /// No tensor has this name.
    MissingTensor(String),
    /// A tensor's data could not be turned into `f32`.
    Dequant {
        tensor: String,
        source: DequantError,
    },
}

/// A GGUF file that does not parse: where, inside what, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct ParseError {
    /// Byte offset (from the start of the file) of the field that is wrong.
    pub offset: u64,
    /// The metadata key or tensor the field belongs to, when there is one.
    pub context: Option<Context>,
    pub kind: ParseErrorKind,
}

/// What a bad field belongs to.
#[derive(Debug, Clone, PartialEq)]
pub enum Context {
    Key(String),
    Tensor(String),
}

/// The ways a GGUF file can be malformed.
#[derive(Debug, Clone, PartialEq)]
pub enum ParseErrorKind {
    /// The file does not start with `GGUF`.
    BadMagic([u8; 4]),
    /// A version other than 2 or 3.
    UnsupportedVersion(u32),
    /// The file ends inside a field.
    Truncated {
        what: &'static str,
        need: u64,
        left: u64,
    },
    /// A string length larger than what is left of the file.
    StringTooLong { len: u64, left: u64 },
    /// A count of items that cannot all fit in what is left of the file, even at their smallest.
    CountTooLarge {
        what: &'static str,
        count: u64,
        min_each: u64,
        left: u64,
    },
    /// A string that is not UTF-8.
    InvalidUtf8,
    /// A metadata key of length 0.
    EmptyKey,
    /// The same key twice.
    DuplicateKey(String),
    /// A metadata value type id outside 0..=12.
    UnknownValueType(u32),
    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`](super::MAX_ARRAY_DEPTH).
    NestingTooDeep(usize),
    /// `general.alignment` has a type other than u32.
    AlignmentType(String),
    /// `general.alignment` is not a power of two.
    BadAlignment(u64),
    /// The same tensor name twice.
    DuplicateTensor(String),
    /// More dimensions than ggml's `GGML_MAX_DIMS` (4).
    TooManyDims(u32),
    /// A dimension larger than ggml's `int64_t` can hold.
    DimTooLarge(u64),
    /// The product of the dimensions, or the size in bytes, overflows.
    ShapeOverflow(Vec<u64>),
    /// A ggml type id this parser does not know (or that ggml removed).
    UnknownGgmlType(u32),
    /// `dims[0]` is not a whole number of blocks of the tensor's type.
    PartialBlock { ne0: u64, ggml_type: GgmlType },
    /// The data section would start past the end of the file.
    DataSectionPastEnd { data_offset: u64, file_len: u64 },
    /// A tensor offset that is not a multiple of the alignment.
    Misaligned { offset: u64, alignment: u64 },
    /// A tensor whose bytes do not lie inside the data section.
    OutOfBounds {
        offset: u64,
        n_bytes: u64,
        data_len: u64,
    },
    /// Two tensors share bytes.
    Overlap {
        other: String,
        other_offset: u64,
        other_bytes: u64,
        offset: u64,
    },
}

impl fmt::Display for ParseErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ParseErrorKind::*;
        match self {
            BadMagic(m) => write!(
                f,
                "bad magic {:?} ({m:02x?}): not a GGUF file, which starts with \"GGUF\"",
                String::from_utf8_lossy(m)
            ),
            UnsupportedVersion(v) if v & 0xffff == 0 => write!(
                f,
                "GGUF version {v} (0x{v:08x}) looks byte-swapped: a big-endian file? only \
                 little-endian versions 2 and 3 are supported"
            ),
            UnsupportedVersion(v) => {
                write!(
                    f,
                    "GGUF version {v} is not supported (only versions 2 and 3)"
                )
            }
            Truncated { what, need, left } => write!(
                f,
                "file ends inside {what}: it needs {need} bytes, {left} are left"
            ),
            StringTooLong { len, left } => write!(
                f,
                "string length {len} exceeds the {left} bytes left in the file"
            ),
            CountTooLarge {
                what,
                count,
                min_each,
                left,
            } => write!(
                f,
                "{count} {what} cannot fit in the {left} bytes left in the file (each needs at \
                 least {min_each} bytes)"
            ),
            InvalidUtf8 => write!(f, "string is not valid UTF-8"),
            EmptyKey => write!(f, "empty metadata key"),
            DuplicateKey(k) => write!(f, "duplicate metadata key {k:?}"),
            UnknownValueType(t) => write!(f, "unknown metadata value type {t} (known: 0..=12)"),
            NestingTooDeep(d) => write!(f, "arrays nested more than {d} deep"),
            AlignmentType(t) => write!(f, "general.alignment must be a u32, found {t}"),
            BadAlignment(a) => write!(f, "alignment {a} is not a power of two"),
            DuplicateTensor(n) => write!(f, "duplicate tensor name {n:?}"),
            TooManyDims(n) => write!(f, "{n} dimensions, at most 4 are allowed"),
            DimTooLarge(d) => write!(f, "dimension {d} exceeds 2^63 - 1"),
            ShapeOverflow(dims) => write!(
                f,
                "shape {dims:?} overflows: its element count or size in bytes exceeds 2^63 - 1"
            ),
            UnknownGgmlType(t) => write!(f, "unknown ggml type id {t}"),
            PartialBlock { ne0, ggml_type } => write!(
                f,
                "rows of {ne0} elements are not a whole number of {ggml_type} blocks of {}",
                ggml_type.block_size()
            ),
            DataSectionPastEnd {
                data_offset,
                file_len,
            } => write!(
                f,
                "the data section would start at byte {data_offset}, past the end of the \
                 {file_len}-byte file"
            ),
            Misaligned { offset, alignment } => write!(
                f,
                "tensor offset {offset} is not a multiple of the alignment {alignment}"
            ),
            OutOfBounds {
                offset,
                n_bytes,
                data_len,
            } => write!(
                f,
                "tensor bytes {offset}..{} lie outside the {data_len}-byte data section",
                *offset as u128 + *n_bytes as u128
            ),
            Overlap {
                other,
                other_offset,
                other_bytes,
                offset,
            } => write!(
                f,
                "tensor at data offset {offset} overlaps tensor {other:?} (bytes {other_offset}..{})",
                other_offset + other_bytes
            ),
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at byte {}", self.offset)?;
        match &self.context {
            Some(Context::Key(k)) => write!(f, " (metadata key {k:?})")?,
            Some(Context::Tensor(t)) => write!(f, " (tensor {t:?})")?,
            None => {}
        }
        write!(f, ": {}", self.kind)
    }
}

impl std::error::Error for ParseError {}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufError::Io { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            GgufError::InFile { path, source } => write!(f, "{}: {source}", path.display()),
            GgufError::Parse(e) => e.fmt(f),
            GgufError::MissingKey(k) => write!(f, "metadata key {k:?} is missing"),
            GgufError::WrongType {
                key,
                expected,
                found,
            } => write!(
                f,
                "metadata key {key:?}: expected {expected}, found {found}"
            ),
            GgufError::MissingTensor(n) => write!(f, "no tensor named {n:?}"),
            GgufError::Dequant { tensor, source } => write!(f, "tensor {tensor:?}: {source}"),
        }
    }
}

// Display already carries the inner error's message, so `source` stays empty rather than
// have error reporters print it twice.
impl std::error::Error for GgufError {}

impl From<ParseError> for GgufError {
    fn from(e: ParseError) -> GgufError {
        GgufError::Parse(e)
    }
}

impl GgufError {
    /// The parse error inside this error, if it is one (also through [`GgufError::InFile`]).
    pub fn parse_error(&self) -> Option<&ParseError> {
        match self {
            GgufError::Parse(e) => Some(e),
            GgufError::InFile { source, .. } => source.parse_error(),
            _ => None,
        }
    }
}
