// Prepended to the kernels that read weights: the weights as the file stores them, and how to
// read their bytes. WGSL has no 8- or 16-bit storage types without extensions, so a tensor is
// an array of u32 words and a value is cut out of the word (or two words) that holds it: a
// Q4_0 block is 18 bytes and a Q8_0 block 34, so most blocks do not start on a word.
@group(0) @binding(2) var<storage, read> weights: array<u32>;

// ANCHOR: w8
// Eight weights of a row, dequantized: `lo` are columns c_lo..c_lo+3, `hi` c_hi..c_hi+3. Every
// type's `dequant8(row_off, u)` returns the u-th group of eight of the row that starts at byte
// `row_off`; the eight columns always lie in the 64 columns from 64 * (u / 8).
struct W8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
    c_lo: u32,
    c_hi: u32,
}
// ANCHOR_END: w8

// ANCHOR: bytes
fn byte_at(off: u32) -> u32 {
    return (weights[off >> 2u] >> ((off & 3u) * 8u)) & 0xffu;
}

// A 16-bit value at an even byte offset: it never straddles two words.
fn u16_at(off: u32) -> u32 {
    return (weights[off >> 2u] >> ((off & 3u) * 8u)) & 0xffffu;
}

fn f16_at(off: u32) -> f32 {
    return unpack2x16float(u16_at(off)).x;
}

// Four bytes at any offset: one word, or the high part of one and the low part of the next.
// Buffers are padded to whole words, so the next word exists whenever the bytes do.
fn u32_at(off: u32) -> u32 {
    let i = off >> 2u;
    let s = (off & 3u) * 8u;
    if s == 0u {
        return weights[i];
    }
    return (weights[i] >> s) | (weights[i + 1u] << (32u - s));
}
// ANCHOR_END: bytes

// The low nibbles of the four bytes of `q`, and the high ones.
fn nibbles_lo(q: u32) -> vec4<f32> {
    let b = vec4<u32>(q, q >> 8u, q >> 16u, q >> 24u) & vec4<u32>(15u);
    return vec4<f32>(b);
}

fn nibbles_hi(q: u32) -> vec4<f32> {
    return nibbles_lo(q >> 4u);
}

// The four bytes of `q` as signed 8-bit integers.
fn i8x4(q: u32) -> vec4<f32> {
    let s = bitcast<i32>(q);
    return vec4<f32>(
        f32(extractBits(s, 0u, 8u)),
        f32(extractBits(s, 8u, 8u)),
        f32(extractBits(s, 16u, 8u)),
        f32(extractBits(s, 24u, 8u)),
    );
}
