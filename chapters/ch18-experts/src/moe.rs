//! A mixture of experts as a layer's feed-forward network: `n_expert` SwiGLU networks, the
//! experts, of which each token runs the `n_used` its router chooses (module [`router`]), their
//! outputs weighted and summed.
//!
//! The experts' matrices are 3-D tensors, `ffn_gate_exps` and `ffn_up_exps`
//! (`(n_expert, n_ff_exp, d_model)`) and `ffn_down_exps` (`(n_expert, d_model, n_ff_exp)`): each
//! expert's slice is a matrix of its own, loaded through the model's matrix loader as any other
//! (a view of the mapped file, or packed, as chapters 8 and 10 decide), and run as chapter 4's
//! [`FeedForward`].
//!
//! A batch runs expert by expert, not token by token: the tokens' choices are grouped by expert
//! ([`group_by_expert`]), each expert runs once on all the rows routed to it, and each token's
//! outputs are summed in its router's order. That is llama.cpp's `mul_mat_id`: an expert's
//! weights are read once per batch instead of once per token that chose it, and the numbers are
//! the token-by-token loop's ([`Moe::forward_tokens`], kept as the reference).
//!
//! [`router`]: crate::router

use crate::router::{Weights, route};
use ch01::config::RopeStyle;
use ch01::{Config, GgufFile, TensorInfo};
use ch03::matrix::{LoadError, Matrix, MatrixLoader, load_matrix};
use ch03::{NoObserver, Observer};
use ch04::layer::FeedForward;
use ch04::llama::{FfnBlock, Llama};
use ch04::{Activation, Blocks, Compute, Ctx, FfnScratch};
use ch13::qwen3::QkNormed;

/// The experts' sizes, from the file's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeShape {
    /// `{arch}.expert_count`.
    pub n_expert: usize,
    /// `{arch}.expert_used_count`: experts run per token.
    pub n_used: usize,
    /// `{arch}.expert_feed_forward_length`: each expert's hidden width.
    pub n_ff_exp: usize,
}

/// One layer's mixture of experts.
pub struct Moe {
    pub router: Box<dyn Matrix>, // (n_expert, d_model)
    /// Each expert's SwiGLU: gate and up `(n_ff_exp, d_model)`, down `(d_model, n_ff_exp)`.
    pub experts: Vec<FeedForward>,
    pub n_used: usize,
    /// What the family does with the chosen experts' probabilities.
    pub weights: Weights,
}

fn other(msg: String) -> LoadError {
    LoadError::Other(msg)
}

impl MoeShape {
    /// The sizes under the keys of architecture `arch`, checked against each other and against
    /// every layer's tensors before any matrix is loaded. An expert's width is
    /// `{arch}.expert_feed_forward_length`, or where the file has no such key
    /// `fallback_ff(n_used)`, as llama.cpp reads each family.
    pub fn read<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        config: &Config,
        arch: &str,
        fallback_ff: impl FnOnce(usize) -> usize,
    ) -> Result<Self, LoadError> {
        let key = |k: &str| format!("{arch}.{k}");
        let get = |k: &str| {
            file.gguf
                .get_u32(&key(k))
                .map(|v| v as usize)
                .map_err(|e| other(format!("{}: {e}", key(k))))
        };
        let n_expert = get("expert_count")?;
        let n_used = get("expert_used_count")?;
        if n_expert == 0 {
            return Err(other(format!(
                "{} is 0: a mixture needs experts",
                key("expert_count")
            )));
        }
        if n_used == 0 || n_used > n_expert {
            return Err(other(format!(
                "{} is {n_used}: it must be between 1 and {} ({n_expert})",
                key("expert_used_count"),
                key("expert_count")
            )));
        }
        let n_ff_exp = match file.gguf.get(&key("expert_feed_forward_length")) {
            Some(_) => get("expert_feed_forward_length")?,
            None => fallback_ff(n_used),
        };
        if n_ff_exp == 0 {
            return Err(other(format!("{} is 0", key("expert_feed_forward_length"))));
        }
        let (d, e, ff) = (config.d_model as u64, n_expert as u64, n_ff_exp as u64);
        for l in 0..config.n_layer {
            let want: [(&str, Vec<u64>); 4] = [
                ("ffn_gate_inp", vec![d, e]),
                ("ffn_gate_exps", vec![d, ff, e]),
                ("ffn_up_exps", vec![d, ff, e]),
                ("ffn_down_exps", vec![ff, d, e]),
            ];
            for (t, dims) in want {
                let name = format!("blk.{l}.{t}.weight");
                let info = file
                    .gguf
                    .tensor(&name)
                    .ok_or_else(|| LoadError::MissingTensor(name.clone()))?;
                if info.dims != dims {
                    return Err(LoadError::Shape {
                        name,
                        expected: dims,
                        found: info.dims.clone(),
                    });
                }
            }
        }
        Ok(MoeShape {
            n_expert,
            n_used,
            n_ff_exp,
        })
    }
}

// ANCHOR: expert_matrix
/// Expert `e`'s matrix of the 3-D tensor `name` (`ne = [cols, rows, n_expert]`, checked by
/// [`MoeShape::read`]): its slice of the bytes, given to the loader as a 2-D tensor of its own
/// at its own offset, so a loader that views the file views the slice.
pub fn expert_matrix<B: AsRef<[u8]>>(
    file: &GgufFile<B>,
    loader: &dyn MatrixLoader,
    name: &str,
    e: usize,
) -> Result<Box<dyn Matrix>, LoadError> {
    let info = file
        .gguf
        .tensor(name)
        .ok_or_else(|| LoadError::MissingTensor(name.to_string()))?;
    let [cols, rows, n] = info.dims[..] else {
        return Err(other(format!("tensor {name:?} is not 3-D")));
    };
    if e as u64 >= n {
        return Err(other(format!(
            "tensor {name:?} has {n} experts, not {}",
            e + 1
        )));
    }
    let per = info
        .ggml_type
        .row_bytes(cols)
        .map(|r| r * rows)
        .ok_or_else(|| {
            other(format!(
                "tensor {name:?}: rows of {cols} are not whole blocks"
            ))
        })?;
    let bytes = file
        .tensor_bytes(name)
        .map_err(|e| LoadError::Gguf(name.to_string(), e))?;
    let start = per as usize * e;
    let slice = TensorInfo {
        name: format!("{name}[{e}]"),
        dims: vec![cols, rows],
        ggml_type: info.ggml_type,
        offset: info.offset + start as u64,
    };
    let bytes = bytes
        .get(start..start + per as usize)
        .ok_or_else(|| other(format!("tensor {name:?}: expert {e} lies past its bytes")))?;
    loader.load(&file.gguf, &slice, bytes)
}
// ANCHOR_END: expert_matrix

impl Moe {
    /// Layer `layer`'s router and experts, of the sizes `shape`, weighted by `weights`.
    pub fn load<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
        config: &Config,
        shape: MoeShape,
        weights: Weights,
        layer: usize,
    ) -> Result<Moe, LoadError> {
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        let router = load_matrix(
            file,
            loader,
            &name("ffn_gate_inp"),
            config.d_model,
            shape.n_expert,
        )?;
        let experts = (0..shape.n_expert)
            .map(|e| {
                Ok(FeedForward {
                    gate: expert_matrix(file, loader, &name("ffn_gate_exps"), e)?,
                    up: expert_matrix(file, loader, &name("ffn_up_exps"), e)?,
                    down: expert_matrix(file, loader, &name("ffn_down_exps"), e)?,
                    act: Activation::Silu,
                })
            })
            .collect::<Result<Vec<_>, LoadError>>()?;
        Ok(Moe {
            router,
            experts,
            n_used: shape.n_used,
            weights,
        })
    }
}

// ANCHOR: family
/// A mixture-of-experts family on llama's blocks, as Qwen3-MoE and OLMoE are: NeoX RoPE, RMS
/// norms of the queries and keys before it, and a [`Moe`] as every layer's feed-forward
/// network. What differs between them is these values.
pub struct Family {
    /// `general.architecture`, and the prefix of its keys.
    pub arch: &'static str,
    /// The widths of the query and key norms (chapter 13's [`QkNormed::load_widths`]).
    pub norm_widths: fn(&Config) -> (usize, usize),
    /// An expert's width where the file has no `{arch}.expert_feed_forward_length`, given the
    /// configuration and the experts used per token.
    pub fallback_ff: fn(&Config, usize) -> usize,
    /// What the router does with the chosen experts' probabilities.
    pub weights: Weights,
}

impl Family {
    /// Read a file of this family and build its blocks.
    pub fn load(
        &self,
        file: &GgufFile<&[u8]>,
        loader: &dyn MatrixLoader,
    ) -> Result<(Config, Box<dyn Blocks>), LoadError> {
        let mut config = Config::from_gguf(&file.gguf, &[self.arch])
            .map_err(|e| LoadError::Other(e.to_string()))?;
        config.rope_style = RopeStyle::Neox;
        let fallback = |n_used| (self.fallback_ff)(&config, n_used);
        let shape = MoeShape::read(file, &config, self.arch, fallback)?;
        let (q, k) = (self.norm_widths)(&config);
        let attention = QkNormed::load_widths(file, &config, q, k)?;
        let blocks = Llama::load_with_ffn(file, loader, &config, attention, |l| {
            Moe::load(file, loader, &config, shape, self.weights, l)
        })?;
        Ok((config, Box::new(blocks)))
    }
}
// ANCHOR_END: family

// ANCHOR: group
/// Groups a batch's choices by expert, a counting sort: `chosen` holds each token's `k`
/// experts (`(n, k)`, slot `t·k + j` is token `t`'s `j`-th choice). On return expert `e`'s slots
/// are `order[start[e]..start[e + 1]]`, in token order, and `at[slot]` is the slot's place in
/// `order`. `start` has `n_expert + 1` entries; `order` and `at` as many as `chosen`.
pub fn group_by_expert(
    chosen: &[usize],
    start: &mut [usize],
    order: &mut [usize],
    at: &mut [usize],
) {
    // ANCHOR: yours_group
    start.fill(0);
    for &e in chosen {
        start[e + 1] += 1;
    }
    for e in 1..start.len() {
        start[e] += start[e - 1];
    }
    // start[e] is now expert e's first place; use it as the cursor of e's run, slots in order.
    for (slot, &e) in chosen.iter().enumerate() {
        let place = start[e];
        start[e] += 1;
        order[place] = slot;
        at[slot] = place;
    }
    // Each start moved to its run's end, the next run's start: shift them back by one.
    for e in (1..start.len()).rev() {
        start[e] = start[e - 1];
    }
    start[0] = 0;
    // ANCHOR_END: yours_group
}
// ANCHOR_END: group

// ANCHOR: moe_forward
impl Moe {
    /// The layer on `n` tokens `x` (`(n, d_model)`) into `out` (`(n, d_model)`), expert by
    /// expert: the router's choices, grouped; each chosen expert once on the rows routed to it;
    /// each token's outputs weighted and summed in its router's order. Buffers are `s`'s.
    pub fn forward_grouped(
        &self,
        ops: &dyn Compute,
        s: &mut FfnScratch,
        layer: usize,
        x: &[f32],
        obs: &mut dyn Observer,
        out: &mut [f32],
    ) {
        let (d, n_exp, k) = (self.router.cols(), self.experts.len(), self.n_used);
        let n = x.len() / d;
        let FfnScratch {
            gate,
            up,
            spare,
            index,
        } = s;
        // spare: the router's probabilities (n, n_expert), the chosen weights (n, k), one
        // expert's input rows (at most n, d_model), and every slot's output (n·k, d_model) in
        // expert order. index: the choices (n, k), the experts' starts, the order and places.
        spare.resize(n * n_exp + n * k + n * d + n * k * d, 0.0);
        index.resize(n * k + n_exp + 1 + 2 * n * k, 0);
        let (probs, rest) = spare.split_at_mut(n * n_exp);
        let (weights, rest) = rest.split_at_mut(n * k);
        let (xs, ys) = rest.split_at_mut(n * d);
        let (chosen, rest) = index.split_at_mut(n * k);
        let (start, rest) = rest.split_at_mut(n_exp + 1);
        let (order, at) = rest.split_at_mut(n * k);
        self.choose(layer, x, probs, chosen, weights, obs);
        group_by_expert(chosen, start, order, at);
        // ANCHOR: yours_grouped
        for (e, expert) in self.experts.iter().enumerate() {
            let slots = &order[start[e]..start[e + 1]];
            if slots.is_empty() {
                continue; // no token chose it: its weights are not read
            }
            let m = slots.len();
            for (i, &slot) in slots.iter().enumerate() {
                let t = slot / k;
                xs[i * d..(i + 1) * d].copy_from_slice(&x[t * d..(t + 1) * d]);
            }
            let y = &mut ys[start[e] * d..start[e + 1] * d]; // (m, d_model)
            expert.forward_with(ops, gate, up, layer, &xs[..m * d], &mut NoObserver, y);
        }
        for t in 0..n {
            let ot = &mut out[t * d..(t + 1) * d];
            ot.fill(0.0);
            for j in 0..k {
                let (p, w) = (at[t * k + j], weights[t * k + j]);
                let y = &ys[p * d..(p + 1) * d];
                ot.iter_mut().zip(y).for_each(|(o, v)| *o += v * w);
            }
        }
        // ANCHOR_END: yours_grouped
        if obs.enabled() {
            obs.observe(&format!("ffn_moe_out-{layer}"), &[n, d], out);
        }
    }
}
// ANCHOR_END: moe_forward

// ANCHOR: ffn_block
/// The mixture as chapter 4's llama blocks run a feed-forward network.
impl FfnBlock for Moe {
    fn forward(
        &self,
        ctx: &Ctx<'_>,
        s: &mut FfnScratch,
        layer: usize,
        x: &[f32],
        obs: &mut dyn Observer,
        out: &mut [f32],
    ) {
        self.forward_grouped(ctx.compute, s, layer, x, obs, out);
    }

    fn layer_tensors() -> &'static [&'static str] {
        &[
            "ffn_gate_inp.weight",
            "ffn_gate_exps.weight",
            "ffn_up_exps.weight",
            "ffn_down_exps.weight",
        ]
    }
}
// ANCHOR_END: ffn_block

// ANCHOR: choose
impl Moe {
    /// The router for `n` tokens `x` (`(n, d_model)`): `chosen` and `weights` (`(n, k)`) get
    /// each token's experts and weights; `probs` (`(n, n_expert)`) holds the logits, then the
    /// probabilities.
    fn choose(
        &self,
        layer: usize,
        x: &[f32],
        probs: &mut [f32],
        chosen: &mut [usize],
        weights: &mut [f32],
        obs: &mut dyn Observer,
    ) {
        let (n_exp, k) = (self.experts.len(), self.n_used);
        let n = probs.len() / n_exp;
        self.router.matmul(x, probs);
        if obs.enabled() {
            obs.observe(&format!("ffn_moe_logits-{layer}"), &[n, n_exp], probs);
        }
        for t in 0..n {
            let (p, w) = (t * n_exp..(t + 1) * n_exp, t * k..(t + 1) * k);
            route(
                &mut probs[p],
                &mut chosen[w.clone()],
                &mut weights[w],
                self.weights,
            );
        }
        if obs.enabled() {
            obs.observe(&format!("ffn_moe_probs-{layer}"), &[n, n_exp], probs);
            let name = match self.weights {
                Weights::Normalised => "ffn_moe_weights_norm",
                Weights::Probabilities => "ffn_moe_weights",
            };
            obs.observe(&format!("{name}-{layer}"), &[n, k], weights);
        }
    }
}
// ANCHOR_END: choose

// ANCHOR: forward_tokens
impl Moe {
    /// The reference: the same layer token by token, each token through its chosen experts in
    /// the router's order, reading an expert's weights once per token that chose it. `x` and
    /// `out` are `(n, d_model)`.
    pub fn forward_tokens(&self, ops: &dyn Compute, x: &[f32], out: &mut [f32]) {
        let (d, n_exp, k) = (self.router.cols(), self.experts.len(), self.n_used);
        let n = x.len() / d;
        let mut probs = vec![0.0; n * n_exp];
        let (mut chosen, mut weights) = (vec![0; n * k], vec![0.0; n * k]);
        self.choose(0, x, &mut probs, &mut chosen, &mut weights, &mut NoObserver);
        let (mut gate, mut up, mut y) = (Vec::new(), Vec::new(), vec![0.0; d]);
        for t in 0..n {
            let (xt, ot) = (&x[t * d..(t + 1) * d], &mut out[t * d..(t + 1) * d]);
            ot.fill(0.0);
            for j in 0..k {
                let expert = &self.experts[chosen[t * k + j]];
                expert.forward_with(ops, &mut gate, &mut up, 0, xt, &mut NoObserver, &mut y);
                let w = weights[t * k + j];
                ot.iter_mut().zip(&y).for_each(|(o, v)| *o += v * w);
            }
        }
    }
}
// ANCHOR_END: forward_tokens

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_lists_each_experts_slots_in_token_order() {
        // Three tokens, two choices each, four experts: expert 2 twice, expert 3 never.
        let chosen = [2, 0, 1, 2, 0, 1];
        let (mut start, mut order, mut at) = ([9; 5], [9; 6], [9; 6]);
        group_by_expert(&chosen, &mut start, &mut order, &mut at);
        assert_eq!(start, [0, 2, 4, 6, 6]);
        assert_eq!(order, [1, 4, 2, 5, 0, 3]);
        for (slot, &place) in at.iter().enumerate() {
            assert_eq!(order[place], slot);
        }
        // One expert for everything, and the last expert only.
        let (mut start, mut order, mut at) = ([9; 3], [9; 3], [9; 3]);
        group_by_expert(&[1, 1, 1], &mut start, &mut order, &mut at);
        assert_eq!((start, order, at), ([0, 0, 3], [0, 1, 2], [0, 1, 2]));
    }
}
