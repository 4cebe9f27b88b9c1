//! A server program started for a test: on a port the system picks, its log passed through,
//! killed when the test ends.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A server process, killed (and reaped) when dropped.
pub struct Served(pub Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `command` (a server told to listen on port 0) and return it with its base URL, read
/// from the first log line that says `listening on URL` (plain or inside a structured log
/// line). Every line of its standard error is echoed, prefixed `server: `. Panics if no such
/// line comes within `timeout`.
pub fn serve(command: &mut Command, timeout: Duration) -> (Served, String) {
    let mut child = command
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{command:?} does not start: {e}"));
    let stderr = child.stderr.take().expect("stderr is piped");
    let served = Served(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("server: {line}");
            if let Some(i) = line.find("listening on ") {
                let rest = &line[i + "listening on ".len()..];
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
            }
        }
    });
    let base = rx
        .recv_timeout(timeout)
        .expect("the server says where it listens");
    (served, base)
}

/// `llm-rs serve --port 0 ARGS…` on 127.0.0.1 ([`serve`]), on the default model unless `args`
/// name one, returned once it answers `/ready` with 200 (its model loaded): the finished
/// engine's server for a test. Panics if it is not ready within `timeout`.
pub fn llm_rs_serve(args: &[&str], timeout: Duration) -> (Served, String) {
    let started = std::time::Instant::now();
    let mut command = Command::new(crate::program("llm-rs", crate::Target::Bin, "llm-rs", &[]));
    command.arg("serve").args(["--port", "0"]).args(args);
    if !args.contains(&"--model") {
        let model = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
        command.arg("--model").arg(model);
    }
    let (served, base) = serve(&mut command, timeout);
    while !ready(&base) {
        assert!(
            started.elapsed() < timeout,
            "{base}: not ready within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (served, base)
}

/// Whether the server at `base` (`http://HOST:PORT`) answers `GET /ready` with 200: a bare
/// HTTP/1.0 request, so that this kit needs no HTTP client.
fn ready(base: &str) -> bool {
    use std::io::{Read, Write};
    let Some(addr) = base.strip_prefix("http://") else {
        panic!("{base}: not an http:// address")
    };
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = [0u8; 12];
    s.write_all(b"GET /ready HTTP/1.0\r\n\r\n").is_ok()
        && s.read_exact(&mut head).is_ok()
        && head.ends_with(b" 200")
}
