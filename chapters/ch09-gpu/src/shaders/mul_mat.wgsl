// ggml's mul_mat for a batch of tokens (prefill): y = x Wᵀ in tiles. A workgroup computes a
// tile of TM weight rows by TN tokens. It walks the columns TK at a time: its threads
// dequantize the tile's weights (TM rows by TK columns) and load the tokens' activations (TN
// by TK) into workgroup memory, wait for each other, and then each thread multiplies out its
// own 2 rows by 2 tokens from there. Every weight read from memory serves TN tokens, every
// activation TM rows.
struct Params {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    count: u32, // rows of x: the batch's tokens (0) or the rows whose logits are wanted (1)
}
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> x: array<f32>; // (n, cols)
@group(0) @binding(4) var<storage, read_write> y: array<f32>; // (n, rows)

const TM: u32 = 32u;
const TN: u32 = 16u;
const TK: u32 = 64u;
const WG: u32 = 128u; // (TM / 2) x (TN / 2) threads
var<workgroup> ws: array<f32, 2048>; // (TM, TK)
var<workgroup> xs: array<f32, 1024>; // (TN, TK)

// ANCHOR: mul_mat
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let n = rows_of(p.count);
    let r0 = wid.x * TM;
    let t0 = wid.y * TN;
    let tr = tid % (TM / 2u); // this thread's rows: r0 + 2 tr, + 1
    let tt = tid / (TM / 2u); // its tokens: t0 + 2 tt, + 1
    var acc: array<f32, 4>;
    for (var k0 = 0u; k0 < p.cols; k0 += TK) {
        if k0 + TK > p.cols {
            // The last, partial tile: columns past the end must multiply as zeros.
            for (var i = tid; i < TM * TK; i += WG) {
                ws[i] = 0.0;
            }
            workgroupBarrier();
        }
        // TM rows of 8 groups of eight weights: two groups per thread. Rows past the end
        // repeat the last row; their results are not written.
        for (var k = 0u; k < 2u; k++) {
            let i = tid + k * WG;
            let lr = i / 8u;
            let u = k0 / 8u + i % 8u;
            let row = min(r0 + lr, p.rows - 1u);
            if u < p.cols / 8u {
                let w = dequant8(row * p.row_bytes, u);
                let a = lr * TK + w.c_lo - k0;
                let b = lr * TK + w.c_hi - k0;
                ws[a] = w.lo.x;
                ws[a + 1u] = w.lo.y;
                ws[a + 2u] = w.lo.z;
                ws[a + 3u] = w.lo.w;
                ws[b] = w.hi.x;
                ws[b + 1u] = w.hi.y;
                ws[b + 2u] = w.hi.z;
                ws[b + 3u] = w.hi.w;
            }
        }
        // ANCHOR_END: mul_mat
        // ANCHOR: mul_mat_tile
        // TN tokens of TK activations: eight per thread.
        for (var k = 0u; k < 8u; k++) {
            let i = tid + k * WG;
            let t = t0 + i / TK;
            let c = k0 + i % TK;
            var v = 0.0;
            if t < n && c < p.cols {
                v = x[t * p.cols + c];
            }
            xs[i] = v;
        }
        workgroupBarrier();
        for (var c = 0u; c < TK; c++) {
            let w0 = ws[(2u * tr) * TK + c];
            let w1 = ws[(2u * tr + 1u) * TK + c];
            let x0 = xs[(2u * tt) * TK + c];
            let x1 = xs[(2u * tt + 1u) * TK + c];
            acc[0] += w0 * x0;
            acc[1] += w0 * x1;
            acc[2] += w1 * x0;
            acc[3] += w1 * x1;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 2u; i++) {
        for (var j = 0u; j < 2u; j++) {
            let r = r0 + 2u * tr + i;
            let t = t0 + 2u * tt + j;
            if r < p.rows && t < n {
                y[t * p.rows + r] = acc[2u * i + j];
            }
        }
    }
}
// ANCHOR_END: mul_mat_tile
