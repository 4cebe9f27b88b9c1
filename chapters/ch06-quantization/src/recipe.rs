//! Which type each tensor gets: llama.cpp's recipe for a file type, and the whole
//! `llama_model_quantize` built on it.
//!
//! A file type such as Q4_K_M names a *mix*, not one type. `llama_tensor_get_type` (in
//! `src/llama-quant.cpp`) starts every 2-D weight at the file type's default type, then:
//! - leaves 1-D tensors (norms, biases) and a few sensitive matrices in their own type;
//! - gives the output projection (or the token embeddings, when the two are tied) Q6_K, or
//!   Q8_0 when its rows do not split into the type's blocks;
//! - spends more bits where errors hurt most: `attn_v` and `ffn_down` in some layers (the
//!   first and last eighth and every third layer in between, `use_more_bits`) for Q4_K_M and
//!   Q5_K_M, the first few for Q3_K_M and Q4_K_S, …;
//! - falls back to a 32-weight type when a row is not a whole number of 256-weight k-quant
//!   blocks: Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K/Q3_K → Q4_0. SmolLM2's rows of 576
//!   hit this everywhere, which is why its "Q4_K_M" is mostly Q5_0.
//!
//! This module ports those rules for the file types whose kernels chapter 6 has (no i-quants,
//! no ternary or FP4 types, no importance matrix), in llama.cpp's order — the counters that
//! pick "every third layer" advance as tensors are visited, and llama.cpp visits them sorted by
//! layer, then name. [`Plan`] holds the result, can be printed as, or read from, a list of
//! `name TYPE` lines, and [`quantize_gguf`] writes the quantized file.

use crate::gguf_write::{GgufWriter, WriteError};
use crate::qmatrix::requantize;
use ch01::{GgmlType, Gguf, GgufFile, TensorInfo, Value};
use std::cmp::Ordering;
use std::fmt;
use std::path::Path;

/// ggml's `GGML_QNT_VERSION`, written as `general.quantization_version`.
pub const GGML_QNT_VERSION: u32 = 2;

// ANCHOR: ftype
/// llama.cpp's `llama_ftype`: what a whole file is quantized to (`LLAMA_FTYPE_MOSTLY_Q4_K_M`
/// is `LlamaFtype::Q4_K_M`). The ones here are those chapter 6 has kernels for.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LlamaFtype {
    F32 = 0, // LLAMA_FTYPE_ALL_F32
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q8_0 = 7,
    Q5_0 = 8,
    Q5_1 = 9,
    Q2_K = 10,
    Q3_K_S = 11,
    Q3_K_M = 12,
    Q3_K_L = 13,
    Q4_K_S = 14,
    Q4_K_M = 15,
    Q5_K_S = 16,
    Q5_K_M = 17,
    Q6_K = 18,
    BF16 = 32,
}
// ANCHOR_END: ftype

impl LlamaFtype {
    pub const ALL: [LlamaFtype; 17] = {
        use LlamaFtype::*;
        [
            F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q5_1, Q5_0, Q4_K_M, Q4_K_S, Q4_1, Q4_0,
            Q3_K_L, Q3_K_M, Q3_K_S, Q2_K,
        ]
    };

    /// llama.cpp's number, stored as `general.file_type`.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The name `llama-quantize` takes: `"Q4_K_M"`.
    pub const fn name(self) -> &'static str {
        use LlamaFtype::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            BF16 => "BF16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q2_K => "Q2_K",
            Q3_K_S => "Q3_K_S",
            Q3_K_M => "Q3_K_M",
            Q3_K_L => "Q3_K_L",
            Q4_K_S => "Q4_K_S",
            Q4_K_M => "Q4_K_M",
            Q5_K_S => "Q5_K_S",
            Q5_K_M => "Q5_K_M",
            Q6_K => "Q6_K",
        }
    }

    /// The file type named `name` (any case).
    pub fn from_name(name: &str) -> Result<LlamaFtype, RecipeError> {
        LlamaFtype::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| RecipeError::UnknownFtype(name.to_string()))
    }

    /// The file type with llama.cpp's number `id`.
    pub fn from_id(id: u32) -> Option<LlamaFtype> {
        LlamaFtype::ALL.into_iter().find(|f| f.id() == id)
    }

    // ANCHOR: default_type
    /// `llama_ftype_get_default_type`: the type a weight gets unless a rule says otherwise.
    pub const fn default_type(self) -> GgmlType {
        use LlamaFtype as F;
        match self {
            F::F32 => GgmlType::F32,
            F::F16 => GgmlType::F16,
            F::BF16 => GgmlType::BF16,
            F::Q4_0 => GgmlType::Q4_0,
            F::Q4_1 => GgmlType::Q4_1,
            F::Q5_0 => GgmlType::Q5_0,
            F::Q5_1 => GgmlType::Q5_1,
            F::Q8_0 => GgmlType::Q8_0,
            F::Q2_K => GgmlType::Q2_K,
            F::Q3_K_S | F::Q3_K_M | F::Q3_K_L => GgmlType::Q3_K,
            F::Q4_K_S | F::Q4_K_M => GgmlType::Q4_K,
            F::Q5_K_S | F::Q5_K_M => GgmlType::Q5_K,
            F::Q6_K => GgmlType::Q6_K,
        }
    }
    // ANCHOR_END: default_type
}

impl fmt::Display for LlamaFtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a recipe, a list of types or a quantization could not be made.
#[derive(Debug)]
pub enum RecipeError {
    UnknownFtype(String),
    /// A metadata value the recipe needs.
    Metadata(String),
    /// A rule that cannot be applied to a tensor.
    Tensor {
        name: String,
        reason: String,
    },
    /// A bad line in a list of types.
    List {
        source: String,
        line: usize,
        reason: String,
    },
    Write(WriteError),
}

impl fmt::Display for RecipeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecipeError::UnknownFtype(name) => {
                let known: Vec<&str> = LlamaFtype::ALL.iter().map(|f| f.name()).collect();
                write!(f, "unknown file type {name:?}; known: {}", known.join(", "))
            }
            RecipeError::Metadata(reason) => write!(f, "metadata: {reason}"),
            RecipeError::Tensor { name, reason } => write!(f, "tensor {name:?}: {reason}"),
            RecipeError::List {
                source,
                line,
                reason,
            } => write!(f, "{source}:{line}: {reason}"),
            RecipeError::Write(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RecipeError {}

impl From<WriteError> for RecipeError {
    fn from(e: WriteError) -> Self {
        RecipeError::Write(e)
    }
}

/// What the rules need to know about the model (llama.cpp's `hparams`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFacts {
    pub arch: String,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// 0 for a dense model.
    pub n_expert: usize,
}

impl ModelFacts {
    /// Read from `{arch}.block_count`, `.attention.head_count(_kv)` and `.expert_count`.
    pub fn from_gguf(gguf: &Gguf) -> Result<ModelFacts, RecipeError> {
        let meta = |e: ch01::GgufError| RecipeError::Metadata(e.to_string());
        let arch = gguf.architecture().map_err(meta)?.to_string();
        let n = |key: &str| gguf.get_u32(&format!("{arch}.{key}")).map(|v| v as usize);
        let n_head = n("attention.head_count").map_err(meta)?;
        Ok(ModelFacts {
            n_layer: n("block_count").map_err(meta)?,
            n_head,
            n_head_kv: n("attention.head_count_kv").unwrap_or(n_head),
            n_expert: n("expert_count").unwrap_or(0),
            arch,
        })
    }

    /// Query heads per key/value head.
    pub fn n_gqa(&self) -> usize {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    /// llama.cpp's `LLM_TYPE_70B` for llama: 80 layers with grouped-query attention.
    pub fn is_70b(&self) -> bool {
        self.arch == "llama" && self.n_layer == 80 && self.n_head != self.n_head_kv
    }

    fn falcon(&self) -> bool {
        self.arch == "falcon"
    }
}

/// llama.cpp's broad tensor categories (`tensor_get_category`), by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnQkv,
    AttnKvB,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn category(name: &str) -> Category {
    use Category::*;
    let has = |s: &str| name.contains(s);
    match name {
        "output.weight" => Output,
        "token_embd.weight" | "per_layer_token_embd.weight" => TokenEmbd,
        _ if has("attn_qkv.weight") => AttnQkv,
        _ if has("attn_kv_b.weight") => AttnKvB,
        _ if has("attn_v.weight") => AttnV,
        _ if has("attn_k.weight") => AttnK,
        _ if has("attn_q.weight") => AttnQ,
        _ if has("attn_output.weight") => AttnOutput,
        _ if has("ffn_up") => FfnUp,
        _ if has("ffn_gate") => FfnGate,
        _ if has("ffn_down") => FfnDown,
        _ => Other,
    }
}

/// Parts of names llama.cpp never quantizes (`tensor_allows_quantization`): small or
/// sensitive tensors of other architectures (MoE routers, RWKV, Mamba, T5, vision, audio).
const NEVER_QUANTIZED: &[&str] = &[
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// ggml's `ggml_n_dims`: dimensions up to the last one larger than 1 (at least 1).
fn n_dims(t: &TensorInfo) -> usize {
    t.dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1)
}

// ANCHOR: allows
/// `tensor_allows_quantization`: only 2-D and 3-D weights, and not the norms.
pub fn allows_quantization(t: &TensorInfo) -> bool {
    n_dims(t) >= 2
        && t.name.ends_with("weight")
        && !NEVER_QUANTIZED.iter().any(|s| t.name.contains(s))
        && t.name != "position_embd.weight"
        && t.name != "token_types.weight"
}
// ANCHOR_END: allows

/// The `N` of a name starting `blk.N`, read as C's `sscanf(name, "blk.%d.", &n)` reads it.
fn blk_layer(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?.trim_start();
    let sign = usize::from(rest.starts_with(['-', '+']));
    let end = sign
        + rest[sign..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - sign);
    rest[..end].parse().ok()
}

/// `weight_name_comparer`: by layer (`blk.N`; other tensors first), then by name. llama.cpp
/// visits and writes tensors in this order.
pub fn llama_order(a: &str, b: &str) -> Ordering {
    let layer = |s: &str| blk_layer(s).unwrap_or(-1);
    layer(a).cmp(&layer(b)).then_with(|| a.cmp(b))
}

/// The counters of llama.cpp's `quantize_state_impl`.
struct State<'a> {
    facts: &'a ModelFacts,
    ftype: LlamaFtype,
    tied: bool,
    n_attention_wv: usize,
    i_attention_wv: usize,
    i_ffn_down: usize,
    i_ffn_gate: usize,
    i_ffn_up: usize,
}

// ANCHOR: use_more_bits
/// `use_more_bits`: the first and last eighth of the layers, and every third one between.
fn use_more_bits(i_layer: usize, n_layers: usize) -> bool {
    let (i, n) = (i_layer as i64, n_layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}
// ANCHOR_END: use_more_bits

impl State<'_> {
    /// The layer of the `i`-th tensor of a kind: its position among them for a dense model,
    /// its `blk.N` for a mixture of experts, whose expert tensors are not visited in order.
    fn layer_info(&self, i: usize, name: &str) -> Result<(usize, usize), RecipeError> {
        let n_layer = self.facts.n_layer;
        if self.facts.n_expert <= 1 {
            return Ok((i, n_layer));
        }
        let err = |reason: String| RecipeError::Tensor {
            name: name.to_string(),
            reason,
        };
        let layer = blk_layer(name).ok_or_else(|| err("cannot find its layer (blk.N.)".into()))?;
        let layer = usize::try_from(layer)
            .ok()
            .filter(|&l| l < n_layer)
            .ok_or_else(|| err(format!("layer {layer} of a model of {n_layer} layers")))?;
        Ok((layer, n_layer))
    }

    // ANCHOR: get_type_impl
    /// `llama_tensor_get_type_impl`, for the file types here: the type of a quantizable
    /// tensor before the shape fallback.
    fn get_type_impl(
        &mut self,
        t: &TensorInfo,
        mut new: GgmlType,
    ) -> Result<GgmlType, RecipeError> {
        use GgmlType::*;
        use LlamaFtype as F;
        let (ftype, facts) = (self.ftype, self.facts);
        let cat = category(&t.name);
        if cat == Category::Output || (self.tied && cat == Category::TokenEmbd) {
            let nx = t.dims[0];
            if facts.falcon() || !nx.is_multiple_of(new.block_size()) {
                new = Q8_0;
            } else if new != Q8_0 {
                new = Q6_K;
            }
        } else if cat == Category::TokenEmbd {
            // Untied token embeddings keep the default type for these file types.
        } else if matches!(cat, Category::AttnV | Category::AttnQkv | Category::AttnKvB) {
            let (i, n) = (self.i_attention_wv, self.n_attention_wv);
            new = match ftype {
                F::Q2_K if facts.n_gqa() >= 4 => Q4_K,
                F::Q2_K => Q3_K,
                F::Q3_K_M if i < 2 => Q5_K,
                F::Q3_K_M => Q4_K,
                F::Q3_K_L => Q5_K,
                F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => Q6_K,
                F::Q4_K_S if i < 4 => Q5_K,
                _ => new,
            };
            // 8 query heads share each value head there: more bits cost little.
            if facts.is_70b() && matches!(new, Q3_K | Q4_K) {
                new = Q5_K;
            }
            if facts.n_expert == 8 {
                new = Q8_0;
            }
            self.i_attention_wv += 1;
            // ANCHOR_END: get_type_impl
            // ANCHOR: get_type_impl_rest
        } else if cat == Category::AttnK {
            if facts.n_expert == 8 {
                new = Q8_0;
            }
        } else if cat == Category::FfnDown {
            let (i, n) = self.layer_info(self.i_ffn_down, &t.name)?;
            let falcon = facts.falcon();
            new = match ftype {
                F::Q2_K => Q3_K,
                F::Q3_K_M if i < n / 16 => Q5_K,
                F::Q3_K_M if !falcon || use_more_bits(i, n) => Q4_K,
                F::Q3_K_M => Q3_K,
                F::Q3_K_L if falcon => Q4_K,
                F::Q3_K_L => Q5_K,
                F::Q4_K_M if falcon && i < n / 16 => Q6_K,
                F::Q4_K_M if falcon && use_more_bits(i, n) => Q5_K,
                F::Q4_K_M if falcon => Q4_K,
                F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => Q6_K,
                F::Q4_K_S if !falcon && i < n / 8 => Q5_K,
                _ => new,
            };
            self.i_ffn_down += 1;
        } else if cat == Category::AttnOutput {
            if facts.falcon() {
                if ftype == F::Q3_K_L {
                    new = Q4_K;
                }
            } else if facts.n_expert == 8 {
                if matches!(
                    ftype,
                    F::Q2_K | F::Q3_K_S | F::Q3_K_M | F::Q4_K_S | F::Q4_K_M
                ) {
                    new = Q5_K;
                }
            } else {
                new = match ftype {
                    F::Q2_K => Q3_K,
                    F::Q3_K_M => Q4_K,
                    F::Q3_K_L => Q5_K,
                    _ => new,
                };
            }
        } else if cat == Category::FfnGate {
            // Only the i-quant mixes change these; the counter (and its layer check) runs anyway.
            self.layer_info(self.i_ffn_gate, &t.name)?;
            self.i_ffn_gate += 1;
        } else if cat == Category::FfnUp {
            self.layer_info(self.i_ffn_up, &t.name)?;
            self.i_ffn_up += 1;
        }
        // (llama.cpp's separate rule for attn_qkv is never reached: the attn_v branch takes it.)
        Ok(new)
    }
    // ANCHOR_END: get_type_impl_rest
}

// ANCHOR: fallback
/// `tensor_type_fallback`: a type whose blocks do not divide the row is replaced by a
/// 32-weight type, or by F16 when even 32 does not divide it.
pub fn fallback(t: &TensorInfo, target: GgmlType) -> Result<GgmlType, RecipeError> {
    use GgmlType::*;
    let ncols = t.dims.first().copied().unwrap_or(1);
    if ncols.is_multiple_of(target.block_size()) {
        return Ok(target);
    }
    let ty = match target {
        Q2_K | Q3_K => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        ty if ty.block_size() <= 32 => ty,
        ty => {
            return Err(RecipeError::Tensor {
                name: t.name.clone(),
                reason: format!("no fallback for {ty} with rows of {ncols}"),
            });
        }
    };
    Ok(if ncols.is_multiple_of(ty.block_size()) {
        ty
    } else {
        F16
    })
}
// ANCHOR_END: fallback

/// The type of every tensor of a file, in the order the quantized file lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub ftype: LlamaFtype,
    /// `(name, type)`, sorted as llama.cpp writes tensors ([`llama_order`]).
    pub tensors: Vec<(String, GgmlType)>,
}

// ANCHOR: plan
impl Plan {
    /// llama.cpp's choice for each tensor of `gguf` quantized to `ftype`
    /// (`llama_tensor_get_type` with default parameters and no importance matrix).
    pub fn new(gguf: &Gguf, ftype: LlamaFtype) -> Result<Plan, RecipeError> {
        let facts = ModelFacts::from_gguf(gguf)?;
        let mut infos: Vec<&TensorInfo> = gguf.tensors.iter().collect();
        infos.sort_by(|a, b| llama_order(&a.name, &b.name));
        let is_attn_v = |t: &&&TensorInfo| {
            matches!(
                category(&t.name),
                Category::AttnV | Category::AttnQkv | Category::AttnKvB
            )
        };
        let mut state = State {
            facts: &facts,
            ftype,
            tied: !infos.iter().any(|t| category(&t.name) == Category::Output),
            n_attention_wv: infos.iter().filter(is_attn_v).count(),
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
        };
        let default = ftype.default_type();
        let mut tensors = Vec::with_capacity(infos.len());
        for t in infos {
            let ty = if !allows_quantization(t) {
                t.ggml_type
            } else if default.is_quantized() {
                let ty = state.get_type_impl(t, default)?;
                fallback(t, ty)?
            } else {
                default
            };
            tensors.push((t.name.clone(), ty));
        }
        Ok(Plan { ftype, tensors })
    }

    /// The type planned for tensor `name`.
    pub fn get(&self, name: &str) -> Option<GgmlType> {
        self.tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, ty)| ty)
    }
    // ANCHOR_END: plan

    /// Replace the types of the tensors `list` names, exactly (no fallback: a type whose blocks
    /// do not divide the rows is an error naming the line).
    pub fn with_list(mut self, gguf: &Gguf, list: &TypeList) -> Result<Plan, RecipeError> {
        for e in &list.entries {
            let err = |reason: String| RecipeError::List {
                source: list.source.clone(),
                line: e.line,
                reason,
            };
            let Some(t) = gguf.tensor(&e.name) else {
                return Err(err(format!("the model has no tensor {:?}", e.name)));
            };
            let row = t.dims.first().copied().unwrap_or(1);
            if e.ty.row_bytes(row).is_none() {
                return Err(err(format!(
                    "{:?} has rows of {row} elements, not a whole number of {} blocks",
                    e.name, e.ty
                )));
            }
            match self.tensors.iter_mut().find(|(n, _)| *n == e.name) {
                Some(slot) => slot.1 = e.ty,
                None => return Err(err(format!("{:?} is not in the plan", e.name))),
            }
        }
        Ok(self)
    }

    /// The plan as a list of types, one `name TYPE` per line: what [`TypeList::parse`] reads.
    pub fn to_list(&self) -> String {
        let mut s = format!("# llama.cpp's {} recipe\n", self.ftype);
        for (name, ty) in &self.tensors {
            s.push_str(&format!("{name} {ty}\n"));
        }
        s
    }

    /// How many tensors get each type, most common first.
    pub fn type_counts(&self) -> Vec<(GgmlType, usize)> {
        let mut counts: Vec<(GgmlType, usize)> = vec![];
        for &(_, ty) in &self.tensors {
            match counts.iter_mut().find(|(t, _)| *t == ty) {
                Some(c) => c.1 += 1,
                None => counts.push((ty, 1)),
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.id().cmp(&b.0.id())));
        counts
    }
}

/// One line of a list of types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeEntry {
    pub name: String,
    pub ty: GgmlType,
    /// 1-based line number, for errors.
    pub line: usize,
}

/// Per-tensor types from a text list: `name TYPE` per line, `#` comments, blank lines
/// ignored. It reproduces any of llama.cpp's mixes exactly: `llama-quantize` prints each
/// tensor's type as it goes, and `Plan::to_list` writes this format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeList {
    /// Where the list came from (a path), for errors.
    pub source: String,
    pub entries: Vec<TypeEntry>,
}

impl TypeList {
    /// Parse `text`; errors name `source` and the line.
    pub fn parse(text: &str, source: &str) -> Result<TypeList, RecipeError> {
        let mut entries: Vec<TypeEntry> = vec![];
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let err = |reason: String| RecipeError::List {
                source: source.to_string(),
                line,
                reason,
            };
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let fields: Vec<&str> = content.split_whitespace().collect();
            let [name, ty] = fields[..] else {
                return Err(err(format!("expected `name TYPE`, found {content:?}")));
            };
            let ty =
                GgmlType::from_name(ty).ok_or_else(|| err(format!("unknown ggml type {ty:?}")))?;
            if !crate::quants::WEIGHT_TYPES.contains(&ty) {
                return Err(err(format!("no weight quantizer for {ty} here")));
            }
            if let Some(prev) = entries.iter().find(|e| e.name == name) {
                return Err(err(format!(
                    "{name:?} is already given on line {}",
                    prev.line
                )));
            }
            entries.push(TypeEntry {
                name: name.to_string(),
                ty,
                line,
            });
        }
        Ok(TypeList {
            source: source.to_string(),
            entries,
        })
    }

    /// Read and parse the list at `path`.
    pub fn read(path: &Path) -> Result<TypeList, RecipeError> {
        let text = std::fs::read_to_string(path).map_err(|e| RecipeError::List {
            source: path.display().to_string(),
            line: 0,
            reason: e.to_string(),
        })?;
        TypeList::parse(&text, &path.display().to_string())
    }
}

/// What [`quantize_gguf`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeReport {
    /// Bytes of the new file.
    pub file_size: u64,
    /// Elements and bytes of the tensors that could be quantized (the weight matrices).
    pub weight_elements: u64,
    pub weight_bytes: u64,
}

impl QuantizeReport {
    /// Bits per weight of the weight matrices.
    pub fn bits_per_weight(&self) -> f64 {
        self.weight_bytes as f64 * 8.0 / self.weight_elements as f64
    }
}

// ANCHOR: quantize_gguf
/// `llama_model_quantize` without an importance matrix: write `input` to `out` with every
/// tensor in the type `plan` gives it. A tensor already in its type is copied; the others are
/// dequantized to f32 and quantized again (`requantize`). The metadata is kept, with
/// `general.quantization_version` and `general.file_type` set as llama.cpp sets them, and the
/// tensors are written in llama.cpp's order — so the file is byte for byte what
/// `llama-quantize` writes from the same f32 values.
pub fn quantize_gguf<B: AsRef<[u8]>>(
    input: &GgufFile<B>,
    plan: &Plan,
    out: &Path,
) -> Result<QuantizeReport, RecipeError> {
    let mut w = GgufWriter::new();
    for (key, value) in &input.metadata {
        w.set(key, value.clone())?;
    }
    w.set("general.quantization_version", Value::U32(GGML_QNT_VERSION))?;
    w.set("general.file_type", Value::U32(plan.ftype.id()))?;
    for key in ["split.no", "split.count", "split.tensors.count"] {
        w.remove(key);
    }
    let (mut weight_elements, mut weight_bytes) = (0, 0);
    for (name, ty) in &plan.tensors {
        let t = input.tensor(name).ok_or_else(|| RecipeError::Tensor {
            name: name.clone(),
            reason: "is in the plan but not in the file".into(),
        })?;
        w.add_tensor(name, &t.dims, *ty)?;
        if allows_quantization(t) {
            weight_elements += t.n_elements();
            weight_bytes += w.tensors().last().expect("just added").n_bytes();
        }
    }
    let file_size = w.write_file(out, |t| -> Result<Vec<u8>, String> {
        let src = input.tensor(&t.name).expect("planned from this file");
        let bytes = input.bytes_of(src).map_err(|e| e.to_string())?;
        if src.ggml_type == t.ggml_type || t.n_bytes() == 0 {
            return Ok(bytes.to_vec());
        }
        requantize(src, bytes, t.ggml_type).map_err(|e| e.to_string())
    })?;
    Ok(QuantizeReport {
        file_size,
        weight_elements,
        weight_bytes,
    })
}
// ANCHOR_END: quantize_gguf

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ftype_names_and_ids_round_trip() {
        for f in LlamaFtype::ALL {
            assert_eq!(LlamaFtype::from_name(&f.name().to_lowercase()).unwrap(), f);
            assert_eq!(LlamaFtype::from_id(f.id()), Some(f));
        }
        let e = LlamaFtype::from_name("Q4_K_X").unwrap_err().to_string();
        assert!(e.contains("Q4_K_X") && e.contains("Q4_K_M"), "{e}");
        assert_eq!(LlamaFtype::from_id(4), None); // LLAMA_FTYPE_MOSTLY_Q4_1_SOME_F16, removed
    }

    #[test]
    fn llama_order_sorts_by_layer_then_name() {
        let mut names = vec![
            "blk.10.attn_k.weight",
            "token_embd.weight",
            "blk.2.ffn_up.weight",
            "blk.2.attn_k.weight",
            "output_norm.weight",
            "blk.1.x",
            "blkx.3.y",
            "blk.3x",
        ];
        names.sort_by(|a, b| llama_order(a, b));
        assert_eq!(
            names,
            [
                "blkx.3.y",
                "output_norm.weight",
                "token_embd.weight",
                "blk.1.x",
                "blk.2.attn_k.weight",
                "blk.2.ffn_up.weight",
                "blk.3x",
                "blk.10.attn_k.weight",
            ]
        );
    }

    #[test]
    fn use_more_bits_picks_ends_and_every_third_layer() {
        let more: Vec<usize> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
        assert_eq!(
            more,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
    }
}
