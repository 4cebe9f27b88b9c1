// F32: eight consecutive floats, 32 bytes.
fn f32x4(i: u32) -> vec4<f32> {
    let w = vec4<u32>(weights[i], weights[i + 1u], weights[i + 2u], weights[i + 3u]);
    return bitcast<vec4<f32>>(w);
}

fn dequant8(row_off: u32, u: u32) -> W8 {
    let i = (row_off + 32u * u) >> 2u;
    return W8(f32x4(i), f32x4(i + 4u), 8u * u, 8u * u + 4u);
}
