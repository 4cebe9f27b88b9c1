//! Generation with guesses: each pass over the weights checks the guessed tokens, and every
//! token is still sampled from the target model's own logits.
//!
//! Why the output does not change: a pass over the last token `t` and guesses `g1..gk` gives
//! k + 1 rows of logits; row 0 is what plain decoding computes for the token after `t`. The
//! [`Generator`] samples from it exactly as it would without guesses. If that token is `g1`,
//! row 1 was computed from the right sequence and is row 0 of the next plain step, so the
//! generator samples from it too; the first token that differs from its guess ends the pass,
//! and the rows after it, computed from a wrong guess, are thrown away. Every token is drawn
//! from the distribution plain decoding draws it from, with the same random draws, so greedy
//! output is identical and sampled output is identical for the same seed. For a proposer
//! that guesses deterministically this *is* the standard speculative-sampling rule (accept
//! `g` with probability `p(g)`, else sample from `p` without `g`): sampling `x ~ p` and
//! comparing with `g` accepts with probability `p(g)`, and a rejected `x` is distributed as
//! `p` restricted to tokens other than `g`.

use crate::propose::DraftLength;
use crate::propose::Proposer;
use ch02::Tokenizer;
use ch04::{ForwardError, GenParams, Generation, Generator, NonFinite, StepError, StopReason};
use ch05::{Cached, ContiguousCache};
use std::time::{Duration, Instant};

/// How the guesses fared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Passes over the weights after the prompt's (each checks zero or more guesses).
    pub passes: usize,
    /// Guessed tokens checked, and those the model agreed with.
    pub proposed: usize,
    pub accepted: usize,
    /// Tokens those passes generated (the prompt's pass generates the first, and more when
    /// its guesses hold).
    pub decoded: usize,
}

impl SpecStats {
    /// Accepted guesses per guess checked.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.proposed.max(1) as f64
    }
    /// Tokens per pass over the weights after the prompt: 1 without speculation.
    pub fn tokens_per_pass(&self) -> f64 {
        self.decoded as f64 / self.passes.max(1) as f64
    }
    pub fn add(&mut self, o: &SpecStats) {
        self.passes += o.passes;
        self.proposed += o.proposed;
        self.accepted += o.accepted;
        self.decoded += o.decoded;
    }
}

// ANCHOR: speculate
/// Chapter 4's [`generate`](ch04::generate) with guesses from `proposer`, as many as `length`
/// says, checked in one pass of `session` each. The session's cache may already hold a prefix
/// of `prompt` (its `n_past` positions): only the rest is computed. `prompt` must not be empty.
pub fn speculate(
    session: &mut Cached<'_, ContiguousCache>,
    proposer: &mut dyn Proposer,
    length: &mut DraftLength,
    tok: &Tokenizer,
    prompt: &[u32],
    params: &GenParams,
    on_text: &mut dyn FnMut(&str),
) -> Result<(Generation, SpecStats), ForwardError> {
    let vocab = session.model.config.vocab_size;
    let n_ctx = session.kv.capacity();
    let mut generator = Generator::new(tok, params);
    let mut tokens = Vec::with_capacity(prompt.len() + params.max_tokens.min(1 << 16));
    tokens.extend_from_slice(prompt);
    // At least the prompt's last token is computed: its row gives the first token.
    session.rewind(session.n_past.min(prompt.len().saturating_sub(1)));
    let reused = session.n_past;
    let mut n_new = prompt.len() - reused;
    let (mut stats, mut guesses) = (SpecStats::default(), Vec::new());
    let (mut prefill, mut decode) = (Duration::ZERO, Duration::ZERO);
    while generator.stop.is_none() {
        let t0 = Instant::now();
        // Guess no further than the token limit and the cache allow, and no more than one
        // batch of the session holds.
        let room =
            (params.max_tokens - generator.ids.len() - 1).min(n_ctx.saturating_sub(tokens.len()));
        let k = length.get().min(room).min(session.chunk - 1);
        guesses.clear();
        if k > 0 {
            proposer.propose(&tokens, k, &mut guesses)?;
            guesses.truncate(k);
        }
        tokens.extend_from_slice(&guesses);
        let rows = guesses.len() + 1;
        let logits = match session.last_logits(&tokens, n_new + guesses.len(), rows) {
            Ok(logits) => logits,
            Err(e) if e.context_full() && !generator.ids.is_empty() => {
                on_text(&generator.end(StopReason::ContextFull));
                break;
            }
            Err(e) => return Err(e),
        };
        tokens.truncate(tokens.len() - guesses.len());
        let (first, before) = (generator.ids.is_empty(), generator.ids.len());
        let accepted = accept(
            &mut generator,
            logits,
            vocab,
            &guesses,
            &mut tokens,
            on_text,
        )?;
        // The cache holds every token but the last one sampled, which the next pass feeds.
        session.rewind(tokens.len() - 1);
        n_new = 1;
        length.update(guesses.len(), accepted);
        // ANCHOR_END: speculate
        if first {
            prefill = t0.elapsed();
        } else {
            decode += t0.elapsed();
            stats.passes += 1;
            stats.decoded += generator.ids.len() - before;
        }
        stats.proposed += guesses.len();
        stats.accepted += accepted;
    }
    let generation = Generation {
        prompt_ids: prompt.to_vec(),
        text: generator.text().to_string(),
        stop: generator.stop.unwrap_or(StopReason::MaxTokens),
        reused,
        prefill,
        decode,
        // Tokens the passes after the prompt's generated, so that `decode_tok_s` is their
        // tokens per second.
        decode_calls: stats.decoded,
        ids: generator.ids,
    };
    Ok((generation, stats))
}

// ANCHOR: accept
/// Sample from the rows of `logits` `(rows, vocab)` in order, as plain decoding would: row 0
/// gives the token after `tokens`, and row `i + 1` is used only if the token row `i` gave is
/// `guesses[i]`. Each token sampled is pushed onto `tokens` and its text goes to `on_text`;
/// the first token that is not the guess in its place, or that ends generation, is the last.
/// Returns how many guesses held.
pub fn accept(
    generator: &mut Generator<'_>,
    logits: &[f32],
    vocab: usize,
    guesses: &[u32],
    tokens: &mut Vec<u32>,
    on_text: &mut dyn FnMut(&str),
) -> Result<usize, NonFinite> {
    // ANCHOR: yours_accept
    let mut accepted = 0;
    for (i, row) in logits.chunks_exact(vocab).enumerate() {
        NonFinite::check(row, generator.ids.len(), tokens)?;
        let (next, text) = generator.sample(row, tokens);
        on_text(&text);
        tokens.push(next);
        let held = guesses.get(i) == Some(&next);
        accepted += usize::from(held);
        if generator.stop.is_some() || !held {
            break;
        }
    }
    Ok(accepted)
    // ANCHOR_END: yours_accept
}
// ANCHOR_END: accept

#[cfg(test)]
mod tests {
    use super::*;
    use ch01::GgufFile;
    use ch04::SamplerParams;
    use std::sync::OnceLock;

    /// The default model's tokenizer: the rows below are made by hand, only the text is real.
    fn tokenizer() -> &'static Tokenizer {
        static TOK: OnceLock<Tokenizer> = OnceLock::new();
        TOK.get_or_init(|| {
            let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
            let file = GgufFile::open(path).unwrap_or_else(|e| panic!("{e}"));
            Tokenizer::from_gguf(&file.gguf).unwrap_or_else(|e| panic!("{e}"))
        })
    }

    /// Ordinary tokens (none ends generation), and the prompt they follow.
    const A: u32 = 300;
    const B: u32 = 301;
    const C: u32 = 302;
    const D: u32 = 303;
    const PROMPT: [u32; 3] = [400, 401, 402];

    /// What [`accept`] did: the guesses that held, the tokens it appended, the text it streamed,
    /// and whether generation ended.
    #[derive(Debug, PartialEq)]
    struct Checked {
        held: usize,
        added: Vec<u32>,
        text: String,
        stop: Option<StopReason>,
    }

    /// [`accept`] on greedy rows whose argmaxes are `best`, one row each, with `guesses`, at
    /// most `max_tokens` generated.
    fn check(best: &[u32], guesses: &[u32], max_tokens: usize) -> Checked {
        let tok = tokenizer();
        let vocab = tok.vocab_size();
        let mut logits = vec![0.0; best.len() * vocab];
        for (row, &t) in logits.chunks_exact_mut(vocab).zip(best) {
            row[t as usize] = 1.0;
        }
        let params = GenParams {
            max_tokens,
            sampler: SamplerParams::greedy(),
            stop: Vec::new(),
            rule: None,
        };
        let mut generator = Generator::new(tok, &params);
        let (mut tokens, mut text) = (PROMPT.to_vec(), String::new());
        let held = accept(
            &mut generator,
            &logits,
            vocab,
            guesses,
            &mut tokens,
            &mut |t| text.push_str(t),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let added = tokens[PROMPT.len()..].to_vec();
        assert_eq!(
            generator.ids, added,
            "the generator's ids are the tokens appended"
        );
        Checked {
            held,
            added,
            text,
            stop: generator.stop,
        }
    }

    #[test]
    fn the_longest_prefix_of_guesses_the_model_agrees_with_is_kept() {
        // Two guesses hold; the third row gives the model's own token and ends the pass. The
        // row after it was computed after a wrong guess: not used.
        let c = check(&[A, B, D, A], &[A, B, C], 64);
        assert_eq!((c.held, c.added, c.stop), (2, vec![A, B, D], None));
        // Every guess holds: the row after the last one gives one token more.
        let c = check(&[A, B, C], &[A, B], 64);
        assert_eq!((c.held, c.added), (2, vec![A, B, C]));
        // No guesses: one row, one token, as in plain decoding.
        let c = check(&[A], &[], 64);
        assert_eq!((c.held, c.added), (0, vec![A]));
        // The first guess is wrong: one token, though the next row agrees with its guess.
        let c = check(&[D, B, C], &[A, B], 64);
        assert_eq!((c.held, c.added), (0, vec![D]));
    }

    #[test]
    fn a_pass_ends_where_generation_ends() {
        // The token limit is reached at the second guess, which holds: nothing after it, and
        // all the text is streamed.
        let c = check(&[A, B, C, D], &[A, B, C], 2);
        assert_eq!((c.held, &c.added[..]), (2, &[A, B][..]));
        assert_eq!(c.stop, Some(StopReason::MaxTokens));
        assert_eq!(c.text, tokenizer().decode(&[A, B]));
        // A guessed end of generation that holds ends it.
        let tok = tokenizer();
        let eog = (0..tok.vocab_size() as u32)
            .find(|&t| tok.is_eog(t))
            .expect("an eog token");
        let c = check(&[eog, A, B], &[eog, A], 64);
        assert_eq!((c.held, c.added), (1, vec![eog]));
        assert_eq!(c.stop, Some(StopReason::EndOfGeneration));
    }
}
