//! `llm-rs inspect`: what a GGUF file (or the GGUF image of a Hugging Face directory) holds —
//! chapter 1's summary, the configuration, chapter 18's experts if it has them — and whether
//! this engine runs its architecture.

use ch01::{Config, GgufFile};
use ch04::Architectures;
use ch17::Checkpoint;
use std::error::Error;
use std::path::PathBuf;

/// `llm-rs inspect`: chapter 1's summary of the file, its configuration, and whether `archs`
/// has its architecture.
pub fn inspect(path: Option<PathBuf>, archs: &Architectures) -> Result<(), Box<dyn Error>> {
    let path = match path {
        Some(p) => p,
        None => shared::default_model_path()?,
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let gguf = if ch17::files::is_checkpoint(&path) {
        let (file, _) = ch10::mapped::held_gguf(&path, Checkpoint::open(&path)?.image(None)?)?;
        print!("{}", ch01::inspect::summary(&file, &name));
        file.gguf
    } else {
        let file = GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        print!("{}", ch01::inspect::summary(&file, &name));
        file.gguf
    };
    let file = &gguf;
    let arch = file
        .architecture()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    println!("\nconfig:");
    match Config::from_gguf(file, &[arch]) {
        Ok(c) => print!("{c}"),
        Err(e) => println!("  (none: {e})"),
    }
    if let Some(report) = ch18::report::ExpertReport::of(file, arch) {
        println!("\nmixture of experts:");
        print!("{report}");
    }
    let names = archs.names().join(", ");
    match archs.get(arch) {
        Some(_) => println!("\nllm-rs runs architecture {arch:?} (it runs {names})"),
        None => println!("\nllm-rs does not run architecture {arch:?} (it runs {names})"),
    }
    Ok(())
}
