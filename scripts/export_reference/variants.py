"""Step 11: synthetic variants of the llama family, for chapter 13's and 18's checks against
llama.cpp: Llama 3's RoPE frequency factors, YaRN scaling, Qwen2's Q/K/V biases, Qwen3's norms
on the queries and keys, and the mixtures of experts of Qwen3-MoE and OLMoE.

No small real model of these is on the package registries the project can reach, so each is
synthetic: the shapes and metadata of the real family (scaled down: two layers, a 128-wide
residual stream, 64-wide heads), a real vocabulary copied from one of llama.cpp's
`ggml-vocab-*.gguf` files in reference-data/tokenizer/, and random F32 weights.

The weights are not committed. Each variant is a *recipe* (`variants/<id>/model.json`): its
metadata, and for every tensor its shape and either explicit values (the frequency factors) or
a seeded generator — `offset + scale * (2u - 1)` with `u` from splitmix64 of `seed + index`,
all in f32 — with the sha256 of the bytes it makes. gguf-py builds the file here from the
recipe; the Rust tests build the same file from the same recipe (and check every tensor's
sha256), so both engines run identical weights.

What llama.cpp computed is stored per variant: every intermediate tensor of both layers for a
prompt of about 70 tokens (the last position's logits), and a greedy continuation with the top
logits of each step (decode through the KV cache).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

from . import engine as E
from . import prompts as P
from .common import log, sha256_bytes, write_json, write_safetensors

# Tensors stored for every layer (both layers are stored in full).
LAYER_TENSORS = dict(P.LAYER_TENSORS)
N_GENERATE = 8

PROMPT = (
    "The old lighthouse keeper climbed the spiral stairs every evening, counting the steps "
    "as his father had taught him: one hundred and twelve, never more, never fewer. Tonight "
    "the fog was thick, and the lamp"
)

MASK64 = (1 << 64) - 1


def splitmix_uniform(seed: int, n: int) -> np.ndarray:
    """u in [0, 1) for indices 0..n: the top 24 bits of splitmix64(seed + index), exact in f32."""
    with np.errstate(over="ignore"):
        x = np.arange(n, dtype=np.uint64) + np.uint64(seed & MASK64)
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)


def generated(seed: int, n: int, scale: float, offset: float) -> np.ndarray:
    u = splitmix_uniform(seed, n)
    t = np.float32(2.0) * u - np.float32(1.0)  # exact
    return (np.float32(scale) * t + np.float32(offset)).astype(np.float32)


@dataclass
class Variant:
    id: str
    arch: str
    vocab: str  # ggml-vocab-<vocab>.gguf
    what: str
    n_head: int
    n_head_kv: int
    d_model: int = 128
    head_dim: int = 64
    n_ff: int = 384
    n_layer: int = 2
    context_length: int = 8192
    freq_base: float = 10000.0
    extra: dict = field(default_factory=dict)  # more metadata: suffix -> (type, value)
    biases: bool = False
    tied: bool = True
    rope_freqs: list[float] | None = None
    qk_norm: bool = False  # attn_q_norm, attn_k_norm: (head_dim) weights, Qwen3's
    qk_norm_full: bool = False  # the norms across the whole width instead (OLMoE's)
    tensors_dropped: tuple[str, ...] = ()
    tensors_added: dict = field(default_factory=dict)  # more layer tensors: name -> op
    # A mixture of experts in place of the SwiGLU network (Qwen3-MoE's): (n_expert,
    # n_expert_used, n_ff_exp), with a router `ffn_gate_inp` and 3-D `ffn_*_exps` tensors.
    moe: tuple[int, int, int] | None = None


def llama3_factors(head_dim: int, base: float, factor: float, low: float, high: float, orig: int):
    """Llama 3's `rope_freqs`, as llama.cpp's converter computes them from `rope_scaling`
    (`"rope_type": "llama3"`): long wavelengths slowed by `factor`, short ones kept, a smooth
    blend between."""
    low_wavelen = orig / low
    high_wavelen = orig / high
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (base ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


VARIANTS = [
    Variant(
        id="llama3",
        arch="llama",
        vocab="llama-bpe",
        what="Llama 3: rope_freqs.weight from the llama3 rope_scaling (factor 8, low 1, high 4, "
        "original context 8192), base 500000, Llama 3's 128k vocabulary",
        n_head=2,
        n_head_kv=1,
        context_length=131072,
        freq_base=500000.0,
        rope_freqs=llama3_factors(64, 500000.0, 8.0, 1.0, 4.0, 8192),
    ),
    Variant(
        id="yarn",
        arch="llama",
        vocab="llama-spm",
        what="YaRN: rope.scaling.type yarn, factor 4, original context 4096, attn_factor 1.25; "
        "an untied output matrix; Llama 2's 32k vocabulary",
        n_head=4,
        n_head_kv=2,
        context_length=16384,
        extra={
            "rope.scaling.type": ("str", "yarn"),
            "rope.scaling.factor": ("f32", 4.0),
            "rope.scaling.original_context_length": ("u32", 4096),
            "rope.scaling.attn_factor": ("f32", 1.25),
        },
        tied=False,
    ),
    Variant(
        id="qwen2",
        arch="qwen2",
        vocab="qwen2",
        what="Qwen2: biases on Q, K and V, NeoX RoPE (rotating halves), base 1000000, Qwen2's "
        "152k vocabulary",
        n_head=2,
        n_head_kv=1,
        context_length=32768,
        freq_base=1000000.0,
        biases=True,
        # qwen2's graph names no attn_out (llama.cpp's qwen2.cpp has no such callback).
        tensors_dropped=("attn_out",),
    ),
    Variant(
        id="qwen3",
        arch="qwen3",
        vocab="qwen2",
        what="Qwen3: per-head RMS norms on the queries and keys before RoPE, no biases, NeoX "
        "RoPE, base 1000000, four 64-wide query heads (256 wide, twice the residual stream), "
        "Qwen2's 152k vocabulary",
        n_head=4,
        n_head_kv=2,
        context_length=40960,
        freq_base=1000000.0,
        qk_norm=True,
        # qwen3's graph names no attn_out either; it names the normalised queries and keys.
        tensors_dropped=("attn_out",),
        tensors_added={"Qcur_normed": "MUL", "Kcur_normed": "MUL"},
    ),
    Variant(
        id="qwen3moe",
        arch="qwen3moe",
        vocab="qwen2",
        what="Qwen3-MoE: Qwen3's attention, and in place of SwiGLU a mixture of 8 SwiGLU "
        "experts 64 wide, 2 used per token (softmax router, top 2, weights renormalised), "
        "Qwen2's 152k vocabulary",
        n_head=4,
        n_head_kv=2,
        context_length=40960,
        freq_base=1000000.0,
        qk_norm=True,
        extra={
            "expert_count": ("u32", 8),
            "expert_used_count": ("u32", 2),
            "expert_feed_forward_length": ("u32", 64),
        },
        moe=(8, 2, 64),
        # The graph names neither attn_out nor the dense network's tensors; it names the
        # router's logits and probabilities, the chosen experts' renormalised weights, and
        # the weighted sum of their outputs.
        tensors_dropped=("attn_out", "ffn_gate", "ffn_up", "ffn_swiglu", "ffn_out"),
        tensors_added={
            "Qcur_normed": "MUL",
            "Kcur_normed": "MUL",
            "ffn_moe_logits": "MUL_MAT",
            "ffn_moe_probs": "SOFT_MAX",
            "ffn_moe_weights_norm": "DIV",
            "ffn_moe_out": "ADD",
        },
    ),
    Variant(
        id="olmoe",
        arch="olmoe",
        vocab="gpt-neox",
        what="OLMoE: query and key RMS norms across the whole width, NeoX RoPE, and a mixture of "
        "8 SwiGLU experts 64 wide (feed_forward_length), 2 used per token (softmax router, top 2, "
        "the probabilities as weights, not renormalised), GPT-NeoX's vocabulary",
        n_head=2,
        n_head_kv=2,
        n_ff=64,
        context_length=4096,
        # llama.cpp's OLMoE requires an output matrix of its own.
        tied=False,
        qk_norm=True,
        qk_norm_full=True,
        extra={
            "expert_count": ("u32", 8),
            "expert_used_count": ("u32", 2),
        },
        moe=(8, 2, 64),
        # As Qwen3-MoE's, but the chosen weights are not renormalised: the graph names them
        # ffn_moe_weights (rows of the probabilities).
        tensors_dropped=("attn_out", "ffn_gate", "ffn_up", "ffn_swiglu", "ffn_out"),
        tensors_added={
            "Qcur_normed": "MUL",
            "Kcur_normed": "MUL",
            "ffn_moe_logits": "MUL_MAT",
            "ffn_moe_probs": "SOFT_MAX",
            "ffn_moe_weights": "GET_ROWS",
            "ffn_moe_out": "ADD",
        },
    ),
]


def recipe(v: Variant, vocab_size: int) -> dict:
    """The variant's metadata and tensor list; tensor seeds are numbered in list order."""
    a = v.arch
    meta = {
        f"{a}.block_count": ("u32", v.n_layer),
        f"{a}.context_length": ("u32", v.context_length),
        f"{a}.embedding_length": ("u32", v.d_model),
        f"{a}.feed_forward_length": ("u32", v.n_ff),
        f"{a}.attention.head_count": ("u32", v.n_head),
        f"{a}.attention.head_count_kv": ("u32", v.n_head_kv),
        f"{a}.attention.key_length": ("u32", v.head_dim),
        f"{a}.attention.value_length": ("u32", v.head_dim),
        f"{a}.rope.dimension_count": ("u32", v.head_dim),
        f"{a}.rope.freq_base": ("f32", v.freq_base),
        f"{a}.attention.layer_norm_rms_epsilon": ("f32", 1e-5),
        **{f"{a}.{k}": t for k, t in v.extra.items()},
    }
    d, q, kv, ff = v.d_model, v.n_head * v.head_dim, v.n_head_kv * v.head_dim, v.n_ff
    tensors = []

    def mat(name, cols, rows):
        # Uniform with variance 1/cols: activations keep their size through a product.
        tensors.append({"name": name, "ne": [cols, rows], "scale": math.sqrt(3.0 / cols),
                        "offset": 0.0})

    def experts(name, cols, rows, n):
        # n matrices of (rows, cols), each as mat() makes them.
        tensors.append({"name": name, "ne": [cols, rows, n], "scale": math.sqrt(3.0 / cols),
                        "offset": 0.0})

    def vec(name, n, scale, offset):
        tensors.append({"name": name, "ne": [n], "scale": scale, "offset": offset})

    tensors.append({"name": "token_embd.weight", "ne": [d, vocab_size], "scale": 1.0,
                    "offset": 0.0})
    if v.rope_freqs is not None:
        tensors.append({"name": "rope_freqs.weight", "ne": [v.head_dim // 2],
                        "values": [float(np.float32(x)) for x in v.rope_freqs]})
    for il in range(v.n_layer):
        b = f"blk.{il}"
        vec(f"{b}.attn_norm.weight", d, 0.25, 1.0)
        mat(f"{b}.attn_q.weight", d, q)
        mat(f"{b}.attn_k.weight", d, kv)
        mat(f"{b}.attn_v.weight", d, kv)
        if v.biases:
            vec(f"{b}.attn_q.bias", q, 0.5, 0.0)
            vec(f"{b}.attn_k.bias", kv, 0.5, 0.0)
            vec(f"{b}.attn_v.bias", kv, 0.5, 0.0)
        if v.qk_norm:
            qn, kn = (q, kv) if v.qk_norm_full else (v.head_dim, v.head_dim)
            vec(f"{b}.attn_q_norm.weight", qn, 0.5, 1.0)
            vec(f"{b}.attn_k_norm.weight", kn, 0.5, 1.0)
        mat(f"{b}.attn_output.weight", q, d)
        vec(f"{b}.ffn_norm.weight", d, 0.25, 1.0)
        if v.moe is not None:
            n_exp, _, ff_exp = v.moe
            # The router at mat()'s scale: logits of about unit size, so the softmax spreads
            # the tokens over the experts instead of sending them all to one.
            mat(f"{b}.ffn_gate_inp.weight", d, n_exp)
            experts(f"{b}.ffn_gate_exps.weight", d, ff_exp, n_exp)
            experts(f"{b}.ffn_up_exps.weight", d, ff_exp, n_exp)
            experts(f"{b}.ffn_down_exps.weight", ff_exp, d, n_exp)
        else:
            mat(f"{b}.ffn_gate.weight", d, ff)
            mat(f"{b}.ffn_up.weight", d, ff)
            mat(f"{b}.ffn_down.weight", ff, d)
    vec("output_norm.weight", d, 0.25, 1.0)
    if not v.tied:
        mat("output.weight", d, vocab_size)
    for seed, t in enumerate(tensors, start=1):
        if "values" not in t:
            t["seed"] = seed * 1_000_003
        t["sha256"] = sha256_bytes(tensor_values(t).tobytes())
    return {
        "id": v.id,
        "what": v.what,
        "arch": v.arch,
        "vocab": f"tokenizer/ggml-vocab-{v.vocab}.gguf",
        "copied_keys": "every tokenizer.* key of the vocabulary file",
        "generator": "seeded tensors: offset + scale * (2u - 1) in f32, u = (splitmix64(seed + "
        "index) >> 40) * 2^-24; sha256 of the little-endian f32 bytes",
        "metadata": {k: {"type": t, "value": val} for k, (t, val) in meta.items()},
        "tensors": tensors,
    }


def tensor_values(t: dict) -> np.ndarray:
    n = int(np.prod(t["ne"]))
    if "values" in t:
        return np.asarray(t["values"], dtype=np.float32)
    return generated(t["seed"], n, t["scale"], t["offset"])


def write_model(rec: dict, vocab_path: Path, dst: Path) -> None:
    """Build the GGUF file of a recipe with gguf-py."""
    reader = gguf.GGUFReader(vocab_path)
    tmp = dst.with_name(dst.name + ".partial")
    w = gguf.GGUFWriter(tmp, rec["arch"])
    types = {"u32": gguf.GGUFValueType.UINT32, "f32": gguf.GGUFValueType.FLOAT32,
             "str": gguf.GGUFValueType.STRING}
    for k, m in rec["metadata"].items():
        w.add_key_value(k, m["value"], types[m["type"]])
    for f in reader.fields.values():
        if not f.name.startswith("tokenizer."):
            continue
        val_type = f.types[0]
        sub_type = f.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), val_type, sub_type=sub_type)
    for t in rec["tensors"]:
        data = tensor_values(t)
        if sha256_bytes(data.tobytes()) != t["sha256"]:
            raise RuntimeError(f"{t['name']}: values differ from the recipe's sha256")
        w.add_tensor(t["name"], data.reshape(tuple(reversed(t["ne"]))),
                     raw_dtype=gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)


def export_variants(tokenizer_dir: Path, cache: Path, out_dir: Path,
                    settings: E.ContextSettings) -> dict:
    """Write variants/<id>/model.json, prompt.safetensors, generation.safetensors for every
    variant; return the manifest section."""
    section = {}
    for v in VARIANTS:
        vocab_path = tokenizer_dir / f"ggml-vocab-{v.vocab}.gguf"
        vocab_size = len(gguf.GGUFReader(vocab_path).fields["tokenizer.ggml.tokens"].data)
        rec = recipe(v, vocab_size)
        path = cache / "variants" / f"{v.id}.gguf"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_model(rec, vocab_path, path)
        model = E.Model(path)
        try:
            ids = model.tokenize(PROMPT, add_special=True, parse_special=False)
            log(f"variant {v.id}: {len(ids)} prompt tokens")
            layer_tensors = {k: op for k, op in LAYER_TENSORS.items()
                             if k not in v.tensors_dropped}
            layer_tensors.update(v.tensors_added)
            wanted = P.wanted_names(v.n_layer, layer_tensors, tuple(range(v.n_layer)),
                                    P.GLOBAL_TENSORS)
            t, _, _, _ = P.capture_prompt(model, settings, ids, v.n_layer, wanted,
                                          all_logits=False)
            t["tokens"] = np.asarray(ids, dtype=np.int32)
            write_safetensors(out_dir / f"variants/{v.id}/prompt.safetensors", t,
                              {"variant": v.id})
            gen = P.generate(model, settings, ids, N_GENERATE, 1, prompt_logits=False)
            write_safetensors(
                out_dir / f"variants/{v.id}/generation.safetensors",
                {
                    "generated": np.asarray(gen["ids"], dtype=np.int32),
                    "topk_ids": gen["topk_ids"],
                    "topk_logits": gen["topk_logits"],
                },
                {"variant": v.id},
            )
        finally:
            model.close()
        rec["prompt"] = {"text": PROMPT, "add_special": True, "parse_special": False,
                         "ids": ids}
        rec["generated"] = gen["ids"]
        write_json(out_dir / f"variants/{v.id}/model.json", rec)
        section[v.id] = {"what": v.what, "n_prompt_tokens": len(ids)}
    return section
