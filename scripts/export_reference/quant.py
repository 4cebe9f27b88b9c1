"""Step 8: quantized references for chapter 6.

- Whole-model variants: the F32 copy quantized by llama.cpp (`llama_model_quantize`, no
  imatrix) into Q8_0, Q4_0, Q4_K_M and Q6_K. The files stay in the cache (chapter 8 times
  them too); `quant/variants.json` records every tensor's type, shape and sha256, and the
  short prompt's logits and greedy continuation on each variant and on the original Q4_1 file.
- Block references: gguf-py's quantization and dequantization of fixed seeded inputs
  (`quant/blocks.safetensors`), and ggml's own (`ggml_quantize_chunk`, no imatrix) for the
  legacy and K-quant types, which gguf-py can dequantize but not quantize
  (`quant/blocks-ggml.safetensors`).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import gguf
import numpy as np

from . import engine as E
from .common import log, sha256_bytes, sha256_file, write_json, write_safetensors
from .prompts import N_GENERATE, PROMPTS, generate

L = E.L
Q = gguf.GGMLQuantizationType

VARIANTS = {
    "Q8_0": L.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q4_0": L.LLAMA_FTYPE_MOSTLY_Q4_0,
    "Q4_K_M": L.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "Q6_K": L.LLAMA_FTYPE_MOSTLY_Q6_K,
}

BLOCK_SEED = 20240611
BLOCK_N = 256  # one QK_K super-block per row, so K-quants fit; 8 blocks of 32 for the others.
GGML_BLOCK_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)


def variant_path(cache: Path, base_name: str, variant: str) -> Path:
    # SmolLM2-135M-Instruct.Q4_1.gguf -> SmolLM2-135M-Instruct.Q8_0.gguf
    stem = base_name.split(".")[0]
    return cache / f"{stem}.{variant}.gguf"


def quantize_variant(f32_path: Path, out: Path, ftype: int) -> None:
    if out.is_file():
        log(f"quantized variant already present: {out}")
        return
    log(f"quantizing to {out.name}")
    p = L.llama_model_quantize_default_params()
    p.nthread = 2
    p.ftype = ftype
    tmp = out.with_name(out.name + ".partial")
    rc = L.llama_model_quantize(str(f32_path).encode(), str(tmp).encode(), ctypes.byref(p))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({out.name}) returned {rc}:\n{E.recent_log()}")
    os.replace(tmp, out)


def tensor_table(path: Path) -> list[dict]:
    reader = gguf.GGUFReader(path)
    return [
        {
            "name": t.name,
            "type": t.tensor_type.name,
            "ne": [int(x) for x in t.shape],
            "n_bytes": int(t.n_bytes),
            "sha256": sha256_bytes(t.data.tobytes()),
        }
        for t in reader.tensors
    ]


def block_inputs() -> np.ndarray:
    """Eight rows of 256 values that exercise the corner cases of every block format."""
    rng = np.random.default_rng(BLOCK_SEED)
    rows = np.zeros((8, BLOCK_N), dtype=np.float32)
    rows[0] = rng.standard_normal(BLOCK_N)
    r1 = rng.uniform(-1, 1, BLOCK_N)
    r1[rng.random(BLOCK_N) < 0.25] = 0.0  # zeros inside blocks
    rows[1] = r1
    rows[2] = rng.standard_normal(BLOCK_N) * 1e-7  # tiny: scales underflow f16
    rows[3] = rng.standard_normal(BLOCK_N) * 1e4  # huge, yet every scale still fits f16
    rows[4] = 0.75  # all equal: min == max
    rows[5] = 0.0  # all zeros
    r6 = rng.standard_normal(BLOCK_N) * 0.01
    r6[::32] = 5.0  # one outlier per block of 32
    r6[17::64] = -7.5  # and a negative one that holds the absolute maximum
    rows[6] = r6
    rows[7] = -np.abs(rng.standard_normal(BLOCK_N))  # all negative
    return rows


def gguf_py_blocks(inp: np.ndarray) -> tuple[dict, list[str]]:
    tensors = {}
    done = []
    for qt in Q:
        if qt == Q.F32:
            continue
        try:
            q = gguf.quants.quantize(inp, qt)
        except (NotImplementedError, ValueError):
            continue
        raw = np.ascontiguousarray(q).view(np.uint8).reshape(inp.shape[0], -1)
        deq = gguf.quants.dequantize(raw, qt).astype(np.float32)
        tensors[f"{qt.name}.input"] = inp
        tensors[f"{qt.name}.quantized"] = raw
        tensors[f"{qt.name}.dequantized"] = np.ascontiguousarray(deq)
        done.append(qt.name)
    return tensors, done


def ggml_blocks(inp: np.ndarray) -> tuple[dict, list[str]]:
    g = E.ggml
    g.ggml_quantize_chunk.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    g.ggml_quantize_chunk.restype = ctypes.c_size_t
    g.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    g.ggml_row_size.restype = ctypes.c_size_t
    g.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    g.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    tensors = {}
    done = []
    src = np.ascontiguousarray(inp, dtype=np.float32)
    rows, n = src.shape
    for qt in GGML_BLOCK_TYPES:
        if E.type_name(int(qt)).upper() != qt.name.upper():
            raise RuntimeError(
                f"ggml type {int(qt)} is {E.type_name(int(qt))}, gguf-py says {qt.name}"
            )
        if g.ggml_quantize_requires_imatrix(int(qt)):
            continue
        row_size = g.ggml_row_size(int(qt), n)
        dst = np.zeros((rows, row_size), dtype=np.uint8)
        written = g.ggml_quantize_chunk(int(qt), src.ctypes.data, dst.ctypes.data, 0, rows, n, None)
        if written != rows * row_size:
            raise RuntimeError(
                f"ggml_quantize_chunk({qt.name}) wrote {written} bytes, expected {rows * row_size}"
            )
        tensors[f"{qt.name}.input"] = src
        tensors[f"{qt.name}.quantized"] = dst
        tensors[f"{qt.name}.dequantized"] = np.ascontiguousarray(
            gguf.quants.dequantize(dst, qt).astype(np.float32)
        )
        done.append(qt.name)
    return tensors, done


def export_quant(
    model_path: Path, f32_path: Path, cache: Path, out_dir: Path, settings: E.ContextSettings
) -> dict:
    short = next(p for p in PROMPTS if p.id == "short")
    files = {"Q4_1": model_path}
    for name, ftype in VARIANTS.items():
        path = variant_path(cache, model_path.name, name)
        quantize_variant(f32_path, path, ftype)
        files[name] = path

    variants = {}
    logits = {}
    for name, path in files.items():
        model = E.Model(path)
        try:
            ids = model.tokenize(
                short.text, add_special=short.add_special, parse_special=short.parse_special
            )
            gen = generate(model, settings, ids, N_GENERATE, 1)
            ctx_desc = settings.describe()
            model_params = model.params
        finally:
            model.close()
        logits[name] = gen["prompt_logits"][-1].astype(np.float32)
        text = gen["text_bytes"]
        variants[name] = {
            "file": path.name,
            "quantized_here": name != "Q4_1",
            "ftype": VARIANTS.get(name),
            "sha256": sha256_file(path),
            "size": path.stat().st_size,
            "prompt": short.id,
            "prompt_ids": ids,
            "continuation": {
                "ids": gen["ids"],
                "text": text.decode("utf-8", "replace"),
                "n": len(gen["ids"]),
                "stopped": gen["stopped"],
            },
            "tensors": tensor_table(path),
        }
        counts: dict[str, int] = {}
        for t in variants[name]["tensors"]:
            counts[t["type"]] = counts.get(t["type"], 0) + 1
        variants[name]["type_counts"] = dict(sorted(counts.items()))
        log(f"variant {name}: {len(gen['ids'])} tokens: {text[:60]!r}")

    inp = block_inputs()
    py_tensors, py_types = gguf_py_blocks(inp)
    gg_tensors, gg_types = ggml_blocks(inp)
    agree = {
        t: bool(np.array_equal(py_tensors[f"{t}.quantized"], gg_tensors[f"{t}.quantized"]))
        for t in gg_types
        if t in py_types
    }
    write_json(
        out_dir / "quant/variants.json",
        {
            "about": "Quantized variants of the F32 copy made by llama_model_quantize (no imatrix, "
            "nthread 2), and the original Q4_1 file: every tensor's type, ne and the sha256 of "
            "its bytes; the short prompt's greedy continuation on each. Logits of the prompt's "
            "last position are in quant/logits.safetensors under the variant's name.",
            "context": ctx_desc,
            "model_params": model_params,
            "variants": variants,
        },
    )
    write_safetensors(out_dir / "quant/logits.safetensors", logits, {"prompt": short.id})
    write_safetensors(
        out_dir / "quant/blocks.safetensors", py_tensors, {"seed": str(BLOCK_SEED), "by": "gguf-py"}
    )
    write_safetensors(
        out_dir / "quant/blocks-ggml.safetensors",
        gg_tensors,
        {"seed": str(BLOCK_SEED), "by": "ggml"},
    )
    return {
        "variants": {
            k: {"file": v["file"], "sha256": v["sha256"], "type_counts": v["type_counts"]}
            for k, v in variants.items()
        },
        "context": ctx_desc,
        "blocks_gguf_py_types": py_types,
        "blocks_ggml_types": gg_types,
        "ggml_and_gguf_py_quantized_bytes_equal": agree,
    }
