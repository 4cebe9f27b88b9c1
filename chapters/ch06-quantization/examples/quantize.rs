//! Quantize a GGUF model as `llama-quantize` does (without an importance matrix).
//!
//! cargo run --release -p ch06 --example quantize -- IN.gguf OUT.gguf Q4_K_M
//! cargo run --release -p ch06 --example quantize -- IN.gguf OUT.gguf Q8_0 --types types.txt
//! cargo run --release -p ch06 --example quantize -- IN.gguf OUT.gguf Q4_K_M --dry-run > types.txt
//!
//! Each weight tensor gets the type llama.cpp's recipe for TYPE gives it (or the one a
//! `--types` list gives: `name TYPE` per line) and is requantized from its f32 values. TYPE F32
//! writes the model dequantized.

use ch01::GgufFile;
use ch06::recipe::{LlamaFtype, Plan, TypeList, quantize_gguf};
use clap::Parser;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Quantize a GGUF model with llama.cpp's recipes")]
struct Args {
    /// Input GGUF file.
    input: PathBuf,
    /// Output GGUF file (written through OUTPUT.tmp, renamed when complete).
    output: PathBuf,
    /// File type: F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q5_1, Q5_0, Q4_K_M, Q4_K_S,
    /// Q4_1, Q4_0, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K.
    ftype: String,
    /// Take the type of the tensors it names from this list (`name TYPE` per line).
    #[arg(long)]
    types: Option<PathBuf>,
    /// Print each tensor's type, as a list `--types` reads, and write nothing.
    #[arg(long)]
    dry_run: bool,
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let ftype = LlamaFtype::from_name(&args.ftype)?;
    let t0 = Instant::now();
    let input = GgufFile::open(&args.input)?;
    let mut plan = Plan::new(&input.gguf, ftype)?;
    if let Some(path) = &args.types {
        plan = plan.with_list(&input.gguf, &TypeList::read(path)?)?;
    }
    if args.dry_run {
        print!("{}", plan.to_list());
        return Ok(());
    }
    let report = quantize_gguf(&input, &plan, &args.output)?;
    let counts: Vec<String> = plan
        .type_counts()
        .iter()
        .map(|(t, n)| format!("{n} {t}"))
        .collect();
    eprintln!(
        "wrote {} ({ftype}): {} tensors ({}), {:.2} MiB, weight matrices at {:.3} bits per \
         weight, in {:.1} s",
        args.output.display(),
        plan.tensors.len(),
        counts.join(", "),
        report.file_size as f64 / (1 << 20) as f64,
        report.bits_per_weight(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
