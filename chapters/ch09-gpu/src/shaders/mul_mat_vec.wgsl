// ggml's mul_mat_vec: y = x Wᵀ for one token (decoding). A workgroup of 64 threads takes
// eight weight rows, 8 threads to a row: they walk the row's groups of eight weights in turn,
// dequantize each, multiply it by the token's activations, and add up their 8 partial sums at
// the end. Each weight is read once; with one token that read is all the work there is. Grid:
// x (and y) the rows, z the token.
struct Params {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    count: u32, // rows of x: the batch's tokens (0) or the rows whose logits are wanted (1)
}
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> x: array<f32>; // (n, cols)
@group(0) @binding(4) var<storage, read_write> y: array<f32>; // (n, rows)

const TPR: u32 = 8u; // threads per row
const RPW: u32 = 8u; // rows per workgroup
var<workgroup> partial: array<f32, 64>; // (RPW, TPR)

fn x4(i: u32) -> vec4<f32> {
    return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
}

// ANCHOR: mul_mat_vec
@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let lane = tid % TPR;
    let row = group_index(wid, nwg) * RPW + tid / TPR;
    let xb = wid.z * p.cols; // this token's activations
    var acc = 0.0;
    if row < p.rows {
        for (var u = lane; u < p.cols / 8u; u += TPR) {
            let w = dequant8(row * p.row_bytes, u);
            acc += dot(w.lo, x4(xb + w.c_lo)) + dot(w.hi, x4(xb + w.c_hi));
        }
    }
    partial[tid] = acc;
    workgroupBarrier();
    // Tree reduction within each row's 8 threads: 4 add pairs, then 2, then 1.
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if lane < s {
            partial[tid] += partial[tid + s];
        }
        workgroupBarrier();
    }
    if lane == 0u && row < p.rows && wid.z < rows_of(p.count) {
        y[wid.z * p.rows + row] = partial[tid];
    }
}
// ANCHOR_END: mul_mat_vec
