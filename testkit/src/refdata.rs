//! Reading `reference-data/`: what llama.cpp computed, for the tests to compare against.
//!
//! Format (version [`FORMAT_VERSION`], described in `reference-data/README.md`):
//! - `manifest.json`: `format_version`, the llama.cpp version, model sha256s, prompts and their
//!   token ids, run settings, and what each file holds;
//! - `*.safetensors`: tensors by llama.cpp graph name (`attn_norm-0`, `l_out-29`,
//!   `result_output`), little-endian, row-major, shapes in the usual (outer, …, inner) order;
//! - `*.json`: token ids, texts and other small facts;
//! - vocabulary-only `.gguf` files with llama.cpp's `.inp`/`.out` tokenizer tests.
//!
//! Every error says how to regenerate the data: the tests never run llama.cpp themselves.

use safetensors::{Dtype, SafeTensors};
use std::fmt;
use std::path::{Path, PathBuf};

/// The format version this code reads; `manifest.json` must carry the same.
pub const FORMAT_VERSION: u64 = 1;

/// The file types `quant/variants.json` holds besides the original Q4_1 model: what
/// `scripts/export-reference` has llama.cpp quantize the default model to (its `quant.py`).
/// The tests rebuild each one and check that the data has them all.
pub const QUANT_VARIANTS: [&str; 4] = ["Q8_0", "Q4_0", "Q4_K_M", "Q6_K"];

const HINT: &str = "hint: reference data is produced by `scripts/export-reference` (see README.md, \
                    \"Reference data\"); re-run it and commit reference-data/";

/// What went wrong reading reference data.
#[derive(Debug)]
pub enum RefError {
    /// A file is missing.
    Missing(PathBuf),
    /// A file exists but cannot be read or parsed.
    Invalid(PathBuf, String),
    /// The manifest's format version differs from [`FORMAT_VERSION`].
    Version { found: u64 },
    /// A tensor is not in a file.
    NoTensor { file: PathBuf, name: String },
}

impl fmt::Display for RefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefError::Missing(p) => write!(f, "reference file {} is missing\n{HINT}", p.display()),
            RefError::Invalid(p, why) => {
                write!(
                    f,
                    "reference file {} is unreadable: {why}\n{HINT}",
                    p.display()
                )
            }
            RefError::Version { found } => write!(
                f,
                "reference-data/manifest.json has format_version {found}, this code reads \
                 {FORMAT_VERSION}\n{HINT}"
            ),
            RefError::NoTensor { file, name } => {
                write!(f, "tensor {name:?} is not in {}\n{HINT}", file.display())
            }
        }
    }
}

impl std::error::Error for RefError {}

/// The `reference-data/` directory of this repository.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ has a parent")
        .join("reference-data")
}

/// Path of `rel` inside `reference-data/`, which must exist.
pub fn path(rel: &str) -> Result<PathBuf, RefError> {
    let p = dir().join(rel);
    if p.exists() {
        Ok(p)
    } else {
        Err(RefError::Missing(p))
    }
}

/// Read a whole reference file.
pub fn read(rel: &str) -> Result<Vec<u8>, RefError> {
    let p = path(rel)?;
    std::fs::read(&p).map_err(|e| RefError::Invalid(p, e.to_string()))
}

/// Parse a JSON reference file.
pub fn json(rel: &str) -> Result<serde_json::Value, RefError> {
    let bytes = read(rel)?;
    serde_json::from_slice(&bytes).map_err(|e| RefError::Invalid(dir().join(rel), e.to_string()))
}

/// `manifest.json`, after checking its format version.
pub fn manifest() -> Result<serde_json::Value, RefError> {
    let m = json("manifest.json")?;
    match m.get("format_version").and_then(|v| v.as_u64()) {
        Some(FORMAT_VERSION) => Ok(m),
        Some(found) => Err(RefError::Version { found }),
        None => Err(RefError::Invalid(
            dir().join("manifest.json"),
            "no integer `format_version`".into(),
        )),
    }
}

/// A tensor read from a reference file, converted to f32.
#[derive(Debug, Clone)]
pub struct RefTensor {
    pub name: String,
    /// Outer to inner, row-major: `[n_tokens, n_embd]` for `l_out-L`.
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// A safetensors file of reference tensors.
pub struct TensorFile {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl TensorFile {
    /// Open `rel` (inside `reference-data/`) and check that its header parses.
    pub fn open(rel: &str) -> Result<TensorFile, RefError> {
        let path = path(rel)?;
        let bytes =
            std::fs::read(&path).map_err(|e| RefError::Invalid(path.clone(), e.to_string()))?;
        SafeTensors::deserialize(&bytes)
            .map_err(|e| RefError::Invalid(path.clone(), e.to_string()))?;
        Ok(TensorFile { path, bytes })
    }

    fn view(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).expect("checked in open")
    }

    /// Names of all tensors in the file, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.view().names().into_iter().map(String::from).collect();
        n.sort();
        n
    }

    /// Whether the file holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.view().tensor(name).is_ok()
    }

    /// Tensor `name` as f32 (stored as F32, F16 or BF16).
    pub fn f32(&self, name: &str) -> Result<RefTensor, RefError> {
        let st = self.view();
        let t = st.tensor(name).map_err(|_| RefError::NoTensor {
            file: self.path.clone(),
            name: name.to_string(),
        })?;
        let raw = t.data();
        let data: Vec<f32> = match t.dtype() {
            Dtype::F32 => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            Dtype::F16 => raw
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => raw
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(RefError::Invalid(
                    self.path.clone(),
                    format!("tensor {name} has dtype {other:?}, expected a float type"),
                ));
            }
        };
        Ok(RefTensor {
            name: name.to_string(),
            shape: t.shape().to_vec(),
            data,
        })
    }

    /// Tensor `name` as raw bytes (stored as U8): quantized blocks.
    pub fn bytes(&self, name: &str) -> Result<(Vec<usize>, Vec<u8>), RefError> {
        let st = self.view();
        let t = st.tensor(name).map_err(|_| RefError::NoTensor {
            file: self.path.clone(),
            name: name.to_string(),
        })?;
        if t.dtype() != Dtype::U8 {
            return Err(RefError::Invalid(
                self.path.clone(),
                format!("tensor {name} has dtype {:?}, expected U8", t.dtype()),
            ));
        }
        Ok((t.shape().to_vec(), t.data().to_vec()))
    }

    /// Tensor `name` as i64 (stored as I32 or I64): token ids, top-k indices.
    pub fn i64(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>), RefError> {
        let st = self.view();
        let t = st.tensor(name).map_err(|_| RefError::NoTensor {
            file: self.path.clone(),
            name: name.to_string(),
        })?;
        let raw = t.data();
        let data = match t.dtype() {
            Dtype::I32 => raw
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect(),
            Dtype::I64 => raw
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            other => {
                return Err(RefError::Invalid(
                    self.path.clone(),
                    format!("tensor {name} has dtype {other:?}, expected I32 or I64"),
                ));
            }
        };
        Ok((t.shape().to_vec(), data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_error_says_how_to_regenerate() {
        let e = TensorFile::open("no/such/file.safetensors").err().unwrap();
        let msg = e.to_string();
        assert!(
            msg.contains("missing") && msg.contains("scripts/export-reference"),
            "{msg}"
        );
    }

    #[test]
    fn version_error_names_both_versions() {
        let msg = RefError::Version { found: 7 }.to_string();
        assert!(
            msg.contains('7') && msg.contains(&FORMAT_VERSION.to_string()),
            "{msg}"
        );
    }

    #[test]
    fn reads_f32_f16_and_i32_tensors() {
        use safetensors::tensor::TensorView;
        let dir = tempfile::tempdir().unwrap();
        let f: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let h: Vec<u8> = [half::f16::from_f32(0.25)]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let i: Vec<u8> = [7i32, 9, 11].iter().flat_map(|x| x.to_le_bytes()).collect();
        let views = vec![
            ("a", TensorView::new(Dtype::F32, vec![1, 2], &f).unwrap()),
            ("b", TensorView::new(Dtype::F16, vec![1], &h).unwrap()),
            ("c", TensorView::new(Dtype::I32, vec![3], &i).unwrap()),
        ];
        let bytes = safetensors::serialize(views, None).unwrap();
        let file = TensorFile {
            path: dir.path().join("t.safetensors"),
            bytes,
        };
        assert_eq!(file.names(), ["a", "b", "c"]);
        let a = file.f32("a").unwrap();
        assert_eq!((a.shape, a.data), (vec![1, 2], vec![1.5, -2.0]));
        assert_eq!(file.f32("b").unwrap().data, vec![0.25]);
        assert_eq!(file.i64("c").unwrap(), (vec![3], vec![7, 9, 11]));
        assert!(file.f32("c").is_err() && file.f32("zz").is_err());
    }
}
