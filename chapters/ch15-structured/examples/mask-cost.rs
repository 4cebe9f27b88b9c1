//! What a grammar costs a generation: the mask per token on four vocabularies, and constrained
//! against unconstrained decoding on the default model.
//!
//! ```text
//! cargo run --release -p ch15 --example mask-cost [-- --runs 3]
//! ```
//!
//! Table 1 walks a JSON document of the schema below token by token through its grammar, on
//! the tokenizers of SmolLM2 (49,152 tokens), Llama 3 (128,256), Qwen2 (151,936) and Gemma 3
//! (262,144), and gives the median time per token of: asking whether one token may come next
//! (what most steps need), a whole mask computed from the trie, and a whole mask from the
//! cache. Table 2 generates greedily on the default model with and without the schema and
//! gives decode speed and the time to the first token, medians of `--runs`.

use ch01::GgufFile;
use ch02::Tokenizer;
use ch04::cli::Runner;
use ch04::{GenParams, SamplerParams, TokenRule};
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::engine::{Engine, LoadMode, Scheduled};
use ch10::mapped::MapOptions;
use ch14::large::{self, Recipe};
use ch15::matcher::Matcher;
use ch15::{Constraint, Grammar, TokenIndex, schema};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A schema of a dozen fields, of every JSON type.
const SCHEMA: &str = r#"{"type": "object", "properties": {
  "name": {"type": "string"}, "country": {"type": "string"},
  "population": {"type": "integer"}, "area_km2": {"type": "number"},
  "capital": {"type": "boolean"}, "founded": {"type": "integer"},
  "climate": {"enum": ["arid", "temperate", "tropical", "polar"]},
  "mayor": {"type": "string"}, "languages": {"type": "array", "items": {"type": "string"}},
  "timezone": {"type": "string"}, "coastal": {"type": "boolean"},
  "location": {"type": "object", "properties": {"lat": {"type": "number"},
    "lon": {"type": "number"}}, "required": ["lat", "lon"]}},
  "required": ["name", "country", "population", "area_km2", "capital", "founded", "climate",
    "mayor", "languages", "timezone", "coastal", "location"]}"#;

/// An instance of [`SCHEMA`], as a model might write it.
const DOC: &str = r#"{"name": "Lyon", "country": "France", "population": 522250, "area_km2": 47.87, "capital": false, "founded": -43, "climate": "temperate", "mayor": "Grégory Doucet", "languages": ["French"], "timezone": "Europe/Paris", "coastal": false, "location": {"lat": 45.76, "lon": 4.84}}"#;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn max(v: &[Duration]) -> Duration {
    v.iter().copied().max().unwrap_or_default()
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn tokenizer(path: &PathBuf) -> Tokenizer {
    let file = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&file.gguf).unwrap_or_else(|e| panic!("{e}"))
}

fn made(shape: &str) -> PathBuf {
    let r = Recipe::named(shape, "Q4_0")
        .and_then(|r| r.with_layers(2))
        .unwrap_or_else(|e| panic!("{e}"));
    large::ensure_made(&r, &mut |_, _| {}).unwrap_or_else(|e| panic!("{e}"))
}

/// Table 1: the cost per token of one check, a mask from the trie, a mask from the cache.
fn mask_costs(grammar: &Grammar) {
    let vocabularies = [
        (
            "SmolLM2",
            shared::default_model_path().unwrap_or_else(|e| panic!("{e}")),
        ),
        ("Llama 3", made("llama3-8b")),
        ("Qwen2", made("qwen2-7b")),
        (
            "Gemma 3",
            shared::ensure_cached(&shared::GEMMA3_MODEL).unwrap_or_else(|e| panic!("{e}")),
        ),
    ];
    println!(
        "| vocabulary | tokens | trie nodes | trie built (ms) | steps | check one token (µs) | \
         mask from the trie, median / max (µs) | mask from the cache (µs) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, path) in vocabularies {
        let tok = tokenizer(&path);
        let t0 = Instant::now();
        let index = TokenIndex::new(&tok);
        let build = t0.elapsed();
        let ids = tok.encode(DOC, false, false);
        let constraint = Constraint::new(grammar.clone());
        let mut rule = constraint.state(&tok).unwrap_or_else(|e| panic!("{e}"));
        let mut matcher = Matcher::new(Arc::new(grammar.clone())).expect("start");
        let mut logits = vec![0.0f32; tok.vocab_size()];
        let (mut check, mut trie, mut cached) = (Vec::new(), Vec::new(), Vec::new());
        for &t in &ids {
            let t0 = Instant::now();
            let ok = rule.allows(t);
            check.push(t0.elapsed());
            assert!(ok, "{name}: the document's token {t} is refused");
            let t0 = Instant::now();
            let bits = index.allowed(grammar, &matcher.stacks, matcher.partial);
            trie.push(t0.elapsed());
            std::hint::black_box(bits);
            rule.mask(&mut logits); // fills the cache for this state
            logits.fill(0.0);
            let t0 = Instant::now();
            rule.mask(&mut logits);
            cached.push(t0.elapsed());
            logits.fill(0.0);
            rule.accept(t);
            matcher
                .accept_bytes(&tok.token_to_piece(t))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        println!(
            "| {name} | {} | {} | {:.1} | {} | {} | {} / {} | {} |",
            tok.vocab_size(),
            index.n_nodes(),
            build.as_secs_f64() * 1e3,
            ids.len(),
            us(median(check)),
            us(median(trie.clone())),
            us(max(&trie)),
            us(median(cached))
        );
    }
}

/// Table 2: greedy decoding on the default model, unconstrained and under the schema.
fn throughput(grammar: &Grammar, runs: usize) {
    let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let fast = FastLoader::new(new_pool(PoolKind::Spin, 2));
    let engine = Engine::load(
        &path,
        LoadMode::Map(MapOptions::default()),
        fast,
        &ch13::architectures(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let template = engine.template.as_ref().expect("a chat template");
    let messages = [ch02::Message::new(
        "user",
        &format!("Describe Lyon as JSON with the fields of this schema: {SCHEMA}"),
    )];
    let prompt = template
        .encode(&engine.tokenizer, &messages, true)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut runner = Scheduled::new(&engine, 2048, 1).unwrap_or_else(|e| panic!("{e}"));
    let constraint = Constraint::new(grammar.clone());
    let params = |rule: Option<Arc<dyn ch04::MakeRule>>| GenParams {
        max_tokens: 160,
        sampler: SamplerParams::greedy(),
        stop: vec![],
        rule,
    };
    println!(
        "| decoding | tokens | decode (tok/s) | first token (ms) | masks cached |\n|---|---:|---:|---:|---:|"
    );
    let mut row = |name: &str, rule: Option<Arc<dyn ch04::MakeRule>>, cold: bool| {
        let (mut speed, mut first, mut n) = (Vec::new(), Vec::new(), 0);
        for _ in 0..runs {
            // Each run recomputes the prompt: the prefix cache is emptied.
            runner = Scheduled::new(&engine, 2048, 1).unwrap_or_else(|e| panic!("{e}"));
            let rule = match (&rule, cold) {
                (Some(_), true) => {
                    Some(Arc::new(Constraint::new(grammar.clone())) as Arc<dyn ch04::MakeRule>)
                }
                _ => rule.clone(),
            };
            let g = runner
                .generate(&prompt, &params(rule), &mut |_| {})
                .unwrap_or_else(|e| panic!("{e}"));
            speed.push(Duration::from_secs_f64(1.0 / g.decode_tok_s()));
            first.push(g.prefill);
            n = g.ids.len();
        }
        let per_token = median(speed);
        println!(
            "| {name} | {n} | {:.1} | {:.1} | {} |",
            1.0 / per_token.as_secs_f64(),
            median(first).as_secs_f64() * 1e3,
            if rule.is_some() {
                constraint.cached_masks().to_string()
            } else {
                "–".into()
            }
        );
    };
    row("unconstrained", None, false);
    row(
        "schema, cold mask cache",
        Some(Arc::new(constraint.clone())),
        true,
    );
    row(
        "schema, warm mask cache",
        Some(Arc::new(constraint.clone())),
        false,
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut runs = 3;
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--runs", Some(n)) => runs = n.parse().expect("--runs N"),
            _ => {
                eprintln!("usage: mask-cost [--runs N]");
                std::process::exit(2);
            }
        }
    }
    let gbnf = schema::schema_text_to_grammar(SCHEMA).unwrap_or_else(|e| panic!("{e}"));
    let grammar = Grammar::parse(&gbnf, "root").unwrap_or_else(|e| panic!("{e}"));
    mask_costs(&grammar);
    println!();
    throughput(&grammar, runs);
}
