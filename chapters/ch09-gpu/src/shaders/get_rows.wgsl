// ggml's get_rows: the embedding lookup. Row ids[t] of the weights, dequantized, becomes row t
// of the output; one thread per group of eight weights.
struct Params {
    cols: u32,
    row_bytes: u32,
}
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> ids: array<u32>; // (n)
@group(0) @binding(4) var<storage, read_write> out: array<f32>; // (n, cols)

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = group_index(wid, nwg) * 64u + lid;
    let units = p.cols / 8u;
    let t = g / units;
    if t >= step.n_tokens {
        return;
    }
    let w = dequant8(ids[t] * p.row_bytes, g % units);
    let o = t * p.cols;
    out[o + w.c_lo] = w.lo.x;
    out[o + w.c_lo + 1u] = w.lo.y;
    out[o + w.c_lo + 2u] = w.lo.z;
    out[o + w.c_lo + 3u] = w.lo.w;
    out[o + w.c_hi] = w.hi.x;
    out[o + w.c_hi + 1u] = w.hi.y;
    out[o + w.c_hi + 2u] = w.hi.z;
    out[o + w.c_hi + 3u] = w.hi.w;
}
