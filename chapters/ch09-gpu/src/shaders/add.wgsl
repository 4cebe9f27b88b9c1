// ggml's add, in place: the residual connection x += y, one thread per element.
struct Params {
    width: u32,
}
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> x: array<f32>; // (n, width)
@group(0) @binding(3) var<storage, read> y: array<f32>; // (n, width)

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
    x[g] += y[g];
}
