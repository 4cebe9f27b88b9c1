//! Number ranges, digit by digit: the alternatives that match the JSON numbers between a
//! `minimum` (or `exclusiveMinimum`) and a `maximum` (or `exclusiveMaximum`).
//!
//! llama.cpp bounds integers only (`build_min_max_int`); a `"type": "number"` with bounds gets
//! its plain number rule, so a model held to `{"minimum": 0, "maximum": 1}` may still write
//! `7.5`. Bounding a decimal is the integer construction plus its fraction. A number `I.F`
//! (integer part `I`, fraction digits `F`) between `A.α` and `B.β` is one of:
//!
//! - `A` followed by a fraction at least `.α`,
//! - an integer strictly between `A` and `B` (chapter 15's [`IntRange`]) and any fraction,
//! - `B` followed by a fraction at most `.β`,
//!
//! and a fraction compared with a bound's is a walk along the bound's digits: a digit below
//! the lower bound's fails, the same digit keeps comparing, a larger one frees the rest
//! ([`Fraction`]). Negative numbers are the same walk behind a `-`, with the bounds swapped.
//!
//! The rule writes numbers without an exponent (`0.001`, not `1e-3`), at most 16 integer and
//! 16 fraction digits as llama.cpp's number rule allows (more where a bound itself has them,
//! and up to 31 past an excluded bound's last digit: zeros, then a digit that is not): every
//! number it allows lies in the range, and every number in the range can be written this way.

use std::fmt::Write as _;

use super::integers::IntRange;
use super::{SchemaError, invalid};

/// One side of a number's range: the bound and whether it is excluded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct NumBound {
    pub(super) value: f64,
    pub(super) exclusive: bool,
}

impl NumBound {
    /// The tighter of two lower bounds (of two at one value, the exclusive one).
    pub(super) fn tighter_min(a: Option<NumBound>, b: NumBound) -> NumBound {
        match a {
            Some(a) if a.value > b.value || (a.value == b.value && a.exclusive) => a,
            _ => b,
        }
    }

    /// The tighter of two upper bounds.
    pub(super) fn tighter_max(a: Option<NumBound>, b: NumBound) -> NumBound {
        match a {
            Some(a) if a.value < b.value || (a.value == b.value && a.exclusive) => a,
            _ => b,
        }
    }
}

/// The digits of a number's magnitude: its integer part and its fraction's digits (ASCII,
/// without trailing zeros: `0.5` is `(0, "5")`, `2` is `(2, "")`).
#[derive(Debug, Clone, PartialEq)]
struct Digits {
    int: i64,
    frac: Vec<u8>,
}

/// The most integer digits a bound may have: llama.cpp's number rule writes at most 16.
const MAX_INT_DIGITS: usize = 16;
/// The fraction digits the rule allows: llama.cpp's `decimal-part`, `[0-9]{1,16}`.
const FRACTION_DIGITS: usize = 16;

impl Digits {
    /// `|v|` as the shortest decimal that reads back as `v` (Rust's `Display` of an `f64`
    /// never uses an exponent): the number the schema's author wrote, `0.1` and not
    /// `0.1000000000000000055…`.
    fn of(v: f64, key: &str, path: &str) -> Result<Digits, SchemaError> {
        let text = format!("{}", v.abs());
        let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
        if !v.is_finite() || int.len() > MAX_INT_DIGITS {
            return Err(invalid(
                path,
                format!("{key} {v} has more than the {MAX_INT_DIGITS} integer digits of a number"),
            ));
        }
        let int = int
            .parse()
            .map_err(|_| invalid(path, format!("{key} {v}")))?;
        let frac = frac.trim_end_matches('0').as_bytes().to_vec();
        Ok(Digits { int, frac })
    }

    fn zero() -> Digits {
        Digits {
            int: 0,
            frac: Vec::new(),
        }
    }
}

/// What a fraction's digits must still satisfy against one bound, given the digits so far.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Side<'a> {
    /// Decided: the digits so far are already inside on this side.
    Free,
    /// Equal so far: the rest is compared with the bound's remaining digits; `exclusive`
    /// excludes equality.
    Along(&'a [u8], bool),
    /// Decided: outside.
    Out,
}

impl<'a> Side<'a> {
    /// Equal so far with `rest` of the bound left; a lower bound with nothing left that
    /// allows equality allows everything that follows.
    fn along(rest: &'a [u8], exclusive: bool, lower: bool) -> Side<'a> {
        if lower && rest.is_empty() && !exclusive {
            Side::Free
        } else {
            Side::Along(rest, exclusive)
        }
    }

    /// After the digit `d`, for a lower (`lower`) or upper bound.
    fn after(self, d: u8, lower: bool) -> Side<'a> {
        let Side::Along(rest, exclusive) = self else {
            return self;
        };
        // An exhausted bound's digits are zeros.
        let b = rest.first().copied().unwrap_or(b'0');
        let rest = rest.get(1..).unwrap_or(&[]);
        match (d.cmp(&b), lower) {
            (std::cmp::Ordering::Equal, _) => Side::along(rest, exclusive, lower),
            (std::cmp::Ordering::Greater, true) | (std::cmp::Ordering::Less, false) => Side::Free,
            _ => Side::Out,
        }
    }

    /// Whether stopping here (the remaining digits all zeros) is inside this side. Stopped,
    /// the fraction equals the bound where the bound has no digits left, and is below it where
    /// it has some (it has no trailing zeros, so one of them is not zero).
    fn may_stop(self, lower: bool) -> bool {
        match self {
            Side::Free => true,
            Side::Out => false,
            Side::Along([], exclusive) => !exclusive,
            Side::Along(..) => !lower,
        }
    }
}

/// Writes the digits of a fraction (after the `.`) that lie between a lower and an upper side.
struct Fraction<'o> {
    out: &'o mut String,
}

impl Fraction<'_> {
    /// The alternatives for the next digits (at most `left` more), given the sides; `optional`:
    /// stopping before them is allowed (the caller has written a digit or decides the `.`).
    /// Returns whether any digit string is allowed; writes nothing when none is.
    fn digits(&mut self, lo: Side, hi: Side, left: usize) -> bool {
        if lo == Side::Out || hi == Side::Out || left == 0 {
            return false;
        }
        if lo == Side::Free && hi == Side::Free {
            self.any(left);
            return true;
        }
        // Two tails written whole rather than digit by digit: zeros only (up to an upper
        // bound's last digit), and anything not all zeros (past an excluded lower bound's).
        if lo == Side::Free && hi == Side::Along(&[], false) {
            self.out.push_str("[0]");
            if left > 1 {
                let _ = write!(self.out, " [0]{{0,{}}}", left - 1);
            }
            return true;
        }
        if lo == Side::Along(&[], true) && hi == Side::Free {
            if left > 1 {
                let _ = write!(self.out, "[0]{{0,{}}} ", left - 1);
            }
            self.out.push_str("[1-9]");
            if left > 1 {
                let _ = write!(self.out, " [0-9]{{0,{}}}", left - 1);
            }
            return true;
        }
        // Runs of next digits with the same sides after them.
        let mut runs: Vec<(u8, u8, Side, Side)> = Vec::new();
        for d in b'0'..=b'9' {
            let (l, h) = (lo.after(d, true), hi.after(d, false));
            if l == Side::Out || h == Side::Out {
                continue;
            }
            match runs.last_mut() {
                Some(run) if run.1 + 1 == d && (run.2, run.3) == (l, h) => run.1 = d,
                _ => runs.push((d, d, l, h)),
            }
        }
        let mut wrote = false;
        let mut alts = String::new();
        for (from, to, l, h) in runs {
            let stop = l.may_stop(true) && h.may_stop(false);
            let mut rest = String::new();
            let more = Fraction { out: &mut rest }.digits(l, h, left - 1);
            if !stop && !more {
                continue;
            }
            if wrote {
                alts.push_str(" | ");
            }
            wrote = true;
            alts.push('[');
            alts.push(from as char);
            if to != from {
                alts.push('-');
                alts.push(to as char);
            }
            alts.push(']');
            if more {
                let _ = write!(alts, " ({rest}){}", if stop { "?" } else { "" });
            }
        }
        if wrote {
            self.out.push_str(&alts);
        }
        wrote
    }

    /// `[0-9]{0,left-1}` after a first digit: any digits.
    fn any(&mut self, left: usize) {
        self.out.push_str("[0-9]");
        if left > 1 {
            let _ = write!(self.out, " [0-9]{{0,{}}}", left - 1);
        }
    }
}

/// Writes the alternatives of a number's range.
pub(super) struct NumRange<'o> {
    pub(super) out: &'o mut String,
    pub(super) path: &'o str,
}

impl NumRange<'_> {
    /// The numbers between `min` and `max` (`None`: unbounded on that side). An error names a
    /// bound the rule cannot write, or a range with no number in it.
    pub(super) fn build(
        &mut self,
        min: Option<NumBound>,
        max: Option<NumBound>,
    ) -> Result<(), SchemaError> {
        let digits = |b: NumBound, key: &str| Digits::of(b.value, key, self.path);
        let mut alts: Vec<String> = Vec::new();
        // x < 0, written `-y`: y runs from max(-max, 0) (0 excluded: `-0` is not written)
        // to -min.
        if min.is_none_or(|m| m.value < 0.0) {
            let lo = match max {
                Some(m) if m.value < 0.0 => (digits(m, "maximum")?, m.exclusive),
                _ => (Digits::zero(), true),
            };
            let hi = match min {
                Some(m) => Some((digits(m, "minimum")?, m.exclusive)),
                None => None,
            };
            if let Some(body) = self.magnitudes(lo, hi)? {
                alts.push(format!("\"-\" ({body})"));
            }
        }
        // x >= 0.
        if max.is_none_or(|m| m.value >= 0.0) {
            let lo = match min {
                Some(m) if m.value >= 0.0 => (digits(m, "minimum")?, m.exclusive),
                _ => (Digits::zero(), false),
            };
            let hi = match max {
                Some(m) => Some((digits(m, "maximum")?, m.exclusive)),
                None => None,
            };
            if let Some(body) = self.magnitudes(lo, hi)? {
                alts.push(body);
            }
        }
        if alts.is_empty() {
            let show = |b: Option<NumBound>, (incl, excl): (&str, &str)| match b {
                Some(b) => format!("{} {}", if b.exclusive { excl } else { incl }, b.value),
                None => "unbounded".to_string(),
            };
            return Err(invalid(
                self.path,
                format!(
                    "no number lies in the range ({}, {})",
                    show(min, ("minimum", "exclusiveMinimum")),
                    show(max, ("maximum", "exclusiveMaximum"))
                ),
            ));
        }
        self.out.push_str(&alts.join(" | "));
        Ok(())
    }

    /// The magnitudes (no sign) from `lo` to `hi` (`None`: unbounded), each with whether it is
    /// excluded; `None` when there are none.
    fn magnitudes(
        &mut self,
        (a, a_excl): (Digits, bool),
        hi: Option<(Digits, bool)>,
    ) -> Result<Option<String>, SchemaError> {
        let left = FRACTION_DIGITS
            .max(a.frac.len())
            .max(hi.as_ref().map_or(0, |(b, _)| b.frac.len()));
        let lower = Side::along(&a.frac, a_excl, true);
        let mut alts: Vec<String> = Vec::new();
        let mut with_fraction = |int: String, lo: Side, hi: Side| {
            let stop = lo.may_stop(true) && hi.may_stop(false);
            let mut frac = String::new();
            let more = Fraction { out: &mut frac }.digits(lo, hi, left);
            match (stop, more) {
                (_, false) if stop => alts.push(int),
                (_, false) => {}
                (true, true) => alts.push(format!("{int} (\".\" ({frac}))?")),
                (false, true) => alts.push(format!("{int} \".\" ({frac})")),
            }
        };
        let int_text = |i: i64| format!("\"{i}\"");
        match &hi {
            None => {
                with_fraction(int_text(a.int), lower, Side::Free);
                if let Some(next) = a.int.checked_add(1) {
                    let between = self.integers(next, i64::MAX)?;
                    with_fraction(between, Side::Free, Side::Free);
                }
            }
            Some((b, b_excl)) => {
                let upper = Side::along(&b.frac, *b_excl, false);
                if a.int == b.int {
                    with_fraction(int_text(a.int), lower, upper);
                } else if a.int < b.int {
                    with_fraction(int_text(a.int), lower, Side::Free);
                    if a.int + 1 < b.int {
                        let between = self.integers(a.int + 1, b.int - 1)?;
                        with_fraction(between, Side::Free, Side::Free);
                    }
                    with_fraction(int_text(b.int), Side::Free, upper);
                }
            }
        }
        Ok((!alts.is_empty()).then(|| alts.join(" | ")))
    }

    /// The integers from `min` to `max` (`i64::MAX`: unbounded), both non-negative, as
    /// chapter 15's integer ranges write them, in parentheses.
    fn integers(&mut self, min: i64, max: i64) -> Result<String, SchemaError> {
        let mut out = String::from("(");
        IntRange {
            out: &mut out,
            path: self.path,
            exact: true,
        }
        .build(min, max, MAX_INT_DIGITS as i32, true)?;
        out.push(')');
        Ok(out)
    }
}
