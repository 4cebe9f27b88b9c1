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
//!
//! # The files
//!
//! - `packed.rs`: [`PackedMatrix`], the interleaved layout of 16 rows, and packing a matrix
//!   into it;
//! - `repack.rs`: each weight type's blocks into a packed unit and back, byte by byte;
//! - `panels.rs`: [`ActPanels`], the activations quantized in the order the kernels read them;
//! - `driver.rs`: [`PackedMatrix::gemm_groups`], which walks groups of rows and tiles of tokens
//!   and calls a micro-kernel for each tile;
//! - `avx512.rs` (x86-64): the micro-kernels themselves.

#[cfg(target_arch = "x86_64")]
mod avx512;
mod driver;
mod packed;
mod panels;
mod repack;

pub use driver::OutPtr;
pub use packed::{Line, PackedMatrix, PackedType, pack_checked, prefetch_line, zeroed_lines};
pub use panels::{ActPanels, PanelWriter, block_size};

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
/// 4 KiB page boundary, where the core then waits for memory. Asking ahead keeps the requests
/// going across the boundary. Asking too far ahead measured slower, most likely because the
/// core's few slots for lines in flight then hold lines it needs later, ahead of the ones it
/// needs now. Measured on an 8B model's token, every matrix once, more than any cache holds
/// (`cargo run --release -p ch08 --example prefetch_distance`, an Intel Xeon, 1 and 2
/// threads): 1–2 KiB ahead is the best; 4 KiB and 8 KiB are 14–20 % slower, slower even than
/// not asking at all.
pub const PREFETCH: usize = 2048;
// ANCHOR_END: prefetch

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
