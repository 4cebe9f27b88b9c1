//! Encoding throughput on a few MB of generated text, with the hand-written pre-tokenizer and
//! with the regex one (`fancy-regex`), for the default model and the Llama 3 and Llama 2
//! vocabularies; and the pre-tokenizers alone.
//!
//! `cargo bench -p ch02 --bench encode`; `scripts/tokenizer-speed` runs it next to llama.cpp.

use ch01::GgufFile;
use ch02::{RegexSplitter, Tokenizer};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

/// A paragraph mixing prose, code, numbers, punctuation and other scripts, repeated with a
/// running section number until the text is `bytes` long.
fn text(bytes: usize) -> String {
    const PARAGRAPH: &str = "The quick brown fox doesn't jump over the lazy dog; it's 3.14 \
        times faster than you'd think, and we'll see why in section 12.\n\
        fn main() {\n    let x: Vec<u32> = (0..1024).map(|i| i * 2).collect();\n    \
        println!(\"{x:?}\");\n}\n\
        Naïve café owners in Zürich paid €1,234.56 — roughly ¥190,000 — for 42 croissants.\n\
        Привет, мир! 你好，世界！ こんにちは。 مرحبا 👋🌍\n\n";
    let mut s = String::with_capacity(bytes + PARAGRAPH.len() + 32);
    let mut i = 0;
    while s.len() < bytes {
        s.push_str(&format!("Section {i}: "));
        s.push_str(PARAGRAPH);
        i += 1;
    }
    s
}

fn load(path: std::path::PathBuf) -> Tokenizer {
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
    Tokenizer::from_gguf(&file.gguf).unwrap_or_else(|e| panic!("{e}"))
}

fn bench(c: &mut Criterion) {
    const SIZE: usize = 2 << 20;
    let text = text(SIZE);
    let refdata = |name: &str| {
        testkit::refdata::path(&format!("tokenizer/ggml-vocab-{name}.gguf"))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let vocabs = [
        (
            "smollm",
            load(shared::default_model_path().unwrap_or_else(|e| panic!("{e}"))),
        ),
        ("llama3", load(refdata("llama-bpe"))),
        ("llama2-spm", load(refdata("llama-spm"))),
    ];

    let mut group = c.benchmark_group("encode");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.sample_size(10);
    // `scripts/tokenizer-speed` times llama.cpp on the same text and checks it gives the same
    // ids: with LLM_RS_ENCODE_DUMP=DIR the text and each vocabulary's ids are written there.
    let dump = std::env::var_os("LLM_RS_ENCODE_DUMP").map(std::path::PathBuf::from);
    if let Some(dir) = &dump {
        std::fs::write(dir.join("text.txt"), &text).expect("write the text");
    }
    for (name, tok) in &vocabs {
        // Validate before timing: the two splitters agree, and the tokens decode to the text.
        let ids = tok.encode(&text, false, false);
        if let Some(dir) = &dump {
            let json = format!("{ids:?}").replace(' ', "");
            std::fs::write(dir.join(format!("{name}.ids.json")), json).expect("write the ids");
        }
        assert!(ids.len() > text.len() / 8, "{name}: {} tokens", ids.len());
        if let Some(pre) = tok.pre_tokenizer() {
            let re = RegexSplitter::new(pre);
            assert_eq!(
                tok.encode_with(&re, &text, false, false),
                ids,
                "{name}: splitters differ"
            );
            group.bench_function(format!("{name}/regex/2MiB"), |b| {
                b.iter(|| tok.encode_with(&re, black_box(&text), false, false))
            });
        }
        if *name == "smollm" {
            assert_eq!(tok.decode(&ids), text, "{name}: does not round-trip");
        }
        group.bench_function(format!("{name}/hand/2MiB"), |b| {
            b.iter(|| tok.encode(black_box(&text), false, false))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("pre-tokenize");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.sample_size(10);
    let splitter = vocabs[0].1.splitter().expect("SmolLM2 is BPE");
    let re = RegexSplitter::new(splitter.pre_tokenizer());
    group.bench_function("smollm/hand/2MiB", |b| {
        b.iter(|| {
            let mut out = Vec::new();
            splitter.split(black_box(&text), &mut out);
            out
        })
    });
    group.bench_function("smollm/regex/2MiB", |b| {
        b.iter(|| {
            let mut out = Vec::new();
            re.split(black_box(&text), &mut out);
            out
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
