//! Any bytes as a GGUF file, then its metadata as a model configuration:
//! `Config::from_gguf` never panics, and a configuration it accepts can be used to size the
//! model's buffers without overflow.

#![no_main]

use ch01::{Config, Gguf};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(gguf) = Gguf::parse(bytes) else {
        return;
    };
    let Ok(c) = Config::from_gguf(&gguf) else {
        return;
    };
    for n in [
        c.n_layer,
        c.d_model,
        c.n_head,
        c.n_head_kv,
        c.head_dim,
        c.n_ff,
    ] {
        assert!(n >= 1, "{c:?}");
    }
    assert_eq!(c.n_head % c.n_head_kv, 0, "{c:?}");
    assert!(c.rope_dim == c.head_dim && c.rope_dim % 2 == 0, "{c:?}");
    let _ = (c.n_group(), c.kv_dim());
    let _ = c.to_string();
});
