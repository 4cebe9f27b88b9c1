//! Opening a GGUF file so that the weights are never copied: a memory map, and the views into
//! it that the matrices keep.
//!
//! # What a memory map is
//!
//! `mmap` asks the kernel to make the file appear in the address space: no byte is read yet.
//! The first access to each 4 KiB page faults; the kernel finds the page in its page cache (or
//! reads it from disk, with some readahead) and maps that very page into the process. The
//! weights then live in the page cache only, shared by every process that maps the file,
//! dropped under memory pressure and read again when touched, and still warm for the next run.
//! Reading the file instead copies every byte out of the page cache into the process's own
//! memory: twice the memory while the cache holds the file, and a full read before the first
//! token.
//!
//! # The safety contract
//!
//! A `&[u8]` into a map promises Rust that the bytes do not change while it is alive. The kernel
//! promises no such thing: another process may write to the file (we would see the new bytes,
//! a data race the compiler assumed away) or truncate it (touching a page past the new end
//! raises `SIGBUS` and kills the process). That is why [`Mmap::map`] is `unsafe`: the caller
//! promises that the file stays as it is while mapped. We keep our side of it — the file is
//! opened read-only and never written — and ask the same of the user: do not rewrite a model
//! file while an engine runs on it (write a new file and rename it over the old one; the running
//! engine keeps the old inode). llama.cpp makes the same bargain. On Linux, a file protected by
//! fs-verity or a sealed memfd cannot change at all, and memmap2's `map_if_safe` checks that;
//! ordinary model files are neither.
//!
//! Bad files are a different matter, and they never reach the pages: [`Gguf::parse`] checks
//! every tensor's extent against the length of the map before anything is loaded, so a
//! truncated download is an error naming the file and the byte offset, not a `SIGBUS`.
//!
//! [`Gguf::parse`]: ch08::Gguf::parse

use ch08::ch01::{GgufError, GgufFile};
use memmap2::{Advice, Mmap, MmapOptions};
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

// ANCHOR: shared_bytes
/// Bytes `start..start + len` of a buffer shared by reference count: a view that keeps the
/// buffer alive, so a matrix can hold its weights without copying them. The buffer is a memory
/// map ([`MappedBytes`]) or the whole file read into memory ([`ReadBytes`]).
pub struct SharedBytes<O> {
    owner: Arc<O>,
    start: usize,
    len: usize,
}

/// A range of a memory-mapped file.
pub type MappedBytes = SharedBytes<Mmap>;
/// A range of a file read into memory.
pub type ReadBytes = SharedBytes<AlignedBuf>;

impl<O: AsRef<[u8]>> SharedBytes<O> {
    /// All of `owner`.
    pub fn whole(owner: Arc<O>) -> SharedBytes<O> {
        let len = (*owner).as_ref().len();
        SharedBytes {
            owner,
            start: 0,
            len,
        }
    }

    /// Bytes `start..start + len` of the same buffer, relative to this view; `None` if they do
    /// not lie inside it.
    pub fn slice(&self, start: u64, len: u64) -> Option<SharedBytes<O>> {
        let end = start.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        Some(SharedBytes {
            owner: Arc::clone(&self.owner),
            start: self.start + start as usize,
            len: len as usize,
        })
    }

    /// Where this view starts in the buffer.
    pub fn offset(&self) -> usize {
        self.start
    }

    /// The buffer this view keeps alive.
    pub fn owner(&self) -> &Arc<O> {
        &self.owner
    }
}

impl<O: AsRef<[u8]>> AsRef<[u8]> for SharedBytes<O> {
    fn as_ref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
}

impl<O> Clone for SharedBytes<O> {
    fn clone(&self) -> Self {
        SharedBytes {
            owner: Arc::clone(&self.owner),
            start: self.start,
            len: self.len,
        }
    }
}
// ANCHOR_END: shared_bytes

/// Bytes in memory aligned to 8, whatever the allocator does for `Vec<u8>` (whose alignment is
/// 1): the file image of the read path, and the copy of a tensor whose mapped bytes are not
/// aligned for its blocks. Eight covers every block of ggml (they need 2 or 4).
pub struct AlignedBuf {
    words: Vec<u64>, // (len.div_ceil(8)): the bytes, and up to 7 of padding
    len: usize,
}

impl AlignedBuf {
    /// A copy of `bytes`.
    pub fn copy_of(bytes: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(bytes.len());
        buf.as_mut().copy_from_slice(bytes);
        buf
    }

    fn zeroed(len: usize) -> AlignedBuf {
        AlignedBuf {
            words: vec![0u64; len.div_ceil(8)],
            len,
        }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }

    /// Read the whole file at `path`.
    pub fn read_file(path: &Path) -> Result<AlignedBuf, OpenError> {
        let io = |what, source| OpenError::Io {
            path: path.to_path_buf(),
            what,
            source,
        };
        let mut file = File::open(path).map_err(|e| io("cannot open", e))?;
        // The allocation is sized by the file system's length of a file we opened, not by any
        // field inside the file.
        let len = file.metadata().map_err(|e| io("cannot stat", e))?.len();
        let len = usize::try_from(len).map_err(|_| {
            let e = std::io::Error::other(format!("{len} bytes do not fit in memory"));
            io("cannot read", e)
        })?;
        let mut buf = AlignedBuf::zeroed(len);
        file.read_exact(buf.as_mut())
            .map_err(|e| io("cannot read", e))?;
        Ok(buf)
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

/// A kernel hint on how the mapped pages will be used (`madvise`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PageAdvice {
    /// No hint: pages are read as they are first touched, with the kernel's default readahead.
    #[default]
    Normal,
    /// `MADV_WILLNEED`: start reading the whole file in the background now.
    WillNeed,
    /// `MADV_SEQUENTIAL`: aggressive readahead, pages dropped soon after use.
    Sequential,
    /// `MADV_RANDOM`: no readahead; every fault reads one page.
    Random,
}

/// How to map a file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapOptions {
    pub advice: PageAdvice,
    /// Fault every page in while mapping (`MAP_POPULATE`, Linux): the load pays for reading
    /// the file, the first token does not.
    pub populate: bool,
    /// Lock the pages in memory (`mlock`): they are read now and never evicted or swapped.
    /// Limited by `RLIMIT_MEMLOCK` (`ulimit -l`) for unprivileged users.
    pub lock: bool,
}

/// Why a model file could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// A system call on the file failed.
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    /// The file is not a valid GGUF file. The error names the file and the byte offset.
    Gguf(GgufError),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Io { path, what, source } => {
                write!(f, "{}: {what}: {source}", path.display())
            }
            OpenError::Gguf(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for OpenError {}

// ANCHOR: map_gguf
/// Memory-map the GGUF file at `path` and parse it. Returns the parsed file and a view of the
/// whole map, from which a [`ViewLoader`](crate::ViewLoader) makes matrices. Nothing but the
/// header's pages is touched (unless `opts` asks for more): parsing checks every tensor against
/// the length of the map.
pub fn map_gguf(
    path: &Path,
    opts: &MapOptions,
) -> Result<(GgufFile<MappedBytes>, MappedBytes), OpenError> {
    let io = |what, source| OpenError::Io {
        path: path.to_path_buf(),
        what,
        source,
    };
    let file = File::open(path).map_err(|e| io("cannot open", e))?;
    let mut options = MmapOptions::new();
    if opts.populate {
        options.populate();
    }
    // SAFETY: the map is read-only and this process never writes the file. The remaining risk,
    // another process writing or truncating the file while it is mapped, is the contract
    // described in this module's documentation: model files are not modified in place.
    let map = unsafe { options.map(&file) }.map_err(|e| io("cannot map", e))?;
    let advice = match opts.advice {
        PageAdvice::Normal => None,
        PageAdvice::WillNeed => Some(Advice::WillNeed),
        PageAdvice::Sequential => Some(Advice::Sequential),
        PageAdvice::Random => Some(Advice::Random),
    };
    if let Some(advice) = advice.filter(|_| !map.is_empty()) {
        map.advise(advice).map_err(|e| io("madvise failed", e))?;
    }
    if opts.lock && !map.is_empty() {
        map.lock()
            .map_err(|e| io("cannot lock the file in memory (mlock; see ulimit -l)", e))?;
    }
    let bytes = SharedBytes::whole(Arc::new(map));
    let file = GgufFile::from_bytes(bytes.clone()).map_err(|e| in_file(path, e))?;
    Ok((file, bytes))
}
// ANCHOR_END: map_gguf

/// Read the GGUF file at `path` into aligned memory and parse it: the `--no-mmap` path, the
/// same views over a private copy.
pub fn read_gguf(path: &Path) -> Result<(GgufFile<ReadBytes>, ReadBytes), OpenError> {
    let bytes = SharedBytes::whole(Arc::new(AlignedBuf::read_file(path)?));
    let file = GgufFile::from_bytes(bytes.clone()).map_err(|e| in_file(path, e))?;
    Ok((file, bytes))
}

fn in_file(path: &Path, e: GgufError) -> OpenError {
    OpenError::Gguf(GgufError::InFile {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_stay_inside_their_view() {
        let buf = Arc::new(AlignedBuf::copy_of(&[1, 2, 3, 4, 5, 6, 7]));
        let all = SharedBytes::whole(buf);
        let mid = all.slice(2, 4).unwrap();
        assert_eq!(mid.as_ref(), &[3, 4, 5, 6]);
        assert_eq!(mid.slice(1, 2).unwrap().as_ref(), &[4, 5]);
        assert_eq!(mid.slice(1, 2).unwrap().offset(), 3);
        assert!(mid.slice(1, 4).is_none());
        assert!(mid.slice(u64::MAX, 2).is_none());
        assert!(mid.slice(4, 0).unwrap().as_ref().is_empty());
    }

    #[test]
    fn aligned_buffers_are_aligned() {
        for n in [0, 1, 7, 8, 9, 1000] {
            let bytes: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let b = AlignedBuf::copy_of(&bytes);
            assert_eq!(b.as_ref(), &bytes[..]);
            assert_eq!(b.as_ref().as_ptr() as usize % 8, 0);
        }
    }
}
