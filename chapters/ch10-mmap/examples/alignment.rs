//! What a misaligned tensor would cost: one weight matrix of the default model multiplied
//! from its aligned bytes, from the same bytes one byte off (every dot product then copies
//! its row into an aligned buffer first), and the price of copying the tensor once at load,
//! which is what the view loader does instead.
//!
//! cargo run --release -p ch10 --example alignment [-- OUT.md]
//!
//! Prints a markdown table (and writes it to OUT.md if given). Times are medians.

use ch03::Matrix;
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::{AlignedBuf, MapOptions, ViewLoader, map_gguf};
use std::time::Instant;

const TENSOR: &str = "blk.0.ffn_up.weight";
const REPS: usize = 41;

/// Median time of `f` in microseconds.
fn median_us(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..REPS)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[REPS / 2]
}

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args().nth(1);
    let path = shared::default_model_path()?;
    let (file, bytes) = map_gguf(&path, &MapOptions::default())?;
    let info = file
        .gguf
        .tensor(TENSOR)
        .ok_or("the default model has no blk.0.ffn_up.weight")?
        .clone();
    let mut fast = FastLoader::new(new_pool(PoolKind::Spin, 1));
    fast.pack = false;
    let loader = ViewLoader::new(bytes, fast.clone());
    let view = loader.view(&file.gguf, &info)?;

    // The same bytes at an odd address, which no block struct accepts.
    struct Odd(Vec<u8>, usize, usize);
    impl AsRef<[u8]> for Odd {
        fn as_ref(&self) -> &[u8] {
            &self.0[self.1..self.1 + self.2]
        }
    }
    let n_bytes = view.as_ref().len();
    let mut buf = vec![0u8; n_bytes + 8];
    let at = (1..8)
        .find(|i| (buf.as_ptr() as usize + i) % 2 == 1)
        .expect("an odd address among 7");
    buf[at..at + n_bytes].copy_from_slice(view.as_ref());
    let aligned = fast.matrix(&info, view.clone())?;
    let misaligned = fast.matrix(&info, Odd(buf, at, n_bytes))?;
    let (rows, cols) = (aligned.rows(), aligned.cols());

    let mut lines = vec![
        format!(
            "`{TENSOR}` ({} × {}, {}, {:.2} MB) as chapter 8's matrix ({}) on {}; medians of \
             {REPS} runs, produced by `cargo run --release -p ch10 --example alignment` (run by \
             `scripts/bench-load`):",
            rows,
            cols,
            info.ggml_type.name(),
            n_bytes as f64 / 1e6,
            aligned.describe(),
            cpu_name()
        ),
        String::new(),
        "| tokens | aligned view (µs) | misaligned bytes (µs) | slowdown | one copy at load (µs) |"
            .to_string(),
        "|---|---|---|---|---|".to_string(),
    ];
    let copy = median_us(|| {
        std::hint::black_box(AlignedBuf::copy_of(view.as_ref()));
    });
    for n in [1usize, 16] {
        // (n, cols): activations in [-1, 1), any values do
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 7919) % 113) as f32 / 56.0 - 1.0)
            .collect();
        let mut ya = vec![0.0; n * rows]; // (n, rows)
        let mut yb = vec![0.0; n * rows]; // (n, rows)
        aligned.matmul(&x, &mut ya);
        misaligned.matmul(&x, &mut yb);
        assert!(
            ya.iter().zip(&yb).all(|(a, b)| a.to_bits() == b.to_bits()),
            "misaligned bytes gave other results"
        );
        let ta = median_us(|| aligned.matmul(&x, &mut ya));
        let tb = median_us(|| misaligned.matmul(&x, &mut yb));
        lines.push(format!(
            "| {n} | {ta:.0} | {tb:.0} | {:.2}× | {copy:.0} |",
            tb / ta
        ));
    }
    let table = lines.join("\n") + "\n";
    print!("{table}");
    if let Some(out) = out {
        std::fs::write(out, &table)?;
    }
    Ok(())
}
