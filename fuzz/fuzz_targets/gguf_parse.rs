//! Any bytes as a GGUF file: `Gguf::parse` never panics; a rejected file gets a parse error
//! that says at which byte; an accepted file keeps the promises the rest of the engine relies
//! on (the checks of ch01's `tests/fuzz.rs`, here with coverage guiding the inputs).

#![no_main]

use ch01::{Gguf, GgufError, GgufFile};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    match Gguf::parse(bytes) {
        Ok(_) => check_accepted(bytes),
        Err(e) => {
            let pe = e
                .parse_error()
                .expect("Gguf::parse returns parse errors only");
            let lead = format!("at byte {}", pe.offset);
            assert!(e.to_string().starts_with(&lead), "{e}");
        }
    }
});

fn check_accepted(bytes: &[u8]) {
    let file = GgufFile::from_bytes(bytes).expect("parsed once, parses again");
    assert!(file.data_offset <= bytes.len() as u64 || file.tensors.is_empty());
    assert!(file.alignment.is_power_of_two());
    for t in &file.tensors {
        assert!(t.dims.len() <= 4);
        assert_eq!(t.offset % file.alignment, 0, "{}", t.name);
        let data = file
            .tensor_bytes(&t.name)
            .expect("accepted tensors lie in the file");
        assert_eq!(data.len() as u64, t.n_bytes());
        match file.tensor_f32(&t.name) {
            Ok(v) => assert_eq!(v.len() as u64, t.n_elements()),
            Err(GgufError::Dequant { .. }) => {}
            Err(e) => panic!("unexpected error for an accepted tensor: {e}"),
        }
    }
}
