//! A cursor over the file's bytes that never reads past the end and never trusts a length.
//!
//! Every read checks what is left first. A length or count read from the file is compared
//! with the bytes left *before* anything is allocated for it: a string of length 2^63 or an
//! array of 2^40 elements in a 1 KiB file is an error, not an attempt to allocate 8 EiB.

use super::error::{ParseError, ParseErrorKind};

pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, pos: 0 }
    }

    /// Offset of the next byte to read.
    pub(super) fn pos(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes not yet read.
    pub(super) fn left(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    /// An error about the field that starts at `offset`.
    pub(super) fn error_at(offset: u64, kind: ParseErrorKind) -> ParseError {
        ParseError {
            offset,
            context: None,
            kind,
        }
    }

    // ANCHOR: take
    /// The next `n` bytes; `what` names the field for the error when the file is shorter.
    pub(super) fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], ParseError> {
        let left = self.left();
        if n > left {
            return Err(Self::error_at(
                self.pos(),
                ParseErrorKind::Truncated {
                    what,
                    need: n,
                    left,
                },
            ));
        }
        // n <= left <= usize::MAX, so the cast is lossless.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }
    // ANCHOR_END: take

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ParseError> {
        let b = self.take(N as u64, what)?;
        Ok(b.try_into().expect("take returned N bytes"))
    }

    pub(super) fn u8(&mut self, what: &'static str) -> Result<u8, ParseError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(super) fn i8(&mut self, what: &'static str) -> Result<i8, ParseError> {
        Ok(i8::from_le_bytes(self.array(what)?))
    }
    pub(super) fn u16(&mut self, what: &'static str) -> Result<u16, ParseError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub(super) fn i16(&mut self, what: &'static str) -> Result<i16, ParseError> {
        Ok(i16::from_le_bytes(self.array(what)?))
    }
    pub(super) fn u32(&mut self, what: &'static str) -> Result<u32, ParseError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(super) fn i32(&mut self, what: &'static str) -> Result<i32, ParseError> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }
    pub(super) fn u64(&mut self, what: &'static str) -> Result<u64, ParseError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    pub(super) fn i64(&mut self, what: &'static str) -> Result<i64, ParseError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }
    pub(super) fn f32(&mut self, what: &'static str) -> Result<f32, ParseError> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }
    pub(super) fn f64(&mut self, what: &'static str) -> Result<f64, ParseError> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    // ANCHOR: string
    /// A GGUF string: a u64 byte length, then that many bytes of UTF-8 (no terminating NUL).
    pub(super) fn string(&mut self, what: &'static str) -> Result<String, ParseError> {
        let at = self.pos();
        let len = self.u64(what)?;
        if len > self.left() {
            return Err(Self::error_at(
                at,
                ParseErrorKind::StringTooLong {
                    len,
                    left: self.left(),
                },
            ));
        }
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(Self::error_at(at, ParseErrorKind::InvalidUtf8)),
        }
    }
    // ANCHOR_END: string

    /// A u64 count of items that each take at least `min_each` bytes, checked against what is
    /// left so that `Vec::with_capacity(count)` is bounded by the file size.
    pub(super) fn count(&mut self, what: &'static str, min_each: u64) -> Result<u64, ParseError> {
        let at = self.pos();
        let count = self.u64(what)?;
        self.check_count(at, what, count, min_each)?;
        Ok(count)
    }

    /// Check that `count` items of at least `min_each` bytes fit in what is left.
    pub(super) fn check_count(
        &self,
        at: u64,
        what: &'static str,
        count: u64,
        min_each: u64,
    ) -> Result<(), ParseError> {
        let left = self.left();
        let fits = count.checked_mul(min_each).is_some_and(|n| n <= left);
        if fits {
            Ok(())
        } else {
            Err(Self::error_at(
                at,
                ParseErrorKind::CountTooLarge {
                    what,
                    count,
                    min_each,
                    left,
                },
            ))
        }
    }
}
