//! Quantized matrix products that load each weight once per tile of tokens: row interleaving
//! and AVX-512 VNNI micro-kernels.
//!
//! # Why a different layout
//!
//! Chapter 6's product takes one weight row and one activation row at a time and reduces 32
//! products to one number per block. A SIMD register of 16 lanes then holds 16 partial sums of
//! the *same* row, which must be added across lanes (a horizontal sum) before the block's scale
//! can be applied, and a weight block is unpacked again for every token.
//!
//! Here 16 rows are interleaved ([`GROUP`]): for each block, the packed weights hold 4 bytes of
//! row 0, 4 bytes of row 1, …, 4 bytes of row 15 side by side, 64 bytes that fill a register.
//! One `vpdpbusd` multiplies them by the same 4 activation bytes broadcast to all lanes and adds
//! each lane's four products into that lane's 32-bit sum: lane `r` accumulates row `r`. After
//! eight of them (32 weights) each lane holds its row's integer block sum; the scales of the 16
//! rows are a vector too, so the block is finished with a few vector multiplies and no
//! horizontal sum at all. The unpacked weights stay in registers while up to [`TILE`] tokens
//! use them: the micro-kernel computes a 16-row × N-token tile.
//!
//! # Same bits as the scalar reference (32-weight blocks)
//!
//! For Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 each lane performs exactly the operations of chapter 6's
//! `vec_dot_*` for its row, in the same order: an exact integer block sum, then the block's
//! float expression, then `sumf +=`. `vpdpbusd` multiplies unsigned by signed bytes, so codes
//! are kept unsigned (Q8_0's are shifted by 128 at packing time) and the offset is taken off in
//! integers, `Σ(q - o)·y = Σq·y - o·Σy`, with `Σy` computed once per activation block. So these
//! products are bit-identical to chapter 6's, for any number of tokens and threads.
//!
//! # K-quants
//!
//! Q4_K, Q5_K and Q6_K super-blocks (256 weights) sum their sub-blocks' exact integer products,
//! each times its 6- or 8-bit scale, into one total per row, and apply the float scales once. The
//! total is a float, summed with fused multiply-adds: a convert and an FMA cost less than a 32-bit
//! integer multiply, and every term is an integer below 2^24, so the total is exact too until it
//! passes 2^24. The part of the sum that does not depend on the weights (Q4_K's and Q5_K's mins,
//! Q6_K's offset of 32) is taken once per super-block, in 16-bit pairs (`vpdpwssd`). Chapter 6
//! (like ggml's generic code) instead keeps eight float partial sums per row, one per position
//! modulo 8, and adds them at the end: the same value in exact arithmetic, rounded differently.
//! These kernels therefore agree with the scalar ones to float rounding, like the k-quant SIMD
//! `vec_dot`s of [`crate::kernels`], not bit for bit.

use crate::kernels::TypeKernels;
use ch01::GgmlType;
use ch03::LoadError;
use ch06::qmatrix::QMatrix;
use ch06::quants::search::get_scale_min_k4;
use rayon::prelude::*;

/// Rows interleaved in a packed group: one AVX-512 register of 32-bit lanes.
pub const GROUP: usize = 16;
/// Most tokens one call of the micro-kernel computes: each unpacked weight register is used
/// this many times. Two or three registers per token (float and integer accumulators) plus the
/// weights and scales fit in the 32 vector registers at 8.
pub const TILE: usize = 8;
const QK: usize = 32;
const QK_K: usize = 256;

// ANCHOR: prefetch
/// How far ahead of the block it is reading a kernel asks for weight lines (`prefetcht0`).
///
/// One token's product reads every weight byte once, in order, so it runs at the speed memory
/// delivers lines to one core. The hardware prefetchers guess that order but stop at every
/// 4 KiB page boundary, where the core then waits for memory. Asking 4 KiB (64 lines) ahead
/// keeps the requests going across the boundary. Measured on a matrix the size of Gemma 3's
/// 178 MB Q8_0 output table (`cargo bench -p ch08 --bench memory`): on huge pages, 1.4–1.6×
/// the speed without it; 2 KiB and 8 KiB measured no better.
pub const PREFETCH: usize = 4096;
// ANCHOR_END: prefetch

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
    fn qs_bytes(self) -> usize {
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
    fn offset(self) -> i32 {
        match self {
            PackedType::Q4_0 => 8,
            PackedType::Q5_0 => 16,
            PackedType::Q8_0 => 128,
            PackedType::Q6_K => 32,
            PackedType::Q4_1 | PackedType::Q5_1 | PackedType::Q4_K | PackedType::Q5_K => 0,
        }
    }

    /// Byte offsets inside a legacy file block: (d, m, qh, qs).
    fn fields(self) -> (usize, Option<usize>, Option<usize>, usize) {
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
struct Layout {
    qh: usize,    // legacy: 2 × 64 bytes of fifth-bit masks
    d: usize,     // the rows' f16 scales (legacy: of both blocks)
    m: usize,     // legacy mins, or Q4_K's dmin
    sc: usize,    // k-quants: sub-block scales, one byte per row
    mn: usize,    // Q4_K: sub-block mins, two bytes (sub-blocks 2p, 2p + 1) per row and pair
    bytes: usize, // the whole unit
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
    layout: Layout,
    group_bytes: usize,
    data: Vec<Line>, // (groups, group_bytes / 64)
}
// ANCHOR_END: packed

/// True when this CPU can run the micro-kernels.
pub fn vnni_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Where the four bytes `i` of 4-byte chunk `c` of row `lane` go in a chunked part.
fn chunk_at(c: usize, lane: usize, i: usize) -> usize {
    64 * c + 4 * lane + i
}

/// The inverse of [`get_scale_min_k4`]: 8 scales and 8 mins of 6 bits into 12 bytes. Every
/// bit of the 12 bytes holds one bit of the 16 values, so this round-trips any bytes.
fn pack_scale_min_k4(sc: &[u8; 8], mn: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            q[j] |= sc[j] & 63;
            q[j + 4] |= mn[j] & 63;
        } else {
            q[j + 4] = (sc[j] & 0xF) | ((mn[j] & 0xF) << 4);
            q[j - 4] |= (sc[j] >> 4) << 6;
            q[j] |= (mn[j] >> 4) << 6;
        }
    }
    q
}

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
    fn group_ptr(&self, g: usize) -> *const u8 {
        lines(&self.data)[g * self.group_bytes..].as_ptr()
    }

    /// Panics unless the public fields still describe `data`. The kernels read `data` through
    /// raw pointers at offsets computed from them, so a field changed after packing must not
    /// reach them.
    fn check_layout(&self) {
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
/// memory (`shared::memory::advise_huge_pages`): one TLB entry then covers 2 MiB of weights
/// instead of 4 KiB, and a streaming product stops missing the TLB every 64 lines. The advice
/// is given before the first write, so the pages are huge from the start.
pub fn zeroed_lines(n: usize, huge_pages: bool) -> Vec<Line> {
    let mut v: Vec<Line> = Vec::with_capacity(n);
    if huge_pages {
        shared::memory::advise_huge_pages(&mut v.spare_capacity_mut()[..n]);
    }
    v.resize(n, Line([0; 64]));
    v
}

fn pack_legacy(ty: PackedType, blk: &[u8], unit: &mut [u8], l: &Layout, lane: usize, h: usize) {
    let (fd, fm, fqh, fqs) = ty.fields();
    let d = 32 * h + 2 * lane;
    unit[l.d + d..l.d + d + 2].copy_from_slice(&blk[fd..fd + 2]);
    if let Some(fm) = fm {
        unit[l.m + d..l.m + d + 2].copy_from_slice(&blk[fm..fm + 2]);
    }
    let qs = &mut unit[h * ty.qs_bytes()..(h + 1) * ty.qs_bytes()];
    for c in 0..ty.qs_bytes() / 64 {
        for i in 0..4 {
            let v = blk[fqs + 4 * c + i];
            qs[chunk_at(c, lane, i)] = if ty == PackedType::Q8_0 { v ^ 0x80 } else { v };
        }
    }
    if let Some(fqh) = fqh {
        let qh = u32::from_le_bytes(blk[fqh..fqh + 4].try_into().unwrap());
        for j in 0..8 {
            let at = l.qh + 64 * h + 8 * j;
            let mut mask = u64::from_le_bytes(unit[at..at + 8].try_into().unwrap());
            for i in 0..4 {
                mask |= (((qh >> (4 * j + i)) & 1) as u64) << (4 * lane + i);
            }
            unit[at..at + 8].copy_from_slice(&mask.to_le_bytes());
        }
    }
}

fn unpack_legacy(ty: PackedType, unit: &[u8], blk: &mut [u8], l: &Layout, lane: usize, h: usize) {
    let (fd, fm, fqh, fqs) = ty.fields();
    let d = 32 * h + 2 * lane;
    blk[fd..fd + 2].copy_from_slice(&unit[l.d + d..l.d + d + 2]);
    if let Some(fm) = fm {
        blk[fm..fm + 2].copy_from_slice(&unit[l.m + d..l.m + d + 2]);
    }
    let qs = &unit[h * ty.qs_bytes()..];
    for c in 0..ty.qs_bytes() / 64 {
        for i in 0..4 {
            let v = qs[chunk_at(c, lane, i)];
            blk[fqs + 4 * c + i] = if ty == PackedType::Q8_0 { v ^ 0x80 } else { v };
        }
    }
    if let Some(fqh) = fqh {
        let mut qh = 0u32;
        for j in 0..8 {
            let at = l.qh + 64 * h + 8 * j;
            let mask = u64::from_le_bytes(unit[at..at + 8].try_into().unwrap());
            for i in 0..4 {
                qh |= (((mask >> (4 * lane + i)) & 1) as u32) << (4 * j + i);
            }
        }
        blk[fqh..fqh + 4].copy_from_slice(&qh.to_le_bytes());
    }
}

// BlockQ4_K: d (2), dmin (2), scales (12), qs (128). Nibble byte `32j + l` holds weight
// `64j + l` (low) and `64j + 32 + l` (high): chunk `8j + c` is bytes `32j + 4c..`.
/// Q4_K's fields (d, dmin, scales, then `qs` at byte `qs`) into a unit: shared with Q5_K,
/// whose blocks put their high bits between the scales and `qs`.
fn pack_q4_k(blk: &[u8], unit: &mut [u8], l: &Layout, lane: usize) {
    pack_k4(blk, 16, unit, l, lane);
}

fn pack_k4(blk: &[u8], qs: usize, unit: &mut [u8], l: &Layout, lane: usize) {
    unit[l.d + 2 * lane..][..2].copy_from_slice(&blk[0..2]);
    unit[l.m + 2 * lane..][..2].copy_from_slice(&blk[2..4]);
    let scales: &[u8; 12] = blk[4..16].try_into().unwrap();
    for s in 0..8 {
        let (sc, mn) = get_scale_min_k4(s, scales);
        unit[l.sc + 16 * s + lane] = sc;
        unit[l.mn + 32 * (s / 2) + 2 * lane + s % 2] = mn;
    }
    for c in 0..32 {
        for i in 0..4 {
            unit[chunk_at(c, lane, i)] = blk[qs + 4 * c + i];
        }
    }
}

fn unpack_q4_k(unit: &[u8], blk: &mut [u8], l: &Layout, lane: usize) {
    unpack_k4(unit, blk, 16, l, lane);
}

fn unpack_k4(unit: &[u8], blk: &mut [u8], qs: usize, l: &Layout, lane: usize) {
    blk[0..2].copy_from_slice(&unit[l.d + 2 * lane..][..2]);
    blk[2..4].copy_from_slice(&unit[l.m + 2 * lane..][..2]);
    let sc: [u8; 8] = std::array::from_fn(|s| unit[l.sc + 16 * s + lane]);
    let mn: [u8; 8] = std::array::from_fn(|s| unit[l.mn + 32 * (s / 2) + 2 * lane + s % 2]);
    blk[4..16].copy_from_slice(&pack_scale_min_k4(&sc, &mn));
    for c in 0..32 {
        for i in 0..4 {
            blk[qs + 4 * c + i] = unit[chunk_at(c, lane, i)];
        }
    }
}

// BlockQ5_K: d, dmin, scales (12) as Q4_K's, then qh (32), then qs (128) as Q4_K's. Weight
// `32s + l` of sub-block s has its fifth bit at bit s of `qh[l]`. Packed: Q4_K's unit, and
// for each sub-block s and 4-weight chunk c a 64-bit mask at `qh + 8·(8s + c)` whose bit
// `4r + i` is the fifth bit of weight `32s + 4c + i` of row r (as Q5_0's masks).
fn pack_q5_k(blk: &[u8], unit: &mut [u8], l: &Layout, lane: usize) {
    pack_k4(blk, 48, unit, l, lane);
    for s in 0..8 {
        for c in 0..8 {
            let mask = &mut unit[l.qh + 8 * (8 * s + c)..][..8];
            for i in 0..4 {
                let bit = (blk[16 + 4 * c + i] >> s) & 1;
                let at = 4 * lane + i;
                mask[at / 8] |= bit << (at % 8);
            }
        }
    }
}

fn unpack_q5_k(unit: &[u8], blk: &mut [u8], l: &Layout, lane: usize) {
    unpack_k4(unit, blk, 48, l, lane);
    blk[16..48].fill(0);
    for s in 0..8 {
        for c in 0..8 {
            let mask = &unit[l.qh + 8 * (8 * s + c)..][..8];
            for i in 0..4 {
                let at = 4 * lane + i;
                blk[16 + 4 * c + i] |= ((mask[at / 8] >> (at % 8)) & 1) << s;
            }
        }
    }
}

// BlockQ6_K: ql (128), qh (64), scales (16, i8), d (2). Weight `128h + 32k + l` (k < 4,
// l < 32) has its low four bits in nibble `k / 2` of `ql[64h + 32(k % 2) + l]` and its high two
// bits at bit `2k` of `qh[32h + l]`. The code of weight `e` (unsigned, 0..64) belongs to code
// chunk `c = e / 4`, byte `e % 4`, of sub-block `s = c / 4`; packed, its low four bits are in
// nibble `s % 2` of nibble chunk `4·(s / 2) + c % 4`, and its high two at bit `2·(c % 4)` of
// high-bit chunk `s`.
fn q6_k_code(blk: &[u8], e: usize) -> u8 {
    let (h, k, l) = (e / 128, e % 128 / 32, e % 32);
    let lo = (blk[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
    let hi = (blk[128 + 32 * h + l] >> (2 * k)) & 3;
    lo | (hi << 4)
}

/// Where code `e`'s nibble and high bits are in a Q6_K unit: (nibble byte, shift, high-bit
/// byte, shift).
fn q6_k_at(l: &Layout, lane: usize, e: usize) -> (usize, usize, usize, usize) {
    let (c, i) = (e / 4, e % 4);
    let (s, k) = (c / 4, c % 4);
    let nib = chunk_at(4 * (s / 2) + k, lane, i);
    (nib, 4 * (s % 2), l.qh + chunk_at(s, lane, i), 2 * k)
}

fn pack_q6_k(blk: &[u8], unit: &mut [u8], l: &Layout, lane: usize) {
    for e in 0..QK_K {
        let code = q6_k_code(blk, e);
        let (nib, ns, hb, hs) = q6_k_at(l, lane, e);
        unit[nib] |= (code & 0xF) << ns;
        unit[hb] |= (code >> 4) << hs;
    }
    for s in 0..16 {
        unit[l.sc + 16 * s + lane] = blk[192 + s];
    }
    unit[l.d + 2 * lane..][..2].copy_from_slice(&blk[208..210]);
}

fn unpack_q6_k(unit: &[u8], blk: &mut [u8], l: &Layout, lane: usize) {
    blk[..192].fill(0);
    for e in 0..QK_K {
        let (nib, ns, hb, hs) = q6_k_at(l, lane, e);
        let code = (unit[nib] >> ns) & 0xF | ((unit[hb] >> hs) & 3) << 4;
        let (h, k, i) = (e / 128, e % 128 / 32, e % 32);
        blk[64 * h + 32 * (k % 2) + i] |= (code & 0xF) << (4 * (k / 2));
        blk[128 + 32 * h + i] |= (code >> 4) << (2 * k);
    }
    for s in 0..16 {
        blk[192 + s] = unit[l.sc + 16 * s + lane];
    }
    blk[208..210].copy_from_slice(&unit[l.d + 2 * lane..][..2]);
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

// ANCHOR: panels
/// Activations quantized for a packed product, in the order the micro-kernel reads them.
///
/// Tokens are taken in tiles of [`TILE`] (the last tile may be shorter). Within a tile, for
/// every block `b`, the codes of each token follow each other: `qs[tile][b][t][qk]`. The
/// per-block numbers the kernel needs are unpacked once here, in the same order: the scale `d`
/// as f32, Q8_1's `s`, and the sums of the codes — of the whole block for 32-weight blocks, of
/// each 16 codes (Q8_K's `bsums`) for super-blocks.
pub struct ActPanels {
    pub n: usize,   // tokens
    pub nb: usize,  // blocks per token
    qk: usize,      // codes per block
    qs: Vec<u8>,    // (n, nb, qk) in tile order
    d: Vec<f32>,    // (n, nb) in tile order
    s: Vec<f32>,    // (n, nb) in tile order, Q8_1 only
    sums: Vec<i32>, // (n, nb, qk / 16 or 1) in tile order
    row: Vec<u8>,   // one token's blocks, as the quantizer writes them
}
// ANCHOR_END: panels

impl ActPanels {
    pub fn new() -> ActPanels {
        ActPanels {
            n: 0,
            nb: 0,
            qk: QK,
            qs: Vec::new(),
            d: Vec::new(),
            s: Vec::new(),
            sums: Vec::new(),
            row: Vec::new(),
        }
    }

    fn n_sums(qk: usize) -> usize {
        if qk == QK_K { 16 } else { 1 }
    }

    /// Make room for `n` tokens of `cols` values in blocks of `qk`.
    pub fn resize(&mut self, n: usize, cols: usize, qk: usize) {
        self.n = n;
        self.qk = qk;
        self.nb = cols / qk;
        let nb = self.nb;
        self.qs.resize(n * nb * qk, 0);
        self.d.resize(n * nb, 0.0);
        self.s.resize(n * nb, 0.0);
        self.sums.resize(n * nb * Self::n_sums(qk), 0);
    }

    /// The pointers of the tile that starts at token `t0` (bounds-checked).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by the x86 kernels
    fn tile(&self, t0: usize) -> Tile {
        assert!(t0 < self.n, "tile at token {t0} of {}", self.n);
        let o = t0 * self.nb;
        Tile {
            qs: self.qs[o * self.qk..].as_ptr(),
            d: self.d[o..].as_ptr(),
            s: self.s[o..].as_ptr(),
            sums: self.sums[o * Self::n_sums(self.qk)..].as_ptr(),
            stride: (self.n - t0).min(TILE),
        }
    }

    /// Panics unless the buffers hold `n` tokens of `nb` blocks of `qk`, as the public `n` and
    /// `nb` say: the kernels read them through raw pointers at offsets computed from those.
    fn check_sizes(&self) {
        let blocks = self.n * self.nb;
        assert!(
            self.qs.len() >= blocks * self.qk
                && self.d.len() >= blocks
                && self.s.len() >= blocks
                && self.sums.len() >= blocks * Self::n_sums(self.qk),
            "activation panels: {} tokens of {} blocks of {} do not fit the {} codes held",
            self.n,
            self.nb,
            self.qk,
            self.qs.len()
        );
    }
}

impl Default for ActPanels {
    fn default() -> Self {
        ActPanels::new()
    }
}

/// A tile of activations: `stride` tokens, block-major (see [`ActPanels`]).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // read by the x86 kernels
struct Tile {
    qs: *const u8,
    d: *const f32,
    s: *const f32,
    sums: *const i32,
    stride: usize,
}

/// Raw parts of an [`ActPanels`] that threads fill in for disjoint tokens.
#[derive(Clone, Copy)]
pub struct PanelWriter {
    qs: *mut u8,
    d: *mut f32,
    s: *mut f32,
    sums: *mut i32,
    n: usize,
    nb: usize,
    qk: usize,
}

// SAFETY: a `PanelWriter` is only pointers and sizes; it writes nothing except through the
// unsafe `quantize_token`, whose callers give each token to one thread and keep the panels
// alive and unresized meanwhile.
unsafe impl Send for PanelWriter {}
// SAFETY: as for `Send`: shared between threads, it writes only the disjoint tokens each
// thread is given.
unsafe impl Sync for PanelWriter {}

impl ActPanels {
    pub fn writer(&mut self) -> PanelWriter {
        PanelWriter {
            qs: self.qs.as_mut_ptr(),
            d: self.d.as_mut_ptr(),
            s: self.s.as_mut_ptr(),
            sums: self.sums.as_mut_ptr(),
            n: self.n,
            nb: self.nb,
            qk: self.qk,
        }
    }

    /// Quantize token rows `x` (`(n, cols)`) with `k.quantize_act` into the panels, on this
    /// thread.
    pub fn fill(&mut self, k: &TypeKernels, x: &[f32], cols: usize) {
        let n = x.len() / cols;
        self.resize(n, cols, block_size(k.act_ty));
        let w = self.writer();
        let mut row = std::mem::take(&mut self.row);
        for t in 0..n {
            // SAFETY: one thread, every token once.
            unsafe { w.quantize_token(k, &x[t * cols..(t + 1) * cols], t, &mut row) };
        }
        self.row = row;
    }
}

/// Weights per block of an activation type.
pub fn block_size(act_ty: GgmlType) -> usize {
    if act_ty == GgmlType::Q8_K { QK_K } else { QK }
}

impl PanelWriter {
    /// Quantize token `t`'s activations `x` into the panels; `row` is scratch space.
    ///
    /// # Safety
    /// No other thread may write token `t` at the same time, and the panels must outlive the
    /// call and not be resized meanwhile. (That `t` is one of the panels' tokens, and that
    /// `k`'s activation blocks are the panels' size, is checked.)
    pub unsafe fn quantize_token(&self, k: &TypeKernels, x: &[f32], t: usize, row: &mut Vec<u8>) {
        assert!(
            t < self.n && block_size(k.act_ty) == self.qk,
            "quantize_token: token {t} of {}, {} blocks into panels of {}-value blocks",
            self.n,
            k.act_ty.name(),
            self.qk
        );
        #[cfg(target_arch = "x86_64")]
        if matches!(k.act_ty, GgmlType::Q8_0 | GgmlType::Q8_1) && vnni_available() {
            // The blocks' own quantizer, writing each block's parts straight to its slots:
            // block 0's is `at`, block b's `at + b·nt` (as below).
            let (tile, i) = (t / TILE, t % TILE);
            let nt = (self.n - tile * TILE).min(TILE);
            let at = tile * TILE * self.nb + i;
            // SAFETY: the CPU has AVX-512 (packed kernels need it, `vnni_available`). Slot
            // `at + b·nt` of block b < nb is token t's (as below), inside the panels' `n · nb`
            // blocks of `qk` (= 32, checked above) codes, `d`, `s` and one sum each, and only
            // this thread writes token t.
            unsafe {
                crate::simd::x86::quantize_q8_panel(
                    &x[..self.nb * QK],
                    k.act_ty == GgmlType::Q8_1,
                    self.qs.add(at * QK),
                    self.d.add(at),
                    self.s.add(at),
                    self.sums.add(at),
                    nt,
                );
            }
            return;
        }
        // SAFETY: the caller's promises, forwarded.
        unsafe { self.quantize_token_blocks(k, x, t, row) };
    }

    /// [`PanelWriter::quantize_token`] through the kernel set's own quantizer: the row as the
    /// activation type's blocks, then each block's parts copied to its slots.
    ///
    /// # Safety
    /// As for [`PanelWriter::quantize_token`].
    unsafe fn quantize_token_blocks(
        &self,
        k: &TypeKernels,
        x: &[f32],
        t: usize,
        row: &mut Vec<u8>,
    ) {
        // Byte layouts of BlockQ8_0 (d, qs), BlockQ8_1 (d, s, qs) and BlockQ8_K (d: f32, qs,
        // bsums: i16).
        let (bs, qs_at) = match k.act_ty {
            GgmlType::Q8_1 => (36, 4),
            GgmlType::Q8_K => (292, 4),
            _ => (34, 2),
        };
        row.resize(self.nb * bs, 0);
        (k.quantize_act)(x, row);
        let (tile, i) = (t / TILE, t % TILE);
        let nt = (self.n - tile * TILE).min(TILE);
        let n_sums = ActPanels::n_sums(self.qk);
        for b in 0..self.nb {
            let blk = &row[b * bs..(b + 1) * bs];
            let at = tile * TILE * self.nb + b * nt + i;
            let qs = &blk[qs_at..qs_at + self.qk];
            let f16 = |o: usize| half::f16::from_bits(u16::from_le_bytes([blk[o], blk[o + 1]]));
            // SAFETY: `t < n` and `b < nb` (checked above) put `at` below `n · nb`, and the
            // panels hold `n · nb` blocks of `qk` codes, one `d`, one `s` and `n_sums` sums
            // (`ActPanels::resize`, which the caller promises did not run since); slot `at`
            // belongs to token t, which only this thread writes.
            unsafe {
                std::ptr::copy_nonoverlapping(qs.as_ptr(), self.qs.add(at * self.qk), self.qk);
                let sums = self.sums.add(at * n_sums);
                match k.act_ty {
                    GgmlType::Q8_K => {
                        *self.d.add(at) = f32::from_le_bytes(blk[0..4].try_into().unwrap());
                        for j in 0..16 {
                            let o = 260 + 2 * j;
                            *sums.add(j) = i16::from_le_bytes([blk[o], blk[o + 1]]) as i32;
                        }
                    }
                    _ => {
                        *self.d.add(at) = f16(0).to_f32();
                        if k.act_ty == GgmlType::Q8_1 {
                            *self.s.add(at) = f16(2).to_f32();
                        }
                        *sums = qs.iter().map(|&q| q as i8 as i32).sum();
                    }
                }
            }
        }
    }
}

/// Where a tile's results go: `out[t * ld + row]`.
#[derive(Clone, Copy)]
pub struct OutPtr(pub *mut f32);
// SAFETY: an `OutPtr` is only a pointer; it is written through only by the unsafe
// `gemm_groups`, whose callers give each thread its own rows of a buffer that outlives them.
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`: each thread sharing it writes only its own rows.
unsafe impl Sync for OutPtr {}

impl PackedMatrix {
    /// Rows `groups` (in units of [`GROUP`]) of `out = x Wᵀ` for every token of `acts`:
    /// `out` is `(acts.n, rows)`.
    ///
    /// # Safety
    /// `out` must point to `acts.n * rows` floats, and no other thread may access the rows of
    /// `groups` meanwhile. (That `acts` and `self` are consistent is checked.)
    pub unsafe fn gemm_groups(
        &self,
        acts: &ActPanels,
        groups: std::ops::Range<usize>,
        out: OutPtr,
    ) {
        assert!(
            acts.nb == self.nb && acts.qk == self.ty.qk(),
            "activations have {} blocks of {}, rows {} of {}",
            acts.nb,
            acts.qk,
            self.nb,
            self.ty.qk()
        );
        assert!(groups.end <= self.groups);
        self.check_layout();
        acts.check_sizes();
        #[cfg(target_arch = "x86_64")]
        for g in groups {
            let valid = (self.rows - g * GROUP).min(GROUP);
            for t0 in (0..acts.n).step_by(TILE) {
                let tile = acts.tile(t0);
                // SAFETY: packed matrices exist only where the CPU has AVX-512 F, BW and VNNI
                // (`pack` checks). Group g < groups and the tile of tokens `t0..t0 + stride`
                // are inside `data` and `acts` (checked above). `dst` is token t0's row at
                // column `16g`; the kernel writes `stride` tokens' `valid` columns from it,
                // inside the `acts.n · rows` floats the caller promised, in rows of `groups`
                // that only this thread writes.
                unsafe {
                    let dst = out.0.add(t0 * self.rows + g * GROUP);
                    avx512::tile(self, g, &tile, dst, valid);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (acts, groups, out);
            unreachable!("packed matrices are only built on x86_64");
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// One tile: `a.stride` tokens × the 16 rows of group `g`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW and VNNI; `m`'s layout is consistent and `g < m.groups`; `a` is
    /// a tile of panels with `m.nb` blocks per token; `dst` points to `a.stride` rows of
    /// `m.rows` floats, of which the first `valid <= 16` from `dst` are written.
    pub(super) unsafe fn tile(m: &PackedMatrix, g: usize, a: &Tile, dst: *mut f32, valid: usize) {
        macro_rules! by_n {
            // `by_n!(kernel, n)`, or `by_n!(kernel<T>, n)` for a kernel with a type parameter.
            ($kernel:ident $(<$ty:literal>)?, $n:expr) => {
                match $n {
                    1 => $kernel::<$($ty,)? 1>(m, g, a, dst, valid),
                    2 => $kernel::<$($ty,)? 2>(m, g, a, dst, valid),
                    3 => $kernel::<$($ty,)? 3>(m, g, a, dst, valid),
                    4 => $kernel::<$($ty,)? 4>(m, g, a, dst, valid),
                    5 => $kernel::<$($ty,)? 5>(m, g, a, dst, valid),
                    6 => $kernel::<$($ty,)? 6>(m, g, a, dst, valid),
                    7 => $kernel::<$($ty,)? 7>(m, g, a, dst, valid),
                    _ => $kernel::<$($ty,)? 8>(m, g, a, dst, valid),
                }
            };
        }
        let n = a.stride;
        // SAFETY: forwarded from the caller, who also promised the CPU the features these
        // kernels enable; every kernel gets `N = min(stride, 8)` tokens.
        unsafe {
            match m.ty {
                PackedType::Q4_0 => by_n!(legacy<0>, n),
                PackedType::Q4_1 => by_n!(legacy<1>, n),
                PackedType::Q5_0 => by_n!(legacy<2>, n),
                PackedType::Q5_1 => by_n!(legacy<3>, n),
                PackedType::Q8_0 => by_n!(legacy<4>, n),
                PackedType::Q6_K => by_n!(q6_k, n),
                PackedType::Q4_K => by_n!(q4_k<false>, n),
                PackedType::Q5_K => by_n!(q4_k<true>, n),
            }
        }
    }

    /// Four activation bytes at `p`, in every lane.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; `p` is valid for reading 4 bytes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn bcast(p: *const u8) -> __m512i {
        // SAFETY: the caller's pointer has 4 readable bytes.
        _mm512_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
    }

    // ANCHOR: prefetch_fn
    /// Ask for the lines of group-relative bytes `[from, to)`, `m.prefetch` bytes ahead of
    /// `grp`: called as a kernel walks its group, so that the lines it will read next are on
    /// their way. Groups are stored one after another, so looking past a group's end asks for
    /// the next group's first lines, which the same task usually reads next.
    ///
    /// # Safety
    /// The CPU has AVX-512 F. Any addresses are allowed: a prefetch never faults, and the
    /// pointer is only computed (`wrapping_add`), never read.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn prefetch(m: &PackedMatrix, grp: *const u8, from: usize, to: usize) {
        if m.prefetch == 0 {
            return;
        }
        let mut at = from.saturating_add(m.prefetch) & !63;
        while at < to.saturating_add(m.prefetch) {
            _mm_prefetch::<_MM_HINT_T0>(grp.wrapping_add(at) as *const i8);
            at += 64;
        }
    }
    // ANCHOR_END: prefetch_fn

    /// Store the 16 rows (the first `valid` of them) of token `t`'s results.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; `dst + t·ld` is valid for writing `valid` floats.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store(dst: *mut f32, ld: usize, t: usize, valid: usize, acc: __m512) {
        let mask: __mmask16 = if valid >= 16 {
            0xFFFF
        } else {
            (1u16 << valid) - 1
        };
        // SAFETY: the masked store writes only the first `valid` lanes, which the caller
        // promised are writable at `dst + t·ld`; lanes masked off are not touched (no fault).
        unsafe { _mm512_mask_storeu_ps(dst.add(t * ld), mask, acc) };
    }

    // ANCHOR: kernel
    /// The micro-kernel for 32-weight blocks: 16 rows × `N` tokens, every block of the row.
    /// `T` is the packed type (0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0), a constant so that
    /// each type gets its own code.
    ///
    /// # Safety
    /// As for [`tile`], with `N <= a.stride` and `T` the type of `m`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn legacy<const T: u8, const N: usize>(
        m: &PackedMatrix,
        g: usize,
        a: &Tile,
        dst: *mut f32,
        valid: usize,
    ) {
        let (q8, min, high) = (T == 4, T == 1 || T == 3, T == 2 || T == 3);
        let (l, offset, grp, nt) = (&m.layout, m.ty.offset(), m.group_ptr(g), a.stride);
        let low4 = _mm512_set1_epi8(0x0F);
        let bit4 = _mm512_set1_epi8(0x10);
        let mut acc = [_mm512_setzero_ps(); N]; // (N, 16 rows): sumf of each row and token
        let step = m.group_bytes / m.nb; // a block's share of the group's bytes
        for b in 0..m.nb {
            // SAFETY: the CPU has what this function enables; prefetches never fault.
            unsafe { prefetch(m, grp, b * step, (b + 1) * step) };
            // SAFETY: offsets stay inside the group and the tile (`b < nb`, `t < N <= stride`),
            // laid out as `PackedMatrix` and `ActPanels` describe (the caller's contract). The
            // aligned loads are aligned: units and their parts are whole 64-byte lines of
            // `data` (`Line` is aligned to 64), and `d`/`m` of block h sit 32·h bytes in. The
            // instructions are those this function enables, which the caller promised.
            unsafe {
                let (unit, h) = (grp.add(b / 2 * l.bytes), b % 2);
                let y = |t: usize, k: usize| a.qs.add((b * nt + t) * QK + k);
                // Σ q·y of each row and token. With one or two tokens, a single chain of
                // eight dependent `vpdpbusd`s per block would bound the speed by their
                // latency, so the block is summed in two halves.
                let mut isum = [_mm512_setzero_si512(); N];
                let mut isum2 = [_mm512_setzero_si512(); N];
                let split = N <= 2;
                // ANCHOR_END: kernel
                // ANCHOR: kernel_sums
                if q8 {
                    let qs = unit.add(h * 512);
                    for c in 0..8 {
                        let w = _mm512_load_si512(qs.add(64 * c) as *const _);
                        for t in 0..N {
                            if split && c % 2 == 1 {
                                isum2[t] = _mm512_dpbusd_epi32(isum2[t], w, bcast(y(t, 4 * c)));
                            } else {
                                isum[t] = _mm512_dpbusd_epi32(isum[t], w, bcast(y(t, 4 * c)));
                            }
                        }
                    }
                } else {
                    let qs = unit.add(h * 256);
                    let masks = unit.add(l.qh + 64 * h) as *const u64;
                    for c in 0..4 {
                        let raw = _mm512_load_si512(qs.add(64 * c) as *const _);
                        let mut lo = _mm512_and_si512(raw, low4); // weights 4c..4c+4
                        let mut hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4); // +16
                        if high {
                            lo = _mm512_mask_add_epi8(lo, masks.add(c).read(), lo, bit4);
                            hi = _mm512_mask_add_epi8(hi, masks.add(c + 4).read(), hi, bit4);
                        }
                        for t in 0..N {
                            isum[t] = _mm512_dpbusd_epi32(isum[t], lo, bcast(y(t, 4 * c)));
                            let hy = bcast(y(t, 16 + 4 * c));
                            if split {
                                isum2[t] = _mm512_dpbusd_epi32(isum2[t], hi, hy);
                            } else {
                                isum[t] = _mm512_dpbusd_epi32(isum[t], hi, hy);
                            }
                        }
                    }
                }
                // ANCHOR_END: kernel_sums
                // ANCHOR: kernel_terms
                let dx = _mm512_cvtph_ps(_mm256_load_si256(unit.add(l.d + 32 * h) as *const _));
                let mx = if min {
                    _mm512_cvtph_ps(_mm256_load_si256(unit.add(l.m + 32 * h) as *const _))
                } else {
                    _mm512_setzero_ps()
                };
                for t in 0..N {
                    let at = b * nt + t; // this block's scalars of token t
                    let dy = _mm512_set1_ps(*a.d.add(at));
                    let mut sumi = isum[t];
                    if split {
                        sumi = _mm512_add_epi32(sumi, isum2[t]);
                    }
                    if offset != 0 {
                        sumi = _mm512_sub_epi32(sumi, _mm512_set1_epi32(offset * *a.sums.add(at)));
                    }
                    let sumi = _mm512_cvtepi32_ps(sumi);
                    // Each row's block term, in the order of chapter 6's scalar kernels.
                    let term = match T {
                        0 => _mm512_mul_ps(_mm512_mul_ps(sumi, dx), dy), // sumi * dx * dy
                        1 | 3 => _mm512_add_ps(
                            _mm512_mul_ps(_mm512_mul_ps(dx, dy), sumi), // (dx*dy)*sumi
                            _mm512_mul_ps(mx, _mm512_set1_ps(*a.s.add(at))), // + m*s
                        ),
                        2 => _mm512_mul_ps(_mm512_mul_ps(dx, dy), sumi), // (dx*dy)*sumi
                        _ => _mm512_mul_ps(sumi, _mm512_mul_ps(dx, dy)), // sumi*(dx*dy)
                    };
                    acc[t] = _mm512_add_ps(acc[t], term);
                }
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            // SAFETY: token t < N <= stride has `valid` writable floats at `dst + t·rows` (the
            // caller's contract).
            unsafe { store(dst, m.rows, t, valid, *acc) };
        }
    }
    // ANCHOR_END: kernel_terms

    /// Q4_K (and, with `HIGH`, Q5_K): per super-block and row,
    /// `d·dy·Σ_s sc_s·Σ q·y − dmin·dy·Σ_s mn_s·Σy` over the 8 sub-blocks of 32. Q5_K's codes are
    /// Q4_K's plus 16 where a weight's fifth bit is set, added under the bit's mask as in
    /// `legacy` for Q5_0; the rest is the same.
    ///
    /// Only the first sum is per weight: each sub-block's `Σ q·y` in 32-bit integers, times
    /// its scale in floats (see the module's docs). The second needs each row's 8 mins and
    /// each token's 8 sub-block sums `Σy` (each within ±32·127, so 16 bits): four `vpdpwssd`s
    /// per token and super-block, two sub-blocks each, instead of a 32-bit multiply per
    /// sub-block; and it is taken after the sub-blocks, so the kernel keeps three registers per
    /// token and takes a whole tile of [`TILE`] tokens, each unpacked weight register used by
    /// all of them.
    ///
    /// # Safety
    /// As for [`tile`], with `N <= a.stride` and `m` a Q4_K matrix (a Q5_K matrix if `HIGH`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn q4_k<const HIGH: bool, const N: usize>(
        m: &PackedMatrix,
        g: usize,
        a: &Tile,
        dst: *mut f32,
        valid: usize,
    ) {
        let (l, grp, nt) = (&m.layout, m.group_ptr(g), a.stride);
        let (low4, bit4) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
        let mut acc = [_mm512_setzero_ps(); N]; // (N, 16 rows)
        for b in 0..m.nb {
            // SAFETY: as in `legacy`: offsets inside the group's unit and the tile, and each
            // aligned load at an address aligned for it (code lines at multiples of 64 into
            // the unit, `sc` rows at multiples of 16, `mn` pairs, `d` and `dmin` of 32).
            unsafe {
                let unit = grp.add(b * l.bytes);
                let y = |t: usize, k: usize| a.qs.add((b * nt + t) * QK_K + k);
                let mut total = [_mm512_setzero_ps(); N]; // Σ_s sc_s · Σ q·y
                for s in 0..8 {
                    prefetch(
                        m,
                        grp,
                        b * l.bytes + s * l.bytes / 8,
                        b * l.bytes + (s + 1) * l.bytes / 8,
                    );
                    // Sub-block s: the low (s even) or high (s odd) nibbles of chunks
                    // 8(s/2)..8(s/2)+8; weights 32s + 4c..
                    let mut isum = [_mm512_setzero_si512(); N];
                    for c in 0..8 {
                        let raw = _mm512_load_si512(unit.add(64 * (8 * (s / 2) + c)) as *const _);
                        let mut w = if s % 2 == 0 {
                            _mm512_and_si512(raw, low4)
                        } else {
                            _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4)
                        };
                        if HIGH {
                            // Q5_K: 16 added where the weight's fifth bit is set.
                            let mask = (unit.add(l.qh + 8 * (8 * s + c)) as *const u64).read();
                            w = _mm512_mask_add_epi8(w, mask, w, bit4);
                        }
                        for (t, isum) in isum.iter_mut().enumerate() {
                            *isum = _mm512_dpbusd_epi32(*isum, w, bcast(y(t, 32 * s + 4 * c)));
                        }
                    }
                    let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(
                        unit.add(l.sc + 16 * s) as *const _,
                    )));
                    for t in 0..N {
                        total[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), sc, total[t]);
                    }
                }
                // Each row's mins of sub-blocks 2p and 2p + 1, as two 16-bit halves of a lane.
                let mn: [__m512i; 4] = std::array::from_fn(|p| {
                    _mm512_cvtepu8_epi16(_mm256_load_si256(unit.add(l.mn + 32 * p) as *const _))
                });
                let dx = _mm512_cvtph_ps(_mm256_load_si256(unit.add(l.d) as *const _));
                let dmin = _mm512_cvtph_ps(_mm256_load_si256(unit.add(l.m) as *const _));
                for t in 0..N {
                    let at = b * nt + t;
                    let sums = a.sums.add(at * 16); // Q8_K's bsums: Σy of each half sub-block
                    let mut mins = _mm512_setzero_si512(); // Σ_s mn_s · Σy
                    for (p, mn) in mn.iter().enumerate() {
                        let y0 = *sums.add(4 * p) + *sums.add(4 * p + 1);
                        let y1 = *sums.add(4 * p + 2) + *sums.add(4 * p + 3);
                        let pair = (y0 as u16 as u32 | (y1 as u32) << 16) as i32;
                        mins = _mm512_dpwssd_epi32(mins, *mn, _mm512_set1_epi32(pair));
                    }
                    let dy = _mm512_set1_ps(*a.d.add(at));
                    let plus = _mm512_mul_ps(_mm512_mul_ps(dx, dy), total[t]);
                    let minus = _mm512_mul_ps(_mm512_mul_ps(dmin, dy), _mm512_cvtepi32_ps(mins));
                    acc[t] = _mm512_add_ps(acc[t], _mm512_sub_ps(plus, minus));
                }
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            // SAFETY: token t < N <= stride has `valid` writable floats at `dst + t·rows` (the
            // caller's contract).
            unsafe { store(dst, m.rows, t, valid, *acc) };
        }
    }

    /// Q6_K: per super-block and row, `d·dy·(Σ_s sc_s·Σ q·y − 32·Σ_s sc_s·Σy)` over 16
    /// sub-blocks of 16.
    ///
    /// The codes are stored unsigned (0..64, for `vpdpbusd`), so the `−32` of each is taken
    /// off once per super-block: each row's 16 scales and each token's 16 sums `Σy` (within
    /// ±16·127) are 16-bit pairs, eight `vpdpwssd`s per token, exact. The first sum's scale is
    /// applied in floats, a convert and a fused multiply-add per sub-block and token, where a
    /// 32-bit integer multiply costs twice the convert on the port the products use.
    ///
    /// # Safety
    /// As for [`tile`], with `N <= a.stride` and `m` a Q6_K matrix.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn q6_k<const N: usize>(
        m: &PackedMatrix,
        g: usize,
        a: &Tile,
        dst: *mut f32,
        valid: usize,
    ) {
        let (l, grp, nt) = (&m.layout, m.group_ptr(g), a.stride);
        let (low4, mask30) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        let mut acc = [_mm512_setzero_ps(); N];
        for b in 0..m.nb {
            // SAFETY: as in `legacy`: offsets inside the group's unit and the tile, and each
            // aligned load at an address aligned for it (code lines at multiples of 64 into
            // the unit, `sc` rows at multiples of 16, `d` of 32).
            unsafe {
                let unit = grp.add(b * l.bytes);
                let y = |t: usize, k: usize| a.qs.add((b * nt + t) * QK_K + k);
                let scales = |s: usize| _mm_load_si128(unit.add(l.sc + 16 * s) as *const _);
                let mut total = [_mm512_setzero_ps(); N]; // Σ_s sc_s · Σ q·y
                for s in 0..16 {
                    let part = |s: usize| b * l.bytes + s * l.bytes / 16;
                    prefetch(m, grp, part(s), part(s + 1));
                    let mut isum = [_mm512_setzero_si512(); N];
                    let hb = _mm512_load_si512(unit.add(l.qh + 64 * s) as *const _);
                    for k in 0..4 {
                        let raw = _mm512_load_si512(unit.add(64 * (4 * (s / 2) + k)) as *const _);
                        let nib = if s % 2 == 0 {
                            raw
                        } else {
                            _mm512_srli_epi16(raw, 4)
                        };
                        // The high two bits to bits 4 and 5 (16-bit shifts: what crosses a
                        // byte lands outside those bits and is masked off below).
                        let high = match k {
                            0 => _mm512_slli_epi16(hb, 4),
                            1 => _mm512_slli_epi16(hb, 2),
                            2 => hb,
                            _ => _mm512_srli_epi16(hb, 2),
                        };
                        // (nib & 0x0F) | (high & 0x30): the 6-bit codes of code chunk 4s + k.
                        let w = _mm512_ternarylogic_epi32::<0xF8>(
                            _mm512_and_si512(nib, low4),
                            high,
                            mask30,
                        );
                        let c = 4 * s + k;
                        for (t, isum) in isum.iter_mut().enumerate() {
                            *isum = _mm512_dpbusd_epi32(*isum, w, bcast(y(t, 4 * c)));
                        }
                    }
                    let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scales(s)));
                    for t in 0..N {
                        total[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), sc, total[t]);
                    }
                }
                // Each row's scales of sub-blocks 2p and 2p + 1, as two 16-bit halves of a lane.
                let sc: [__m512i; 8] = std::array::from_fn(|p| {
                    let (lo, hi) = (scales(2 * p), scales(2 * p + 1));
                    let rows =
                        _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
                    _mm512_cvtepi8_epi16(rows)
                });
                let dx = _mm512_cvtph_ps(_mm256_load_si256(unit.add(l.d) as *const _));
                for t in 0..N {
                    let at = b * nt + t;
                    let sums = a.sums.add(at * 16); // Σy of each sub-block
                    let mut offset = _mm512_setzero_si512(); // Σ_s sc_s · Σy
                    for (p, sc) in sc.iter().enumerate() {
                        let (y0, y1) = (*sums.add(2 * p), *sums.add(2 * p + 1));
                        let pair = (y0 as u16 as u32 | (y1 as u32) << 16) as i32;
                        offset = _mm512_dpwssd_epi32(offset, *sc, _mm512_set1_epi32(pair));
                    }
                    let offset = _mm512_cvtepi32_ps(_mm512_slli_epi32(offset, 5)); // × 32
                    let dy = _mm512_set1_ps(*a.d.add(at));
                    let term =
                        _mm512_mul_ps(_mm512_mul_ps(dx, dy), _mm512_sub_ps(total[t], offset));
                    acc[t] = _mm512_add_ps(acc[t], term);
                }
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            // SAFETY: token t < N <= stride has `valid` writable floats at `dst + t·rows` (the
            // caller's contract).
            unsafe { store(dst, m.rows, t, valid, *acc) };
        }
    }
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

    /// Quantizing a token into the panels as the packed products do gives the panels that
    /// chapter 6's scalar quantizer gives, its blocks' parts copied to their slots: every code,
    /// scale, `s` and sum, for rows with zeros, ties, huge values, infinities and NaN, in any
    /// tile position. (With AVX-512 the first path writes the panels directly.)
    #[test]
    fn panels_written_directly_equal_panels_copied_from_blocks() {
        let (set, scalar) = (
            crate::kernels::KernelSet::detect(),
            crate::kernels::KernelSet::SCALAR,
        );
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1] {
            let (k, reference) = (set.get(ty).unwrap(), scalar.get(ty).unwrap());
            let cols = 4 * QK;
            for n in [1, 5, 8, 11] {
                let rows: Vec<f32> = (0..n * cols)
                    .map(|i| match (i / QK) % 8 {
                        0 => 0.0,
                        1 => (next() % 9) as f32 - 4.0 + 0.5, // halves: ties at every scale
                        2 => f32::from_bits(next() as u32 & 0x7F7F_FFFF), // any finite value
                        3 if i % 7 == 0 => f32::INFINITY,
                        4 if i % 5 == 0 => f32::NAN,
                        _ => (next() % 20_001) as f32 / 1000.0 - 10.0,
                    })
                    .collect();
                let (mut direct, mut copied) = (ActPanels::new(), ActPanels::new());
                let mut row = Vec::new();
                for (p, via_blocks) in [(&mut direct, false), (&mut copied, true)] {
                    p.resize(n, cols, QK);
                    let w = p.writer();
                    for t in 0..n {
                        let xt = &rows[t * cols..(t + 1) * cols];
                        // SAFETY: one thread, every token once, the panels just sized.
                        unsafe {
                            if via_blocks {
                                w.quantize_token_blocks(&reference, xt, t, &mut row);
                            } else {
                                w.quantize_token(&k, xt, t, &mut row);
                            }
                        }
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(direct.qs, copied.qs, "{ty:?}, {n} tokens: codes");
                assert_eq!(
                    bits(&direct.d),
                    bits(&copied.d),
                    "{ty:?}, {n} tokens: scales"
                );
                if k.act_ty == GgmlType::Q8_1 {
                    assert_eq!(bits(&direct.s), bits(&copied.s), "{ty:?}, {n} tokens: s");
                }
                assert_eq!(direct.sums, copied.sums, "{ty:?}, {n} tokens: sums");
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

    #[test]
    #[should_panic(expected = "do not fit")]
    fn panels_claiming_more_tokens_than_they_hold_are_refused() {
        let mut acts = ActPanels::new();
        acts.resize(4, 64, QK);
        acts.n = 5;
        acts.check_sizes();
    }
}
