// Prepended to every kernel: what changes from one forward call to the next. The host writes
// it once per call (one small upload), and every dispatch of the call reads it, so the
// command list itself can stay the same from call to call.
struct Step {
    n_tokens: u32,  // tokens in this batch
    start_pos: u32, // position of the first of them
    n_out: u32,     // rows whose logits are wanted
    out_row0: u32,  // the first of those rows (they are consecutive: the last one, or all)
}
@group(0) @binding(0) var<uniform> step: Step;

// How many rows a kernel works on: the batch's tokens (0), or the rows whose logits are
// wanted (1).
fn rows_of(count: u32) -> u32 {
    if count == 1u {
        return step.n_out;
    }
    return step.n_tokens;
}

// A workgroup's index in a grid spread over x and y (one dimension holds at most 65535).
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}
