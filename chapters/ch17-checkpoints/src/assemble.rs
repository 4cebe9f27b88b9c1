//! A checkpoint as one GGUF image without copying its weights: the shards mapped side by side
//! in one range of addresses, after a little private memory for what the conversion changes.
//!
//! Chapter 4's loader reads a model from one image: a header and one slice of bytes that every
//! tensor lies in. A checkpoint's tensors lie in several files. So reserve one range of
//! addresses (`mmap` with no access), and map into it, at fixed places: first private memory
//! for the tensors the conversion must write (llama's reordered query and key rows, vectors
//! made F32, Gemma's shifted norms, Llama 3's RoPE factors, anything stored in another type),
//! then each shard file whole. The header (a [`Gguf`] made in memory) points every other tensor
//! at its bytes inside its shard's map: those matrices are the page cache's pages, as chapter
//! 10's are for a GGUF file.
//!
//! ```text
//! base                     private                 + shard 0              + shard 1 …
//! | reordered Q, K, norms | model-00001-of-00002.safetensors | model-00002-of-00002… |
//!   written here            mapped read-only from the file     mapped read-only
//! ```
//!
//! The maps are private and read-only, so nothing the engine does writes a shard. A shard
//! truncated while mapped raises `SIGBUS` on the next read of a page past its end, as with a
//! GGUF file (chapter 10); the bus-error handler does not know these maps, so the process ends
//! with the bare signal.

use crate::convert::{Planned, Source};
use crate::files::{Checkpoint, bad};
use ch01::{Gguf, TensorInfo};
use ch10::mapped::{PageAdvice, ReleasePages};
use std::error::Error;
use std::os::fd::AsRawFd;

/// GGUF's usual alignment, kept for the tensors written into the private memory.
const ALIGN: usize = 32;

// ANCHOR: assembled
/// The image: `len` bytes at `base`, the first `private` of them private memory.
pub struct Assembled {
    base: *mut u8,
    len: usize,
    private: usize,
}

// SAFETY: the range is owned by this value alone and read-only once assembled; the pointer is
// only ever read through `as_ref`.
unsafe impl Send for Assembled {}
unsafe impl Sync for Assembled {}

impl AsRef<[u8]> for Assembled {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `base..base + len` is mapped readable for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.base, self.len) }
    }
}

impl Drop for Assembled {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by `assemble` and nothing refers to it once `self` goes
        // (the matrices keep `self` alive through their views).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
// ANCHOR_END: assembled

impl Assembled {
    /// Bytes of private memory: what the conversion wrote rather than mapped.
    pub fn private_bytes(&self) -> usize {
        self.private
    }

    /// Chapter 10's page-cache hint for the shards' maps (`--advice`; `WillNeed` when the
    /// matrices are repacked, which reads every page anyway).
    pub fn advise(&self, advice: PageAdvice) {
        let how = match advice {
            PageAdvice::Normal => return,
            PageAdvice::WillNeed => libc::MADV_WILLNEED,
            PageAdvice::Sequential => libc::MADV_SEQUENTIAL,
            PageAdvice::Random => libc::MADV_RANDOM,
        };
        if self.len > self.private {
            // SAFETY: advice on pages of a range this value owns; it changes no byte.
            unsafe {
                libc::madvise(
                    self.base.add(self.private).cast(),
                    self.len - self.private,
                    how,
                )
            };
        }
    }
}

impl ReleasePages for Assembled {
    /// Pages of the shards' maps leave the resident set (they are read from the page cache
    /// again if touched); the private memory stays, since dropping it would lose its bytes.
    fn release(&self, range: std::ops::Range<usize>) {
        let page = page_size();
        let start = range.start.max(self.private).next_multiple_of(page);
        let end = range.end.min(self.len) / page * page;
        if start < end {
            // SAFETY: DONTNEED on a private read-only file map only drops this process's
            // copies of pages it never wrote; a later read faults them in from the file.
            unsafe {
                libc::madvise(
                    self.base.add(start).cast(),
                    end - start,
                    libc::MADV_DONTNEED,
                )
            };
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// Whether tensor `t` is the checkpoint's bytes as they are: no reordering, no shift, its own
/// type (the first `rows` rows of it, for an embedding cut to the vocabulary).
fn as_stored(source: &Source, t: &TensorInfo) -> bool {
    match source {
        Source::Tensor {
            dtype,
            permute: None,
            shift,
            ..
        } => *shift == 0.0 && crate::convert::kept_type(*dtype) == Some(t.ggml_type),
        _ => false,
    }
}

// ANCHOR: layout
/// Where an image puts things, in bytes from its start.
#[derive(Debug, PartialEq, Eq)]
pub struct Layout {
    /// Per tensor: its offset in the private memory if it is written, `None` if it stays in
    /// its shard.
    pub written: Vec<Option<usize>>,
    /// The private memory's length: whole pages.
    pub private: usize,
    /// Where each shard's map starts: a page boundary.
    pub shard_at: Vec<usize>,
    /// The image's length: whole pages.
    pub len: usize,
}

/// The layout of an image of tensors that are written (`Some(n_bytes)`) or stay in their
/// shard (`None`), over shard files of `shard_lens` bytes, in pages of `page` bytes: the
/// written tensors one after another, each at a multiple of `ALIGN`; the private memory
/// rounded up to whole pages; then each shard at a page boundary, as `mmap` places a file.
pub fn layout(written: &[Option<usize>], shard_lens: &[usize], page: usize) -> Layout {
    // ANCHOR: yours_layout
    let mut private = 0;
    let mut offsets = Vec::with_capacity(written.len());
    for n in written {
        offsets.push(n.map(|_| private));
        if let Some(n) = n {
            private = (private + n).next_multiple_of(ALIGN);
        }
    }
    let private = private.next_multiple_of(page);
    let mut shard_at = Vec::with_capacity(shard_lens.len());
    let mut len = private;
    for n in shard_lens {
        shard_at.push(len);
        len += n.next_multiple_of(page);
    }
    Layout {
        written: offsets,
        private,
        shard_at,
        len,
    }
    // ANCHOR_END: yours_layout
}
// ANCHOR_END: layout

// ANCHOR: assemble
/// `planned`'s image over `ckpt`'s shards, mapped; the header points into it.
pub fn assemble(ckpt: &Checkpoint, planned: &Planned) -> Result<(Gguf, Assembled), Box<dyn Error>> {
    let page = page_size();
    let tensors = planned.writer.tensors();
    let sizes: Vec<Option<usize>> = tensors
        .iter()
        .map(|t| (!as_stored(&planned.sources[&t.name], t)).then_some(t.n_bytes() as usize))
        .collect();
    let lens: Vec<usize> = ckpt.shards.iter().map(|s| s.file_len()).collect();
    let Layout {
        written,
        private,
        shard_at,
        len,
    } = layout(&sizes, &lens, page);
    let image = reserve(len.max(page), private)?;
    for (s, &at) in ckpt.shards.iter().zip(&shard_at) {
        map_file_at(&image, at, s)?;
    }
    for (t, at) in tensors.iter().zip(&written) {
        let Some(at) = *at else { continue };
        let bytes = ckpt.tensor_data(planned, t)?;
        // SAFETY: `at..at + n_bytes` lies in the private memory, mapped writable and not yet
        // shared with anyone.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), image.base.add(at), bytes.len()) };
    }
    if private > 0 {
        // SAFETY: the private memory is ours; from here on it is only read.
        unsafe { libc::mprotect(image.base.cast(), private, libc::PROT_READ) };
    }
    // Every tensor at its place: written ones in the private memory, the rest in their shard.
    let infos = tensors
        .iter()
        .zip(&written)
        .map(|(t, at)| {
            let offset = match *at {
                Some(at) => at,
                None => {
                    let Source::Tensor { hf, .. } = &planned.sources[&t.name] else {
                        unreachable!("computed tensors are written")
                    };
                    let shard = ckpt.tensors[hf].shard;
                    shard_at[shard] + ckpt.shards[shard].file_range(hf).0
                }
            };
            TensorInfo {
                offset: offset as u64,
                ..t.clone()
            }
        })
        .collect();
    let w = &planned.writer;
    Ok((
        Gguf::new(3, w.metadata().to_vec(), infos, ALIGN as u64, 0),
        image,
    ))
}
// ANCHOR_END: assemble

/// `len` bytes of addresses reserved, the first `private` of them writable private memory.
fn reserve(len: usize, private: usize) -> Result<Assembled, Box<dyn Error>> {
    use libc::{MAP_ANONYMOUS, MAP_FAILED, MAP_FIXED, MAP_NORESERVE, MAP_PRIVATE, PROT_NONE};
    // SAFETY: a new anonymous mapping at an address the kernel chooses touches nothing else.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            PROT_NONE,
            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == MAP_FAILED {
        return Err(format!(
            "cannot reserve {len} bytes of addresses: {}",
            std::io::Error::last_os_error()
        )
        .into());
    }
    let image = Assembled {
        base: base.cast(),
        len,
        private,
    };
    if private > 0 {
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: the range lies in the reservation `image` owns.
        let p = unsafe {
            libc::mmap(
                base,
                private,
                rw,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                -1,
                0,
            )
        };
        if p == MAP_FAILED {
            return Err(format!(
                "cannot map {private} bytes: {}",
                std::io::Error::last_os_error()
            )
            .into());
        }
    }
    Ok(image)
}

/// Shard `s`'s file mapped read-only at byte `at` of `image`.
fn map_file_at(
    image: &Assembled,
    at: usize,
    s: &crate::files::Shard,
) -> Result<(), Box<dyn Error>> {
    let file =
        std::fs::File::open(&s.path).map_err(|e| bad(&s.path, format!("cannot open: {e}")))?;
    let len = file
        .metadata()
        .map_err(|e| bad(&s.path, format!("cannot stat: {e}")))?
        .len() as usize;
    if len != s.file_len() {
        return Err(bad(&s.path, "changed since it was opened").into());
    }
    if len == 0 {
        return Ok(());
    }
    let flags = libc::MAP_PRIVATE | libc::MAP_FIXED;
    // SAFETY: `at..at + len` lies in the reservation `image` owns (its length was summed from
    // these very shards); the map is read-only, under chapter 10's contract for model files.
    let p = unsafe {
        libc::mmap(
            image.base.add(at).cast(),
            len,
            libc::PROT_READ,
            flags,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(bad(
            &s.path,
            format!("cannot map: {}", std::io::Error::last_os_error()),
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pages of 4,096 bytes, by hand: tensors of 10, 40 and 33 bytes written (one stays in its
    /// shard) at 0, 32 and 96, ending at 129: one page of private memory; then shards of
    /// 5,000, 4,096 and 1 bytes in 2, 1 and 1 pages.
    #[test]
    fn the_layout_puts_written_tensors_first_then_each_shard_on_whole_pages() {
        let l = layout(
            &[Some(10), None, Some(40), Some(33)],
            &[5000, 4096, 1],
            4096,
        );
        let want = Layout {
            written: vec![Some(0), None, Some(32), Some(96)],
            private: 4096,
            shard_at: vec![4096, 12288, 16384],
            len: 20480,
        };
        assert_eq!(l, want);
        // Nothing written: the shards start at the image's start.
        let l = layout(&[None, None], &[100, 100], 16384);
        assert_eq!((l.private, l.shard_at, l.len), (0, vec![0, 16384], 32768));
    }

    proptest! {
        /// Any tensors and shards: the written tensors lie apart, aligned, inside the private
        /// memory; the shards lie apart, each at a page boundary after it, with less than a
        /// page between; the image ends within a page of the last shard's end.
        #[test]
        fn the_layout_keeps_everything_apart_and_page_aligned(
            sizes in prop::collection::vec(prop::option::of(0usize..10_000), 0..12),
            lens in prop::collection::vec(0usize..100_000, 0..5),
            page in prop::sample::select(vec![4096usize, 16384, 65536]),
        ) {
            let l = layout(&sizes, &lens, page);
            prop_assert_eq!(l.written.len(), sizes.len());
            let mut end = 0;
            for (at, n) in l.written.iter().zip(&sizes) {
                prop_assert_eq!(at.is_some(), n.is_some());
                if let (Some(at), Some(n)) = (at, n) {
                    prop_assert!(at.is_multiple_of(ALIGN) && *at >= end, "{} after {}", at, end);
                    prop_assert!(*at - end < ALIGN, "a gap before {}", at);
                    end = at + n;
                }
            }
            prop_assert!(l.private.is_multiple_of(page) && end <= l.private);
            prop_assert!(l.private < end + page, "a page more than needed: {}", l.private);
            let mut end = l.private;
            for (at, n) in l.shard_at.iter().zip(&lens) {
                prop_assert!(at.is_multiple_of(page) && *at >= end, "{} after {}", at, end);
                prop_assert!(*at < end + page, "a page between shards at {}", at);
                end = at + n;
            }
            prop_assert_eq!(l.shard_at.len(), lens.len());
            prop_assert!(l.len.is_multiple_of(page) && end <= l.len && l.len < end + page);
        }
    }
}
