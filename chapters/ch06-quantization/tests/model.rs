//! The model run on quantized weights, against llama.cpp: the original Q4_1 file, and each of
//! llama.cpp's Q8_0, Q4_0, Q4_K_M and Q6_K variants rebuilt in memory by this chapter's
//! quantizer (byte-identical to llama.cpp's files, as `tests/variants.rs` proves).
//!
//! How a quantized model is judged against llama.cpp (KL divergence and mean |Δlogit| of the
//! next-token distribution, teacher-forced greedy tokens that may differ only at near-ties),
//! and why not element-wise: `ch06::agreement`.

use ch01::{GgmlType, GgufFile, TensorInfo};
use ch03::NoObserver;
use ch04::{Batch, Model};
use ch06::agreement::{check_tie_fraction, teacher_forced};
use ch06::{QuantLoader, RequantLoader};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use testkit::refdata::{self, TensorFile};

/// How much larger or smaller than the file the loaded model may be, as a fraction of the
/// file. The model keeps every tensor's bytes as the file stores them; what differs is the
/// file's header (the tokenizer's vocabulary and merges), which the model does not keep, and
/// the model's own bookkeeping (small allocations). Observed: 0.993 of the 98 MB file. The
/// same weights expanded to f32 (`DenseLoader`) measure 5.5 times the file, far outside.
const MODEL_SIZE_OVER_FILE_TOL: f64 = 0.05;

/// Counts the bytes the current thread holds on the heap, so that one test can measure what
/// a model keeps while the other test of this file allocates on its own thread.
struct ThreadBytes;

thread_local! {
    static LIVE_BYTES: Cell<isize> = const { Cell::new(0) };
}

fn add_live(n: isize) {
    // `try_with`: an allocation while the thread's locals are being torn down is not counted.
    let _ = LIVE_BYTES.try_with(|c| c.set(c.get() + n));
}

fn live_bytes() -> isize {
    LIVE_BYTES.with(Cell::get)
}

// SAFETY: every method forwards to the system allocator with the caller's arguments.
unsafe impl GlobalAlloc for ThreadBytes {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add_live(layout.size() as isize);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add_live(-(layout.size() as isize));
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add_live(new_size as isize - layout.size() as isize);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: ThreadBytes = ThreadBytes;

fn model_for(variant: &serde_json::Value, file: &GgufFile, name: &str) -> Model {
    if variant["quantized_here"] != serde_json::Value::Bool(true) {
        return Model::load(file, &QuantLoader, &ch04::architectures()).unwrap();
    }
    let types: HashMap<String, GgmlType> = variant["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let ty = t["type"].as_str().unwrap();
            let ty = GgmlType::from_name(ty).unwrap_or_else(|| panic!("{name}: type {ty}"));
            (t["name"].as_str().unwrap().to_string(), ty)
        })
        .collect();
    let choose = |info: &TensorInfo| types[&info.name];
    Model::load(file, &RequantLoader { choose }, &ch04::architectures()).unwrap()
}

#[test]
fn every_variant_matches_llama_cpp() {
    let file = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
    let json = refdata::json("quant/variants.json").unwrap_or_else(|e| panic!("{e}"));
    let logits = TensorFile::open("quant/logits.safetensors").unwrap_or_else(|e| panic!("{e}"));
    let ids = |x: &serde_json::Value| {
        x.as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect::<Vec<_>>()
    };
    let (mut steps, mut near_ties) = (0, 0);
    for (name, v) in json["variants"].as_object().unwrap() {
        let model = model_for(v, &file, name);
        let vocab = model.config.vocab_size;
        let prompt = ids(&v["prompt_ids"]);
        let cont = ids(&v["continuation"]["ids"]);
        // Teacher forcing: one pass over prompt + llama.cpp's continuation gives our logits at
        // every greedy step, given llama.cpp's choices so far.
        let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();
        let ours = model
            .forward(
                &Batch::sequence(0, &all, 0, true),
                &mut model.new_kv(),
                &mut NoObserver,
            )
            .unwrap();
        let want = logits.f32(name).unwrap();
        let a = teacher_forced(&want.data, &ours[(prompt.len() - 1) * vocab..], &cont)
            .unwrap_or_else(|e| panic!("{name} vs llama.cpp: {e}"));
        eprintln!("{name}: {a}");
        steps += a.steps;
        near_ties += a.near_ties;
    }
    check_tie_fraction(near_ties, steps).unwrap_or_else(|e| panic!("{e}"));
}

/// Quantized weights are used in place: the model keeps the file's bytes, not f32 copies.
#[test]
fn the_quantized_model_is_about_the_size_of_the_file() {
    let path = shared::default_model_path().unwrap();
    let file = GgufFile::open(&path).unwrap();
    // Model::load runs on this thread, so what this thread holds afterwards, and did not
    // before, is the model.
    let before = live_bytes();
    let model = Model::load(&file, &QuantLoader, &ch04::architectures()).unwrap();
    let model_bytes = (live_bytes() - before) as f64;
    let file_bytes = std::fs::metadata(&path).unwrap().len() as f64;
    let ratio = model_bytes / file_bytes;
    eprintln!(
        "model {:.1} MB, file {:.1} MB: {ratio:.4} of the file",
        model_bytes / 1e6,
        file_bytes / 1e6
    );
    assert!(
        (ratio - 1.0).abs() <= MODEL_SIZE_OVER_FILE_TOL,
        "the loaded model holds {model_bytes} bytes, {ratio:.3} times the file's {file_bytes}: \
         more than {MODEL_SIZE_OVER_FILE_TOL} away from 1"
    );
    // One token through the model works and gives finite logits.
    let logits = model
        .forward(
            &Batch::sequence(0, &[504], 0, false),
            &mut model.new_kv(),
            &mut NoObserver,
        )
        .unwrap();
    assert!(logits.iter().all(|l| l.is_finite()));
    assert!(
        model
            .blocks_as::<ch04::llama::Llama>()
            .expect("llama blocks")
            .layers[0]
            .attn
            .wq
            .describe()
            .contains("Q4_1")
    );
    assert!(model.weights.token_embd.describe().contains("Q8_0"));
}
