//! `tojson` as chat templates expect it: Python's `json.dumps` as transformers calls it (and
//! llama.cpp copies) — `", "` and `": "` between items, keys in the order they were given,
//! text other than ASCII written as it is, `indent=N` for one item per line. minijinja's own
//! filter writes JSON for HTML pages (`<` as `\u003c`); a tool's description printed that way
//! would not be the text the model was trained on.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// The `tojson` filter: `value | tojson`, `tojson(indent=4)`, `tojson(ensure_ascii=true)`,
/// `tojson(separators=(",", ":"))`.
pub fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        Some(i) if i.kind() == ValueKind::Number => Some(usize::try_from(i)?),
        _ => None,
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let separators = kwargs.get::<Option<Vec<String>>>("separators")?;
    if kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: sort_keys is not supported",
        ));
    }
    kwargs.assert_all_used()?;
    let item = match (&separators, indent) {
        (Some(s), _) if !s.is_empty() => s[0].clone(),
        (_, Some(_)) => ",".to_string(),
        _ => ", ".to_string(),
    };
    let key = match &separators {
        Some(s) if s.len() > 1 => s[1].clone(),
        _ => ": ".to_string(),
    };
    let mut out = String::new();
    let style = Style {
        indent,
        item: &item,
        key: &key,
        ensure_ascii,
    };
    write(&mut out, value, 0, &style)?;
    Ok(out)
}

struct Style<'a> {
    indent: Option<usize>,
    item: &'a str,
    key: &'a str,
    ensure_ascii: bool,
}

/// Depth past which a value is refused: a template's data is the request's, and a value nested
/// deeper than any real tool schema would only be a way to exhaust the stack.
const MAX_DEPTH: usize = 128;

fn write(out: &mut String, v: &Value, level: usize, s: &Style) -> Result<(), Error> {
    if level > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: a value nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => number(out, v),
        ValueKind::String => string(out, v.as_str().unwrap_or(""), s.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            open_close(out, '[', ']', items.len(), level, s, |out, i| {
                write(out, &items[i], level + 1, s)
            })?;
        }
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            open_close(out, '{', '}', keys.len(), level, s, |out, i| {
                let k = &keys[i];
                match k.as_str() {
                    Some(text) => string(out, text, s.ensure_ascii),
                    None => string(out, &k.to_string(), s.ensure_ascii),
                }
                out.push_str(s.key);
                write(out, &v.get_item(k)?, level + 1, s)
            })?;
        }
        _ => string(out, &v.to_string(), s.ensure_ascii),
    }
    Ok(())
}

/// `[`/`{`, `n` items written by `item`, `]`/`}` — on one line, or one item a line indented.
fn open_close(
    out: &mut String,
    open: char,
    close: char,
    n: usize,
    level: usize,
    s: &Style,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if n > 0 {
        let pad = |out: &mut String, l: usize| {
            if let Some(w) = s.indent {
                out.extend(std::iter::repeat_n(' ', w * l));
            }
        };
        if s.indent.is_some() {
            out.push('\n');
        }
        for i in 0..n {
            pad(out, level + 1);
            item(out, i)?;
            if i + 1 < n {
                out.push_str(s.item);
            }
            if s.indent.is_some() {
                out.push('\n');
            }
        }
        pad(out, level);
    }
    out.push(close);
    Ok(())
}

/// Integers as they are; other numbers as C++'s `<<` writes a double (`%g`, six significant
/// digits), which is what llama.cpp's templates print.
fn number(out: &mut String, v: &Value) {
    if v.is_integer() {
        out.push_str(&v.to_string());
    } else {
        out.push_str(&format_g(f64::try_from(v.clone()).unwrap_or(f64::NAN)));
    }
}

/// `printf("%g", f)`: six significant digits, trailing zeros dropped, an exponent outside
/// 1e-4 ..< 1e6.
pub fn format_g(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.into();
    }
    if !f.is_finite() {
        return if f.is_nan() {
            "nan".into()
        } else if f > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let e = format!("{f:.5e}");
    let (mantissa, exp) = e.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let trim = |t: String| {
        if t.contains('.') {
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            t
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa.to_string()), exp.abs())
    } else {
        let decimals = (5 - exp).max(0) as usize;
        trim(format!("{f:.decimals$}"))
    }
}

fn string(out: &mut String, text: &str, ensure_ascii: bool) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g_format_as_printf() {
        for (f, want) in [
            (0.5, "0.5"),
            (1.0, "1"),
            (21.25, "21.25"),
            (1234567.0, "1.23457e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-1.234567, "-1.23457"),
            (100000.0, "100000"),
        ] {
            assert_eq!(format_g(f), want, "{f}");
        }
    }
}
