//! The model: embeddings, the stack of transformer blocks, the final norm and the output
//! projection, and a forward pass over a batch of tokens.

use crate::arch::{Architectures, Blocks, Ctx};
pub use crate::batch::Batch;
use crate::compute::{Compute, Scratch};
use crate::memory::{TooLarge, checked_bytes};
use ch01::{Config, GgufFile};
use ch03::attention::reserve_batch_with;
use ch03::matrix::{LoadError, Matrix, MatrixLoader, load_matrix, load_vector, matrix_bytes};
use ch03::{Attention, KvError, KvStore, Observer};
use std::fmt;
use std::sync::Arc;

/// The weights of the model's frame, around its blocks (which hold their own).
pub struct Weights {
    pub token_embd: Box<dyn Matrix>, // (vocab, d_model)
    pub output_norm: Vec<f32>,       // (d_model)
    /// `(vocab, d_model)`; `None` when the output projection is tied to `token_embd`.
    pub output: Option<Box<dyn Matrix>>,
}

/// A model ready to run: the frame (embeddings, final norm, output projection) around the
/// blocks of its architecture.
pub struct Model {
    pub config: Config,
    pub attention: Attention,
    pub weights: Weights,
    /// The architecture's blocks ([`crate::llama::Llama`] for a llama file).
    pub blocks: Box<dyn Blocks>,
    /// How the non-product work runs: the scalar reference unless a later chapter hands in
    /// its own ([`Model::with_compute`]).
    pub compute: Arc<dyn Compute>,
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
    /// The logits are NaN or infinite: the weights or hyperparameters are broken.
    NonFinite(NonFinite),
}

/// Logits that are not finite. Generation checks every row of logits it samples from (a cheap
/// scan of `vocab` values); only when that fails does [`NonFinite::locate`] run the sequence
/// again, observed, to find the first tensor of the forward pass that holds a NaN or an
/// infinity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonFinite {
    /// Generation step whose logits were not finite (0: the prompt's).
    pub step: usize,
    /// The sequence those logits were computed for: the prompt and the tokens before `step`.
    pub tokens: Vec<u32>,
    /// The first tensor (llama.cpp's name, with its layer) holding a non-finite value, once
    /// [`NonFinite::locate`] has looked.
    pub tensor: Option<String>,
}

impl NonFinite {
    /// `Err` if `logits` hold a NaN or an infinity.
    pub fn check(logits: &[f32], step: usize, tokens: &[u32]) -> Result<(), NonFinite> {
        if logits.iter().all(|x| x.is_finite()) {
            return Ok(());
        }
        Err(NonFinite {
            step,
            tokens: tokens.to_vec(),
            tensor: None,
        })
    }

    /// Find where the non-finite values first appear, by running `model` on the sequence
    /// again (without a cache, observing every tensor).
    pub fn locate(mut self, model: &Model) -> NonFinite {
        if self.tensor.is_none() {
            self.tensor = model.first_non_finite(&self.tokens);
        }
        self
    }
}

impl fmt::Display for NonFinite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the logits of generation step {} are not finite",
            self.step
        )?;
        if let Some(t) = &self.tensor {
            write!(f, "; the first NaN or infinity appears in tensor {t:?}")?;
        }
        write!(f, ": the model's weights or hyperparameters are broken")
    }
}

/// A context size the model cannot run with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContextError {
    /// 0, or more positions than the model was trained on (`context_length`).
    OutOfRange { n_ctx: usize, context_length: usize },
    /// The RoPE table or the KV cache for it would not fit in memory (or overflows).
    TooLarge(TooLarge),
}

impl fmt::Display for ContextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContextError::OutOfRange {
                n_ctx,
                context_length,
            } => write!(
                f,
                "a context of {n_ctx} positions: it must be between 1 and the model's \
                 {context_length} (context_length)"
            ),
            ContextError::TooLarge(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ContextError {}

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
            ForwardError::NonFinite(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ForwardError {}

impl ForwardError {
    /// `Err(TokenOutOfRange)` for the first of `tokens` that is not below `vocab`: what every
    /// forward pass checks before it looks anything up, whatever computes it.
    pub fn check_tokens(tokens: &[u32], vocab: usize) -> Result<(), ForwardError> {
        match tokens.iter().position(|&t| t as usize >= vocab) {
            Some(index) => Err(ForwardError::TokenOutOfRange {
                index,
                token: tokens[index],
                vocab,
            }),
            None => Ok(()),
        }
    }
}

impl From<KvError> for ForwardError {
    fn from(e: KvError) -> Self {
        ForwardError::Kv(e)
    }
}

impl From<NonFinite> for ForwardError {
    fn from(e: NonFinite) -> Self {
        ForwardError::NonFinite(e)
    }
}

/// Records the name of the first observed tensor that holds a NaN or an infinity.
struct FirstNonFinite(Option<String>);

impl Observer for FirstNonFinite {
    fn enabled(&self) -> bool {
        self.0.is_none()
    }
    fn observe(&mut self, name: &str, _shape: &[usize], data: &[f32]) {
        if self.0.is_none() && data.iter().any(|x| !x.is_finite()) {
            self.0 = Some(name.to_string());
        }
    }
}

/// Refuse a context of `n_ctx` positions that is out of range for `cfg`, or whose RoPE table
/// or f32 KV cache would not fit in memory.
pub fn check_context(cfg: &Config, n_ctx: usize) -> Result<(), ContextError> {
    if n_ctx == 0 || n_ctx > cfg.context_length {
        return Err(ContextError::OutOfRange {
            n_ctx,
            context_length: cfg.context_length,
        });
    }
    let f32_bytes = size_of::<f32>() as u64;
    let (n, layers) = (n_ctx as u64, cfg.n_layer as u64);
    checked_bytes(
        &format!("the RoPE table for a context of {n_ctx}"),
        &[
            ("positions", n),
            ("rotated dims", cfg.rope_dim as u64),
            ("bytes", f32_bytes),
        ],
    )
    .and_then(|_| {
        checked_bytes(
            &format!("the KV cache for a context of {n_ctx}"),
            &[
                ("layers", layers),
                ("positions", n),
                ("K and V", 2),
                ("kv width", cfg.kv_dim() as u64),
                ("bytes", f32_bytes),
            ],
        )
    })
    .map(|_| ())
    .map_err(ContextError::TooLarge)
}

impl Model {
    // ANCHOR: load
    /// Build the model of a GGUF file whose architecture is one of `archs`, each weight matrix
    /// made by `loader`: the architecture's loader reads the configuration and builds the
    /// blocks, and the frame is loaded around them.
    pub fn load<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
        archs: &Architectures,
    ) -> Result<Model, LoadError> {
        let arch = archs.of(&file.gguf)?;
        let (config, blocks) = (arch.load)(&file.borrowed(), loader)?;
        Model::assemble(file, loader, config, blocks)
    }

    /// The frame of the model — token embeddings, final norm, output projection (tied to the
    /// embeddings when the file has no `output.weight`), attention with its RoPE table — around
    /// `blocks`, for `config`.
    pub fn assemble<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
        config: Config,
        mut blocks: Box<dyn Blocks>,
    ) -> Result<Model, LoadError> {
        let (d, vocab) = (config.d_model, config.vocab_size);
        let weights = Weights {
            // Only looked up by row, unless it is the output projection too.
            token_embd: if config.tied_embeddings {
                load_matrix(file, loader, "token_embd.weight", d, vocab)?
            } else {
                let (info, bytes) = matrix_bytes(file, "token_embd.weight", d, vocab)?;
                loader.load_rows(&file.gguf, info, bytes)?
            },
            output_norm: load_vector(file, "output_norm.weight", d)?,
            output: if config.tied_embeddings {
                None
            } else {
                Some(load_matrix(file, loader, "output.weight", d, vocab)?)
            },
        };
        // After the weights, whose shapes have confirmed the widths the metadata states: the
        // RoPE table is sized by them and by the run's context, not by the file's claim.
        let n_ctx = config.default_context();
        check_context(&config, n_ctx).map_err(|e| LoadError::Other(e.to_string()))?;
        let attention = Attention::load(file, &config, n_ctx)?;
        blocks.set_context(&config, n_ctx)?;
        Ok(Model {
            config,
            attention,
            weights,
            blocks,
            compute: Arc::new(ch03::Scalar),
        })
    }
    // ANCHOR_END: load

    /// The same model with its non-product work run by `compute`.
    pub fn with_compute(mut self, compute: Arc<dyn Compute>) -> Model {
        self.compute = compute;
        self
    }

    /// The types of the weights, for diagnostics, as the blocks describe them.
    pub fn describe_weights(&self) -> String {
        self.blocks.describe()
    }

    /// The blocks as their concrete type `B` (e.g. [`crate::llama::Llama`]), if they are one.
    pub fn blocks_as<B: Blocks>(&self) -> Option<&B> {
        self.blocks.downcast_ref()
    }

    /// The output projection: `output.weight`, or the token embeddings when tied.
    pub fn output(&self) -> &dyn Matrix {
        self.weights
            .output
            .as_deref()
            .unwrap_or(&*self.weights.token_embd)
    }

    /// Positions this model runs: the length of its RoPE table. [`Config::default_context`]
    /// after loading; [`Model::set_context`] changes it.
    pub fn n_ctx(&self) -> usize {
        self.attention.rope.n_pos()
    }

    /// Run with a context of `n_ctx` positions (llama.cpp's `--ctx-size`): between 1 and the
    /// model's `context_length`, and small enough that its RoPE table and an f32 KV cache of
    /// that size fit in memory, checked before anything is allocated.
    pub fn set_context(&mut self, n_ctx: usize) -> Result<(), ContextError> {
        check_context(&self.config, n_ctx)?;
        if n_ctx != self.n_ctx() {
            self.attention.rope.resize(n_ctx);
            self.blocks
                .set_context(&self.config, n_ctx)
                .expect("the configuration was accepted when the model loaded");
        }
        Ok(())
    }

    /// The name of the first tensor of the forward pass over `tokens` that holds a NaN or an
    /// infinity (`None` if there is none, or the sequence cannot run).
    pub fn first_non_finite(&self, tokens: &[u32]) -> Option<String> {
        let mut obs = FirstNonFinite(None);
        let batch = Batch::sequence(0, tokens, 0, false);
        let logits = self.forward(&batch, &mut self.new_kv(), &mut obs).ok()?;
        obs.0.or_else(|| {
            let bad = logits.iter().any(|x| !x.is_finite());
            bad.then(|| "result_output".to_string())
        })
    }

    /// The logits of every position of `tokens`, one sequence in one batch on a fresh store:
    /// `(tokens.len(), vocab)` — what a teacher-forced check against a reference needs.
    pub fn logits_at_every_position(&self, tokens: &[u32]) -> Result<Vec<f32>, ForwardError> {
        self.logits_at_every_position_in(tokens, &mut self.new_kv())
    }

    /// [`Model::logits_at_every_position`] with the keys and values kept in `kv` (an empty
    /// store: sequence 0 from position 0).
    pub fn logits_at_every_position_in<K: KvStore>(
        &self,
        tokens: &[u32],
        kv: &mut K,
    ) -> Result<Vec<f32>, ForwardError> {
        self.logits_from_in(tokens, 0, kv)
    }

    /// The logits of positions `from..` of `tokens`, one sequence in one batch on a fresh
    /// store: `(tokens.len() - from, vocab)`. A teacher-forced check needs only the rows from
    /// the prompt's last token on, and the output projection is the largest product of a
    /// model with a large vocabulary.
    pub fn logits_from(&self, tokens: &[u32], from: usize) -> Result<Vec<f32>, ForwardError> {
        self.logits_from_in(tokens, from, &mut self.new_kv())
    }

    /// [`Model::logits_from`] with the keys and values kept in `kv` (an empty store: sequence
    /// 0 from position 0).
    pub fn logits_from_in<K: KvStore>(
        &self,
        tokens: &[u32],
        from: usize,
        kv: &mut K,
    ) -> Result<Vec<f32>, ForwardError> {
        let mut batch = Batch::sequence(0, tokens, 0, true);
        for (i, wanted) in batch.logits.iter_mut().enumerate() {
            *wanted = i >= from;
        }
        self.forward(&batch, kv, &mut ch03::NoObserver)
    }

    /// A fresh, empty store of keys and values that fits this model.
    pub fn new_kv(&self) -> ch03::VecKv {
        ch03::VecKv::new(self.config.n_layer, self.attention.kv_dim())
    }

    fn check(&self, batch: &Batch) -> Result<(), ForwardError> {
        ForwardError::check_tokens(&batch.tokens, self.config.vocab_size)?;
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

    /// Run the model on `batch`, keeping keys and values in `kv`. Returns the logits of the
    /// tokens whose `logits` flag is set, in batch order: `(n_out, vocab)`. Allocates its
    /// buffers: a session calls [`Model::forward_with`] with buffers it keeps.
    pub fn forward<K: KvStore>(
        &self,
        batch: &Batch,
        kv: &mut K,
        obs: &mut dyn Observer,
    ) -> Result<Vec<f32>, ForwardError> {
        let mut s = Scratch::default();
        self.forward_with(batch, kv, obs, &mut s)?;
        Ok(std::mem::take(&mut s.logits))
    }

    // ANCHOR: forward
    /// [`Model::forward`] with the activations in `s`: the logits are `s.logits` afterwards,
    /// and the returned slice. Once `s` has seen a batch this large, nothing is allocated.
    pub fn forward_with<'s, K: KvStore>(
        &self,
        batch: &Batch,
        kv: &mut K,
        obs: &mut dyn Observer,
        s: &'s mut Scratch,
    ) -> Result<&'s [f32], ForwardError> {
        self.check(batch)?;
        reserve_batch_with(kv, &batch.at, &mut s.attn.spans)?;
        let (n, d) = (batch.len(), self.config.d_model);

        s.x.resize(n * d, 0.0); // (n, d_model): the residual stream
        s.h.resize(n * d, 0.0); // (n, d_model): normalised input of a sub-block
        s.y.resize(n * d, 0.0); // (n, d_model): output of a sub-block
        for (row, &t) in s.x.chunks_exact_mut(d).zip(&batch.tokens) {
            self.weights.token_embd.get_row(t as usize, row);
        }
        if obs.enabled() {
            obs.observe("inp_embd", &[n, d], &s.x);
        }
        let ctx = Ctx {
            config: &self.config,
            attention: &self.attention,
            compute: &*self.compute,
        };
        self.blocks.forward(&ctx, batch, kv, obs, s);
        self.output_logits(batch, obs, s)
    }
    // ANCHOR_END: forward

    // ANCHOR: output
    /// The final norm and the output projection of the rows of `s.x` whose logits `batch`
    /// wants: `s.logits`, `(n_out, vocab)`.
    fn output_logits<'s>(
        &self,
        batch: &Batch,
        obs: &mut dyn Observer,
        s: &'s mut Scratch,
    ) -> Result<&'s [f32], ForwardError> {
        let (cfg, ops) = (&self.config, &*self.compute);
        let (n, d) = (batch.len(), cfg.d_model);
        // Only the rows whose logits are wanted go through the final norm and the output
        // projection, which is the largest matrix of this model (vocab × d_model).
        s.rows.clear();
        s.rows.extend((0..n).filter(|&i| batch.logits[i]));
        let n_out = s.rows.len();
        s.sel.clear(); // (n_out, d_model)
        for &i in &s.rows {
            s.sel.extend_from_slice(&s.x[i * d..(i + 1) * d]);
        }
        s.normed.resize(n_out * d, 0.0); // (n_out, d_model)
        ops.rms_norm(
            &s.sel,
            &self.weights.output_norm,
            cfg.rms_norm_eps,
            &mut s.normed,
        );
        s.logits.resize(n_out * cfg.vocab_size, 0.0); // (n_out, vocab)
        self.output().matmul(&s.normed, &mut s.logits);
        if let Some(cap) = cfg.final_logit_softcapping {
            softcap(&mut s.logits, cap);
        }
        // A NaN in the residual stream must reach the logits, where generation looks for it
        // (`NonFinite`); a quantized product could hide it, since quantizing activations to
        // Q8 turns NaN into 0. Checking d_model values per row costs nothing next to the
        // product.
        for (x, logits) in s
            .sel
            .chunks_exact(d)
            .zip(s.logits.chunks_exact_mut(cfg.vocab_size))
        {
            if x.iter().any(|v| !v.is_finite()) {
                logits.fill(f32::NAN);
            }
        }
        if obs.enabled() {
            obs.observe("result_norm", &[n_out, d], &s.normed);
            obs.observe("result_output", &[n_out, cfg.vocab_size], &s.logits);
        }
        Ok(&s.logits)
    }
    // ANCHOR_END: output
}

/// Each of `logits` made `cap·tanh(logit/cap)`: close to itself while small against `cap`,
/// never past `±cap` ([`Config::final_logit_softcapping`]).
pub fn softcap(logits: &mut [f32], cap: f32) {
    logits.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
}

#[cfg(test)]
mod tests {
    use super::{ForwardError, softcap};

    /// The cap keeps a small logit (nearly) as it is, bounds a large one by the cap, and keeps
    /// the order of any two: greedy picks the same token.
    #[test]
    fn a_soft_cap_bounds_large_logits_and_keeps_their_order() {
        let mut l = [0.0, 0.5, -0.5, 30.0, -30.0, 1000.0, 29.0];
        softcap(&mut l, 30.0);
        assert_eq!(l[0], 0.0);
        assert!(
            (l[1] - 0.5).abs() < 1e-3 && (l[2] + 0.5).abs() < 1e-3,
            "{l:?}"
        );
        assert!((l[3] - 30.0 * 1f32.tanh()).abs() < 1e-4, "{l:?}");
        assert!(
            l[5] <= 30.0 && l[5] > l[3] && l[3] > l[6] && l[4] == -l[3],
            "{l:?}"
        );
    }

    #[test]
    fn the_first_token_outside_the_vocabulary_is_named() {
        assert_eq!(ForwardError::check_tokens(&[0, 8, 3], 9), Ok(()));
        assert_eq!(ForwardError::check_tokens(&[], 0), Ok(()));
        assert_eq!(
            ForwardError::check_tokens(&[1, 9, 12], 9),
            Err(ForwardError::TokenOutOfRange {
                index: 1,
                token: 9,
                vocab: 9
            })
        );
    }
}
