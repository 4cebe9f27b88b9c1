//! The activations' side of a packed product: [`ActPanels`], the tokens quantized once and
//! stored in the order the micro-kernels read them, tile by tile, with each block's scale and
//! code sums unpacked beside the codes.
//!
//! Threads quantize disjoint tokens into the same panels through a [`PanelWriter`].

#[cfg(target_arch = "x86_64")]
use super::vnni_available;
use super::{QK, QK_K, TILE};
use crate::kernels::TypeKernels;
use ch01::GgmlType;

// ANCHOR: panels
/// Activations quantized for a packed product, in the order the micro-kernel reads them.
///
/// Tokens are taken in tiles of [`TILE`] (the last tile may be shorter). Within a tile, for
/// every block `b`, the codes of each token follow each other: `qs[tile][b][t][qk]`. The
/// per-block numbers the kernel needs are unpacked once here, in the same order: the scale `d`
/// as f32, Q8_1's `s`, and the sums of the codes — of the whole block for 32-weight blocks, of
/// each 16 codes (Q8_K's `bsums`) for super-blocks.
pub struct ActPanels {
    pub n: usize,         // tokens
    pub nb: usize,        // blocks per token
    pub(super) qk: usize, // codes per block
    qs: Vec<u8>,          // (n, nb, qk) in tile order
    d: Vec<f32>,          // (n, nb) in tile order
    s: Vec<f32>,          // (n, nb) in tile order, Q8_1 only
    sums: Vec<i32>,       // (n, nb, qk / 16 or 1) in tile order
    row: Vec<u8>,         // one token's blocks, as the quantizer writes them
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
    pub(super) fn tile(&self, t0: usize) -> Tile {
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
    pub(super) fn check_sizes(&self) {
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
pub(super) struct Tile {
    pub(super) qs: *const u8,
    pub(super) d: *const f32,
    pub(super) s: *const f32,
    pub(super) sums: *const i32,
    pub(super) stride: usize,
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

#[cfg(test)]
mod tests {
    use super::*;

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
    #[should_panic(expected = "do not fit")]
    fn panels_claiming_more_tokens_than_they_hold_are_refused() {
        let mut acts = ActPanels::new();
        acts.resize(4, 64, QK);
        acts.n = 5;
        acts.check_sizes();
    }
}
