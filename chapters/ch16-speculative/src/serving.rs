//! Speculation in the server: chapter 11's [`Lookaheads`], giving each request its own
//! proposer, [`Guessed`] in chapter 7's continuous batch next to requests that do not guess.

use crate::batched::{Guessed, Steps};
use crate::propose::{Adaptive, DraftLength, PromptLookup};
use ch07::Lookahead;
use ch11::{Lookaheads, Predicted, api::Sampling};

// ANCHOR: lookup_guessing
/// Prompt lookup for every request of a server (`llm-rs serve --spec ngram`): each request
/// gets its own [`Adaptive`] [`PromptLookup`], guessing at most `draft_max` tokens a step, or
/// its `speculative.n_max` if that is smaller (0: this request does not guess); of those, at
/// least `draft_min` (or its `speculative.n_min`) are checked whatever they cost. A request
/// that predicts its output (chapter 11's [`Predicted`]) feeds that instead.
#[derive(Debug, Clone, Default)]
pub struct LookupGuessing {
    pub draft_max: usize,
    pub draft_min: usize,
    /// What the server's steps cost, shared by its requests' guesses.
    pub steps: Steps,
}

impl LookupGuessing {
    pub fn new(draft_max: usize, draft_min: usize) -> LookupGuessing {
        LookupGuessing {
            draft_max,
            draft_min,
            steps: Steps::default(),
        }
    }

    /// The proposer of a request whose `speculative.n_max` and `speculative.n_min` are
    /// `n_max` and `n_min` (`None` where absent): `None` for no guessing.
    pub fn proposer(
        &self,
        n_max: Option<u64>,
        n_min: Option<u64>,
    ) -> Option<Adaptive<PromptLookup>> {
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let max = n_max.map_or(self.draft_max, count).min(self.draft_max);
        let min = n_min.map_or(self.draft_min, count).min(max);
        (max > 0).then(|| Adaptive {
            inner: PromptLookup::default(),
            length: DraftLength::new(max),
            at_least: min,
        })
    }
}

impl Lookaheads for LookupGuessing {
    fn lookahead(
        &self,
        prompt_len: usize,
        predicted: Vec<u32>,
        sampling: &Sampling,
    ) -> Option<Box<dyn Lookahead + Send>> {
        if !predicted.is_empty() {
            return Predicted.lookahead(prompt_len, predicted, sampling);
        }
        let p = self.proposer(sampling.speculative_n_max(), sampling.speculative_n_min())?;
        Some(Box::new(Guessed::new(p, self.steps.clone())))
    }
}
// ANCHOR_END: lookup_guessing

#[cfg(test)]
mod tests {
    use super::*;
    use crate::propose::Proposer;

    /// How many tokens a request's proposer guesses at its first step over a text that repeats
    /// (prompt lookup could guess on without end), and how many it has checked whatever they
    /// cost; `None` where the request does not guess.
    fn first_guesses(
        g: &LookupGuessing,
        n_max: Option<u64>,
        n_min: Option<u64>,
    ) -> Option<(usize, usize)> {
        let mut p = g.proposer(n_max, n_min)?;
        let mut out = Vec::new();
        p.propose(&[1, 2, 1, 2, 1, 2], usize::MAX, &mut out)
            .unwrap();
        Some((out.len(), p.at_least()))
    }

    #[test]
    fn a_request_guesses_within_the_servers_limits_and_not_at_all_at_zero() {
        let g = LookupGuessing::new(8, 2);
        assert_eq!(first_guesses(&g, None, None), Some((8, 2)));
        assert_eq!(first_guesses(&g, Some(3), None), Some((3, 2)));
        assert_eq!(first_guesses(&g, Some(3), Some(5)), Some((3, 3)));
        assert_eq!(
            first_guesses(&g, Some(u64::MAX), Some(u64::MAX)),
            Some((8, 8))
        );
        assert_eq!(first_guesses(&g, Some(0), None), None);
        let off = LookupGuessing::new(0, 0);
        assert_eq!(first_guesses(&off, Some(4), None), None);
    }
}
