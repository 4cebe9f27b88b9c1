//! The finished engine: load a model (mapped by default), then generate from a prompt or hold
//! a conversation, streaming text and ending with llama.cpp-style timings.

use crate::chat::{Chat, PrefixSession};
use crate::loader::ViewLoader;
use crate::mapped::{MapOptions, PageAdvice, SharedBytes, map_gguf, read_gguf};
use ch08::ch04::{ForwardError, GenParams, Generation, generate};
use ch08::cli::Args;
use ch08::{
    ChatTemplate, FastLoader, Gguf, GgufFile, KvError, Model, PoolKind, Tokenizer, new_pool,
};
use clap::Parser;
use std::error::Error;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

// ANCHOR: args
/// Run a GGUF model: complete a prompt, or chat.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "ch10",
    about = "Run a GGUF model: complete a prompt, or chat (--chat).",
    mut_arg("chat", |a| a.help(
        "Chat: the prompt (if any) is the first user message, then one message per line of \
         stdin, answered through the model's chat template; /exit or end of input stops"
    ))
)]
pub struct EngineArgs {
    /// Chapter 4's flags: model, prompt, sampling, context size, --json.
    #[command(flatten)]
    pub generation: Args,
    /// Read the file into memory instead of mapping it (llama.cpp's --no-mmap).
    #[arg(long)]
    pub no_mmap: bool,
    /// madvise hint for the mapped file.
    #[arg(long, value_enum, default_value_t = PageAdvice::Normal)]
    pub advice: PageAdvice,
    /// Read every page of the file while mapping it (MAP_POPULATE), before the first token.
    #[arg(long)]
    pub populate: bool,
    /// Lock the model's pages in memory (mlock): read now, never evicted.
    #[arg(long)]
    pub mlock: bool,
    /// Keep every weight a view of the file: no repacking for chapter 8's micro-kernel, which
    /// by default interleaves the matrices where the CPU has one (faster products, but the
    /// packed weights are a private copy, no longer the mapped pages).
    #[arg(long)]
    pub no_repack: bool,
    /// The system message of a --chat conversation.
    #[arg(long)]
    pub system: Option<String>,
}
// ANCHOR_END: args

/// How the weights get from the file into the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadMode {
    /// Memory-map the file; the matrices view the mapped pages.
    Map(MapOptions),
    /// Read the whole file into memory once; the matrices view that copy.
    Read,
}

impl EngineArgs {
    /// Chapter 8's matrices, on `--threads` threads, repacked unless `--no-repack`.
    pub fn fast_loader(&self) -> FastLoader {
        let mut fast = FastLoader::new(new_pool(PoolKind::Spin, self.generation.threads.max(1)));
        fast.pack = !self.no_repack;
        fast
    }

    pub fn load_mode(&self) -> LoadMode {
        if self.no_mmap {
            LoadMode::Read
        } else {
            LoadMode::Map(MapOptions {
                advice: self.advice,
                populate: self.populate,
                lock: self.mlock,
            })
        }
    }
}

/// A loaded model with its tokenizer and chat template. It needs nothing more of the file
/// object: the matrices hold the map (or the read buffer) alive themselves.
pub struct Engine {
    pub model: Model,
    pub tokenizer: Tokenizer,
    /// `None` when the file has no `tokenizer.chat_template`.
    pub template: Option<ChatTemplate>,
    /// Open to ready: mapping (or reading), parsing, tokenizer, matrices.
    pub load_time: Duration,
    pub mode: LoadMode,
}

// ANCHOR: load
impl Engine {
    /// Load the model at `path`, its matrices made by `fast` over the file's bytes.
    pub fn load(path: &Path, mode: LoadMode, fast: FastLoader) -> Result<Engine, Box<dyn Error>> {
        let t0 = Instant::now();
        let (model, gguf) = match mode {
            LoadMode::Map(opts) => {
                let (file, bytes) = map_gguf(path, &opts)?;
                build(path, file, bytes, fast)?
            }
            LoadMode::Read => {
                let (file, bytes) = read_gguf(path)?;
                build(path, file, bytes, fast)?
            }
        };
        let tokenizer = Tokenizer::from_gguf(&gguf).map_err(|e| in_file(path, e))?;
        let template = ChatTemplate::from_gguf(&gguf).ok();
        Ok(Engine {
            model,
            tokenizer,
            template,
            load_time: t0.elapsed(),
            mode,
        })
    }
    // ANCHOR_END: load

    /// One line saying what was loaded and how.
    pub fn describe(&self, path: &Path) -> String {
        let c = &self.model.config;
        let how = match self.mode {
            LoadMode::Read => "read into memory".to_string(),
            LoadMode::Map(o) => {
                let mut s = "memory-mapped".to_string();
                if o.advice != PageAdvice::Normal {
                    s += &format!(", madvise {:?}", o.advice);
                }
                if o.populate {
                    s += ", populated";
                }
                if o.lock {
                    s += ", locked";
                }
                s
            }
        };
        format!(
            "model: {} ({how}; {} layers, d_model {}, {}; loaded in {:.1} ms)",
            path.display(),
            c.n_layer,
            c.d_model,
            self.model.weights.layers[0].attn.wq.describe(),
            self.load_time.as_secs_f64() * 1e3
        )
    }
}

/// The model over views of `bytes` (the image of `file`), and the header for the tokenizer.
fn build<O: AsRef<[u8]> + Send + Sync + 'static>(
    path: &Path,
    file: GgufFile<SharedBytes<O>>,
    bytes: SharedBytes<O>,
    fast: FastLoader,
) -> Result<(Model, Gguf), Box<dyn Error>> {
    let compute = fast.compute();
    let model = Model::load(&file, &ViewLoader::new(bytes, fast))
        .map_err(|e| in_file(path, e))?
        .with_compute(compute);
    Ok((model, file.gguf))
}

fn in_file(path: &Path, e: impl std::fmt::Display) -> Box<dyn Error> {
    format!("{}: {e}", path.display()).into()
}

/// The process's memory as Linux reports it in `/proc/self/status`, in KiB.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryStats {
    /// Peak resident set size (`VmHWM`).
    pub peak_rss: u64,
    /// Resident now (`VmRSS`) = anonymous + file-backed + shared memory.
    pub rss: u64,
    /// Resident private memory (`RssAnon`): heap, stacks, the KV cache, a read-in model.
    pub rss_anon: u64,
    /// Resident pages of mapped files (`RssFile`): a mapped model, shared with the page cache.
    pub rss_file: u64,
}

/// This process's [`MemoryStats`]; `None` where `/proc/self/status` does not exist.
pub fn memory_stats() -> Option<MemoryStats> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    };
    Some(MemoryStats {
        peak_rss: kib("VmHWM")?,
        rss: kib("VmRSS")?,
        rss_anon: kib("RssAnon")?,
        rss_file: kib("RssFile")?,
    })
}

/// Work done over a run, for the timing lines.
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    pub load: Duration,
    /// Prompt tokens computed (not those reused from the cache) and the time they took.
    pub prompt_tokens: usize,
    pub prompt_eval: Duration,
    /// Decode steps, each one token fed back, and their time.
    pub eval_runs: usize,
    pub eval: Duration,
    /// Tokens generated, the final end-of-generation token included.
    pub generated: usize,
}

impl Totals {
    fn add(&mut self, g: &Generation, computed: usize) {
        self.prompt_tokens += computed;
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

// ANCHOR: run
/// Run the engine as `args` say. The prompt (or the chat) is checked before the model loads.
pub fn run(args: &EngineArgs) -> Result<(), Box<dyn Error>> {
    let g = &args.generation;
    if !g.chat && g.prompt_text().is_empty() {
        return Err("no prompt: give a PROMPT (or --prompt TEXT), or --chat".into());
    }
    if g.chat && g.json {
        return Err("--json prints one generation as JSON; it does not apply to --chat".into());
    }
    let path: PathBuf = g.model_path()?;
    let t0 = Instant::now();
    let engine = Engine::load(&path, args.load_mode(), args.fast_loader())?;
    if !g.json {
        eprintln!("{}", engine.describe(&path));
    }
    let n_ctx = g.ctx.unwrap_or(engine.model.config.context_length);
    let mut totals = Totals {
        load: engine.load_time,
        ..Totals::default()
    };
    let stdout = std::io::stdout();
    let mut print = |s: &str| {
        let mut out = stdout.lock();
        let _ = out.write_all(s.as_bytes());
        let _ = out.flush();
    };
    if g.chat {
        let stdin = std::io::stdin();
        chat_loop(
            args,
            &engine,
            n_ctx,
            &mut stdin.lock(),
            &mut print,
            &mut totals,
        )?;
    } else {
        let ids = engine.tokenizer.encode(g.prompt_text(), true, true);
        let mut session = PrefixSession::new(&engine.model, n_ctx);
        let params = gen_params(g, 0);
        let mut on_text = |s: &str| {
            if !g.json {
                print(s)
            }
        };
        let generation = generate(&mut session, &engine.tokenizer, &ids, &params, &mut on_text)?;
        totals.add(&generation, ids.len());
        if g.json {
            println!(
                "{}",
                json_report(&generation, &totals, &engine, t0.elapsed())
            );
            return Ok(());
        }
        println!();
    }
    eprintln!("{}", totals.report(t0.elapsed()));
    Ok(())
}
// ANCHOR_END: run

/// Generation parameters for turn `turn` (each turn gets its own seed).
fn gen_params(g: &Args, turn: u64) -> GenParams {
    let mut sampler = g.sampler();
    sampler.seed = sampler.seed.wrapping_add(turn);
    GenParams {
        max_tokens: g.n,
        sampler,
        stop: g.stop.clone(),
    }
}

// ANCHOR: chat_loop
/// Read user messages from `input`, one per line, and answer each; the prompt of `args`, if
/// any, is the first message. Stops at the end of the input or at `/exit`.
pub fn chat_loop(
    args: &EngineArgs,
    engine: &Engine,
    n_ctx: usize,
    input: &mut dyn BufRead,
    print: &mut dyn FnMut(&str),
    totals: &mut Totals,
) -> Result<(), Box<dyn Error>> {
    let template = engine
        .template
        .as_ref()
        .ok_or("--chat needs a chat template, and the model file has no tokenizer.chat_template")?;
    let mut chat = Chat::new(
        &engine.model,
        &engine.tokenizer,
        template,
        args.system.as_deref(),
        n_ctx,
    );
    let interactive = std::io::stdin().is_terminal();
    let mut first = Some(args.generation.prompt_text().to_string()).filter(|p| !p.is_empty());
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
        let t = chat
            .turn(&message, &gen_params(&args.generation, turn), print)
            .map_err(|e| match e.downcast_ref::<ForwardError>() {
                Some(ForwardError::Kv(KvError::Full { .. })) => {
                    format!("{e}: the conversation outgrew --ctx {n_ctx}; start it again with more")
                        .into()
                }
                _ => e,
            })?;
        print("\n");
        totals.add(&t.generation, t.computed());
        eprintln!(
            "[{} prompt tokens, {} kept from the cache; {} generated, {:.1} tok/s]",
            t.generation.prompt_ids.len(),
            t.reused,
            t.generation.ids.len(),
            t.generation.decode_tok_s()
        );
    }
    Ok(())
}
// ANCHOR_END: chat_loop

fn json_report(g: &Generation, t: &Totals, e: &Engine, total: Duration) -> serde_json::Value {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mem = memory_stats().map(|m| {
        serde_json::json!({
            "peak_rss_kib": m.peak_rss,
            "rss_kib": m.rss,
            "rss_anon_kib": m.rss_anon,
            "rss_file_kib": m.rss_file,
        })
    });
    serde_json::json!({
        "prompt_ids": g.prompt_ids,
        "ids": g.ids,
        "text": g.text,
        "loader": match e.mode { LoadMode::Map(_) => "mmap", LoadMode::Read => "read" },
        "load_ms": ms(t.load),
        "first_token_ms": ms(t.load + g.prefill),
        "prompt_eval_ms": ms(t.prompt_eval),
        "eval_ms": ms(t.eval),
        "eval_runs": t.eval_runs,
        "total_ms": ms(total),
        "prefill_tok_s": g.prefill_tok_s(),
        "decode_tok_s": g.decode_tok_s(),
        "memory": mem,
    })
}
