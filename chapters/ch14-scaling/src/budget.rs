//! The memory budget: what a run will hold resident, computed from the file's header before
//! anything is allocated, and a clear refusal when it cannot fit.
//!
//! At 135M parameters nobody asks whether a model fits. At 8B the question decides whether
//! the engine runs at all: 4.7 GB of weights, a KV cache of 0.5–2 GB, on machines sold with
//! 6–8 GB. Every term is known from the header and the settings:
//!
//! | term | what | resident when |
//! |---|---|---|
//! | repacked weights | chapter 8's interleaved copies of the matrices it packs | always (a private copy) |
//! | mapped weights read every token | matrices the micro-kernel does not take, used from the map | as page cache, counted in the process's RSS |
//! | mapped rows | the token embeddings, read one row per token | only the rows touched |
//! | read copy | the whole file, with `--no-mmap` | always |
//! | small tensors | norms and biases, decoded to f32 | always |
//! | KV cache | layers × positions × (a K row + a V row of the cache types: 4 bytes a value in f32, 2 in f16, 34/32 in q8_0) | as positions fill |
//! | runtime | activations of a 256-token batch, logits, tokenizer | always |
//!
//! Since chapter 10 releases the mapped pages of every matrix it repacks, the weights are
//! resident once, whichever form they take.

use ch01::{Config, GgmlType, Gguf};
use ch05::CacheTypes;
use ch08::gemm::PackedMatrix;
use ch10::engine::MAX_BATCH_TOKENS;
use std::fmt;

// ANCHOR: budget
/// What a run of a model will hold in memory, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The tensors' bytes in the file.
    pub file_weights: u64,
    /// Private copies of the matrices chapter 8 repacks (their mapped pages are released).
    pub repacked: u64,
    /// Matrices used as the file's rows, every one read for every token: with a map, page
    /// cache counted in the process's resident set.
    pub mapped_read: u64,
    /// The token embeddings, read a row at a time from the map: only touched rows resident.
    pub mapped_rows: u64,
    /// The whole file read into memory (`--no-mmap`), else 0.
    pub read_copy: u64,
    /// Norms and biases, decoded to f32.
    pub small: u64,
    /// The KV cache for `n_ctx` positions, in `cache`'s types.
    pub kv_cache: u64,
    /// What the KV cache keeps keys and values in.
    pub cache: CacheTypes,
    /// Activations of one batch, logits, the tokenizer: an estimate (see [`runtime_bytes`]).
    pub runtime: u64,
    /// While loading, the file's pages of the matrix being repacked, released once it is:
    /// the largest such matrix.
    pub load_transient: u64,
    /// The positions the KV cache holds.
    pub n_ctx: usize,
}
// ANCHOR_END: budget

/// How the weights will be held: mapped or read, repacked or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// The file is memory-mapped (else read into memory, `--no-mmap`).
    pub mapped: bool,
    /// Chapter 8 repacks what its micro-kernel takes (not `--no-repack`, and the CPU has it).
    pub repack: bool,
}

/// Activations of a batch of [`MAX_BATCH_TOKENS`] tokens (the residual stream, the norms'
/// outputs, Q/K/V, the attention output, the FFN's gate, up and their product, each f32),
/// the logits of one position, and 64 MiB for the tokenizer's tables and everything else a
/// process holds. An estimate: chapter 14's tests check the whole budget against a measured
/// resident set.
pub fn runtime_bytes(c: &Config) -> u64 {
    let [d, kv, ff, vocab] = [c.d_model, c.kv_dim(), c.n_ff, c.vocab_size].map(|x| x as u64);
    let per_token = (5 * d).saturating_add(2 * kv).saturating_add(3 * ff);
    let activations = per_token.saturating_mul(MAX_BATCH_TOKENS as u64 * 4);
    activations
        .saturating_add(vocab.saturating_mul(4))
        .saturating_add(64 << 20)
}

/// The product of `factors`, or `u64::MAX` if it overflows: a size no machine has, which the
/// budget then refuses (a context or a width from a flag or a file may be anything).
fn product(factors: &[u64]) -> u64 {
    factors.iter().fold(1u64, |acc, &f| acc.saturating_mul(f))
}

impl Budget {
    // ANCHOR: plan
    /// The budget of running the model `gguf` (configuration `c`) with a KV cache of `n_ctx`
    /// positions in `cache`'s types, its weights held as `holding` says.
    pub fn plan(
        gguf: &Gguf,
        c: &Config,
        n_ctx: usize,
        cache: CacheTypes,
        holding: Holding,
    ) -> Budget {
        // A width that is not whole blocks of the types is refused when the cache is made;
        // counted as f32 until then.
        let position = cache
            .position_bytes(c.kv_dim())
            .unwrap_or(c.kv_dim().saturating_mul(8)) as u64;
        let mut b = Budget {
            file_weights: 0,
            repacked: 0,
            mapped_read: 0,
            mapped_rows: 0,
            read_copy: 0,
            small: 0,
            kv_cache: product(&[c.n_layer as u64, n_ctx as u64, position]),
            cache,
            runtime: runtime_bytes(c),
            load_transient: 0,
            n_ctx,
        };
        // ANCHOR: yours_plan_tensors
        let has_output = gguf.tensor("output.weight").is_some();
        for t in &gguf.tensors {
            b.file_weights = b.file_weights.saturating_add(t.n_bytes());
            let (cols, rows) = (
                t.dims[0] as usize,
                (t.n_elements() / t.dims[0].max(1)) as usize,
            );
            if t.dims.len() < 2 || rows == 1 {
                b.small = b.small.saturating_add(t.n_elements().saturating_mul(4));
                continue;
            }
            let is_embd = t.name == "token_embd.weight";
            if is_embd {
                b.mapped_rows += t.n_bytes();
                if has_output {
                    continue; // read by row only
                }
                // Tied embeddings: also the output projection, a matrix.
            }
            match PackedMatrix::packed_bytes(t.ggml_type, rows, cols).filter(|_| holding.repack) {
                Some(p) => {
                    b.repacked += p as u64;
                    b.load_transient = b.load_transient.max(t.n_bytes());
                }
                None if !is_embd => b.mapped_read += t.n_bytes(),
                None => {} // the tied output reads the embeddings' mapped rows
            }
        }
        // ANCHOR_END: yours_plan_tensors
        if !holding.mapped {
            b.read_copy = gguf.data_offset + b.file_weights;
            b.mapped_read = 0;
            b.load_transient = 0; // the read copy holds every page already
        }
        b
    }
    // ANCHOR_END: plan

    /// Bytes resident once the context is full: everything but the embeddings' untouched rows.
    pub fn resident(&self) -> u64 {
        self.at_most(self.kv_cache)
    }

    /// The weights' resident bytes, in whichever form they are held.
    pub fn weights(&self) -> u64 {
        self.repacked
            .saturating_add(self.mapped_read)
            .saturating_add(self.read_copy)
    }

    /// The most resident at any time: with a full context, or while loading (the KV cache is
    /// not yet touched then, but one matrix's file pages are resident beside its copy).
    pub fn peak(&self) -> u64 {
        self.at_most(self.kv_cache.max(self.load_transient))
    }

    /// Everything but the KV cache, plus `extra`.
    fn at_most(&self, extra: u64) -> u64 {
        [self.small, self.runtime, extra]
            .into_iter()
            .fold(self.weights(), u64::saturating_add)
    }

    /// `Ok` if [`Budget::peak`] fits in `available` bytes, else what does not fit and
    /// which flags make it smaller.
    pub fn check(&self, available: u64) -> Result<(), DoesNotFit> {
        if self.peak() <= available {
            Ok(())
        } else {
            Err(DoesNotFit {
                budget: self.clone(),
                available,
            })
        }
    }
}

/// A model and context that need more memory than there is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoesNotFit {
    pub budget: Budget,
    pub available: u64,
}

impl fmt::Display for DoesNotFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.budget;
        write!(
            f,
            "the model and its context need {} of memory, and {} is available:\n{b}\n\
             To fit: a smaller --ctx (the KV cache is {} for {} positions in {})",
            gb(b.peak()),
            gb(self.available),
            gb(b.kv_cache),
            b.n_ctx,
            b.cache
        )?;
        if [b.cache.k, b.cache.v]
            .iter()
            .any(|t| t.ty == GgmlType::F32 || t.ty == GgmlType::F16)
        {
            write!(
                f,
                ",\na smaller KV cache type (--cache-type-k q8_0 --cache-type-v q8_0)"
            )?;
        }
        if b.read_copy > 0 && b.repacked > 0 {
            write!(
                f,
                ",\nno --no-mmap (mapped, the repacked matrices' pages are released)"
            )?;
        }
        write!(f, ",\nor a file type with fewer bits per weight")
    }
}

impl std::error::Error for DoesNotFit {}

/// Bytes as GB with two decimals (10^9, as file sizes are quoted).
pub fn gb(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kv = format!("KV cache ({})", self.cache);
        let rows = [
            ("weights repacked (private copy)", self.repacked),
            ("weights mapped, read every token", self.mapped_read),
            ("weights read into memory (--no-mmap)", self.read_copy),
            ("norms and biases (f32)", self.small),
            (kv.as_str(), self.kv_cache),
            ("activations, logits, tokenizer (est.)", self.runtime),
        ];
        for (what, bytes) in rows.iter().filter(|r| r.1 > 0) {
            writeln!(f, "  {what:<40} {:>9}", gb(*bytes))?;
        }
        if self.mapped_rows > 0 {
            writeln!(
                f,
                "  {:<40} {:>9}   (rows, as used)",
                "token embeddings, mapped",
                gb(self.mapped_rows)
            )?;
        }
        writeln!(
            f,
            "  {:<40} {:>9}",
            format!("resident at {} positions", self.n_ctx),
            gb(self.resident())
        )?;
        if self.load_transient > self.kv_cache {
            writeln!(
                f,
                "  {:<40} {:>9}   (+ a matrix's file pages)",
                "peak, while loading",
                gb(self.peak())
            )?;
        }
        Ok(())
    }
}

/// Bytes this process may still use: the kernel's `MemAvailable` (free memory and page cache
/// it can reclaim), and within a control group with a limit (a container), that limit less
/// what the group uses, whichever is smaller. `None` where neither can be read.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let available = meminfo.as_deref().and_then(|s| {
        let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
        line.split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()?
            .checked_mul(1024)
    });
    let read = |p: &str| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok();
    let cgroup = match (
        read("/sys/fs/cgroup/memory.max"),
        read("/sys/fs/cgroup/memory.current"),
    ) {
        (Some(max), Some(cur)) => Some(max.saturating_sub(cur)),
        _ => None,
    };
    match (available, cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::large::{Recipe, layout, vocab_file};

    fn budget() -> Budget {
        Budget {
            file_weights: 4_000_000_000,
            repacked: 3_700_000_000,
            mapped_read: 0,
            mapped_rows: 300_000_000,
            read_copy: 0,
            small: 1_000_000,
            kv_cache: 1_073_741_824,
            cache: CacheTypes::F32,
            runtime: 200_000_000,
            load_transient: 400_000_000,
            n_ctx: 4096,
        }
    }

    #[test]
    fn resident_counts_every_term_but_the_embeddings() {
        assert_eq!(
            budget().resident(),
            3_700_000_000 + 1_000_000 + 1_073_741_824 + 200_000_000
        );
    }

    #[test]
    fn a_budget_that_does_not_fit_names_the_sizes_and_the_flag() {
        let b = budget();
        assert_eq!(b.peak(), b.resident()); // the KV cache outweighs the load's transient
        assert!(b.check(b.resident()).is_ok());
        let small_ctx = Budget {
            kv_cache: 100_000_000,
            n_ctx: 384,
            ..budget()
        };
        assert_eq!(small_ctx.peak(), small_ctx.resident() + 300_000_000);
        let e = b.check(4_000_000_000).unwrap_err().to_string();
        assert!(e.contains("4.97 GB") && e.contains("4.00 GB"), "{e}");
        assert!(
            e.contains("--ctx") && e.contains("1.07 GB for 4096 positions"),
            "{e}"
        );
        assert!(e.contains("KV cache (f32)"), "{e}");
    }

    /// The header of the Llama-3-8B recipe cut to one layer, in file type `ftype`, without its
    /// output projection when `tied` (the embeddings are the output then).
    fn header(ftype: &str, tied: bool) -> (Gguf, Config) {
        let recipe = Recipe::named("llama3-8b", ftype)
            .and_then(|r| r.with_layers(1))
            .unwrap();
        let (w, _) = layout(&recipe, &vocab_file(&recipe.shape).unwrap()).unwrap();
        let mut tensors = w.tensors().to_vec();
        tensors.retain(|t| !(tied && t.name == "output.weight"));
        let gguf = Gguf::new(3, w.metadata().to_vec(), tensors, 32, 4096);
        let config = Config::from_gguf(&gguf, &["llama"]).unwrap();
        (gguf, config)
    }

    /// The weights' terms of the budget worked out by the tensors' names: norms are small,
    /// the token embeddings are rows (and the output matrix too when tied), every other tensor
    /// a matrix, repacked when chapter 8 takes its type. `(repacked, mapped_read, mapped_rows,
    /// small, load_transient)`.
    fn by_name(gguf: &Gguf, repack: bool) -> [u64; 5] {
        let tied = gguf.tensor("output.weight").is_none();
        let mut want = [0u64; 5];
        for t in &gguf.tensors {
            let (cols, rows) = (t.dims[0] as usize, t.dims[1..].iter().product::<u64>());
            if t.name.ends_with("_norm.weight") {
                want[3] += t.n_elements() * 4;
                continue;
            }
            let embd = t.name == "token_embd.weight";
            if embd {
                want[2] += t.n_bytes();
            }
            if embd && !tied {
                continue;
            }
            match PackedMatrix::packed_bytes(t.ggml_type, rows as usize, cols) {
                Some(p) if repack => {
                    want[0] += p as u64;
                    want[4] = want[4].max(t.n_bytes());
                }
                _ if !embd => want[1] += t.n_bytes(),
                _ => {}
            }
        }
        want
    }

    #[test]
    fn every_tensor_is_counted_once_in_the_form_it_is_held() {
        for (ftype, tied, repack) in [
            ("Q4_K_M", false, true),
            ("Q4_K_M", true, true),
            ("Q4_0", false, false),
            ("Q4_0", true, false),
            ("F16", false, true), // chapter 8 does not repack f16: read from the map
        ] {
            let (gguf, c) = header(ftype, tied);
            let holding = Holding {
                mapped: true,
                repack,
            };
            let b = Budget::plan(&gguf, &c, 64, CacheTypes::F16, holding);
            let got = [
                b.repacked,
                b.mapped_read,
                b.mapped_rows,
                b.small,
                b.load_transient,
            ];
            let case = format!("{ftype}, tied {tied}, repacked {repack}");
            assert_eq!(
                got,
                by_name(&gguf, repack),
                "{case}: (repacked, mapped_read, mapped_rows, small, load_transient)"
            );
            let file: u64 = gguf.tensors.iter().map(|t| t.n_bytes()).sum();
            assert_eq!(b.file_weights, file, "{case}");
        }
    }

    #[test]
    fn read_into_memory_the_file_is_the_weights() {
        let (gguf, c) = header("Q4_0", false);
        let holding = Holding {
            mapped: false,
            repack: true,
        };
        let b = Budget::plan(&gguf, &c, 64, CacheTypes::F16, holding);
        assert_eq!(b.read_copy, 4096 + b.file_weights);
        assert_eq!((b.mapped_read, b.load_transient), (0, 0));
        assert_eq!(b.weights(), b.repacked + b.read_copy);
    }
}
