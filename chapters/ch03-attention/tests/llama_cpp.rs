//! Attention of layers 0, 1, 15 and 29, checked against llama.cpp tensor by tensor.
//!
//! Input: llama.cpp's own `attn_norm-L` for each reference prompt, so each layer is checked on
//! its own, with no error carried in from earlier layers. The weights are the default model's,
//! dequantized to f32 — the same values llama.cpp ran with (it ran an F32 copy of the model
//! made by dequantizing the same file).

use ch01::{Config, GgufFile};
use ch03::attention::{Attention, AttentionWeights, TokenPos};
use ch03::{DenseLoader, KvStore, Recorder, VecKv};
use testkit::refdata::{self, TensorFile};
use testkit::{Tolerance, assert_close};

/// Q, K, V are dot products of 576 terms. llama.cpp sums them in a different order (SIMD partial
/// sums of another width), so each value can differ by a few units in the last place of the
/// largest partial sums: relative 1e-4 with an absolute floor of 1e-4 covers that with room,
/// while a wrong weight, a wrong RoPE pair or a wrong position is off by 1e-1 or more.
const PROJ_TOL: Tolerance = Tolerance::new(1e-4, 1e-4);
/// Attention weights are probabilities in [0, 1]; rounding differences in the scores above move
/// them by far less than 1e-5.
const PROBS_TOL: Tolerance = Tolerance::new(1e-5, 1e-4);
/// The attention output and its projection add one more sum of 576 terms each.
const OUT_TOL: Tolerance = Tolerance::new(2e-4, 1e-4);

const LAYERS: [usize; 4] = [0, 1, 15, 29];

#[test]
fn attention_matches_llama_cpp_for_every_prompt() {
    let file = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
    let cfg = Config::from_gguf(&file.gguf, &["llama"]).unwrap();
    let att = Attention::new(&cfg, cfg.default_context()).unwrap();
    let manifest = refdata::manifest().unwrap_or_else(|e| panic!("{e}"));
    let prompts = manifest["prompts"]
        .as_array()
        .expect("manifest lists prompts");
    assert!(
        prompts.len() >= 3,
        "expected at least three reference prompts"
    );
    let weights: Vec<AttentionWeights> = LAYERS
        .iter()
        .map(|&l| AttentionWeights::load(&file, &DenseLoader, &cfg, l).unwrap())
        .collect();

    for prompt in prompts {
        let id = prompt["id"].as_str().unwrap();
        let refs = TensorFile::open(&format!("prompts/{id}.safetensors"))
            .unwrap_or_else(|e| panic!("{e}"));
        for (&layer, w) in LAYERS.iter().zip(&weights) {
            let x = refs.f32(&format!("attn_norm-{layer}")).unwrap();
            let n = x.shape[0];
            let mut kv = VecKv::new(cfg.n_layer, att.kv_dim());
            kv.reserve(0, 0..n).unwrap();
            let mut rec = Recorder::new();
            let mut out = vec![0.0; x.data.len()];
            att.forward(
                w,
                layer,
                &x.data,
                &TokenPos::run(0, 0, n),
                &mut kv,
                &mut rec,
                &mut out,
            );

            for (name, tol) in [
                ("Qcur", PROJ_TOL),
                ("Kcur", PROJ_TOL),
                ("Vcur", PROJ_TOL),
                ("kq_soft_max", PROBS_TOL),
                ("kqv_out", OUT_TOL),
                ("attn_out", OUT_TOL),
            ] {
                let name = format!("{name}-{layer}");
                let want = refs.f32(&name).unwrap();
                let (shape, got) = rec.get(&name);
                assert_eq!(shape, &want.shape[..], "{id}: shape of {name}");
                let r = assert_close(&format!("{id}: {name}"), shape, got, &want.data, tol);
                eprintln!(
                    "{id} {name:16} max abs err {:.2e} max rel err {:.2e}",
                    r.max_abs, r.max_rel
                );
            }
        }
    }
}
