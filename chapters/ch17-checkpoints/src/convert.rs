//! The GGUF file a checkpoint makes: its metadata, each tensor's name, shape and type, and
//! each tensor's bytes — written to disk, or built in memory for the engine.

use crate::family::{Meta, permute_rows};
use crate::files::{Checkpoint, CheckpointError, bad};
use crate::vocab::tokenizer_keys;
use ch01::{GgmlType, Gguf, TensorInfo, Value};
use ch06::gguf_write::GgufWriter;
use ch06::recipe::{GGML_QNT_VERSION, LlamaFtype, Plan};
use ch06::requantize;
use ch10::mapped::AlignedBuf;
use safetensors::Dtype;
use serde_json::Value as Json;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

/// What the weights are stored as: `None` keeps the checkpoint's type for every matrix (and
/// F32 for vectors, as llama.cpp's converter does); a file type (`F16`, `Q4_K_M`, …) is
/// chapter 6's recipe for it.
pub type Precision = Option<LlamaFtype>;

// ANCHOR: source
/// Where a GGUF tensor's values come from, and what is done to them on the way.
#[derive(Debug, Clone)]
pub enum Source {
    /// A checkpoint tensor: its rows reordered for RoPE in `permute` heads, `shift` added to
    /// each value, only its first `rows` rows kept.
    Tensor {
        hf: String,
        dtype: Dtype,
        permute: Option<usize>,
        shift: f32,
        rows: usize,
    },
    /// Values computed from the configuration (Llama 3's RoPE factors).
    Computed(Vec<f32>),
}

/// The GGUF file to make: its header, and where each tensor comes from.
pub struct Planned {
    pub writer: GgufWriter,
    pub sources: HashMap<String, Source>,
}
// ANCHOR_END: source

/// Tensors computed from the configuration: (name, values).
pub type Computed = Vec<(String, Vec<f32>)>;

/// `config.json`'s value of `key` (or the family's default).
fn num(ckpt: &Checkpoint, key: &str) -> Option<f64> {
    let v = ckpt.config.get(key).filter(|v| !v.is_null());
    v.and_then(Json::as_f64)
        .or_else(|| ckpt.family.default_of(key))
}

/// `config.json`'s count `key`: a whole number that fits GGUF's u32.
fn count(ckpt: &Checkpoint, key: &str) -> Result<u32, String> {
    match num(ckpt, key) {
        Some(v) if v >= 0.0 && v.fract() == 0.0 && v <= u32::MAX as f64 => Ok(v as u32),
        Some(v) => Err(format!("{key}: {v} is not a count")),
        None => Err(format!("{key}: missing")),
    }
}

impl Checkpoint {
    // ANCHOR: hparams
    /// The architecture's metadata keys from `config.json`, and any tensors computed from it.
    pub fn hparams(&self) -> Result<(Meta, Computed), CheckpointError> {
        let file = self.dir.join("config.json");
        let err = |e: String| bad(&file, e);
        let a = self.family.arch;
        let key = |k: &str| format!("{a}.{k}");
        let n_head = count(self, "num_attention_heads").map_err(err)?;
        let n_head_kv = match self.config.get("num_key_value_heads") {
            Some(Json::Null) | None => n_head,
            Some(_) => count(self, "num_key_value_heads").map_err(err)?,
        };
        let d_model = count(self, "hidden_size").map_err(err)?;
        let head_dim = match num(self, "head_dim") {
            Some(_) => count(self, "head_dim").map_err(err)?,
            None => d_model
                .checked_div(n_head)
                .ok_or_else(|| err("num_attention_heads: 0".into()))?,
        };
        let mut meta: Meta = vec![
            (
                key("block_count"),
                Value::U32(count(self, "num_hidden_layers").map_err(err)?),
            ),
            (
                key("context_length"),
                Value::U32(count(self, "max_position_embeddings").map_err(err)?),
            ),
            (key("embedding_length"), Value::U32(d_model)),
            (
                key("feed_forward_length"),
                Value::U32(count(self, "intermediate_size").map_err(err)?),
            ),
            (key("attention.head_count"), Value::U32(n_head)),
            (key("attention.head_count_kv"), Value::U32(n_head_kv)),
            (key("attention.key_length"), Value::U32(head_dim)),
            (key("attention.value_length"), Value::U32(head_dim)),
            (key("rope.dimension_count"), Value::U32(head_dim)),
        ];
        let eps = num(self, "rms_norm_eps").ok_or_else(|| err("rms_norm_eps: missing".into()))?;
        meta.push((
            key("attention.layer_norm_rms_epsilon"),
            Value::F32(eps as f32),
        ));
        let computed = self.rope(&mut meta, head_dim as usize).map_err(err)?;
        (self.family.extra)(&self.config, &mut meta).map_err(err)?;
        Ok((meta, computed))
    }
    // ANCHOR_END: hparams

    // ANCHOR: rope
    /// RoPE's base and scaling: `rope_parameters` (newer `config.json`s) or `rope_scaling`
    /// with `rope_theta`. Linear and YaRN scaling are keys; Llama 3's is a tensor of factors,
    /// computed here as llama.cpp's converter computes it.
    fn rope(&self, meta: &mut Meta, head_dim: usize) -> Result<Computed, String> {
        let a = self.family.arch;
        let key = |k: &str| format!("{a}.{k}");
        let params = ["rope_parameters", "rope_scaling"]
            .iter()
            .find_map(|k| self.config.get(*k).filter(|v| v.is_object()));
        // Gemma 3's newer form keeps the global layers' parameters apart.
        let params = params.map(|p| p.get("full_attention").unwrap_or(p));
        let get = |k: &str| params.and_then(|p| p.get(k)).and_then(Json::as_f64);
        let base = get("rope_theta")
            .or_else(|| num(self, "rope_theta"))
            .unwrap_or(10000.0);
        meta.push((key("rope.freq_base"), Value::F32(base as f32)));
        let kind = params.and_then(|p| p.get("rope_type").or_else(|| p.get("type")));
        let factor = get("factor").unwrap_or(1.0);
        let original = get("original_max_position_embeddings");
        match kind.and_then(Json::as_str) {
            None | Some("default") => Ok(Vec::new()),
            Some("linear") => {
                meta.push((key("rope.scaling.type"), Value::String("linear".into())));
                meta.push((key("rope.scaling.factor"), Value::F32(factor as f32)));
                Ok(Vec::new())
            }
            Some("yarn") => {
                meta.push((key("rope.scaling.type"), Value::String("yarn".into())));
                meta.push((key("rope.scaling.factor"), Value::F32(factor as f32)));
                if let Some(o) = original {
                    let o = Value::U32(o as u32);
                    meta.push((key("rope.scaling.original_context_length"), o));
                }
                Ok(Vec::new())
            }
            Some("llama3") => {
                let low = get("low_freq_factor").unwrap_or(1.0) as f32;
                let high = get("high_freq_factor").unwrap_or(4.0) as f32;
                let old = original.unwrap_or(8192.0) as f32;
                let f = llama3_factors(base as f32, head_dim, factor as f32, low, high, old);
                Ok(vec![("rope_freqs.weight".into(), f)])
            }
            Some(other) => Err(format!(
                "rope_scaling: rope_type {other:?} is not supported"
            )),
        }
    }
    // ANCHOR_END: rope
}

/// Llama 3's RoPE factors (`LlamaModel.generate_extra_tensors` of llama.cpp's converter): 1
/// for wavelengths under `old / high`, `factor` over `old / low`, and a smooth blend between.
pub fn llama3_factors(
    base: f32,
    dim: usize,
    factor: f32,
    low: f32,
    high: f32,
    old: f32,
) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    (0..dim / 2)
        .map(|i| {
            let freq = 1.0 / base.powf((2 * i) as f32 / dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// The GGUF type a checkpoint dtype is kept as, if the engine computes on it.
pub(crate) fn kept_type(dtype: Dtype) -> Option<GgmlType> {
    match dtype {
        Dtype::F32 => Some(GgmlType::F32),
        Dtype::F16 => Some(GgmlType::F16),
        Dtype::BF16 => Some(GgmlType::BF16),
        _ => None,
    }
}

/// What the tensors of a checkpoint are planned with: the model's shape as the metadata says.
struct Shape {
    n_vocab: usize,
    n_layer: usize,
    n_head: usize,
    n_head_kv: usize,
}

impl Checkpoint {
    // ANCHOR: plan
    /// The GGUF file this checkpoint makes at `precision`: metadata (the architecture's, the
    /// tokenizer's, `general.*`), and every tensor under llama.cpp's name with its type.
    pub fn plan(&self, precision: Precision) -> Result<Planned, CheckpointError> {
        let (arch_meta, computed) = self.hparams()?;
        let (tok_meta, n_vocab) = tokenizer_keys(self)?;
        let a = self.family.arch;
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        let mut meta: Meta = vec![
            ("general.architecture".into(), Value::String(a.into())),
            (
                "general.name".into(),
                Value::String(name.unwrap_or_default()),
            ),
        ];
        meta.extend(arch_meta);
        meta.push((format!("{a}.vocab_size"), Value::U32(n_vocab as u32)));
        let omitted = |k: &str| {
            let key = k.strip_prefix(a).and_then(|k| k.strip_prefix('.'));
            key.is_some_and(|k| self.family.omitted.contains(&k))
        };
        meta.retain(|(k, _)| !omitted(k));
        meta.extend(tok_meta);
        let get = |k: &str| match meta.iter().find(|(m, _)| *m == format!("{a}.{k}")) {
            Some((_, Value::U32(v))) => *v as usize,
            _ => 0,
        };
        let shape = Shape {
            n_vocab,
            n_layer: get("block_count"),
            n_head: get("attention.head_count"),
            n_head_kv: get("attention.head_count_kv"),
        };
        let (mut infos, mut sources) = (Vec::new(), HashMap::new());
        for hf in self.tensors.keys() {
            if let Some((info, source)) = self.plan_tensor(hf, &shape)? {
                sources.insert(info.name.clone(), source);
                infos.push(info);
            }
        }
        for (name, values) in computed {
            let (dims, ggml_type) = (vec![values.len() as u64], GgmlType::F32);
            infos.push(TensorInfo {
                name: name.clone(),
                dims,
                ggml_type,
                offset: 0,
            });
            sources.insert(name, Source::Computed(values));
        }
        self.typed(meta, infos, sources, precision)
    }
    // ANCHOR_END: plan

    // ANCHOR: plan_tensor
    /// Checkpoint tensor `hf` as a GGUF tensor (in its own type, vectors in F32) and where its
    /// values come from; `None` for one the text model does not use.
    fn plan_tensor(
        &self,
        hf: &str,
        m: &Shape,
    ) -> Result<Option<(TensorInfo, Source)>, CheckpointError> {
        let (t, file) = (&self.tensors[hf], self.file_of(hf));
        let err = |why: String| Err(bad(file, format!("tensor {hf:?}: {why}")));
        let Some(name) = self.family.gguf_name(hf).map_err(|e| bad(file, e))? else {
            return Ok(None);
        };
        let layer = name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next()?.parse().ok());
        if layer.is_some_and(|l: usize| l >= m.n_layer) {
            return err(format!("a layer beyond num_hidden_layers {}", m.n_layer));
        }
        let Some(own) = kept_type(t.dtype) else {
            return err(format!(
                "dtype {:?} (the engine reads F32, F16 and BF16)",
                t.dtype
            ));
        };
        let mut dims: Vec<u64> = t.shape.iter().rev().map(|&d| d as u64).collect();
        // The embeddings and output may have rows past the tokenizer's last token.
        let mut rows = t.shape.first().copied().unwrap_or(1);
        if matches!(name.as_str(), "token_embd.weight" | "output.weight") && dims.len() == 2 {
            if rows < m.n_vocab {
                return err(format!("{rows} rows for {} tokens", m.n_vocab));
            }
            (rows, dims[1]) = (m.n_vocab, m.n_vocab as u64);
        }
        // ANCHOR_END: plan_tensor
        // ANCHOR: plan_tensor_rest
        let heads = match name.rsplit('.').nth(1) {
            Some("attn_q") => Some(m.n_head),
            Some("attn_k") => Some(m.n_head_kv),
            _ => None,
        };
        let permute = heads.filter(|_| self.family.permute_qk);
        if let Some(h) = permute
            && (h == 0 || !rows.is_multiple_of(2 * h))
        {
            return err(format!("{rows} rows do not split into {h} heads of pairs"));
        }
        let shift = if name.ends_with("norm.weight") {
            self.family.norm_shift
        } else {
            0.0
        };
        // Vectors are kept in F32, as llama.cpp's converter keeps them.
        let ggml_type = if dims.len() < 2 { GgmlType::F32 } else { own };
        let (hf, dtype) = (hf.to_string(), t.dtype);
        let source = Source::Tensor {
            hf,
            dtype,
            permute,
            shift,
            rows,
        };
        Ok(Some((
            TensorInfo {
                name,
                dims,
                ggml_type,
                offset: 0,
            },
            source,
        )))
    }
    // ANCHOR_END: plan_tensor_rest

    /// The writer of `infos` under `meta`, each tensor's type chosen by `precision`.
    fn typed(
        &self,
        meta: Meta,
        infos: Vec<TensorInfo>,
        sources: HashMap<String, Source>,
        precision: Precision,
    ) -> Result<Planned, CheckpointError> {
        let gguf = Gguf::new(3, meta.clone(), infos, 32, 0);
        let plan = match precision {
            Some(ftype) => {
                Some(Plan::new(&gguf, ftype).map_err(|e| bad(&self.dir, e.to_string()))?)
            }
            None => None,
        };
        let w_err = |e: ch06::gguf_write::WriteError| bad(&self.dir, e.to_string());
        let mut writer = GgufWriter::new();
        for (k, v) in meta {
            writer.set(&k, v).map_err(w_err)?;
        }
        let ftype = precision.unwrap_or_else(|| file_type_of(&gguf.tensors));
        // What llama.cpp's converter writes of every file besides: its kind, its size class
        // (for file names and model cards) and the quantization format's version.
        let params: u64 = gguf.tensors.iter().map(|t| t.n_elements()).sum();
        for (k, v) in [
            ("general.type", Value::String("model".into())),
            ("general.size_label", Value::String(size_label(params))),
            ("general.file_type", Value::U32(ftype.id())),
            ("general.quantization_version", Value::U32(GGML_QNT_VERSION)),
        ] {
            writer.set(k, v).map_err(w_err)?;
        }
        for t in &gguf.tensors {
            let ty = plan
                .as_ref()
                .and_then(|p| p.get(&t.name))
                .unwrap_or(t.ggml_type);
            writer.add_tensor(&t.name, &t.dims, ty).map_err(w_err)?;
        }
        Ok(Planned { writer, sources })
    }

    // ANCHOR: tensor_data
    /// The bytes of GGUF tensor `t` of `planned`: the checkpoint's own bytes when nothing
    /// changes them, else its values reordered, shifted and stored as `t`'s type.
    pub fn tensor_data<'a>(
        &'a self,
        planned: &Planned,
        t: &TensorInfo,
    ) -> Result<Cow<'a, [u8]>, String> {
        let (bytes, dtype, permute, shift, rows): (Cow<[u8]>, _, _, _, _) =
            match &planned.sources[&t.name] {
                Source::Computed(v) => (Cow::Owned(bytemuck_f32(v)), Dtype::F32, None, 0.0, 1),
                Source::Tensor {
                    hf,
                    dtype,
                    permute,
                    shift,
                    rows,
                } => {
                    let b = self
                        .bytes(hf)
                        .ok_or_else(|| format!("tensor {hf:?} is gone"))?;
                    (Cow::Borrowed(b), *dtype, *permute, *shift, *rows)
                }
            };
        let n_cols = t.dims[0] as usize;
        let row_bytes = n_cols * dtype.bitsize() / 8;
        let n_rows = if t.dims.len() < 2 {
            n_cols / n_cols.max(1)
        } else {
            rows
        };
        let mut bytes = match bytes {
            Cow::Borrowed(b) => Cow::Borrowed(&b[..(n_rows * row_bytes).min(b.len())]),
            owned => owned,
        };
        if let Some(heads) = permute {
            // A bias is one value per row.
            let per_row = if t.dims.len() < 2 {
                dtype.bitsize() / 8
            } else {
                row_bytes
            };
            bytes = Cow::Owned(permute_rows(&bytes, heads, per_row));
        }
        if shift == 0.0 && kept_type(dtype) == Some(t.ggml_type) {
            return Ok(bytes);
        }
        let mut values = to_f32(&bytes, dtype);
        values.iter_mut().for_each(|v| *v += shift);
        Ok(Cow::Owned(from_f32(&values, t)?))
    }
    // ANCHOR_END: tensor_data

    // ANCHOR: write
    /// Write the GGUF file at `precision` to `out`; returns its size in bytes.
    pub fn write_gguf(
        &self,
        out: &Path,
        precision: Precision,
    ) -> Result<u64, Box<dyn std::error::Error>> {
        let planned = self.plan(precision)?;
        let n = planned
            .writer
            .write_file(out, |t| self.tensor_data(&planned, t))?;
        Ok(n)
    }

    /// The same file built in memory: what the engine loads a directory as with `--no-mmap`.
    pub fn image(&self, precision: Precision) -> Result<AlignedBuf, Box<dyn std::error::Error>> {
        let planned = self.plan(precision)?;
        let size = usize::try_from(planned.writer.file_size())?;
        let mut buf = AlignedBuf::zeroed(size);
        let mut out: &mut [u8] = buf.as_mut();
        planned
            .writer
            .write(&mut out, |t| self.tensor_data(&planned, t))?;
        Ok(buf)
    }
    // ANCHOR_END: write
}

/// gguf-py's size class of a model of `params` weights: two significant digits at least,
/// in thousands, millions, billions or trillions (`42M`, `1.5B`).
fn size_label(params: u64) -> String {
    let n = params as f64;
    let (scaled, suffix) = match n {
        n if n > 1e12 => (n * 1e-12, "T"),
        n if n > 1e9 => (n * 1e-9, "B"),
        n if n > 1e6 => (n * 1e-6, "M"),
        n => (n * 1e-3, "K"),
    };
    let digits = (scaled.round() as u64).to_string();
    let whole = digits.trim_start_matches('0').len();
    format!("{scaled:.*}{suffix}", 2usize.saturating_sub(whole))
}

/// llama.cpp's `general.file_type` for a file whose matrices keep their types: that of most
/// of them.
fn file_type_of(tensors: &[TensorInfo]) -> LlamaFtype {
    let matrices = tensors.iter().filter(|t| t.dims.len() >= 2);
    let count = |ty| matrices.clone().filter(|t| t.ggml_type == ty).count();
    let (f32, f16, bf16) = (
        count(GgmlType::F32),
        count(GgmlType::F16),
        count(GgmlType::BF16),
    );
    if bf16 >= f16.max(f32) && bf16 > 0 {
        LlamaFtype::BF16
    } else if f16 > f32 {
        LlamaFtype::F16
    } else {
        LlamaFtype::F32
    }
}

fn bytemuck_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian `dtype` values as f32 (`dtype` is one [`kept_type`] accepts).
pub fn to_f32(bytes: &[u8], dtype: Dtype) -> Vec<f32> {
    match dtype {
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    }
}

/// `values` stored as `t`'s type: a float type rounded to nearest even (as ggml rounds), a
/// quantized one by chapter 6's quantizer.
fn from_f32(values: &[f32], t: &TensorInfo) -> Result<Vec<u8>, String> {
    Ok(match t.ggml_type {
        GgmlType::F32 => bytemuck_f32(values),
        GgmlType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        ty => {
            let f32_info = TensorInfo {
                ggml_type: GgmlType::F32,
                ..t.clone()
            };
            requantize(&f32_info, &bytemuck_f32(values), ty).map_err(|e| e.to_string())?
        }
    })
}
