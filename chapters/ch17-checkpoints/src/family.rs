//! What Hugging Face and GGUF disagree on, per architecture, as values.
//!
//! Three things differ between a Hugging Face checkpoint and the GGUF file llama.cpp's
//! converter makes of it:
//!
//! - **Names.** `config.json` says `num_hidden_layers` where GGUF says `llama.block_count`, and
//!   a tensor `model.layers.3.self_attn.q_proj.weight` is `blk.3.attn_q.weight`.
//! - **The query and key rows (llama only).** RoPE rotates pairs of values in each head.
//!   Hugging Face's llama pairs value `i` with value `i + d/2` (`rotate_half`); llama.cpp's
//!   llama graph pairs `2i` with `2i + 1`. llama.cpp's converter therefore reorders the rows of
//!   `q_proj` and `k_proj` so that each head's first half and second half interleave
//!   ([`permute_rows`]). The product then computes the same numbers in llama.cpp's order, and
//!   its RoPE rotates the same pairs. Qwen2 and Gemma 3 run on llama.cpp's "NeoX" RoPE, which
//!   rotates halves as Hugging Face does: their rows stay as they are (chapter 13).
//! - **Values (Gemma only).** Gemma's RMSNorm multiplies by `1 + w` and stores `w`; llama.cpp
//!   multiplies by `w`, so the converter adds one to every norm weight.
//!
//! Each [`Family`] says these things for one architecture; [`FAMILIES`] are the ones the
//! engine converts.

use ch01::Value;
use serde_json::Value as Json;

/// The metadata of a GGUF file being made: `(key, value)` in the order written.
pub type Meta = Vec<(String, Value)>;

// ANCHOR: family
/// One architecture as a Hugging Face checkpoint stores it.
pub struct Family {
    /// `config.json`'s `architectures` names for it, e.g. `"LlamaForCausalLM"`.
    pub hf_architectures: &'static [&'static str],
    /// `config.json`'s `model_type` values for it, when `architectures` is absent.
    pub model_types: &'static [&'static str],
    /// `general.architecture`: the engine's (and llama.cpp's) name.
    pub arch: &'static str,
    /// Names of a layer's tensors: Hugging Face's (after `layers.N.`) → llama.cpp's (after
    /// `blk.N.`), without the `.weight` or `.bias` both end in.
    pub layer_names: &'static [(&'static str, &'static str)],
    /// Whether `q_proj` and `k_proj` rows are reordered for llama.cpp's RoPE.
    pub permute_qk: bool,
    /// Added to every norm weight (Gemma stores `w` for a scale of `1 + w`).
    pub norm_shift: f32,
    /// Defaults for keys `config.json` may leave out: (key, value).
    pub defaults: &'static [(&'static str, f64)],
    /// The family's own metadata, after the keys every family has.
    pub extra: fn(&Json, &mut Meta) -> Result<(), String>,
    /// Keys of every family's list that llama.cpp's converter leaves out for this one (after
    /// `{arch}.`): its loader derives them (the RoPE width from the head width, the vocabulary
    /// size from the token list).
    pub omitted: &'static [&'static str],
}
// ANCHOR_END: family

/// The tensors llama and Qwen2 layers hold.
const LLAMA_LAYER: &[(&str, &str)] = &[
    ("input_layernorm", "attn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("post_attention_layernorm", "ffn_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

/// Gemma 3's: norms on queries and keys, and around both sub-blocks.
const GEMMA3_LAYER: &[(&str, &str)] = &[
    ("input_layernorm", "attn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("post_attention_layernorm", "post_attention_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffw_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

fn nothing_more(_: &Json, _: &mut Meta) -> Result<(), String> {
    Ok(())
}

// ANCHOR: families
/// The families the engine converts: chapter 4's llama, chapter 13's Qwen2 and Gemma 3.
pub const FAMILIES: &[Family] = &[
    Family {
        hf_architectures: &["LlamaForCausalLM"],
        model_types: &["llama"],
        arch: "llama",
        layer_names: LLAMA_LAYER,
        permute_qk: true,
        norm_shift: 0.0,
        defaults: &[("rope_theta", 10000.0)],
        extra: nothing_more,
        omitted: &[],
    },
    Family {
        hf_architectures: &["Qwen2ForCausalLM"],
        model_types: &["qwen2"],
        arch: "qwen2",
        layer_names: LLAMA_LAYER,
        permute_qk: false,
        norm_shift: 0.0,
        defaults: &[("rope_theta", 10000.0)],
        extra: nothing_more,
        omitted: &[],
    },
    Family {
        hf_architectures: &["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"],
        model_types: &["gemma3_text", "gemma3"],
        arch: "gemma3",
        layer_names: GEMMA3_LAYER,
        permute_qk: false,
        norm_shift: 1.0,
        // transformers' Gemma3TextConfig defaults.
        defaults: &[
            ("rope_theta", 1_000_000.0),
            ("max_position_embeddings", 131_072.0),
            ("head_dim", 256.0),
            ("rms_norm_eps", 1e-6),
        ],
        extra: gemma3_extra,
        omitted: &["rope.dimension_count", "vocab_size"],
    },
];
// ANCHOR_END: families

impl Family {
    /// The family `config` names by its `architectures` (else its `model_type`).
    pub fn of(config: &Json) -> Result<&'static Family, String> {
        let known = crate::files::known_families();
        if let Some(list) = config.get("architectures").and_then(Json::as_array) {
            let name = list.first().and_then(Json::as_str).unwrap_or("");
            return FAMILIES
                .iter()
                .find(|f| f.hf_architectures.contains(&name))
                .ok_or_else(|| {
                    format!("architectures: {name:?} is not one the engine runs (it runs {known})")
                });
        }
        let ty = config.get("model_type").and_then(Json::as_str);
        match ty {
            Some(t) => FAMILIES
                .iter()
                .find(|f| f.model_types.contains(&t))
                .ok_or_else(|| {
                    format!("model_type: {t:?} is not one the engine runs (it runs {known})")
                }),
            None => Err("neither architectures nor model_type says what the model is".into()),
        }
    }

    // ANCHOR: gguf_name
    /// llama.cpp's name for Hugging Face's tensor `hf`: `None` for a tensor the text model
    /// does not use (an image encoder's, a cached RoPE table); an error for one not known.
    pub fn gguf_name(&self, hf: &str) -> Result<Option<String>, String> {
        const SKIPPED: [&str; 4] = [
            "vision_tower.",
            "multi_modal_projector.",
            "model.vision_tower.",
            "model.multi_modal_projector.",
        ];
        if SKIPPED.iter().any(|p| hf.starts_with(p)) || hf.ends_with("rotary_emb.inv_freq") {
            return Ok(None);
        }
        // ANCHOR: yours_gguf_name
        let unknown = || format!("tensor {hf:?}: not a tensor of a {} model", self.arch);
        if matches!(hf, "lm_head.weight" | "language_model.lm_head.weight") {
            return Ok(Some("output.weight".into()));
        }
        let body = ["model.language_model.", "language_model.model.", "model."]
            .iter()
            .find_map(|p| hf.strip_prefix(p))
            .ok_or_else(unknown)?;
        let global = match body {
            "embed_tokens.weight" => Some("token_embd.weight"),
            "norm.weight" => Some("output_norm.weight"),
            _ => None,
        };
        if let Some(g) = global {
            return Ok(Some(g.into()));
        }
        let rest = body.strip_prefix("layers.").ok_or_else(unknown)?;
        let (layer, rest) = rest.split_once('.').ok_or_else(unknown)?;
        let layer: usize = layer.parse().map_err(|_| unknown())?;
        let (stem, kind) = rest.rsplit_once('.').ok_or_else(unknown)?;
        if kind != "weight" && kind != "bias" {
            return Err(unknown());
        }
        let (_, ours) = self
            .layer_names
            .iter()
            .find(|(theirs, _)| *theirs == stem)
            .ok_or_else(unknown)?;
        Ok(Some(format!("blk.{layer}.{ours}.{kind}")))
        // ANCHOR_END: yours_gguf_name
    }
    // ANCHOR_END: gguf_name

    /// The default of `key` for this family, if it has one.
    pub fn default_of(&self, key: &str) -> Option<f64> {
        self.defaults
            .iter()
            .find(|(k, _)| *k == key)
            .map(|&(_, v)| v)
    }
}

// ANCHOR: permute
/// llama.cpp's `permute` of a query or key projection (or its bias): `rows` rows of
/// `row_bytes` bytes in `n_head` heads. In each head, row `j · d/2 + i` (half `j`, pair `i`)
/// moves to row `2i + j`, so the halves Hugging Face's RoPE rotates together become the
/// adjacent pairs llama.cpp's does.
pub fn permute_rows(bytes: &[u8], n_head: usize, row_bytes: usize) -> Vec<u8> {
    // ANCHOR: yours_permute_rows
    // (n_head, 2, d/2, row) → (n_head, d/2, 2, row)
    let rows = bytes.len() / row_bytes;
    let (head, half) = (rows / n_head, rows / n_head / 2);
    let mut out = vec![0u8; bytes.len()];
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let from = h * head + j * half + i;
                let to = h * head + 2 * i + j;
                out[to * row_bytes..(to + 1) * row_bytes]
                    .copy_from_slice(&bytes[from * row_bytes..(from + 1) * row_bytes]);
            }
        }
    }
    out
    // ANCHOR_END: yours_permute_rows
}
// ANCHOR_END: permute

/// Gemma 3's own keys: the sliding window, which layers use it, its RoPE base, the soft cap.
fn gemma3_extra(config: &Json, meta: &mut Meta) -> Result<(), String> {
    let key = |k: &str| format!("gemma3.{k}");
    let pattern = config.get("sliding_window_pattern").and_then(Json::as_u64);
    if let Some(w) = config.get("sliding_window").and_then(Json::as_u64)
        && pattern != Some(1)
    {
        let w = u32::try_from(w).map_err(|_| format!("sliding_window: {w} is too large"))?;
        meta.push((key("attention.sliding_window"), Value::U32(w)));
    }
    // Which layers slide: one flag per layer (newer configurations), or a period.
    if let Some(types) = config.get("layer_types").and_then(Json::as_array) {
        let flags = types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(Value::Bool(true)),
                Some("full_attention") => Ok(Value::Bool(false)),
                _ => Err(format!(
                    "layer_types: {t} is neither sliding_ nor full_attention"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ty = ch01::gguf::ValueType::Bool;
        meta.push((
            key("attention.sliding_window_pattern"),
            Value::Array(ty, flags),
        ));
    } else if let Some(p) = pattern {
        let p =
            u32::try_from(p).map_err(|_| format!("sliding_window_pattern: {p} is too large"))?;
        meta.push((key("attention.sliding_window_pattern"), Value::U32(p)));
    }
    let local_base = config
        .get("rope_parameters")
        .and_then(|r| r.get("sliding_attention"))
        .and_then(|r| r.get("rope_theta"))
        .or_else(|| config.get("rope_local_base_freq"))
        .and_then(Json::as_f64);
    if let Some(b) = local_base {
        meta.push((key("rope.freq_base_swa"), Value::F32(b as f32)));
    }
    if let Some(cap) = config.get("final_logit_softcapping").and_then(Json::as_f64) {
        meta.push((key("final_logit_softcapping"), Value::F32(cap as f32)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ch01::config::RopeStyle;
    use ch03::RopeTable;

    /// Why the permutation is right: Hugging Face's RoPE (rotating halves, NeoX style) on a
    /// query in Hugging Face's order, then reordered, equals llama.cpp's RoPE (adjacent pairs)
    /// on the query reordered first — bit for bit, since each pair turns by the same angle.
    #[test]
    fn permuted_rows_turn_hugging_faces_rope_into_llama_cpps() {
        let (n_head, head_dim, n_pos) = (3, 8, 16);
        let q: Vec<f32> = (0..n_head * head_dim)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) / 3.0)
            .collect();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let floats = |b: &[u8]| {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect::<Vec<f32>>()
        };
        let neox = RopeTable::new(head_dim, 10000.0, 1.0, RopeStyle::Neox, n_pos);
        let normal = RopeTable::new(head_dim, 10000.0, 1.0, RopeStyle::Normal, n_pos);
        for pos in [0, 1, 7, 15] {
            let mut theirs = q.clone();
            neox.apply(&mut theirs, head_dim, pos);
            let mut ours = floats(&permute_rows(&bytes(&q), n_head, 4));
            normal.apply(&mut ours, head_dim, pos);
            assert_eq!(
                ours,
                floats(&permute_rows(&bytes(&theirs), n_head, 4)),
                "position {pos}"
            );
        }
    }

    /// Two heads of d = 8 and one row of one byte each: the order the page draws, by hand.
    #[test]
    fn permute_rows_interleaves_the_halves_of_each_head() {
        let rows: Vec<u8> = (0..16).collect();
        let want = [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15];
        assert_eq!(permute_rows(&rows, 2, 1), want);
        // A row of several bytes (a matrix's row, a bias's f32) moves whole.
        let wide: Vec<u8> = (0..16u8).flat_map(|r| [r, 100 + r, 200 - r]).collect();
        let want_wide: Vec<u8> = want.iter().flat_map(|&r| [r, 100 + r, 200 - r]).collect();
        assert_eq!(permute_rows(&wide, 2, 3), want_wide);
        // One head of d = 4 (a key projection of one head): 0 2 1 3; of d = 2: as it was.
        assert_eq!(permute_rows(&[10, 11, 12, 13], 1, 1), [10, 12, 11, 13]);
        assert_eq!(permute_rows(&[10, 11, 12, 13], 2, 1), [10, 11, 12, 13]);
    }

    #[test]
    fn hugging_face_names_map_to_llama_cpps() {
        let llama = &FAMILIES[0];
        let name = |hf| llama.gguf_name(hf).unwrap();
        assert_eq!(
            name("model.layers.12.self_attn.k_proj.weight").as_deref(),
            Some("blk.12.attn_k.weight")
        );
        assert_eq!(name("lm_head.weight").as_deref(), Some("output.weight"));
        assert_eq!(name("model.layers.0.self_attn.rotary_emb.inv_freq"), None);
        assert!(
            llama
                .gguf_name("model.layers.x.mlp.up_proj.weight")
                .is_err()
        );
        assert_eq!(
            name("model.embed_tokens.weight").as_deref(),
            Some("token_embd.weight")
        );
        assert_eq!(
            name("model.norm.weight").as_deref(),
            Some("output_norm.weight")
        );
        // Qwen2's query, key and value projections have biases.
        let qwen2 = &FAMILIES[1];
        let b = qwen2.gguf_name("model.layers.0.self_attn.q_proj.bias");
        assert_eq!(b.unwrap().as_deref(), Some("blk.0.attn_q.bias"));
        let gemma = &FAMILIES[2];
        let g = gemma.gguf_name("language_model.model.layers.3.pre_feedforward_layernorm.weight");
        assert_eq!(g.unwrap().as_deref(), Some("blk.3.ffn_norm.weight"));
        // A model that also sees images: its language model under `model.language_model.`.
        let g = gemma.gguf_name("model.language_model.layers.5.self_attn.q_norm.weight");
        assert_eq!(g.unwrap().as_deref(), Some("blk.5.attn_q_norm.weight"));
        let g = gemma.gguf_name("model.language_model.embed_tokens.weight");
        assert_eq!(g.unwrap().as_deref(), Some("token_embd.weight"));
        // Names not known are errors that name the tensor, never a guess.
        for hf in [
            "model.layers.0.mlp.up_proj.scales",
            "model.layers.0.self_attn.qkv_proj.weight",
            "model.layers.0.post_feedforward_layernorm.weight",
            "transformer.h.0.attn.c_attn.weight",
            "model.layers.0",
            "model.embed_tokens.bias",
        ] {
            let e = llama.gguf_name(hf).unwrap_err();
            assert!(e.contains(hf), "{hf}: {e}");
        }
    }
}
