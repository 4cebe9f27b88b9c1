//! Fetch a model into the cache (if it is not there yet) and print its path: the default model,
//! or `gemma3` (chapter 13's second family). `scripts/fetch-model` runs this; tests and examples
//! fetch on first need by themselves.

fn main() {
    let which = std::env::args().nth(1);
    let path = match which.as_deref() {
        None | Some("smollm2") => shared::default_model_path(),
        Some("gemma3") => shared::ensure_cached(&shared::GEMMA3_MODEL),
        Some(other) => {
            eprintln!("error: unknown model {other:?} (known: smollm2, gemma3)");
            std::process::exit(2);
        }
    };
    match path {
        Ok(path) => println!("{}", path.display()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
