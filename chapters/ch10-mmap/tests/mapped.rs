//! Mapping changes where the weights live, not what they are: every tensor viewed in the map
//! is byte for byte chapter 1's tensor read into memory, and sits in the map itself (no copy);
//! a model loaded through the map computes exactly the logits and the greedy tokens of one
//! read into memory, through the same matrix type.

use ch01::{GgufFile, Value};
use ch04::sampling::argmax;
use ch04::{Model, Session};
use ch05::Cached;
use ch06::gguf_write::GgufWriter;
use ch08::kernels::KernelSet;
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::{MapOptions, PageAdvice, ViewLoader, map_gguf, read_gguf};
use std::path::PathBuf;
use testkit::refdata;

/// Greedy steps compared between loaders (and with llama.cpp).
const STEPS: usize = 16;

/// Chapter 8's matrices over the file's own rows (no repacking), on one thread.
fn fast() -> FastLoader {
    let mut f = FastLoader::new(new_pool(PoolKind::Spin, 1));
    f.pack = false;
    f
}

fn model_path() -> PathBuf {
    shared::default_model_path().unwrap_or_else(|e| panic!("{e}"))
}

/// The "short" reference prompt and llama.cpp's greedy continuation of it.
fn reference() -> (Vec<u32>, Vec<u32>) {
    let m = refdata::manifest().unwrap_or_else(|e| panic!("{e}"));
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let p = m["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "short")
        .expect("the manifest has no prompt \"short\"");
    let g = refdata::json("prompts/short.generation.json").unwrap_or_else(|e| panic!("{e}"));
    (ids(&p["ids"]), ids(&g["ids"]))
}

/// Greedy generation of up to `STEPS` tokens, returning the tokens and every step's logits.
fn greedy(model: &Model, prompt: &[u32]) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut session = Cached::contiguous(model, Some(64));
    let mut tokens = prompt.to_vec();
    let (mut ids, mut logits) = (Vec::new(), Vec::new());
    for step in 0..STEPS {
        let n_new = if step == 0 { tokens.len() } else { 1 };
        let l = session.next_logits(&tokens, n_new).unwrap().to_vec();
        let next = argmax(&l) as u32;
        ids.push(next);
        logits.push(l);
        tokens.push(next);
    }
    (ids, logits)
}

#[test]
fn every_tensor_is_viewed_in_place_and_equals_the_read_bytes() {
    let path = model_path();
    let read = GgufFile::open(&path).unwrap();
    let (mapped, bytes) = map_gguf(&path, &MapOptions::default()).unwrap();
    let loader = ViewLoader::new(bytes, fast());
    assert_eq!(read.gguf, mapped.gguf);
    let base = mapped.bytes().as_ptr() as usize;
    for info in &mapped.gguf.tensors {
        let view = loader.view(&mapped.gguf, info).unwrap();
        let want = read.tensor_bytes(&info.name).unwrap();
        assert!(view.as_ref() == want, "{}: bytes differ", info.name);
        // Zero copy: the view is the map's own memory, where the file puts the tensor.
        let at = (mapped.gguf.data_offset + info.offset) as usize;
        assert_eq!(view.as_ref().as_ptr() as usize, base + at, "{}", info.name);
        assert_eq!(view.as_ref().as_ptr() as usize % 32, 0, "{}", info.name);
    }
    assert!(loader.copied().is_empty());
}

#[test]
fn mapped_read_and_copied_models_compute_the_same_bits() {
    let path = model_path();
    let (prompt, _) = reference();
    let (copied, read, mapped) = std::thread::scope(|s| {
        let copied = s.spawn(|| {
            // Chapter 8's way: chapter 1 reads the file into a Vec, each tensor is copied out.
            let file = GgufFile::open(&path).unwrap();
            greedy(
                &Model::load(&file, &fast(), &ch04::architectures()).unwrap(),
                &prompt,
            )
        });
        let read = s.spawn(|| {
            let (file, bytes) = read_gguf(&path).unwrap();
            let loader = ViewLoader::new(bytes, fast());
            greedy(
                &Model::load(&file, &loader, &ch04::architectures()).unwrap(),
                &prompt,
            )
        });
        let opts = MapOptions {
            advice: PageAdvice::WillNeed,
            ..MapOptions::default()
        };
        let (file, bytes) = map_gguf(&path, &opts).unwrap();
        let loader = ViewLoader::new(bytes, fast());
        let mapped = greedy(
            &Model::load(&file, &loader, &ch04::architectures()).unwrap(),
            &prompt,
        );
        (copied.join().unwrap(), read.join().unwrap(), mapped)
    });
    for (name, (ids, logits)) in [("read", &read), ("copied", &copied)] {
        testkit::assert_same_sequence(&format!("greedy tokens: mapped vs {name}"), &mapped.0, ids);
        for (step, (a, b)) in mapped.1.iter().zip(logits).enumerate() {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "step {step}: mapped and {name} logits differ");
        }
    }
}

#[test]
fn the_mapped_model_continues_as_llama_cpp_does() {
    // The end-to-end check, on chapter 6's scalar kernels: their greedy tokens are
    // llama.cpp's. (SIMD kernels quantize activations with other roundings, which may flip
    // a near-tie; chapter 8 measures how close they stay.)
    let path = model_path();
    let (prompt, want) = reference();
    let mut scalar = fast();
    scalar.kernels = KernelSet::SCALAR;
    let (file, bytes) = map_gguf(&path, &MapOptions::default()).unwrap();
    let model = Model::load(
        &file,
        &ViewLoader::new(bytes, scalar),
        &ch04::architectures(),
    )
    .unwrap();
    let (ids, _) = greedy(&model, &prompt);
    let n = STEPS.min(want.len());
    testkit::assert_same_sequence("greedy tokens vs llama.cpp", &ids[..n], &want[..n]);
}

#[test]
fn misaligned_tensors_are_copied_once_and_compute_the_same() {
    // Rewrite the model with general.alignment = 1 and a header of odd length: every tensor
    // then starts at an odd address in the map, which no ggml block accepts.
    let path = model_path();
    let src = GgufFile::open(&path).unwrap();
    let build = |pad: &str| {
        let mut w = GgufWriter::new();
        w.set("general.alignment", Value::U32(1)).unwrap();
        for (k, v) in &src.gguf.metadata {
            if k != "general.alignment" {
                w.set(k, v.clone()).unwrap();
            }
        }
        w.set("test.pad", Value::String(pad.into())).unwrap();
        for t in &src.gguf.tensors {
            w.add_tensor(&t.name, &t.dims, t.ggml_type).unwrap();
        }
        w
    };
    let w = [build(""), build("x")]
        .into_iter()
        .find(|w| w.header().len() % 2 == 1)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("odd.gguf");
    w.write_file(&odd, |t| src.tensor_bytes(&t.name)).unwrap();

    let (file, bytes) = map_gguf(&odd, &MapOptions::default()).unwrap();
    let loader = ViewLoader::new(bytes, fast());
    assert_eq!(file.gguf.data_offset % 2, 1);
    let model = Model::load(&file, &loader, &ch04::architectures()).unwrap();
    let copied = loader.copied();
    let matrices = src
        .gguf
        .tensors
        .iter()
        .filter(|t| t.dims.len() == 2)
        .count();
    assert_eq!(
        copied.len(),
        matrices,
        "every matrix is misaligned, so every one is copied: {copied:?}"
    );

    let (aligned_file, bytes) = map_gguf(&path, &MapOptions::default()).unwrap();
    let aligned_loader = ViewLoader::new(bytes, fast());
    let aligned = Model::load(&aligned_file, &aligned_loader, &ch04::architectures()).unwrap();
    let (prompt, _) = reference();
    let a = Cached::contiguous(&model, Some(16))
        .next_logits(&prompt, prompt.len())
        .unwrap()
        .to_vec();
    let b = Cached::contiguous(&aligned, Some(16))
        .next_logits(&prompt, prompt.len())
        .unwrap()
        .to_vec();
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}
