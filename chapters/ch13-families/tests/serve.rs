//! Gemma 3 served: the finished engine's production server (`llm-rs serve`) on 127.0.0.1, at a port
//! the system picks. A completion must be llama.cpp's greedy continuation, and a chat request
//! goes through Gemma's chat template (the file carries none: the family's is used).

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

/// Every request ends within this; a hung server fails the test instead of hanging it.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// Loading Gemma 3 270M takes about a second; this allows for a busy machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Greedy tokens compared: llama.cpp's continuation of the prompt up to well before its first
/// near-tie with ours (step 18, see `tests/gemma3.rs`).
const N_TOKENS: usize = 8;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn gemma_path() -> String {
    let p = shared::ensure_cached(&shared::GEMMA3_MODEL).unwrap_or_else(|e| panic!("{e}"));
    p.to_string_lossy().into_owned()
}

/// llama.cpp's greedy continuation of the `short` prompt ("The capital of France is").
fn reference() -> (String, Vec<u32>) {
    let m = testkit::refdata::json("gemma3/prompts.json").unwrap_or_else(|e| panic!("{e}"));
    let p = m["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "short")
        .unwrap();
    let ids = p["generated"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    (p["text"].as_str().unwrap().to_string(), ids)
}

#[test]
fn the_server_runs_gemma_as_llama_cpp_does() {
    let model = gemma_path();
    let mut child = Command::new(testkit::program(
        "llm-rs",
        testkit::Target::Bin,
        "llm-rs",
        &[],
    ))
    .args([
        "serve",
        "--model",
        &model,
        "--port",
        "0",
        "--threads",
        "2",
        "--ctx",
        "512",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start serve");
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                let _ = tx.send(digits.parse::<u16>().unwrap());
            }
        }
    });
    let port = rx
        .recv_timeout(START_TIMEOUT)
        .expect("the server did not say where it listens");
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .build()
        .unwrap();
    // It listens before the model is loaded; `/ready` says when it serves.
    let started = Instant::now();
    while client
        .get(format!("{base}/ready"))
        .send()
        .map_or(true, |r| r.status() != 200)
    {
        assert!(started.elapsed() < START_TIMEOUT, "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }

    let (prompt, want) = reference();
    let file = ch01::GgufFile::open(&model).unwrap();
    let tokenizer = ch02::Tokenizer::from_gguf(&file.gguf).unwrap();
    let r: Value = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": prompt, "max_tokens": N_TOKENS, "temperature": 0}))
        .send()
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        r["choices"][0]["text"].as_str().unwrap(),
        tokenizer.decode(&want[..N_TOKENS]),
        "{r}"
    );

    let r: Value = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({
            "messages": [{"role": "user", "content": "Name three colors."}],
            "max_tokens": 16,
            "temperature": 0
        }))
        .send()
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .unwrap();
    let content = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.trim().is_empty(), "{r}");
    // The prompt is Gemma's template: `<bos><start_of_turn>user\nName three colors.
    // <end_of_turn>\n<start_of_turn>model\n`, 13 tokens (as in reference-data/gemma3's chat).
    assert_eq!(r["usage"]["prompt_tokens"], 13, "{r}");
    drop(server);
}
