//! Llama: the first architecture, and so far the only one.
//!
//! Each block is pre-norm attention and a pre-norm SwiGLU feed-forward network, each added back
//! to the residual stream:
//!
//! ```text
//! h = x + attention(rms_norm(x))
//! x = h + ffn(rms_norm(h))
//! ```
//!
//! The attention of that block is a value of the blocks ([`AttentionBlock`]): llama's is
//! chapter 3's ([`Standard`]), and an architecture whose attention differs in a step keeps the
//! rest of the block by bringing its own. The feed-forward network is each layer's value of a
//! type the blocks name ([`FfnBlock`]): llama's is the SwiGLU of [`FeedForward`], and an
//! architecture with another network keeps the rest of the block by bringing that.

use crate::arch::{Architecture, Blocks, Ctx};
use crate::batch::Batch;
use crate::compute::{FfnScratch, Scratch};
use crate::layer::{FeedForward, LayerWeights};
use ch01::{Config, GgufFile};
use ch03::matrix::{LoadError, MatrixLoader};
use ch03::{AttentionWeights, AttnScratch, KvDyn, Observer, TokenPos};

/// `general.architecture` of llama files.
pub const NAME: &str = "llama";

/// Llama in a set of [`Architectures`](crate::Architectures).
pub const ARCHITECTURE: Architecture = Architecture {
    name: NAME,
    load,
    chat_template: None,
};

/// Llama's blocks: `n_layer` of them with their feed-forward networks `F`, and the attention
/// they run (chapter 3's and SwiGLU for llama).
pub struct Llama<A = Standard, F = FeedForward> {
    pub layers: Vec<LayerWeights<F>>,
    pub attention: A,
}

// ANCHOR: attention_block
/// The attention sub-block of a llama block: from the normalised input `x` (`(n, d_model)`) to
/// `out` (`(n, d_model)`), storing the tokens' keys and values in `kv` on the way. Llama's is
/// [`Standard`]; an architecture whose attention differs in one of chapter 3's steps (norms on
/// the queries and keys between projecting and rotating, say) implements this with the steps
/// it keeps, and runs the rest of llama's block as it is.
pub trait AttentionBlock: Send + Sync + 'static {
    /// Layer `layer`'s attention, with its projections `w`, the model's hyperparameters and
    /// compute in `ctx`, and the buffers of `s`.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        ctx: &Ctx<'_>,
        s: &mut AttnScratch,
        w: &AttentionWeights,
        layer: usize,
        x: &[f32],
        tokens: &[TokenPos],
        kv: &mut dyn KvDyn,
        obs: &mut dyn Observer,
        out: &mut [f32],
    );

    /// The tensors of each layer it reads besides chapter 3's projections and their biases
    /// (names after `blk.N.`): a file's tensors are checked against these too.
    fn layer_tensors(&self) -> &'static [&'static str] {
        &[]
    }
}

/// Llama's attention: chapter 3's five steps as they are.
pub struct Standard;

impl AttentionBlock for Standard {
    fn forward(
        &self,
        ctx: &Ctx<'_>,
        s: &mut AttnScratch,
        w: &AttentionWeights,
        layer: usize,
        x: &[f32],
        tokens: &[TokenPos],
        kv: &mut dyn KvDyn,
        obs: &mut dyn Observer,
        out: &mut [f32],
    ) {
        let ops = ctx.compute;
        ctx.attention
            .forward_with(ops, s, w, layer, x, tokens, kv, obs, out);
    }
}
// ANCHOR_END: attention_block

// ANCHOR: ffn_block
/// The feed-forward sub-block of one llama layer, as a value of the layer: from the normalised
/// input `x` (`(n, d_model)`) to `out` (`(n, d_model)`). Llama's is [`FeedForward`]; an
/// architecture whose network differs implements this for the weights of one layer and runs
/// the rest of llama's block as it is.
pub trait FfnBlock: Send + Sync + 'static {
    /// Layer `layer`'s network, with compute in `ctx` and the buffers of `s`.
    fn forward(
        &self,
        ctx: &Ctx<'_>,
        s: &mut FfnScratch,
        layer: usize,
        x: &[f32],
        obs: &mut dyn Observer,
        out: &mut [f32],
    );

    /// The tensors of each layer it reads (names after `blk.N.`): a file's tensors are
    /// checked against these.
    fn layer_tensors() -> &'static [&'static str];
}
// ANCHOR_END: ffn_block

/// Read a llama file's configuration and build its blocks.
pub fn load(
    file: &GgufFile<&[u8]>,
    loader: &dyn MatrixLoader,
) -> Result<(Config, Box<dyn Blocks>), LoadError> {
    let config =
        Config::from_gguf(&file.gguf, &[NAME]).map_err(|e| LoadError::Other(e.to_string()))?;
    let blocks = Llama::load(file, loader, &config)?;
    Ok((config, Box::new(blocks)))
}

impl Llama {
    /// Llama's blocks for `config`, read from `file` by the caller: llama itself, or an
    /// architecture that differs from it only in its metadata. Every tensor of the file must
    /// be one these blocks or the model's frame use, as llama.cpp insists.
    pub fn load<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
        config: &Config,
    ) -> Result<Llama, LoadError> {
        Llama::load_with(file, loader, config, Standard)
    }
}

impl<A: AttentionBlock> Llama<A> {
    /// [`Llama::load`] with another attention, `attention`, whose own tensors the file may
    /// hold as well.
    pub fn load_with<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
        config: &Config,
        attention: A,
    ) -> Result<Llama<A>, LoadError> {
        Llama::load_with_ffn(file, loader, config, attention, |l| {
            FeedForward::load(file, loader, config, l)
        })
    }
}

impl<A: AttentionBlock, F: FfnBlock> Llama<A, F> {
    /// [`Llama::load_with`] with another feed-forward network: `ffn(l)` reads layer `l`'s.
    pub fn load_with_ffn<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
        config: &Config,
        attention: A,
        mut ffn: impl FnMut(usize) -> Result<F, LoadError>,
    ) -> Result<Llama<A, F>, LoadError> {
        let layers = (0..config.n_layer)
            .map(|l| LayerWeights::load_with(file, loader, config, l, || ffn(l)))
            .collect::<Result<Vec<_>, _>>()?;
        let more = [attention.layer_tensors(), F::layer_tensors()].concat();
        check_used(file, config, &more)?;
        Ok(Llama { layers, attention })
    }
}

// ANCHOR: blocks
impl<A: AttentionBlock, F: FfnBlock> Blocks for Llama<A, F> {
    /// Llama's blocks over the residual stream `s.x` (`(n, d_model)`), in place.
    fn forward(
        &self,
        ctx: &Ctx<'_>,
        batch: &Batch,
        kv: &mut dyn KvDyn,
        obs: &mut dyn Observer,
        s: &mut Scratch,
    ) {
        let (cfg, ops) = (ctx.config, ctx.compute);
        let (n, d) = (batch.len(), cfg.d_model);
        let (x, h, y) = (&mut s.x, &mut s.h, &mut s.y);
        // ANCHOR: yours_layers
        for (l, w) in self.layers.iter().enumerate() {
            ops.rms_norm(x, &w.attn_norm, cfg.rms_norm_eps, h);
            if obs.enabled() {
                obs.observe(&format!("attn_norm-{l}"), &[n, d], h);
            }
            self.attention
                .forward(ctx, &mut s.attn, &w.attn, l, h, &batch.at, kv, obs, y);
            ops.add(x, y); // residual connection
            if obs.enabled() {
                obs.observe(&format!("ffn_inp-{l}"), &[n, d], x);
            }
            ops.rms_norm(x, &w.ffn_norm, cfg.rms_norm_eps, h);
            if obs.enabled() {
                obs.observe(&format!("ffn_norm-{l}"), &[n, d], h);
            }
            w.ffn.forward(ctx, &mut s.ffn, l, h, obs, y);
            if obs.enabled() {
                obs.observe(&format!("ffn_out-{l}"), &[n, d], y);
            }
            ops.add(x, y); // residual connection
            if obs.enabled() {
                obs.observe(&format!("l_out-{l}"), &[n, d], x);
            }
        }
        // ANCHOR_END: yours_layers
    }

    fn describe(&self) -> String {
        match self.layers.first() {
            Some(l) => l.attn.wq.describe(),
            None => "no layers".to_string(),
        }
    }
}
// ANCHOR_END: blocks

/// Refuse a file with a tensor our llama blocks do not use: one llama.cpp's llama graph can use
/// and ours does not (a fused QKV matrix, biases of the feed-forward network), or one nothing
/// uses. Running without it would compute another model.
pub fn check_all_used<B: AsRef<[u8]>>(file: &GgufFile<B>, cfg: &Config) -> Result<(), LoadError> {
    check_used(file, cfg, FeedForward::layer_tensors())
}

/// Refuse a file with a tensor that is neither the model's frame, nor one of each layer's norms,
/// attention projections and their biases, nor one of `more` (names after `blk.N.`: the
/// feed-forward network's, and any other the blocks read).
pub fn check_used<B: AsRef<[u8]>>(
    file: &GgufFile<B>,
    cfg: &Config,
    more: &[&str],
) -> Result<(), LoadError> {
    const GLOBAL: [&str; 4] = [
        "token_embd.weight",
        "output_norm.weight",
        "output.weight",
        "rope_freqs.weight",
    ];
    const LAYER: [&str; 10] = [
        "attn_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "attn_q.bias",
        "attn_k.bias",
        "attn_v.bias",
        "attn_output.bias",
        "ffn_norm.weight",
    ];
    let used = |name: &str| {
        GLOBAL.contains(&name)
            || name
                .strip_prefix("blk.")
                .and_then(|rest| rest.split_once('.'))
                .is_some_and(|(layer, t)| {
                    layer
                        .parse::<usize>()
                        .is_ok_and(|l| l < cfg.n_layer && l.to_string() == layer)
                        && (LAYER.contains(&t) || more.contains(&t))
                })
    };
    match file.gguf.tensors.iter().find(|t| !used(&t.name)) {
        Some(t) => Err(LoadError::Other(format!(
            "tensor {:?} is not one the {} blocks use: this engine cannot run the file",
            t.name, cfg.arch
        ))),
        None => Ok(()),
    }
}
