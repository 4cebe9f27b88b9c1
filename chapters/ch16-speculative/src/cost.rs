//! What a step costs, learnt from the steps themselves, and how many guesses that makes worth
//! checking.
//!
//! A step over `n` rows takes about `fixed + per_row × n`: reading every weight once, then each
//! row's arithmetic. When memory is the wall (a large model, few rows) `fixed` dominates and a
//! guessed row is almost free; when arithmetic is (a small model, or a full batch), a row costs
//! nearly as much as a token, and a guess that probably fails costs more than it saves.
//! [`StepCost`] fits that line through the recent steps; [`worth_checking`] keeps a guess when
//! it raises the step's expected useful rows per second.

use std::time::Duration;

// ANCHOR: step_cost
/// A least-squares line `seconds = fixed + per_row × rows` through the steps seen, the older
/// ones weighing less (each step multiplies the past's weight by [`StepCost::KEEP`]).
#[derive(Debug, Clone, Default)]
pub struct StepCost {
    // Weighted sums of 1, rows, rows², seconds and rows × seconds.
    w: f64,
    n: f64,
    nn: f64,
    t: f64,
    nt: f64,
}

impl StepCost {
    /// The past's weight after one more step: about the last 30 steps count, so the line
    /// follows a machine that gets busier, but one slow step does not swing it.
    pub const KEEP: f64 = 0.97;

    pub fn add(&mut self, rows: usize, took: Duration) {
        let (n, t) = (rows as f64, took.as_secs_f64());
        for s in [
            &mut self.w,
            &mut self.n,
            &mut self.nn,
            &mut self.t,
            &mut self.nt,
        ] {
            *s *= Self::KEEP;
        }
        self.w += 1.0;
        self.n += n;
        self.nn += n * n;
        self.t += t;
        self.nt += n * t;
    }

    /// `(fixed, per_row)` in seconds, once steps of different sizes have been seen (`None`
    /// before: every step had the same number of rows, and no line goes through one point).
    pub fn line(&self) -> Option<(f64, f64)> {
        let det = self.w * self.nn - self.n * self.n;
        if det <= 1e-6 * self.w * self.nn {
            return None;
        }
        let per_row = ((self.w * self.nt - self.n * self.t) / det).max(0.0);
        let fixed = ((self.t - per_row * self.n) / self.w).max(0.0);
        Some((fixed, per_row))
    }
}
// ANCHOR_END: step_cost

// ANCHOR: worth_checking
/// How many of `offered` guesses to check, on a step that already has `rows` rows, `useful` of
/// them expected to be kept, when a guess holds with chance `hold` and steps cost `line`
/// (`(fixed, per_row)`; `None`: not known yet, all of them). Guess `j` (from 1) is kept with
/// chance `hold^j`, since it needs every one before it; it is checked while that chance, per
/// second its row adds, is at least what the step yields per second without it.
pub fn worth_checking(
    offered: usize,
    hold: f64,
    mut rows: f64,
    mut useful: f64,
    line: Option<(f64, f64)>,
) -> usize {
    // ANCHOR: yours_worth_checking
    let Some((fixed, per_row)) = line else {
        return offered;
    };
    let mut chance = 1.0;
    for j in 0..offered {
        chance *= hold;
        // chance / per_row ≥ useful / (fixed + per_row × rows), without dividing by zero.
        if chance * (fixed + per_row * rows) < useful * per_row {
            return j;
        }
        rows += 1.0;
        useful += chance;
    }
    offered
    // ANCHOR_END: yours_worth_checking
}
// ANCHOR_END: worth_checking

/// One sequence's guesses, judged: how often they hold lately, and how many of those offered
/// to check at what steps cost now.
#[derive(Debug, Clone)]
pub struct Judge {
    /// The chance the next guess holds, as the recent guesses say.
    pub hold: f64,
    /// Steps since a guess was last checked.
    unchecked: usize,
}

impl Judge {
    /// What guesses are expected to do before any is checked.
    pub const HOLD_PRIOR: f64 = 0.5;
    /// How far each checked guess moves `hold` towards what happened to it: about the last 5
    /// guesses count.
    pub const HOLD_LEARN: f64 = 0.2;
    /// Steps after which a sequence whose guesses were all judged not worth checking has one
    /// checked anyway: without it guesses that once failed would never be tried again, even
    /// when the text starts to copy. One row in this many steps costs a few percent at most.
    pub const PROBE_EVERY: usize = 32;

    pub fn new() -> Judge {
        Judge {
            hold: Self::HOLD_PRIOR,
            unchecked: 0,
        }
    }

    /// How many of `offered` guesses to check ([`worth_checking`]), at least `at_least`, one
    /// as a probe after [`Judge::PROBE_EVERY`] steps without any.
    pub fn keep(
        &mut self,
        offered: usize,
        at_least: usize,
        rows: f64,
        useful: f64,
        line: Option<(f64, f64)>,
    ) -> usize {
        let mut k =
            worth_checking(offered, self.hold, rows, useful, line).max(at_least.min(offered));
        self.unchecked = if k > 0 { 0 } else { self.unchecked + 1 };
        if self.unchecked >= Self::PROBE_EVERY && offered > 0 {
            (k, self.unchecked) = (1, 0);
        }
        k
    }

    /// Rows expected to be kept of `k` guesses checked: `hold + hold² + … + hold^k`.
    pub fn expected(&self, k: usize) -> f64 {
        (1..=k as i32).map(|j| self.hold.powi(j)).sum()
    }

    /// Of `proposed` guesses checked, the first `kept` held.
    pub fn learn(&mut self, proposed: usize, kept: usize) {
        for held in std::iter::repeat_n(1.0, kept).chain((kept < proposed).then_some(0.0)) {
            self.hold += Self::HOLD_LEARN * (held - self.hold);
        }
    }
}

impl Default for Judge {
    fn default() -> Self {
        Judge::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_goes_through_the_steps() {
        let mut c = StepCost::default();
        c.add(1, Duration::from_millis(10));
        assert_eq!(c.line(), None, "one size of step: no line yet");
        c.add(1, Duration::from_millis(10));
        c.add(5, Duration::from_millis(14));
        let (fixed, per_row) = c.line().unwrap();
        assert!((fixed - 0.009).abs() < 1e-9 && (per_row - 0.001).abs() < 1e-9);
    }

    #[test]
    fn guesses_pay_where_rows_are_cheap() {
        // Memory-bound: a row is 1 % of the step. Even guesses that hold half the time pay.
        assert_eq!(worth_checking(4, 0.5, 1.0, 1.0, Some((0.1, 0.001))), 4);
        // Arithmetic-bound: a row costs as much as the step's average row. Only a guess sure
        // to hold would pay, so none does.
        assert_eq!(worth_checking(4, 0.9, 4.0, 4.0, Some((0.0, 0.01))), 0);
        // In between, the likelier first guesses pay and the later ones do not.
        let some = worth_checking(8, 0.8, 1.0, 1.0, Some((0.01, 0.01)));
        assert!((1..8).contains(&some), "{some}");
        // By hand: the step of 1 row takes 0.02 s for 1 useful row, 50 a second. Guess 1 holds
        // with chance 0.8 for 0.01 s more: 80 a second, kept. The step is then 2 rows, 1.8
        // useful, 0.03 s (60 a second); guess 2 gives 0.64 in 0.01 s: 64 a second, kept. Then
        // 3 rows, 2.44 useful, 0.04 s (61 a second); guess 3 gives 0.512: 51.2, not kept.
        assert_eq!(some, 2);
        // Not known yet: all of them.
        assert_eq!(worth_checking(3, 0.1, 1.0, 1.0, None), 3);
    }
}
