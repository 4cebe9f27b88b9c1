//! A grammar's matcher at work: the rules a GBNF grammar parses into, or the set of stacks
//! after each character of a text.
//!
//! ```text
//! cargo run -q -p ch15 --example match-trace                     # the book's grammar and text
//! cargo run -q -p ch15 --example match-trace -- GRAMMAR TEXT
//! cargo run -q -p ch15 --example match-trace -- --rules [GRAMMAR] # the rules it parses into
//! cargo run -q -p ch15 --example match-trace -- --schema SCHEMA  # the grammar of a JSON Schema
//! ```
//!
//! With `--rules`, each rule is shown as llama.cpp's element array and as the GBNF it now
//! stands for (groups and repetitions have become rules of their own). Otherwise the text is
//! fed a byte at a time, and the stacks are shown after each character, top first: the
//! position whose character class is matched next, then, below it, where to go on when that
//! rule finishes. A position is written as its rule's name and what is left of its
//! alternative.

use ch15::gbnf::{Elem, Grammar};
use ch15::matcher::{Partial, Scratch, Stacks};

/// The book's grammar: a list of numbers.
const GRAMMAR: &str = r#"root ::= "[" num ("," num)* "]"
num  ::= [0-9]+"#;

/// The book's text.
const TEXT: &str = "[1,23]";

/// A code point as GBNF writes it inside a literal (`class` false) or a class.
fn escaped(c: u32, class: bool, out: &mut String) {
    match char::from_u32(c) {
        Some('"') if !class => out.push_str("\\\""),
        Some('\\') => out.push_str("\\\\"),
        Some(ch @ ('[' | ']' | '-')) if class => {
            out.push('\\');
            out.push(ch);
        }
        Some('\n') => out.push_str("\\n"),
        Some('\t') => out.push_str("\\t"),
        Some('\r') => out.push_str("\\r"),
        Some(ch) if !ch.is_control() => out.push(ch),
        _ if c <= 0xFF => out.push_str(&format!("\\x{c:02X}")),
        _ => out.push_str(&format!("\\U{c:08X}")),
    }
}

/// The elements of one alternative from `pos` to its end, as GBNF.
fn gbnf(g: &Grammar, pos: usize) -> String {
    let e = &g.elems;
    let mut parts: Vec<String> = Vec::new();
    let mut literal = String::new();
    let mut i = pos;
    while !e[i].ends_sequence() {
        let end = match e[i] {
            Elem::Char(_) | Elem::CharNot(_) | Elem::CharAny => ch15::gbnf::class_end(e, i),
            _ => i + 1,
        };
        match e[i] {
            Elem::Char(c) if end == i + 1 => {
                escaped(c, false, &mut literal);
                i = end;
                continue;
            }
            _ => {}
        }
        if !literal.is_empty() {
            parts.push(format!("\"{}\"", std::mem::take(&mut literal)));
        }
        match e[i] {
            Elem::RuleRef(r) => parts.push(g.names[r as usize].clone()),
            Elem::CharAny => parts.push(".".into()),
            _ => {
                let mut class = String::from(if let Elem::CharNot(_) = e[i] {
                    "[^"
                } else {
                    "["
                });
                for el in &e[i..end] {
                    match *el {
                        Elem::Char(c) | Elem::CharNot(c) | Elem::CharAlt(c) => {
                            escaped(c, true, &mut class)
                        }
                        Elem::CharRngUpper(c) => {
                            class.push('-');
                            escaped(c, true, &mut class);
                        }
                        _ => {}
                    }
                }
                class.push(']');
                parts.push(class);
            }
        }
        i = end;
    }
    if !literal.is_empty() {
        parts.push(format!("\"{literal}\""));
    }
    parts.join(" ")
}

/// The rule that holds element `pos`.
fn rule_of(g: &Grammar, pos: u32) -> usize {
    g.starts.partition_point(|&s| s <= pos) - 1
}

/// An element as llama.cpp's grammar tests print it.
fn element(e: Elem) -> String {
    let ch = |c: u32| match char::from_u32(c) {
        Some(ch) if !ch.is_control() && ch != ' ' => format!("'{ch}'"),
        _ => format!("{c}"),
    };
    match e {
        Elem::End => "END".into(),
        Elem::Alt => "ALT".into(),
        Elem::RuleRef(r) => format!("RULE_REF {r}"),
        Elem::Char(c) => format!("CHAR {}", ch(c)),
        Elem::CharNot(c) => format!("CHAR_NOT {}", ch(c)),
        Elem::CharRngUpper(c) => format!("CHAR_RNG_UPPER {}", ch(c)),
        Elem::CharAlt(c) => format!("CHAR_ALT {}", ch(c)),
        Elem::CharAny => "CHAR_ANY".into(),
    }
}

fn show_rules(g: &Grammar) {
    let width = g.names.iter().map(String::len).max().unwrap_or(0);
    for (r, name) in g.names.iter().enumerate() {
        let rule = g.rule(r as u32);
        let start = g.starts[r] as usize;
        let mut alts = Vec::new();
        let mut i = start;
        loop {
            alts.push(gbnf(g, i));
            while !g.elems[i].ends_sequence() {
                i += 1;
            }
            if g.elems[i] != Elem::Alt {
                break;
            }
            i += 1;
        }
        let alts: Vec<&str> = alts.iter().map(|a| a.trim_end()).collect();
        println!("{r}  {name:width$} ::= {}", alts.join(" | ").trim_end());
        let elems: Vec<String> = rule.iter().map(|&e| element(e)).collect();
        println!("   {:width$}     {}", "", elems.join(", "));
    }
}

/// A stack, top first: each position as `rule: what is left of its alternative`.
fn stack(g: &Grammar, st: &[u32]) -> String {
    if st.is_empty() {
        return "(empty: the text so far is a whole sentence)".into();
    }
    let positions: Vec<String> = (st.iter().rev())
        .map(|&p| format!("{}: {}", g.names[rule_of(g, p)], gbnf(g, p as usize)))
        .collect();
    positions.join("  ←  ")
}

fn show_stacks(g: &Grammar, label: &str, stacks: &Stacks) {
    let n = stacks.len();
    println!("{label:8} {n} stack{}", if n == 1 { "" } else { "s" });
    for st in stacks.iter() {
        println!("{:8}   {}", "", stack(g, st));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (grammar, text, rules) = match args.as_slice() {
        [] => (GRAMMAR, TEXT, false),
        [flag] if flag == "--rules" => (GRAMMAR, "", true),
        [flag, g] if flag == "--rules" => (g.as_str(), "", true),
        [flag, schema] if flag == "--schema" => {
            match ch15::schema::schema_text_to_grammar(schema) {
                Ok(g) => print!("{g}"),
                Err(e) => {
                    eprintln!("JSON schema: {e}");
                    std::process::exit(1);
                }
            }
            return;
        }
        [g, t] => (g.as_str(), t.as_str(), false),
        _ => {
            eprintln!(
                "usage: trace [GRAMMAR TEXT] | trace --rules [GRAMMAR] | trace --schema SCHEMA"
            );
            std::process::exit(2);
        }
    };
    let g = match Grammar::parse(grammar, "root") {
        Ok(g) => g,
        Err(e) => {
            eprintln!("grammar: {e}");
            std::process::exit(1);
        }
    };
    println!("{grammar}\n");
    if rules {
        let n = g.names.len();
        println!("parsed into {n} rule{}:", if n == 1 { "" } else { "s" });
        show_rules(&g);
        return;
    }
    let mut s = Scratch::default();
    let mut stacks = match g.initial_stacks(&mut s) {
        Ok(st) => st,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    println!("stacks, top first (`a  ←  b`: match a; when its rule ends, go on with b):");
    show_stacks(&g, "start", &stacks);
    let mut partial = Partial::default();
    let mut next = Stacks::default();
    let mut read = String::new();
    for &b in text.as_bytes() {
        let Some(c) = partial.push(b) else {
            let fits = g.partial_fits(&stacks, partial);
            println!(
                "{:8} byte {b:#04X} starts a character; {} more to come; {}",
                "",
                partial.n_remain,
                if fits {
                    "some class can match it"
                } else {
                    "no class can match it"
                }
            );
            continue;
        };
        partial = Partial::default();
        read.push(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER));
        if let Err(e) = g.accept_char(&stacks, c, &mut next, &mut s) {
            println!("{read}: {e}");
            std::process::exit(1);
        }
        std::mem::swap(&mut stacks, &mut next);
        show_stacks(&g, &format!("{read:?}"), &stacks);
        if stacks.is_empty() {
            println!(
                "rejected: no stack's class matches {:?}",
                read.chars().last()
            );
            std::process::exit(1);
        }
    }
    let whole = partial.n_remain == 0 && stacks.accepts_here();
    println!(
        "\n{text:?} is {}a sentence of the grammar",
        if whole { "" } else { "not " }
    );
}
