//! A batch: the tokens of one forward pass.

use ch03::TokenPos;

/// The tokens of one forward pass: which sequence each belongs to, at which position, and
/// whether its logits are wanted. This is llama.cpp's `llama_batch`. Until chapter 7 a batch
/// holds one sequence.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub at: Vec<TokenPos>,
    pub logits: Vec<bool>,
}

impl Batch {
    /// `tokens` of sequence `seq` at positions `start..`, with logits for the last token only
    /// (or for every token when `all_logits`).
    pub fn sequence(seq: usize, tokens: &[u32], start: usize, all_logits: bool) -> Batch {
        let n = tokens.len();
        Batch {
            tokens: tokens.to_vec(),
            at: TokenPos::run(seq, start, n),
            logits: (0..n).map(|i| all_logits || i + 1 == n).collect(),
        }
    }

    /// Make this batch `tokens` of `seq` at `start..`, as [`Batch::sequence`] does, reusing
    /// its buffers.
    pub fn set_sequence(&mut self, seq: usize, tokens: &[u32], start: usize, all_logits: bool) {
        self.clear();
        for (i, &t) in tokens.iter().enumerate() {
            self.push(t, seq, start + i, all_logits || i + 1 == tokens.len());
        }
    }

    /// Remove every token (keeps the buffers).
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.at.clear();
        self.logits.clear();
    }

    /// Append one token.
    pub fn push(&mut self, token: u32, seq: usize, pos: usize, logits: bool) {
        self.tokens.push(token);
        self.at.push(TokenPos { seq, pos });
        self.logits.push(logits);
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}
