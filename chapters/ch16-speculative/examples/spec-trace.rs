//! One generation with prompt lookup, pass by pass: what was guessed, how much of it held,
//! and the token the model added. Greedy, on the default model (or `--model FILE`).
//!
//! `cargo run --release -p ch16 --example spec-trace -- [--model FILE] [-n 40] [PROMPT]`

use ch02::Tokenizer;
use ch04::{ForwardError, GenParams, SamplerParams};
use ch05::{Cached, ContiguousCache};
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::engine::{Engine, LoadMode};
use ch10::mapped::MapOptions;
use ch16::Proposer;
use ch16::{DraftLength, PromptLookup, speculate};
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
struct Flags {
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(short, default_value_t = 40)]
    n: usize,
    #[arg(
        default_value = "Copy the words: alpha beta gamma delta epsilon zeta eta theta. \
                           Again: alpha beta"
    )]
    prompt: String,
}

/// Prompt lookup, remembering each call: where in the sequence it guessed, and what.
struct Recorded {
    inner: PromptLookup,
    calls: Vec<(usize, Vec<u32>)>,
}

impl Proposer for Recorded {
    fn propose(
        &mut self,
        tokens: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), ForwardError> {
        let start = out.len();
        self.inner.propose(tokens, max, out)?;
        self.calls.push((tokens.len(), out[start..].to_vec()));
        Ok(())
    }
}

fn text(tok: &Tokenizer, ids: &[u32]) -> String {
    format!("{:?}", tok.decode(ids))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let flags = Flags::parse();
    let path = match flags.model {
        Some(p) => p,
        None => shared::default_model_path()?,
    };
    let fast = FastLoader::new(new_pool(PoolKind::Spin, 2));
    let engine = Engine::load(
        &path,
        LoadMode::Map(MapOptions::default()),
        fast,
        &ch13::architectures(),
    )?;
    let (model, tok) = (&engine.model, &engine.tokenizer);
    let prompt = tok.encode(&flags.prompt, true, false);
    let params = GenParams {
        max_tokens: flags.n,
        sampler: SamplerParams::greedy(),
        stop: Vec::new(),
        rule: None,
    };
    let mut session = Cached::new(model, ContiguousCache::for_model(model, 512), 256);
    let mut proposer = Recorded {
        inner: PromptLookup::default(),
        calls: Vec::new(),
    };
    let (g, stats) = speculate(
        &mut session,
        &mut proposer,
        &mut DraftLength::new(8),
        tok,
        &prompt,
        &params,
        &mut |_| {},
    )?;
    let mut all = prompt.clone();
    all.extend_from_slice(&g.ids);
    println!("prompt: {} tokens", prompt.len());
    for (pass, (at, guess)) in proposer.calls.iter().enumerate() {
        let truth = &all[*at..];
        let held = guess.iter().zip(truth).take_while(|(a, b)| a == b).count();
        let added = &truth[held..(held + 1).min(truth.len())];
        println!(
            "pass {pass:>2}: guessed {:>2} {:<34} held {held}, then {}",
            guess.len(),
            text(tok, guess),
            text(tok, added)
        );
    }
    println!(
        "{} tokens in {} passes after the prompt's ({:.2} per pass); {} of {} guesses held ({:.0} %)",
        g.ids.len(),
        stats.passes,
        stats.tokens_per_pass(),
        stats.accepted,
        stats.proposed,
        100.0 * stats.acceptance()
    );
    println!("text: {:?}", g.text);
    Ok(())
}
