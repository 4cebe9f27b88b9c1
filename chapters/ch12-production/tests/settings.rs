//! Chapter 12's layering of settings (`examples/common/settings.rs`, which the production
//! example and `llm-rs serve` include): flags beat the environment, which beats the file,
//! which beats the default; a bad file is an error naming it and its key; the production
//! server's repeated flags take lists.

#[path = "../examples/common/production_flags.rs"]
mod production_flags;

use clap::Parser;
use production_flags::settings::parse_from;
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Parser, Debug)]
struct Demo {
    #[arg(long, default_value_t = 8080)]
    port: u16,
    #[arg(long, default_value = "text")]
    log_format: String,
    #[arg(long)]
    no_repack: bool,
    #[arg(long)]
    tag: Vec<String>,
    #[arg(long)]
    config: Option<PathBuf>,
}

fn argv(args: &[&str]) -> Vec<OsString> {
    std::iter::once("demo")
        .chain(args.iter().copied())
        .map(Into::into)
        .collect()
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), text).unwrap();
    f
}

/// For the one test that sets the environment, which is process-wide: its variable,
/// `LLM_RS_LAYERS_PORT`, is read by no other test.
#[derive(Parser, Debug)]
struct Layers {
    #[arg(long, default_value_t = 8080)]
    layers_port: u16,
    #[arg(long, default_value = "text")]
    log_format: String,
    #[arg(long)]
    no_repack: bool,
    #[arg(long)]
    config: Option<PathBuf>,
}

#[test]
fn flags_beat_the_environment_which_beats_the_file_which_beats_the_default() {
    let f = file("layers-port = 9000\nlog-format = \"json\"\nno_repack = true\n");
    let c = f.path().to_str().unwrap();
    let d: Layers = parse_from(argv(&[]), "config").unwrap();
    assert_eq!(
        (d.layers_port, d.log_format.as_str(), d.no_repack),
        (8080, "text", false)
    );
    let d: Layers = parse_from(argv(&["--config", c]), "config").unwrap();
    assert_eq!(
        (d.layers_port, d.log_format.as_str(), d.no_repack),
        (9000, "json", true)
    );
    // SAFETY: no other test reads or writes this variable, and none sets any.
    unsafe { std::env::set_var("LLM_RS_LAYERS_PORT", "9100") };
    let d: Layers = parse_from(argv(&["--config", c]), "config").unwrap();
    assert_eq!(d.layers_port, 9100, "the environment beats the file");
    let args = ["--config", c, "--layers-port", "9200"];
    let d: Layers = parse_from(argv(&args), "config").unwrap();
    assert_eq!(d.layers_port, 9200, "a flag beats the environment");
    unsafe { std::env::remove_var("LLM_RS_LAYERS_PORT") };
}

#[test]
fn a_bad_file_is_an_error_naming_the_file_and_the_key() {
    for (text, expect) in [
        ("prot = 1", "unknown key \"prot\""),
        ("port = \"many\"", "invalid value 'many' for '--port"),
        (
            "port = [1]",
            "\"port\" must be a string or a number, not array",
        ),
        ("no-repack = 1", "\"no-repack\" is a switch"),
        (
            "tag = [[1]]",
            "\"tag\" must be a string or a number, or a list of them, not array",
        ),
        ("config = \"x\"", "cannot name another file"),
        ("port = ", "expected"),
    ] {
        let f = file(text);
        let c = f.path().to_str().unwrap();
        let e = parse_from::<Demo>(argv(&["--config", c]), "config").unwrap_err();
        let m = e.to_string();
        assert!(m.contains(c) && m.contains(expect), "{text}: {m}");
    }
    let e = parse_from::<Demo>(argv(&["--config", "/nonexistent.toml"]), "config");
    assert!(e.unwrap_err().to_string().contains("/nonexistent.toml"));
}

#[test]
fn a_flag_given_more_than_once_takes_a_list_from_the_file() {
    for (text, expect) in [
        ("tag = [\"a\", \"b\"]", &["a", "b"][..]),
        ("tag = \"a\"", &["a"][..]),
        ("tag = []", &[][..]),
    ] {
        let f = file(text);
        let c = f.path().to_str().unwrap();
        let d: Demo = parse_from(argv(&["--config", c]), "config").unwrap();
        assert_eq!(d.tag, expect, "{text}");
    }
    let f = file("tag = [\"a\", \"b\"]");
    let c = f.path().to_str().unwrap();
    let d: Demo = parse_from(argv(&["--config", c, "--tag", "c"]), "config").unwrap();
    assert_eq!(d.tag, ["c"], "the command line's list replaces the file's");
}

fn parse(args: &[&str]) -> production_flags::Production {
    let argv = std::iter::once("production")
        .chain(args.iter().copied())
        .map(OsString::from)
        .collect();
    parse_from::<production_flags::Production>(argv, "config").unwrap()
}

#[test]
fn every_api_key_given_is_kept() {
    let p = parse(&["--api-key", "k1", "--api-key", "k2", "--api-key", "k3"]);
    assert_eq!(p.api_key, ["k1", "k2", "k3"]);
    assert!(
        !p.metrics_per_key,
        "key names stay out of /metrics by default"
    );
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        f.path(),
        "api-key = [\"k1\", \"k2\"]\nmetrics-per-key = true\n",
    )
    .unwrap();
    let p = parse(&["--config", f.path().to_str().unwrap()]);
    assert_eq!(p.api_key, ["k1", "k2"]);
    assert!(p.metrics_per_key);
}
