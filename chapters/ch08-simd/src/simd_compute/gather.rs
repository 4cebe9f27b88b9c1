//! Reading keys and values for attention: a tile's rows gathered from the cache (read in
//! place where they are f32, or f16 that the kernels convert as they load; decoded once per
//! tile otherwise), and the rows a unit reads next asked for ahead of time.

use super::KEY_TILE;
use crate::simd::F32Simd;
use ch01::GgmlType;
use ch01::dequant::row_dequantizer;
use ch03::{KvRows, KvView};
use std::ops::Range;

/// Ask for part `head` (of rows of `width` values) of the keys and values of positions `keys`
/// to be brought into the cache.
#[inline(always)]
pub(super) fn prefetch_kv(kv: &dyn KvView, keys: Range<usize>, head: Range<usize>, width: usize) {
    prefetch_rows(keys.clone(), head.clone(), width, |p, m| kv.key_run(p, m));
    prefetch_rows(keys, head, width, |p, m| kv.value_run(p, m));
}

/// Ask for part `head` of the rows of positions `keys` to be brought into the cache, read a run
/// at a time with `run(pos, max)` as [`gather`] reads them.
#[inline(always)]
fn prefetch_rows<'a>(
    keys: Range<usize>,
    head: Range<usize>,
    width: usize,
    run: impl Fn(usize, usize) -> KvRows<'a>,
) {
    let mut p = keys.start;
    while p < keys.end {
        let r = run(p, keys.end - p);
        let n = r.len(width).clamp(1, keys.end - p);
        // The rows' start, the bytes of a row, and the head's bytes within one.
        let (base, row, part) = match r {
            KvRows::F32(x) => (
                x.as_ptr() as *const u8,
                4 * width,
                4 * head.start..4 * head.end,
            ),
            KvRows::Encoded { ty, bytes } => {
                let at = |n: usize| ty.row_bytes(n as u64).unwrap_or(0) as usize;
                (bytes.as_ptr(), at(width), at(head.start)..at(head.end))
            }
        };
        for k in 0..n {
            let mut o = k * row + part.start;
            while o < k * row + part.end {
                prefetch(base.wrapping_add(o));
                o += 64;
            }
        }
        p += n;
    }
}

/// `prefetcht1` of the line at `at`: a hint, which never faults (nothing on other CPUs).
#[inline(always)]
fn prefetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(at as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Fill `rows[..j1 - j0]` with part `head` of the rows of positions `j0..j1`, read a run at a
/// time with `run(pos, max)` (rows of `width` values side by side): f32 rows in place, encoded
/// rows (f16, q8_0) decoded into `dec` (`(KEY_TILE, head.len())`).
///
/// # Safety
/// `S`'s instructions are available.
#[inline(always)]
pub(super) unsafe fn gather<'a, S: F32Simd>(
    j0: usize,
    j1: usize,
    head: Range<usize>,
    width: usize,
    run: impl Fn(usize, usize) -> KvRows<'a>,
    dec: &'a mut [f32],
    rows: &mut [&'a [f32]; KEY_TILE],
) {
    let hd = head.len();
    let mut decoded = [false; KEY_TILE];
    let mut p = j0;
    while p < j1 {
        let r = run(p, j1 - p);
        let n = r.len(width).min(j1 - p);
        // The kernels read a whole head of every row of the tile, so each position must get
        // one: a run of less than one row (which `KvView` promises never to return) would
        // leave a row empty.
        assert!(
            n >= 1,
            "attention: the KV store returned less than one row of {width} values at position {p}"
        );
        match r {
            KvRows::F32(x) => {
                for (k, row) in x.chunks_exact(width).take(n).enumerate() {
                    rows[p - j0 + k] = &row[head.clone()];
                }
            }
            KvRows::Encoded { ty, bytes } => {
                let at = |n: usize| {
                    ty.row_bytes(n as u64).unwrap_or_else(|| {
                        panic!("attention: {n} values are not whole {ty} blocks")
                    }) as usize
                };
                let (rb, b0, b1) = (at(width), at(head.start), at(head.end));
                for k in 0..n {
                    let (src, i) = (&bytes[k * rb..][b0..b1], p - j0 + k);
                    let out = &mut dec[i * hd..(i + 1) * hd];
                    match ty {
                        // SAFETY: `S`'s instructions are enabled (this function's contract); the
                        // decoder stays inside its slices.
                        GgmlType::F16 => unsafe { S::f16_to_f32(src, out) },
                        // SAFETY: as for F16.
                        GgmlType::Q8_0 => unsafe { S::q8_0_to_f32(src, out) },
                        other => row_dequantizer(other)
                            .unwrap_or_else(|| panic!("attention: no decoder for {other} rows"))(
                            src, out,
                        ),
                    }
                    decoded[i] = true;
                }
            }
        }
        p += n;
    }
    let dec: &'a [f32] = dec;
    for (i, row) in rows.iter_mut().enumerate().take(j1 - j0) {
        if decoded[i] {
            *row = &dec[i * hd..(i + 1) * hd];
        }
    }
}

/// Fill `rows[..j1 - j0]` with part `head` of the rows of positions `j0..j1`, encoded as `ty`
/// (f16, q8_0), in place, read a run at a time with `run(pos, max)` as [`gather`] reads them.
pub(super) fn gather_encoded<'a>(
    ty: GgmlType,
    j0: usize,
    j1: usize,
    head: Range<usize>,
    width: usize,
    run: impl Fn(usize, usize) -> KvRows<'a>,
    rows: &mut [&'a [u8]; KEY_TILE],
) {
    let at = |n: usize| {
        ty.row_bytes(n as u64)
            .unwrap_or_else(|| panic!("attention: {n} values are not whole {ty} blocks"))
            as usize
    };
    let (rb, b0, b1) = (at(width), at(head.start), at(head.end));
    let mut p = j0;
    while p < j1 {
        let r = run(p, j1 - p);
        let n = r.len(width).min(j1 - p);
        // As in `gather`: a store that gives less than a row, or changes its rows' type within
        // a call, breaks `KvView`'s promise; refused before any kernel reads.
        let bytes = match r {
            KvRows::Encoded { ty: t, bytes } if t == ty => bytes,
            _ => panic!(
                "attention: the KV store's rows at position {p} are not the {ty} rows it began with"
            ),
        };
        assert!(
            n >= 1,
            "attention: the KV store returned less than one row of {width} values at position {p}"
        );
        for k in 0..n {
            rows[p - j0 + k] = &bytes[k * rb + b0..k * rb + b1];
        }
        p += n;
    }
}
