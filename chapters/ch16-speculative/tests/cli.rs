//! `llm-rs run --spec`: the same text as without it, acceptance in `--json`, and settings that
//! cannot run refused with the flag named.

use testkit::{json_printed as json, llm_rs_run as llm_rs};

const PROMPT: &str = "Copy the words: alpha beta gamma delta epsilon zeta eta theta. Again: alpha";

#[test]
fn spec_ngram_prints_what_plain_decoding_prints() {
    let common = [
        "--temp",
        "0",
        "-n",
        "32",
        "--json",
        "--threads",
        "2",
        PROMPT,
    ];
    let plain = json(&llm_rs(&common));
    let spec = json(&llm_rs(
        &[&["--spec", "ngram", "--draft-max", "6"][..], &common].concat(),
    ));
    assert_eq!(spec["ids"], plain["ids"]);
    assert_eq!(spec["text"], plain["text"]);
    let s = &spec["speculative"];
    assert_eq!(s["kind"], "ngram");
    assert_eq!(s["draft_max"], 6);
    let (proposed, accepted) = (
        s["proposed"].as_u64().unwrap(),
        s["accepted"].as_u64().unwrap(),
    );
    assert!(accepted > 0 && accepted <= proposed, "{s}");
    assert!(s["tokens_per_pass"].as_f64().unwrap() > 1.0, "{s}");
    assert!(plain.get("speculative").is_none());
}

#[test]
fn settings_that_cannot_run_are_refused_by_name() {
    for (args, says) in [
        (&["--spec", "draft"][..], "--draft-model"),
        (&["--spec", "ngram", "--draft-max", "0"][..], "--draft-max"),
        (
            &["--spec", "ngram", "--draft-model", "x.gguf"][..],
            "--draft-model",
        ),
        (
            &["--spec", "draft", "--draft-model", "/nonexistent.gguf"][..],
            "/nonexistent.gguf",
        ),
        (&["--spec", "sideways"][..], "--spec"),
    ] {
        let out = llm_rs(&[args, &["-n", "1", "Hi"]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} ran");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
