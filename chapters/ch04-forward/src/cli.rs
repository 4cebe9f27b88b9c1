//! The command line of the `generate` example, shared by every later chapter's engine: each
//! chapter passes its own way of loading the model and of computing logits (its [`Session`]),
//! and keeps the flags.

use crate::generate::{GenParams, Generation, Session, generate};
use crate::model::Model;
use crate::sampling::SamplerParams;
use ch02::{ChatTemplate, Message, Tokenizer};
use ch03::GgufFile;
use clap::Parser;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Generate text with a GGUF model.
#[derive(Parser, Debug, Clone)]
pub struct Args {
    /// GGUF model file (default: the default model, fetched on first use).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The prompt (or give it as the last argument).
    #[arg(long, short)]
    pub prompt: Option<String>,
    /// The prompt, as a positional argument.
    #[arg(value_name = "PROMPT", conflicts_with = "prompt")]
    pub prompt_arg: Option<String>,
    /// Number of tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n: usize,
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Random seed (default: from the clock; printed so a run can be repeated).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Threads (used from chapter 8 on).
    #[arg(long, short = 't', default_value_t = 1)]
    pub threads: usize,
    /// Context size: positions the KV cache holds (from chapter 5 on; default: the model's).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Treat the prompt as a user message and apply the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Stop when the text contains this (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// The prompt from `--prompt` or the positional argument (empty if neither).
    pub fn prompt_text(&self) -> &str {
        self.prompt
            .as_deref()
            .or(self.prompt_arg.as_deref())
            .unwrap_or("")
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

    /// The model path: `--model`, else the default model (fetched if needed).
    pub fn model_path(&self) -> Result<PathBuf, Box<dyn std::error::Error>> {
        match &self.model {
            Some(p) => Ok(p.clone()),
            None => Ok(shared::default_model_path()?),
        }
    }
}

/// Tokenize the prompt as llama.cpp's tools do: special tokens parsed, BOS per the model's
/// metadata; with `chat`, the prompt is first rendered as a user turn by the chat template.
pub fn prompt_ids(
    file: &GgufFile,
    tok: &Tokenizer,
    prompt: &str,
    chat: bool,
) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let text = if chat {
        let template = ChatTemplate::from_gguf(&file.gguf)?;
        template.render(
            &[Message {
                role: "user".into(),
                content: prompt.into(),
            }],
            true,
        )?
    } else {
        prompt.to_string()
    };
    Ok(tok.encode(&text, true, true))
}

/// The whole `main` of a chapter's `generate` example: parse the flags, [`run`], and exit with
/// a message on error.
pub fn main(
    load: impl FnOnce(&GgufFile) -> Result<Model, Box<dyn std::error::Error>>,
    session: impl for<'m> FnOnce(&'m Model, &Args) -> Box<dyn Session + 'm>,
) {
    let args = Args::parse();
    if let Err(e) = run(&args, load, |model| session(model, &args)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Run the example: load with `load`, compute with the session `session` makes, print.
pub fn run(
    args: &Args,
    load: impl FnOnce(&GgufFile) -> Result<Model, Box<dyn std::error::Error>>,
    session: impl FnOnce(&Model) -> Box<dyn Session + '_>,
) -> Result<Generation, Box<dyn std::error::Error>> {
    let path = args.model_path()?;
    let t0 = Instant::now();
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file.gguf)?;
    let model = load(&file)?;
    let load_time = t0.elapsed();
    let ids = prompt_ids(&file, &tok, args.prompt_text(), args.chat)?;
    let sampler = args.sampler();
    if !args.json {
        eprintln!(
            "model: {} ({:.2} s to load), seed {}",
            path.display(),
            load_time.as_secs_f64(),
            sampler.seed
        );
    }
    let params = GenParams {
        max_tokens: args.n,
        sampler,
        stop: args.stop.clone(),
    };
    let mut session = session(&model);
    let stdout = std::io::stdout();
    let mut on_text = |s: &str| {
        if !args.json {
            let mut out = stdout.lock();
            let _ = out.write_all(s.as_bytes());
            let _ = out.flush();
        }
    };
    let generation = generate(session.as_mut(), &tok, &ids, &params, &mut on_text)?;
    if args.json {
        let json = serde_json::json!({
            "prompt_ids": generation.prompt_ids,
            "ids": generation.ids,
            "text": generation.text,
            "prefill_tok_s": generation.prefill_tok_s(),
            "decode_tok_s": generation.decode_tok_s(),
        });
        println!("{json}");
    } else {
        println!();
        eprintln!("{}", generation.timings());
    }
    Ok(generation)
}
