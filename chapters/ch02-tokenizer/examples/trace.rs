//! The worked examples of the chapter, printed from the real tokenizers: pre-tokenization,
//! BPE merges step by step, SentencePiece merges by score, byte fallback, special tokens, and
//! streaming detokenization.
//!
//! `cargo run -q -p ch02 --example trace`

use ch01::GgufFile;
use ch02::unicode::byte_level_encode;
use ch02::{StreamDecoder, Tokenizer};

fn load(path: std::path::PathBuf) -> Result<Tokenizer, Box<dyn std::error::Error>> {
    Ok(Tokenizer::from_gguf(&GgufFile::open(&path)?.gguf)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let smollm = load(shared::default_model_path()?)?;
    let llama2 = load(testkit::refdata::path(
        "tokenizer/ggml-vocab-llama-spm.gguf",
    )?)?;
    let splitter = smollm.splitter().ok_or("SmolLM2 is byte-level BPE")?;

    let text = "Don't panic: it's 2024,  and tokenization works!";
    let pre = splitter.pre_tokenizer();
    println!("== pre-tokenization ({pre:?}) of {text:?}");
    println!("{:?}\n", splitter.pieces(text));

    let word = " tokenization";
    println!("== BPE merges of {word:?} (SmolLM2; rank = line in tokenizer.ggml.merges)");
    let bpe = smollm.bpe().ok_or("SmolLM2 is byte-level BPE")?;
    for (rank, symbols) in bpe.merge_steps(word.as_bytes()) {
        let shown: Vec<String> = symbols.iter().map(|s| byte_level_encode(s)).collect();
        match rank {
            None => println!("  start      {}", shown.join(" ")),
            Some(r) => println!("  rank {r:>5} {}", shown.join(" ")),
        }
    }
    let ids = smollm.encode(word, false, false);
    println!("  ids {ids:?}\n");

    let escaped = word.replace(' ', "▁");
    println!("== SentencePiece merges of {escaped:?} (Llama 2; higher score first)");
    let mut out = Vec::new();
    let mut show = |symbols: Vec<&str>, score: Option<f32>| match score {
        None => println!("  start        {}", symbols.join(" ")),
        Some(s) => println!("  score {s:>7.0} {}", symbols.join(" ")),
    };
    ch02::spm::encode(
        llama2.vocab(),
        &escaped,
        |_| None,
        &mut out,
        Some(&mut show),
    );
    println!("  ids {out:?}\n");

    for text in ["龘", "é"] {
        let ids = llama2.encode(text, false, false);
        let texts: Vec<&str> = ids.iter().filter_map(|&id| llama2.token_text(id)).collect();
        println!("== Llama 2: {text:?} -> {ids:?} = {texts:?}");
    }
    println!();

    let text = "<|im_start|>user";
    for parse in [false, true] {
        let ids = smollm.encode(text, false, parse);
        println!("== SmolLM2: {text:?} with parse_special {parse}: {ids:?}");
    }
    println!();

    let text = "café 👋";
    let ids = llama2.encode(text, false, false);
    println!("== streaming {text:?} from Llama 2 ids {ids:?}");
    let mut stream = StreamDecoder::new(&llama2);
    for id in ids {
        let piece = llama2.token_to_piece(id);
        println!(
            "  push {id:>5} piece {:<18} -> {:?}",
            format!("{piece:02X?}"),
            stream.push(id)
        );
    }
    println!("  finish -> {:?}", stream.finish());
    Ok(())
}
