//! Generate text with chapter 8's engine: SIMD kernels, packed rows, products on threads.
//!
//! cargo run --release -p ch08 --example generate_simd -- --prompt "The capital of France is" -n 64 --temp 0 --threads 2

use ch04::Model;
use ch04::cli;
use ch05::Cached;
use ch08::FastLoader;
use ch08::pool::{PoolKind, new_pool};
use clap::Parser;

/// Chapter 4's command line (the `generate` example's flags), which this one extends.
#[path = "../../ch04-forward/examples/common/generate_flags.rs"]
mod generate_flags;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: generate_flags::Generate,
    /// Thread pool for the matrix products: `spin` (ours) or `rayon`.
    #[arg(long, default_value = "spin")]
    pool: PoolKind,
    /// Keep the file's row layout (no interleaving for the micro-kernel).
    #[arg(long)]
    no_pack: bool,
    /// Run attention, norms and SwiGLU with chapters 3 and 4's scalar reference code instead of
    /// this chapter's vector kernels on the pool (to measure what they buy).
    #[arg(long)]
    scalar_compute: bool,
}

fn main() {
    let cli = Cli::parse();
    let mut args = cli.args.args();
    generate_flags::default_model(&mut args);
    let args = &args;
    let mut loader = FastLoader::new(new_pool(cli.pool, args.threads()));
    loader.pack = !cli.no_pack;
    let result = cli::run(
        args,
        |file| {
            let mut model = Model::load(file, &loader, &ch04::architectures())?;
            if !cli.scalar_compute {
                model = model.with_compute(loader.compute());
            }
            if !args.json {
                eprintln!("{}", loader.describe());
                eprintln!("{}", model.compute.describe());
                eprintln!("matrices: {}", summary(&model));
            }
            Ok(model)
        },
        |model| Box::new(Cached::contiguous(model, args.ctx)),
    );
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// How many matrices of each kind, e.g. `210 × Q4_1 packed ×16 (avx512vnni micro-kernel), …`.
fn summary(model: &Model) -> String {
    let w = &model.weights;
    let mut all = vec![w.token_embd.describe()];
    let layers = model
        .blocks_as::<ch04::llama::Llama>()
        .map_or(&[][..], |b| &b.layers);
    for l in layers {
        for m in [&l.attn.wq, &l.attn.wk, &l.attn.wv, &l.attn.wo] {
            all.push(m.describe());
        }
        for m in [&l.ffn.gate, &l.ffn.up, &l.ffn.down] {
            all.push(m.describe());
        }
    }
    if let Some(o) = &w.output {
        all.push(o.describe());
    }
    let mut counts: Vec<(String, usize)> = Vec::new();
    for d in all {
        match counts.iter_mut().find(|(k, _)| *k == d) {
            Some((_, n)) => *n += 1,
            None => counts.push((d, 1)),
        }
    }
    counts
        .iter()
        .map(|(d, n)| format!("{n} × {d}"))
        .collect::<Vec<_>>()
        .join("; ")
}
