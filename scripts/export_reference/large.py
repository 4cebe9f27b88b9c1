"""Step 12: chapter 14's generated large models, cut to two layers at full width.

Chapter 14 writes 7-9B-shaped models from a recipe (`chapters/ch14-scaling/src/large.rs`): a real
shape and vocabulary, seeded weights at trained scale, llama.cpp's quantization mix. The files are
plain GGUF, so llama.cpp runs them as they are. This step has the project's own `make-model`
example write the tests' cut versions (two layers, full width: d 4096 or 3584, the 128k or 152k
vocabulary) into the cache, records each file's sha256 (a test that builds the file again checks it
before comparing a number), and stores llama.cpp's logits after a prompt and its greedy
continuation: what chapter 6's KL / near-tie rule needs.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import numpy as np

from . import engine as E
from . import prompts as P
from .common import log, sha256_file, write_json, write_safetensors

# (shape, file type, layers): the recipes the tests build.
MODELS = [
    ("llama3-8b", "Q4_0", 2),
    ("llama3-8b", "Q4_K_M", 2),
    ("qwen2-7b", "Q4_0", 2),
]
N_GENERATE = 16

# The KV cache types the tests check besides f32 (the settings' own): llama.cpp's default f16,
# and q8_0, which llama.cpp keeps for values only with flash attention on.
CACHES = [
    ("f16", "GGML_TYPE_F16", False),
    ("q8_0", "GGML_TYPE_Q8_0", True),
]

PROMPT = (
    "The old lighthouse keeper climbed the spiral stairs every evening, counting the steps "
    "as his father had taught him: one hundred and twelve, never more, never fewer."
)


def model_id(shape: str, ftype: str, layers: int) -> str:
    return f"{shape}-{layers}L-{ftype}"


def make_model(root: Path, shape: str, ftype: str, layers: int, dst: Path) -> None:
    """Write the recipe's file with the project's own generator (a release build of ch14)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["cargo", "run", "--release", "--quiet", "-p", "ch14", "--example", "make-model", "--",
         shape, ftype, "--layers", str(layers), "--out", str(dst)],
        cwd=root, check=True, stdout=subprocess.DEVNULL,
    )


def export_large(root: Path, cache: Path, out_dir: Path, settings: E.ContextSettings) -> dict:
    """Write large/<id>.safetensors for every model and large/models.json; return the manifest
    section."""
    models = {}
    for shape, ftype, layers in MODELS:
        mid = model_id(shape, ftype, layers)
        path = cache / "large" / f"{mid}.gguf"
        make_model(root, shape, ftype, layers, path)
        model = E.Model(path)
        try:
            ids = model.tokenize(PROMPT, add_special=True, parse_special=False)
            gen = P.generate(model, settings, ids, N_GENERATE, 1, prompt_logits=False)
            cached = {}
            for name, ty, fa in CACHES:
                s = dataclasses.replace(settings, type_k=getattr(E.L, ty),
                                        type_v=getattr(E.L, ty), flash_attn=fa)
                cached[name] = (s, P.generate(model, s, ids, N_GENERATE, 1, prompt_logits=False))
        finally:
            model.close()
        log(f"large {mid}: {len(ids)} prompt tokens, {len(gen['ids'])} generated")
        tensors = {
            "tokens": np.asarray(ids, dtype=np.int32),
            "next_logits": gen["logits_full"][0].astype(np.float32),
            "generated": np.asarray(gen["ids"], dtype=np.int32),
        }
        for name, (_, g) in cached.items():
            tensors[f"{name}.next_logits"] = g["logits_full"][0].astype(np.float32)
            tensors[f"{name}.generated"] = np.asarray(g["ids"], dtype=np.int32)
        write_safetensors(out_dir / f"large/{mid}.safetensors", tensors, {"model": mid})
        models[mid] = {
            "shape": shape,
            "ftype": ftype,
            "layers": layers,
            "seed": 0,
            "file": path.name,
            "sha256": sha256_file(path),
            "size": path.stat().st_size,
            "prompt": PROMPT,
            "add_special": True,
            "n_prompt_tokens": len(ids),
            "generated": gen["ids"],
            "caches": {name: {"settings": s.describe(), "generated": g["ids"]}
                       for name, (s, g) in cached.items()},
        }
    write_json(out_dir / "large/models.json", {"settings": settings.describe(), "models": models})
    return {mid: {k: m[k] for k in ("sha256", "size", "n_prompt_tokens")}
            for mid, m in models.items()}
