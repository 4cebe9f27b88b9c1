//! `reference-data/` is whole, and was computed from the default model.
//!
//! Every chapter compares against these files, so a missing, stale or hand-edited file must
//! fail here first, with the way to regenerate it, rather than as a puzzling numeric
//! mismatch in some chapter's test.

use serde_json::Value;
use shared::model::sha256_file;
use shared::{DEFAULT_MODEL, default_model_path};
use std::collections::BTreeSet;
use std::path::Path;
use testkit::refdata::{self, TensorFile};

const HINT: &str = "hint: re-run `scripts/export-reference` and commit reference-data/";

/// Files in `reference-data/` that the manifest does not list: the manifest itself (it cannot
/// hold its own hash) and the hand-written format documentation.
const UNLISTED_OK: [&str; 2] = ["manifest.json", "README.md"];

fn manifest() -> Value {
    refdata::manifest().unwrap_or_else(|e| panic!("{e}"))
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("manifest.json: no string at {pointer}\n{HINT}"))
}

fn listed_files(m: &Value) -> Vec<(String, String)> {
    let files = m
        .get("files")
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("manifest.json: no `files` map\n{HINT}"));
    files
        .iter()
        .map(|(rel, info)| {
            let sha = info
                .get("sha256")
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("manifest.json: files[{rel:?}] has no sha256\n{HINT}"));
            (rel.clone(), sha.to_string())
        })
        .collect()
}

fn walk(dir: &Path, root: &Path, out: &mut BTreeSet<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, root, out);
        } else {
            let rel = path.strip_prefix(root).unwrap();
            let rel: Vec<_> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect();
            out.insert(rel.join("/"));
        }
    }
}

#[test]
fn every_listed_file_has_its_recorded_sha256() {
    let m = manifest();
    let listed = listed_files(&m);
    assert!(!listed.is_empty(), "manifest.json lists no files\n{HINT}");
    for (rel, want) in listed {
        let path = refdata::path(&rel).unwrap_or_else(|e| panic!("{e}"));
        let got = sha256_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            got, want,
            "reference-data/{rel} has sha256 {got}, the manifest records {want}: the file was \
             changed after it was exported\n{HINT}"
        );
    }
}

#[test]
fn no_unlisted_file_is_present() {
    let m = manifest();
    let listed: BTreeSet<String> = listed_files(&m).into_iter().map(|(rel, _)| rel).collect();
    let root = refdata::dir();
    let mut present = BTreeSet::new();
    walk(&root, &root, &mut present);
    let stray: Vec<_> = present
        .iter()
        .filter(|rel| !listed.contains(*rel) && !UNLISTED_OK.contains(&rel.as_str()))
        .collect();
    assert!(
        stray.is_empty(),
        "reference-data/ holds files the manifest does not list: {stray:?}\n{HINT}"
    );
}

#[test]
fn references_were_computed_from_the_default_model() {
    let m = manifest();
    let sha = str_at(&m, "/model/sha256");
    assert_eq!(
        sha, DEFAULT_MODEL.sha256,
        "reference-data/ was computed from a model with sha256 {sha}, but the default model \
         (shared::DEFAULT_MODEL) is {}\n{HINT}",
        DEFAULT_MODEL.sha256
    );
    assert_eq!(str_at(&m, "/model/file"), DEFAULT_MODEL.file_name);
    assert_eq!(
        m.pointer("/model/size").and_then(Value::as_u64),
        Some(DEFAULT_MODEL.size)
    );

    let path = default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let actual = sha256_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let why = if std::env::var_os("LLM_RS_MODEL").is_some() {
        "LLM_RS_MODEL points at another model: unset it to run the checks against llama.cpp"
    } else {
        "the cached model file is not the one the references were computed from"
    };
    assert_eq!(
        actual,
        sha,
        "{} has sha256 {actual}; {why}\n{HINT}",
        path.display()
    );
}

#[test]
fn prompt_files_match_the_prompts_in_the_manifest() {
    let m = manifest();
    let prompts = m
        .get("prompts")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("manifest.json: no `prompts` list\n{HINT}"));
    assert!(
        !prompts.is_empty(),
        "manifest.json lists no prompts\n{HINT}"
    );
    for p in prompts {
        let id = str_at(p, "/id");
        let ids: Vec<i64> = p
            .get("ids")
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("prompt {id}: no ids\n{HINT}"))
            .iter()
            .map(|v| v.as_i64().expect("token ids are integers"))
            .collect();
        let n = ids.len();
        let file = TensorFile::open(&format!("prompts/{id}.safetensors"))
            .unwrap_or_else(|e| panic!("{e}"));
        let (shape, tokens) = file.i64("tokens").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (shape, &tokens),
            (vec![n], &ids),
            "prompt {id}: tokens differ from the manifest\n{HINT}"
        );
        // Token dimension outermost, and attention cut to the prompt's own n_tokens KV cells.
        let l_out = file.f32("l_out-29").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l_out.shape, [n, 576], "prompt {id}: l_out-29\n{HINT}");
        let q = file.f32("Qcur-0").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(q.shape, [n, 9, 64], "prompt {id}: Qcur-0\n{HINT}");
        let kq = file.f32("kq_soft_max-0").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(kq.shape, [9, n, n], "prompt {id}: kq_soft_max-0\n{HINT}");
        // Each row of attention weights is a probability distribution over earlier positions.
        for (r, row) in kq.data.chunks_exact(n).enumerate() {
            let sum: f32 = row.iter().sum();
            assert!(
                (sum - 1.0).abs() < 1e-5,
                "prompt {id}: kq_soft_max-0 row {r} sums to {sum}"
            );
        }

        let decode = TensorFile::open(&format!("prompts/{id}.decode.safetensors"))
            .unwrap_or_else(|e| panic!("{e}"));
        let generation = refdata::json(&format!("prompts/{id}.generation.json"))
            .unwrap_or_else(|e| panic!("{e}"));
        let generated = generation
            .get("ids")
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("prompt {id}: generation has no ids\n{HINT}"));
        let (topk_shape, topk_ids) = decode.i64("topk_ids").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            topk_shape,
            [generated.len(), 32],
            "prompt {id}: topk_ids\n{HINT}"
        );
        // Greedy decoding: each generated token is the top logit of its step.
        for (step, tok) in generated.iter().enumerate() {
            assert_eq!(
                Some(topk_ids[step * 32]),
                tok.as_i64(),
                "prompt {id}: step {step}'s token is not its top-1\n{HINT}"
            );
        }
    }
}
