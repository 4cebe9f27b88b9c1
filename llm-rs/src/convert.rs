//! `llm-rs convert`: a Hugging Face directory written as a GGUF file (chapter 17's), its
//! matrices in their own type or as a chapter 6 file type.

use ch06::recipe::LlamaFtype;
use ch17::Checkpoint;
use std::error::Error;
use std::path::Path;

/// `llm-rs convert`: the checkpoint in `dir` written to `out` as a GGUF file.
pub fn convert(dir: &Path, out: &Path, ftype: Option<LlamaFtype>) -> Result<(), Box<dyn Error>> {
    let ckpt = Checkpoint::open(dir)?;
    let bytes = ckpt.write_gguf(out, ftype)?;
    let kind = ftype.map_or("its own types".to_string(), |f| f.name().to_string());
    eprintln!(
        "{}: {} {} model, {} tensors ({kind}) → {} ({:.1} MB)",
        dir.display(),
        ckpt.family.hf_architectures[0],
        ckpt.family.arch,
        ckpt.tensors.len(),
        out.display(),
        bytes as f64 / 1e6
    );
    Ok(())
}
