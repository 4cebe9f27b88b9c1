//! Repacking, one weight type at a time: a row's block as the file stores it into its lane of
//! a packed unit (`pack_*`), and back again (`unpack_*`, which [`PackedMatrix::row_blocks`]
//! uses).
//!
//! Each function moves the bytes of one row's block, so the layout of a unit can be read here
//! a field at a time; `tests/gemm.rs` checks that every type round-trips.
//!
//! [`PackedMatrix::row_blocks`]: super::PackedMatrix::row_blocks

use super::QK_K;
use super::packed::{Layout, PackedType};
use ch06::quants::search::get_scale_min_k4;

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

pub(super) fn pack_legacy(
    ty: PackedType,
    blk: &[u8],
    unit: &mut [u8],
    l: &Layout,
    lane: usize,
    h: usize,
) {
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

pub(super) fn unpack_legacy(
    ty: PackedType,
    unit: &[u8],
    blk: &mut [u8],
    l: &Layout,
    lane: usize,
    h: usize,
) {
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
pub(super) fn pack_q4_k(blk: &[u8], unit: &mut [u8], l: &Layout, lane: usize) {
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

pub(super) fn unpack_q4_k(unit: &[u8], blk: &mut [u8], l: &Layout, lane: usize) {
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
pub(super) fn pack_q5_k(blk: &[u8], unit: &mut [u8], l: &Layout, lane: usize) {
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

pub(super) fn unpack_q5_k(unit: &[u8], blk: &mut [u8], l: &Layout, lane: usize) {
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

pub(super) fn pack_q6_k(blk: &[u8], unit: &mut [u8], l: &Layout, lane: usize) {
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

pub(super) fn unpack_q6_k(unit: &[u8], blk: &mut [u8], l: &Layout, lane: usize) {
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
