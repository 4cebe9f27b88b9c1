// Q4_K: super-blocks of 256 weights in 144 bytes: d and dmin (f16), 12 bytes of eight 6-bit
// scales and eight 6-bit mins, then 128 bytes of nibbles. Weight 64j + l (l < 32) is the low
// nibble of qs[32j + l] with scale 2j, weight 64j + 32 + l its high nibble with scale 2j + 1;
// w = d * sc * q - dmin * m.

// ggml's `get_scale_min_k4`: scale and min `j` of the 12 bytes at `off`.
fn scale_min_k4(off: u32, j: u32) -> vec2<f32> {
    if j < 4u {
        return vec2<f32>(f32(byte_at(off + j) & 63u), f32(byte_at(off + j + 4u) & 63u));
    }
    let sc = (byte_at(off + j + 4u) & 15u) | ((byte_at(off + j - 4u) >> 6u) << 4u);
    let m = (byte_at(off + j + 4u) >> 4u) | ((byte_at(off + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

fn dequant8(row_off: u32, u: u32) -> W8 {
    let b = u / 32u;
    let w = u % 32u; // word of the 128 bytes of nibbles
    let j = w / 8u; // 64-weight chunk
    let l = 4u * (w % 8u);
    let off = row_off + b * 144u;
    let d = f16_at(off);
    let dmin = f16_at(off + 2u);
    let s1 = scale_min_k4(off + 4u, 2u * j);
    let s2 = scale_min_k4(off + 4u, 2u * j + 1u);
    let q = u32_at(off + 16u + 4u * w);
    let lo = (d * s1.x) * nibbles_lo(q) - dmin * s1.y;
    let hi = (d * s2.x) * nibbles_hi(q) - dmin * s2.y;
    return W8(lo, hi, b * 256u + 64u * j + l, b * 256u + 64u * j + 32u + l);
}
