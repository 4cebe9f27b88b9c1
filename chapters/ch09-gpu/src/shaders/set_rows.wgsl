// ggml's set_rows, as llama.cpp stores a batch's keys and values: row t of k and v goes to row
// start_pos + t of the layer's cache.
struct Params {
    width: u32, // n_head_kv * head_dim
}
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> k: array<f32>; // (n, width)
@group(0) @binding(3) var<storage, read> v: array<f32>; // (n, width)
@group(0) @binding(4) var<storage, read_write> k_cache: array<f32>; // (n_ctx, width)
@group(0) @binding(5) var<storage, read_write> v_cache: array<f32>; // (n_ctx, width)

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = group_index(wid, nwg) * 64u + lid;
    if g >= step.n_tokens * p.width {
        return;
    }
    let dst = step.start_pos * p.width + g;
    k_cache[dst] = k[g];
    v_cache[dst] = v[g];
}
