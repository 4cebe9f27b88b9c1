//! Chapter 15's engine: chapter 14's flags and llama.cpp's grammar flags (`--grammar`,
//! `--grammar-file`, `--json-schema`, `--json-schema-file`), turned into chapter 15's
//! [`Constraint`](ch15::Constraint) on the generation.

use crate::scaling::{self, Scaling};
use ch04::{Architectures, MakeRule};
use ch15::{Constraint, Source, compile};
use clap::{CommandFactory, Parser};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

/// Run a GGUF model: complete a prompt, or chat — its output held to a grammar if asked.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "engine",
    about = "Run a GGUF model: complete a prompt, or chat (--chat); --grammar or --json-schema \
             holds the output to a form."
)]
pub struct Structured {
    /// Chapter 14's flags: chapter 10's and --mem-budget.
    #[command(flatten)]
    pub scaling: Scaling,
    /// A GBNF grammar the output must follow (root rule `root`).
    #[arg(long, group = "form", conflicts_with = "ignore_eos")]
    pub grammar: Option<String>,
    /// A file holding the GBNF grammar.
    #[arg(long, group = "form", conflicts_with = "ignore_eos")]
    pub grammar_file: Option<PathBuf>,
    /// A JSON Schema the output must be an instance of, e.g. '{"type": "object"}' ('{}': any
    /// JSON).
    #[arg(long, short = 'j', group = "form", conflicts_with = "ignore_eos")]
    pub json_schema: Option<String>,
    /// A file holding the JSON Schema.
    #[arg(long, group = "form", conflicts_with = "ignore_eos")]
    pub json_schema_file: Option<PathBuf>,
}

impl Structured {
    /// What the flags ask to constrain the output to, reading a file if one is named, with
    /// the flag that asked (for messages).
    pub fn source(&self) -> Result<Option<(&'static str, Source)>, String> {
        let read = |flag: &str, p: &PathBuf| {
            std::fs::read_to_string(p).map_err(|e| format!("{flag} {}: {e}", p.display()))
        };
        let (g, gf, j, jf) = (
            &self.grammar,
            &self.grammar_file,
            &self.json_schema,
            &self.json_schema_file,
        );
        Ok(match (g, gf, j, jf) {
            (Some(g), ..) => Some(("--grammar", Source::Grammar(g.clone()))),
            (_, Some(p), ..) => Some((
                "--grammar-file",
                Source::Grammar(read("--grammar-file", p)?),
            )),
            (_, _, Some(j), _) => Some(("--json-schema", Source::JsonSchema(j.clone()))),
            (.., Some(p)) => Some((
                "--json-schema-file",
                Source::JsonSchema(read("--json-schema-file", p)?),
            )),
            _ => None,
        })
    }
}

/// [`scaling::main_with`] with the output held to the grammar the flags give; a grammar or
/// schema that cannot be used is a usage error naming the flag and the problem.
pub fn main_from(argv: Vec<OsString>, archs: Architectures) {
    let name = argv.first().map(|a| a.to_string_lossy().into_owned());
    let flags = Structured::parse_from(argv);
    let rule = flags.rule(name.as_deref());
    scaling::main_with(flags.scaling, archs, rule);
}

impl Structured {
    /// The rule the grammar flags ask for, if any; a usage error (and exit) naming the flag
    /// when the grammar or schema cannot be used. `name` is the program's, for the message.
    pub fn rule(&self, name: Option<&str>) -> Option<Arc<dyn MakeRule>> {
        let fail = |m: String| -> ! {
            let mut cmd = Structured::command();
            if let Some(n) = name {
                cmd = cmd.bin_name(n.to_string());
            }
            cmd.error(clap::error::ErrorKind::ValueValidation, m).exit()
        };
        match self.source() {
            Err(e) => fail(e),
            Ok(None) => None,
            Ok(Some((flag, source))) => match compile(&source) {
                Ok(g) => Some(Arc::new(Constraint::new(g)) as Arc<dyn MakeRule>),
                Err(e) => fail(format!("{flag}: {e}")),
            },
        }
    }
}
