//! Writing GBNF text: rule names made from any text, string literals, characters of a class, and
//! an item repeated `{m,n}` times with a separator.

use super::{MAX_REPETITION, SchemaError, invalid};

/// A rule name from any text: each run of characters other than `a-zA-Z0-9-` becomes `-`.
pub(super) fn rule_name_of(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push('-');
            in_run = true;
        }
    }
    out
}

/// A GBNF string literal of `text`.
pub(super) fn format_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One character inside a GBNF character class. llama.cpp writes it as it is; the characters
/// that would end the class, start a range or negate it are escaped here.
pub(super) fn class_char(c: char, first: bool, out: &mut String) {
    match c {
        '\\' => out.push_str("\\\\"),
        ']' => out.push_str("\\]"),
        '-' => out.push_str("\\-"),
        '^' if first => out.push_str("\\x5E"),
        c => out.push(c),
    }
}

/// `item` repeated `min` to `max` times (no `max`: unbounded), with `separator` between items.
pub(super) fn build_repetition(
    item: &str,
    min: u64,
    max: Option<u64>,
    separator: &str,
    path: &str,
) -> Result<String, SchemaError> {
    if let Some(max) = max {
        if min > max {
            return Err(invalid(
                path,
                format!("at least {min} but at most {max} repetitions"),
            ));
        }
        if max == 0 {
            return Ok(String::new());
        }
    }
    if min == 0 && max == Some(1) {
        return Ok(format!("{item}?"));
    }
    if separator.is_empty() {
        return Ok(match (min, max) {
            (1, None) => format!("{item}+"),
            (0, None) => format!("{item}*"),
            _ => {
                for count in std::iter::once(min).chain(max) {
                    if count > MAX_REPETITION {
                        return Err(SchemaError::RepetitionTooLarge {
                            path: path.to_string(),
                            count,
                            limit: MAX_REPETITION,
                        });
                    }
                }
                let max = max.map(|m| m.to_string()).unwrap_or_default();
                format!("{item}{{{min},{max}}}")
            }
        });
    }
    let rest = build_repetition(
        &format!("({separator} {item})"),
        min.saturating_sub(1),
        max.map(|m| m - 1),
        "",
        path,
    )?;
    let result = format!("{item} {rest}");
    Ok(if min == 0 {
        format!("({result})?")
    } else {
        result
    })
}
