//! Guesses inside chapter 7's continuous batch: a request's [`Proposer`] as the scheduler's
//! [`Lookahead`].
//!
//! Chapter 7's scheduler already feeds a decoding request's tokens ahead of its decode token
//! and keeps each while it equals what the model samples — the check speculation needs. What
//! this module adds is the judgement a batch needs that a lone sequence does not: a guessed
//! row is almost free when memory is the wall, but costs nearly a token's work when the batch
//! is full of other requests' rows. So each request's guesses are cut to the ones expected to
//! pay for their rows ([`Judge`]), at what the recent steps cost ([`StepCost`]) — one line of
//! cost for all the requests of a scheduler ([`Steps`]).

use crate::cost::{Judge, StepCost};
use crate::propose::Proposer;
use ch04::ForwardError;
use ch07::{Lookahead, StepRows};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// What the steps of one scheduler cost, and what this step's guesses are expected to waste:
/// shared by the [`Guessed`] of every request it runs.
#[derive(Debug, Clone, Default)]
pub struct Steps(Arc<Mutex<Pace>>);

#[derive(Debug, Default)]
struct Pace {
    cost: StepCost,
    /// The step whose guesses `lost` counts, and rows of it expected not to be kept.
    step: usize,
    lost: f64,
    /// The last step added to `cost` (each is added once, by whichever request hears first).
    timed: Option<usize>,
}

// ANCHOR: guessed
/// A request's proposer, its guesses judged against what a row of the batch costs.
pub struct Guessed<P> {
    pub proposer: P,
    pub judge: Judge,
    pub steps: Steps,
}

impl<P: Proposer> Guessed<P> {
    pub fn new(proposer: P, steps: Steps) -> Guessed<P> {
        Guessed {
            proposer,
            judge: Judge::new(),
            steps,
        }
    }
}

impl<P: Proposer> Lookahead for Guessed<P> {
    fn ahead(
        &mut self,
        tokens: &[u32],
        room: usize,
        step: StepRows,
        out: &mut Vec<u32>,
    ) -> Result<(), ForwardError> {
        let start = out.len();
        self.proposer.propose(tokens, room, out)?;
        let offered = (out.len() - start).min(room);
        let mut pace = self.steps.0.lock().unwrap_or_else(PoisonError::into_inner);
        if pace.step != step.step {
            (pace.step, pace.lost) = (step.step, 0.0);
        }
        // The step's rows so far, and how many of them are expected to be kept.
        let (rows, line) = (step.rows as f64, pace.cost.line());
        let useful = rows - pace.lost;
        let at_least = self.proposer.at_least();
        let k = self.judge.keep(offered, at_least, rows, useful, line);
        out.truncate(start + k);
        pace.lost += k as f64 - self.judge.expected(k);
        Ok(())
    }

    fn kept(&mut self, fed: usize, kept: usize, step: StepRows, took: Duration) {
        let mut pace = self.steps.0.lock().unwrap_or_else(PoisonError::into_inner);
        if pace.timed != Some(step.step) {
            pace.cost.add(step.rows, took);
            pace.timed = Some(step.step);
        }
        if fed > 0 {
            self.judge.learn(fed, kept);
            self.proposer.checked(fed, kept);
        }
    }
}
// ANCHOR_END: guessed
