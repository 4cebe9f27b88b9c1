//! API keys, and the tenants they make.
//!
//! Without keys anyone who can reach the port can use the server. With them (`--api-key`, or
//! a file of keys with `--api-keys`), every request to `/v1/…` must carry one, as OpenAI's
//! clients send it: `Authorization: Bearer KEY`. A missing or wrong key is a 401 in OpenAI's
//! shape; `/health`, `/ready` and `/metrics` stay open for the orchestrator and the scraper.
//!
//! - **Hashed at rest.** The file holds each key's SHA-256, not the key (`printf %s "$KEY" |
//!   sha256sum`), with a name for logs and metrics: `NAME SHA256-HEX` per line. A key given
//!   with `--api-key` is hashed when it is read. A presented key is hashed and compared with
//!   every stored hash in constant time, so the time an answer takes says nothing about how
//!   close a guess was; keys are never logged, only their names.
//! - **Tenants.** Each key is a tenant with its own partition of the prefix cache (chapter
//!   7's salt, through chapter 11's [`Tenant`]): a cache hit, and `cached_tokens` in the
//!   usage, never crosses keys. Without that, a client could learn another's system prompt by
//!   guessing it and watching how many tokens come back cached.
//! - **Per-key limits.** `--key-max-in-flight` requests at once and `--key-tokens-per-minute`
//!   tokens (prompt and completion, over the last 60 s) per key; past either a request is a
//!   429 with `Retry-After`, so one tenant cannot take the whole server.

use ch11::Tenant;
use ch11::api::ApiError;
use prometheus::{IntCounterVec, Opts, Registry};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A keys file larger than this is refused: a line is ~80 bytes, so this is 10,000 keys.
pub const MAX_KEYS_FILE_BYTES: u64 = 1 << 20;

/// The window of `--key-tokens-per-minute`.
const TOKEN_WINDOW: Duration = Duration::from_secs(60);

/// One key: its name and its SHA-256.
struct Key {
    name: String,
    hash: [u8; 32],
}

/// What one key has in use.
#[derive(Default)]
struct Usage {
    in_flight: AtomicUsize,
    /// Tokens charged in the last [`TOKEN_WINDOW`], oldest first.
    window: Mutex<VecDeque<(Instant, u64)>>,
}

/// The server's keys, their limits, and what each has in use.
pub struct Keys {
    keys: Vec<Key>,
    usage: Vec<Usage>,
    max_in_flight: usize,
    tokens_per_minute: u64,
    /// Requests the engine runs, by request id: whose tokens its outcome is.
    running: Mutex<HashMap<String, usize>>,
    requests: IntCounterVec,
    tokens: IntCounterVec,
}

/// Why a request was not let in.
pub enum Refused {
    /// 401: no key, or not one of ours.
    Unauthorized,
    /// 429: the key's limit; retry after this many seconds.
    Limited(&'static str, u64),
}

impl Keys {
    /// The keys of `--api-key` (in clear, named `cli`) and of the file `--api-keys`, with
    /// per-key limits (0: none). No keys: every request is let in.
    pub fn new(
        key: Option<&str>,
        file: Option<&Path>,
        max_in_flight: usize,
        tokens_per_minute: u64,
    ) -> Result<Keys, String> {
        let mut keys = Vec::new();
        if let Some(k) = key {
            if k.is_empty() {
                return Err("--api-key is empty".into());
            }
            keys.push(Key {
                name: "cli".into(),
                hash: Sha256::digest(k.as_bytes()).into(),
            });
        }
        if let Some(path) = file {
            keys.extend(read_file(path)?);
        }
        let mut names: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("--api-keys: the name {:?} is given twice", w[0]));
        }
        let labels = &["key", "status"];
        Ok(Keys {
            usage: keys.iter().map(|_| Usage::default()).collect(),
            keys,
            max_in_flight,
            tokens_per_minute,
            running: Mutex::new(HashMap::new()),
            requests: IntCounterVec::new(
                Opts::new(
                    "llmrs_key_requests_total",
                    "Requests to /v1/ by API key name (\"none\": no or a wrong key) and status: \
                     ok (let in), unauthorized, in_flight or tokens (refused by a limit).",
                ),
                labels,
            )
            .expect("a valid counter"),
            tokens: IntCounterVec::new(
                Opts::new(
                    "llmrs_key_tokens_total",
                    "Prompt and completion tokens by API key name.",
                ),
                &["key"],
            )
            .expect("a valid counter"),
        })
    }

    /// Whether requests need a key.
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    pub fn register(&self, registry: &Registry) {
        for c in [&self.requests, &self.tokens] {
            registry
                .register(Box::new(c.clone()))
                .expect("distinct metric names");
        }
    }

    // ANCHOR: admit
    /// Let in the request with `Authorization` header `authorization` and id `label`, or say
    /// why not. Let in, it holds a place among its key's requests until the returned guard is
    /// dropped, and its tokens are charged to the key when the engine reports them.
    pub fn admit(
        self: &Arc<Keys>,
        authorization: Option<&str>,
        label: &str,
    ) -> Result<(Tenant, Admitted), Refused> {
        let Some(i) = self.find(authorization) else {
            self.count("none", "unauthorized");
            return Err(Refused::Unauthorized);
        };
        // ANCHOR: yours_admit
        let name = &self.keys[i].name;
        let usage = &self.usage[i];
        if self.tokens_per_minute > 0 {
            let now = Instant::now();
            let mut w = usage.window.lock().unwrap_or_else(|e| e.into_inner());
            while w.front().is_some_and(|&(t, _)| now - t > TOKEN_WINDOW) {
                w.pop_front();
            }
            if w.iter().map(|&(_, n)| n).sum::<u64>() >= self.tokens_per_minute {
                let oldest = w.front().map_or(now, |&(t, _)| t);
                let wait = TOKEN_WINDOW.saturating_sub(now - oldest).as_secs() + 1;
                self.count(name, "tokens");
                return Err(Refused::Limited("tokens per minute", wait));
            }
        }
        let max = if self.max_in_flight == 0 {
            usize::MAX
        } else {
            self.max_in_flight
        };
        if usage
            .in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .is_err()
        {
            self.count(name, "in_flight");
            return Err(Refused::Limited("requests in flight", 1));
        }
        self.count(name, "ok");
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(label.to_string(), i);
        let salt = u64::from_le_bytes(self.keys[i].hash[..8].try_into().expect("8 bytes")) | 1;
        Ok((
            Tenant { salt },
            Admitted {
                keys: Arc::clone(self),
                key: i,
                label: label.to_string(),
            },
        ))
        // ANCHOR_END: yours_admit
    }
    // ANCHOR_END: admit

    // ANCHOR: find
    /// The key that `Authorization` header `authorization` presents (`Bearer KEY`), if it is
    /// one of ours. Every stored hash is compared, each in constant time: no early exit, so the
    /// time an answer takes says nothing about how close a guess was.
    fn find(&self, authorization: Option<&str>) -> Option<usize> {
        let presented: [u8; 32] =
            Sha256::digest(authorization?.strip_prefix("Bearer ")?.trim().as_bytes()).into();
        let mut found = None;
        for (i, k) in self.keys.iter().enumerate() {
            if constant_time_eq(&presented, &k.hash) {
                found = Some(i);
            }
        }
        found
    }
    // ANCHOR_END: find

    /// The engine finished request `label` with `tokens` tokens: charge its key.
    pub fn charge(&self, label: &str, tokens: u64) {
        let key = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(label);
        if let Some(i) = key {
            self.tokens
                .with_label_values(&[&self.keys[i].name])
                .inc_by(tokens);
            if self.tokens_per_minute > 0 {
                let mut w = self.usage[i]
                    .window
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                w.push_back((Instant::now(), tokens));
            }
        }
    }

    fn count(&self, key: &str, status: &str) {
        self.requests.with_label_values(&[key, status]).inc();
    }
}

/// A request let in: its place among its key's requests, given back when dropped.
pub struct Admitted {
    keys: Arc<Keys>,
    key: usize,
    label: String,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.keys.usage[self.key]
            .in_flight
            .fetch_sub(1, Ordering::SeqCst);
        // A request refused before the engine ran it has nothing to charge.
        self.keys
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.label);
    }
}

impl Refused {
    pub fn into_error(self) -> ApiError {
        match self {
            Refused::Unauthorized => ApiError {
                code: Some("invalid_api_key"),
                ..ApiError::new(
                    401,
                    "invalid_request_error",
                    "a valid API key is needed: send it as Authorization: Bearer KEY",
                )
            },
            Refused::Limited(what, wait) => ApiError {
                code: Some("rate_limit_exceeded"),
                retry_after: Some(wait),
                ..ApiError::new(
                    429,
                    "rate_limit_error",
                    format!("this API key is at its limit of {what}; try again in {wait} s"),
                )
            },
        }
    }
}

/// Whether `a` and `b` are equal, in a time that does not depend on where they differ.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// `NAME SHA256-HEX` per line; blank lines and `#` comments skipped.
fn read_file(path: &Path) -> Result<Vec<Key>, String> {
    let err = |m: String| format!("--api-keys {}: {m}", path.display());
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    if !meta.is_file() || meta.len() > MAX_KEYS_FILE_BYTES {
        return Err(err(format!(
            "not a regular file of at most {MAX_KEYS_FILE_BYTES} bytes"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |what: &str| err(format!("line {}: {what}", n + 1));
        let mut parts = line.split_whitespace();
        let (Some(name), Some(hex), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("expected NAME SHA256-HEX"));
        };
        let valid_name = name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !valid_name {
            return Err(bad("a name is up to 64 letters, digits, '.', '_' or '-'"));
        }
        let hash = parse_hex(hex).ok_or_else(|| {
            bad("the hash must be 64 hex digits: the key's SHA-256 (printf %s KEY | sha256sum)")
        })?;
        keys.push(Key {
            name: name.to_string(),
            hash,
        });
    }
    if keys.is_empty() {
        return Err(err("no keys".into()));
    }
    Ok(keys)
}

fn parse_hex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(key: &str) -> String {
        Sha256::digest(key.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn keys_are_checked_by_hash_and_each_is_a_tenant_of_its_own() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            f.path(),
            format!(
                "# team keys\nalice {}\n\nbob {}\n",
                hex("sk-alice"),
                hex("sk-bob")
            ),
        )
        .unwrap();
        let keys = Arc::new(Keys::new(Some("sk-cli"), Some(f.path()), 0, 0).unwrap());
        assert!(keys.enabled());
        let (a, _ga) = keys.admit(Some("Bearer sk-alice"), "r1").ok().unwrap();
        let (b, _gb) = keys.admit(Some("Bearer sk-bob"), "r2").ok().unwrap();
        let (c, _gc) = keys.admit(Some("Bearer sk-cli"), "r3").ok().unwrap();
        assert!(a != b && b != c && a != c && a.salt != 0);
        let (a2, _) = keys.admit(Some("Bearer sk-alice"), "r4").ok().unwrap();
        assert_eq!(a, a2, "a key is always the same tenant");
        for bad in [
            None,
            Some("sk-alice"),
            Some("Bearer sk-alic"),
            Some("Bearer "),
        ] {
            assert!(
                matches!(keys.admit(bad, "x"), Err(Refused::Unauthorized)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_key_past_its_limits_is_refused_with_a_time_to_wait() {
        let keys = Arc::new(Keys::new(Some("k"), None, 2, 100).unwrap());
        let first = keys.admit(Some("Bearer k"), "r1").ok().unwrap();
        let _second = keys.admit(Some("Bearer k"), "r2").ok().unwrap();
        assert!(matches!(
            keys.admit(Some("Bearer k"), "r3"),
            Err(Refused::Limited("requests in flight", 1))
        ));
        drop(first);
        let (_, third) = keys.admit(Some("Bearer k"), "r3").ok().unwrap();
        keys.charge("r3", 150);
        drop(third);
        match keys.admit(Some("Bearer k"), "r4") {
            Err(Refused::Limited("tokens per minute", wait)) => assert!((59..=61).contains(&wait)),
            _ => panic!("the tokens limit did not hold"),
        }
    }

    #[test]
    fn a_bad_keys_file_is_an_error_naming_the_line() {
        for (text, expect) in [
            ("alice\n", "line 1: expected NAME SHA256-HEX"),
            ("alice zz\n", "line 1: the hash must be 64 hex digits"),
            (&format!("al ice {}\n", hex("k")), "line 1: expected"),
            (&format!("a {}\na {}\n", hex("k"), hex("j")), "given twice"),
            ("# nothing\n", "no keys"),
        ] {
            let f = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(f.path(), text).unwrap();
            let e = Keys::new(None, Some(f.path()), 0, 0).err().unwrap();
            assert!(e.contains(expect), "{text:?}: {e}");
        }
    }
}
