//! What every chapter's engine does for its command line, from this chapter's `generate`
//! example to the finished engine of chapter 10. A chapter plugs in what it changes and keeps
//! the rest:
//! - how the model loads (the `load` closure of [`run`]);
//! - how logits are computed: a [`Session`] for chapters 4–8 ([`Sessions`]), or any other
//!   [`Runner`] (chapter 10 runs chapter 7's scheduler);
//! - settings of its own, next to [`Args`];
//! - fields of its own in the `--json` report ([`Runner::report`]).
//!
//! The loop itself — one prompt, or a conversation with `--chat` — the llama.cpp-style timing
//! lines and the JSON report are [`drive`]'s, the same in every chapter. Parsing the flags is
//! not: it is the programs' job (the examples' `generate_flags`, with clap), so that this
//! library, and every chapter built on it, can be used without a command line.

use crate::generate::{GenParams, Generation, Session, StopReason, generate};
use crate::model::{ForwardError, Model};
use crate::sampling::{MakeRule, SamplerParams};
use ch01::GgufFile;
use ch02::{ChatTemplate, Message, Tokenizer};
use ch03::KvError;
use serde_json::{Map, Value, json};
use std::error::Error;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The default `--threads`: the machine's physical cores (llama.cpp's
/// `cpu_get_num_physical_cores`: one per distinct set of hardware-thread siblings in
/// `/sys/devices/system/cpu`), at most the cores this process may run on, and those where the
/// topology is not there to read.
pub fn default_threads() -> usize {
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut siblings = std::collections::BTreeSet::new();
    for cpu in 0.. {
        let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings");
        match std::fs::read_to_string(path) {
            Ok(s) => siblings.insert(s.trim().to_string()),
            Err(_) => break,
        };
    }
    match siblings.len() {
        0 => available,
        n => n.min(available),
    }
}

/// What a run of the command line is asked to do: the settings behind chapter 4's flags
/// (`--model`, the prompt, `-n`, the sampler, `--threads`, `--ctx`, `--chat`, `--system`,
/// `--stop`, `--json`, `--ignore-eos`). The flags themselves — their names, help and parsing — belong to the
/// programs (the `generate` example's `examples/common/generate_flags.rs`), not to this library; [`Args::default`] is what they default to.
#[derive(Debug, Clone)]
pub struct Args {
    /// GGUF model file (`None`: the default model, fetched on first use).
    pub model: Option<PathBuf>,
    /// The prompt (`--prompt` or the positional argument).
    pub prompt: Option<String>,
    /// Number of tokens to generate.
    pub n: usize,
    /// Temperature; 0 is greedy.
    pub temp: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    /// Random seed (`None`: from the clock; printed so a run can be repeated).
    pub seed: Option<u64>,
    /// Threads (used from chapter 8 on).
    pub threads: usize,
    /// Context size: positions a run holds (`None`: 4096, or the model's context if shorter).
    pub ctx: Option<usize>,
    /// Chat: the prompt (if any) is the first user message, then one message per line of
    /// stdin, each answered through the model's chat template; /exit or end of input stops.
    pub chat: bool,
    /// The system message of a chat (`None`: the template's own, if any).
    pub system: Option<String>,
    /// Stop when the text contains one of these.
    pub stop: Vec<String>,
    /// Print one JSON object instead of streaming text (not with `chat`).
    pub json: bool,
    /// Which tokens may come next, if not all: [`IgnoreEos`](crate::IgnoreEos) for
    /// `--ignore-eos`, or any other [`MakeRule`].
    pub rule: Option<Arc<dyn MakeRule>>,
}

impl Default for Args {
    /// llama.cpp's defaults: 128 tokens, temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
    /// no repeat penalty; threads: the machine's physical cores.
    fn default() -> Args {
        Args {
            model: None,
            prompt: None,
            n: 128,
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            seed: None,
            threads: default_threads(),
            ctx: None,
            chat: false,
            system: None,
            stop: Vec::new(),
            json: false,
            rule: None,
        }
    }
}

impl Args {
    /// The prompt (empty if none was given).
    pub fn prompt_text(&self) -> &str {
        self.prompt.as_deref().unwrap_or("")
    }

    /// What to generate: `-n`, the sampler, `--stop`. Chat turn `turn` gets the seed plus
    /// `turn`, so that turns differ and a conversation can be repeated.
    pub fn params(&self, turn: u64) -> GenParams {
        let mut sampler = self.sampler();
        sampler.seed = sampler.seed.wrapping_add(turn);
        GenParams {
            max_tokens: self.n,
            sampler,
            stop: self.stop.clone(),
            rule: self.rule.clone(),
        }
    }

    pub fn sampler(&self) -> SamplerParams {
        SamplerParams {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: 64,
            seed: self.seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
            }),
        }
    }

    /// `--threads`, capped at [`MAX_THREADS_PER_CORE`] per available core (with a warning):
    /// more threads than that only wait for each other, and each costs a stack. [`check`]
    /// refuses more; the cap is for a caller that did not check.
    pub fn threads(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cap = cores * MAX_THREADS_PER_CORE;
        if self.threads > cap {
            eprintln!(
                "warning: --threads {} is more than {MAX_THREADS_PER_CORE} per core on this \
                 machine's {cores}; using {cap}",
                self.threads
            );
        }
        self.threads.clamp(1, cap)
    }

    /// The model path, `--model`. (A program fills in its default model, if it has one,
    /// before it runs: the library fetches nothing.)
    pub fn model_path(&self) -> Result<PathBuf, Box<dyn Error>> {
        self.model
            .clone()
            .ok_or_else(|| "no model file: give --model PATH".into())
    }
}

/// A prompt that does not fit the context: what a [`Runner`] returns rather than start on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextFull {
    pub prompt: usize,
    pub n_ctx: usize,
}

impl std::fmt::Display for ContextFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ContextFull { prompt, n_ctx } = self;
        write!(
            f,
            "the prompt has {prompt} tokens and the context holds {n_ctx} (--ctx {n_ctx})"
        )
    }
}

impl Error for ContextFull {}

// ANCHOR: runner
/// What a chapter plugs into the command line: how a prompt becomes a generation.
pub trait Runner {
    /// Generate from `prompt` (token ids), streaming text to `on_text`. In a conversation each
    /// turn's prompt is the whole conversation so far; a runner with a cache may keep what an
    /// earlier turn computed and say so in [`Generation::reused`].
    fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, Box<dyn Error>>;

    /// Add this chapter's fields to the `--json` report.
    fn report(&self, _report: &mut Report) {}
}

/// Chapters 4–8's runner: chapter 4's [`generate`] loop over a fresh [`Session`] from
/// `new_session` for every prompt, so each chat turn computes the whole conversation again.
pub struct Sessions<'m, F> {
    pub model: &'m Model,
    pub tokenizer: &'m Tokenizer,
    pub new_session: F,
}

impl<'m, F: FnMut(&'m Model) -> Box<dyn Session<Error = ForwardError> + 'm>> Runner
    for Sessions<'m, F>
{
    fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, Box<dyn Error>> {
        let mut session = (self.new_session)(self.model);
        let g = generate(session.as_mut(), self.tokenizer, prompt, params, on_text);
        Ok(g.map_err(|e| match e {
            ForwardError::NonFinite(e) => ForwardError::NonFinite(e.locate(self.model)),
            e => e,
        })?)
    }
}
// ANCHOR_END: runner

/// Run a `generate` example: load with `load`, compute with the sessions `session` makes, [`drive`].
pub fn run(
    args: &Args,
    load: impl FnOnce(&GgufFile) -> Result<Model, Box<dyn Error>>,
    session: impl FnMut(&Model) -> Box<dyn Session<Error = ForwardError> + '_>,
) -> Result<(), Box<dyn Error>> {
    check(args)?;
    let path = args.model_path()?;
    let t0 = Instant::now();
    let file = GgufFile::open(&path)?;
    let tokenizer = Tokenizer::from_gguf(&file.gguf)?;
    let template = ChatTemplate::from_gguf(&file.gguf).ok();
    let mut model = load(&file)?;
    set_context(&mut model, args.ctx)?;
    let load_time = t0.elapsed();
    if !args.json {
        eprintln!(
            "model: {} ({:.2} s to load)",
            path.display(),
            load_time.as_secs_f64()
        );
    }
    let mut runner = Sessions {
        model: &model,
        tokenizer: &tokenizer,
        new_session: session,
    };
    drive(
        args,
        &tokenizer,
        template.as_ref(),
        (t0, load_time),
        &mut runner,
    )
}

/// Give `model` the context `--ctx` asks for (if it does), or say why it cannot have it.
pub fn set_context(model: &mut Model, ctx: Option<usize>) -> Result<(), Box<dyn Error>> {
    if let Some(n) = ctx {
        model
            .set_context(n)
            .map_err(|e| format!("--ctx {n}: {e}"))?;
    }
    Ok(())
}

/// The prompt in the file at `path` (llama.cpp's `-f FNAME`): its text, less one final
/// newline (as llama.cpp takes it). A file that is not UTF-8, or longer than any context holds
/// (chapter 2's [`MAX_RENDERED_BYTES`](ch02::chat::MAX_RENDERED_BYTES), 8 MiB), is refused by
/// name; at most that many bytes are ever read, so `/dev/zero` is an error, not a hang.
pub fn read_prompt_file(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let limit = ch02::chat::MAX_RENDERED_BYTES;
    let what = |e: &dyn std::fmt::Display| format!("--file {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(|e| what(&e))?;
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| what(&e))?;
    if bytes.len() > limit {
        return Err(what(&format!(
            "longer than {limit} bytes (MAX_RENDERED_BYTES): more than any model's context holds"
        )));
    }
    let mut text = String::from_utf8(bytes).map_err(|e| what(&e))?;
    if text.ends_with('\n') {
        text.pop();
    }
    Ok(text)
}

/// Refuse flags that cannot work, before anything loads: no prompt, a sampling setting out of
/// its domain (named with its value), no threads.
pub fn check(args: &Args) -> Result<(), Box<dyn Error>> {
    if !args.chat && args.prompt_text().is_empty() {
        return Err(
            "no prompt: give a PROMPT (or --prompt TEXT, or --file FNAME), or --chat".into(),
        );
    }
    args.sampler()
        .validate()
        .map_err(|e| format!("--{}", e.to_string().replace('_', "-")))?;
    check_threads(args.threads)?;
    Ok(())
}

/// Threads beyond this many per hardware thread the process may run on only take turns on the
/// cores: each costs a stack and a few memory mappings, and waits for the others at every
/// product. The bound is what makes a typo harmless: `--threads 100000` would start threads
/// until the system refuses one (after about 16,000 on a machine with Linux's default of
/// 65,530 memory mappings a process), and with the mappings spent, even reporting that can
/// fail and abort the process.
pub const MAX_THREADS_PER_CORE: usize = 4;

/// The most `--threads` this process takes: [`MAX_THREADS_PER_CORE`] per hardware thread it
/// may run on.
pub fn max_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.saturating_mul(MAX_THREADS_PER_CORE)
}

/// Refuse a `--threads` of 0, or of more than [`max_threads`], with a message naming the flag,
/// the value and the bound. Every program that takes `--threads` checks it here.
pub fn check_threads(threads: usize) -> Result<(), String> {
    if threads == 0 {
        return Err("--threads 0: at least one thread computes".into());
    }
    let max = max_threads();
    if threads > max {
        return Err(format!(
            "--threads {threads} is more than {max}, {MAX_THREADS_PER_CORE} per hardware thread \
             this process may run on: more threads only take turns on the cores"
        ));
    }
    Ok(())
}

// ANCHOR: drive
/// Run the command line's job with `runner`: complete the prompt, or hold a conversation
/// (`--chat`, messages from stdin); stream the text to stdout, then print llama.cpp-style
/// timings to stderr, or one JSON object with `--json`. `loaded` is when loading started and
/// how long it took.
pub fn drive(
    args: &Args,
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    loaded: (Instant, Duration),
    runner: &mut dyn Runner,
) -> Result<(), Box<dyn Error>> {
    check(args)?;
    let (t0, load_time) = loaded;
    let mut totals = Totals {
        load: load_time,
        ..Totals::default()
    };
    let stdout = std::io::stdout();
    let mut print = |s: &str| {
        let mut out = stdout.lock();
        let _ = out.write_all(s.as_bytes());
        let _ = out.flush();
    };
    // ANCHOR_END: drive
    // ANCHOR: drive_branches
    if args.chat {
        let template = template.ok_or(
            "--chat needs a chat template, and the model file has no tokenizer.chat_template",
        )?;
        eprintln!("seed {}", args.sampler().seed);
        let stdin = std::io::stdin();
        let interactive = stdin.is_terminal();
        let mut chat = Chat::new(tokenizer, template, args.system.as_deref());
        chat_loop(
            args,
            &mut chat,
            runner,
            &mut stdin.lock(),
            interactive,
            &mut print,
            &mut totals,
        )?;
    } else {
        let ids = tokenizer.encode(args.prompt_text(), true, true);
        if ids.is_empty() {
            return Err("the prompt encodes to no tokens (and the model adds no BOS)".into());
        }
        let params = args.params(0);
        if !args.json {
            eprintln!("seed {}", params.sampler.seed);
        }
        let mut on_text = |s: &str| {
            if !args.json {
                print(s)
            }
        };
        let g = runner.generate(&ids, &params, &mut on_text)?;
        totals.add(&g);
        if g.stop == StopReason::ContextFull && !args.json {
            eprintln!("\n[the context is full; a larger --ctx holds more]");
        }
        if args.json {
            let mut report = json_report(&g, &totals, t0.elapsed());
            let mut own = Report::default();
            runner.report(&mut own);
            report.extend(own.to_json());
            println!("{}", Value::Object(report));
            return Ok(());
        }
        println!();
    }
    eprintln!("{}", totals.report(t0.elapsed()));
    Ok(())
}
// ANCHOR_END: drive_branches

/// A conversation: the messages so far, rendered by the model's chat template.
pub struct Chat<'a> {
    pub messages: Vec<Message>,
    template: &'a ChatTemplate,
    tokenizer: &'a Tokenizer,
}

impl<'a> Chat<'a> {
    /// A new conversation, opened by a system message if one is given (otherwise the template
    /// may supply its own, as SmolLM2's does).
    pub fn new(tokenizer: &'a Tokenizer, template: &'a ChatTemplate, system: Option<&str>) -> Self {
        Chat {
            messages: system
                .map(|s| vec![Message::new("system", s)])
                .unwrap_or_default(),
            template,
            tokenizer,
        }
    }

    /// The token ids of the conversation so far, ending with the header of an assistant turn.
    /// What the user typed is text: `<|im_end|>` in a message is characters, not the marker
    /// (chapter 2's [`ChatTemplate::encode`]).
    pub fn prompt_ids(&self) -> Result<Vec<u32>, Box<dyn Error>> {
        Ok(self.template.encode(self.tokenizer, &self.messages, true)?)
    }

    // ANCHOR: turn
    /// Add `user`'s message, generate the answer with `runner` (streamed to `on_text`) and keep
    /// it. On an error the conversation is as it was before.
    pub fn turn(
        &mut self,
        user: &str,
        runner: &mut dyn Runner,
        params: &GenParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, Box<dyn Error>> {
        self.messages.push(Message::new("user", user));
        let result = self
            .prompt_ids()
            .and_then(|ids| runner.generate(&ids, params, on_text));
        match result {
            Ok(g) => {
                self.messages.push(Message::new("assistant", &g.text));
                Ok(g)
            }
            Err(e) => {
                self.messages.pop();
                Err(e)
            }
        }
    }
    // ANCHOR_END: turn
}

/// Read user messages from `input`, one per line, and answer each; the prompt of `args`, if
/// any, is the first message. Stops at the end of the input or at `/exit`.
pub fn chat_loop(
    args: &Args,
    chat: &mut Chat,
    runner: &mut dyn Runner,
    input: &mut dyn BufRead,
    interactive: bool,
    print: &mut dyn FnMut(&str),
    totals: &mut Totals,
) -> Result<(), Box<dyn Error>> {
    let mut first = Some(args.prompt_text().to_string()).filter(|p| !p.is_empty());
    for turn in 0.. {
        let message = match first.take() {
            Some(m) => m,
            None => {
                if interactive {
                    eprint!("> ");
                }
                let mut line = String::new();
                if input.read_line(&mut line)? == 0 {
                    break;
                }
                line.trim().to_string()
            }
        };
        if message == "/exit" {
            break;
        }
        if message.is_empty() {
            continue;
        }
        let g = chat
            .turn(&message, runner, &args.params(turn), print)
            .map_err(|e| {
                let full = e.is::<ContextFull>()
                    || matches!(
                        e.downcast_ref::<ForwardError>(),
                        Some(ForwardError::Kv(KvError::Full { .. }))
                    );
                if full {
                    format!(
                        "{e}: the conversation outgrew the context; start it again with a larger --ctx"
                    )
                    .into()
                } else {
                    e
                }
            })?;
        print("\n");
        totals.add(&g);
        eprintln!(
            "[{} prompt tokens, {} kept from the cache; {} generated, {:.1} tok/s]",
            g.prompt_ids.len(),
            g.reused,
            g.ids.len(),
            g.decode_tok_s()
        );
    }
    Ok(())
}

/// Work done over a run, for the timing lines.
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    pub load: Duration,
    /// Prompt tokens computed (not those reused from a cache) and the time they took.
    pub prompt_tokens: usize,
    pub prompt_eval: Duration,
    /// Decode steps, each one token fed back, and their time.
    pub eval_runs: usize,
    pub eval: Duration,
    /// Tokens generated, final end-of-generation tokens included.
    pub generated: usize,
}

impl Totals {
    pub fn add(&mut self, g: &Generation) {
        self.prompt_tokens += g.computed();
        self.prompt_eval += g.prefill;
        self.eval_runs += g.decode_calls;
        self.eval += g.decode;
        self.generated += g.ids.len();
    }

    /// The timing lines llama.cpp prints at the end of a run.
    pub fn report(&self, total: Duration) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let rate = |d: Duration, n: usize, unit: &str| {
            if n == 0 {
                unit.trim_end().to_string()
            } else {
                format!(
                    "{unit} ({:8.2} ms per token, {:8.2} tokens per second)",
                    ms(d) / n as f64,
                    n as f64 / d.as_secs_f64()
                )
            }
        };
        format!(
            "       load time = {:10.2} ms\n\
             prompt eval time = {:10.2} ms / {:5} {}\n\
             \x20      eval time = {:10.2} ms / {:5} {}\n\
             \x20     total time = {:10.2} ms / {:5} tokens",
            ms(self.load),
            ms(self.prompt_eval),
            self.prompt_tokens,
            rate(self.prompt_eval, self.prompt_tokens, "tokens"),
            ms(self.eval),
            self.eval_runs,
            rate(self.eval, self.eval_runs, "runs  "),
            ms(total),
            self.prompt_tokens + self.eval_runs
        )
    }
}

/// The `--json` report of one generation: ids, text, why it stopped, and timings in
/// milliseconds (`total_ms` from the start of loading). Runners add their own fields.
fn json_report(g: &Generation, t: &Totals, total: Duration) -> Map<String, Value> {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let stop = g.stop.name();
    let Value::Object(map) = json!({
        "prompt_ids": g.prompt_ids,
        "ids": g.ids,
        "text": g.text,
        "stop": stop,
        "prompt_tokens_reused": g.reused,
        "load_ms": ms(t.load),
        "first_token_ms": ms(t.load + g.prefill),
        "prompt_eval_ms": ms(t.prompt_eval),
        "eval_ms": ms(t.eval),
        "eval_runs": t.eval_runs,
        "total_ms": ms(total),
        "prefill_tok_s": g.prefill_tok_s(),
        "decode_tok_s": g.decode_tok_s(),
    }) else {
        unreachable!("json! of an object literal is an object")
    };
    map
}

/// Fields a [`Runner`] adds to the `--json` report, in order: a name and a value each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub fields: Vec<(String, Field)>,
}

/// A value of the `--json` report: a number, text, a switch, nothing, or fields of its own.
#[derive(Debug, Clone, PartialEq)]
pub enum Field {
    Null,
    Bool(bool),
    Int(u64),
    Float(f64),
    Text(String),
    Fields(Report),
}

impl Report {
    /// Add the field `name`.
    pub fn add(&mut self, name: &str, value: impl Into<Field>) -> &mut Report {
        self.fields.push((name.to_string(), value.into()));
        self
    }
}

impl From<bool> for Field {
    fn from(v: bool) -> Field {
        Field::Bool(v)
    }
}
impl From<u64> for Field {
    fn from(v: u64) -> Field {
        Field::Int(v)
    }
}
impl From<usize> for Field {
    fn from(v: usize) -> Field {
        Field::Int(v as u64)
    }
}
impl From<f64> for Field {
    fn from(v: f64) -> Field {
        Field::Float(v)
    }
}
impl From<&str> for Field {
    fn from(v: &str) -> Field {
        Field::Text(v.to_string())
    }
}
impl From<String> for Field {
    fn from(v: String) -> Field {
        Field::Text(v)
    }
}
impl From<Report> for Field {
    fn from(v: Report) -> Field {
        Field::Fields(v)
    }
}
impl<T: Into<Field>> From<Option<T>> for Field {
    fn from(v: Option<T>) -> Field {
        v.map_or(Field::Null, Into::into)
    }
}

impl Field {
    /// As JSON; a number that is not finite is `null`, as JSON has no such number.
    fn to_json(&self) -> Value {
        match self {
            Field::Null => Value::Null,
            Field::Bool(b) => Value::Bool(*b),
            Field::Int(n) => Value::from(*n),
            Field::Float(x) => Value::from(*x),
            Field::Text(s) => Value::String(s.clone()),
            Field::Fields(r) => Value::Object(r.to_json()),
        }
    }
}

impl Report {
    fn to_json(&self) -> Map<String, Value> {
        self.fields
            .iter()
            .map(|(k, v)| (k.clone(), v.to_json()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_beyond_the_bound_are_refused_naming_the_flag_and_the_bound() {
        assert!(check_threads(1).is_ok());
        assert!(check_threads(max_threads()).is_ok());
        for bad in [0, max_threads() + 1, 100_000, usize::MAX] {
            let e = check_threads(bad).unwrap_err();
            assert!(e.starts_with(&format!("--threads {bad}")), "{e}");
            if bad > 0 {
                assert!(e.contains(&max_threads().to_string()), "{e}");
            }
        }
    }

    #[test]
    fn a_prompt_file_loses_one_final_newline_and_bad_files_are_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("llm-rs-prompt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let two = write("two.txt", b"line one\nline two\n\n");
        assert_eq!(read_prompt_file(&two).unwrap(), "line one\nline two\n");
        let bad = write("bad.txt", b"ok \xff\xfe");
        let e = read_prompt_file(&bad).unwrap_err();
        assert!(e.starts_with("--file ") && e.contains("bad.txt"), "{e}");
        let e = read_prompt_file(&dir.join("missing.txt")).unwrap_err();
        assert!(e.contains("missing.txt"), "{e}");
        // An endless file: refused after the bound, not read until memory runs out.
        #[cfg(target_os = "linux")]
        {
            let e = read_prompt_file(std::path::Path::new("/dev/zero")).unwrap_err();
            assert!(e.contains("MAX_RENDERED_BYTES"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
