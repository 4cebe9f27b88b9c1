// Q8_0: blocks of 32 weights in 34 bytes (d: f16, then 32 signed bytes), w = d * q. Group k
// of a block is bytes qs[8k..8k+8]: eight consecutive weights.
fn dequant8(row_off: u32, u: u32) -> W8 {
    let b = u / 4u;
    let k = u % 4u;
    let off = row_off + b * 34u;
    let d = f16_at(off);
    let lo = i8x4(u32_at(off + 2u + 8u * k)) * d;
    let hi = i8x4(u32_at(off + 6u + 8u * k)) * d;
    return W8(lo, hi, b * 32u + 8u * k, b * 32u + 8u * k + 4u);
}
