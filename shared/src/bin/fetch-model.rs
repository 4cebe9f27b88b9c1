//! Fetch the default model into the cache (if it is not there yet) and print its path.
//! `scripts/fetch-model` runs this; tests and examples fetch on first need by themselves.

fn main() {
    match shared::default_model_path() {
        Ok(path) => println!("{}", path.display()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
