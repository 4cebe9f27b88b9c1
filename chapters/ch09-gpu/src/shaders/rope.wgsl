// ggml's rope, in place: one thread per rotated pair of one head of one token. The angles are
// chapter 3's table, uploaded once: `cos_sin` is (n_ctx, n_rot / 2, 2).
struct Params {
    n_heads: u32,
    head_dim: u32,
    n_rot: u32,
    neox: u32, // 0: adjacent pairs (x[2i], x[2i+1]); 1: halves (x[i], x[i + n_rot/2])
}
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> x: array<f32>; // (n, n_heads, head_dim)
@group(0) @binding(3) var<storage, read> cos_sin: array<f32>; // (n_ctx, n_rot / 2, 2)

// ANCHOR: rope
@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let half = p.n_rot / 2u;
    let g = group_index(wid, nwg) * 64u + lid;
    let t = g / (p.n_heads * half);
    if t >= step.n_tokens {
        return;
    }
    let h = (g / half) % p.n_heads;
    let i = g % half;
    let cs = ((step.start_pos + t) * half + i) * 2u;
    let c = cos_sin[cs];
    let s = cos_sin[cs + 1u];
    let base = (t * p.n_heads + h) * p.head_dim;
    var a = base + 2u * i;
    var b = a + 1u;
    if p.neox == 1u {
        a = base + i;
        b = a + half;
    }
    let x0 = x[a];
    let x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}
// ANCHOR_END: rope
