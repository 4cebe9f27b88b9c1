//! Chapter 12's settings from three places, in one order: flags, then environment variables, then a
//! TOML file, then the defaults.
//!
//! A module of the programs, not of the library (which takes its settings as a plain value):
//! chapter 12's examples include it, and so does the finished engine's `llm-rs serve`
//! (`#[path = …] mod settings;`). Its tests are `tests/settings.rs`.
//!
//! A server in a container is configured by its orchestrator's environment; one on a machine
//! by a file an operator edits; a person trying something by flags. Every setting can come
//! from each, and the most specific wins: a flag beats `LLM_RS_<FLAG>`, which beats the file
//! named by `--config` (or `LLM_RS_CONFIG`), which beats the built-in default. The keys of the
//! file are the flags' long names (`port = 8080`, `drain-timeout = 30`; `batch_tokens` is
//! accepted for `batch-tokens`), a flag that may be given more than once takes a list
//! (`api-key = ["K1", "K2"]`), and an unknown key is an error naming it.
//!
//! It works for any clap parser: the environment names are added to its arguments, and the
//! file's values are given to clap as flags — but only for settings that neither the command
//! line nor the environment gave, so clap checks every value the same way wherever it came
//! from.

// Not every program that includes this file calls each of its functions.
#![allow(dead_code)]

use clap::parser::ValueSource;
use clap::{ArgAction, Command, Parser};
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// Prefix of the environment variables: `--drain-timeout` is `LLM_RS_DRAIN_TIMEOUT`.
pub const ENV_PREFIX: &str = "LLM_RS_";

/// A configuration file larger than this is refused before it is read: a settings file is a
/// few hundred bytes, and a path pointing at a model or a device should not be read whole.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// What is wrong with the configuration.
#[derive(Debug)]
pub enum ConfigError {
    /// A flag or environment variable clap refused (it prints its own usage).
    Clap(clap::Error),
    /// The configuration file: which, and what is wrong in it.
    File(PathBuf, String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Clap(e) => write!(f, "{e}"),
            ConfigError::File(p, m) => write!(f, "config file {}: {m}", p.display()),
        }
    }
}

impl std::error::Error for ConfigError {}

/// `P`'s command with an environment variable for every flag but help, version and hidden
/// ones.
pub fn command<P: Parser>() -> Command {
    P::command().mut_args(|a| {
        let skip = a.is_hide_set()
            || a.get_long().is_none()
            || matches!(a.get_action(), ArgAction::Help | ArgAction::Version);
        if skip {
            return a;
        }
        let name = format!("{ENV_PREFIX}{}", a.get_id().as_str().to_uppercase());
        // The variables' values stay out of `--help`: one of them may be an API key.
        a.env(name).hide_env_values(true)
    })
}

// ANCHOR: parse
/// Parse `argv` (program name first) with the environment and the file named by `config_id`'s
/// value, in the order of the module's docs.
pub fn parse_from<P: Parser>(argv: Vec<OsString>, config_id: &str) -> Result<P, ConfigError> {
    let cmd = command::<P>();
    let first = cmd
        .clone()
        .try_get_matches_from(&argv)
        .map_err(ConfigError::Clap)?;
    let Some(path) = first.get_one::<PathBuf>(config_id).cloned() else {
        return P::from_arg_matches(&first).map_err(ConfigError::Clap);
    };
    let table = read_table(&path)?;
    // The file's settings become flags, placed before the real ones, for each setting the
    // command line and the environment left at its default.
    let mut from_file: Vec<OsString> = Vec::new();
    for (key, value) in &table {
        let err = |m: String| ConfigError::File(path.clone(), m);
        let long = key.replace('_', "-");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && !a.is_hide_set())
            .ok_or_else(|| {
                err(format!(
                    "unknown key {key:?} (the keys are: {})",
                    keys(&cmd)
                ))
            })?;
        if arg.get_id() == config_id {
            return Err(err(format!("{key:?} cannot name another file")));
        }
        let given = matches!(
            first.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if given {
            continue;
        }
        from_file.extend(as_flags(key, &long, arg.get_action(), value).map_err(err)?);
    }
    // ANCHOR_END: parse
    // ANCHOR: parse_layered
    let mut layered = Vec::with_capacity(argv.len() + from_file.len());
    let mut rest = argv.into_iter();
    layered.extend(rest.next());
    layered.extend(from_file);
    layered.extend(rest);
    let matches = cmd.try_get_matches_from(layered).map_err(|e| {
        // clap's message names the flag; say that the value came from the file.
        ConfigError::File(path.clone(), e.to_string())
    })?;
    P::from_arg_matches(&matches).map_err(ConfigError::Clap)
}
// ANCHOR_END: parse_layered

/// The flags that give the file's `key = value` to the flag `--long` of action `action`: a
/// switch's `true`, a value, or for a flag that may be given again (`--api-key K1 --api-key
/// K2`) a list of values.
fn as_flags(
    key: &str,
    long: &str,
    action: &ArgAction,
    value: &toml::Value,
) -> Result<Vec<OsString>, String> {
    let flag = || OsString::from(format!("--{long}"));
    let values = match value {
        toml::Value::Array(items) if matches!(action, ArgAction::Append) => items.as_slice(),
        v => std::slice::from_ref(v),
    };
    let mut flags = Vec::new();
    for value in values {
        match (value, action) {
            (toml::Value::Boolean(true), ArgAction::SetTrue) => flags.push(flag()),
            (toml::Value::Boolean(false), ArgAction::SetTrue) => {}
            (_, ArgAction::SetTrue) => {
                return Err(format!("{key:?} is a switch: give true or false"));
            }
            (toml::Value::String(s), _) => flags.extend([flag(), s.into()]),
            (toml::Value::Integer(i), _) => flags.extend([flag(), i.to_string().into()]),
            (toml::Value::Float(x), _) => flags.extend([flag(), x.to_string().into()]),
            (v, _) => {
                let list = if matches!(action, ArgAction::Append) {
                    ", or a list of them"
                } else {
                    ""
                };
                return Err(format!(
                    "{key:?} must be a string or a number{list}, not {}",
                    v.type_str()
                ));
            }
        }
    }
    Ok(flags)
}

fn read_table(path: &Path) -> Result<toml::Table, ConfigError> {
    let err = |m: String| ConfigError::File(path.to_path_buf(), m);
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    if !meta.is_file() {
        return Err(err("not a regular file".into()));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(err(format!(
            "{} bytes, more than a configuration file holds ({MAX_CONFIG_BYTES})",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    text.parse::<toml::Table>().map_err(|e| err(e.to_string()))
}

fn keys(cmd: &Command) -> String {
    let mut keys: Vec<&str> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .filter(|l| !matches!(*l, "help" | "version"))
        .collect();
    keys.sort_unstable();
    keys.join(", ")
}
