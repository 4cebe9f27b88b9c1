//! Where the load time goes, with the file in the page cache: opening (mapping or reading) and
//! parsing the header, building the tokenizer and the chat template, and making the matrices,
//! for each way of loading. Medians of several loads.
//!
//! cargo run --release -p ch10 --example load_phases [-- PATH] [--markdown]

use ch01::GgufFile;
use ch02::{ChatTemplate, Tokenizer};
use ch04::Model;
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::{MapOptions, SharedBytes, ViewLoader, map_gguf, read_gguf};
use std::path::{Path, PathBuf};
use std::time::Instant;

const RUNS: usize = 7;

/// The CPU's model name, from `/proc/cpuinfo` where there is one.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("model name"))?;
            Some(line.split_once(':')?.1.trim().to_string())
        })
        .unwrap_or_else(|| "an unknown CPU".to_string())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The phases of one load, in milliseconds.
fn load(path: &Path, read: bool, repack: bool) -> Result<[f64; 4], Box<dyn std::error::Error>> {
    let mut fast = FastLoader::new(new_pool(PoolKind::Spin, 1));
    fast.pack = repack;
    let t = Instant::now();
    let (open, [tokenizer, template, matrices]) = if read {
        let (file, bytes) = read_gguf(path)?;
        (ms(t), rest(&file, bytes, fast)?)
    } else {
        let (file, bytes) = map_gguf(path, &MapOptions::default())?;
        (ms(t), rest(&file, bytes, fast)?)
    };
    Ok([open, tokenizer, template, matrices])
}

/// Tokenizer, chat template and matrices of an opened file.
fn rest<O: AsRef<[u8]> + ch10::ReleasePages + Send + Sync + 'static>(
    file: &GgufFile<SharedBytes<O>>,
    bytes: SharedBytes<O>,
    fast: FastLoader,
) -> Result<[f64; 3], Box<dyn std::error::Error>> {
    let t = Instant::now();
    Tokenizer::from_gguf(&file.gguf)?;
    let tokenizer = ms(t);
    let t = Instant::now();
    ChatTemplate::from_gguf(&file.gguf)?;
    let template = ms(t);
    let t = Instant::now();
    Model::load(file, &ViewLoader::new(bytes, fast), &ch04::architectures())?;
    Ok([tokenizer, template, ms(t)])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let markdown = args.iter().any(|a| a == "--markdown");
    let path = match args.iter().find(|a| !a.starts_with("--")) {
        Some(p) => PathBuf::from(p),
        None => shared::default_model_path()?,
    };
    let ways = [
        ("read (`--no-mmap`), repacked", true, true),
        ("mmap, repacked (default)", false, true),
        ("mmap, `--no-repack`", false, false),
    ];
    let mut rows = Vec::new();
    for (name, read, repack) in ways {
        load(&path, read, repack)?; // once to warm the page cache and the allocator
        let runs: Vec<[f64; 4]> = (0..RUNS)
            .map(|_| load(&path, read, repack))
            .collect::<Result<_, _>>()?;
        let med = |i: usize| {
            let mut v: Vec<f64> = runs.iter().map(|r| r[i]).collect();
            v.sort_by(f64::total_cmp);
            v[RUNS / 2]
        };
        let total = {
            let mut v: Vec<f64> = runs.iter().map(|r| r.iter().sum()).collect();
            v.sort_by(f64::total_cmp);
            v[RUNS / 2]
        };
        rows.push(format!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {total:.1} |",
            med(0),
            med(1),
            med(2),
            med(3)
        ));
    }
    if markdown {
        println!(
            "The file in the page cache, one thread, on {}; medians of {RUNS} loads, produced \
             by `cargo run --release -p ch10 --example load_phases -- --markdown` (run by \
             `scripts/bench-load`):\n",
            cpu_name()
        );
    }
    println!(
        "| loading | open + parse (ms) | tokenizer (ms) | chat template (ms) | matrices (ms) | \
         total (ms) |\n|---|---|---|---|---|---|"
    );
    for r in rows {
        println!("{r}");
    }
    Ok(())
}
