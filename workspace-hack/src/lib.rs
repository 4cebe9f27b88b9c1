//! No code: this package only lists dependencies with features (see its `Cargo.toml`).
