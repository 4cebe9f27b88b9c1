//! The whole forward pass checked against llama.cpp: every layer's output, the final norm, the
//! logits of every prompt position, and the greedy continuation, for every reference prompt.
//!
//! llama.cpp ran an F32 copy of the default model made by dequantizing the Q4_1 file, and we
//! load the Q4_1 file dequantized to f32 ourselves: the same weights.

use ch01::GgufFile;
use ch02::Tokenizer;
use ch03::{DenseLoader, Recorder};
use ch04::by_hand::logits_by_hand;
use ch04::sampling::argmax;
use ch04::{Batch, GenParams, Model, SamplerParams, StopReason, Uncached, generate};
use std::sync::OnceLock;
use testkit::HIDDEN_TOL;
use testkit::refdata::{self, TensorFile};
use testkit::{Tolerance, assert_close};

/// Logits in f32 (the last position, stored in full precision): about 2.4e-5 observed after
/// 30 layers and a 576-term dot product per vocabulary entry.
const LOGITS_TOL: Tolerance = Tolerance::new(1e-4, 1e-4);
/// Logits of every position are stored as f16 (see `reduced_precision` in the manifest): the
/// f32 tolerance plus f16's rounding, at most 2^-11 of the value.
const LOGITS_F16_TOL: Tolerance = Tolerance::new(LOGITS_TOL.abs, LOGITS_TOL.rel + 1.0 / 2048.0);

/// The forward pass written out by hand against the real one: the same arithmetic in another
/// order (one token at a time, sums in other groupings), so only rounding apart — the f32
/// logits' own tolerance, which allows 4x the 2.4e-5 seen against llama.cpp.
const BY_HAND_TOL: Tolerance = LOGITS_TOL;

fn model() -> &'static (Model, Tokenizer) {
    static M: OnceLock<(Model, Tokenizer)> = OnceLock::new();
    M.get_or_init(|| {
        let file = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
        let tok = Tokenizer::from_gguf(&file.gguf).unwrap();
        (
            Model::load(&file, &DenseLoader, &ch04::architectures()).unwrap(),
            tok,
        )
    })
}

fn prompts() -> Vec<(String, Vec<u32>)> {
    let m = refdata::manifest().unwrap_or_else(|e| panic!("{e}"));
    m["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let ids = p["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            (p["id"].as_str().unwrap().to_string(), ids)
        })
        .collect()
}

fn generated(id: &str) -> Vec<u32> {
    let g =
        refdata::json(&format!("prompts/{id}.generation.json")).unwrap_or_else(|e| panic!("{e}"));
    g["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn every_layer_and_the_logits_match_llama_cpp() {
    let (model, _) = model();
    for (id, ids) in prompts() {
        let refs = TensorFile::open(&format!("prompts/{id}.safetensors"))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut rec = Recorder::new();
        let mut kv = model.new_kv();
        let logits = model
            .forward(&Batch::sequence(0, &ids, 0, true), &mut kv, &mut rec)
            .unwrap();
        let mut worst = (0.0f32, String::new());
        for layer in 0..model.config.n_layer {
            let name = format!("l_out-{layer}");
            let want = refs.f32(&name).unwrap();
            let (shape, got) = rec.get(&name);
            let r = assert_close(&format!("{id}: {name}"), shape, got, &want.data, HIDDEN_TOL);
            if r.max_abs > worst.0 {
                worst = (r.max_abs, name);
            }
        }
        let want = refs.f32("result_norm").unwrap();
        let (shape, got) = rec.get("result_norm");
        assert_close(
            &format!("{id}: result_norm"),
            shape,
            got,
            &want.data,
            HIDDEN_TOL,
        );
        let want = refs.f32("result_output").unwrap();
        let r = assert_close(
            &format!("{id}: result_output"),
            &want.shape,
            &logits,
            &want.data,
            LOGITS_F16_TOL,
        );
        let last = TensorFile::open(&format!("prompts/{id}.decode.safetensors"))
            .unwrap()
            .f32("logits_full")
            .unwrap();
        let vocab = model.config.vocab_size;
        let got_last = &logits[(ids.len() - 1) * vocab..];
        let r32 = assert_close(
            &format!("{id}: last logits"),
            &[vocab],
            got_last,
            &last.data[..vocab],
            LOGITS_TOL,
        );
        eprintln!(
            "{id}: {} tokens; worst hidden-state error {:.2e} at {}; logits max abs err {:.2e} (f16-stored), {:.2e} (f32)",
            ids.len(),
            worst.0,
            worst.1,
            r.max_abs,
            r32.max_abs
        );
    }
}

/// One token through the model in one function (`ch04::by_hand`, the page's listing) gives
/// the real forward pass's logits, and llama.cpp's.
#[test]
fn the_forward_pass_written_out_gives_the_same_logits() {
    let (model, _) = model();
    let vocab = model.config.vocab_size;
    for (id, ids) in prompts() {
        let by_hand = logits_by_hand(model, &ids).unwrap_or_else(|e| panic!("{e}"));
        let real = model.logits_at_every_position(&ids).unwrap();
        let real_last = &real[(ids.len() - 1) * vocab..];
        assert_close(
            &format!("{id}: by hand against Model::forward"),
            &[vocab],
            &by_hand,
            real_last,
            BY_HAND_TOL,
        );
        let llama_cpp = TensorFile::open(&format!("prompts/{id}.decode.safetensors"))
            .unwrap()
            .f32("logits_full")
            .unwrap();
        assert_close(
            &format!("{id}: by hand against llama.cpp"),
            &[vocab],
            &by_hand,
            &llama_cpp.data[..vocab],
            LOGITS_TOL,
        );
    }
}

/// Greedy decoding picks the argmax at every step, so our greedy continuation equals llama.cpp's
/// token for token exactly when, fed llama.cpp's continuation, our argmax at every position is
/// llama.cpp's next token. One pass over prompt + continuation checks all steps at once.
#[test]
fn greedy_continuation_matches_llama_cpp_token_for_token() {
    let (model, tok) = model();
    for (id, prompt) in prompts() {
        let cont = generated(&id);
        // llama.cpp stops at 64 tokens or at an end-of-generation token, which we check too.
        assert!(
            cont.len() == 64 || tok.is_eog(*cont.last().unwrap()),
            "{id}: {} tokens",
            cont.len()
        );
        let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();
        let logits = model.logits_at_every_position(&all).unwrap();
        let vocab = model.config.vocab_size;
        for (i, &want) in cont.iter().enumerate() {
            let row = &logits[(prompt.len() - 1 + i) * vocab..][..vocab];
            assert_eq!(
                argmax(row) as u32,
                want,
                "{id}: generated token {i} differs from llama.cpp's"
            );
        }
    }
}

/// The generation loop itself, uncached (slow), for a few tokens of the shortest prompt: it
/// generates llama.cpp's first tokens, and stops where llama.cpp stopped if that is sooner.
#[test]
fn the_generation_loop_produces_llama_cpp_tokens() {
    const MAX_TOKENS: usize = 8;
    let (model, tok) = model();
    let (id, prompt) = prompts().into_iter().min_by_key(|(_, p)| p.len()).unwrap();
    let want = generated(&id);
    // llama.cpp generated up to 64 tokens (see the test above): within our first MAX_TOKENS it
    // either went on, or ended with an end-of-generation token, where we must stop too.
    let want = &want[..want.len().min(MAX_TOKENS)];
    let want_stop = if want.len() == MAX_TOKENS {
        StopReason::MaxTokens
    } else {
        assert!(
            tok.is_eog(*want.last().expect("llama.cpp generated at least one token")),
            "{id}: llama.cpp stopped after {} tokens without an end-of-generation token",
            want.len()
        );
        StopReason::EndOfGeneration
    };
    let params = GenParams {
        max_tokens: MAX_TOKENS,
        sampler: SamplerParams::greedy(),
        stop: vec![],
        rule: None,
    };
    let mut streamed = String::new();
    let g = generate(&mut Uncached::new(model), tok, &prompt, &params, &mut |s| {
        streamed.push_str(s)
    })
    .unwrap();
    testkit::assert_same_sequence(&format!("{id}: greedy token ids"), &g.ids, want);
    assert_eq!(g.stop, want_stop, "{id}: why generation stopped");
    assert_eq!(streamed, g.text);
    assert_eq!(g.text, tok.decode(&g.ids));
}
