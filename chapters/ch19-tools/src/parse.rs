//! The generated text cut into its parts while it streams: the answer's content, the model's
//! reasoning, and its tool calls — each call announced as soon as its name is known and its
//! arguments passed on piece by piece as they are written, as OpenAI's streamed
//! `delta.tool_calls` carry them.
//!
//! Text arrives in pieces that may end anywhere, inside a marker (`<tool_` … `call>`) or inside
//! a JSON string. The parser holds back only what it cannot yet tell: the longest end of the
//! text that could still become a marker, and whitespace that may turn out to lie between two
//! parts (which is dropped). Everything else goes out at once.

use crate::conversation::Call;
use crate::format::{Calls, Format, deepseek};

// ANCHOR: delta
/// A piece of the answer, as it becomes known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    Content(String),
    Reasoning(String),
    /// Call `index` of the turn begins: its id and function's name.
    Call {
        index: usize,
        id: String,
        name: String,
    },
    /// More of call `index`'s arguments (JSON text; all of them together are the object).
    Arguments {
        index: usize,
        text: String,
    },
}
// ANCHOR_END: delta

/// A whole answer: what the deltas add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<Call>,
}

impl Parsed {
    /// Add `d` to the answer.
    pub fn apply(&mut self, d: &Delta) {
        match d {
            Delta::Content(t) => self.content.push_str(t),
            Delta::Reasoning(t) => self.reasoning.push_str(t),
            Delta::Call { id, name, .. } => self.calls.push(Call {
                id: id.clone(),
                name: name.clone(),
                arguments: String::new(),
            }),
            Delta::Arguments { index, text } => {
                if let Some(c) = self.calls.get_mut(*index) {
                    c.arguments.push_str(text);
                }
            }
        }
    }
}

/// What the parser looks for.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Take reasoning out of the content (llama-server's `reasoning_format` other than
    /// `none`).
    pub reasoning: bool,
    /// Parse tool calls (the request offered tools and `tool_choice` is not `none`).
    pub calls: bool,
    /// The prompt ends inside the reasoning (it ends with the opening marker): the answer
    /// begins as reasoning.
    pub thinking_open: bool,
}

#[derive(Debug)]
enum State {
    Content,
    Reasoning,
    /// Inside a call's JSON object; `then` is what follows it.
    Object(Box<ObjectScan>, After),
    /// After a tagged call's object: whitespace, then the closing tag.
    Close(&'static str),
    /// Mistral's list: `[` expected, or `,`/`]` between objects.
    ListOpen,
    ListNext,
    /// DeepSeek: between calls, in a call's head (`function<｜tool▁sep｜>NAME\n```json\n`),
    /// after its arguments (```` ``` ```` then the call's end).
    DsBetween,
    DsHead,
    DsTail,
    /// Llama 3.x: after `<|python_tag|>`, the JSON call, or a built-in tool's call in Python's
    /// form, read once the answer has ended ([`builtin_call`]).
    Builtin,
    /// Text after the last call that is not a call: kept as content.
    Done,
}

#[derive(Debug, Clone, Copy)]
enum After {
    Tag(&'static str),
    List,
    Bare,
    Ds,
}

/// The streaming parser of one answer.
#[derive(Debug)]
pub struct Parser {
    format: Format,
    options: Options,
    state: State,
    /// Text not yet consumed.
    buf: String,
    /// Whitespace held back after content or reasoning.
    space: String,
    /// At the beginning of a part: leading whitespace is dropped.
    fresh: bool,
    /// Nothing has been written yet (Llama 3.x's call must be the whole answer).
    at_start: bool,
    calls: usize,
    ids: IdMaker,
    out: Vec<Delta>,
    parsed: Parsed,
}

impl Parser {
    pub fn new(format: Format, options: Options) -> Parser {
        let reasoning_first = options.reasoning && options.thinking_open && format.think.is_some();
        Parser {
            format,
            options,
            state: if reasoning_first {
                State::Reasoning
            } else {
                State::Content
            },
            buf: String::new(),
            space: String::new(),
            fresh: true,
            at_start: true,
            calls: 0,
            ids: IdMaker::new(matches!(format.calls, Calls::Listed { .. })),
            out: Vec::new(),
            parsed: Parsed::default(),
        }
    }

    /// Feed the next piece of text; the deltas it completes.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.buf.push_str(text);
        while self.step(false) {}
        self.take()
    }

    /// The text has ended: flush what was held back.
    pub fn finish(&mut self) -> Vec<Delta> {
        while self.step(true) {}
        match self.state {
            State::Content | State::Done => {
                let rest = std::mem::take(&mut self.buf);
                self.content(&rest);
                if self.calls == 0 {
                    let space = std::mem::take(&mut self.space);
                    self.emit(Delta::Content(space));
                }
            }
            State::Reasoning => {
                let rest = std::mem::take(&mut self.buf);
                self.reasoning(&rest);
            }
            _ => {}
        }
        self.take()
    }

    /// The answer so far.
    pub fn parsed(&self) -> &Parsed {
        &self.parsed
    }

    /// Parse a whole answer at once.
    pub fn parse(format: Format, options: Options, text: &str) -> Parsed {
        let mut p = Parser::new(format, options);
        p.push(text);
        p.finish();
        p.parsed
    }

    fn take(&mut self) -> Vec<Delta> {
        std::mem::take(&mut self.out)
    }

    fn emit(&mut self, d: Delta) {
        let empty = matches!(&d, Delta::Content(t) | Delta::Reasoning(t) if t.is_empty())
            || matches!(&d, Delta::Arguments { text, .. } if text.is_empty());
        if !empty {
            self.parsed.apply(&d);
            self.out.push(d);
        }
    }

    /// Content text: leading whitespace of a part dropped, trailing whitespace held back.
    fn content(&mut self, text: &str) {
        self.text(text, false);
    }

    fn reasoning(&mut self, text: &str) {
        self.text(text, true);
    }

    fn text(&mut self, text: &str, reasoning: bool) {
        let text = if self.fresh { text.trim_start() } else { text };
        if text.is_empty() {
            return;
        }
        self.at_start = false;
        self.fresh = false;
        let body = text.trim_end();
        let tail = &text[body.len()..];
        if !body.is_empty() {
            let space = std::mem::take(&mut self.space);
            let piece = space + body;
            self.emit(if reasoning {
                Delta::Reasoning(piece)
            } else {
                Delta::Content(piece)
            });
        }
        self.space.push_str(tail);
    }

    /// A new part begins: whitespace held back is dropped.
    fn new_part(&mut self) {
        self.space.clear();
        self.fresh = true;
    }

    /// The markers that end content.
    fn content_markers(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if self.options.reasoning
            && let Some((open, _)) = self.format.think
        {
            m.push(open);
        }
        if self.options.calls {
            match self.format.calls {
                Calls::Tagged { open, .. } => m.push(open),
                Calls::Listed { marker } => m.push(marker),
                Calls::DeepSeek => m.push(deepseek::CALLS_BEGIN),
                Calls::Bare { .. } => {}
            }
        }
        m
    }

    /// One step; whether it consumed anything (or changed state).
    fn step(&mut self, ended: bool) -> bool {
        match &mut self.state {
            State::Content => {
                // Llama 3.x: a call is the whole answer, so it begins with its `{`, or with
                // the tag.
                if self.options.calls
                    && let Calls::Bare { tag } = self.format.calls
                    && self.at_start
                {
                    let t = self.buf.trim_start();
                    if t.is_empty() || (!ended && t.len() < tag.len() && tag.starts_with(t)) {
                        return false;
                    }
                    let skip = self.buf.len() - t.len();
                    if t.starts_with('{') {
                        self.at_start = false;
                        self.buf.drain(..skip);
                        self.state = State::Object(
                            Box::new(ObjectScan::new(self.format.arguments_key)),
                            After::Bare,
                        );
                    } else if t.starts_with(tag) {
                        self.at_start = false;
                        self.buf.drain(..skip + tag.len());
                        self.state = State::Builtin;
                    } else {
                        self.at_start = false;
                    }
                    return true;
                }
                let markers = self.content_markers();
                match find_first(&self.buf, &markers) {
                    Some((at, marker)) => {
                        let before: String = self.buf[..at].to_string();
                        self.buf.drain(..at + marker.len());
                        self.content(&before);
                        self.new_part();
                        self.state = self.after_marker(marker);
                        true
                    }
                    None => {
                        let keep = if ended {
                            0
                        } else {
                            held_prefix(&self.buf, &markers)
                        };
                        let cut = self.buf.len() - keep;
                        if cut == 0 {
                            return false;
                        }
                        let before: String = self.buf[..cut].to_string();
                        self.buf.drain(..cut);
                        self.content(&before);
                        false
                    }
                }
            }
            State::Reasoning => {
                let close = self.format.think.map_or("</think>", |(_, c)| c);
                match self.buf.find(close) {
                    Some(at) => {
                        let before = self.buf[..at].to_string();
                        self.buf.drain(..at + close.len());
                        self.reasoning(&before);
                        self.new_part();
                        self.at_start = true;
                        self.state = State::Content;
                        true
                    }
                    None => {
                        let keep = if ended {
                            0
                        } else {
                            held_prefix(&self.buf, &[close])
                        };
                        let cut = self.buf.len() - keep;
                        if cut == 0 {
                            return false;
                        }
                        let before = self.buf[..cut].to_string();
                        self.buf.drain(..cut);
                        self.reasoning(&before);
                        false
                    }
                }
            }
            State::Object(scan, after) => {
                let after = *after;
                let (used, done) = scan.feed(&self.buf);
                let announce_early = !matches!(after, After::List);
                let mut scan_events = Vec::new();
                scan.events(announce_early, &mut scan_events);
                self.buf.drain(..used);
                for e in scan_events {
                    self.scan_event(e);
                }
                match done {
                    Scan::More => used > 0,
                    Scan::Done => {
                        let State::Object(scan, _) =
                            std::mem::replace(&mut self.state, State::Done)
                        else {
                            unreachable!()
                        };
                        let mut rest = Vec::new();
                        scan.finish_events(&mut rest);
                        for e in rest {
                            self.scan_event(e);
                        }
                        self.state = match after {
                            After::Tag(close) => State::Close(close),
                            After::List => State::ListNext,
                            After::Bare => State::Done,
                            After::Ds => State::DsTail,
                        };
                        self.new_part();
                        true
                    }
                    Scan::Bad => {
                        // Not a call after all: what follows is content.
                        self.state = State::Done;
                        true
                    }
                }
            }
            State::Close(close) => {
                let close = *close;
                let t = self.buf.trim_start();
                if t.len() < close.len() && close.starts_with(t) && !ended {
                    return false;
                }
                let skip = self.buf.len() - t.len();
                if t.starts_with(close) {
                    self.buf.drain(..skip + close.len());
                }
                self.new_part();
                self.state = State::Content;
                true
            }
            State::ListOpen => {
                let t = self.buf.trim_start();
                if t.is_empty() {
                    return false;
                }
                let skip = self.buf.len() - t.len();
                if t.starts_with('[') {
                    self.buf.drain(..skip + 1);
                    self.state = State::Object(
                        Box::new(ObjectScan::new(self.format.arguments_key)),
                        After::List,
                    );
                } else {
                    self.state = State::Done;
                }
                true
            }
            State::ListNext => {
                let t = self.buf.trim_start();
                if t.is_empty() {
                    return false;
                }
                let skip = self.buf.len() - t.len();
                if t.starts_with(',') {
                    self.buf.drain(..skip + 1);
                    self.state = State::Object(
                        Box::new(ObjectScan::new(self.format.arguments_key)),
                        After::List,
                    );
                } else {
                    let n = if t.starts_with(']') { 1 } else { 0 };
                    self.buf.drain(..skip + n);
                    self.new_part();
                    self.state = State::Done;
                }
                true
            }
            State::DsBetween => {
                let t = self.buf.trim_start();
                let skip = self.buf.len() - t.len();
                if t.starts_with(deepseek::CALL_BEGIN) {
                    self.buf.drain(..skip + deepseek::CALL_BEGIN.len());
                    self.state = State::DsHead;
                    true
                } else if t.starts_with(deepseek::CALLS_END) {
                    self.buf.drain(..skip + deepseek::CALLS_END.len());
                    self.new_part();
                    self.state = State::Content;
                    true
                } else if !ended
                    && (deepseek::CALL_BEGIN.starts_with(t) || deepseek::CALLS_END.starts_with(t))
                {
                    false
                } else {
                    self.state = State::Done;
                    true
                }
            }
            State::DsHead => {
                // `function<｜tool▁sep｜>NAME\n```json\n`
                let head = format!("function{}", deepseek::SEP);
                let Some(nl) = self.buf.find('\n') else {
                    return false;
                };
                let Some(name) = self.buf[..nl].strip_prefix(&head) else {
                    self.state = State::Done;
                    return true;
                };
                let name = name.trim().to_string();
                let after = &self.buf[nl + 1..];
                let fence = "```json\n";
                if after.len() < fence.len() && fence.starts_with(after) && !ended {
                    return false;
                }
                let skip = nl
                    + 1
                    + if after.starts_with(fence) {
                        fence.len()
                    } else {
                        0
                    };
                self.buf.drain(..skip);
                let mut scan = ObjectScan::arguments_only();
                scan.name = Some(name);
                self.state = State::Object(Box::new(scan), After::Ds);
                true
            }
            State::DsTail => {
                let t = self
                    .buf
                    .trim_start_matches(|c: char| c.is_whitespace() || c == '`');
                if t.is_empty() && !ended {
                    return false;
                }
                let skip = self.buf.len() - t.len();
                if t.starts_with(deepseek::CALL_END) {
                    self.buf.drain(..skip + deepseek::CALL_END.len());
                    self.state = State::DsBetween;
                    true
                } else if !ended && deepseek::CALL_END.starts_with(t) {
                    false
                } else {
                    self.buf.drain(..skip);
                    self.state = State::DsBetween;
                    true
                }
            }
            State::Builtin => {
                let t = self.buf.trim_start();
                if t.starts_with('{') {
                    // The JSON call after all, with the tag in front.
                    let skip = self.buf.len() - t.len();
                    self.buf.drain(..skip);
                    self.state = State::Object(
                        Box::new(ObjectScan::new(self.format.arguments_key)),
                        After::Bare,
                    );
                    return true;
                }
                if !ended {
                    return false;
                }
                let text = std::mem::take(&mut self.buf);
                match builtin_call(&text) {
                    Some((name, arguments)) => {
                        self.scan_event(ScanEvent::Start { name, id: None });
                        self.scan_event(ScanEvent::Arguments(arguments));
                        self.new_part();
                    }
                    None => self.content(&text),
                }
                self.state = State::Done;
                true
            }
            State::Done => {
                if self.buf.is_empty() {
                    return false;
                }
                let rest = std::mem::take(&mut self.buf);
                self.content(&rest);
                false
            }
        }
    }

    fn after_marker(&mut self, marker: &str) -> State {
        if self.format.think.is_some_and(|(open, _)| open == marker) {
            return State::Reasoning;
        }
        match self.format.calls {
            Calls::Tagged { close, .. } => State::Object(
                Box::new(ObjectScan::new(self.format.arguments_key)),
                After::Tag(close),
            ),
            Calls::Listed { .. } => State::ListOpen,
            Calls::DeepSeek => State::DsBetween,
            Calls::Bare { .. } => State::Content,
        }
    }

    fn scan_event(&mut self, e: ScanEvent) {
        match e {
            ScanEvent::Start { name, id } => {
                let id = id.unwrap_or_else(|| self.ids.next());
                let index = self.calls;
                self.calls += 1;
                self.emit(Delta::Call { index, id, name });
            }
            ScanEvent::Arguments(text) => {
                let index = self.calls.saturating_sub(1);
                self.emit(Delta::Arguments { index, text });
            }
        }
    }
}

/// A built-in tool's call as Llama 3.x writes it after `<|python_tag|>`:
/// `NAME.call(ARG=VALUE, …)`, each value JSON. Its name, and its arguments as a JSON object
/// (the values' text as written); `None` if `text` is not one such call.
fn builtin_call(text: &str) -> Option<(String, String)> {
    let text = text.trim();
    let open = text.find(".call(")?;
    let name = &text[..open];
    crate::conversation::check_name(name).ok()?;
    let mut rest = &text[open + ".call(".len()..];
    let mut arguments = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(end) = rest.strip_prefix(')') {
            return end.trim().is_empty().then(|| {
                let fields: Vec<String> = (arguments.iter())
                    .map(|(k, v)| format!("{}: {v}", serde_json::to_string(k).expect("a str")))
                    .collect();
                (name.to_string(), format!("{{{}}}", fields.join(", ")))
            });
        }
        if !arguments.is_empty() {
            rest = rest.strip_prefix(',')?.trim_start();
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim();
        let identifier = !key.is_empty()
            && (key.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !key.as_bytes()[0].is_ascii_digit();
        if !identifier {
            return None;
        }
        let value_text = rest[eq + 1..].trim_start();
        // A string, object or list ends itself; a number, `true`, `false` or `null` ends at
        // the next `,` or `)`.
        let end = if value_text.starts_with(['"', '{', '[']) {
            let mut values = serde_json::Deserializer::from_str(value_text)
                .into_iter::<&serde_json::value::RawValue>();
            values.next()?.ok()?;
            values.byte_offset()
        } else {
            value_text.find([',', ')'])?
        };
        let value = value_text[..end].trim();
        serde_json::from_str::<&serde_json::value::RawValue>(value).ok()?;
        arguments.push((key, value));
        rest = &value_text[end..];
    }
}

/// The first of `markers` in `text`: its byte offset, and which.
fn find_first(text: &str, markers: &[&'static str]) -> Option<(usize, &'static str)> {
    markers
        .iter()
        .filter_map(|m| text.find(m).map(|at| (at, *m)))
        .min_by_key(|(at, _)| *at)
}

// ANCHOR: held_prefix
/// How many bytes at the end of `text` could begin one of `markers` (the most): what must be
/// held back, since the next piece may complete the marker.
fn held_prefix(text: &str, markers: &[&str]) -> usize {
    // ANCHOR: yours_held_prefix
    let mut keep = 0;
    for m in markers {
        // Each proper prefix of the marker (a whole marker was found already), at a
        // character boundary.
        for (i, _) in m.char_indices().skip(1) {
            if text.ends_with(&m[..i]) {
                keep = keep.max(i);
            }
        }
    }
    keep
    // ANCHOR_END: yours_held_prefix
}
// ANCHOR_END: held_prefix

/// `n` letters and digits, for an id (a message's, a response's).
pub fn random_id(n: usize) -> String {
    IdMaker::new(false).letters(n)
}

/// Call ids: `call_` and 24 letters and digits as OpenAI writes them, or nine (Mistral's
/// templates require nine), from a splitmix64 stream seeded by the clock and a counter.
#[derive(Debug)]
struct IdMaker {
    state: u64,
    nine: bool,
}

impl IdMaker {
    fn new(nine: bool) -> IdMaker {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        IdMaker {
            state: t ^ COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed),
            nine,
        }
    }

    fn next(&mut self) -> String {
        let (prefix, n) = if self.nine { ("", 9) } else { ("call_", 24) };
        prefix.to_string() + &self.letters(n)
    }

    fn letters(&mut self, n: usize) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut id = String::with_capacity(n);
        for _ in 0..n {
            self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            id.push(ALPHABET[(z % ALPHABET.len() as u64) as usize] as char);
        }
        id
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Scan {
    More,
    Done,
    Bad,
}

#[derive(Debug)]
enum ScanEvent {
    Start { name: String, id: Option<String> },
    Arguments(String),
}

/// Where [`ObjectScan`] is in a call's object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    KeyOrEnd,
    Key,
    Colon,
    Value(Slot),
    Comma,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Name,
    Id,
    Arguments,
    Other,
}

/// One call's JSON object read a character at a time: its `name`, its `id`, and its arguments'
/// text passed on as it comes. Or, for DeepSeek, the arguments object alone.
#[derive(Debug)]
struct ObjectScan {
    arguments_key: &'static str,
    phase: Phase,
    key: String,
    value: Value,
    raw: String,
    name: Option<String>,
    id: Option<String>,
    /// Arguments read but not yet passed on.
    args: String,
    announced: bool,
    /// DeepSeek: the object is the arguments.
    only_arguments: bool,
}

impl ObjectScan {
    fn new(arguments_key: &'static str) -> ObjectScan {
        ObjectScan {
            arguments_key,
            phase: Phase::Open,
            key: String::new(),
            value: Value::default(),
            raw: String::new(),
            name: None,
            id: None,
            args: String::new(),
            announced: false,
            only_arguments: false,
        }
    }

    fn arguments_only() -> ObjectScan {
        ObjectScan {
            phase: Phase::Value(Slot::Arguments),
            only_arguments: true,
            ..ObjectScan::new("arguments")
        }
    }

    /// Consume what of `text` belongs to the object: (bytes used, where it stands).
    fn feed(&mut self, text: &str) -> (usize, Scan) {
        for (i, c) in text.char_indices() {
            match self.phase {
                Phase::Open => match c {
                    c if c.is_whitespace() => {}
                    '{' => self.phase = Phase::KeyOrEnd,
                    _ => return (i, Scan::Bad),
                },
                Phase::KeyOrEnd => match c {
                    c if c.is_whitespace() => {}
                    '"' => {
                        self.phase = Phase::Key;
                        self.value = Value::default();
                        self.raw.clear();
                        self.raw.push('"');
                        self.value.in_string = true;
                        self.value.started = true;
                    }
                    '}' => {
                        self.phase = Phase::Done;
                        return (i + 1, Scan::Done);
                    }
                    _ => return (i, Scan::Bad),
                },
                Phase::Key => {
                    self.raw.push(c);
                    if self.value.string_char(c) {
                        self.key = serde_json::from_str(&self.raw).unwrap_or_default();
                        self.phase = Phase::Colon;
                    }
                }
                Phase::Colon => match c {
                    c if c.is_whitespace() => {}
                    ':' => {
                        let slot = match self.key.as_str() {
                            "name" => Slot::Name,
                            "id" => Slot::Id,
                            k if k == self.arguments_key => Slot::Arguments,
                            _ => Slot::Other,
                        };
                        self.value = Value::default();
                        self.raw.clear();
                        self.phase = Phase::Value(slot);
                    }
                    _ => return (i, Scan::Bad),
                },
                Phase::Value(slot) => match self.value.feed(c) {
                    Step::Skip => {}
                    Step::Take => {
                        if slot == Slot::Arguments {
                            self.args.push(c);
                        } else {
                            self.raw.push(c);
                        }
                    }
                    Step::TakeEnd | Step::EndBefore => {
                        let take = self.value.last == Step::TakeEnd;
                        if take {
                            if slot == Slot::Arguments {
                                self.args.push(c);
                            } else {
                                self.raw.push(c);
                            }
                        }
                        match slot {
                            Slot::Name => {
                                self.name = serde_json::from_str(&self.raw).ok();
                                if self.name.is_none() {
                                    return (i, Scan::Bad);
                                }
                            }
                            Slot::Id => self.id = serde_json::from_str(&self.raw).ok(),
                            _ => {}
                        }
                        if self.only_arguments {
                            self.phase = Phase::Done;
                            return (i + usize::from(take) * c.len_utf8(), Scan::Done);
                        }
                        self.phase = Phase::Comma;
                        if !take {
                            // The character that ended a number is the comma or the brace.
                            match c {
                                ',' => self.phase = Phase::KeyOrEnd,
                                '}' => {
                                    self.phase = Phase::Done;
                                    return (i + 1, Scan::Done);
                                }
                                _ => {}
                            }
                        }
                    }
                    Step::Bad => return (i, Scan::Bad),
                },
                Phase::Comma => match c {
                    c if c.is_whitespace() => {}
                    ',' => self.phase = Phase::KeyOrEnd,
                    '}' => {
                        self.phase = Phase::Done;
                        return (i + 1, Scan::Done);
                    }
                    _ => return (i, Scan::Bad),
                },
                Phase::Done => return (i, Scan::Done),
            }
        }
        (text.len(), Scan::More)
    }

    /// What the scan can say so far: the call's start once its name is known (`early`; else
    /// at the end, with its id), and its arguments read since.
    fn events(&mut self, early: bool, out: &mut Vec<ScanEvent>) {
        if !self.announced && early && self.name.is_some() {
            self.announced = true;
            out.push(ScanEvent::Start {
                name: self.name.clone().unwrap_or_default(),
                id: self.id.clone(),
            });
        }
        if self.announced && !self.args.is_empty() {
            out.push(ScanEvent::Arguments(std::mem::take(&mut self.args)));
        }
    }

    fn finish_events(mut self, out: &mut Vec<ScanEvent>) {
        if !self.announced {
            self.announced = true;
            out.push(ScanEvent::Start {
                name: self.name.clone().unwrap_or_default(),
                id: self.id.clone(),
            });
        }
        if !self.args.is_empty() {
            out.push(ScanEvent::Arguments(std::mem::take(&mut self.args)));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Step {
    #[default]
    Skip,
    Take,
    /// This character ends the value and is part of it.
    TakeEnd,
    /// The value ended before this character (a number or a literal).
    EndBefore,
    Bad,
}

/// The extent of one JSON value, a character at a time.
#[derive(Debug, Default)]
struct Value {
    started: bool,
    depth: u32,
    in_string: bool,
    escaped: bool,
    scalar: bool,
    last: Step,
}

impl Value {
    /// Inside a string: whether `c` closes it.
    fn string_char(&mut self, c: char) -> bool {
        if self.escaped {
            self.escaped = false;
        } else if c == '\\' {
            self.escaped = true;
        } else if c == '"' {
            self.in_string = false;
            return true;
        }
        false
    }

    fn feed(&mut self, c: char) -> Step {
        let s = self.step(c);
        self.last = s;
        s
    }

    // ANCHOR: value_step
    fn step(&mut self, c: char) -> Step {
        // ANCHOR: yours_value_step
        if !self.started {
            if c.is_whitespace() {
                return Step::Skip;
            }
            self.started = true;
            return match c {
                '{' | '[' => {
                    self.depth = 1;
                    Step::Take
                }
                '"' => {
                    self.in_string = true;
                    Step::Take
                }
                '-' | '0'..='9' | 't' | 'f' | 'n' => {
                    self.scalar = true;
                    Step::Take
                }
                _ => Step::Bad,
            };
        }
        if self.scalar {
            return if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+') {
                Step::Take
            } else {
                Step::EndBefore
            };
        }
        if self.in_string {
            let closed = self.string_char(c);
            return if closed && self.depth == 0 {
                Step::TakeEnd
            } else {
                Step::Take
            };
        }
        match c {
            '"' => {
                self.in_string = true;
                Step::Take
            }
            '{' | '[' => {
                self.depth += 1;
                Step::Take
            }
            '}' | ']' => {
                self.depth -= 1;
                if self.depth == 0 {
                    Step::TakeEnd
                } else {
                    Step::Take
                }
            }
            _ => Step::Take,
        }
        // ANCHOR_END: yours_value_step
    }
    // ANCHOR_END: value_step
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{HERMES, LLAMA3, MISTRAL};

    const CALLS: Options = Options {
        reasoning: true,
        calls: true,
        thinking_open: false,
    };

    /// `text` fed one character at a time.
    fn by_chars(format: Format, text: &str) -> Parsed {
        let mut p = Parser::new(format, CALLS);
        let mut whole = Parsed::default();
        for (i, c) in text.char_indices() {
            for d in p.push(&text[i..i + c.len_utf8()]) {
                whole.apply(&d);
            }
        }
        for d in p.finish() {
            whole.apply(&d);
        }
        whole
    }

    #[test]
    fn braces_and_quotes_inside_argument_strings_stay_arguments() {
        let args = r#"{"code": "if (a) { b(\"}\"); }", "list": [1, {"x": "]"}], "n": -2.5e3}"#;
        let text = format!(
            "Sure.\n<tool_call>\n{{\"name\": \"run\", \"arguments\": {args}}}\n</tool_call>"
        );
        for p in [Parser::parse(HERMES, CALLS, &text), by_chars(HERMES, &text)] {
            assert_eq!(p.content, "Sure.");
            assert_eq!(p.calls.len(), 1);
            assert_eq!(p.calls[0].name, "run");
            assert_eq!(p.calls[0].arguments, args);
        }
    }

    #[test]
    fn a_marker_cut_anywhere_is_held_back_and_a_near_miss_is_content() {
        // `<tool_` could begin a call until `cat>` shows it does not.
        let p = by_chars(HERMES, "a <tool_cat> b");
        assert_eq!((p.content.as_str(), p.calls.len()), ("a <tool_cat> b", 0));
        let mut parser = Parser::new(HERMES, CALLS);
        assert_eq!(parser.push("Hi <tool_"), vec![Delta::Content("Hi".into())]);
        // The held space and `<tool_` come out once they are known to be text.
        assert_eq!(parser.push("x"), vec![Delta::Content(" <tool_x".into())]);
    }

    #[test]
    fn keys_in_any_order_and_ids_a_model_gives() {
        let text = r#"[TOOL_CALLS][{"arguments": {"a": 1}, "id": "abcdefghi", "name": "f"}, {"name": "g", "arguments": {}, "id": "012345678"}]"#;
        for p in [Parser::parse(MISTRAL, CALLS, text), by_chars(MISTRAL, text)] {
            let calls: Vec<(&str, &str, &str)> = (p.calls.iter())
                .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
                .collect();
            assert_eq!(
                calls,
                [("abcdefghi", "f", r#"{"a": 1}"#), ("012345678", "g", "{}")]
            );
        }
    }

    #[test]
    fn a_llama_3_call_is_the_whole_answer_after_the_python_tag_or_not() {
        let text = r#" {"name": "get_weather", "parameters": {"city": "Paris"}}"#;
        for p in [Parser::parse(LLAMA3, CALLS, text), by_chars(LLAMA3, text)] {
            assert_eq!(p.content, "");
            let calls: Vec<(&str, &str)> = (p.calls.iter())
                .map(|c| (c.name.as_str(), c.arguments.as_str()))
                .collect();
            assert_eq!(calls, [("get_weather", r#"{"city": "Paris"}"#)]);
        }
        // After `<|python_tag|>`, the same call, or a built-in tool's in Python's form.
        let tagged = format!("<|python_tag|>{text}");
        let builtin = r#"<|python_tag|>brave_search.call(query="weather, Paris (FR)", n=3)"#;
        for (text, name, arguments) in [
            (tagged.as_str(), "get_weather", r#"{"city": "Paris"}"#),
            (
                builtin,
                "brave_search",
                r#"{"query": "weather, Paris (FR)", "n": 3}"#,
            ),
        ] {
            for p in [Parser::parse(LLAMA3, CALLS, text), by_chars(LLAMA3, text)] {
                assert_eq!(p.content, "");
                let calls: Vec<(&str, &str)> = (p.calls.iter())
                    .map(|c| (c.name.as_str(), c.arguments.as_str()))
                    .collect();
                assert_eq!(calls, [(name, arguments)], "{text}");
            }
        }
        // Code after the tag, not a call's form: content.
        let p = by_chars(LLAMA3, "<|python_tag|>print(1 + 1)");
        assert_eq!((p.content.as_str(), p.calls.len()), ("print(1 + 1)", 0));
        // Words first: an answer in words, whatever follows.
        let text = r#"It is sunny. {"name": "x", "parameters": {}}"#;
        let p = by_chars(LLAMA3, text);
        assert_eq!((p.content.as_str(), p.calls.len()), (text, 0));
    }
}
