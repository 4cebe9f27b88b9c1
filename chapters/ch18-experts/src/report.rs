//! What a mixture-of-experts file reads per token: the count that makes these models fast on a
//! CPU, worked out from the file's metadata and tensor sizes alone (nothing is loaded).

use ch01::Gguf;
use std::fmt;

// ANCHOR: active_bytes
/// A file's experts and the bytes a decoded token reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertReport {
    pub n_expert: u64,
    pub n_used: u64,
    /// Bytes of every layer's experts (the `*_exps` tensors).
    pub expert_bytes: u64,
    /// Bytes of every other tensor but the token embeddings, of which a token reads one row
    /// (unless they are also the output matrix, when the file has no `output.weight`).
    pub dense_bytes: u64,
}

impl ExpertReport {
    /// The report of a file of architecture `arch`, or `None` if it names no experts.
    pub fn of(gguf: &Gguf, arch: &str) -> Option<ExpertReport> {
        let n_expert = gguf.get_u32(&format!("{arch}.expert_count")).ok()? as u64;
        let n_used = gguf.get_u32(&format!("{arch}.expert_used_count")).ok()? as u64;
        let tied = gguf.tensor("output.weight").is_none();
        let (mut expert_bytes, mut dense_bytes) = (0, 0);
        for t in &gguf.tensors {
            if t.name.ends_with("_exps.weight") {
                expert_bytes += t.n_bytes();
            } else if t.name != "token_embd.weight" || tied {
                dense_bytes += t.n_bytes();
            }
        }
        Some(ExpertReport {
            n_expert,
            n_used,
            expert_bytes,
            dense_bytes,
        })
    }

    /// Bytes a decoded token reads: the dense weights, and `n_used` of every `n_expert` experts.
    pub fn active_bytes(&self) -> u64 {
        let share = self.expert_bytes as u128 * self.n_used as u128 / self.n_expert.max(1) as u128;
        self.dense_bytes + share as u64
    }
}
// ANCHOR_END: active_bytes

impl fmt::Display for ExpertReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        writeln!(
            f,
            "  experts: {} per layer, {} used per token",
            self.n_expert, self.n_used
        )?;
        writeln!(
            f,
            "  weights: {:.1} MiB in experts, {:.1} MiB outside them (token embeddings aside)",
            mib(self.expert_bytes),
            mib(self.dense_bytes)
        )?;
        writeln!(
            f,
            "  a decoded token reads {:.1} MiB of weights ({:.1}% of them)",
            mib(self.active_bytes()),
            100.0 * self.active_bytes() as f64
                / (self.expert_bytes + self.dense_bytes).max(1) as f64
        )
    }
}
