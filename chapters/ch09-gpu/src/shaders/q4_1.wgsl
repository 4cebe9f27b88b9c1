// Q4_1: blocks of 32 weights in 20 bytes (d: f16, m: f16, then 16 bytes of nibbles laid out as
// in Q4_0), w = d * q + m.
fn dequant8(row_off: u32, u: u32) -> W8 {
    let b = u / 4u;
    let k = u % 4u;
    let off = row_off + b * 20u;
    let d = f16_at(off);
    let m = f16_at(off + 2u);
    let q = u32_at(off + 4u + 4u * k);
    let lo = nibbles_lo(q) * d + m;
    let hi = nibbles_hi(q) * d + m;
    return W8(lo, hi, b * 32u + 4u * k, b * 32u + 16u + 4u * k);
}
