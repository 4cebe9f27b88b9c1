//! The packed layout: [`PackedMatrix`], a quantized matrix with its rows interleaved in groups of
//! [`GROUP`], and packing one from a file's matrix.
//!
//! This file says where everything is: which weight types have a layout ([`PackedType`]), where
//! the parts of a unit lie (`Layout`), and how a matrix is cut into groups and units of 64-byte
//! lines. The byte-level moves of each type's blocks into a unit are in `repack.rs`; the
//! kernels that read the result are in `avx512.rs`.

use super::repack::{
    pack_legacy, pack_q4_k, pack_q5_k, pack_q6_k, unpack_legacy, unpack_q4_k, unpack_q5_k,
    unpack_q6_k,
};
use super::{GROUP, PREFETCH, QK, QK_K, vnni_available};
use ch01::GgmlType;
use ch03::LoadError;
use ch06::qmatrix::QMatrix;
use rayon::prelude::*;

/// A 64-byte line, so packed groups start on a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Line(pub [u8; 64]);

/// The weight types with a packed layout and micro-kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)] // ggml's names
pub enum PackedType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl PackedType {
    /// Every packed type, so that tests cover each one.
    pub const ALL: [PackedType; 8] = {
        use PackedType::*;
        [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K]
    };

    /// The ggml type whose blocks this packs.
    pub const fn ggml_type(self) -> GgmlType {
        match self {
            PackedType::Q4_0 => GgmlType::Q4_0,
            PackedType::Q4_1 => GgmlType::Q4_1,
            PackedType::Q5_0 => GgmlType::Q5_0,
            PackedType::Q5_1 => GgmlType::Q5_1,
            PackedType::Q8_0 => GgmlType::Q8_0,
            PackedType::Q4_K => GgmlType::Q4_K,
            PackedType::Q5_K => GgmlType::Q5_K,
            PackedType::Q6_K => GgmlType::Q6_K,
        }
    }

    /// The packed type of `ty`, or `None` where `ty` has no packed layout.
    pub fn of(ty: GgmlType) -> Option<PackedType> {
        PackedType::ALL.into_iter().find(|p| p.ggml_type() == ty)
    }

    /// Weights per block.
    pub fn qk(self) -> usize {
        if self.is_k() { QK_K } else { QK }
    }

    fn is_k(self) -> bool {
        matches!(self, PackedType::Q4_K | PackedType::Q5_K | PackedType::Q6_K)
    }

    /// Bytes of one block in the file.
    fn block_bytes(self) -> usize {
        match self {
            PackedType::Q4_0 => 18,
            PackedType::Q4_1 => 20,
            PackedType::Q5_0 => 22,
            PackedType::Q5_1 => 24,
            PackedType::Q8_0 => 34,
            PackedType::Q4_K => 144,
            PackedType::Q5_K => 176,
            PackedType::Q6_K => 210,
        }
    }

    /// Packed code bytes per legacy block of a group: 16 rows of 16 nibble bytes, or of 32.
    pub(super) fn qs_bytes(self) -> usize {
        if self == PackedType::Q8_0 { 512 } else { 256 }
    }

    fn has_min(self) -> bool {
        matches!(self, PackedType::Q4_1 | PackedType::Q5_1)
    }

    fn has_high_bit(self) -> bool {
        matches!(self, PackedType::Q5_0 | PackedType::Q5_1)
    }

    /// What the stored (unsigned) code exceeds the signed code by: `Σ(q - o)·y = Σq·y - o·Σy`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by the x86 kernels
    pub(super) fn offset(self) -> i32 {
        match self {
            PackedType::Q4_0 => 8,
            PackedType::Q5_0 => 16,
            PackedType::Q8_0 => 128,
            PackedType::Q6_K => 32,
            PackedType::Q4_1 | PackedType::Q5_1 | PackedType::Q4_K | PackedType::Q5_K => 0,
        }
    }

    /// Byte offsets inside a legacy file block: (d, m, qh, qs).
    pub(super) fn fields(self) -> (usize, Option<usize>, Option<usize>, usize) {
        match self {
            PackedType::Q4_0 | PackedType::Q8_0 => (0, None, None, 2),
            PackedType::Q4_1 => (0, Some(2), None, 4),
            PackedType::Q5_0 => (0, None, Some(2), 6),
            PackedType::Q5_1 => (0, Some(2), Some(4), 8),
            PackedType::Q4_K | PackedType::Q5_K | PackedType::Q6_K => {
                unreachable!("k-quants have no legacy fields")
            }
        }
    }

    /// Blocks per *unit*, the part of a group the kernels step through: two legacy blocks
    /// (so every part is a whole number of 64-byte lines), or one super-block.
    fn unit_blocks(self) -> usize {
        if self.is_k() { 1 } else { 2 }
    }
}

/// Where the parts of a unit are, in bytes from its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) qh: usize, // legacy: 2 × 64 bytes of fifth-bit masks
    pub(super) d: usize,  // the rows' f16 scales (legacy: of both blocks)
    pub(super) m: usize,  // legacy mins, or Q4_K's dmin
    pub(super) sc: usize, // k-quants: sub-block scales, one byte per row
    // Q4_K: sub-block mins, two bytes (sub-blocks 2p, 2p + 1) per row and pair
    pub(super) mn: usize,
    pub(super) bytes: usize, // the whole unit
}

impl Layout {
    fn of(ty: PackedType) -> Layout {
        match ty {
            PackedType::Q4_K => Layout {
                qh: 0,
                sc: 2048,
                mn: 2176,
                d: 2304,
                m: 2336,
                bytes: 2368,
            },
            PackedType::Q5_K => Layout {
                qh: 2048,
                sc: 2560,
                mn: 2688,
                d: 2816,
                m: 2848,
                bytes: 2880,
            },
            PackedType::Q6_K => Layout {
                qh: 2048,
                sc: 3072,
                mn: 0,
                d: 3328,
                m: 0,
                bytes: 3392,
            },
            _ => {
                let qh = 2 * ty.qs_bytes();
                let d = qh + if ty.has_high_bit() { 128 } else { 0 };
                let m = d + 64;
                let bytes = m + if ty.has_min() { 64 } else { 0 };
                Layout {
                    qh,
                    d,
                    m,
                    sc: 0,
                    mn: 0,
                    bytes,
                }
            }
        }
    }
}

// ANCHOR: packed
/// A quantized matrix with its rows interleaved in groups of [`GROUP`].
///
/// A group of 16 rows is one sequential stream of *units* (two legacy blocks, or one
/// super-block), so the hardware prefetcher sees a single run of addresses per thread. A
/// legacy unit holds:
/// - `qs`: the codes of block 0, then of block 1. For 4- and 5-bit types, 4 chunks of 64 bytes;
///   chunk `c` holds bytes `4c..4c+4` of each row's 16 nibble bytes, row after row. Their low
///   nibbles are weights `4c..4c+4` of the block and their high nibbles weights `16+4c..20+4c`,
///   so one load and two masks give two registers of 16 rows × 4 weights. For Q8_0, 8 chunks
///   of 16 rows × 4 codes, each code plus 128 so that it is unsigned.
/// - `qh` (5-bit types), per block: for each 4-weight group `j`, a 64-bit mask whose bit
///   `4r + i` is the fifth bit of weight `4j + i` of row `r`.
/// - `d`, then `m` (types with a min): the 16 rows' scales (and mins) of the two blocks, as the
///   file's f16.
///
/// A Q4_K unit holds the nibble bytes in the same 16 rows × 4 bytes chunks (32 of them), then
/// the unpacked 6-bit sub-block scales (one byte per row and sub-block), the mins (for each pair of
/// sub-blocks, the two bytes of row 0, of row 1, …: widened to 16 bits they are one 32-bit lane per
/// row, for `vpdpwssd`), then `d` and `dmin`. A Q5_K unit is a Q4_K unit with the fifth bits after
/// the nibbles: for each sub-block and 4-weight chunk, a 64-bit mask as Q5_0's (2,880 bytes per 16
/// rows of 256 weights against the file's 2,816). A Q6_K unit splits its 6-bit codes as the file
/// does: the low four bits in nibble chunks (chunk `4j + k` holds code chunk `k` of sub-block `2j`
/// in its low nibbles and of sub-block `2j + 1` in its high ones), the high two in one 64-byte
/// chunk per sub-block (bits `2k, 2k + 1` of each byte for its code chunk `k`), then the sub-block
/// scales and `d`: 3,392 bytes per 16 rows of 256 weights against the file's 3,360. A shift, a mask
/// and one three-way logic instruction put a code register back together. (Keeping each code in a
/// byte of its own, 4,416 bytes, needs no unpacking, but a decoded token then reads 30 % more of
/// these matrices' bytes, and a decoded token's products are a memory stream.)
///
/// Every part is a whole number of 64-byte lines, so every load is aligned. A last group with
/// fewer than 16 rows is padded with zero rows, a last legacy unit with a zero block.
pub struct PackedMatrix {
    pub ty: PackedType,
    pub rows: usize,
    pub cols: usize,
    pub nb: usize,     // blocks per row
    pub groups: usize, // rows.div_ceil(GROUP)
    /// Bytes ahead that the kernels prefetch ([`PREFETCH`]; 0 for none). Any value is safe:
    /// a prefetch is a hint that never faults.
    pub prefetch: usize,
    pub(super) layout: Layout,
    pub(super) group_bytes: usize,
    data: Vec<Line>, // (groups, group_bytes / 64)
}
// ANCHOR_END: packed

impl PackedMatrix {
    /// Interleave the rows of `q`, or `None` when its type has no packed layout or this CPU
    /// cannot run the micro-kernels.
    pub fn pack<S: AsRef<[u8]>>(q: &QMatrix<S>) -> Option<PackedMatrix> {
        PackedMatrix::pack_with(q, true)
    }

    /// As [`PackedMatrix::pack`], choosing whether the packed bytes may sit on huge pages
    /// (`pack` says yes) — for the bench that measures what they buy.
    pub fn pack_with<S: AsRef<[u8]>>(q: &QMatrix<S>, huge_pages: bool) -> Option<PackedMatrix> {
        let ty = PackedType::of(q.ty)?;
        if !vnni_available() || !q.cols.is_multiple_of(ty.qk()) {
            return None;
        }
        Some(PackedMatrix::pack_as(
            ty,
            q.rows,
            q.cols,
            q.data.as_ref(),
            huge_pages,
        ))
    }

    /// Bytes a matrix of `rows × cols` weights of type `ty` takes once packed, without
    /// packing it: `None` for a type or width the micro-kernel does not take. (The file's
    /// bytes plus the layout's padding: a group of 16 rows, units of whole blocks, 64-byte
    /// lines.)
    pub fn packed_bytes(ty: GgmlType, rows: usize, cols: usize) -> Option<usize> {
        let ty = PackedType::of(ty)?;
        if !cols.is_multiple_of(ty.qk()) {
            return None;
        }
        let group_bytes = (cols / ty.qk()).div_ceil(ty.unit_blocks()) * Layout::of(ty).bytes;
        Some((rows.div_ceil(GROUP) * group_bytes).next_multiple_of(64))
    }

    fn pack_as(
        ty: PackedType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
        huge_pages: bool,
    ) -> PackedMatrix {
        let nb = cols / ty.qk();
        let groups = rows.div_ceil(GROUP);
        let layout = Layout::of(ty);
        let group_bytes = nb.div_ceil(ty.unit_blocks()) * layout.bytes;
        let mut data = zeroed_lines(groups * group_bytes / 64, huge_pages);
        let out = lines_mut(&mut data);
        let bb = ty.block_bytes();
        // Groups are independent: they are packed in parallel (an 8B model's 4.7 GB pack
        // in half the time on two cores). Each group's 16 rows are read once, in order.
        out.par_chunks_mut(group_bytes)
            .enumerate()
            .for_each(|(g, grp)| {
                for r in g * GROUP..((g + 1) * GROUP).min(rows) {
                    let lane = r % GROUP;
                    for b in 0..nb {
                        let blk = &bytes[(r * nb + b) * bb..(r * nb + b + 1) * bb];
                        let unit = &mut grp[b / ty.unit_blocks() * layout.bytes..][..layout.bytes];
                        match ty {
                            PackedType::Q4_K => pack_q4_k(blk, unit, &layout, lane),
                            PackedType::Q5_K => pack_q5_k(blk, unit, &layout, lane),
                            PackedType::Q6_K => pack_q6_k(blk, unit, &layout, lane),
                            _ => pack_legacy(ty, blk, unit, &layout, lane, b % 2),
                        }
                    }
                }
            });
        PackedMatrix {
            ty,
            rows,
            cols,
            nb,
            groups,
            prefetch: PREFETCH,
            layout,
            group_bytes,
            data,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 64
    }

    /// Row `r` in the file's block format again (the inverse of packing).
    pub fn row_blocks(&self, r: usize, out: &mut [u8]) {
        let ty = self.ty;
        let bb = ty.block_bytes();
        assert_eq!(out.len(), self.nb * bb, "row_blocks: output length");
        let (g, lane) = (r / GROUP, r % GROUP);
        let grp = &lines(&self.data)[g * self.group_bytes..][..self.group_bytes];
        let l = &self.layout;
        for b in 0..self.nb {
            let blk = &mut out[b * bb..(b + 1) * bb];
            let unit = &grp[b / ty.unit_blocks() * l.bytes..][..l.bytes];
            match ty {
                PackedType::Q4_K => unpack_q4_k(unit, blk, l, lane),
                PackedType::Q5_K => unpack_q5_k(unit, blk, l, lane),
                PackedType::Q6_K => unpack_q6_k(unit, blk, l, lane),
                _ => unpack_legacy(ty, unit, blk, l, lane, b % 2),
            }
        }
    }

    /// Where group `g` starts (bounds-checked: a pointer into `data`, or panic).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by the x86 kernels
    pub(super) fn group_ptr(&self, g: usize) -> *const u8 {
        lines(&self.data)[g * self.group_bytes..].as_ptr()
    }

    /// Panics unless the public fields still describe `data`. The kernels read `data` through
    /// raw pointers at offsets computed from them, so a field changed after packing must not
    /// reach them.
    pub(super) fn check_layout(&self) {
        let ty = self.ty;
        assert!(
            self.layout == Layout::of(ty)
                && self.groups == self.rows.div_ceil(GROUP)
                && self.group_bytes == self.nb.div_ceil(ty.unit_blocks()) * self.layout.bytes
                && self.data.len() * 64 == self.groups * self.group_bytes,
            "packed matrix: {ty:?}, {} rows, {} blocks per row and {} groups do not match the \
             {} bytes packed",
            self.rows,
            self.nb,
            self.groups,
            self.data.len() * 64
        );
    }
}

/// Ask for `line` to be brought into the cache (`prefetcht0`; nothing on other CPUs). The
/// `breakdown` example's bandwidth probe reads memory with it, as the kernels read weights.
#[inline]
pub fn prefetch_line(line: &Line) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and never faults; `line` is a valid reference anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            line.0.as_ptr() as *const i8
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = line;
}

/// `n` zeroed lines. With `huge_pages`, a buffer of 2 MiB or more is first advised as huge-page
/// memory (`ch04::memory::advise_huge_pages`): one TLB entry then covers 2 MiB of weights
/// instead of 4 KiB, and a streaming product stops missing the TLB every 64 lines. The advice
/// is given before the first write, so the pages are huge from the start.
pub fn zeroed_lines(n: usize, huge_pages: bool) -> Vec<Line> {
    let mut v: Vec<Line> = Vec::with_capacity(n);
    if huge_pages {
        ch04::memory::advise_huge_pages(&mut v.spare_capacity_mut()[..n]);
    }
    v.resize(n, Line([0; 64]));
    v
}

fn lines_mut(lines: &mut [Line]) -> &mut [u8] {
    // SAFETY: `Line` is 64 plain bytes with no padding, so the `64 · len` bytes from its start
    // are the lines' own memory, initialised, aligned for u8, and borrowed as long as `lines`.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr() as *mut u8, lines.len() * 64) }
}

fn lines(lines: &[Line]) -> &[u8] {
    // SAFETY: as in `lines_mut`.
    unsafe { std::slice::from_raw_parts(lines.as_ptr() as *const u8, lines.len() * 64) }
}

/// A packed matrix made from a checked `QMatrix`; errors name the tensor.
pub fn pack_checked<S: AsRef<[u8]>>(
    name: &str,
    q: &QMatrix<S>,
) -> Result<Option<PackedMatrix>, LoadError> {
    if let Some(ty) = PackedType::of(q.ty)
        && !q.cols.is_multiple_of(ty.qk())
    {
        return Err(LoadError::Other(format!(
            "tensor {name:?}: {} columns are not a whole number of {} blocks",
            q.cols,
            q.ty.name()
        )));
    }
    Ok(PackedMatrix::pack(q))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::{ActPanels, TILE};

    /// The checks that guard the kernels' raw pointers pass for every matrix and panel the
    /// code itself makes (on any CPU: nothing here runs a kernel).
    #[test]
    fn packed_matrices_and_panels_pass_their_own_checks() {
        for ty in PackedType::ALL {
            let nb = 3;
            let cols = nb * ty.qk();
            for rows in [1, 15, 16, 17, 40] {
                let bytes = vec![0u8; rows * nb * ty.block_bytes()];
                let m = PackedMatrix::pack_as(ty, rows, cols, &bytes, false);
                m.check_layout();
                let gt = GgmlType::ALL
                    .into_iter()
                    .find(|&g| PackedType::of(g) == Some(ty));
                assert_eq!(
                    PackedMatrix::packed_bytes(gt.unwrap(), rows, cols),
                    Some(m.bytes()),
                    "{ty:?}, {rows} rows: the size predicted without packing"
                );
                for g in 0..m.groups {
                    let _ = m.group_ptr(g);
                }
            }
            let mut acts = ActPanels::new();
            for n in [1, 7, 8, 9, 20, 3] {
                acts.resize(n, cols, ty.qk());
                acts.check_sizes();
                for t0 in (0..n).step_by(TILE) {
                    assert_eq!(acts.tile(t0).stride, (n - t0).min(TILE));
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "do not match")]
    fn a_shape_changed_after_packing_is_refused() {
        let ty = PackedType::Q4_0;
        let mut m = PackedMatrix::pack_as(ty, 16, 64, &vec![0u8; 16 * 2 * ty.block_bytes()], false);
        m.rows = 32;
        m.check_layout();
    }
}
