// Attention of the batch's queries over the layer's KV cache, causal, grouped-query: one
// workgroup per (query head, token). The keys are taken 64 at a time, one per thread, with an
// online softmax (as in ggml's flash_attn_ext): a running maximum m, a running sum l and an
// output accumulator rescaled by e^(m_old - m_new) when the maximum grows, so no score matrix
// is ever stored and a query may see any number of positions.
struct Params {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    window: u32, // sliding window: positions a query sees, itself included (0: all)
    kq_scale: f32,
}
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> q: array<f32>; // (n, n_head, head_dim)
@group(0) @binding(3) var<storage, read> k_cache: array<f32>; // (n_ctx, n_head_kv, head_dim)
@group(0) @binding(4) var<storage, read> v_cache: array<f32>; // (n_ctx, n_head_kv, head_dim)
@group(0) @binding(5) var<storage, read_write> out: array<f32>; // (n, n_head, head_dim)

const WG: u32 = 64u;
const MAX_HEAD_DIM: u32 = 256u; // WG * 4: each thread accumulates up to four output dims
var<workgroup> qs: array<f32, 256>; // (head_dim)
var<workgroup> ps: array<f32, 64>; // this tile's weights e^(s - m)
var<workgroup> red: array<f32, 64>; // reduction scratch

// ANCHOR: attention
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.x;
    let i = wid.y;
    let hd = p.head_dim;
    let kv_dim = p.n_head_kv * hd;
    let kv_off = (h / (p.n_head / p.n_head_kv)) * hd; // this head's KV head
    let pos = step.start_pos + i;
    var lo = 0u;
    if p.window > 0u && pos + 1u > p.window {
        lo = pos + 1u - p.window;
    }
    let hi = pos + 1u; // causal: positions lo..=pos
    for (var d = tid; d < hd; d += WG) {
        qs[d] = q[(i * p.n_head + h) * hd + d];
    }
    workgroupBarrier();
    var m = -1e30;
    var l = 0.0;
    var acc: array<f32, 4>;
    for (var j0 = lo; j0 < hi; j0 += WG) {
        // One score per thread.
        let j = j0 + tid;
        var s = -1e30;
        if j < hi {
            var qk = 0.0;
            for (var d = 0u; d < hd; d++) {
                qk += qs[d] * k_cache[j * kv_dim + kv_off + d];
            }
            s = qk * p.kq_scale;
        }
        // ANCHOR_END: attention
        // ANCHOR: attention_softmax
        red[tid] = s;
        workgroupBarrier();
        for (var k = WG / 2u; k > 0u; k >>= 1u) {
            if tid < k {
                red[tid] = max(red[tid], red[tid + k]);
            }
            workgroupBarrier();
        }
        let m_new = max(m, red[0]);
        workgroupBarrier();
        var e = 0.0;
        if j < hi {
            e = exp(s - m_new);
        }
        ps[tid] = e;
        red[tid] = e;
        workgroupBarrier();
        for (var k = WG / 2u; k > 0u; k >>= 1u) {
            if tid < k {
                red[tid] += red[tid + k];
            }
            workgroupBarrier();
        }
        // Rescale what was accumulated under the old maximum, and add this tile.
        let corr = exp(m - m_new);
        l = l * corr + red[0];
        let nj = min(WG, hi - j0);
        for (var k = 0u; k < 4u; k++) {
            let d = tid + k * WG;
            if d < hd {
                var a = acc[k] * corr;
                for (var jj = 0u; jj < nj; jj++) {
                    a += ps[jj] * v_cache[(j0 + jj) * kv_dim + kv_off + d];
                }
                acc[k] = a;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    for (var k = 0u; k < 4u; k++) {
        let d = tid + k * WG;
        if d < hd {
            out[(i * p.n_head + h) * hd + d] = acc[k] / l;
        }
    }
}
// ANCHOR_END: attention_softmax
