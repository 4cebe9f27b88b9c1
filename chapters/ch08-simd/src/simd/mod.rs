//! The SIMD versions of chapter 6's scalar kernels, one module per architecture.
//!
//! - [`x86`] (x86-64): AVX2 with FMA and F16C, AVX-512 (F, BW, VL), and AVX-512 VNNI;
//! - [`arm`] (AArch64): NEON, and NEON with the dot-product extension (`sdot`).
//!
//! Every kernel here is compiled for one instruction set with `#[target_feature]`, so calling
//! it on a CPU without that set is undefined behaviour: the functions are unsafe to call from
//! code that does not enable the same features. [`crate::kernels::KernelSet`] is the safe way
//! in: it hands out a kernel only after the CPU said it has the instructions.
//!
//! The kernels keep the contract of chapter 6's table: the same blocks in, the same sum out up
//! to the order of the float additions. Their integer work is exact, so SIMD and scalar differ
//! only in how the per-block float terms are added (see `tests/kernels.rs` for the bound). Two
//! preconditions hold for every activation row a quantizer of chapter 6 or this chapter writes,
//! and the kernels rely on them, as ggml's do:
//! - activation codes (Q8_0, Q8_1, Q8_K) are in `-127..=127`, never `-128`, so that negating
//!   one cannot overflow;
//! - a Q8_K block's `bsums` are the sums of its codes, which the k-quant kernels use in place of
//!   adding the codes again.
//!
//! The activation quantizers give the bytes of the scalar ones exactly, for every input.

// ggml's names, kept so the kernels read beside ggml's: `vec_dot_q4_K_q8_K`, `scales_q3_K`.
#![allow(non_snake_case)]

use ch06::quants::blocks::BlockQ8_0;
use std::ops::Range;

// ANCHOR: f32simd
/// Lane operations on f32 slices, the building blocks of every kernel here. Implemented by
/// [`Portable`](crate::simd_compute::Portable) and, on x86-64, by AVX2 + FMA and by AVX-512
/// (`simd::x86::act`).
///
/// # Safety
/// The methods are unsafe because an implementation may use instructions the CPU must have:
/// call them only from code compiled for, and running on, that instruction set. This is the
/// safety contract of every method, hence no section per method; `scores` and `weighted_sum`
/// add the row lengths their documentation states. Any other lengths are allowed: a method
/// reads and writes only inside the slices it is given.
#[allow(clippy::missing_safety_doc)]
pub trait F32Simd {
    /// `Σ a_i b_i`.
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32;
    /// `y += a·x`.
    unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]);
    /// `y *= a`.
    unsafe fn scale(y: &mut [f32], a: f32);
    /// The largest element (`-inf` for an empty slice).
    unsafe fn max(x: &[f32]) -> f32;
    /// `x_i = e^(x_i - m)` in place; returns the sum. `-inf` elements become 0.
    unsafe fn exp_sum(x: &mut [f32], m: f32) -> f32;
    /// `g_i = silu(g_i)·u_i`.
    unsafe fn silu_mul(g: &mut [f32], u: &[f32]);
    /// `Σ x_i²`.
    unsafe fn sum_squares(x: &[f32]) -> f32;
    /// `out_i = (x_i·s)·w_i`.
    unsafe fn scale_mul(x: &[f32], s: f32, w: &[f32], out: &mut [f32]);
    /// `x += y`.
    unsafe fn add(x: &mut [f32], y: &[f32]);
    // ANCHOR_END: f32simd

    // ANCHOR: f32simd_provided
    /// `s_j = scale·(q · k_j)` for every key row `keys[j]`. Every row must be exactly as long
    /// as `q` (part of the safety contract: a kernel may read `q.len()` values of each).
    #[inline(always)]
    unsafe fn scores(q: &[f32], keys: &[&[f32]], scale: f32, s: &mut [f32]) {
        for (s, k) in s.iter_mut().zip(keys) {
            // SAFETY: forwarded: the caller enables `Self`'s instructions and gives key rows as
            // long as `q` (this method's contract), which is all `dot` needs.
            *s = unsafe { Self::dot(q, k) } * scale;
        }
    }
    /// `out_i` = the little-endian f16 `x[2i..2i + 2]`: a key or value row of an f16 cache.
    /// By default chapter 1's plain loop.
    #[inline(always)]
    unsafe fn f16_to_f32(x: &[u8], out: &mut [f32]) {
        ch01::dequant::dequantize_row_f16(x, out)
    }
    /// `out` = the Q8_0 blocks in `x` (34 bytes each: an f16 scale `d`, 32 codes `q`; value
    /// `d·q`): a key or value row of a Q8_0 cache. By default chapter 1's plain loop.
    #[inline(always)]
    unsafe fn q8_0_to_f32(x: &[u8], out: &mut [f32]) {
        ch01::dequant::dequantize_row_q8_0(x, out)
    }
    /// `acc += Σ_j p_j·v_j` over the value rows `vals[j]`. Every row must be exactly as long as
    /// `acc` (part of the safety contract, as for `scores`).
    #[inline(always)]
    unsafe fn weighted_sum(acc: &mut [f32], p: &[f32], vals: &[&[f32]]) {
        for (&p, v) in p.iter().zip(vals) {
            // SAFETY: forwarded: the caller enables `Self`'s instructions and gives value rows as
            // long as `acc` (this method's contract), which is all `axpy` needs.
            unsafe { Self::axpy(acc, p, v) };
        }
    }
    // ANCHOR_END: f32simd_provided

    // ANCHOR: f32simd_heads
    /// [`F32Simd::scores`] of several query vectors against the same keys: `q` holds them side
    /// by side, `hd` values each (the query heads of one KV head), and query `i`'s scores go to
    /// `s[i·stride..][..keys.len()]`. A kernel may load each key once for all of them; each
    /// query's scores must be the bits `scores` gives it alone.
    #[inline(always)]
    unsafe fn scores_heads(
        q: &[f32],
        hd: usize,
        keys: &[&[f32]],
        scale: f32,
        s: &mut [f32],
        stride: usize,
    ) where
        Self: Sized,
    {
        // SAFETY: forwarded: the caller enables `Self`'s instructions and gives key rows of
        // `hd` values (this method's contract), which is all `scores` needs.
        unsafe { scores_heads_rows::<Self>(q, hd, keys, scale, s, stride) }
    }
    /// [`F32Simd::weighted_sum`] of several accumulators over the same value rows: `acc` holds
    /// them side by side, `hd` values each, and accumulator `i` takes the weights
    /// `p[i·stride..][..vals.len()]`. A kernel may load each value row once for all of them;
    /// each accumulator must get the bits `weighted_sum` gives it alone.
    #[inline(always)]
    unsafe fn weighted_sum_heads(
        acc: &mut [f32],
        hd: usize,
        p: &[f32],
        stride: usize,
        vals: &[&[f32]],
    ) where
        Self: Sized,
    {
        // SAFETY: forwarded: the caller enables `Self`'s instructions and gives value rows of
        // `hd` values (this method's contract), which is all `weighted_sum` needs.
        unsafe { weighted_sum_heads_rows::<Self>(acc, hd, p, stride, vals) }
    }
    // ANCHOR_END: f32simd_heads
    // ANCHOR: f32simd_q8_0
    /// Whether attention's scores against a q8_0 key cache are this set's integer dot products
    /// of the key codes with the query rounded to q8_0 (as llama.cpp computes them), through
    /// [`F32Simd::pack_keys_q8_0`] and [`F32Simd::scores_heads_q8_0`], for heads of `hd`
    /// values. By default they are not, and the keys are decoded to f32 like any other.
    fn keys_q8_0(_hd: usize) -> bool {
        false
    }
    /// A query rounded to q8_0 for [`F32Simd::scores_heads_q8_0`]: the bytes of chapter 6's
    /// `quantize_row_q8_0`, which is the default.
    #[inline(always)]
    unsafe fn quantize_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
        ch06::quants::quantize_row_q8_0(x, y)
    }
    /// The q8_0 key rows `keys` (this KV head's blocks of each, `hd / 32` of 34 bytes; at most
    /// [`KEYS_Q8_0`] rows) laid out for [`F32Simd::scores_heads_q8_0`]: in `kt`, for each block
    /// of 16 keys and each group `t` of 4 values, 64 bytes holding those 4 codes of each of the
    /// 16 keys, each code plus 128 (as an unsigned byte); in `dk`, `(hd / 32, KEYS_Q8_0)`, each
    /// key's block scales in f32. By default plain loops ([`pack_keys_q8_0_rows`]).
    #[inline(always)]
    unsafe fn pack_keys_q8_0(keys: &[&[u8]], hd: usize, kt: &mut [u8], dk: &mut [f32]) {
        pack_keys_q8_0_rows(keys, hd, kt, dk)
    }
    /// The scores of the query vectors `q` (side by side, `hd / 32` q8_0 blocks each) against
    /// keys `keys` of a tile packed by [`F32Simd::pack_keys_q8_0`]: query `i`'s score of key `j`
    /// goes to `s[i·stride + j]`, computed as [`score_q8_0`] computes it. Other entries of `s` up
    /// to `i·stride + KEYS_Q8_0` may be written. By default a key at a time
    /// ([`scores_heads_q8_0_rows`]).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn scores_heads_q8_0(
        q: &[BlockQ8_0],
        hd: usize,
        kt: &[u8],
        dk: &[f32],
        keys: Range<usize>,
        scale: f32,
        s: &mut [f32],
        stride: usize,
    ) where
        Self: Sized,
    {
        scores_heads_q8_0_rows(q, hd, kt, dk, keys, scale, s, stride)
    }
    // ANCHOR_END: f32simd_q8_0
    /// Whether [`F32Simd::scores_heads_f16`] and [`F32Simd::weighted_sum_heads_f16`] are kernels
    /// of this set's own for groups of `group` heads of `hd` values, which attention then uses
    /// on an f16 cache instead of decoding its rows first. By default they are not.
    fn heads_f16(_hd: usize, _group: usize) -> bool {
        false
    }
    /// [`F32Simd::scores_heads`] over key rows of little-endian f16 (`2·hd` bytes each),
    /// converted as they are loaded: a set's own kernel must give each query the bits its
    /// `scores` gives against the rows decoded. The default ([`scores_heads_f16_rows`]) decodes
    /// each row and takes `dot` of it: correct, but no faster than decoding the tile, and not
    /// those bits; attention calls it only where `heads_f16` says a set has its own.
    #[inline(always)]
    unsafe fn scores_heads_f16(
        q: &[f32],
        hd: usize,
        keys: &[&[u8]],
        scale: f32,
        s: &mut [f32],
        stride: usize,
    ) where
        Self: Sized,
    {
        // SAFETY: forwarded: the caller enables `Self`'s instructions.
        unsafe { scores_heads_f16_rows::<Self>(q, hd, keys, scale, s, stride) }
    }
    /// [`F32Simd::weighted_sum_heads`] over value rows of little-endian f16, converted as they
    /// are loaded: a set's own kernel must give each accumulator the bits its `weighted_sum`
    /// gives against the rows decoded. The default ([`weighted_sum_heads_f16_rows`]) decodes
    /// each row and takes `axpy` of it, as `scores_heads_f16`'s does.
    #[inline(always)]
    unsafe fn weighted_sum_heads_f16(
        acc: &mut [f32],
        hd: usize,
        p: &[f32],
        stride: usize,
        vals: &[&[u8]],
    ) where
        Self: Sized,
    {
        // SAFETY: forwarded: the caller enables `Self`'s instructions.
        unsafe { weighted_sum_heads_f16_rows::<Self>(acc, hd, p, stride, vals) }
    }
}

/// The keys a tile packed for [`F32Simd::scores_heads_q8_0`] holds: two blocks of 16.
pub const KEYS_Q8_0: usize = 32;

/// The bytes of [`F32Simd::pack_keys_q8_0`]'s `kt` for heads of `hd` values: `hd` per key.
pub const fn packed_q8_0_bytes(hd: usize) -> usize {
    KEYS_Q8_0 * hd
}

/// Where the 4 codes of group `t` of key `j` lie in a packed tile of `hd`-value keys.
#[inline(always)]
fn packed_at(hd: usize, j: usize, t: usize) -> usize {
    ((j / 16) * (hd / 4) + t) * 64 + (j % 16) * 4
}

// ANCHOR: score_q8_0
/// One score against a q8_0 key, as every kernel of [`F32Simd::scores_heads_q8_0`] computes
/// it: per block `b`, the integer dot product `isum_b` of the codes (exact), then in f32
/// `((isum_0·(dk_0·dq_0)) + isum_1·(dk_1·dq_1) + …)·scale`, each later block added with one
/// fused multiply-add. The same operations in the same order in every kernel give the same
/// bits, so that a query's scores are the same in a decode step and in a prompt.
#[inline(always)]
pub fn score_q8_0(isum: impl Iterator<Item = (i32, f32, f32)>, scale: f32) -> f32 {
    let mut s = 0.0f32;
    for (b, (i, dk, dq)) in isum.enumerate() {
        s = if b == 0 {
            i as f32 * (dk * dq)
        } else {
            (i as f32).mul_add(dk * dq, s)
        };
    }
    s * scale
}
// ANCHOR_END: score_q8_0

/// [`F32Simd::pack_keys_q8_0`] as plain loops.
pub fn pack_keys_q8_0_rows(keys: &[&[u8]], hd: usize, kt: &mut [u8], dk: &mut [f32]) {
    let nb = hd / 32;
    assert!(hd.is_multiple_of(32) && keys.len() <= KEYS_Q8_0);
    assert!(kt.len() >= packed_q8_0_bytes(hd) && dk.len() >= nb * KEYS_Q8_0);
    for (j, k) in keys.iter().enumerate() {
        for b in 0..nb {
            let block = &k[b * 34..(b + 1) * 34];
            dk[b * KEYS_Q8_0 + j] = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
            for (i, &c) in block[2..].iter().enumerate() {
                let d = b * 32 + i;
                kt[packed_at(hd, j, d / 4) + d % 4] = c ^ 0x80;
            }
        }
    }
}

/// [`F32Simd::scores_heads_q8_0`] a key and a query at a time.
#[allow(clippy::too_many_arguments)]
pub fn scores_heads_q8_0_rows(
    q: &[BlockQ8_0],
    hd: usize,
    kt: &[u8],
    dk: &[f32],
    keys: Range<usize>,
    scale: f32,
    s: &mut [f32],
    stride: usize,
) {
    let nb = hd / 32;
    for j in keys {
        for (g, q) in q.chunks_exact(nb).enumerate() {
            let isum = q.iter().enumerate().map(|(b, qb)| {
                let mut i = 0i32;
                for (n, &c) in qb.qs.iter().enumerate() {
                    let d = b * 32 + n;
                    let k = kt[packed_at(hd, j, d / 4) + d % 4] as i32 - 128;
                    i += k * c as i32;
                }
                (i, dk[b * KEYS_Q8_0 + j], qb.d.to_f32())
            });
            s[g * stride + j] = score_q8_0(isum, scale);
        }
    }
}

/// [`F32Simd::scores_heads`] a head at a time: one `scores` call per query.
///
/// # Safety
/// `S`'s instructions are available; every key row holds `hd` values.
#[inline(always)]
pub unsafe fn scores_heads_rows<S: F32Simd>(
    q: &[f32],
    hd: usize,
    keys: &[&[f32]],
    scale: f32,
    s: &mut [f32],
    stride: usize,
) {
    for (i, q) in q.chunks_exact(hd).enumerate() {
        // SAFETY: the caller's contract is all `scores` needs.
        unsafe { S::scores(q, keys, scale, &mut s[i * stride..i * stride + keys.len()]) };
    }
}

/// [`F32Simd::weighted_sum_heads`] a head at a time: one `weighted_sum` call per accumulator.
///
/// # Safety
/// `S`'s instructions are available; every value row holds `hd` values.
#[inline(always)]
pub unsafe fn weighted_sum_heads_rows<S: F32Simd>(
    acc: &mut [f32],
    hd: usize,
    p: &[f32],
    stride: usize,
    vals: &[&[f32]],
) {
    for (i, a) in acc.chunks_exact_mut(hd).enumerate() {
        // SAFETY: the caller's contract is all `weighted_sum` needs.
        unsafe { S::weighted_sum(a, &p[i * stride..i * stride + vals.len()], vals) };
    }
}

/// [`F32Simd::scores_heads_f16`] a row at a time: each f16 key row decoded (256 values at a
/// time) and taken `dot` of, for each query.
///
/// # Safety
/// `S`'s instructions are available.
#[inline(always)]
pub unsafe fn scores_heads_f16_rows<S: F32Simd>(
    q: &[f32],
    hd: usize,
    keys: &[&[u8]],
    scale: f32,
    s: &mut [f32],
    stride: usize,
) {
    let mut buf = [0f32; 256];
    for (j, k) in keys.iter().enumerate() {
        for (g, q) in q.chunks_exact(hd).enumerate() {
            let mut dot = 0.0;
            for (k, q) in k.chunks(512).zip(q.chunks(256)) {
                let b = &mut buf[..q.len()];
                // SAFETY: the caller enables `S`'s instructions; the decoder and `dot` stay
                // inside their slices.
                unsafe {
                    S::f16_to_f32(k, b);
                    dot += S::dot(q, b);
                }
            }
            s[g * stride + j] = dot * scale;
        }
    }
}

/// [`F32Simd::weighted_sum_heads_f16`] a row at a time: each f16 value row decoded (256
/// values at a time) and added with `axpy`, for each accumulator.
///
/// # Safety
/// `S`'s instructions are available.
#[inline(always)]
pub unsafe fn weighted_sum_heads_f16_rows<S: F32Simd>(
    acc: &mut [f32],
    hd: usize,
    p: &[f32],
    stride: usize,
    vals: &[&[u8]],
) {
    let mut buf = [0f32; 256];
    for (j, v) in vals.iter().enumerate() {
        for (g, a) in acc.chunks_exact_mut(hd).enumerate() {
            for (v, a) in v.chunks(512).zip(a.chunks_mut(256)) {
                let b = &mut buf[..a.len()];
                // SAFETY: the caller enables `S`'s instructions; the decoder and `axpy` stay
                // inside their slices.
                unsafe {
                    S::f16_to_f32(v, b);
                    S::axpy(a, p[g * stride + j], b);
                }
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
pub mod arm;
#[cfg(target_arch = "x86_64")]
pub mod x86;

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K/Q5_K block, one per byte (scale or min
/// `j` in byte `j`), unpacked four at a time with 32-bit masks rather than one by one as
/// chapter 6's `get_scale_min_k4` does.
#[inline(always)]
pub(crate) fn scales_mins_k4(q: &[u8; 12]) -> (u64, u64) {
    let word = |i: usize| u32::from_le_bytes([q[i], q[i + 1], q[i + 2], q[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    // Scales and mins 0..4 are the low six bits of bytes 0..4 and 4..8; 4..8 keep their low
    // four bits in bytes 8..12 and their top two in the spare top bits of bytes 0..8.
    let scales_lo = a & 0x3f3f_3f3f;
    let mins_lo = b & 0x3f3f_3f3f;
    let scales_hi = (c & 0x0f0f_0f0f) | (((a >> 6) & 0x0303_0303) << 4);
    let mins_hi = ((c >> 4) & 0x0f0f_0f0f) | (((b >> 6) & 0x0303_0303) << 4);
    (
        scales_lo as u64 | (scales_hi as u64) << 32,
        mins_lo as u64 | (mins_hi as u64) << 32,
    )
}

/// The sixteen 6-bit scales of a Q3_K block, one per byte as four little-endian words, each
/// still offset by 32 (`scale + 32`, in `0..64`): low four bits from the nibbles of bytes
/// 0..8, top two from bytes 8..12, four bit pairs per byte.
#[inline(always)]
pub(crate) fn scales_q3_K(q: &[u8; 12]) -> [u32; 4] {
    let word = |i: usize| u32::from_le_bytes([q[i], q[i + 1], q[i + 2], q[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    [
        (a & 0x0f0f_0f0f) | ((c & 0x0303_0303) << 4),
        (b & 0x0f0f_0f0f) | (((c >> 2) & 0x0303_0303) << 4),
        ((a >> 4) & 0x0f0f_0f0f) | (((c >> 4) & 0x0303_0303) << 4),
        ((b >> 4) & 0x0f0f_0f0f) | (((c >> 6) & 0x0303_0303) << 4),
    ]
}

/// The first element of `x` whose magnitude is `amax` (one of them is): Q8_K's scale takes the
/// sign of the first element of largest magnitude.
#[inline(always)]
fn first_with_abs(x: &[f32], amax: f32) -> f32 {
    x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ch06::quants::k_quants::q3_K_scale;
    use ch06::quants::search::get_scale_min_k4;

    #[test]
    fn scale_unpacking_matches_chapter_6() {
        // Every byte value in every position, in a few hundred pseudo-random blocks.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..500 {
            let mut q = [0u8; 12];
            for b in q.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *b = state as u8;
            }
            let (scales, mins) = scales_mins_k4(&q);
            for j in 0..8 {
                let (sc, m) = get_scale_min_k4(j, &q);
                assert_eq!((scales >> (8 * j)) as u8, sc, "scale {j} of {q:?}");
                assert_eq!((mins >> (8 * j)) as u8, m, "min {j} of {q:?}");
            }
            let s3 = scales_q3_K(&q);
            for j in 0..16 {
                let byte = s3[j / 4].to_le_bytes()[j % 4];
                assert_eq!(
                    byte as i32 - 32,
                    q3_K_scale(&q, j),
                    "Q3_K scale {j} of {q:?}"
                );
            }
        }
    }
}
