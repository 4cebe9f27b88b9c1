//! Several prompts at once through the continuous-batching scheduler, each one's text streamed
//! as it is written, with its request number in front: `[2] …`.
//!
//! cargo run --release -p ch07 --example serve_batch -- -n 48 --temp 0
//! cargo run --release -p ch07 --example serve_batch -- --prompt "Hi" --prompt "Tell me a joke" --stagger 4
//!
//! Without `--prompt`, four chat questions that share a system prompt: the later ones find it
//! in the prefix cache (`cached` in the table at the end). `--show-tree` prints the prefix
//! cache's radix tree at the end.

use ch01::GgufFile;
use ch02::{ChatTemplate, Message, Tokenizer};
use ch03::DenseLoader;
use ch04::{GenParams, Model, SamplerParams};
use ch06::QuantLoader;
use ch07::{Request, RequestId, Scheduler, SchedulerConfig, Sink};
use clap::Parser;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Run several prompts concurrently and stream their text.
#[derive(Parser, Debug)]
struct Args {
    /// GGUF model file (default: the default model, fetched on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    /// A prompt (repeatable); each becomes a user message of the chat template.
    #[arg(long, short)]
    prompt: Vec<String>,
    /// System message put before every prompt.
    #[arg(
        long,
        default_value = "You are a friendly assistant for a science museum. Visitors ask you short questions; answer each in two or three plain sentences that a curious twelve-year-old would understand."
    )]
    system: String,
    /// Tokens to generate per request.
    #[arg(short = 'n', long = "n-predict", default_value_t = 48)]
    n: usize,
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when the text contains this (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Most tokens per step.
    #[arg(long, default_value_t = 64)]
    budget: usize,
    /// Most requests running at once.
    #[arg(long, default_value_t = 8)]
    max_running: usize,
    /// KV blocks in the pool, and positions per block.
    #[arg(long, default_value_t = 128)]
    blocks: usize,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    #[arg(long)]
    no_prefix_cache: bool,
    /// Submit request i after i × STAGGER steps instead of all at once.
    #[arg(long, default_value_t = 0)]
    stagger: usize,
    /// f32 weights instead of the file's quantized blocks.
    #[arg(long)]
    dense: bool,
    /// Print the prefix cache's radix tree at the end.
    #[arg(long)]
    show_tree: bool,
}

const DEFAULT_PROMPTS: [&str; 4] = [
    "What is the capital of France?",
    "Why is the sky blue?",
    "Give me a tip for learning to play the guitar.",
    "What do bees make?",
];

/// Streams every request's text as lines `[id] …`: a line is printed as soon as it is complete
/// or long enough, so that the requests' texts interleave line by line, not token by token.
#[derive(Default)]
struct Printer {
    pending: HashMap<RequestId, String>,
}

impl Printer {
    const WIDTH: usize = 60;

    fn flush(&mut self, id: RequestId, all: bool) {
        let buf = self.pending.entry(id).or_default();
        let mut out = std::io::stdout().lock();
        loop {
            let cut = match buf.find('\n') {
                Some(i) => Some((i, i + 1)),
                None if buf.len() >= Self::WIDTH => {
                    buf.rfind(' ').filter(|&i| i > 0).map(|i| (i, i))
                }
                None => None,
            };
            let Some((end, next)) = cut else { break };
            let _ = writeln!(out, "[{id}] {}", &buf[..end]);
            buf.drain(..next);
        }
        if all && !buf.is_empty() {
            let _ = writeln!(out, "[{id}] {buf}");
            buf.clear();
        }
    }
}

impl Sink for Printer {
    fn text(&mut self, id: RequestId, text: &str) {
        self.pending.entry(id).or_default().push_str(text);
        self.flush(id, false);
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let path = match &args.model {
        Some(p) => p.clone(),
        None => shared::default_model_path()?,
    };
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file.gguf)?;
    let model = if args.dense {
        Model::load(&file, &DenseLoader, &ch04::architectures())?
    } else {
        Model::load(&file, &QuantLoader, &ch04::architectures())?
    };
    let template = ChatTemplate::from_gguf(&file.gguf)?;
    let prompts: Vec<String> = if args.prompt.is_empty() {
        DEFAULT_PROMPTS.iter().map(|p| p.to_string()).collect()
    } else {
        args.prompt.clone()
    };
    let mut requests = Vec::new();
    for p in &prompts {
        let messages = [
            Message::new("system", &args.system),
            Message::new("user", p),
        ];
        requests.push(Request {
            prompt: template.encode(&tok, &messages, true)?,
            params: GenParams {
                max_tokens: args.n,
                sampler: SamplerParams {
                    temp: args.temp,
                    seed: args.seed,
                    ..SamplerParams::default()
                },
                stop: args.stop.clone(),
                rule: None,
            },
        });
    }
    let config = SchedulerConfig {
        max_batch_tokens: args.budget,
        max_running: args.max_running.min(args.budget),
        block_size: args.block_size,
        n_blocks: args.blocks,
        prefix_cache: !args.no_prefix_cache,
        cache: Default::default(),
    };
    let name = path
        .file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy();
    let weights = model
        .blocks_as::<ch04::llama::Llama>()
        .expect("llama blocks")
        .layers[0]
        .attn
        .wq
        .describe();
    eprintln!("model: {name} ({weights}), {config:?}");

    let mut scheduler = Scheduler::new(&model, &tok, config)?;
    let mut printer = Printer::default();
    let mut done = Vec::new();
    let mut batch_tokens = 0;
    let t0 = Instant::now();
    let mut pending = requests.into_iter().enumerate().peekable();
    while pending.peek().is_some() || !scheduler.is_idle() {
        while let Some((i, _)) = pending.peek() {
            if i * args.stagger > scheduler.stats().steps {
                break;
            }
            let (_, r) = pending.next().expect("peeked");
            scheduler.submit(r)?;
        }
        let report = scheduler.step(&mut printer)?;
        batch_tokens += report.n_tokens;
        for f in &report.finished {
            printer.flush(f.id, true);
        }
        done.extend(report.finished);
    }
    let wall = t0.elapsed();

    done.sort_by_key(|f| f.id);
    eprintln!(
        "\nrequest  prompt  cached  computed  generated  preempted  first token  decode tok/s  stop"
    );
    for f in &done {
        eprintln!(
            "[{}]      {:>6}  {:>6}  {:>8}  {:>9}  {:>9}  {:>8.0} ms  {:>12.1}  {:?}",
            f.id,
            f.prompt_len,
            f.cached_tokens,
            f.computed_tokens,
            f.ids.len(),
            f.preemptions,
            f.ttft.as_secs_f64() * 1e3,
            f.decode_tok_s(),
            f.stop
        );
    }
    let st = scheduler.stats();
    eprintln!(
        "total: {} tokens generated in {:.2} s ({:.1} tok/s); {} steps, {:.1} tokens per step; {} prompt positions from the prefix cache",
        st.generated_tokens,
        wall.as_secs_f64(),
        st.generated_tokens as f64 / wall.as_secs_f64(),
        st.steps,
        batch_tokens as f64 / st.steps.max(1) as f64,
        st.cached_tokens,
    );
    if args.show_tree {
        // An edge's first and last few characters: where it starts, and where it parts.
        let label = |t: &[u32]| {
            let chars: Vec<char> = tok.decode(t).chars().collect();
            let n = chars.len();
            if n <= 40 {
                return chars.iter().collect::<String>();
            }
            let head: String = chars[..16].iter().collect();
            let tail: String = chars[n - 20..].iter().collect();
            format!("{head}…{tail}")
        };
        eprintln!("\n{}", scheduler.prefix_cache().draw(&label));
    }
    Ok(())
}
