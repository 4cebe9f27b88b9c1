//! The `make-model` examples' program: make a model of one of `shapes` from a recipe into the
//! model cache, and print its path. A chapter's `make-model` example runs it on that chapter's
//! shapes.
//!
//! A file already in the cache is reused (its name holds the shape, layers, type, seed and
//! recipe version); `--out PATH` writes somewhere else instead.

use ch14::large::{self, Recipe, Shape};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::process::ExitCode;

/// Make a generated model (random weights at trained scale, a real vocabulary).
#[derive(Parser)]
struct Cli {
    /// The shape (the example's usage lists them).
    shape: String,
    /// llama.cpp's file type: Q4_0, Q4_K_M, Q8_0 or F16.
    ftype: String,
    /// Keep only the first N layers (full width): the tests' models.
    #[arg(long)]
    layers: Option<usize>,
    /// The seed of the weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write here instead of the model cache (an existing file is replaced).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Parse the command line and make the model of one of `shapes` it names.
pub fn main_with(shapes: &[Shape]) -> ExitCode {
    let cli = Cli::parse();
    match run(&cli, shapes) {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli, shapes: &[Shape]) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let mut recipe = Recipe::named_in(shapes, &cli.shape, &cli.ftype)?;
    if let Some(n) = cli.layers {
        recipe = recipe.with_layers(n)?;
    }
    recipe.seed = cli.seed;
    let bar = ProgressBar::new(0).with_style(ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )?);
    bar.set_message(format!("writing {}", recipe.file_name()));
    let mut progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let path = match &cli.out {
        Some(out) => {
            let vocab = large::vocab_file(&recipe.shape)?;
            large::make(&recipe, &vocab, out, &mut progress)?;
            out.clone()
        }
        None => large::ensure_made(&recipe, &mut progress)?,
    };
    bar.finish_and_clear();
    Ok(path)
}
