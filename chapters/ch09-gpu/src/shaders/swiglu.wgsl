// ggml's swiglu, in place: gate = silu(gate) * up, one thread per element.
struct Params {
    width: u32, // n_ff
}
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> gate: array<f32>; // (n, n_ff)
@group(0) @binding(3) var<storage, read> up: array<f32>; // (n, n_ff)

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
    let v = gate[g];
    gate[g] = v / (1.0 + exp(-v)) * up[g];
}
