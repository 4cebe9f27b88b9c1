//! Qwen3-MoE: Qwen3's blocks with a mixture of experts in place of the SwiGLU network.
//!
//! llama.cpp's `qwen3moe` graph (`src/models/qwen3moe.cpp`, through `build_moe_ffn` of
//! `src/llama-graph.cpp`) keeps Qwen3's attention (per-head query and key norms before NeoX
//! RoPE) and replaces each layer's feed-forward network by `n_expert` SwiGLU networks, the
//! experts, of which every token runs `n_expert_used`:
//!
//! 1. the router: logits `x · W_gate_inp` (`ffn_gate_inp`, `(n_expert, d_model)`), a softmax
//!    over all experts (`ffn_moe_probs`);
//! 2. the `n_expert_used` experts of highest probability, highest first (`ffn_moe_topk`);
//! 3. their probabilities divided by their sum, so the chosen weights add up to one
//!    (`ffn_moe_weights_norm`; the sum is clamped below at 2^-14 against a division by zero);
//! 4. each chosen expert's SwiGLU on the token, times its weight, summed in the order of
//!    step 2 (`ffn_moe_out`).
//!
//! The experts' matrices are 3-D tensors, `ffn_gate_exps` and `ffn_up_exps`
//! (`(n_expert, n_ff_exp, d_model)`) and `ffn_down_exps` (`(n_expert, d_model, n_ff_exp)`): each
//! expert's slice is a matrix of its own, loaded through the model's matrix loader as any other,
//! and run as chapter 4's [`FeedForward`]. This module runs the tokens one at a time; llama.cpp
//! groups the tokens by expert (`mul_mat_id`), which changes the speed and not the numbers.

use crate::qwen3::QkNormed;
use ch01::config::RopeStyle;
use ch01::{Config, GgufFile, TensorInfo};
use ch03::matrix::{LoadError, Matrix, MatrixLoader, load_matrix};
use ch03::{NoObserver, Observer};
use ch04::layer::FeedForward;
use ch04::llama::{FfnBlock, Llama};
use ch04::{Activation, Architecture, Blocks, Ctx, FfnScratch};

/// `general.architecture` of Qwen3-MoE files.
pub const ARCH: &str = "qwen3moe";

/// Qwen3-MoE in a set of [`Architectures`](ch04::Architectures). Its files carry their own chat
/// template.
pub const ARCHITECTURE: Architecture = Architecture {
    name: ARCH,
    load,
    chat_template: None,
};

/// The experts' sizes, from the file's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeShape {
    /// `qwen3moe.expert_count`.
    pub n_expert: usize,
    /// `qwen3moe.expert_used_count`: experts run per token.
    pub n_used: usize,
    /// `qwen3moe.expert_feed_forward_length`: each expert's hidden width.
    pub n_ff_exp: usize,
}

/// One layer's mixture of experts.
pub struct Moe {
    pub router: Box<dyn Matrix>, // (n_expert, d_model)
    /// Each expert's SwiGLU: gate and up `(n_ff_exp, d_model)`, down `(d_model, n_ff_exp)`.
    pub experts: Vec<FeedForward>,
    pub n_used: usize,
}

/// Read a Qwen3-MoE file's configuration and build its blocks: Qwen3's, with a [`Moe`] as each
/// layer's feed-forward network.
pub fn load(
    file: &GgufFile<&[u8]>,
    loader: &dyn MatrixLoader,
) -> Result<(Config, Box<dyn Blocks>), LoadError> {
    let mut config =
        Config::from_gguf(&file.gguf, &[ARCH]).map_err(|e| LoadError::Other(e.to_string()))?;
    config.rope_style = RopeStyle::Neox;
    let shape = MoeShape::read(file, &config)?;
    let attention = QkNormed::load(file, &config)?;
    let blocks = Llama::load_with_ffn(file, loader, &config, attention, |l| {
        Moe::load(file, loader, &config, shape, l)
    })?;
    Ok((config, Box::new(blocks)))
}

fn other(msg: String) -> LoadError {
    LoadError::Other(msg)
}

impl MoeShape {
    /// The sizes, checked against each other and against every layer's tensors before any
    /// matrix is loaded.
    pub fn read<B: AsRef<[u8]>>(file: &GgufFile<B>, config: &Config) -> Result<Self, LoadError> {
        let key = |k: &str| format!("{ARCH}.{k}");
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
        // llama.cpp's fallback when the key is absent.
        let n_ff_exp = match file.gguf.get(&key("expert_feed_forward_length")) {
            Some(_) => get("expert_feed_forward_length")?,
            None => config.n_ff / n_used,
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

/// Expert `e`'s matrix of the 3-D tensor `name` (`ne = [cols, rows, n_expert]`, checked by
/// [`MoeShape::read`]): its slice of the bytes, loaded as a `(rows, cols)` matrix.
fn expert_matrix<B: AsRef<[u8]>>(
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

impl Moe {
    /// Layer `layer`'s router and experts, of the sizes `shape`.
    pub fn load<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
        config: &Config,
        shape: MoeShape,
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
        })
    }
}

// ANCHOR: route
/// The router's step for one token: `probs` (`n_expert` logits) becomes their softmax in place;
/// `chosen` receives the `chosen.len()` experts of highest probability, highest first (equal
/// ones by lower index), and `weights` their probabilities divided by their sum.
pub fn route(probs: &mut [f32], chosen: &mut [usize], weights: &mut [f32]) {
    let max = probs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for p in probs.iter_mut() {
        *p = (*p - max).exp();
        sum += *p as f64;
    }
    let inv = (1.0 / sum) as f32;
    probs.iter_mut().for_each(|p| *p *= inv);
    for j in 0..chosen.len() {
        let mut best = usize::MAX;
        for (e, &p) in probs.iter().enumerate() {
            if !chosen[..j].contains(&e) && (best == usize::MAX || p > probs[best]) {
                best = e;
            }
        }
        chosen[j] = best;
        weights[j] = probs[best];
    }
    // llama.cpp clamps the sum at the smallest normal f16 against a division by zero.
    let total = weights.iter().sum::<f32>().max(6.103_515_6e-5);
    weights.iter_mut().for_each(|w| *w /= total);
}
// ANCHOR_END: route

// ANCHOR: moe_forward
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
        let (d, n_exp, k) = (self.router.cols(), self.experts.len(), self.n_used);
        let n = x.len() / d;
        let FfnScratch {
            gate,
            up,
            spare,
            index,
        } = s;
        // spare: the router's probabilities (n, n_expert), the chosen weights (n, k), and one
        // expert's output for one token (d_model).
        spare.resize(n * n_exp + n * k + d, 0.0);
        index.resize(n * k, 0);
        let (probs, rest) = spare.split_at_mut(n * n_exp);
        let (weights, y) = rest.split_at_mut(n * k);
        self.router.matmul(x, probs);
        if obs.enabled() {
            obs.observe(&format!("ffn_moe_logits-{layer}"), &[n, n_exp], probs);
        }
        for t in 0..n {
            let (p, w) = (t * n_exp..(t + 1) * n_exp, t * k..(t + 1) * k);
            route(&mut probs[p], &mut index[w.clone()], &mut weights[w]);
        }
        if obs.enabled() {
            obs.observe(&format!("ffn_moe_probs-{layer}"), &[n, n_exp], probs);
            obs.observe(&format!("ffn_moe_weights_norm-{layer}"), &[n, k], weights);
        }
        for t in 0..n {
            let (xt, ot) = (&x[t * d..(t + 1) * d], &mut out[t * d..(t + 1) * d]);
            ot.fill(0.0);
            for j in 0..k {
                let expert = &self.experts[index[t * k + j]];
                expert.forward_with(ctx.compute, gate, up, layer, xt, &mut NoObserver, y);
                let wj = weights[t * k + j];
                ot.iter_mut().zip(y.iter()).for_each(|(o, v)| *o += v * wj);
            }
        }
        if obs.enabled() {
            obs.observe(&format!("ffn_moe_out-{layer}"), &[n, d], out);
        }
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
// ANCHOR_END: moe_forward

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_router_keeps_the_top_experts_and_renormalises_their_weights() {
        let mut probs = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let (mut chosen, mut weights) = ([0usize; 2], [0f32; 2]);
        route(&mut probs, &mut chosen, &mut weights);
        let total: f32 = probs.iter().sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        // Experts 1 and 3 tie: the lower index comes first.
        assert_eq!(chosen, [1, 3]);
        assert_eq!(weights, [0.5, 0.5]);
        let mut probs = [3.0f32, 0.0, 1.0];
        let (mut chosen, mut weights) = ([0usize; 2], [0f32; 2]);
        route(&mut probs, &mut chosen, &mut weights);
        assert_eq!(chosen, [0, 2]);
        let want = 1.0 / (1.0 + (-2f32).exp());
        assert!(
            (weights[0] - want).abs() < 1e-6 && (weights.iter().sum::<f32>() - 1.0).abs() < 1e-6
        );
    }
}
