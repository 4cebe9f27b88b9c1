// ANCHOR: dequant
// Q4_0: blocks of 32 weights in 18 bytes (d: f16, then 16 bytes of nibbles), w = d * (q - 8).
// Byte j holds weight j in its low nibble and weight j + 16 in its high one, so group k of a
// block, the four bytes qs[4k..4k+4], holds weights 4k..4k+3 and 16+4k..16+4k+3.
fn dequant8(row_off: u32, u: u32) -> W8 {
    let b = u / 4u;
    let k = u % 4u;
    let off = row_off + b * 18u; // on a word boundary only for even blocks
    let d = f16_at(off);
    let q = u32_at(off + 2u + 4u * k);
    let lo = (nibbles_lo(q) - 8.0) * d;
    let hi = (nibbles_hi(q) - 8.0) * d;
    return W8(lo, hi, b * 32u + 4u * k, b * 32u + 16u + 4u * k);
}
// ANCHOR_END: dequant
