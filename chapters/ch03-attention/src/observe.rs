//! Looking inside a forward pass, the way llama.cpp's eval callback (`cb_eval`) does.
//!
//! The forward pass reports its intermediate tensors by llama.cpp's graph names (`attn_norm-0`,
//! `Qcur-0`, `kq_soft_max-0`, `l_out-29`, `result_output`), so a test can put ours next to
//! llama.cpp's, name by name. Shapes are given outer to inner, tokens outermost, as in
//! `reference-data/`.

use std::collections::BTreeMap;

/// Receives intermediate tensors of a forward pass.
pub trait Observer {
    /// Whether anything is observed. When false, the forward pass skips building tensors that
    /// only an observer needs (the full attention-weight matrix, for one).
    fn enabled(&self) -> bool {
        true
    }
    /// `name` is llama.cpp's graph name with the layer (`Qcur-0`); `shape` is outer to inner.
    fn observe(&mut self, name: &str, shape: &[usize], data: &[f32]);
}

/// Observes nothing: the normal case.
pub struct NoObserver;

impl Observer for NoObserver {
    fn enabled(&self) -> bool {
        false
    }
    fn observe(&mut self, _: &str, _: &[usize], _: &[f32]) {}
}

/// Keeps a copy of every tensor it sees (or of those a filter accepts): for tests.
#[derive(Default)]
pub struct Recorder {
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    only: Option<Vec<String>>,
}

impl Recorder {
    /// Record everything.
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// Record only these names.
    pub fn only<S: AsRef<str>>(names: &[S]) -> Recorder {
        Recorder {
            tensors: BTreeMap::new(),
            only: Some(names.iter().map(|s| s.as_ref().to_string()).collect()),
        }
    }

    /// The recorded tensor `name`; panics with the recorded names if it is absent (tests only).
    pub fn get(&self, name: &str) -> (&[usize], &[f32]) {
        match self.tensors.get(name) {
            Some((s, d)) => (s, d),
            None => panic!(
                "no tensor {name:?} was observed; have {:?}",
                self.tensors.keys().collect::<Vec<_>>()
            ),
        }
    }
}

impl Observer for Recorder {
    fn observe(&mut self, name: &str, shape: &[usize], data: &[f32]) {
        if self
            .only
            .as_ref()
            .is_none_or(|o| o.iter().any(|n| n == name))
        {
            self.tensors
                .insert(name.to_string(), (shape.to_vec(), data.to_vec()));
        }
    }
}
