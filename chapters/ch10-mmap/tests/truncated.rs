//! A model file changed while it is mapped: `check_unchanged` says what changed, and on Linux a
//! read past the end of a truncated file ends the process with a message naming the file and
//! exit status 1, while a bus error anywhere else still crashes as it would without the handler.
//!
//! The bus errors happen in a child process: the test binary runs itself again with
//! [`CHILD_ENV`] naming what the child does, and only the test that spawned it.

use ch10::{FileChanged, MapOptions, map_gguf};
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Set in a child's environment: `mapped` or `unmapped` (which file the child reads past the
/// end of), a space, and the path of the model copy.
const CHILD_ENV: &str = "LLM_RS_TRUNCATED_TEST_CHILD";

/// How long a child may take: it maps a 100 MB file and reads one page.
const CHILD_TIMEOUT: Duration = Duration::from_secs(120);

/// The start of the message the bus-error handler writes for a mapped model file.
fn handler_message(path: &Path) -> String {
    format!(
        "error: {}: the model file changed or was truncated while mapped",
        path.display()
    )
}

/// A private copy of the default model, which a test may truncate.
fn copy_of_model(dir: &Path) -> PathBuf {
    let from = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let to = dir.join("model.gguf");
    fs::copy(&from, &to)
        .unwrap_or_else(|e| panic!("cannot copy {} to {}: {e}", from.display(), to.display()));
    to
}

/// Cut the file at `path` to `len` bytes.
fn truncate(path: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(len))
        .unwrap_or_else(|e| panic!("cannot truncate {}: {e}", path.display()));
}

#[test]
fn check_unchanged_reports_a_truncation_with_both_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of_model(dir.path());
    let (_file, bytes) = map_gguf(&path, &MapOptions::default()).unwrap();
    let mapped = bytes.owner();
    mapped.check_unchanged().unwrap();
    let len = mapped.mapped_len();
    assert_eq!(len, fs::metadata(&path).unwrap().len());

    // Nothing past the new end is read: that would be a bus error (the next test's subject).
    truncate(&path, len / 2);
    let e = mapped.check_unchanged().unwrap_err();
    match &e {
        FileChanged::Size {
            path: p,
            mapped,
            now,
        } => {
            assert_eq!((p, *mapped, *now), (&path, len, len / 2), "{e}");
        }
        other => panic!("a truncation reported as {other:?}"),
    }
    let msg = e.to_string();
    for part in [
        path.display().to_string(),
        format!("from {len} to {} bytes", len / 2),
        "--no-mmap".to_string(),
    ] {
        assert!(msg.contains(&part), "{msg:?} does not say {part:?}");
    }
}

#[test]
fn check_unchanged_reports_a_rewrite_of_the_same_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of_model(dir.path());
    let (_file, bytes) = map_gguf(&path, &MapOptions::default()).unwrap();
    let mapped = bytes.owner();
    // A rewrite in place leaves the size and moves the modification time. (Set explicitly:
    // a write in the same clock tick as the copy could leave the time as it was.)
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    let was = file.metadata().unwrap().modified().unwrap();
    file.set_modified(was + Duration::from_secs(5)).unwrap();
    let e = mapped.check_unchanged().unwrap_err();
    assert!(
        matches!(&e, FileChanged::Modified { path: p, .. } if p == &path),
        "a rewrite reported as {e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("5.000 s later") && msg.contains(&path.display().to_string()),
        "{msg}"
    );
}

#[test]
fn a_file_replaced_by_rename_is_not_a_change_to_the_map() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of_model(dir.path());
    let (_file, bytes) = map_gguf(&path, &MapOptions::default()).unwrap();
    // The safe way to update a model: a new file renamed over the path. The map keeps the old
    // file, which did not change.
    let other = dir.path().join("other.gguf");
    fs::write(&other, b"not the model").unwrap();
    fs::rename(&other, &path).unwrap();
    bytes.owner().check_unchanged().unwrap();
}

/// Run this test binary again as a child doing `what` to the model copy at `path`, with only
/// the test `name`; wait for it at most [`CHILD_TIMEOUT`]. Returns its status and stderr.
#[cfg(target_os = "linux")]
fn run_child(name: &str, what: &str, path: &Path) -> (std::process::ExitStatus, String) {
    use std::process::{Command, Stdio};
    use std::time::Instant;
    let stderr_path = path.with_extension("stderr");
    let stderr = fs::File::create(&stderr_path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{what} {}", path.display()))
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > CHILD_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the child ({what}) ran for more than {CHILD_TIMEOUT:?}; its stderr:\n{}",
                fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, fs::read_to_string(&stderr_path).unwrap())
}

/// The child's part: map the model copy, truncate a file, read a byte past its new end.
/// `mapped`: the model itself; `unmapped`: another file mapped directly with memmap2, which
/// the handler knows nothing of. Either way, the read should never return.
#[cfg(target_os = "linux")]
fn child(what: &str, path: &Path) -> ! {
    // No core file from the crash the `unmapped` child is meant to have.
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads a valid `rlimit`; lowering the core limit has no other effect.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };

    let (_file, bytes) = map_gguf(path, &MapOptions::default()).unwrap();
    let byte = match what {
        "mapped" => {
            let last = bytes.as_ref().len() - 1;
            truncate(path, 4096);
            std::hint::black_box(bytes.as_ref())[last]
        }
        "unmapped" => {
            let other = path.with_extension("other");
            fs::write(&other, vec![7u8; 1 << 20]).unwrap();
            let file = fs::File::open(&other).unwrap();
            // SAFETY: a file of this test's own, truncated below on purpose: the read past its
            // new end raises SIGBUS and never returns a value.
            let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
            truncate(&other, 4096);
            std::hint::black_box(&map[..])[map.len() - 1]
        }
        _ => panic!("{CHILD_ENV}: unknown child {what:?}"),
    };
    eprintln!("read byte {byte} past the truncated end of the file without a bus error");
    std::process::exit(3)
}

/// The child's instructions, if this process is one.
#[cfg(target_os = "linux")]
fn child_task() -> Option<(String, PathBuf)> {
    let v = std::env::var(CHILD_ENV).ok()?;
    let (what, path) = v
        .split_once(' ')
        .unwrap_or_else(|| panic!("{CHILD_ENV}={v:?}: expected `WHAT PATH`"));
    Some((what.to_string(), PathBuf::from(path)))
}

#[cfg(target_os = "linux")]
#[test]
fn a_read_past_the_end_of_a_truncated_mapped_file_exits_with_a_message() {
    const NAME: &str = "a_read_past_the_end_of_a_truncated_mapped_file_exits_with_a_message";
    if let Some((what, path)) = child_task() {
        child(&what, &path);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of_model(dir.path());
    let (status, stderr) = run_child(NAME, "mapped", &path);
    assert_eq!(status.code(), Some(1), "child: {status}; stderr:\n{stderr}");
    assert!(
        stderr.contains(&handler_message(&path)) && stderr.contains("--no-mmap"),
        "child stderr:\n{stderr}"
    );
}

#[cfg(target_os = "linux")]
#[test]
fn a_bus_error_outside_the_mapped_files_still_crashes() {
    use std::os::unix::process::ExitStatusExt;
    const NAME: &str = "a_bus_error_outside_the_mapped_files_still_crashes";
    if let Some((what, path)) = child_task() {
        child(&what, &path);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of_model(dir.path());
    let (status, stderr) = run_child(NAME, "unmapped", &path);
    assert_eq!(
        status.signal(),
        Some(libc::SIGBUS),
        "child: {status}; stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("changed or was truncated while mapped"),
        "child stderr:\n{stderr}"
    );
}
