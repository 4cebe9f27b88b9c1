//! The micro-kernels (AVX-512 F, BW and VNNI): one call computes a tile of 16 rows × up to
//! [`TILE`] tokens of a packed product, every weight loaded and unpacked once for all the tile's
//! tokens. One kernel for the 32-weight blocks (a constant picks the type), one for Q4_K and
//! Q5_K, one for Q6_K; [`tile`] picks among them.

use super::panels::Tile;
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
                let sumi = match split {
                    true => _mm512_add_epi32(isum[t], isum2[t]),
                    false => isum[t],
                };
                let y = (*a.d.add(at), *a.sums.add(at), *a.s.add(at));
                acc[t] = _mm512_add_ps(acc[t], block_terms::<T>(sumi, offset, dx, mx, y));
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

// ANCHOR: block_terms
/// One block's term of each of the 16 rows for one token, from the rows' exact integer sums
/// `sumi` of `code · y`: chapter 6's float expression of type `T`, in chapter 6's order.
/// The packed codes are unsigned (`vpdpbusd` multiplies unsigned bytes by signed ones), so a
/// type whose weights are `code − offset` (Q4_0: 8, Q5_0: 16, Q8_0: 128) takes
/// `offset · Σy` off first. `dx` and `mx` are the rows' scales and mins (zero for a type
/// without one); `y` is the token's `(d, Σy, s)` for this block, as the panels hold them.
///
/// # Safety
/// The CPU has AVX-512 F (the caller enables it).
#[inline(always)]
unsafe fn block_terms<const T: u8>(
    sumi: __m512i,
    offset: i32,
    dx: __m512,
    mx: __m512,
    y: (f32, i32, f32),
) -> __m512 {
    // SAFETY: AVX-512 F on registers only, which the caller enables.
    unsafe {
        // ANCHOR: yours_block_terms
        let (dy, sum_y, s) = y;
        let mut sumi = sumi;
        if offset != 0 {
            sumi = _mm512_sub_epi32(sumi, _mm512_set1_epi32(offset * sum_y)); // Σ(q−o)·y
        }
        let (sumi, dy) = (_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(dy));
        match T {
            0 => _mm512_mul_ps(_mm512_mul_ps(sumi, dx), dy), // Q4_0: sumi * dx * dy
            1 | 3 => _mm512_add_ps(
                _mm512_mul_ps(_mm512_mul_ps(dx, dy), sumi), // Q4_1, Q5_1: (dx*dy)*sumi
                _mm512_mul_ps(mx, _mm512_set1_ps(s)),       // + m*s
            ),
            2 => _mm512_mul_ps(_mm512_mul_ps(dx, dy), sumi), // Q5_0: (dx*dy)*sumi
            _ => _mm512_mul_ps(sumi, _mm512_mul_ps(dx, dy)), // Q8_0: sumi*(dx*dy)
        }
        // ANCHOR_END: yours_block_terms
    }
}
// ANCHOR_END: block_terms

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
unsafe fn q6_k<const N: usize>(m: &PackedMatrix, g: usize, a: &Tile, dst: *mut f32, valid: usize) {
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
                let rows = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
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
                let term = _mm512_mul_ps(_mm512_mul_ps(dx, dy), _mm512_sub_ps(total[t], offset));
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
