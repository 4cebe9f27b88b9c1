// ggml's rms_norm (with the multiplication by the norm's weight fused in): one workgroup per
// row. The threads sum squares over strided columns, a tree reduction adds the 64 partial
// sums, and every thread scales its columns.
struct Params {
    d: u32,
    count: u32, // rows: the batch's tokens (0) or the rows whose logits are wanted (1)
    from_out_row: u32, // 1: input row r is row out_row0 + r (the output's rows)
    eps: f32,
}
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>; // (n, d)
@group(0) @binding(3) var<storage, read> weight: array<f32>; // (d)
@group(0) @binding(4) var<storage, read_write> out: array<f32>; // (n, d)

const WG: u32 = 64u;
var<workgroup> red: array<f32, 64>;

// ANCHOR: rms_norm
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let r = wid.x;
    if r >= rows_of(p.count) {
        return;
    }
    let src = (r + select(0u, step.out_row0, p.from_out_row == 1u)) * p.d;
    var s = 0.0;
    for (var i = tid; i < p.d; i += WG) {
        let v = x[src + i];
        s += v * v;
    }
    red[tid] = s;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if tid < k {
            red[tid] += red[tid + k];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(red[0] / f32(p.d) + p.eps);
    for (var i = tid; i < p.d; i += WG) {
        out[r * p.d + i] = (x[src + i] * scale) * weight[i];
    }
}
// ANCHOR_END: rms_norm
