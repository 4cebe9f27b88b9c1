//! Random damage to a small valid GGUF file: parsing never panics, and never allocates more
//! than a fixed multiple of the input size, whatever lengths and counts the damaged file claims.
//!
//! A counting global allocator measures the peak heap use of each parse. It counts per thread,
//! so tests running in parallel in this binary do not disturb each other.

mod common;

use ch01::gguf::ParseErrorKind;
use ch01::{Gguf, GgufError, GgufFile};
use proptest::prelude::*;
use proptest::sample::Index;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::OnceLock;

struct Counting;

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn track(grow: usize, shrink: usize) {
    // try_with: the allocator also runs while a thread's locals are being torn down.
    let _ = CURRENT.try_with(|c| {
        let now = c.get().saturating_add(grow).saturating_sub(shrink);
        c.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            track(layout.size(), 0);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            track(layout.size(), 0);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        track(0, layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            track(new_size, layout.size());
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak heap bytes allocated on this thread while `f` runs, above what was live before.
fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = CURRENT.get();
    PEAK.set(base);
    let r = f();
    (r, PEAK.get() - base)
}

/// The parse may allocate this many bytes per input byte. The worst honest case is an array
/// of u8: one byte in the file becomes a 32-byte `Value`; hash sets of keys and names and the
/// vectors sized by the header's counts add a few bytes more per input byte.
const ALLOC_PER_INPUT_BYTE: usize = 48;
/// Fixed overhead on top: empty hash sets, error strings.
const ALLOC_SLACK: usize = 16 * 1024;
/// Enough random files to reach each field many times (the sample has ~110 fields).
const CASES: u32 = 4000;

struct Base {
    bytes: Vec<u8>,
    /// `(position, width)` of every length, count and type field.
    fields: Vec<(u64, u8)>,
}

fn bases() -> &'static [Base] {
    static BASES: OnceLock<Vec<Base>> = OnceLock::new();
    BASES.get_or_init(|| {
        [
            common::sample(),
            common::sample().version(2),
            common::sample().alignment(64),
        ]
        .iter()
        .map(|b| {
            let (bytes, layout) = b.build_with_layout();
            Base {
                bytes,
                fields: layout.fields,
            }
        })
        .collect()
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Overwrite one byte.
    Byte(Index, u8),
    /// Overwrite a length, count or type field with a chosen value.
    Field(Index, u64),
    /// Cut the file.
    Truncate(Index),
    /// Insert bytes, shifting everything after.
    Insert(Index, Vec<u8>),
    /// Remove up to 16 bytes.
    Delete(Index, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let value = prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(13),
        Just(1 << 31),
        Just(1 << 32),
        Just(1 << 40),
        Just(1 << 63),
        Just(u64::MAX),
        Just(u64::MAX - 31),
        0..512u64,
        any::<u64>(),
    ];
    prop_oneof![
        3 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Byte(i, b)),
        4 => (any::<Index>(), value).prop_map(|(i, v)| Mutation::Field(i, v)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => (any::<Index>(), 1..16usize).prop_map(|(i, n)| Mutation::Delete(i, n)),
    ]
}

fn apply(base: &Base, mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = base.bytes.clone();
    for m in mutations {
        if bytes.is_empty() {
            break;
        }
        match m {
            Mutation::Byte(i, b) => {
                let at = i.index(bytes.len());
                bytes[at] = *b;
            }
            Mutation::Field(i, v) => {
                let (at, width) = base.fields[i.index(base.fields.len())];
                let at = at as usize;
                let width = width as usize;
                // Earlier cuts or shifts may have moved the field; write what still fits.
                let end = (at + width).min(bytes.len());
                if at < end {
                    bytes[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
                }
            }
            Mutation::Truncate(i) => bytes.truncate(i.index(bytes.len())),
            Mutation::Insert(i, b) => {
                let at = i.index(bytes.len() + 1);
                bytes.splice(at..at, b.iter().copied());
            }
            Mutation::Delete(i, n) => {
                let at = i.index(bytes.len());
                let end = (at + n).min(bytes.len());
                bytes.drain(at..end);
            }
        }
    }
    bytes
}

/// What must hold for any file the parser accepts.
fn check_accepted(bytes: &[u8]) {
    let file = GgufFile::from_bytes(bytes).expect("parsed once, parses again");
    let data_offset = file.data_offset;
    assert!(data_offset <= bytes.len() as u64 || file.tensors.is_empty());
    assert!(file.alignment.is_power_of_two());
    for t in &file.tensors {
        assert!(t.dims.len() <= 4);
        assert_eq!(t.offset % file.alignment, 0, "{}", t.name);
        let data = file
            .tensor_bytes(&t.name)
            .expect("accepted tensors lie in the file");
        assert_eq!(data.len() as u64, t.n_bytes());
        match file.tensor_f32(&t.name) {
            Ok(v) => assert_eq!(v.len() as u64, t.n_elements()),
            Err(GgufError::Dequant { .. }) => {}
            Err(e) => panic!("unexpected error for an accepted tensor: {e}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn damaged_files_never_panic_or_overallocate(
        which in 0..3usize,
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let base = &bases()[which];
        let bytes = apply(base, &mutations);
        let (result, peak) = peak_during(|| Gguf::parse(&bytes));
        let limit = ALLOC_PER_INPUT_BYTE * bytes.len() + ALLOC_SLACK;
        prop_assert!(
            peak <= limit,
            "parsing {} bytes allocated {peak} bytes at peak (limit {limit}): {:?}",
            bytes.len(),
            result.as_ref().err()
        );
        match result {
            Ok(_) => check_accepted(&bytes),
            Err(e) => {
                let pe = e.parse_error().expect("parse errors only");
                let lead = format!("at byte {}", pe.offset);
                prop_assert!(e.to_string().starts_with(&lead), "{}", e);
            }
        }
    }
}

/// The allocation bound is not vacuous: a valid file full of u8 arrays gets close to it, and
/// the header counts alone can be made to claim far more than it.
#[test]
fn the_allocation_bound_is_tight_enough_to_matter() {
    use ch01::gguf::{Value, ValueType};
    let big = Value::Array(ValueType::U8, vec![Value::U8(0); 100_000]);
    let bytes = common::Builder::new().kv("bytes", big).build();
    let (g, peak) = peak_during(|| Gguf::parse(&bytes).unwrap());
    drop(g);
    let per_byte = peak as f64 / bytes.len() as f64;
    assert!(
        (16.0..=ALLOC_PER_INPUT_BYTE as f64).contains(&per_byte),
        "{per_byte} bytes allocated per input byte"
    );

    // A count of 2^40 elements in this file would need 32 TiB: rejected before allocating.
    let mut bad = bytes.clone();
    let count_at = 24 + 8 + "bytes".len() + 4 + 4;
    bad[count_at..count_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let (r, peak) = peak_during(|| Gguf::parse(&bad));
    assert!(matches!(
        r.unwrap_err().parse_error().unwrap().kind,
        ParseErrorKind::CountTooLarge { .. }
    ));
    assert!(peak < ALLOC_SLACK, "{peak}");
}
