//! Integer ranges, digit by digit: the alternatives that match the decimal integers between a
//! `minimum` and a `maximum` (llama.cpp's `build_min_max_int`).

use std::fmt::Write as _;

use super::{SchemaError, invalid};

/// Writes the alternatives that match the decimal integers in `min..=max` (`i64::MIN` /
/// `i64::MAX`: unbounded), as llama.cpp's `build_min_max_int`: numbers of fewer digits than a
/// bound, then digit by digit along it. An unbounded side allows `decimals_left` digits.
pub(super) struct IntRange<'o> {
    pub(super) out: &'o mut String,
    pub(super) path: &'o str,
    /// Mend two slips of llama.cpp's construction (strict): see `at_least` and `build`.
    pub(super) exact: bool,
}

impl IntRange<'_> {
    fn digit_range(&mut self, from: u8, to: u8) {
        self.out.push('[');
        self.out.push(from as char);
        if from != to {
            self.out.push('-');
            self.out.push(to as char);
        }
        self.out.push(']');
    }

    /// The digits that may follow a minimum's first digit when the number has as many digits
    /// as the minimum: as many as `tail` and not less, or more. llama.cpp reads `tail` as a
    /// number, which loses its leading zeros (after `1` of `1005`, `5` would allow `15`);
    /// strictly, a leading zero is kept: `[1-9]` and any `len - 1` digits, or `0` and the rest.
    fn at_least(&mut self, tail: &[u8], decimals_left: i32) -> Result<(), SchemaError> {
        if self.exact && tail.len() > 1 && tail[0] == b'0' {
            let less_decimals = (decimals_left - 1).max(1);
            self.out.push_str("[1-9] ");
            self.more_digits(tail.len() as i32 - 1, less_decimals)?;
            self.out.push_str(" | [0] (");
            self.at_least(&tail[1..], less_decimals)?;
            self.out.push(')');
            return Ok(());
        }
        let value = std::str::from_utf8(tail)
            .unwrap_or("0")
            .parse()
            .unwrap_or(0);
        self.build(value, i64::MAX, decimals_left, false)
    }

    /// `[0-9]{min,max}`; `max` of `i32::MAX` is unbounded.
    fn more_digits(&mut self, min: i32, max: i32) -> Result<(), SchemaError> {
        if min > max {
            return Err(invalid(
                self.path,
                "an integer bound has more digits than the 16 llama.cpp's integers allow",
            ));
        }
        self.out.push_str("[0-9]");
        if min == max && min == 1 {
            return Ok(());
        }
        let _ = write!(self.out, "{{{min}");
        if max != min {
            self.out.push(',');
            if max != i32::MAX {
                let _ = write!(self.out, "{max}");
            }
        }
        self.out.push('}');
        Ok(())
    }

    /// The numbers from `from` to `to`, both of the same number of digits.
    fn uniform_range(&mut self, from: &[u8], to: &[u8]) -> Result<(), SchemaError> {
        let mut i = 0;
        while i < from.len() && i < to.len() && from[i] == to[i] {
            i += 1;
        }
        if i > 0 {
            self.out.push('"');
            self.out
                .push_str(std::str::from_utf8(&from[..i]).unwrap_or_default());
            self.out.push('"');
        }
        if i < from.len() && i < to.len() {
            if i > 0 {
                self.out.push(' ');
            }
            let sub_len = from.len() - i - 1;
            if sub_len > 0 {
                let from_sub = &from[i + 1..];
                let to_sub = &to[i + 1..];
                let zeros = vec![b'0'; sub_len];
                let nines = vec![b'9'; sub_len];
                let n = sub_len as i32;
                let mut to_reached = false;
                self.out.push('(');
                if from_sub == zeros.as_slice() {
                    self.digit_range(from[i], to[i] - 1);
                    self.out.push(' ');
                    self.more_digits(n, n)?;
                } else {
                    let _ = write!(self.out, "[{}] (", from[i] as char);
                    self.uniform_range(from_sub, &nines)?;
                    self.out.push(')');
                    if from[i] < to[i] - 1 {
                        self.out.push_str(" | ");
                        if to_sub == nines.as_slice() {
                            self.digit_range(from[i] + 1, to[i]);
                            to_reached = true;
                        } else {
                            self.digit_range(from[i] + 1, to[i] - 1);
                        }
                        self.out.push(' ');
                        self.more_digits(n, n)?;
                    }
                }
                if !to_reached {
                    self.out.push_str(" | ");
                    self.digit_range(to[i], to[i]);
                    self.out.push(' ');
                    self.uniform_range(&zeros, to_sub)?;
                }
                self.out.push(')');
            } else {
                let _ = write!(self.out, "[{}-{}]", from[i] as char, to[i] as char);
            }
        }
        Ok(())
    }

    pub(super) fn build(
        &mut self,
        mut min: i64,
        max: i64,
        decimals_left: i32,
        top_level: bool,
    ) -> Result<(), SchemaError> {
        let has_min = min != i64::MIN;
        let has_max = max != i64::MAX;
        let neg = |v: i64| {
            v.checked_neg()
                .ok_or_else(|| invalid(self.path, "integer bound out of range"))
        };

        if has_min && has_max {
            if min < 0 && max < 0 {
                let (lo, hi) = (neg(max)?, neg(min)?);
                self.out.push_str("\"-\" (");
                self.build(lo, hi, decimals_left, true)?;
                self.out.push(')');
                return Ok(());
            }
            if min < 0 {
                let hi = neg(min)?;
                self.out.push_str("\"-\" (");
                self.build(0, hi, decimals_left, true)?;
                self.out.push_str(") | ");
                min = 0;
            }
            let mut min_s = min.to_string().into_bytes();
            let max_s = max.to_string().into_bytes();
            for digits in min_s.len()..max_s.len() {
                self.uniform_range(&min_s, &vec![b'9'; digits])?;
                min_s = std::iter::once(b'1')
                    .chain(std::iter::repeat_n(b'0', digits))
                    .collect();
                self.out.push_str(" | ");
            }
            return self.uniform_range(&min_s, &max_s);
        }

        let less_decimals = (decimals_left - 1).max(1);

        if has_min {
            if min < 0 {
                let hi = neg(min)?;
                self.out.push_str("\"-\" (");
                self.build(i64::MIN, hi, decimals_left, false)?;
                self.out.push_str(") | [0] | [1-9] ");
                self.more_digits(0, decimals_left - 1)?;
            } else if min == 0 {
                if top_level {
                    self.out.push_str("[0] | [1-9] ");
                    self.more_digits(0, less_decimals)?;
                } else {
                    self.more_digits(1, decimals_left)?;
                }
            } else if min <= 9 {
                let c = b'0' + min as u8;
                let range_start = if top_level { b'1' } else { b'0' };
                if c > range_start {
                    self.digit_range(range_start, c - 1);
                    self.out.push(' ');
                    self.more_digits(1, less_decimals)?;
                    self.out.push_str(" | ");
                }
                self.digit_range(c, b'9');
                self.out.push(' ');
                self.more_digits(0, less_decimals)?;
            } else {
                let min_s = min.to_string().into_bytes();
                let len = min_s.len() as i32;
                let c = min_s[0];
                // Inside a number, a first digit below `c` needs one digit more; llama.cpp
                // leaves out `0` there when `c` is `1` (`4` `0…` after `410`), strictly kept.
                if c > b'1' || (self.exact && !top_level) {
                    self.digit_range(if top_level { b'1' } else { b'0' }, c - 1);
                    self.out.push(' ');
                    self.more_digits(len, less_decimals)?;
                    self.out.push_str(" | ");
                }
                self.digit_range(c, c);
                self.out.push_str(" (");
                self.at_least(&min_s[1..], less_decimals)?;
                self.out.push(')');
                if c < b'9' {
                    self.out.push_str(" | ");
                    self.digit_range(c + 1, b'9');
                    self.out.push(' ');
                    self.more_digits(len - 1, less_decimals)?;
                }
            }
            return Ok(());
        }

        if has_max {
            if max >= 0 {
                if top_level {
                    self.out.push_str("\"-\" [1-9] ");
                    self.more_digits(0, less_decimals)?;
                    self.out.push_str(" | ");
                }
                self.build(0, max, decimals_left, true)?;
            } else {
                let lo = neg(max)?;
                self.out.push_str("\"-\" (");
                self.build(lo, i64::MAX, decimals_left, false)?;
                self.out.push(')');
            }
            return Ok(());
        }
        Err(invalid(
            self.path,
            "an integer range needs a minimum or a maximum",
        ))
    }
}
