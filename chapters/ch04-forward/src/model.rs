//! The model: embeddings, the stack of transformer blocks, the final norm and the output
//! projection, and a forward pass over a batch of tokens.

use crate::layer::{LayerWeights, rms_norm};
use ch03::attention::reserve_batch;
use ch03::matrix::{LoadError, Matrix, MatrixLoader, load_matrix, load_vector};
use ch03::{Attention, Config, GgufFile, KvError, KvStore, Observer, TokenPos};
use std::fmt;

/// All weights of a llama model.
pub struct Weights {
    pub token_embd: Box<dyn Matrix>, // (vocab, d_model)
    pub layers: Vec<LayerWeights>,   // n_layer
    pub output_norm: Vec<f32>,       // (d_model)
    /// `(vocab, d_model)`; `None` when the output projection is tied to `token_embd`.
    pub output: Option<Box<dyn Matrix>>,
}

/// A llama model ready to run.
pub struct Model {
    pub config: Config,
    pub attention: Attention,
    pub weights: Weights,
}

/// The tokens of one forward pass: which sequence each belongs to, at which position, and
/// whether its logits are wanted. This is llama.cpp's `llama_batch`. Until chapter 7 a batch
/// holds one sequence.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub at: Vec<TokenPos>,
    pub logits: Vec<bool>,
}

impl Batch {
    /// `tokens` of sequence `seq` at positions `start..`, with logits for the last token only
    /// (or for every token when `all_logits`).
    pub fn sequence(seq: usize, tokens: &[u32], start: usize, all_logits: bool) -> Batch {
        let n = tokens.len();
        Batch {
            tokens: tokens.to_vec(),
            at: TokenPos::run(seq, start, n),
            logits: (0..n).map(|i| all_logits || i + 1 == n).collect(),
        }
    }

    /// Append one token.
    pub fn push(&mut self, token: u32, seq: usize, pos: usize, logits: bool) {
        self.tokens.push(token);
        self.at.push(TokenPos { seq, pos });
        self.logits.push(logits);
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Why a forward pass did not run. It checks everything before computing, so nothing is
/// half-done when it fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardError {
    /// A token id is not in the vocabulary.
    TokenOutOfRange {
        index: usize,
        token: u32,
        vocab: usize,
    },
    /// A position is beyond what the model's RoPE table covers.
    PositionOutOfRange {
        index: usize,
        pos: usize,
        max: usize,
    },
    /// The KV store has no room.
    Kv(KvError),
}

impl fmt::Display for ForwardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForwardError::TokenOutOfRange {
                index,
                token,
                vocab,
            } => {
                write!(
                    f,
                    "token {token} at batch index {index} is not below the vocabulary size {vocab}"
                )
            }
            ForwardError::PositionOutOfRange { index, pos, max } => write!(
                f,
                "position {pos} at batch index {index} is beyond the model's context of {max} positions"
            ),
            ForwardError::Kv(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ForwardError {}

impl From<KvError> for ForwardError {
    fn from(e: KvError) -> Self {
        ForwardError::Kv(e)
    }
}

impl Model {
    /// Build the model from a GGUF file, each weight matrix made by `loader`.
    pub fn load<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
    ) -> Result<Model, LoadError> {
        let config = Config::from_gguf(&file.gguf).map_err(|e| LoadError::Other(e.to_string()))?;
        let attention = Attention::new(&config)?;
        let (d, vocab) = (config.d_model, config.vocab_size);
        let layers = (0..config.n_layer)
            .map(|l| LayerWeights::load(file, loader, &config, l))
            .collect::<Result<Vec<_>, _>>()?;
        let weights = Weights {
            token_embd: load_matrix(file, loader, "token_embd.weight", d, vocab)?,
            layers,
            output_norm: load_vector(file, "output_norm.weight", d)?,
            output: if config.tied_embeddings {
                None
            } else {
                Some(load_matrix(file, loader, "output.weight", d, vocab)?)
            },
        };
        Ok(Model {
            config,
            attention,
            weights,
        })
    }

    /// The output projection: `output.weight`, or the token embeddings when tied.
    pub fn output(&self) -> &dyn Matrix {
        self.weights
            .output
            .as_deref()
            .unwrap_or(&*self.weights.token_embd)
    }

    /// A fresh, empty store of keys and values that fits this model.
    pub fn new_kv(&self) -> ch03::VecKv {
        ch03::VecKv::new(self.config.n_layer, self.attention.kv_dim())
    }

    fn check(&self, batch: &Batch) -> Result<(), ForwardError> {
        let vocab = self.config.vocab_size;
        if let Some((index, &token)) = batch
            .tokens
            .iter()
            .enumerate()
            .find(|(_, t)| **t as usize >= vocab)
        {
            return Err(ForwardError::TokenOutOfRange {
                index,
                token,
                vocab,
            });
        }
        let max = self.attention.rope.n_pos();
        if let Some((index, t)) = batch.at.iter().enumerate().find(|(_, t)| t.pos >= max) {
            return Err(ForwardError::PositionOutOfRange {
                index,
                pos: t.pos,
                max,
            });
        }
        Ok(())
    }

    // ANCHOR: forward
    /// Run the model on `batch`, keeping keys and values in `kv`. Returns the logits of the
    /// tokens whose `logits` flag is set, in batch order: `(n_out, vocab)`.
    pub fn forward<K: KvStore>(
        &self,
        batch: &Batch,
        kv: &mut K,
        obs: &mut dyn Observer,
    ) -> Result<Vec<f32>, ForwardError> {
        self.check(batch)?;
        reserve_batch(kv, &batch.at)?;
        let cfg = &self.config;
        let (n, d) = (batch.len(), cfg.d_model);

        let mut x = vec![0.0; n * d]; // (n, d_model): the residual stream
        for (row, &t) in x.chunks_exact_mut(d).zip(&batch.tokens) {
            self.weights.token_embd.get_row(t as usize, row);
        }
        let mut h = vec![0.0; n * d]; // (n, d_model): normalised input of a sub-block
        let mut y = vec![0.0; n * d]; // (n, d_model): output of a sub-block
        for (l, w) in self.weights.layers.iter().enumerate() {
            rms_norm(&x, &w.attn_norm, cfg.rms_norm_eps, &mut h);
            if obs.enabled() {
                obs.observe(&format!("attn_norm-{l}"), &[n, d], &h);
            }
            self.attention
                .forward(&w.attn, l, &h, &batch.at, kv, obs, &mut y);
            add(&mut x, &y); // residual connection
            if obs.enabled() {
                obs.observe(&format!("ffn_inp-{l}"), &[n, d], &x);
            }
            rms_norm(&x, &w.ffn_norm, cfg.rms_norm_eps, &mut h);
            if obs.enabled() {
                obs.observe(&format!("ffn_norm-{l}"), &[n, d], &h);
            }
            w.ffn.forward(l, &h, obs, &mut y);
            if obs.enabled() {
                obs.observe(&format!("ffn_out-{l}"), &[n, d], &y);
            }
            add(&mut x, &y); // residual connection
            if obs.enabled() {
                obs.observe(&format!("l_out-{l}"), &[n, d], &x);
            }
        }

        // Only the rows whose logits are wanted go through the final norm and the output
        // projection, which is the largest matrix of this model (vocab × d_model).
        let rows: Vec<usize> = (0..n).filter(|&i| batch.logits[i]).collect();
        let mut sel = Vec::with_capacity(rows.len() * d); // (n_out, d_model)
        for &i in &rows {
            sel.extend_from_slice(&x[i * d..(i + 1) * d]);
        }
        let mut normed = vec![0.0; sel.len()]; // (n_out, d_model)
        rms_norm(
            &sel,
            &self.weights.output_norm,
            cfg.rms_norm_eps,
            &mut normed,
        );
        let mut logits = vec![0.0; rows.len() * cfg.vocab_size]; // (n_out, vocab)
        self.output().matmul(&normed, &mut logits);
        if obs.enabled() {
            obs.observe("result_norm", &[rows.len(), d], &normed);
            obs.observe("result_output", &[rows.len(), cfg.vocab_size], &logits);
        }
        Ok(logits)
    }
    // ANCHOR_END: forward
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
