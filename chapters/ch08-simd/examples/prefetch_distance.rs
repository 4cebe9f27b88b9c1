//! How far ahead the packed kernels should ask for weight lines, measured on one decoded
//! token's products with every matrix of a model file.
//!
//! A decoded token multiplies one activation row by every weight matrix once: a stream of the
//! whole file's bytes, far larger than the caches at 8B. This example packs each matrix of a
//! file as the engine does (the token-embedding table is left out where the file has its own
//! output matrix: decoding reads one row of it), then times that stream with each prefetch
//! distance in turn — round after round, every distance once per round, so that all of them
//! meet the same machine — and prints, as a table, each distance's median rate and its median
//! ratio to the first distance's rate in the same round. The products themselves do not depend
//! on the distance: every distance's outputs are checked against the first's before anything
//! is timed.
//!
//! cargo run --release -p ch08 --example prefetch_distance -- --model FILE [--threads 2]
//!     [--rounds 8] [--distances 2048,0,1024,4096,8192]

use ch01::GgufFile;
use ch03::matrix::Matrix;
use ch08::FastLoader;
use ch08::fast_matrix::{FastMatrix, Store};
use ch08::gemm::PREFETCH;
use ch08::pool::{PoolKind, new_pool};
use clap::Parser;
use std::time::Instant;

#[derive(Parser)]
struct Cli {
    /// GGUF model file (default: the default model).
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Threads (default: the physical cores).
    #[arg(long, short = 't', default_value_t = ch04::cli::default_threads())]
    threads: usize,
    /// Rounds; each times one token's products once per distance.
    #[arg(long, default_value_t = 8)]
    rounds: usize,
    /// Prefetch distances in bytes (0: none); ratios are to the first.
    #[arg(long, value_delimiter = ',', default_values_t = [PREFETCH, 0, 1024, 4096, 8192])]
    distances: Vec<usize>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    if cli.rounds == 0 || cli.distances.is_empty() {
        return Err("--rounds and --distances need at least one each".into());
    }
    let path = match cli.model {
        Some(p) => p,
        None => shared::default_model_path()?,
    };
    let file = GgufFile::open(&path)?;
    let loader = FastLoader::new(new_pool(PoolKind::Spin, cli.threads));
    let tensors = &file.gguf.tensors;
    let has_output = tensors.iter().any(|t| t.name == "output.weight");
    let mut matrices: Vec<FastMatrix> = Vec::new();
    for info in tensors {
        if info.dims.len() != 2 || (has_output && info.name == "token_embd.weight") {
            continue;
        }
        let m = loader.matrix(info, file.bytes_of(info)?.to_vec())?;
        if matches!(m.store, Store::Packed(_)) {
            matrices.push(m);
        }
    }
    let bytes: usize = matrices
        .iter()
        .map(|m| match &m.store {
            Store::Packed(p) => p.bytes(),
            Store::Rows(_) => 0,
        })
        .sum();
    let widest = matrices
        .iter()
        .map(|m| m.cols.max(m.rows))
        .max()
        .unwrap_or(0);
    // x: one activation row (cols,); out: one output row (rows,)
    let x: Vec<f32> = (0..widest).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut out = vec![0f32; widest];
    // One token's products with every matrix, prefetching `d` bytes ahead; `keep` collects
    // every output (only for the check: the timed rounds keep nothing).
    let mut token = |matrices: &mut [FastMatrix], d: usize, mut keep: Option<&mut Vec<f32>>| {
        for m in matrices.iter_mut() {
            if let Store::Packed(p) = &mut m.store {
                p.prefetch = d;
            }
            m.matmul(&x[..m.cols], &mut out[..m.rows]);
            if let Some(k) = keep.as_mut() {
                k.extend_from_slice(&out[..m.rows]);
            }
        }
    };

    let mut want = Vec::new();
    token(&mut matrices, cli.distances[0], Some(&mut want));
    for &d in &cli.distances[1..] {
        let mut got = Vec::with_capacity(want.len());
        token(&mut matrices, d, Some(&mut got));
        if got != want {
            return Err(format!("distance {d}: products differ from the first distance's").into());
        }
    }
    eprintln!(
        "{}: {} packed matrices, {:.0} MB a token, {} thread(s), {} rounds",
        path.file_name().unwrap_or_default().to_string_lossy(),
        matrices.len(),
        bytes as f64 / 1e6,
        cli.threads,
        cli.rounds
    );
    // rates: (distances, rounds) in GB/s
    let mut rates = vec![Vec::with_capacity(cli.rounds); cli.distances.len()];
    for _ in 0..cli.rounds {
        for (i, &d) in cli.distances.iter().enumerate() {
            let t0 = Instant::now();
            token(&mut matrices, d, None);
            rates[i].push(bytes as f64 / t0.elapsed().as_secs_f64() / 1e9);
        }
    }
    println!("| threads | prefetch distance (bytes) | GB/s | ÷ first, same round |");
    println!("|---|---|---|---|");
    for (i, d) in cli.distances.iter().enumerate() {
        let ratios: Vec<f64> = rates[i].iter().zip(&rates[0]).map(|(a, b)| a / b).collect();
        println!(
            "| {} | {d} | {:.1} | {:.2}× |",
            cli.threads,
            median(&rates[i]),
            median(&ratios)
        );
    }
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
