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
