//! Hugging Face directories against the GGUF path: each directory is made from a GGUF model
//! by Hugging Face's own libraries (`common`), converted by this chapter, and must compute
//! the logits of the GGUF file holding the values it stores — bit for bit, since both run the
//! same kernels on the same numbers — and tokenize as Hugging Face's `tokenizers` does and as
//! the GGUF file's tokenizer does (chapter 2's, checked against llama.cpp).

mod common;
mod converted;

use ch01::Gguf;
use ch06::agreement::{MAX_KL, TIE_MARGIN, greedy_step_within, kl_divergence};
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::{Engine, LoadMode};
use ch13::synthetic;
use ch17::{Checkpoints, Precision};
use common::Recipe;
use safetensors::Dtype;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;
use testkit::refdata::TensorFile;
use testkit::{Target, Tolerance, assert_close};

/// Logits of a BF16 directory run on chapter 8's BF16 kernels, against the F32 file of the
/// same values. The weights are the same numbers; what differs is that each matrix product
/// rounds its input activations to BF16 first (as ggml's BF16 matrices do). BF16 keeps 8
/// significant bits: each rounding is a relative error of at most 2⁻⁸, and, spread evenly,
/// of standard deviation 2⁻⁸/√3 ≈ 0.23%. A logit passes through 17 such roundings (in each
/// of the 4 layers: the input shared by the query, key and value products, the attention's
/// output, the input shared by gate and up, the input of down; then the output's);
/// independent, they add in quadrature to √17 · 0.23% ≈ 0.93% of the logit's size: σ ≈ 0.19
/// for the largest logits here (about 20). Every one of the prompt's 14 × 49,152 logits must
/// hold, so the bound is some σ out: 0.5 (observed: at most 0.21); and each position's
/// distribution must be within chapter 6's `MAX_KL`.
const BF16_LOGITS_TOL: Tolerance = Tolerance::new(0.5, 0.0);

/// The layers kept of the default model: four of its thirty, at full width.
const LAYERS: usize = 4;

const PROMPT: &str = "The capital of France is Paris. The old lighthouse keeper climbed the stairs";

/// A checkpoint made for these tests, and the GGUF file of the values it stores.
struct Made {
    dir: PathBuf,
    reference: PathBuf,
    /// The header of the GGUF model it was made from (its tokenizer).
    source: Gguf,
}

/// Where the tests keep what they make: cargo's directory for integration tests' files.
fn work_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ch17-checkpoints")
}

/// The source GGUF model `id`: the default model, Gemma 3 270M, or chapter 13's synthetic
/// variant `id` (built from its recipe, in memory).
fn source(id: &str) -> ch01::GgufFile {
    let path = match id {
        "default" => shared::default_model_path().unwrap_or_else(|e| panic!("{e}")),
        "gemma3" => shared::model::ensure_cached(&shared::model::GEMMA3_MODEL)
            .unwrap_or_else(|e| panic!("{e}")),
        _ => {
            let recipe = testkit::refdata::json(&format!("variants/{id}/model.json")).unwrap();
            let vocab = testkit::refdata::read(recipe["vocab"].as_str().unwrap()).unwrap();
            let vocab = Gguf::parse(&vocab).unwrap();
            let bytes = synthetic::build(&recipe, &vocab).unwrap_or_else(|e| panic!("{id}: {e}"));
            return ch01::GgufFile::from_bytes(bytes).unwrap();
        }
    };
    ch01::GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// How many times the tests take each checkpoint, and how many of those take its reference
/// file too. The files are large (the default model's four layers in F32 take 164 MB a copy,
/// Gemma 3's embeddings 335 MB) and together would take 2.4 GB, so the last test to use a
/// file removes it. A count too low costs time, never a result: a file asked for after it
/// was removed is made again, the same bytes. One too high leaves the file until the next run
/// makes it again.
const TAKEN: &[(&str, usize, usize)] = &[
    ("default-f32", 9, 3),
    ("default-f32-sharded", 1, 0),
    ("default-bf16", 3, 1),
    ("llama3-f32", 2, 1),
    ("qwen2-f32", 2, 1),
    ("yarn-f32", 2, 1),
    ("gemma3-bf16", 5, 1),
];

/// A made checkpoint, with what the tests still want of it.
struct Entry {
    made: Arc<Made>,
    id: String,
    recipe: Recipe,
    /// Per file (the directory, the reference): takings still to come, those held now, and
    /// whether it is on disk.
    to_come: [usize; 2],
    held: [usize; 2],
    present: [bool; 2],
}

const DIR: usize = 0;
const REFERENCE: usize = 1;

fn entries() -> MutexGuard<'static, HashMap<String, Entry>> {
    static ENTRIES: OnceLock<Mutex<HashMap<String, Entry>>> = OnceLock::new();
    let all = ENTRIES.get_or_init(Default::default);
    // A test that failed while holding the lock left the map as it was: still usable.
    all.lock().unwrap_or_else(|e| e.into_inner())
}

/// Entry `e`'s checkpoint made from `src` into its directory, and its reference file written,
/// as `which` says (a file held now is never rewritten).
fn make_files(e: &mut Entry, src: &ch01::GgufFile, which: [bool; 2]) {
    let dir = if which[DIR] {
        let _ = std::fs::remove_dir_all(&e.made.dir);
        e.made.dir.clone()
    } else {
        e.made.dir.with_extension("scratch")
    };
    let reference = common::make(src, &e.recipe, &dir);
    if !which[DIR] {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if which[REFERENCE] {
        std::fs::write(&e.made.reference, reference).unwrap();
    }
    for part in [DIR, REFERENCE] {
        e.present[part] |= which[part];
    }
}

/// A test's hold on a made checkpoint: its directory, and its reference file if it asked.
struct Taken {
    made: Arc<Made>,
    key: String,
    with_reference: bool,
}

impl std::ops::Deref for Taken {
    type Target = Made;
    fn deref(&self) -> &Made {
        &self.made
    }
}

impl Drop for Taken {
    /// The last test to use a file removes it.
    fn drop(&mut self) {
        let mut all = entries();
        let e = all
            .get_mut(&self.key)
            .expect("an entry outlives its takings");
        let parts: &[usize] = if self.with_reference {
            &[DIR, REFERENCE]
        } else {
            &[DIR]
        };
        for &part in parts {
            e.held[part] -= 1;
            e.to_come[part] = e.to_come[part].saturating_sub(1);
        }
        for part in [REFERENCE, DIR] {
            if e.present[part] && e.to_come[part] == 0 && e.held[part] == 0 {
                let _ = match part {
                    DIR => std::fs::remove_dir_all(&e.made.dir),
                    _ => std::fs::remove_file(&e.made.reference),
                };
                e.present[part] = false;
            }
        }
    }
}

/// Checkpoint `name` of model `id` (its reference file too, if `reference`), made once while
/// tests use it.
fn made(id: &str, name: &str, recipe: Recipe, reference: bool) -> Taken {
    let key = format!("{id}-{name}");
    let mut all = entries();
    // The source model, read when something is made.
    let mut src = None;
    let e = all.entry(key.clone()).or_insert_with(|| {
        let (_, dirs, refs) = TAKEN
            .iter()
            .find(|(k, ..)| *k == key)
            .copied()
            .unwrap_or_default();
        let s = src.insert(source(id));
        let made = Made {
            dir: work_dir().join(&key),
            reference: work_dir().join(format!("{key}.reference.gguf")),
            source: s.gguf.clone(),
        };
        Entry {
            made: Arc::new(made),
            id: id.to_string(),
            recipe,
            to_come: [dirs, refs],
            held: [0, 0],
            present: [false, false],
        }
    });
    // The reference file is written with the directory when a test will want it.
    let fresh = src.is_some();
    let want_reference = reference || fresh && e.to_come[REFERENCE] > 0;
    let want = [!e.present[DIR], want_reference && !e.present[REFERENCE]];
    if want.contains(&true) {
        std::fs::create_dir_all(work_dir()).unwrap();
        if !fresh {
            eprintln!("{key}: made again; TAKEN counts fewer takings than the tests make");
        }
        let src = src.unwrap_or_else(|| source(&e.id));
        make_files(e, &src, want);
    }
    e.held[DIR] += 1;
    e.held[REFERENCE] += usize::from(reference);
    Taken {
        made: e.made.clone(),
        key,
        with_reference: reference,
    }
}

fn recipe(layers: Option<usize>, dtype: Dtype, shards: usize) -> Recipe {
    Recipe {
        layers,
        dtype,
        shards,
        rope_scaling: None,
        reference_in_dtype: false,
    }
}

/// The default model's four layers, in F32 (one file) — the checkpoint most tests use.
fn smollm2_f32(reference: bool) -> Taken {
    made(
        "default",
        "f32",
        recipe(Some(LAYERS), Dtype::F32, 1),
        reference,
    )
}

fn fast() -> FastLoader {
    FastLoader::new(new_pool(PoolKind::Spin, 2))
}

/// The engine of a GGUF file, or of a directory at `precision`, mapped (a directory's
/// shards side by side in one image).
fn engine(path: &Path, precision: Precision) -> Engine {
    engine_in(path, precision, LoadMode::Map(Default::default()))
}

/// The same, loaded as `mode` says (`LoadMode::Read`: a directory converted into memory).
fn engine_in(path: &Path, precision: Precision, mode: LoadMode) -> Engine {
    let files = Checkpoints { precision };
    let archs = ch13::architectures();
    Engine::open(&files, path, mode, fast(), &archs, Box::new(|_, _| {}))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Logits at every position of [`PROMPT`] (tokenized by `engine`'s tokenizer).
fn logits(engine: &Engine) -> (Vec<u32>, Vec<f32>) {
    let tokens = engine.tokenizer.encode(PROMPT, true, false);
    let logits = engine.model.logits_at_every_position(&tokens).unwrap();
    (tokens, logits)
}

/// The directory's logits must be the reference file's, bit for bit.
fn assert_same_logits(dir: &Path, reference: &Path, precision: Precision) {
    let (want_tokens, want) = logits(&engine(reference, None));
    let (tokens, got) = logits(&engine(dir, precision));
    assert_eq!(
        tokens,
        want_tokens,
        "{}: the prompt's tokens",
        dir.display()
    );
    let shape = [tokens.len(), got.len() / tokens.len()];
    assert_close("logits", &shape, &got, &want, Tolerance::EXACT);
}

#[test]
fn an_f32_directory_computes_the_gguf_files_logits_exactly() {
    let m = smollm2_f32(true);
    assert_same_logits(&m.dir, &m.reference, None);
}

#[test]
fn the_weights_stay_in_the_shards_and_read_into_memory_compute_the_same() {
    let m = smollm2_f32(false);
    for m in [&*m, &*gemma3(false)] {
        let ckpt = ch17::Checkpoint::open(&m.dir).unwrap();
        let planned = ckpt.plan(None).unwrap();
        let (_, image) = ch17::assemble::assemble(&ckpt, &planned).unwrap();
        let weights: u64 = planned.writer.tensors().iter().map(|t| t.n_bytes()).sum();
        // Only what the conversion changes is written: llama's query and key matrices, the
        // vectors made F32.
        let private = image.private_bytes() as u64;
        assert!(
            private * 10 < weights,
            "{}: {private} of {weights} bytes copied",
            m.dir.display()
        );
        eprintln!(
            "{}: {private} of {weights} bytes written, the rest mapped",
            m.dir.display()
        );
    }
    let (_, mapped) = logits(&engine(&m.dir, None));
    let (_, read) = logits(&engine_in(&m.dir, None, LoadMode::Read));
    assert_close(
        "read against mapped",
        &[read.len()],
        &read,
        &mapped,
        Tolerance::EXACT,
    );
}

#[test]
fn a_sharded_directory_computes_the_same_logits() {
    // The values a directory stores do not depend on how many shards hold them: its GGUF file
    // of those values is the single file's (`common::make` reads `shards` only to write them).
    let single = smollm2_f32(true);
    let recipe = recipe(Some(LAYERS), Dtype::F32, 3);
    let m = made("default", "f32-sharded", recipe, false);
    assert!(m.dir.join("model.safetensors.index.json").is_file());
    assert_same_logits(&m.dir, &single.reference, None);
}

fn smollm2_bf16(reference: bool) -> Taken {
    made(
        "default",
        "bf16",
        recipe(Some(LAYERS), Dtype::BF16, 2),
        reference,
    )
}

#[test]
fn a_bf16_directory_is_exact_in_f32_and_close_on_the_bf16_kernels() {
    let m = smollm2_bf16(true);
    // Converted to F32, the directory's BF16 values are exact.
    let f32 = Some(ch06::recipe::LlamaFtype::F32);
    assert_same_logits(&m.dir, &m.reference, f32);
    // Kept in BF16, chapter 8's BF16 kernels run it.
    let (_, want) = logits(&engine(&m.reference, None));
    let bf16 = engine(&m.dir, None);
    assert!(
        bf16.model.describe_weights().contains("BF16"),
        "{}",
        bf16.model.describe_weights()
    );
    let (tokens, got) = logits(&bf16);
    let shape = [tokens.len(), got.len() / tokens.len()];
    let r = assert_close("bf16 logits", &shape, &got, &want, BF16_LOGITS_TOL);
    let kl = (0..tokens.len())
        .map(|i| {
            let row = i * shape[1]..(i + 1) * shape[1];
            kl_divergence(&want[row.clone()], &got[row])
        })
        .fold(0.0, f64::max);
    eprintln!(
        "bf16 against f32: largest |Δlogit| {}, largest KL {kl:.2e}",
        r.max_abs
    );
    assert!(
        kl <= MAX_KL,
        "KL divergence {kl} at a position, more than {MAX_KL}"
    );
}

/// Chapter 13's synthetic variants: Llama 3's RoPE factors (a tensor the converter computes
/// from `rope_scaling`), Qwen2's biases and NeoX RoPE, YaRN with an untied output on Llama 2's
/// SentencePiece vocabulary.
fn variant(id: &str, reference: bool) -> Taken {
    let mut r = recipe(None, Dtype::F32, 1);
    if id == "llama3" {
        r.rope_scaling = Some(json!({
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
        }));
    }
    made(id, "f32", r, reference)
}

#[test]
fn every_family_variant_computes_the_gguf_files_logits_exactly() {
    for id in ["llama3", "qwen2", "yarn"] {
        let m = variant(id, true);
        assert_same_logits(&m.dir, &m.reference, None);
    }
}

/// Gemma 3 270M's first two layers in BF16, as Google publishes it: norms stored minus one,
/// a SentencePiece-style tokenizer of 262,144 tokens without a space prefix. Its reference
/// file keeps the matrices in BF16 too, so both run chapter 8's BF16 kernels.
fn gemma3(reference: bool) -> Taken {
    let mut r = recipe(Some(2), Dtype::BF16, 1);
    r.reference_in_dtype = true;
    made("gemma3", "bf16", r, reference)
}

#[test]
fn gemma3_computes_the_gguf_files_logits_exactly() {
    let m = gemma3(true);
    assert_same_logits(&m.dir, &m.reference, None);
}

/// The texts a tokenizer is checked on: the project's corpus for vocabulary `vocab`
/// (`reference-data/tokenizer/corpus.json`) and, for a vocabulary of one of llama.cpp's
/// vocabulary-only test files (`ggml-vocab-<name>.gguf`), llama.cpp's test texts for it. The
/// default model's and Gemma 3's vocabularies come from the models themselves, and llama.cpp
/// has no test texts for them.
fn corpus(vocab: &str) -> Vec<String> {
    let corpus = testkit::refdata::json("tokenizer/corpus.json").unwrap_or_else(|e| panic!("{e}"));
    let mut texts: Vec<String> = corpus["vocabs"][vocab]["strings"]
        .as_array()
        .unwrap_or_else(|| panic!("no corpus for {vocab}"))
        .iter()
        .map(|s| s["text"].as_str().unwrap().to_string())
        .collect();
    let file = corpus["vocabs"][vocab]["file"]
        .as_str()
        .unwrap_or_else(|| panic!("tokenizer/corpus.json names no file for {vocab}"));
    if file.starts_with("ggml-vocab-") {
        // A missing file is an error that says how to regenerate the reference data.
        let rel = format!("tokenizer/{file}.inp");
        let inp = testkit::refdata::read(&rel).unwrap_or_else(|e| panic!("{vocab}: {e}"));
        let inp = String::from_utf8(inp).unwrap_or_else(|e| panic!("{rel} is not UTF-8: {e}"));
        texts.extend(inp.split("\n__ggml_vocab_test__\n").map(str::to_string));
    }
    texts
}

#[test]
fn the_tokenizer_gives_the_ids_of_tokenizers_and_of_the_gguf_file() {
    for (vocab, m) in [
        ("default", smollm2_f32(false)),
        ("llama-bpe", variant("llama3", false)),
        ("qwen2", variant("qwen2", false)),
        ("llama-spm", variant("yarn", false)),
        ("gemma-3", gemma3(false)),
    ] {
        let hf = tokenizers::Tokenizer::from_file(m.dir.join("tokenizer.json")).unwrap();
        let ours = engine(&m.dir, None).tokenizer;
        let gguf = ch02::Tokenizer::from_gguf(&m.source).unwrap();
        let texts = corpus(vocab);
        assert!(texts.len() >= 50, "{vocab}: {} texts", texts.len());
        for text in &texts {
            for add_special in [false, true] {
                let want: Vec<u32> = hf
                    .encode(text.as_str(), add_special)
                    .unwrap()
                    .get_ids()
                    .to_vec();
                let got = ours.encode(text, add_special, true);
                assert_eq!(
                    got, want,
                    "{vocab}: {text:?} (add_special {add_special}): ours vs tokenizers"
                );
                let direct = gguf.encode(text, add_special, true);
                assert_eq!(got, direct, "{vocab}: {text:?}: ours vs the GGUF file's");
            }
        }
    }
}

/// `llm-rs ARGS…`, run to the end.
fn llm_rs(args: &[&OsStr]) -> Output {
    Command::new(testkit::program("llm-rs", Target::Bin, "llm-rs", &[]))
        .args(args)
        .output()
        .expect("llm-rs runs")
}

/// The ids `llm-rs run --model MODEL` generates greedily from [`PROMPT`], with `extra` flags.
fn generated(model: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args: Vec<&OsStr> = vec!["run".as_ref(), "--model".as_ref(), model.as_os_str()];
    args.extend(
        ["--temp", "0", "-n", "8", "--json", PROMPT]
            .iter()
            .map(OsStr::new),
    );
    args.extend(extra.iter().map(OsStr::new));
    testkit::json_printed(&llm_rs(&args))["ids"].clone()
}

#[test]
fn llm_rs_runs_converts_and_inspects_a_directory() {
    let m = smollm2_f32(true);
    let want = generated(&m.reference, &[]);
    assert_eq!(generated(&m.dir, &[]), want, "run --model DIR");

    // `convert` writes the file the directory runs as; it runs the same. The files go with
    // the test.
    let converted = tempfile::tempdir_in(work_dir()).unwrap();
    let out = converted.path().join("converted.gguf");
    let o = llm_rs(&["convert".as_ref(), m.dir.as_os_str(), out.as_os_str()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(generated(&out, &[]), want, "run --model CONVERTED");

    // Quantized on load, or converted to the same type: the same file, the same tokens.
    let q8 = converted.path().join("converted-q8_0.gguf");
    let o = llm_rs(&[
        "convert".as_ref(),
        m.dir.as_os_str(),
        q8.as_os_str(),
        "Q8_0".as_ref(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let q8_file = ch01::GgufFile::open(&q8).unwrap();
    let q = q8_file.gguf.tensor("blk.0.ffn_up.weight").unwrap();
    assert_eq!(q.ggml_type, ch01::GgmlType::Q8_0);
    assert_eq!(
        generated(&m.dir, &["--quantize", "Q8_0"]),
        generated(&q8, &[])
    );

    let o = llm_rs(&["inspect".as_ref(), m.dir.as_os_str()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains("llm-rs runs architecture \"llama\""),
        "{text}"
    );
    assert!(text.contains("blk.0.attn_q.weight"), "{text}");

    // A directory that is not a checkpoint: an error naming what it lacks, exit status 1.
    let empty = tempfile::tempdir().unwrap();
    let o = llm_rs(&[
        "run".as_ref(),
        "--model".as_ref(),
        empty.path().as_os_str(),
        "Hi".as_ref(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("config.json"), "{err}");
    let o = llm_rs(&[
        "run".as_ref(),
        "--model".as_ref(),
        m.reference.as_os_str(),
        "--quantize".as_ref(),
        "Q4_0".as_ref(),
        "Hi".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(1), "--quantize on a GGUF file");
}

#[test]
fn llm_rs_serves_a_directory() {
    let m = smollm2_f32(false);
    let want = generated(&m.dir, &[]);
    let dir = m.dir.to_str().unwrap();
    let (_server, base) = testkit::serve::llm_rs_serve(&["--model", dir], Duration::from_secs(120));
    let body = json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0.0});
    let client = reqwest::blocking::Client::new();
    let reply: serde_json::Value = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .and_then(|r| r.json())
        .unwrap();
    let text = reply["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply}"));
    let engine = engine(&m.dir, None);
    let ids: Vec<u32> = want
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(text, engine.tokenizer.decode(&ids), "served: {reply}");
}

/// The F32 checkpoint's logits against llama.cpp's on the converted file: chapter 4's
/// `LOGITS_TOL` (the same f32 arithmetic summed in another order).
const CONVERTED_F32_TOL: Tolerance = Tolerance::new(1e-4, 1e-4);

#[test]
fn llama_cpp_runs_the_converted_files_with_the_same_logits() {
    let manifest = testkit::refdata::manifest().unwrap();
    for (id, m) in [
        ("default-f32", smollm2_f32(false)),
        ("default-bf16", smollm2_bf16(false)),
        ("gemma3-bf16", gemma3(false)),
    ] {
        let case = &manifest["checkpoints"]["cases"][id];
        // llama.cpp ran the file the converter makes now (hashed as it is written).
        let ckpt = ch17::Checkpoint::open(&m.dir).unwrap();
        let planned = ckpt.plan(None).unwrap();
        let mut hash = Sha256Writer(Sha256::new());
        planned
            .writer
            .write(&mut hash, |t| ckpt.tensor_data(&planned, t))
            .unwrap();
        let sha: String = hash
            .0
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let want = case["converted_sha256"].as_str().unwrap();
        assert_eq!(sha, want, "{id}: the converted file");
        let refs = TensorFile::open(&format!("checkpoints/{id}.safetensors")).unwrap();
        let (_, tokens) = refs.i64("tokens").unwrap();
        let tokens: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        let engine = engine(&m.dir, None);
        assert_eq!(
            engine.tokenizer.encode(PROMPT, true, false),
            tokens,
            "{id}: the prompt"
        );
        let logits = engine.model.logits_at_every_position(&tokens).unwrap();
        let vocab = logits.len() / tokens.len();
        let last = &logits[logits.len() - vocab..];
        let want = refs.f32("last_logits").unwrap();
        if id.ends_with("f32") {
            assert_close(
                &format!("{id} last logits"),
                &[vocab],
                last,
                &want.data,
                CONVERTED_F32_TOL,
            );
        } else {
            // Two engines' BF16 products round differently: chapter 6's agreement.
            let kl = kl_divergence(&want.data, last);
            assert!(
                kl <= MAX_KL,
                "{id}: KL {kl} from llama.cpp's, more than {MAX_KL}"
            );
            let step = greedy_step_within(last, argmax(&want.data), TIE_MARGIN);
            assert!(
                step.is_ok(),
                "{id}: the next token is not llama.cpp's, nor a near-tie"
            );
            eprintln!("{id}: KL from llama.cpp's {kl:.2e}");
        }
    }
}

/// A `Write` that only hashes.
struct Sha256Writer(Sha256);

impl std::io::Write for Sha256Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn argmax(x: &[f32]) -> usize {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
}

// ANCHOR: converter_differences
/// Metadata on which this converter and llama.cpp's `convert_hf_to_gguf.py` differ, and why:
/// (the cases, by the start of their id; a key, or a prefix of keys ending in `.`; why).
/// Every other key, and every tensor's name, type, shape and bytes, must be llama.cpp's; an
/// entry must still match a difference (else it leaves the list).
const KEYS_WE_DIFFER_ON: &[(&str, &str, &str)] = &[
    (
        "",
        "general.name",
        "llama.cpp's converter makes a title of the directory's name (`default-f32` becomes \
         `Default F32`); ours keeps the name. Only people read it.",
    ),
    (
        "default",
        "tokenizer.ggml.pre",
        "two of llama.cpp's names for one rule: its converter knows SmolLM2's tokenizer by a \
         hash of the ids it gives a test text (`smollm`), ours takes the first name of \
         chapter 2's row with the same regexes and flags (`command-r`); llama.cpp's tokenizer \
         runs both names with the same regexes and flags.",
    ),
    (
        "gemma3",
        "tokenizer.ggml.",
        "Google's Gemma 3 directories hold `tokenizer.model`, the SentencePiece model \
         llama.cpp's converter reads; these hold only `tokenizer.json`, which llama.cpp's \
         converter then reads as a GPT-2 byte-level BPE, named after another model whose \
         tokenizer gives the same ids on its test text — a tokenizer llama.cpp does not run \
         right. Ours is SentencePiece's, and gives Hugging Face's ids (checked by \
         `the_tokenizer_gives_the_ids_of_tokenizers_and_of_the_gguf_file`).",
    ),
    (
        "gemma3",
        "gemma3.attention.sliding_window_pattern",
        "config.json's period of sliding-window layers: llama.cpp's converter leaves it out and \
         both engines' loaders then take Gemma 3's period, 6; ours writes what the \
         configuration says.",
    ),
];
// ANCHOR_END: converter_differences

#[test]
fn the_converter_writes_the_metadata_and_tensors_llama_cpps_converter_writes() {
    use ch06::recipe::LlamaFtype;
    let record = testkit::refdata::json("checkpoints/converted.json").unwrap();
    let mut differences = Vec::new();
    let mut allowed_seen = std::collections::HashSet::new();
    for (id, m, precision) in [
        ("default-f32", smollm2_f32(false), None),
        ("default-bf16", smollm2_bf16(false), None),
        ("gemma3-bf16", gemma3(false), None),
        (
            "default-f32-q8_0",
            smollm2_f32(false),
            Some(LlamaFtype::Q8_0),
        ),
    ] {
        let case = &record["cases"][id];
        let hint = "reference-data/checkpoints/converted.json: regenerate it with \
                    scripts/export-reference --only checkpoints";
        let files = case["directory_files"]
            .as_object()
            .unwrap_or_else(|| panic!("{id}: no case in {hint}"));
        // llama.cpp converted the directory the tests make now.
        let mut ours: Vec<String> = std::fs::read_dir(&m.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        ours.sort();
        assert_eq!(
            ours,
            files.keys().cloned().collect::<Vec<_>>(),
            "{id}: {hint}"
        );
        for (file, want) in files {
            let got = converted::sha256(&std::fs::read(m.dir.join(file)).unwrap());
            assert_eq!(
                &got, want,
                "{id}: {file} is not the file converted ({hint})"
            );
        }
        let ty = precision.map(LlamaFtype::name);
        assert_eq!(case["llm_rs_type"].as_str(), ty, "{id}: {hint}");

        let ckpt = ch17::Checkpoint::open(&m.dir).unwrap();
        let planned = ckpt.plan(precision).unwrap();
        let meta: serde_json::Map<String, serde_json::Value> = planned
            .writer
            .metadata()
            .iter()
            .map(|(k, v)| (k.clone(), converted::metadata_entry(v)))
            .collect();
        let theirs = case["metadata"].as_object().unwrap();
        for (key, what) in converted::metadata_differences(&meta, theirs) {
            let listed = KEYS_WE_DIFFER_ON.iter().position(|(case, k, _)| {
                id.starts_with(case) && (key == *k || k.ends_with('.') && key.starts_with(k))
            });
            match listed {
                Some(i) => {
                    allowed_seen.insert(i);
                }
                None => differences.push(format!("{id}: metadata {key}: {what}")),
            }
        }

        let theirs = case["tensors"].as_object().unwrap();
        let mut names: Vec<&String> = theirs.keys().collect();
        for t in planned.writer.tensors() {
            let Some(want) = theirs.get(&t.name) else {
                differences.push(format!("{id}: tensor {} is not llama.cpp's", t.name));
                continue;
            };
            names.retain(|n| **n != t.name);
            let shape: Vec<u64> = serde_json::from_value(want["shape"].clone()).unwrap();
            let (ty, want_ty) = (t.ggml_type.name(), want["type"].as_str().unwrap());
            if t.dims != shape || ty != want_ty {
                differences.push(format!(
                    "{id}: tensor {}: ours {ty} {:?}, llama.cpp's {want_ty} {shape:?}",
                    t.name, t.dims
                ));
                continue;
            }
            let bytes = ckpt.tensor_data(&planned, t).unwrap();
            if converted::sha256(&bytes) != want["sha256"].as_str().unwrap() {
                differences.push(format!("{id}: tensor {}: other bytes", t.name));
            }
        }
        for n in names {
            differences.push(format!("{id}: tensor {n}: llama.cpp's, not ours"));
        }
    }
    for (i, (case, key, _)) in KEYS_WE_DIFFER_ON.iter().enumerate() {
        if !allowed_seen.contains(&i) {
            differences.push(format!(
                "{key} ({case:?}): listed in KEYS_WE_DIFFER_ON, but the same now"
            ));
        }
    }
    assert!(
        differences.is_empty(),
        "llama.cpp's converter wrote otherwise:\n{}",
        differences.join("\n")
    );
}
