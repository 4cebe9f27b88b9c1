//! Tokenize text, or decode ids, with a GGUF model's vocabulary.
//!
//! ```text
//! cargo run -q -p ch02 --example tokenize -- "Hello world"          # [19556, 905]
//! cargo run -q -p ch02 --example tokenize -- --parse-special "<|im_start|>user"
//! cargo run -q -p ch02 --example tokenize -- --decode "[19556, 905]"  # Hello world
//! ```

use ch01::GgufFile;
use ch02::Tokenizer;
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    about = "Print the token ids of TEXT as a JSON array (or, with --decode, the text of ids)"
)]
struct Args {
    /// GGUF file to read the vocabulary from (default: the default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Recognise control tokens such as <|im_start|> written in TEXT.
    #[arg(long)]
    parse_special: bool,
    /// Do not add BOS/EOS even where the vocabulary asks for them.
    #[arg(long)]
    no_bos: bool,
    /// TEXT is a JSON array of ids: print their text.
    #[arg(long)]
    decode: bool,
    text: String,
}

fn run(args: Args) -> Result<String, Box<dyn std::error::Error>> {
    let path = match args.model {
        Some(p) => p,
        None => shared::default_model_path()?,
    };
    let file = GgufFile::open(&path)?;
    let tokenizer = Tokenizer::from_gguf(&file.gguf)?;
    if args.decode {
        let ids: Vec<u32> = serde_json::from_str(&args.text)
            .map_err(|e| format!("--decode expects a JSON array of token ids: {e}"))?;
        let bytes = tokenizer.detokenize(&ids, false, true)?;
        return Ok(String::from_utf8_lossy(&bytes).into_owned());
    }
    let ids = tokenizer.encode(&args.text, !args.no_bos, args.parse_special);
    Ok(serde_json::to_string(&ids)?)
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
