//! llama.cpp's vocabulary-only GGUF files (`reference-data/tokenizer/ggml-vocab-*.gguf`: the
//! metadata of many models, no tensors) parse, and hold a consistent tokenizer.

use ch01::config::ConfigError;
use ch01::{Config, GgufFile};
use std::path::PathBuf;
use testkit::refdata;

fn vocab_files() -> Vec<PathBuf> {
    let dir = refdata::path("tokenizer").unwrap_or_else(|e| panic!("{e}"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("ggml-vocab-") && name.ends_with(".gguf")
        })
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no ggml-vocab-*.gguf in {}",
        dir.display()
    );
    files
}

#[test]
fn every_vocab_file_parses() {
    for path in vocab_files() {
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let name = path.display();
        assert!(
            f.tensors.is_empty(),
            "{name}: a vocab-only file has no tensors"
        );
        assert_eq!(f.data_offset, f.bytes().len() as u64, "{name}");
        let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
        assert!(!tokens.is_empty(), "{name}");
        f.get_str("tokenizer.ggml.model").unwrap();
        // Per-token arrays, where present, have one entry per token.
        if f.get("tokenizer.ggml.token_type").is_some() {
            let types = f.get_i32_array("tokenizer.ggml.token_type").unwrap();
            assert_eq!(types.len(), tokens.len(), "{name}: token_type");
        }
        if f.get("tokenizer.ggml.scores").is_some() {
            let scores = f.get_f32_array("tokenizer.ggml.scores").unwrap();
            assert_eq!(scores.len(), tokens.len(), "{name}: scores");
        }
    }
}

#[test]
fn llama_vocab_files_give_a_config_and_others_name_their_architecture() {
    let mut llama = 0;
    for path in vocab_files() {
        let f = GgufFile::open(&path).unwrap();
        let arch = f.architecture().unwrap().to_string();
        match Config::from_gguf(&f, &["llama"]) {
            Ok(c) => {
                assert_eq!(arch, "llama");
                let tokens = f.get_array("tokenizer.ggml.tokens").unwrap().len();
                if f.get("llama.vocab_size").is_none() {
                    assert_eq!(c.vocab_size, tokens, "{}", path.display());
                }
                assert!(c.tied_embeddings, "no tensors, so no output.weight");
                llama += 1;
            }
            Err(ConfigError::UnsupportedArch { arch: a, .. }) => assert_eq!(a, arch),
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }
    assert!(llama > 0, "no llama vocab file");
}
