//! One exchange with the server, as a client sees it: a chat request answered with one JSON
//! response, or with `--stream` the same request streamed as Server-Sent Events.
//!
//! ```text
//! cargo run --release -p ch11 --example exchange -- [--stream] [the server example's flags]
//! ```
//!
//! It loads the model, serves it on 127.0.0.1 at a port the system picks (`--host` and
//! `--port` are ignored), sends the request over loopback, prints it and the response as it
//! came, and shuts the server down. Two things are changed in what it prints:
//! `created`, the Unix time of the answer, is shown as `<unix time>` (it changes every second);
//! and an event longer than a page is wrapped at 100 columns, its continuation indented (on the
//! wire each event is one `data:` line, followed by an empty line). The request is greedy
//! (`temperature` 0), so the text is the same on every run.

use clap::Parser;
use reqwest::blocking::Client;
use serde_json::Value;
use std::error::Error;
use std::io::{BufRead, BufReader};
use std::sync::Arc;

/// The chat request, as it is sent.
const CHAT: &str = r#"{
  "messages": [{"role": "user", "content": "Name the capital of France."}],
  "max_tokens": 16,
  "temperature": 0
}"#;

/// The same request streamed, with the usage as a last chunk.
const STREAMED: &str = r#"{
  "messages": [{"role": "user", "content": "Name the capital of France."}],
  "max_tokens": 16,
  "temperature": 0,
  "stream": true,
  "stream_options": {"include_usage": true}
}"#;

/// Widest line printed: an event is wrapped to fit the book's page.
const WIDTH: usize = 100;

/// The `server` example's flags.
#[path = "common/server_flags.rs"]
mod server_flags;

/// `--stream`, and the `server` example's flags.
#[derive(Parser)]
struct Exchange {
    /// Send the request with `"stream": true`.
    #[arg(long)]
    stream: bool,
    #[command(flatten)]
    server: server_flags::Server,
}

fn main() -> Result<(), Box<dyn Error>> {
    let cli = Exchange::parse();
    let mut args = cli.server.args(ch04::architectures());
    (args.host, args.port) = ("127.0.0.1".into(), 0);
    args.check()?;
    server_flags::default_model(&mut args.model);
    let state = ch11::AppState::new(args.limits());
    if state.loaded.set(ch11::load(&args)?).is_err() {
        unreachable!("loaded once");
    }
    // The server on its own runtime's threads; the client, blocking, on this one.
    let runtime = ch11::runtime()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(ch11::server::serve(
        listener,
        Arc::clone(&state),
        Arc::clone(&args.endpoints),
        async {
            let _ = stopped.await;
        },
    ));

    let client = Client::new();
    let body = if cli.stream { STREAMED } else { CHAT };
    exchange(&client, &base, "/v1/chat/completions", body)?;

    drop(client);
    let _ = stop.send(());
    runtime.block_on(server)??;
    Ok(())
}

/// POST `body` to `path`; print the request, then the response's status line, its
/// `content-type` and its body (a JSON body pretty-printed, a stream line by line).
fn exchange(client: &Client, base: &str, path: &str, body: &str) -> Result<(), Box<dyn Error>> {
    println!("POST {path} HTTP/1.1\ncontent-type: application/json\n\n{body}\n");
    let response = client
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()?;
    let kind = response.headers()["content-type"].to_str()?.to_string();
    println!(
        "{:?} {}\ncontent-type: {kind}\n",
        response.version(),
        response.status()
    );
    if kind == "text/event-stream" {
        for line in BufReader::new(response).lines() {
            println!("{}", wrap(&mask_created(&line?)));
        }
    } else {
        let v: Value = response.json()?;
        println!("{}", mask_created(&serde_json::to_string_pretty(&v)?));
    }
    Ok(())
}

/// `text` with the value of every `"created":` shown as `<unix time>`.
fn mask_created(text: &str) -> String {
    let key = "\"created\":";
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(key) {
        let (head, tail) = rest.split_at(at + key.len());
        let value = tail.trim_start_matches(' ');
        let spaces = &tail[..tail.len() - value.len()];
        let digits = value.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(head);
        out.push_str(spaces);
        out.push_str("<unix time>");
        rest = &value[digits..];
    }
    out.push_str(rest);
    out
}

/// `line` cut after a comma that ends a JSON member (`,"`) wherever it passes [`WIDTH`],
/// each continuation indented to follow `data: `.
fn wrap(line: &str) -> String {
    const INDENT: &str = "      ";
    // Each piece ends with the comma after a member; the next begins with its key's quote.
    let mut pieces = Vec::new();
    let mut start = 0;
    for (comma, _) in line.match_indices(",\"") {
        pieces.push(&line[start..=comma]);
        start = comma + 1;
    }
    pieces.push(&line[start..]);
    let mut out = String::new();
    let mut current = String::new();
    for piece in pieces {
        if !current.trim().is_empty() && current.len() + piece.len() > WIDTH {
            out.push_str(&current);
            out.push('\n');
            current = INDENT.to_string();
        }
        current.push_str(piece);
    }
    out.push_str(&current);
    out
}
