//! Reading a Hugging Face directory: its JSON files, and its safetensors shards, mapped.
//!
//! # safetensors
//!
//! A `.safetensors` file is an 8-byte little-endian length `n`, `n` bytes of JSON, and the
//! tensors' bytes:
//!
//! ```text
//! n: u64 | {"model.norm.weight": {"dtype": "BF16", "shape": [576], "data_offsets": [0, 1152]},
//!           ..., "__metadata__": {"format": "pt"}} | data
//! ```
//!
//! Each tensor is row-major, little-endian, at `data_offsets` from the start of the data. That
//! is GGUF's layout too (a `[rows, cols]` tensor is ggml's `ne = [cols, rows]`), so a tensor
//! whose type and row order the engine shares needs no conversion at all. The header is input
//! like any other: Hugging Face's own reader ([`safetensors::SafeTensors::read_metadata`])
//! checks that the offsets are in order, cover the data exactly, and agree with each shape and
//! type, before a byte of a tensor is read.

use memmap2::Mmap;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorInfo};
use serde_json::Value as Json;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::family::{FAMILIES, Family};

/// The largest JSON file read whole (`config.json`, `tokenizer.json`, the shard index): a
/// tokenizer of 262,144 tokens, Gemma 3's, takes 33 MB; a file 8 times that is not one.
pub const MAX_JSON_BYTES: u64 = 256 << 20;

/// The most shards a directory may list: a 405B model ships in 191.
pub const MAX_SHARDS: usize = 4096;

// ANCHOR: error
/// What is wrong with a checkpoint: the file, and what in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointError {
    pub file: PathBuf,
    pub what: String,
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.what)
    }
}

impl std::error::Error for CheckpointError {}

/// A [`CheckpointError`] in `file`.
pub fn bad(file: &Path, what: impl Into<String>) -> CheckpointError {
    CheckpointError {
        file: file.to_path_buf(),
        what: what.into(),
    }
}
// ANCHOR_END: error

/// The JSON file at `path`, read whole if it is no larger than [`MAX_JSON_BYTES`].
pub fn read_json(path: &Path) -> Result<Json, CheckpointError> {
    let len = std::fs::metadata(path)
        .map_err(|e| bad(path, format!("cannot read: {e}")))?
        .len();
    if len > MAX_JSON_BYTES {
        let why =
            format!("{len} bytes is more than a JSON file of a model takes ({MAX_JSON_BYTES})");
        return Err(bad(path, why));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(path, format!("cannot read: {e}")))?;
    serde_json::from_str(&text).map_err(|e| bad(path, format!("not valid JSON: {e}")))
}

/// `path` read as JSON if the file exists.
fn read_json_if(path: &Path) -> Result<Option<Json>, CheckpointError> {
    if path.is_file() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

// ANCHOR: shard
/// One `.safetensors` file, memory-mapped, its header parsed and checked.
pub struct Shard {
    pub path: PathBuf,
    map: Mmap,
    /// Where the data starts: after the length and the header.
    data_start: usize,
    pub tensors: HashMap<String, TensorInfo>,
}

impl Shard {
    /// Map the file at `path` and read its header.
    pub fn open(path: &Path) -> Result<Shard, CheckpointError> {
        let file = File::open(path).map_err(|e| bad(path, format!("cannot open: {e}")))?;
        // SAFETY: the map is read-only and this process never writes the file; as with a
        // GGUF file (chapter 10), a model file must not be changed while it is mapped.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| bad(path, format!("cannot map: {e}")))?;
        let (n, metadata) = SafeTensors::read_metadata(&map)
            .map_err(|e| bad(path, format!("not a valid safetensors file: {e}")))?;
        let tensors = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, info.clone()))
            .collect();
        Ok(Shard {
            path: path.to_path_buf(),
            map,
            data_start: 8 + n,
            tensors,
        })
    }

    /// The file's length in bytes.
    pub fn file_len(&self) -> usize {
        self.map.len()
    }

    /// Where tensor `name` (one of this shard's) lies in the file: bytes `start..end`.
    pub fn file_range(&self, name: &str) -> (usize, usize) {
        let (start, end) = self.tensors[name].data_offsets;
        (self.data_start + start, self.data_start + end)
    }

    /// The bytes of tensor `info` (one of this shard's: the header check put them inside the
    /// file).
    pub fn bytes(&self, info: &TensorInfo) -> &[u8] {
        let (start, end) = info.data_offsets;
        &self.map[self.data_start + start..self.data_start + end]
    }
}
// ANCHOR_END: shard

/// One tensor of the checkpoint: where it is and what it is.
#[derive(Debug, Clone)]
pub struct HfTensor {
    pub shard: usize,
    pub dtype: Dtype,
    /// Outermost first, as PyTorch writes it: `[rows, cols]`.
    pub shape: Vec<usize>,
}

// ANCHOR: checkpoint
/// A Hugging Face model directory, opened: its configuration, tokenizer files and shards.
pub struct Checkpoint {
    pub dir: PathBuf,
    /// `config.json`; for a model that also sees images, its `text_config` over the rest.
    pub config: Json,
    pub family: &'static Family,
    pub shards: Vec<Shard>,
    /// Every tensor by its Hugging Face name.
    pub tensors: BTreeMap<String, HfTensor>,
    pub tokenizer: Json,
    pub tokenizer_config: Option<Json>,
    /// The chat template: `tokenizer_config.json`'s, else `chat_template.jinja`'s.
    pub chat_template: Option<String>,
}
// ANCHOR_END: checkpoint

/// Whether `path` looks like a Hugging Face checkpoint: a directory with a `config.json`, or
/// that file itself.
pub fn is_checkpoint(path: &Path) -> bool {
    (path.is_dir() && path.join("config.json").is_file())
        || (path.file_name().is_some_and(|n| n == "config.json") && path.is_file())
}

impl Checkpoint {
    // ANCHOR: open
    /// Open the checkpoint in directory `path` (or the directory of `path`, a `config.json`).
    pub fn open(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let dir = if path.is_dir() {
            path.to_path_buf()
        } else {
            path.parent().unwrap_or(Path::new(".")).to_path_buf()
        };
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(bad(
                &dir,
                "no config.json: not a Hugging Face model directory",
            ));
        }
        let mut config = read_json(&config_path)?;
        // A model that also sees images keeps its language model's settings apart.
        if let Some(Json::Object(text)) = config.get("text_config").cloned() {
            let top = config.as_object_mut().expect("has a text_config key");
            top.extend(text);
        }
        let family = Family::of(&config).map_err(|e| bad(&config_path, e))?;
        let (paths, claims) = shard_paths(&dir)?;
        let shards = paths
            .iter()
            .map(|p| Shard::open(p))
            .collect::<Result<Vec<_>, _>>()?;
        // ANCHOR_END: open
        // ANCHOR: open_rest
        let mut tensors = BTreeMap::new();
        for (i, shard) in shards.iter().enumerate() {
            for (name, info) in &shard.tensors {
                let t = HfTensor {
                    shard: i,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                };
                if tensors.insert(name.clone(), t).is_some() {
                    return Err(bad(
                        &shard.path,
                        format!("tensor {name:?} is in two shards"),
                    ));
                }
            }
        }
        for (tensor, file) in &claims {
            let found = tensors.get(tensor).map(|t| shards[t.shard].path.as_path());
            if found != Some(file.as_path()) {
                let why = format!("weight_map: tensor {tensor:?} is not in {}", file.display());
                return Err(bad(&dir.join("model.safetensors.index.json"), why));
            }
        }
        let tokenizer_path = dir.join("tokenizer.json");
        if !tokenizer_path.is_file() {
            return Err(bad(
                &dir,
                "no tokenizer.json (the engine reads the tokenizer from it)",
            ));
        }
        let tokenizer = read_json(&tokenizer_path)?;
        let tokenizer_config = read_json_if(&dir.join("tokenizer_config.json"))?;
        let chat_template = chat_template(&dir, tokenizer_config.as_ref())?;
        Ok(Checkpoint {
            dir,
            config,
            family,
            shards,
            tensors,
            tokenizer,
            tokenizer_config,
            chat_template,
        })
    }
    // ANCHOR_END: open_rest

    /// The bytes of tensor `name`.
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        let t = self.tensors.get(name)?;
        let shard = &self.shards[t.shard];
        Some(shard.bytes(&shard.tensors[name]))
    }

    /// The file a tensor is in, for errors.
    pub fn file_of(&self, name: &str) -> &Path {
        match self.tensors.get(name) {
            Some(t) => &self.shards[t.shard].path,
            None => &self.dir,
        }
    }
}

/// The shards: those `model.safetensors.index.json` lists, with the tensors it says each
/// holds; else `model.safetensors`, else every `*.safetensors` in `dir`.
type Claims = Vec<(String, PathBuf)>;
fn shard_paths(dir: &Path) -> Result<(Vec<PathBuf>, Claims), CheckpointError> {
    let index_path = dir.join("model.safetensors.index.json");
    if index_path.is_file() {
        let index = read_json(&index_path)?;
        let map = index
            .get("weight_map")
            .and_then(Json::as_object)
            .ok_or_else(|| bad(&index_path, "weight_map: missing, or not an object"))?;
        let mut files = std::collections::BTreeSet::new();
        let mut claims = Vec::with_capacity(map.len());
        for (tensor, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| bad(&index_path, format!("weight_map.{tensor}: not a file name")))?;
            // A shard is a file beside the index, never a path elsewhere.
            if file.contains('/') || file.contains('\\') || file.starts_with('.') {
                let why = format!("weight_map.{tensor}: {file:?} is not a file in the directory");
                return Err(bad(&index_path, why));
            }
            files.insert(file);
            claims.push((tensor.clone(), dir.join(file)));
        }
        if files.len() > MAX_SHARDS {
            let why = format!("{} shards: more than {MAX_SHARDS}", files.len());
            return Err(bad(&index_path, why));
        }
        return Ok((files.into_iter().map(|f| dir.join(f)).collect(), claims));
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok((vec![single], Vec::new()));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| bad(dir, format!("cannot list: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors") && p.is_file())
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(bad(
            dir,
            "no model.safetensors, model.safetensors.index.json or *.safetensors",
        ));
    }
    if found.len() > MAX_SHARDS {
        return Err(bad(
            dir,
            format!("{} safetensors files: more than {MAX_SHARDS}", found.len()),
        ));
    }
    Ok((found, Vec::new()))
}

/// `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates of which
/// `default` is taken), else the file `chat_template.jinja` newer libraries write beside it.
fn chat_template(dir: &Path, config: Option<&Json>) -> Result<Option<String>, CheckpointError> {
    let file = dir.join("tokenizer_config.json");
    match config.and_then(|c| c.get("chat_template")) {
        None | Some(Json::Null) => {}
        Some(Json::String(s)) => return Ok(Some(s.clone())),
        Some(Json::Array(list)) => {
            let named = |n: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Json::as_str) == Some(n))
                    .and_then(|t| t.get("template").and_then(Json::as_str))
            };
            return match named("default") {
                Some(t) => Ok(Some(t.to_string())),
                None => Err(bad(
                    &file,
                    "chat_template: a list without a \"default\" template",
                )),
            };
        }
        Some(_) => return Err(bad(&file, "chat_template: neither a string nor a list")),
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        let len = std::fs::metadata(&jinja).map(|m| m.len()).unwrap_or(0);
        if len > MAX_JSON_BYTES {
            return Err(bad(
                &jinja,
                format!("{len} bytes: too large for a chat template"),
            ));
        }
        let text = std::fs::read_to_string(&jinja)
            .map_err(|e| bad(&jinja, format!("cannot read: {e}")))?;
        return Ok(Some(text));
    }
    Ok(None)
}

/// The family `config.json` names, for errors that list what is known.
pub fn known_families() -> String {
    FAMILIES
        .iter()
        .flat_map(|f| f.hf_architectures.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}
