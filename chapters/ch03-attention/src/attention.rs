//! Scaled dot-product attention, multi-head and grouped-query, with a causal mask.
//!
//! For one query vector `q` and the keys `k_j` and values `v_j` of the positions it may see,
//!
//! ```text
//! s_j = (q · k_j) / sqrt(head_dim)      scores
//! p   = softmax(s)                      attention weights, summing to 1
//! o   = Σ_j p_j v_j                     the head's output
//! ```
//!
//! Each of the `n_head` query heads does this with its own slice of `q`. With grouped-query
//! attention there are fewer key/value heads than query heads: SmolLM2 has 9 query heads and 3
//! KV heads, so query heads 0–2 read KV head 0, 3–5 KV head 1, 6–8 KV head 2. The KV cache is
//! three times smaller than with one KV head per query head.

use crate::kv::{KvDyn, KvError, KvStore, KvView};
use crate::matrix::{LoadError, Matrix, MatrixLoader, load_matrix, load_vector};
use crate::observe::Observer;
use crate::ops::{AttentionOps, AttnScratch, Scalar};
use crate::rope::{RopeScale, RopeTable};
use ch01::config::RopeScalingType;
use ch01::{Config, GgufFile};

// ANCHOR: softmax
/// Softmax in place, numerically stable: subtracting the maximum first keeps every `exp` in
/// `(0, 1]`, so nothing overflows, and the result is unchanged because softmax is invariant to
/// shifting all inputs. The sum is accumulated in f64, as ggml does.
pub fn softmax(x: &mut [f32]) {
    // ANCHOR: yours_softmax
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
    // ANCHOR_END: yours_softmax
}
// ANCHOR_END: softmax

/// Where a token of a batch sits: its sequence and its position in that sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenPos {
    pub seq: usize,
    pub pos: usize,
}

impl TokenPos {
    /// Positions `start..start + n` of sequence `seq`.
    pub fn run(seq: usize, start: usize, n: usize) -> Vec<TokenPos> {
        (start..start + n)
            .map(|pos| TokenPos { seq, pos })
            .collect()
    }

    /// The runs of consecutive tokens of one sequence in `tokens`, in order: each as its
    /// sequence and its range of indices. A prompt is one run; chapter 7's batches have one
    /// per sequence.
    pub fn seq_runs(
        tokens: &[TokenPos],
    ) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + '_ {
        let mut i = 0;
        std::iter::from_fn(move || {
            let seq = tokens.get(i)?.seq;
            let j = i + tokens[i..].iter().take_while(|t| t.seq == seq).count();
            let run = (seq, i..j);
            i = j;
            Some(run)
        })
    }
}

/// The hyperparameters of attention and the RoPE table, shared by every layer.
pub struct Attention {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope: RopeTable,
    /// Sliding-window attention: a query sees at most this many positions, itself included.
    pub window: Option<usize>,
    /// The factor on every score `q · k`: `1/√head_dim` ([`Attention::standard_scale`]) unless
    /// the configuration says otherwise ([`Config::attention_scale`]).
    pub kq_scale: f32,
}

impl Attention {
    /// From the model configuration, with a RoPE table for positions `0..n_ctx`: the context
    /// a run holds, which the caller has checked (it is not the file's `context_length`, which
    /// a file may set to anything).
    pub fn new(cfg: &Config, n_ctx: usize) -> Result<Attention, LoadError> {
        let scale = Attention::rope_scale(cfg, None)?;
        Ok(Attention::with_rope(cfg, scale, n_ctx))
    }

    /// [`Attention::new`] for a model file, which may carry RoPE frequency factors
    /// (`rope_freqs.weight`, Llama 3).
    pub fn load<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        cfg: &Config,
        n_ctx: usize,
    ) -> Result<Attention, LoadError> {
        let name = "rope_freqs.weight";
        let factors = match file.gguf.tensor(name) {
            None => None,
            Some(_) => {
                let f = load_vector(file, name, cfg.rope_dim / 2)?;
                // Each divides an angle: zero or negative would give infinities or reversals.
                if let Some((i, v)) = f.iter().enumerate().find(|(_, v)| **v <= 0.0) {
                    return Err(LoadError::Other(format!(
                        "tensor {name:?} holds {v} at index {i}: frequency factors must be positive"
                    )));
                }
                Some(f)
            }
        };
        let scale = Attention::rope_scale(cfg, factors)?;
        Ok(Attention::with_rope(cfg, scale, n_ctx))
    }

    /// The position scaling `cfg` asks for, with `freq_factors` (`rope_dim / 2` of them) if
    /// the file has them.
    pub fn rope_scale(
        cfg: &Config,
        freq_factors: Option<Vec<f32>>,
    ) -> Result<RopeScale, LoadError> {
        let mut scale = match &cfg.rope_scaling {
            None => RopeScale::linear(1.0),
            Some(s) => match s.kind {
                RopeScalingType::Linear => RopeScale::linear(1.0 / s.factor),
                RopeScalingType::Yarn => RopeScale::yarn(
                    cfg.rope_dim,
                    cfg.rope_freq_base,
                    s.factor,
                    s.original_context,
                ),
                RopeScalingType::LongRope => {
                    return Err(LoadError::Other(
                        "RoPE scaling LongRope is not supported (only linear and YaRN)".into(),
                    ));
                }
            },
        };
        scale.attn_factor *= cfg.rope_attn_factor;
        scale.freq_factors = freq_factors;
        Ok(scale)
    }

    fn with_rope(cfg: &Config, scale: RopeScale, n_ctx: usize) -> Attention {
        let base = cfg.rope_freq_base;
        let rope = RopeTable::scaled(cfg.rope_dim, base, cfg.rope_style, scale, n_ctx);
        Attention {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
            rope,
            window: None,
            kq_scale: cfg
                .attention_scale
                .unwrap_or_else(|| Attention::standard_scale(cfg.head_dim)),
        }
    }

    /// `1/√head_dim`: scores of unit-variance queries and keys keep unit variance.
    pub fn standard_scale(head_dim: usize) -> f32 {
        1.0 / (head_dim as f32).sqrt()
    }

    /// Width of a query row `(n_head * head_dim)` and of a key or value row `(n_head_kv * head_dim)`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// The positions a query at `pos` may attend to: causal (nothing after `pos`), limited by
    /// the sliding window and by what the store still holds.
    pub fn visible(&self, pos: usize, first_stored: usize) -> std::ops::Range<usize> {
        let lo = self.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        lo.max(first_stored)..pos + 1
    }

    // ANCHOR: attend
    /// Attention of one token's queries `q` (`(n_head, head_dim)`) over positions `visible` of
    /// `kv`, written to `out` (`(n_head, head_dim)`). `probs` (`(n_head, visible.len())`) is
    /// scratch space and holds the attention weights afterwards.
    pub fn attend(
        &self,
        q: &[f32],
        kv: &(impl KvView + ?Sized),
        visible: std::ops::Range<usize>,
        probs: &mut [f32],
        out: &mut [f32],
    ) {
        // ANCHOR: yours_attend
        let (hd, kvd) = (self.head_dim, self.kv_dim());
        let group = self.n_head / self.n_head_kv; // query heads per KV head
        let scale = self.kq_scale; // 1/√head_dim, unless the file says otherwise
        let n = visible.len();
        out.fill(0.0);
        for h in 0..self.n_head {
            let head = (h / group) * hd..(h / group + 1) * hd; // its KV head's part of a row
            let q_h = &q[h * hd..(h + 1) * hd];
            let p = &mut probs[h * n..(h + 1) * n];
            for (j, pos) in visible.clone().enumerate() {
                p[j] = kv.key(pos).dot(kvd, 0, head.clone(), q_h) * scale;
            }
            softmax(p);
            let o = &mut out[h * hd..(h + 1) * hd];
            for (j, pos) in visible.clone().enumerate() {
                kv.value(pos).axpy(kvd, 0, head.clone(), p[j], o);
            }
        }
        // ANCHOR_END: yours_attend
    }
    // ANCHOR_END: attend
}

/// The four projections of one layer's attention block.
pub struct AttentionWeights {
    pub wq: Box<dyn Matrix>, // (n_head * head_dim, d_model)
    pub wk: Box<dyn Matrix>, // (n_head_kv * head_dim, d_model)
    pub wv: Box<dyn Matrix>, // (n_head_kv * head_dim, d_model)
    pub wo: Box<dyn Matrix>, // (d_model, n_head * head_dim)
    /// Biases some files add to the projections (Qwen2 on Q, K and V).
    pub bias: AttnBias,
}

/// Optional biases of the attention projections (`blk.N.attn_{q,k,v,output}.bias`), added to
/// every row of the product.
#[derive(Debug, Clone, Default)]
pub struct AttnBias {
    pub q: Option<Vec<f32>>, // (n_head * head_dim)
    pub k: Option<Vec<f32>>, // (n_head_kv * head_dim)
    pub v: Option<Vec<f32>>, // (n_head_kv * head_dim)
    pub o: Option<Vec<f32>>, // (d_model)
}

impl AttnBias {
    /// Layer `layer`'s biases, those the file has.
    pub fn load<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        cfg: &Config,
        layer: usize,
    ) -> Result<AttnBias, LoadError> {
        let (d, q, kv) = (cfg.d_model, cfg.n_head * cfg.head_dim, cfg.kv_dim());
        let bias = |t: &str, n: usize| {
            let name = format!("blk.{layer}.{t}.bias");
            match file.gguf.tensor(&name) {
                None => Ok(None),
                Some(_) => load_vector(file, &name, n).map(Some),
            }
        };
        Ok(AttnBias {
            q: bias("attn_q", q)?,
            k: bias("attn_k", kv)?,
            v: bias("attn_v", kv)?,
            o: bias("attn_output", d)?,
        })
    }
}

/// Add `bias` (if any) to every row of `x`.
fn add_bias(x: &mut [f32], bias: &Option<Vec<f32>>) {
    if let Some(b) = bias {
        for row in x.chunks_exact_mut(b.len()) {
            for (x, b) in row.iter_mut().zip(b) {
                *x += b;
            }
        }
    }
}

impl AttentionWeights {
    /// Load layer `layer`'s `attn_q`, `attn_k`, `attn_v`, `attn_output`.
    pub fn load<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
        cfg: &Config,
        layer: usize,
    ) -> Result<AttentionWeights, LoadError> {
        let (d, q, kv) = (
            cfg.d_model,
            cfg.n_head * cfg.head_dim,
            cfg.n_head_kv * cfg.head_dim,
        );
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        Ok(AttentionWeights {
            wq: load_matrix(file, loader, &name("attn_q"), d, q)?,
            wk: load_matrix(file, loader, &name("attn_k"), d, kv)?,
            wv: load_matrix(file, loader, &name("attn_v"), d, kv)?,
            wo: load_matrix(file, loader, &name("attn_output"), q, d)?,
            bias: AttnBias::load(file, cfg, layer)?,
        })
    }
}

// ANCHOR: forward
impl Attention {
    /// Self-attention of layer `layer` for a batch of tokens: `x` is `(n, d_model)` (the
    /// normalised hidden states), `out` receives `(n, d_model)`. Every token's key and value go
    /// into `kv` first; then each token attends to its own sequence up to its own position.
    /// `kv` must already have room for the tokens (see [`KvStore::reserve`]). RoPE and the
    /// attention itself run through `ops` (the scalar reference, or a faster one); `s` holds
    /// the buffers, reused from call to call.
    ///
    /// It is five steps, each its own method, so that an architecture whose attention differs
    /// in one step (norms on the queries and keys between projecting and rotating, say) runs
    /// the other four as they are.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_with(
        &self,
        ops: &dyn AttentionOps,
        s: &mut AttnScratch,
        w: &AttentionWeights,
        layer: usize,
        x: &[f32],
        tokens: &[TokenPos],
        kv: &mut dyn KvDyn,
        obs: &mut dyn Observer,
        out: &mut [f32],
    ) {
        self.project(w, x, tokens.len(), s); // q, k, v
        self.rotate(ops, s, tokens);
        self.store(layer, tokens, s, kv);
        self.attend_runs(ops, layer, tokens, s, kv, obs); // s.attn
        self.project_out(w, s, out);
        self.observe(layer, s, out, obs);
    }
    // ANCHOR_END: forward

    // ANCHOR: parts
    /// Step 1: the projections of `x` (`(n, d_model)`) into `s.q` (`(n, n_head, head_dim)`),
    /// `s.k` and `s.v` (`(n, n_head_kv, head_dim)`), with the biases the layer has.
    pub fn project(&self, w: &AttentionWeights, x: &[f32], n: usize, s: &mut AttnScratch) {
        s.fit(self, n);
        // s.q: (n, n_head, head_dim); s.k, s.v: (n, n_head_kv, head_dim). One input, three
        // products: a fast matrix type does them as one.
        w.wq.matmul_fused(
            &[&*w.wk, &*w.wv],
            x,
            &mut [&mut s.q[..], &mut s.k[..], &mut s.v[..]],
        );
        add_bias(&mut s.q, &w.bias.q);
        add_bias(&mut s.k, &w.bias.k);
        add_bias(&mut s.v, &w.bias.v);
    }

    /// Step 2: RoPE on the queries and keys of `s`, each token by its position.
    pub fn rotate(&self, ops: &dyn AttentionOps, s: &mut AttnScratch, tokens: &[TokenPos]) {
        ops.rope(&self.rope, &mut s.q, self.head_dim, tokens);
        ops.rope(&self.rope, &mut s.k, self.head_dim, tokens);
    }

    /// Step 3: every token's key and value into `kv` at its sequence and position.
    pub fn store(&self, layer: usize, tokens: &[TokenPos], s: &AttnScratch, kv: &mut dyn KvDyn) {
        let kvd = self.kv_dim();
        for (i, t) in tokens.iter().enumerate() {
            let r = i * kvd..(i + 1) * kvd;
            kv.store_kv(layer, t.seq, t.pos, &s.k[r.clone()], &s.v[r]);
        }
    }

    /// Step 4: each query of `s.q` attends to the positions of its sequence it may see, into
    /// `s.attn` (`(n, n_head * head_dim)`).
    pub fn attend_runs(
        &self,
        ops: &dyn AttentionOps,
        layer: usize,
        tokens: &[TokenPos],
        s: &mut AttnScratch,
        kv: &dyn KvDyn,
        obs: &mut dyn Observer,
    ) {
        let (q, attn) = (&s.q, &mut s.attn);
        if obs.enabled() {
            // Observing needs every attention weight (`kq_soft_max`), which only the reference
            // materialises: run it, and report.
            return self.attend_observed(layer, q, tokens, kv, obs, attn);
        }
        // Every sequence of the batch in one call: the default runs one `attend` per run of
        // consecutive tokens of a sequence; chapter 8 makes them one piece of parallel work.
        ops.attend_batch(self, layer, q, tokens, kv, attn);
    }

    /// Step 5: the output projection of the heads' outputs `s.attn` into `out`
    /// (`(n, d_model)`), with its bias if the layer has one.
    pub fn project_out(&self, w: &AttentionWeights, s: &AttnScratch, out: &mut [f32]) {
        w.wo.matmul(&s.attn, out);
        add_bias(out, &w.bias.o);
    }
    // ANCHOR_END: parts

    /// Report the block's tensors by llama.cpp's names (`Qcur`, `Kcur`, `Vcur` as rotated,
    /// `kqv_out`, `attn_out`).
    pub fn observe(&self, layer: usize, s: &AttnScratch, out: &[f32], obs: &mut dyn Observer) {
        if !obs.enabled() {
            return;
        }
        let (hd, qd) = (self.head_dim, self.q_dim());
        let n = s.q.len() / qd.max(1);
        obs.observe(&format!("Qcur-{layer}"), &[n, self.n_head, hd], &s.q);
        obs.observe(&format!("Kcur-{layer}"), &[n, self.n_head_kv, hd], &s.k);
        obs.observe(&format!("Vcur-{layer}"), &[n, self.n_head_kv, hd], &s.v);
        obs.observe(&format!("kqv_out-{layer}"), &[n, qd], &s.attn);
        obs.observe(
            &format!("attn_out-{layer}"),
            &[n, out.len() / n.max(1)],
            out,
        );
    }
}

impl Attention {
    /// [`Attention::forward_with`] on the scalar reference, with buffers of its own.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        w: &AttentionWeights,
        layer: usize,
        x: &[f32],
        tokens: &[TokenPos],
        kv: &mut dyn KvDyn,
        obs: &mut dyn Observer,
        out: &mut [f32],
    ) {
        let mut s = AttnScratch::default();
        self.forward_with(&Scalar, &mut s, w, layer, x, tokens, kv, obs, out);
    }

    /// The reference attention of every token, reporting the attention weights of all heads
    /// as `kq_soft_max-{layer}` (`(n_head, n, n_kv)`, zero where a query sees nothing).
    fn attend_observed(
        &self,
        layer: usize,
        q: &[f32],
        tokens: &[TokenPos],
        kv: &dyn KvDyn,
        obs: &mut dyn Observer,
        attn: &mut [f32],
    ) {
        let (n, qd) = (tokens.len(), self.q_dim());
        let n_kv = tokens.iter().map(|t| t.pos + 1).max().unwrap_or(0);
        let mut all_probs = vec![0.0; self.n_head * n * n_kv]; // (n_head, n, n_kv)
        let mut probs = Vec::new(); // (n_head, n_visible) scratch
        for (i, t) in tokens.iter().enumerate() {
            kv.with_view(layer, t.seq, &mut |view| {
                let visible = self.visible(t.pos, view.first());
                probs.resize(self.n_head * visible.len(), 0.0);
                self.attend(
                    &q[i * qd..(i + 1) * qd],
                    view,
                    visible.clone(),
                    &mut probs,
                    &mut attn[i * qd..(i + 1) * qd],
                );
                for h in 0..self.n_head {
                    let row = &mut all_probs[(h * n + i) * n_kv..(h * n + i + 1) * n_kv];
                    row[visible.clone()]
                        .copy_from_slice(&probs[h * visible.len()..(h + 1) * visible.len()]);
                }
            });
        }
        obs.observe(
            &format!("kq_soft_max-{layer}"),
            &[self.n_head, n, n_kv],
            &all_probs,
        );
    }
}

/// Reserve room in `kv` for every sequence of a batch (positions must follow what is stored).
pub fn reserve_batch<K: KvStore>(kv: &mut K, tokens: &[TokenPos]) -> Result<(), KvError> {
    reserve_batch_with(kv, tokens, &mut Vec::new())
}

/// [`reserve_batch`] with the list of spans kept by the caller, so it is not allocated anew.
pub fn reserve_batch_with<K: KvStore>(
    kv: &mut K,
    tokens: &[TokenPos],
    spans: &mut Vec<(usize, usize, usize)>, // (seq, first pos, end pos)
) -> Result<(), KvError> {
    spans.clear();
    for t in tokens {
        match spans.iter_mut().find(|s| s.0 == t.seq) {
            Some(s) => {
                s.1 = s.1.min(t.pos);
                s.2 = s.2.max(t.pos + 1);
            }
            None => spans.push((t.seq, t.pos, t.pos + 1)),
        }
    }
    for &(seq, lo, hi) in spans.iter() {
        kv.reserve(seq, lo..hi)?;
    }
    Ok(())
}
