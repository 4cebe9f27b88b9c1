"""Step 12: chapters 14 and 18's generated large models, cut to a few layers at full width.

Chapter 14 writes 7-9B-shaped models from a recipe (`chapters/ch14-scaling/src/large.rs`): a real
shape and vocabulary, seeded weights at trained scale, llama.cpp's quantization mix. The files are
plain GGUF, so llama.cpp runs them as they are. This step has the project's own `make-model`
example write the tests' cut versions (two layers, full width: d 4096 or 3584, the 128k or 152k
vocabulary; Llama 3, Qwen2 and Qwen3) into the cache, records each file's sha256 (a test that
builds the file again checks it before comparing a number), and stores llama.cpp's logits after
a prompt, its greedy continuation, and what is needed of its logits after each token of that
continuation to judge every step by chapter 6's rule (KL, mean |dlogit|, the greedy token): see
`continuation`.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import numpy as np

from . import engine as E
from . import prompts as P
from .common import log, sha256_file, write_json, write_safetensors

# (shape, file type, layers): the recipes the tests build. Qwen3-30B-A3B, chapter 18's, is cut
# to one layer: its 128 experts of a layer are 340 MB in Q4_0. OLMoE-1B-7B's 64 experts of a
# layer are 226 MB: two layers.
MODELS = [
    ("llama3-8b", "Q4_0", 2),
    ("llama3-8b", "Q4_K_M", 2),
    ("qwen2-7b", "Q4_0", 2),
    ("qwen3-8b", "Q4_0", 2),
    ("qwen3-30b-a3b", "Q4_0", 1),
    ("olmoe-1b-7b", "Q4_0", 2),
]
# The example that makes a shape: chapter 18's for its mixtures of experts, chapter 14's else.
MAKERS = {"qwen3-30b-a3b": ("ch18", "make-moe"), "olmoe-1b-7b": ("ch18", "make-moe")}
N_GENERATE = 16

# The KV cache types the tests check besides f32 (the settings' own): llama.cpp's default f16,
# and q8_0, which llama.cpp keeps for values only with flash attention on.
CACHES = [
    ("f16", "GGML_TYPE_F16", False),
    ("q8_0", "GGML_TYPE_Q8_0", True),
]

# What is kept of llama.cpp's logits after each continuation token (the row after the prompt is
# kept whole). A whole row is 128k-152k values; 15 rows for 3 models and 3 cache types in f32
# would be 74 MB. The check needs two things of a row:
# - KL(P_llama.cpp || P_ours): the tokens that carry the probability. The TOP_K largest logits
#   (f32, as computed) and the probability of all the others together (`rest_mass`, summed in
#   f64 over the whole row) give the KL of the two distributions over those TOP_K tokens and
#   "the rest" as one outcome. By the chain rule that is the full KL minus rest_mass times the
#   KL within the rest: with 1024 tokens rest_mass is about 0.1-1 % on these flat random-model
#   distributions, so the KL is short by about that fraction of itself (the test requires at
#   most 2 %: large::MAX_REST_MASS).
# - mean |dlogit| over the vocabulary: a mean, estimated from every SAMPLE_STRIDE-th token
#   (4,008 or 4,748 of them; the recipe's output rows are independent of the token id, so a
#   stride is a uniform sample); stored as f16, whose rounding (at most 2^-7 for |logit| < 32)
#   moves a mean of ~0.1 by less than 1 %.
# 15 rows of 1024 ids, 1024 f32 logits and ~4,000 f16 logits: 0.25 MB per run, 2.2 MB in all.
TOP_K = 1024
SAMPLE_STRIDE = 32

PROMPT = (
    "The old lighthouse keeper climbed the spiral stairs every evening, counting the steps "
    "as his father had taught him: one hundred and twelve, never more, never fewer."
)


def model_id(shape: str, ftype: str, layers: int) -> str:
    return f"{shape}-{layers}L-{ftype}"


def continuation(step_logits: np.ndarray, prefix: str, top_k: int = TOP_K) -> dict[str, np.ndarray]:
    """The tensors `<prefix>steps.*` kept of llama.cpp's logits after each continuation token:
    `step_logits` (steps, vocab) f32, row 0 after the prompt (kept whole elsewhere); the `top_k`
    largest of each row."""
    rows = step_logits[1:].astype(np.float32)
    # Largest first; ties by token id, so the choice is the same on every run.
    top = np.argsort(-rows, axis=1, kind="stable")[:, :top_k]
    x = rows.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    rest = np.ones_like(e, dtype=bool)
    np.put_along_axis(rest, top, False, axis=1)
    rest_mass = (e * rest).sum(axis=1) / e.sum(axis=1)
    return {
        f"{prefix}steps.top_ids": top.astype(np.int32),
        f"{prefix}steps.top_logits": np.take_along_axis(rows, top, axis=1),
        f"{prefix}steps.rest_mass": rest_mass.astype(np.float32),
        f"{prefix}steps.sampled_logits": rows[:, ::SAMPLE_STRIDE].astype(np.float16),
    }


def make_model(root: Path, shape: str, ftype: str, layers: int, dst: Path) -> None:
    """Write the recipe's file with the project's own generator (a release build of ch14's
    make-model, or of the example MAKERS names)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    package, example = MAKERS.get(shape, ("ch14", "make-model"))
    subprocess.run(
        ["cargo", "run", "--release", "--quiet", "-p", package, "--example", example, "--",
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
            gen = P.generate(model, settings, ids, N_GENERATE, N_GENERATE, prompt_logits=False)
            cached = {}
            for name, ty, fa in CACHES:
                s = dataclasses.replace(settings, type_k=getattr(E.L, ty),
                                        type_v=getattr(E.L, ty), flash_attn=fa)
                cached[name] = (s, P.generate(model, s, ids, N_GENERATE, N_GENERATE,
                                              prompt_logits=False))
        finally:
            model.close()
        log(f"large {mid}: {len(ids)} prompt tokens, {len(gen['ids'])} generated")
        tensors = {
            "tokens": np.asarray(ids, dtype=np.int32),
            "next_logits": gen["logits_full"][0].astype(np.float32),
            "generated": np.asarray(gen["ids"], dtype=np.int32),
            **continuation(gen["logits_full"], ""),
        }
        for name, (_, g) in cached.items():
            tensors[f"{name}.next_logits"] = g["logits_full"][0].astype(np.float32)
            tensors[f"{name}.generated"] = np.asarray(g["ids"], dtype=np.int32)
            tensors.update(continuation(g["logits_full"], f"{name}."))
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
    steps = {
        "top_k": TOP_K,
        "sample_stride": SAMPLE_STRIDE,
        "how": "after each continuation token but the last, llama.cpp's logits one token at a "
        "time through its KV cache: the top_k largest (top_ids, top_logits, f32), the "
        "probability of all other tokens (rest_mass, summed in f64), and every sample_stride-th "
        "token's logit from id 0 (sampled_logits, f16)",
    }
    write_json(out_dir / "large/models.json",
               {"settings": settings.describe(), "steps": steps, "models": models})
    return {mid: {k: m[k] for k in ("sha256", "size", "n_prompt_tokens")}
            for mid, m in models.items()}
