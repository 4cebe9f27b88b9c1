"""Step 6: model facts for chapter 1, from llama.cpp's C API and gguf-py, on the Q4_1 file."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from . import engine as E
from .common import write_json, write_safetensors

L = E.L

# First rows of these tensors are dequantized with gguf-py for chapter 1's dequantization check:
# the tied embedding (Q8_0), Q4_1 matrices with rows of 576 and 1536 values, and F32 vectors.
DEQUANT_TENSORS = (
    "token_embd.weight",
    "blk.0.attn_q.weight",
    "blk.0.ffn_down.weight",
    "blk.29.attn_v.weight",
    "blk.0.attn_norm.weight",
    "output_norm.weight",
)
DEQUANT_ROWS = 2


def _field_record(field: gguf.ReaderField) -> dict:
    t = field.types[0]
    rec: dict = {"type": t.name}
    if t == gguf.GGUFValueType.ARRAY:
        sub = field.types[-1]
        rec["item_type"] = sub.name
        rec["len"] = len(field.data)
        items = [field.parts[i] for i in field.data[:8]]
        if sub == gguf.GGUFValueType.STRING:
            rec["first"] = [bytes(x).decode("utf-8") for x in items]
        else:
            rec["first"] = [x.tolist()[0] for x in items]
    elif t == gguf.GGUFValueType.STRING:
        rec["value"] = bytes(field.parts[-1]).decode("utf-8")
    else:
        v = field.parts[-1].tolist()[0]
        rec["value"] = v
        if t in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
            # The exact bits, since a decimal rendering of an f32 can be ambiguous.
            rec["bits_hex"] = field.parts[-1].tobytes()[::-1].hex()
    return rec


def export_facts(model_path: Path, out_dir: Path) -> dict:
    reader = gguf.GGUFReader(model_path)
    meta = {
        f.name: _field_record(f) for f in reader.fields.values() if not f.name.startswith("GGUF.")
    }
    arch = meta["general.architecture"]["value"]

    model = E.Model(model_path)
    try:
        vocab = model.vocab
        api = {
            "n_embd": L.llama_model_n_embd(model.ptr),
            "n_layer": L.llama_model_n_layer(model.ptr),
            "n_head": L.llama_model_n_head(model.ptr),
            "n_head_kv": L.llama_model_n_head_kv(model.ptr),
            "n_vocab": L.llama_vocab_n_tokens(vocab),
            "n_ctx_train": L.llama_model_n_ctx_train(model.ptr),
            "rope_type": L.llama_model_rope_type(model.ptr),
            "rope_freq_scale_train": L.llama_model_rope_freq_scale_train(model.ptr),
            "vocab_type": L.llama_vocab_type(vocab),
            "bos": L.llama_vocab_bos(vocab),
            "eos": L.llama_vocab_eos(vocab),
            "eot": L.llama_vocab_eot(vocab),
            "pad": L.llama_vocab_pad(vocab),
            "add_bos": bool(L.llama_vocab_get_add_bos(vocab)),
            "add_eos": bool(L.llama_vocab_get_add_eos(vocab)),
            "n_params": L.llama_model_n_params(model.ptr),
            "model_size_bytes": L.llama_model_size(model.ptr),
        }
        buf = E.ctypes.create_string_buffer(256)
        L.llama_model_desc(model.ptr, buf, len(buf))
        api["desc"] = buf.value.decode()
        # llama.h has no getter for these: llama.cpp's own rendering of the metadata values.
        meta_str = {
            k: model.meta(k)
            for k in (
                f"{arch}.feed_forward_length",
                f"{arch}.rope.freq_base",
                f"{arch}.attention.layer_norm_rms_epsilon",
                f"{arch}.rope.dimension_count",
            )
        }
    finally:
        model.close()

    def mval(key):
        return meta[f"{arch}.{key}"]["value"]

    facts = {
        "model": model_path.name,
        "source": {
            "llama_api": "llama.h getters on the loaded model (llama_model_n_embd, ...)",
            "metadata": "GGUF metadata read by gguf-py; llama.h exposes no getter for n_ff, "
            "rope freq base or rms eps",
        },
        "n_embd": api["n_embd"],
        "n_layer": api["n_layer"],
        "n_head": api["n_head"],
        "n_head_kv": api["n_head_kv"],
        "head_dim": api["n_embd"] // api["n_head"],
        "n_ff": mval("feed_forward_length"),
        "n_ff_source": "metadata",
        "n_vocab": api["n_vocab"],
        "n_ctx_train": api["n_ctx_train"],
        "rope_freq_base": mval("rope.freq_base"),
        "rope_freq_base_source": "metadata",
        "rms_eps": mval("attention.layer_norm_rms_epsilon"),
        "rms_eps_bits_hex": meta[f"{arch}.attention.layer_norm_rms_epsilon"]["bits_hex"],
        "rms_eps_source": "metadata",
        "bos_id": api["bos"],
        "eos_id": api["eos"],
        "llama_api": api,
        "llama_meta_val_str": meta_str,
        "gguf": {
            "version": int(reader.fields["GGUF.version"].parts[-1][0]),
            "tensor_count": len(reader.tensors),
            "kv_count": int(reader.fields["GGUF.kv_count"].parts[-1][0]),
            "alignment": int(reader.alignment),
            "data_offset": int(reader.data_offset),
        },
        "metadata": meta,
        "tensors": [
            {
                "name": t.name,
                "type": t.tensor_type.name,
                "type_id": int(t.tensor_type),
                "ne": [int(x) for x in t.shape],
                "n_bytes": int(t.n_bytes),
                # Offset inside the data section, as stored in the tensor info.
                "offset": int(t.data_offset - reader.data_offset),
            }
            for t in reader.tensors
        ],
    }
    write_json(out_dir / "model/facts.json", facts)

    by_name = {t.name: t for t in reader.tensors}
    rows = {}
    for name in DEQUANT_TENSORS:
        t = by_name[name]
        n = min(DEQUANT_ROWS, int(t.data.shape[0]) if t.data.ndim > 1 else 1)
        raw = t.data[:n] if t.data.ndim > 1 else t.data[None, :]
        rows[name] = np.ascontiguousarray(
            gguf.quants.dequantize(raw, t.tensor_type).astype(np.float32)
        )
    write_safetensors(out_dir / "model/dequant.safetensors", rows, {"model": model_path.name})
    return {
        "dequant": {
            name: {"type": by_name[name].tensor_type.name, "shape": list(rows[name].shape)}
            for name in rows
        }
    }
