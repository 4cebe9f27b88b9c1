//! API keys, and the tenants they make.
//!
//! Without keys anyone who can reach the port can use the server. With them (`--api-key`, once
//! per key, or a file of keys with `--api-keys`), every request to `/v1/…` must carry one, as
//! OpenAI's clients send it, `Authorization: Bearer KEY` (or as Anthropic's do, `x-api-key: KEY`). A missing or wrong key is a 401 in
//! OpenAI's shape; `/health`, `/ready` and `/metrics` stay open for the orchestrator and the
//! scraper.
//!
//! - **Hashed at rest.** The file holds each key's SHA-256, not the key (`printf %s "$KEY" |
//!   sha256sum`), with a name for logs and metrics: `NAME SHA256-HEX` per line. A key given
//!   with `--api-key` is hashed when it is read, and named after its place: `api-key-1`,
//!   `api-key-2`, … A presented key is hashed and compared with every stored hash in constant
//!   time, so the time an answer takes says nothing about how close a guess was; keys are
//!   never logged, only their names. A key given twice, or a name given twice, is an error
//!   naming both places: one key is one tenant.
//! - **Tenants.** Each key is a tenant with its own partition of the prefix cache (chapter
//!   7's partitions, through chapter 11's [`CachePartition`]): a cache hit, and `cached_tokens` in the
//!   usage, never crosses keys. Without that, a client could learn another's system prompt by
//!   guessing it and watching how many tokens come back cached.
//! - **Per-key limits.** `--key-max-in-flight` requests at once and `--key-tokens-per-minute`
//!   tokens (prompt and completion, over the last 60 s) per key; past either a request is a
//!   429 with `Retry-After`, so one tenant cannot take the whole server. How far the tokens
//!   limit can be passed is [`Keys::admit`]'s rule.
//! - **Names stay out of `/metrics` by default.** `/metrics` is open, and a key's name often
//!   names a customer: the key counters add every key's requests and tokens under
//!   `key="all"` unless `--metrics-per-key` asks for a series per name.

use ch11::CachePartition;
use ch11::api::ApiError;
use prometheus::{IntCounterVec, Opts, Registry};
use sha2::{Digest, Sha256};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A keys file larger than this is refused: a line is ~80 bytes, so this is 10,000 keys.
pub const MAX_KEYS_FILE_BYTES: u64 = 1 << 20;

/// The window of `--key-tokens-per-minute`.
const TOKEN_WINDOW: Duration = Duration::from_secs(60);

/// The `key` label of requests without a key, or with a wrong one; no key may be named so.
pub const NO_KEY: &str = "none";

/// The `key` label of every key's requests and tokens without `--metrics-per-key`.
pub const ALL_KEYS: &str = "all";

/// How long a request whose response has ended is still waited for to be charged. The engine
/// reports a request whose client left at its next step, milliseconds (seconds for a large
/// model's long prompt chunk) after the client went; a minute is far past that. What stays
/// longer is a request that never reached the engine (refused for its body): it has nothing to
/// charge.
const CHARGE_WAIT: Duration = Duration::from_secs(60);

/// At most this many ended requests are waited for to be charged, the oldest forgotten first:
/// a bound on the memory a key holder sending malformed requests fast can take (a few hundred
/// bytes each with its id, so ~5 MiB), and so many that no charge is forgotten before the
/// engine's next step reports it unless 16,384 requests end within that one step.
const MAX_CHARGES_AWAITED: usize = 1 << 14;

/// One key: its name, its SHA-256, and where it was given (for error messages).
struct Key {
    name: String,
    hash: [u8; 32],
    place: String,
}

/// What one key has in use.
#[derive(Default)]
struct Usage {
    in_flight: AtomicUsize,
    /// Tokens charged in the last [`TOKEN_WINDOW`], oldest first.
    window: Mutex<VecDeque<(Instant, u64)>>,
}

/// The requests let in and not yet charged: whose tokens the engine's report of each is. Every
/// operation takes a time logarithmic in their number, whatever the ids.
#[derive(Default)]
struct Running {
    /// The next request's number.
    next: u64,
    /// Each request's key, by number.
    key: HashMap<u64, usize>,
    /// The requests' numbers by request id. The ids come from the clients (`X-Request-Id`) and
    /// may repeat, so each holds every request let in under it.
    by_label: HashMap<String, BTreeSet<u64>>,
    /// The requests whose response has ended before their report came, oldest first: (when it
    /// ended, its id, its number).
    ended: VecDeque<(Instant, String, u64)>,
}

impl Running {
    /// Note a request of key `key` under id `label`; its number.
    fn add(&mut self, label: &str, key: usize) -> u64 {
        let number = self.next;
        self.next += 1;
        self.key.insert(number, key);
        self.by_label
            .entry(label.to_string())
            .or_default()
            .insert(number);
        number
    }

    /// The key of a request under id `label`, which the engine has reported: the first let in
    /// of those under that id (requests of one id are in practice one client's, of one key).
    fn take(&mut self, label: &str) -> Option<usize> {
        let numbers = self.by_label.get_mut(label)?;
        let number = numbers.pop_first()?;
        if numbers.is_empty() {
            self.by_label.remove(label);
        }
        self.key.remove(&number)
    }

    /// Request `number`'s response has ended at `now`: if its report has not come, wait for it
    /// at most [`CHARGE_WAIT`].
    fn end(&mut self, label: &str, number: u64, now: Instant) {
        if self.key.contains_key(&number) {
            self.ended.push_back((now, label.to_string(), number));
        }
        self.forget(now);
    }

    /// Forget the ended requests waited for longer than [`CHARGE_WAIT`], and the oldest past
    /// [`MAX_CHARGES_AWAITED`].
    fn forget(&mut self, now: Instant) {
        while let Some((t, _, _)) = self.ended.front() {
            if now.duration_since(*t) <= CHARGE_WAIT && self.ended.len() <= MAX_CHARGES_AWAITED {
                break;
            }
            let (_, label, number) = self.ended.pop_front().expect("a front");
            if self.key.remove(&number).is_some()
                && let Some(numbers) = self.by_label.get_mut(&label)
            {
                numbers.remove(&number);
                if numbers.is_empty() {
                    self.by_label.remove(&label);
                }
            }
        }
    }

    /// Requests let in and not yet charged.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.key.len()
    }
}

/// The server's keys, their limits, and what each has in use.
pub struct Keys {
    keys: Vec<Key>,
    usage: Vec<Usage>,
    max_in_flight: usize,
    tokens_per_minute: u64,
    /// A series per key name in `/metrics` (`--metrics-per-key`), not only [`ALL_KEYS`].
    per_key_metrics: bool,
    running: Mutex<Running>,
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
    /// The keys `given` in clear (`--api-key`, each named `api-key-N` after its place) and
    /// those of the file `--api-keys`, with per-key limits (0: none), and a series per key
    /// name in `/metrics` if `per_key_metrics`. No keys: every request is let in.
    pub fn new(
        given: &[String],
        file: Option<&Path>,
        max_in_flight: usize,
        tokens_per_minute: u64,
        per_key_metrics: bool,
    ) -> Result<Keys, String> {
        let mut keys = Vec::new();
        for (n, k) in given.iter().enumerate() {
            let place = format!("--api-key #{}", n + 1);
            if k.is_empty() {
                return Err(format!("{place} is empty"));
            }
            if k.trim() != k {
                return Err(format!(
                    "{place} begins or ends with white space, which a presented key never \
                     has (it is trimmed)"
                ));
            }
            keys.push(Key {
                name: format!("api-key-{}", n + 1),
                hash: Sha256::digest(k.as_bytes()).into(),
                place,
            });
        }
        if let Some(path) = file {
            keys.extend(read_file(path)?);
        }
        one_name_and_one_key_each(&keys)?;
        let labels = &["key", "status"];
        Ok(Keys {
            usage: keys.iter().map(|_| Usage::default()).collect(),
            keys,
            max_in_flight,
            tokens_per_minute,
            per_key_metrics,
            running: Mutex::new(Running::default()),
            requests: IntCounterVec::new(
                Opts::new(
                    "llmrs_key_requests_total",
                    "Requests to /v1/ by API key (\"none\": no or a wrong key; \"all\": every \
                     key, unless --metrics-per-key names them) and status: ok (let in), \
                     unauthorized, in_flight or tokens (refused by a limit).",
                ),
                labels,
            )
            .expect("a valid counter"),
            tokens: IntCounterVec::new(
                Opts::new(
                    "llmrs_key_tokens_total",
                    "Prompt and completion tokens by API key (\"all\": every key, unless \
                     --metrics-per-key names them).",
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
    /// dropped, and its tokens are charged to the key when the engine reports them — even if
    /// its client has left by then.
    ///
    /// The tokens limit: a request is let in while the tokens charged to its key in the last
    /// 60 s are under the limit. A request's tokens are known only when the engine reports it
    /// done (how many it generates is up to the model, and its prompt is not read yet when it
    /// is let in), so the requests in flight when the limit is reached still finish: in any
    /// 60 s a key is charged less than its limit plus the tokens of the requests it had in
    /// flight at its last admission — at most `--key-max-in-flight` of them (without it, as
    /// many as the server takes), each at most the model's context, prompt and completion.
    /// One request at a time passes the limit by less than one request.
    pub fn admit(
        self: &Arc<Keys>,
        authorization: Option<&str>,
        label: &str,
    ) -> Result<(CachePartition, Admitted), Refused> {
        let Some(i) = self.find(authorization) else {
            self.count(NO_KEY, "unauthorized");
            return Err(Refused::Unauthorized);
        };
        // ANCHOR: yours_admit
        let name = self.label(i);
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
        let number = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(label, i);
        let salt = u64::from_le_bytes(self.keys[i].hash[..8].try_into().expect("8 bytes")) | 1;
        Ok((
            CachePartition(salt),
            Admitted {
                keys: Arc::clone(self),
                key: i,
                label: label.to_string(),
                number,
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
            .take(label);
        if let Some(i) = key {
            self.tokens
                .with_label_values(&[self.label(i)])
                .inc_by(tokens);
            if self.tokens_per_minute > 0 {
                let now = Instant::now();
                let mut w = self.usage[i]
                    .window
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                while w.front().is_some_and(|&(t, _)| now - t > TOKEN_WINDOW) {
                    w.pop_front();
                }
                w.push_back((now, tokens));
            }
        }
    }

    /// Key `i`'s `key` label in `/metrics`: its name with `--metrics-per-key`, else
    /// [`ALL_KEYS`].
    fn label(&self, i: usize) -> &str {
        if self.per_key_metrics {
            &self.keys[i].name
        } else {
            ALL_KEYS
        }
    }

    fn count(&self, key: &str, status: &str) {
        self.requests.with_label_values(&[key, status]).inc();
    }
}

/// A request let in: its place among its key's requests, given back when dropped (its response
/// sent, or its client gone).
pub struct Admitted {
    keys: Arc<Keys>,
    key: usize,
    label: String,
    number: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.keys.usage[self.key]
            .in_flight
            .fetch_sub(1, Ordering::SeqCst);
        // Its tokens are still charged when the engine reports it: a client that leaves in the
        // middle of a stream pays for what was generated. (One refused before the engine ran
        // it is never reported, and forgotten after a while.)
        self.keys
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .end(&self.label, self.number, Instant::now());
    }
}

/// Refuse a key given twice (two tenants for one key: which is it?) and a name given twice
/// (two keys one tenant in the logs), and the name [`NO_KEY`], naming the places.
fn one_name_and_one_key_each(keys: &[Key]) -> Result<(), String> {
    let mut hashes: HashMap<&[u8; 32], &Key> = HashMap::new();
    let mut names: HashMap<&str, &Key> = HashMap::new();
    for k in keys {
        if k.name == NO_KEY {
            return Err(format!(
                "{}: the name {NO_KEY:?} is the metrics' label of requests without a key",
                k.place
            ));
        }
        if let Some(first) = names.insert(&k.name, k) {
            return Err(format!(
                "{} and {} both name a key {:?}: each key needs its own name",
                first.place, k.place, k.name
            ));
        }
        if let Some(first) = hashes.insert(&k.hash, k) {
            return Err(format!(
                "{} ({:?}) and {} ({:?}) are the same key: one key is one tenant, give it one \
                 name",
                first.place, first.name, k.place, k.name
            ));
        }
    }
    Ok(())
}

impl Refused {
    pub fn into_error(self) -> ApiError {
        match self {
            Refused::Unauthorized => ApiError {
                code: Some("invalid_api_key"),
                ..ApiError::new(
                    401,
                    "invalid_request_error",
                    "a valid API key is needed: send it as Authorization: Bearer KEY (or x-api-key: KEY)",
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
            place: format!("--api-keys {} line {}", path.display(), n + 1),
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

    fn given(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| k.to_string()).collect()
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn keys_are_checked_by_hash_and_each_is_a_tenant_of_its_own() {
        let f = file(&format!(
            "# team keys\nalice {}\n\nbob {}\n",
            hex("sk-alice"),
            hex("sk-bob")
        ));
        let keys = Arc::new(Keys::new(&given(&["sk-cli"]), Some(f.path()), 0, 0, false).unwrap());
        assert!(keys.enabled());
        let (a, _ga) = keys.admit(Some("Bearer sk-alice"), "r1").ok().unwrap();
        let (b, _gb) = keys.admit(Some("Bearer sk-bob"), "r2").ok().unwrap();
        let (c, _gc) = keys.admit(Some("Bearer sk-cli"), "r3").ok().unwrap();
        assert!(a != b && b != c && a != c && a.0 != 0);
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
    fn every_api_key_given_is_a_tenant_named_after_its_place() {
        let keys = Arc::new(Keys::new(&given(&["k1", "k2", "k3"]), None, 0, 0, true).unwrap());
        let tenants: Vec<CachePartition> = ["k1", "k2", "k3"]
            .iter()
            .map(|k| keys.admit(Some(&format!("Bearer {k}")), k).ok().unwrap().0)
            .collect();
        assert!(tenants[0] != tenants[1] && tenants[1] != tenants[2] && tenants[0] != tenants[2]);
        let registry = Registry::new();
        keys.register(&registry);
        let text = render(&registry);
        for name in ["api-key-1", "api-key-2", "api-key-3"] {
            assert!(
                text.contains(&format!("key=\"{name}\",status=\"ok\"}} 1")),
                "{text}"
            );
        }
        for (keys, expect) in [
            (&["k", ""][..], "--api-key #2 is empty"),
            (&[" k"][..], "--api-key #1 begins or ends with white space"),
            (
                &["k1", "k2", "k1"][..],
                "--api-key #1 (\"api-key-1\") and --api-key #3 (\"api-key-3\") are the same key",
            ),
        ] {
            let e = Keys::new(&given(keys), None, 0, 0, false).err().unwrap();
            assert!(e.contains(expect), "{keys:?}: {e}");
        }
    }

    fn render(registry: &Registry) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn key_names_reach_the_metrics_only_when_asked() {
        let f = file(&format!("alice {}\nbob {}\n", hex("sk-a"), hex("sk-b")));
        for per_key in [false, true] {
            let keys = Arc::new(Keys::new(&[], Some(f.path()), 0, 0, per_key).unwrap());
            let registry = Registry::new();
            keys.register(&registry);
            for (key, label) in [("sk-a", "r1"), ("sk-b", "r2"), ("sk-b", "r3")] {
                let (_, guard) = keys
                    .admit(Some(&format!("Bearer {key}")), label)
                    .ok()
                    .unwrap();
                keys.charge(label, 10);
                drop(guard);
            }
            let _ = keys.admit(Some("Bearer sk-mallory"), "r4");
            let text = render(&registry);
            assert!(
                text.contains(r#"llmrs_key_requests_total{key="none",status="unauthorized"} 1"#),
                "{text}"
            );
            if per_key {
                for line in [
                    r#"llmrs_key_requests_total{key="alice",status="ok"} 1"#,
                    r#"llmrs_key_requests_total{key="bob",status="ok"} 2"#,
                    r#"llmrs_key_tokens_total{key="bob"} 20"#,
                ] {
                    assert!(text.contains(line), "{line} missing:\n{text}");
                }
            } else {
                assert!(
                    !text.contains("alice") && !text.contains("bob"),
                    "a key's name is in the metrics:\n{text}"
                );
                for line in [
                    r#"llmrs_key_requests_total{key="all",status="ok"} 3"#,
                    r#"llmrs_key_tokens_total{key="all"} 30"#,
                ] {
                    assert!(text.contains(line), "{line} missing:\n{text}");
                }
            }
        }
    }

    #[test]
    fn a_key_past_its_limits_is_refused_with_a_time_to_wait() {
        let keys = Arc::new(Keys::new(&given(&["k"]), None, 2, 100, false).unwrap());
        let first = keys.admit(Some("Bearer k"), "r1").ok().unwrap();
        let _second = keys.admit(Some("Bearer k"), "r2").ok().unwrap();
        assert!(matches!(
            keys.admit(Some("Bearer k"), "r3"),
            Err(Refused::Limited("requests in flight", 1))
        ));
        drop(first);
        let (_, third) = keys.admit(Some("Bearer k"), "r3").ok().unwrap();
        let charged = Instant::now();
        keys.charge("r3", 150);
        drop(third);
        match keys.admit(Some("Bearer k"), "r4") {
            // A client that waits the whole seconds it is told finds the charge gone from the
            // window: at least the time the charge has left in it, however long this took.
            Err(Refused::Limited("tokens per minute", wait)) => {
                let left = TOKEN_WINDOW.saturating_sub(charged.elapsed());
                assert!(
                    wait as f64 >= left.as_secs_f64(),
                    "wait {wait} s, {left:?} left"
                );
                assert!(wait <= TOKEN_WINDOW.as_secs() + 1, "wait {wait} s");
            }
            _ => panic!("the tokens limit did not hold"),
        }
    }

    /// The limit is a number of tokens a key may use: one that used exactly that many is
    /// refused, one token fewer is let in.
    #[test]
    fn a_key_that_used_exactly_its_tokens_is_refused() {
        let keys = Arc::new(Keys::new(&given(&["k"]), None, 0, 100, false).unwrap());
        let (_, first) = keys.admit(Some("Bearer k"), "r1").ok().unwrap();
        keys.charge("r1", 99);
        drop(first);
        let (_, second) = keys
            .admit(Some("Bearer k"), "r2")
            .ok()
            .expect("99 of 100 tokens used: let in");
        keys.charge("r2", 1);
        drop(second);
        assert!(
            matches!(
                keys.admit(Some("Bearer k"), "r3"),
                Err(Refused::Limited("tokens per minute", _))
            ),
            "100 of 100 tokens used: refused"
        );
    }

    /// The rule of [`Keys::admit`]: let in while under the limit, so the requests in flight
    /// when it is reached finish, and pass it together by less than their number times the
    /// largest request; the next is refused.
    #[test]
    fn the_tokens_limit_is_passed_by_less_than_the_requests_in_flight() {
        const LIMIT: u64 = 3000;
        const REQUEST: u64 = 112;
        let keys = Arc::new(Keys::new(&given(&["k"]), None, 3, LIMIT, false).unwrap());
        let (mut charged, mut n) = (0, 0);
        // One request at a time: the last one let in started under the limit.
        while let Ok((_, guard)) = keys.admit(Some("Bearer k"), &format!("one-{n}")) {
            assert!(charged < LIMIT, "let in at {charged} tokens");
            keys.charge(&format!("one-{n}"), REQUEST);
            drop(guard);
            charged += REQUEST;
            n += 1;
        }
        assert!((LIMIT..LIMIT + REQUEST).contains(&charged), "{charged}");
        assert!(matches!(
            keys.admit(Some("Bearer k"), "last"),
            Err(Refused::Limited("tokens per minute", _))
        ));

        // Three at a time (the in-flight limit): all three started under the limit.
        let keys = Arc::new(Keys::new(&given(&["k"]), None, 3, LIMIT, false).unwrap());
        keys.admit(Some("Bearer k"), "warm").ok().unwrap();
        keys.charge("warm", LIMIT - 1);
        let guards: Vec<_> = (0..3)
            .map(|i| {
                keys.admit(Some("Bearer k"), &format!("many-{i}"))
                    .ok()
                    .unwrap()
            })
            .collect();
        assert!(keys.admit(Some("Bearer k"), "many-3").is_err());
        for i in 0..3 {
            keys.charge(&format!("many-{i}"), REQUEST);
        }
        drop(guards);
        // Charged: LIMIT - 1 + 3 * REQUEST, past the limit by less than the three in flight.
        assert!(matches!(
            keys.admit(Some("Bearer k"), "after"),
            Err(Refused::Limited("tokens per minute", _))
        ));
    }

    #[test]
    fn a_request_whose_client_left_is_charged_when_the_engine_reports_it() {
        let keys = Arc::new(Keys::new(&given(&["k"]), None, 0, 100, false).unwrap());
        let (_, guard) = keys.admit(Some("Bearer k"), "r1").ok().unwrap();
        // The client leaves mid-stream: its guard goes before the engine's report.
        drop(guard);
        keys.charge("r1", 150);
        assert!(
            matches!(
                keys.admit(Some("Bearer k"), "r2"),
                Err(Refused::Limited("tokens per minute", _))
            ),
            "a client that left was not charged"
        );
    }

    #[test]
    fn requests_sharing_an_id_are_each_charged() {
        let keys = Arc::new(Keys::new(&given(&["k"]), None, 0, 100, false).unwrap());
        let (_, a) = keys.admit(Some("Bearer k"), "same").ok().unwrap();
        let (_, b) = keys.admit(Some("Bearer k"), "same").ok().unwrap();
        drop(a);
        keys.charge("same", 60);
        keys.charge("same", 60);
        drop(b);
        assert!(
            keys.admit(Some("Bearer k"), "next").is_err(),
            "the second request of the id went uncharged"
        );
    }

    #[test]
    fn ended_requests_never_reported_are_forgotten() {
        let mut r = Running::default();
        let t0 = Instant::now();
        r.add("held", 0);
        for i in 0..3 {
            let number = r.add(&format!("x{i}"), 0);
            r.end(&format!("x{i}"), number, t0);
        }
        assert_eq!(r.len(), 4);
        r.forget(t0 + CHARGE_WAIT + Duration::from_secs(1));
        assert_eq!(r.len(), 1, "only the request still in flight is kept");
        assert_eq!(r.take("held"), Some(0));
        for _ in 0..MAX_CHARGES_AWAITED + 10 {
            let number = r.add("y", 0);
            r.end("y", number, t0);
        }
        assert_eq!(r.len(), MAX_CHARGES_AWAITED);
    }

    #[test]
    fn a_bad_keys_file_is_an_error_naming_the_file_and_the_line() {
        for (text, expect) in [
            ("alice\n".to_string(), "line 1: expected NAME SHA256-HEX"),
            (
                "alice zz\n".into(),
                "line 1: the hash must be 64 hex digits",
            ),
            (format!("al ice {}\n", hex("k")), "line 1: expected"),
            (
                format!("a {}\nb {}\na {}\n", hex("k"), hex("j"), hex("i")),
                "line 1 and --api-keys {} line 3 both name a key \"a\"",
            ),
            (
                format!("alice {}\n# again\nbob {}\n", hex("k"), hex("k")),
                "line 1 (\"alice\") and --api-keys {} line 3 (\"bob\") are the same key",
            ),
            (format!("none {}\n", hex("k")), "line 1: the name \"none\""),
            ("# nothing\n".into(), "no keys"),
        ] {
            let f = file(&text);
            let e = Keys::new(&[], Some(f.path()), 0, 0, false).err().unwrap();
            let path = f.path().display().to_string();
            let expect = expect.replace("{}", &path);
            assert!(
                e.starts_with(&format!("--api-keys {path}")) && e.contains(&expect),
                "{text:?}: {e}"
            );
        }
        // A key of the file also given with --api-key.
        let f = file(&format!("alice {}\n", hex("sk-a")));
        let e = Keys::new(&given(&["sk-a"]), Some(f.path()), 0, 0, false)
            .err()
            .unwrap();
        assert!(
            e.contains("--api-key #1") && e.contains("line 1 (\"alice\")"),
            "{e}"
        );
    }
}
