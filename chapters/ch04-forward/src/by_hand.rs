//! One token through the model, written out in one function.
//!
//! [`Model::forward`] runs a batch of tokens through seams — chapter 3's attention, the
//! [`Blocks`](crate::Blocks) of an architecture, a [`Compute`](crate::Compute) for the
//! non-product work, a key/value store behind a trait — so that later chapters can change each
//! part. [`logits_by_hand`] does the same arithmetic for llama with every seam inlined, in the
//! order the chapters introduce it, as llama2.c's `forward` does: an embedding row, then per
//! layer RMSNorm, the projections, RoPE, attention over the positions so far, the feed-forward
//! network and two residual additions, then the final norm and the output projection. The keys
//! and values are plain vectors. Its tests check that it gives [`Model::forward`]'s logits,
//! and llama.cpp's.

use crate::compute::{Activation, rms_norm, silu};
use crate::llama::Llama;
use crate::model::Model;
use ch03::matrix::dot;
use ch03::softmax;

/// What [`logits_by_hand`] leaves out, named: it writes out llama as the default model is.
fn unsupported(model: &Model, llama: &Llama) -> Option<&'static str> {
    let layers = &llama.layers;
    if layers.iter().any(|w| {
        let b = &w.attn.bias;
        b.q.is_some() || b.k.is_some() || b.v.is_some() || b.o.is_some()
    }) {
        return Some("biases on the attention projections");
    }
    if layers.iter().any(|w| w.ffn.act != Activation::Silu) {
        return Some("a gate other than SiLU");
    }
    if model.attention.window.is_some() {
        return Some("a sliding window");
    }
    if model.config.final_logit_softcapping.is_some() {
        return Some("a soft cap on the logits");
    }
    None
}

// ANCHOR: by_hand
/// The logits `(vocab)` predicting the token after `tokens`, computed one token at a time;
/// an error names what of `model` this function does not write out.
pub fn logits_by_hand(model: &Model, tokens: &[u32]) -> Result<Vec<f32>, String> {
    let llama = model
        .blocks_as::<Llama>()
        .ok_or("the blocks are not llama's")?;
    if let Some(what) = unsupported(model, llama) {
        return Err(format!("{what}: not written out here"));
    }
    let cfg = &model.config;
    let (d, hd, eps) = (cfg.d_model, cfg.head_dim, cfg.rms_norm_eps);
    let (n_head, kv_dim) = (cfg.n_head, cfg.kv_dim());
    let group = cfg.n_group(); // query heads per key/value head
    let (rope, scale) = (&model.attention.rope, model.attention.kq_scale);

    let mut x = vec![0.0; d]; // (d_model): the residual stream
    let mut h = vec![0.0; d]; // (d_model): x normed
    let mut y = vec![0.0; d]; // (d_model): a block's output
    let mut q = vec![0.0; n_head * hd]; // (n_head, head_dim)
    let mut k = vec![0.0; kv_dim]; // (n_head_kv, head_dim)
    let mut v = vec![0.0; kv_dim]; // (n_head_kv, head_dim)
    let mut att = vec![0.0; n_head * hd]; // (n_head, head_dim)
    let mut scores = vec![0.0; tokens.len()]; // (positions so far)
    let mut gate = vec![0.0; cfg.n_ff]; // (n_ff)
    let mut up = vec![0.0; cfg.n_ff]; // (n_ff)
    // Every layer's keys and values, one row per position: (n_layer, positions, kv_dim).
    let mut keys = vec![Vec::new(); cfg.n_layer];
    let mut values = vec![Vec::new(); cfg.n_layer];
    // ANCHOR_END: by_hand

    // ANCHOR: by_hand_loop
    for (pos, &token) in tokens.iter().enumerate() {
        // Chapter 4's frame: the token's row of the embedding matrix.
        model.weights.token_embd.get_row(token as usize, &mut x);
        for (l, w) in llama.layers.iter().enumerate() {
            // Chapter 3: attention. The projections, then RoPE on queries and keys.
            rms_norm(&x, &w.attn_norm, eps, &mut h);
            w.attn.wq.matmul(&h, &mut q);
            w.attn.wk.matmul(&h, &mut k);
            w.attn.wv.matmul(&h, &mut v);
            rope.apply(&mut q, hd, pos);
            rope.apply(&mut k, hd, pos);
            keys[l].extend_from_slice(&k);
            values[l].extend_from_slice(&v);
            // Each query head against every position so far, through its key/value head.
            for head in 0..n_head {
                let kv_head = (head / group) * hd..(head / group + 1) * hd;
                let q_h = &q[head * hd..(head + 1) * hd];
                let s = &mut scores[..=pos];
                for (p, s) in s.iter_mut().enumerate() {
                    let k_p = &keys[l][p * kv_dim..(p + 1) * kv_dim];
                    *s = dot(q_h, &k_p[kv_head.clone()]) * scale;
                }
                softmax(s);
                let out = &mut att[head * hd..(head + 1) * hd];
                out.fill(0.0);
                for (p, &weight) in s.iter().enumerate() {
                    let v_p = &values[l][p * kv_dim..(p + 1) * kv_dim];
                    for (o, &v) in out.iter_mut().zip(&v_p[kv_head.clone()]) {
                        *o += weight * v;
                    }
                }
            }
            w.attn.wo.matmul(&att, &mut y);
            x.iter_mut().zip(&y).for_each(|(x, y)| *x += y); // residual connection
            // Chapter 4: the SwiGLU feed-forward network.
            rms_norm(&x, &w.ffn_norm, eps, &mut h);
            w.ffn.gate.matmul(&h, &mut gate);
            w.ffn.up.matmul(&h, &mut up);
            gate.iter_mut()
                .zip(&up)
                .for_each(|(g, u)| *g = silu(*g) * u);
            w.ffn.down.matmul(&gate, &mut y);
            x.iter_mut().zip(&y).for_each(|(x, y)| *x += y); // residual connection
        }
    }
    // Chapter 4's frame: the final norm, and the output projection of the last token.
    rms_norm(&x, &model.weights.output_norm, eps, &mut h);
    let mut logits = vec![0.0; cfg.vocab_size]; // (vocab)
    model.output().matmul(&h, &mut logits);
    Ok(logits)
}
// ANCHOR_END: by_hand_loop
