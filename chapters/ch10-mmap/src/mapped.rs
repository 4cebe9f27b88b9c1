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
//! raises `SIGBUS`). That is why [`Mmap::map`] is `unsafe`: the caller promises that the file
//! stays as it is while mapped. We keep our side of it — the file is opened read-only and never
//! written — and ask the same of the user: **a model file must not be truncated or rewritten
//! while an engine runs on it.** llama.cpp makes the same bargain. On Linux, a file protected by
//! fs-verity or a sealed memfd cannot change at all, and memmap2's `map_if_safe` checks that;
//! ordinary model files are neither.
//!
//! If the file changes anyway:
//! - **Rewritten in place** (a download restarted over it, an editor saving it): the engine
//!   reads a mix of old and new bytes, and computes with weights that are silently wrong.
//!   Nothing notices as it happens; [`MappedFile::check_unchanged`] notices afterwards, by the
//!   file's size and modification time, and says which changed.
//! - **Truncated**: the first read of a page past the new end raises `SIGBUS`, which would kill
//!   the process with a bare "Bus error". Recovering in Rust is not possible soundly (unwinding
//!   or jumping out of a signal handler across Rust frames is undefined behaviour), so on Linux
//!   the first map installs a handler that only reports: for a fault inside a mapped model file
//!   it writes a message naming the file to stderr and exits with status 1; any other bus
//!   error goes on to the handler that was there before (normally a crash, as it would be
//!   without this one).
//!
//! What to do instead: replace a model file by writing a new file and renaming it over the old
//! one (a running engine keeps the old inode and never sees the new bytes); or run with
//! `--no-mmap`, which reads the file into memory once so that later changes cannot reach the
//! engine; or copy the file and run on the copy.
//!
//! Bad files are a different matter, and they never reach the pages: [`Gguf::parse`] checks
//! every tensor's extent against the length of the map before anything is loaded, so a
//! truncated download is an error naming the file and the byte offset, not a `SIGBUS`.
//!
//! [`Gguf::parse`]: ch01::Gguf::parse

use ch01::{GgufError, GgufFile};
use memmap2::{Advice, Mmap, MmapOptions};
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

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
pub type MappedBytes = SharedBytes<MappedFile>;
/// A range of a file read into memory.
pub type ReadBytes = SharedBytes<AlignedBuf>;
// ANCHOR_END: shared_bytes

// ANCHOR: slice
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
        // ANCHOR: yours_slice
        let end = start.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        Some(SharedBytes {
            owner: Arc::clone(&self.owner),
            start: self.start + start as usize,
            len: len as usize,
        })
        // ANCHOR_END: yours_slice
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
// ANCHOR_END: slice

// ANCHOR: shared_bytes_traits
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
// ANCHOR_END: shared_bytes_traits

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

    /// `len` zero bytes, to be written through `as_mut`.
    pub fn zeroed(len: usize) -> AlignedBuf {
        AlignedBuf {
            words: vec![0u64; len.div_ceil(8)],
            len,
        }
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

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

/// A memory map of a model file, and what the file was when it was mapped: its size and
/// modification time, so that an error can be traced to the file changing underneath the
/// engine ([`MappedFile::check_unchanged`]). On Linux, its address range is registered with
/// the bus-error handler (see the module documentation) for as long as it is mapped.
pub struct MappedFile {
    /// Declared before `map`, so it is dropped first: the range is no longer reported as this
    /// file's once it may be unmapped and reused.
    #[cfg(target_os = "linux")]
    _registered: Option<bus_error::Registration>,
    map: Mmap,
    /// Kept open so that [`MappedFile::check_unchanged`] asks about the file that is mapped,
    /// not whatever file the path names by then.
    file: File,
    path: PathBuf,
    modified: Option<SystemTime>,
}

impl MappedFile {
    fn new(map: Mmap, file: File, path: &Path, modified: Option<SystemTime>) -> MappedFile {
        MappedFile {
            #[cfg(target_os = "linux")]
            _registered: bus_error::register(map.as_ptr(), map.len(), path),
            map,
            file,
            path: path.to_path_buf(),
            modified,
        }
    }

    /// The path the file was mapped from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's size when it was mapped: the length of the map.
    pub fn mapped_len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Whether the mapped file still has the size and modification time it had when it was
    /// mapped; if not, an error naming the file and what changed. Call it when something
    /// suggests the weights are not what they were (a check that failed, output that makes no
    /// sense): a file rewritten in place gives no other sign.
    ///
    /// It asks about the file the map reads (through the descriptor kept open), so a file
    /// replaced by renaming a new one over its path, which the map never sees, is not a change.
    pub fn check_unchanged(&self) -> Result<(), FileChanged> {
        let meta = self.file.metadata().map_err(|source| FileChanged::Stat {
            path: self.path.clone(),
            source,
        })?;
        if meta.len() != self.mapped_len() {
            return Err(FileChanged::Size {
                path: self.path.clone(),
                mapped: self.mapped_len(),
                now: meta.len(),
            });
        }
        if let (Some(mapped), Ok(now)) = (self.modified, meta.modified())
            && mapped != now
        {
            return Err(FileChanged::Modified {
                path: self.path.clone(),
                mapped,
                now,
            });
        }
        Ok(())
    }
}

impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

// ANCHOR: release_pages
/// A buffer whose pages a [`ViewLoader`](crate::ViewLoader) may give back once no matrix
/// reads them: the bytes of a tensor that was repacked into a copy of its own.
pub trait ReleasePages {
    /// Bytes `range` of the buffer will not be read again soon. The default keeps them: a
    /// buffer read into memory is one allocation, and its bytes stay until all of it goes.
    fn release(&self, range: std::ops::Range<usize>) {
        let _ = range;
    }
}

impl ReleasePages for MappedFile {
    /// The whole pages inside `range` leave this process's resident set (`madvise` with
    /// `MADV_DONTNEED`). They stay in the page cache, and a later read of them faults them in
    /// again from there (or from the file): for a map that is never written, dropping pages
    /// changes no byte anyone reads. Advice the kernel refuses (pages locked by `--mlock`)
    /// leaves them resident, which is what the user asked for.
    #[cfg(target_os = "linux")]
    fn release(&self, range: std::ops::Range<usize>) {
        let page = page_size();
        let start = range.start.next_multiple_of(page);
        let end = range.end.min(self.map.len()) / page * page;
        if start < end {
            // SAFETY: DontNeed on a read-only shared file map drops this process's mapping of
            // the pages, not their contents: a later access reads the file's bytes again.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    end - start,
                )
            };
        }
    }
}

impl ReleasePages for AlignedBuf {}
// ANCHOR_END: release_pages

/// The size of a memory page.
#[cfg(target_os = "linux")]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// How a mapped file differs from what it was when it was mapped.
#[derive(Debug)]
pub enum FileChanged {
    /// Its size changed: truncated (a read past the new end raises `SIGBUS`), or extended.
    Size {
        path: PathBuf,
        mapped: u64,
        now: u64,
    },
    /// Same size, but written since it was mapped: the weights may be partly new bytes.
    Modified {
        path: PathBuf,
        mapped: SystemTime,
        now: SystemTime,
    },
    /// The file's metadata could not be read.
    Stat {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What the user can do about a changed file, at the end of every message.
const CHANGED_HINT: &str = "run again, or with --no-mmap to read the file into memory";

impl fmt::Display for FileChanged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileChanged::Size { path, mapped, now } => write!(
                f,
                "{}: the model file changed while mapped: its size went from {mapped} to {now} \
                 bytes; {CHANGED_HINT}",
                path.display()
            ),
            FileChanged::Modified { path, mapped, now } => {
                let (by, way) = match now.duration_since(*mapped) {
                    Ok(d) => (d, "later"),
                    Err(e) => (e.duration(), "earlier"),
                };
                write!(
                    f,
                    "{}: the model file was rewritten while mapped: its size is the same, but \
                     its modification time is {:.3} s {way} than when it was mapped; \
                     {CHANGED_HINT}",
                    path.display(),
                    by.as_secs_f64()
                )
            }
            FileChanged::Stat { path, source } => write!(
                f,
                "{}: cannot read the metadata of the mapped model file: {source}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for FileChanged {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FileChanged::Stat { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A kernel hint on how the mapped pages will be used (`madvise`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
    // What the file was when mapped, for `MappedFile::check_unchanged`.
    let modified = file
        .metadata()
        .map_err(|e| io("cannot stat", e))?
        .modified()
        .ok();
    let mut options = MmapOptions::new();
    if opts.populate {
        options.populate();
    }
    // SAFETY: the map is read-only and this process never writes the file. The remaining risk,
    // another process writing or truncating the file while it is mapped, is the contract
    // described in this module's documentation: model files are not modified in place. If one
    // is truncated anyway, a read past its new end raises SIGBUS, which ends the process (with
    // a message, on Linux) instead of returning.
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
    let bytes = SharedBytes::whole(Arc::new(MappedFile::new(map, file, path, modified)));
    let file = GgufFile::from_bytes(bytes.clone()).map_err(|e| in_file(path, e))?;
    Ok((file, bytes))
}
// ANCHOR_END: map_gguf

/// Read the GGUF file at `path` into aligned memory and parse it: the `--no-mmap` path, the
/// same views over a private copy.
pub fn read_gguf(path: &Path) -> Result<(GgufFile<ReadBytes>, ReadBytes), OpenError> {
    held_gguf(path, AlignedBuf::read_file(path)?)
}

/// Parse the GGUF image that `owner` holds in memory, read or made from `path` (errors name
/// it): views over `owner`, shared by the file and the matrices.
pub fn held_gguf<O: AsRef<[u8]>>(
    path: &Path,
    owner: O,
) -> Result<(GgufFile<SharedBytes<O>>, SharedBytes<O>), OpenError> {
    let bytes = SharedBytes::whole(Arc::new(owner));
    let file = GgufFile::from_bytes(bytes.clone()).map_err(|e| in_file(path, e))?;
    Ok((file, bytes))
}

fn in_file(path: &Path, e: GgufError) -> OpenError {
    OpenError::Gguf(GgufError::InFile {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

/// The `SIGBUS` handler of the module documentation: a read of a page past the end of a
/// truncated model file ends the process with a message naming the file and exit status 1.
///
/// A signal handler may only do what is async-signal-safe: no allocation, no locks, nothing
/// that could be halfway done in the interrupted code. So the mapped ranges live in a fixed
/// table of atomics, each with its message formatted when it was registered; the handler reads
/// the table, writes the message with `write` and leaves with `_exit`, status 1. It never
/// returns into the faulting read: there is nothing sound to return to.
#[cfg(target_os = "linux")]
mod bus_error {
    use std::cell::UnsafeCell;
    use std::ffi::{c_int, c_void};
    use std::mem::MaybeUninit;
    use std::path::Path;
    use std::sync::Once;
    use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering, fence};

    /// Mapped files covered at once. A file mapped while all slots are taken is not covered: a
    /// read past its truncated end is then the usual bare bus error.
    const SLOTS: usize = 32;
    /// Bytes of a message; one whose path does not fit is sent without the path.
    const MESSAGE: usize = 512;
    /// The message when the path does not fit.
    const GENERIC: &str = "error: the model file changed or was truncated while mapped (bus \
                           error reading it); run again, or with --no-mmap to read it into \
                           memory\n";

    /// A slot's `state`: free, or being filled; any larger value means live, and is a
    /// generation number no other registration gets.
    const FREE: usize = 0;
    const BUSY: usize = 1;

    /// One mapped range. All fields are atomics, so the handler may read a slot while another
    /// thread fills or empties it: it then sees `state` change and ignores what it read (a
    /// sequence lock).
    struct Slot {
        state: AtomicUsize,
        start: AtomicUsize,
        end: AtomicUsize,
        len: AtomicUsize, // of the message
        message: [AtomicU8; MESSAGE],
    }

    impl Slot {
        const fn new() -> Slot {
            Slot {
                state: AtomicUsize::new(FREE),
                start: AtomicUsize::new(0),
                end: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                message: [const { AtomicU8::new(0) }; MESSAGE],
            }
        }
    }

    static TABLE: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
    static GENERATION: AtomicUsize = AtomicUsize::new(BUSY + 1);

    /// A registered range; dropping it frees the slot.
    pub(super) struct Registration(usize);

    impl Drop for Registration {
        fn drop(&mut self) {
            TABLE[self.0].state.store(FREE, Ordering::Release);
        }
    }

    /// Report a bus error at `start..start + len` as a read of the mapped file at `path`. The
    /// handler is installed with the first registration.
    pub(super) fn register(start: *const u8, len: usize, path: &Path) -> Option<Registration> {
        INSTALL.call_once(install);
        if len == 0 {
            return None;
        }
        let message = format!(
            "error: {}: the model file changed or was truncated while mapped (bus error reading \
             it); run again, or with --no-mmap to read it into memory\n",
            path.display()
        );
        let message = if message.len() <= MESSAGE {
            message.as_bytes()
        } else {
            GENERIC.as_bytes()
        };
        let (i, slot) = TABLE.iter().enumerate().find(|(_, s)| {
            s.state
                .compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })?;
        // Orders the writes below after `BUSY`: a handler that reads any of them sees the
        // state changed when it checks again.
        fence(Ordering::Release);
        slot.start.store(start as usize, Ordering::Relaxed);
        slot.end.store(start as usize + len, Ordering::Relaxed);
        for (to, &b) in slot.message.iter().zip(message) {
            to.store(b, Ordering::Relaxed);
        }
        slot.len.store(message.len(), Ordering::Relaxed);
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        slot.state.store(generation, Ordering::Release);
        Some(Registration(i))
    }

    /// Copy the message of the live range that holds `addr` into `buf`; its length, or `None`.
    /// Async-signal-safe: atomic loads only.
    fn message_for(addr: usize, buf: &mut [u8; MESSAGE]) -> Option<usize> {
        for slot in &TABLE {
            let state = slot.state.load(Ordering::Acquire);
            if state == FREE || state == BUSY {
                continue;
            }
            let (start, end) = (
                slot.start.load(Ordering::Relaxed),
                slot.end.load(Ordering::Relaxed),
            );
            let len = slot.len.load(Ordering::Relaxed).min(MESSAGE);
            for (to, from) in buf.iter_mut().zip(&slot.message[..len]) {
                *to = from.load(Ordering::Relaxed);
            }
            fence(Ordering::Acquire);
            if slot.state.load(Ordering::Relaxed) == state && (start..end).contains(&addr) {
                return Some(len);
            }
        }
        None
    }

    static INSTALL: Once = Once::new();
    /// Set once `PREVIOUS` holds the action our handler replaced.
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    static PREVIOUS: Previous = Previous(UnsafeCell::new(MaybeUninit::uninit()));

    /// The `SIGBUS` action before ours, to hand other bus errors back to.
    struct Previous(UnsafeCell<MaybeUninit<libc::sigaction>>);

    // SAFETY: `PREVIOUS` is written once, by `sigaction` in `install` (inside `INSTALL`),
    // before `INSTALLED` is set with Release; it is read only after `INSTALLED` is seen set
    // with Acquire, and never written again, so reads never race with the write.
    unsafe impl Sync for Previous {}

    fn install() {
        // SAFETY: all-zero bytes are a valid `sigaction` (a plain C struct of integers and a
        // mask); the fields that matter are set below.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = on_bus_error;
        action.sa_sigaction = handler as libc::sighandler_t;
        // SA_ONSTACK: run on the thread's alternate stack where it has one (Rust's threads do),
        // as the handler Rust installs for stack overflows does.
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `sa_mask` is a valid, writable signal set; emptying it cannot fail.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        let previous = PREVIOUS.0.get().cast::<libc::sigaction>();
        // SAFETY: `action` is a complete action whose handler is async-signal-safe, and
        // `previous` points to room for one that nothing reads until `INSTALLED` is set.
        if unsafe { libc::sigaction(libc::SIGBUS, &action, previous) } == 0 {
            INSTALLED.store(true, Ordering::Release);
        }
        // If sigaction failed, nothing is installed and bus errors stay bare.
    }

    /// Put back the action ours replaced (the default one if there was none to record).
    fn restore_previous() {
        // SAFETY: all-zero bytes are a valid `sigaction`, and with a zero handler it is the
        // default action (SIG_DFL is 0).
        let mut default: libc::sigaction = unsafe { std::mem::zeroed() };
        default.sa_sigaction = libc::SIG_DFL;
        let previous: *const libc::sigaction = if INSTALLED.load(Ordering::Acquire) {
            PREVIOUS.0.get().cast::<libc::sigaction>()
        } else {
            &default
        };
        // SAFETY: `previous` points to a complete action: the one `install` recorded (written
        // before `INSTALLED`, never again), or `default`. sigaction is async-signal-safe.
        unsafe { libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut()) };
    }

    /// Write all of `bytes` to stderr with write(2), which is async-signal-safe; give up on an
    /// error (there is no one to tell).
    fn write_stderr(mut bytes: &[u8]) {
        while !bytes.is_empty() {
            // SAFETY: `bytes` is a live slice of `bytes.len()` readable bytes.
            let n = unsafe { libc::write(libc::STDERR_FILENO, bytes.as_ptr().cast(), bytes.len()) };
            if n <= 0 {
                return;
            }
            bytes = &bytes[n as usize..];
        }
    }

    // ANCHOR: on_bus_error
    extern "C" fn on_bus_error(signal: c_int, info: *mut libc::siginfo_t, _: *mut c_void) {
        // SAFETY: the kernel passes a valid `siginfo_t` to a handler installed with
        // SA_SIGINFO; `si_addr` is the faulting address for the fault codes checked below.
        let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
        let fault = matches!(
            code,
            libc::BUS_ADRALN | libc::BUS_ADRERR | libc::BUS_OBJERR | libc::BUS_MCEERR_AR
        );
        // A read past the end of a truncated file is BUS_ADRERR (BUS_OBJERR on some file
        // systems); only those, at an address of a mapped model file, are ours.
        if matches!(code, libc::BUS_ADRERR | libc::BUS_OBJERR) {
            let mut buf = [0u8; MESSAGE];
            if let Some(len) = message_for(addr, &mut buf) {
                write_stderr(&buf[..len]);
                // SAFETY: `_exit` is async-signal-safe and ends the process at once, running
                // nothing of the interrupted code (no destructors, no atexit handlers).
                unsafe { libc::_exit(1) };
            }
        }
        // Not ours: hand it back. For a fault, returning runs the faulting instruction again,
        // which faults again under the previous action (a crash, or Rust's stack-overflow
        // report); a signal that was sent is raised again for the previous action to take.
        restore_previous();
        if !fault {
            // SAFETY: raise is async-signal-safe; SIGBUS stays blocked until this handler
            // returns, then the previous action receives it.
            unsafe { libc::raise(signal) };
        }
    }
    // ANCHOR_END: on_bus_error
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
