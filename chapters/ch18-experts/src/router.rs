//! The router: which experts a token runs, and with what weights.
//!
//! Every mixture-of-experts family scores the experts with one product, the router's logits
//! `W_gate_inp · x` (`ffn_gate_inp`, `(n_expert, d_model)`), and then applies its own rule to
//! them. Qwen3-MoE's and OLMoE's, llama.cpp's `build_moe_ffn` with a softmax gate:
//!
//! 1. a softmax over all `n_expert` logits (`ffn_moe_probs`);
//! 2. the `n_expert_used` experts of highest probability, highest first (`ffn_moe_topk`);
//! 3. Qwen3-MoE: their probabilities divided by their sum, so the chosen weights add up to one
//!    (`ffn_moe_weights_norm`; the sum is clamped below at 2^-14 against a division by zero);
//!    OLMoE: their probabilities as they are (`ffn_moe_weights`), adding up to less than one.

// ANCHOR: weights
/// What a family does with the chosen experts' probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weights {
    /// Divided by their sum, so that they add up to one (Qwen3-MoE).
    Normalised,
    /// Kept as the softmax over all the experts gave them (OLMoE).
    Probabilities,
}
// ANCHOR_END: weights

// ANCHOR: route
/// The router's step for one token: `probs` (`n_expert` logits) becomes their softmax in place;
/// `chosen` receives the `chosen.len()` experts of highest probability, highest first (equal
/// ones by lower index), and `weights` their probabilities, [`Weights::Normalised`] or not.
pub fn route(probs: &mut [f32], chosen: &mut [usize], weights: &mut [f32], rule: Weights) {
    let max = probs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for p in probs.iter_mut() {
        *p = (*p - max).exp();
        sum += *p as f64;
    }
    let inv = (1.0 / sum) as f32;
    probs.iter_mut().for_each(|p| *p *= inv);
    top_k(probs, chosen, weights);
    if rule == Weights::Normalised {
        // llama.cpp clamps the sum at the smallest normal f16 against a division by zero.
        let total = weights.iter().sum::<f32>().max(6.103_515_6e-5);
        weights.iter_mut().for_each(|w| *w /= total);
    }
}
// ANCHOR_END: route

// ANCHOR: top_k
/// The `chosen.len()` largest of `probs`, largest first, equal ones by lower index: their
/// indices into `chosen` and their values into `weights`. A selection, `k` passes over the
/// experts: `k` is 8 and `n_expert` 128 in Qwen3-30B-A3B, where a sort would cost more.
pub fn top_k(probs: &[f32], chosen: &mut [usize], weights: &mut [f32]) {
    // ANCHOR: yours_top_k
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
    // ANCHOR_END: yours_top_k
}
// ANCHOR_END: top_k

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_router_keeps_the_top_experts_and_renormalises_their_weights() {
        let mut probs = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let (mut chosen, mut weights) = ([0usize; 2], [0f32; 2]);
        route(&mut probs, &mut chosen, &mut weights, Weights::Normalised);
        let total: f32 = probs.iter().sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        // Experts 1 and 3 tie: the lower index comes first.
        assert_eq!(chosen, [1, 3]);
        assert_eq!(weights, [0.5, 0.5]);
        let mut probs = [3.0f32, 0.0, 1.0];
        let (mut chosen, mut weights) = ([0usize; 2], [0f32; 2]);
        route(&mut probs, &mut chosen, &mut weights, Weights::Normalised);
        assert_eq!(chosen, [0, 2]);
        let want = 1.0 / (1.0 + (-2f32).exp());
        assert!(
            (weights[0] - want).abs() < 1e-6 && (weights.iter().sum::<f32>() - 1.0).abs() < 1e-6
        );
        // OLMoE's rule keeps the probabilities: the same choice, weights that sum to less.
        let mut kept = [3.0f32, 0.0, 1.0];
        let (mut chosen, mut weights) = ([0usize; 2], [0f32; 2]);
        route(&mut kept, &mut chosen, &mut weights, Weights::Probabilities);
        assert_eq!(chosen, [0, 2]);
        assert_eq!(weights, [kept[0], kept[2]]);
        assert!(weights.iter().sum::<f32>() < 0.99);
    }

    #[test]
    fn top_k_takes_the_largest_first_and_each_expert_once() {
        let probs = [0.1f32, 0.4, 0.05, 0.4, 0.3, 0.0];
        let (mut chosen, mut weights) = ([0usize; 4], [0f32; 4]);
        top_k(&probs, &mut chosen, &mut weights);
        assert_eq!(chosen, [1, 3, 4, 0]);
        assert_eq!(weights, [0.4, 0.4, 0.3, 0.1]);
        // All of them: a permutation, in order.
        let (mut chosen, mut weights) = ([9usize; 6], [0f32; 6]);
        top_k(&probs, &mut chosen, &mut weights);
        assert_eq!(chosen, [1, 3, 4, 0, 2, 5]);
        // The largest last: found wherever it is.
        let (mut chosen, mut weights) = ([0usize; 1], [0f32; 1]);
        top_k(&[0.0, 0.1, 0.2, 0.9], &mut chosen, &mut weights);
        assert_eq!((chosen, weights), ([3], [0.9]));
    }
}
