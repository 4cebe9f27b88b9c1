//! A bad file through the mapped path is an error naming the file and the byte offset, never a
//! crash: parsing checks every tensor against the length of the map before any tensor page is
//! touched, so a truncated file cannot raise SIGBUS (the test process would die if it did).

use ch01::{Gguf, GgufFile};
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::engine::{Engine, LoadMode};
use ch10::{MapOptions, OpenError, ViewLoader, map_gguf, read_gguf};
use std::fs::{File, OpenOptions};
use std::path::Path;

/// Chapter 8's matrices over the file's own rows (no repacking), on one thread.
fn fast() -> FastLoader {
    let mut f = FastLoader::new(new_pool(PoolKind::Spin, 1));
    f.pack = false;
    f
}

/// Both ways of opening `path` must fail; returns the mapped error, after checking that the
/// message names the file and that reading gives the same message.
#[track_caller]
fn open_err(path: &Path) -> OpenError {
    let mapped = match map_gguf(path, &MapOptions::default()) {
        Ok(_) => panic!("{} opened through the map", path.display()),
        Err(e) => e,
    };
    let read = match read_gguf(path) {
        Ok(_) => panic!("{} opened by reading", path.display()),
        Err(e) => e,
    };
    let msg = mapped.to_string();
    assert!(msg.starts_with(&path.display().to_string()), "{msg}");
    assert_eq!(msg, read.to_string());
    mapped
}

/// The parse error's offset, after checking that the message gives it.
#[track_caller]
fn offset(e: &OpenError) -> u64 {
    let OpenError::Gguf(g) = e else {
        panic!("not a GGUF error: {e}")
    };
    let pe = g.parse_error().expect("a parse error");
    assert!(
        e.to_string().contains(&format!("at byte {}", pe.offset)),
        "{e}"
    );
    pe.offset
}

#[test]
fn a_truncated_model_is_an_error_naming_file_and_offset() {
    let model = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let full = std::fs::read(&model).unwrap();
    let gguf = Gguf::parse(&full).unwrap();
    let len = full.len() as u64;
    let data = gguf.data_offset;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    std::fs::write(&path, &full).unwrap();
    // Cuts in the magic, the counts, the metadata, the tensor infos, the padding before the
    // data, and the data section (first tensor, middle, last byte), largest first so one file
    // is shortened in place.
    let mut cuts = vec![
        len - 1,
        len / 2,
        data + 1,
        data,
        data - 1,
        data / 2,
        1000,
        24,
        9,
        3,
    ];
    cuts.sort_unstable_by(|a, b| b.cmp(a));
    for cut in cuts {
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let e = open_err(&path);
        let at = offset(&e);
        let msg = e.to_string();
        assert!(at <= cut.max(data), "cut at {cut}: {msg}");
        if cut >= data {
            // The header is whole: the error names a tensor that no longer fits.
            assert!(
                msg.contains("(tensor") && msg.contains("lie outside"),
                "cut at {cut}: {msg}"
            );
        } else {
            assert!(
                msg.contains("file ends inside")
                    || msg.contains("exceeds")
                    || msg.contains("past the end")
                    || msg.contains("cannot fit"),
                "cut at {cut}: {msg}"
            );
        }
        // The engine says the same, and names the file.
        let err = Engine::load(
            &path,
            LoadMode::Map(MapOptions::default()),
            fast(),
            &ch04::architectures(),
        )
        .err()
        .expect("a truncated model loaded");
        assert_eq!(err.to_string(), msg);
    }
}

#[test]
fn an_empty_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.gguf");
    File::create(&path).unwrap();
    let e = open_err(&path);
    assert_eq!(offset(&e), 0);
    assert!(e.to_string().contains("file ends inside the magic"), "{e}");
}

#[test]
fn a_file_that_is_not_gguf_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    // A safetensors header, as a user might pass the wrong download.
    let path = dir.path().join("model.safetensors");
    let header = br#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(&[0; 4]);
    std::fs::write(&path, &bytes).unwrap();
    let e = open_err(&path);
    assert_eq!(offset(&e), 0);
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
}

#[test]
fn a_missing_file_or_a_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such.gguf");
    let e = open_err(&missing);
    assert!(e.to_string().contains("cannot open"), "{e}");
    let e = map_gguf(dir.path(), &MapOptions::default())
        .err()
        .expect("a directory mapped");
    assert!(
        e.to_string().starts_with(&dir.path().display().to_string()),
        "{e}"
    );
}

#[test]
fn a_loader_rejects_bytes_from_another_file() {
    let model = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let (_, bytes) = map_gguf(&model, &MapOptions::default()).unwrap();
    let loader = ViewLoader::new(bytes, fast());
    let other = GgufFile::open(&model).unwrap();
    let e = ch04::Model::load(&other, &loader, &ch04::architectures())
        .err()
        .expect("a loader took another file's bytes");
    assert!(e.to_string().contains("not this loader's file"), "{e}");
}
