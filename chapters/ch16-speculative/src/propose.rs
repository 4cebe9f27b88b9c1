//! Who guesses the next tokens: prompt lookup, a draft model, and how many to guess.

use ch02::Tokenizer;
use ch04::sampling::argmax;
use ch04::{ForwardError, Model, Session};
use ch05::{Cached, ContiguousCache};

// ANCHOR: proposer
/// Guesses the tokens that follow a sequence, for the model to check all at once: a guess
/// costs the model nothing until it is checked, and a wrong one costs only the row it adds to
/// the batch. A proposer should be cheap and, where it cannot guess well, propose nothing.
/// Checked one sequence at a time by [`speculate`](crate::speculate()), and inside chapter 7's
/// continuous batch as each request's lookahead ([`Guessed`](crate::batched::Guessed)).
pub trait Proposer {
    /// Append to `out` up to `max` tokens guessed to follow `tokens` (the prompt and every
    /// token generated so far).
    fn propose(
        &mut self,
        tokens: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), ForwardError>;

    /// Of the last `proposed` guesses, the model agreed with the first `accepted`: a proposer
    /// that adapts how much it guesses learns it here.
    fn checked(&mut self, _proposed: usize, _accepted: usize) {}

    /// How many of the guesses offered to check whatever they cost (llama.cpp's
    /// `--draft-min`); the batch checks more only where they pay for their rows.
    fn at_least(&self) -> usize {
        0
    }
}
// ANCHOR_END: proposer

// ANCHOR: lookup
/// Prompt lookup (n-gram) decoding: find the last `n` tokens of the sequence earlier in it —
/// the longest `n` from `max_ngram` down to `min_ngram` that occurs, its latest occurrence —
/// and propose the tokens that followed (llama.cpp's `--lookup`, Hugging Face's
/// `prompt_lookup_num_tokens`). Summaries, edits and answers taken from a document
/// copy long runs of their prompt, which this finds without a second model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptLookup {
    pub min_ngram: usize,
    pub max_ngram: usize,
}

impl Default for PromptLookup {
    /// Matches of 2 to 4 tokens: a single token recurs too often to predict what follows it.
    fn default() -> Self {
        PromptLookup {
            min_ngram: 2,
            max_ngram: 4,
        }
    }
}

impl Proposer for PromptLookup {
    fn propose(
        &mut self,
        tokens: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), ForwardError> {
        // ANCHOR: yours_lookup
        let len = tokens.len();
        for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if n >= len {
                continue;
            }
            let tail = &tokens[len - n..];
            // The latest earlier occurrence that has at least one token after it.
            if let Some(start) = (0..len - n).rev().find(|&s| &tokens[s..s + n] == tail) {
                // Copy what followed it, running on into the guesses themselves when the
                // copy reaches the end (as LZ77 copies an overlapping match): a repeating
                // text keeps repeating.
                let (after, first) = (start + n, out.len());
                for i in 0..max {
                    let at = after + i;
                    let t = if at < len {
                        tokens[at]
                    } else {
                        out[first + at - len]
                    };
                    out.push(t);
                }
                return Ok(());
            }
        }
        Ok(())
        // ANCHOR_END: yours_lookup
    }
}
// ANCHOR_END: lookup

// ANCHOR: draft
/// A draft model: a smaller (or more coarsely quantized) model with the target's vocabulary,
/// decoding greedily `max` tokens ahead. Its own KV cache keeps what it computed; after a
/// check it rewinds to the tokens it shares with the sequence and goes on from there.
pub struct DraftModel<'m> {
    session: Cached<'m, ContiguousCache>,
    /// The tokens whose keys and values are in the draft's cache, then its last guesses.
    fed: Vec<u32>,
}

impl<'m> DraftModel<'m> {
    /// A draft of `n_ctx` positions over `model`, whose tokenizer `draft` must be the target's
    /// `target` token for token: a guess is a token id, and an id that means another text in
    /// the target's vocabulary would be a guess about something else.
    pub fn new(
        model: &'m Model,
        draft: &Tokenizer,
        target: &Tokenizer,
        n_ctx: usize,
    ) -> Result<DraftModel<'m>, String> {
        same_vocabulary(draft, target)?;
        Ok(DraftModel {
            session: Cached::contiguous(model, Some(n_ctx)),
            fed: Vec::new(),
        })
    }
}

/// Whether two tokenizers have the same tokens: the same count, each id the same text.
pub fn same_vocabulary(draft: &Tokenizer, target: &Tokenizer) -> Result<(), String> {
    let (n_draft, n_target) = (draft.vocab_size(), target.vocab_size());
    if n_draft != n_target {
        return Err(format!(
            "the draft model has {n_draft} tokens, the target {n_target}: a draft must have \
             the target's vocabulary"
        ));
    }
    match (0..n_draft as u32).find(|&id| draft.token_text(id) != target.token_text(id)) {
        Some(id) => Err(format!(
            "token {id} is {:?} in the draft model and {:?} in the target: a draft must have \
             the target's vocabulary",
            draft.token_text(id).unwrap_or(""),
            target.token_text(id).unwrap_or("")
        )),
        None => Ok(()),
    }
}

// ANCHOR_END: draft

// ANCHOR: draft_propose
impl Proposer for DraftModel<'_> {
    fn propose(
        &mut self,
        tokens: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), ForwardError> {
        let room = self.session.kv.capacity().saturating_sub(tokens.len());
        let max = max.min(room);
        if max == 0 || tokens.is_empty() {
            return Ok(());
        }
        // Keep what the cache shares with `tokens`, at least one token short of its end, so
        // that the first call has a new token to give logits for.
        let shared = self
            .fed
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(self.session.n_past)
            .min(tokens.len() - 1);
        self.session.rewind(shared);
        self.fed.clear();
        self.fed.extend_from_slice(tokens);
        let mut n_new = tokens.len() - shared;
        for _ in 0..max {
            let logits = self.session.next_logits(&self.fed, n_new)?;
            let guess = argmax(logits) as u32;
            out.push(guess);
            self.fed.push(guess);
            n_new = 1;
        }
        Ok(())
    }
}
// ANCHOR_END: draft_propose

// ANCHOR: length
/// How many tokens to guess next, from how the last guesses fared. All held: guess about
/// twice as many (up to `max`). Some held: one more than held. None held: one guess next
/// time, after a pause without guessing that doubles each time it happens in a row (up to
/// [`MAX_PAUSE`] steps), so that text the proposer cannot predict costs little extra.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftLength {
    pub max: usize,
    next: usize,
    /// Steps left without guessing, and how long the last such pause was.
    pause: usize,
    last_pause: usize,
}

/// The longest pause, in steps: a hopeless proposer then costs one guessed row per this many
/// tokens, yet text that starts copying is noticed within this many tokens.
pub const MAX_PAUSE: usize = 32;

// ANCHOR_END: length

// ANCHOR: length_update
impl DraftLength {
    pub fn new(max: usize) -> DraftLength {
        DraftLength {
            max,
            next: max,
            pause: 0,
            last_pause: 0,
        }
    }

    /// Tokens to guess at this step (0: decode one token as usual).
    pub fn get(&mut self) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        self.next
    }

    /// `accepted` of `proposed` guesses held.
    pub fn update(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        if accepted == proposed {
            self.next = (2 * self.next + 1).min(self.max);
            self.last_pause = 0;
        } else if accepted > 0 {
            self.next = accepted + 1;
            self.last_pause = 0;
        } else {
            self.next = 1;
            self.last_pause = (self.last_pause * 2).clamp(1, MAX_PAUSE);
            self.pause = self.last_pause;
        }
    }
}
// ANCHOR_END: length_update

// ANCHOR: adaptive
/// A proposer that guesses as many tokens as its [`DraftLength`] says, and learns how they
/// fared from whoever checks them ([`Proposer::checked`]): how each request of a server
/// guesses, since its guesses are checked in chapter 7's batch there (at least `at_least` of
/// them, whatever they cost).
#[derive(Debug, Clone)]
pub struct Adaptive<P> {
    pub inner: P,
    pub length: DraftLength,
    pub at_least: usize,
}

impl<P: Proposer> Proposer for Adaptive<P> {
    fn propose(
        &mut self,
        tokens: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), ForwardError> {
        let k = self.length.get().min(max);
        if k > 0 {
            self.inner.propose(tokens, k, out)?;
        }
        Ok(())
    }

    fn checked(&mut self, proposed: usize, accepted: usize) {
        self.length.update(proposed, accepted);
    }

    fn at_least(&self) -> usize {
        self.at_least
    }
}
// ANCHOR_END: adaptive

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(tokens: &[u32], max: usize) -> Vec<u32> {
        let mut out = Vec::new();
        PromptLookup::default()
            .propose(tokens, max, &mut out)
            .unwrap();
        out
    }

    #[test]
    fn prompt_lookup_proposes_what_followed_the_latest_longest_match() {
        // "5 6" occurs twice; the latest occurrence is followed by 9 9.
        assert_eq!(lookup(&[1, 5, 6, 7, 8, 5, 6, 9, 9, 3, 5, 6], 3), [9, 9, 3]);
        // A 3-gram match wins over a later 2-gram one.
        assert_eq!(lookup(&[4, 5, 6, 1, 2, 7, 5, 6, 3, 4, 5, 6], 2), [1, 2]);
        // A copy that reaches the end runs on into itself; `max` bounds it.
        assert_eq!(lookup(&[1, 2, 1, 2], 5), [1, 2, 1, 2, 1]);
        assert_eq!(lookup(&[7, 7, 7], 3), [7, 7, 7]);
        assert_eq!(lookup(&[1, 2, 3, 1, 2], 1), [3]);
        // No match of at least two tokens: nothing.
        assert_eq!(lookup(&[1, 2, 3, 4, 1], 4), Vec::<u32>::new());
        assert_eq!(lookup(&[], 4), Vec::<u32>::new());
    }

    #[test]
    fn draft_length_grows_on_success_and_pauses_on_failure() {
        let mut d = DraftLength::new(8);
        assert_eq!(d.get(), 8);
        d.update(8, 3);
        assert_eq!(d.get(), 4);
        d.update(4, 4);
        assert_eq!(d.get(), 8); // 2 × 4 + 1, capped at 8
        // Nothing held: one step without guessing, then one guess.
        d.update(8, 0);
        assert_eq!((d.get(), d.get()), (0, 1));
        // Nothing held again: a pause twice as long.
        d.update(1, 0);
        assert_eq!((d.get(), d.get(), d.get()), (0, 0, 1));
        // A guess that holds ends the pausing and grows the guesses: 1, 3, 7.
        d.update(1, 1);
        assert_eq!(d.get(), 3);
        d.update(3, 3);
        assert_eq!(d.get(), 7);
        // Pauses double up to MAX_PAUSE.
        for _ in 0..10 {
            d.update(1, 0);
        }
        let paused = std::iter::from_fn(|| Some(d.get()))
            .take_while(|&k| k == 0)
            .count();
        assert_eq!(paused, MAX_PAUSE);
    }
}
