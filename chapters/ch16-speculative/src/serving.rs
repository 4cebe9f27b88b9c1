//! Speculation in the server: chapter 11's [`Guessing`], giving each request its own proposer
//! for chapter 7's scheduler to check in the continuous batch, next to requests that do not
//! guess.

use crate::propose::{Adaptive, DraftLength, PromptLookup};
use ch07::Proposer;
use ch11::Guessing;

// ANCHOR: lookup_guessing
/// Prompt lookup for every request of a server (`llm-rs serve --spec ngram`): each request
/// gets its own [`Adaptive`] [`PromptLookup`], guessing at most `draft_max` tokens a step, or
/// its `speculative.n_max` if that is smaller (0: this request does not guess); of those, at
/// least `draft_min` (or its `speculative.n_min`) are checked whatever they cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupGuessing {
    pub draft_max: usize,
    pub draft_min: usize,
}

impl Guessing for LookupGuessing {
    fn proposer(&self, n_max: Option<u64>, n_min: Option<u64>) -> Option<Box<dyn Proposer + Send>> {
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let max = n_max.map_or(self.draft_max, count).min(self.draft_max);
        let min = n_min.map_or(self.draft_min, count).min(max);
        (max > 0).then(|| {
            Box::new(Adaptive {
                inner: PromptLookup::default(),
                length: DraftLength::new(max),
                at_least: min,
            }) as Box<dyn Proposer + Send>
        })
    }
}
// ANCHOR_END: lookup_guessing

#[cfg(test)]
mod tests {
    use super::*;

    /// How many tokens a request's proposer guesses at its first step over a text that repeats
    /// (prompt lookup could guess on without end), and how many it has checked whatever they
    /// cost; `None` where the request does not guess.
    fn first_guesses(
        g: LookupGuessing,
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
        let g = LookupGuessing {
            draft_max: 8,
            draft_min: 2,
        };
        assert_eq!(first_guesses(g, None, None), Some((8, 2)));
        assert_eq!(first_guesses(g, Some(3), None), Some((3, 2)));
        assert_eq!(first_guesses(g, Some(3), Some(5)), Some((3, 3)));
        assert_eq!(
            first_guesses(g, Some(u64::MAX), Some(u64::MAX)),
            Some((8, 8))
        );
        assert_eq!(first_guesses(g, Some(0), None), None);
        let off = LookupGuessing {
            draft_max: 0,
            draft_min: 0,
        };
        assert_eq!(first_guesses(off, Some(4), None), None);
    }
}
