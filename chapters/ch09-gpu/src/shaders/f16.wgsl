// F16: eight consecutive halves, 16 bytes: two per word, the first in the low half.
fn dequant8(row_off: u32, u: u32) -> W8 {
    let i = (row_off + 16u * u) >> 2u;
    let lo = vec4<f32>(unpack2x16float(weights[i]), unpack2x16float(weights[i + 1u]));
    let hi = vec4<f32>(unpack2x16float(weights[i + 2u]), unpack2x16float(weights[i + 3u]));
    return W8(lo, hi, 8u * u, 8u * u + 4u);
}
