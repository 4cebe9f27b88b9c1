"""Step 17: the default model deep in its context.

Every other reference of the default model is a prompt of a few dozen tokens, where attention
reads a handful of keys. Here the prompt is DEPTH_TOKENS tokens of the project's own book (its
Part I pages, in the order the book gives them, cut to that many tokens: prose, code and tables,
as a long prompt is), so that the last queries attend over thousands of keys: the tiled
attention's segments, merges and online softmax, and the f16 and q8_0 caches, over a long run.

llama.cpp runs the default model as shipped (Q4_1) with the prompt in one batch, then greedy
continuation one token at a time, with its KV cache in f32 and f16 (flash attention off, as the
other references run) and in q8_0 (flash attention on: llama.cpp keeps a q8_0 value cache only
with it). What is kept of each run is what chapter 14's large-model check keeps (`large.py`):
the logits after the prompt whole, the greedy continuation, and after each of its tokens the
top-k logits, the rest's probability and a strided sample (`large.continuation`). The prompt is
stored as ids, so a later edit of the book does not change what the test feeds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from . import engine as E
from . import prompts as P
from .common import log, sha256_file, write_json, write_safetensors
from .large import SAMPLE_STRIDE, continuation

# About half the default model's 8,192 positions: deep enough that a token's attention reads
# about as many bytes of an f16 cache as of weights (keys and values of 3 heads of 64 values in
# 30 layers: 4,000 positions are 92 MB, the Q4_1 weights 98 MB), short enough that the test's
# runs take seconds.
DEPTH_TOKENS = 4000
N_GENERATE = 16
# The largest logits kept after each continuation token. Deep in a book, a trained model is often
# unsure of the next token: with 1,024 of the 49,152 kept, up to 12 % of the probability was
# left to the others, where the check needs at most 2 % (`large::MAX_REST_MASS`; see
# `large.py`). 8,192 rows of 8 bytes, 15 steps, 3 caches: 2.9 MB.
TOP_K = 8192

# Part I of the book, in SUMMARY.md's order.
SOURCES = [
    "book/src/introduction.md",
    "book/src/ch01-gguf.md",
    "book/src/ch02-tokenizer.md",
    "book/src/ch03-attention.md",
    "book/src/ch04-forward.md",
    "book/src/ch05-kv-cache.md",
]

# (name, cache type, flash attention): the tensors' prefixes and llama.cpp's settings.
CACHES = [
    ("f32", "GGML_TYPE_F32", False),
    ("f16", "GGML_TYPE_F16", False),
    ("q8_0", "GGML_TYPE_Q8_0", True),
]


def prompt_ids(root: Path, model: E.Model) -> list[int]:
    text = "\n\n".join((root / s).read_text(encoding="utf-8") for s in SOURCES)
    ids = model.tokenize(text, add_special=True, parse_special=False)
    if len(ids) < DEPTH_TOKENS:
        raise RuntimeError(f"the book's Part I is {len(ids)} tokens, fewer than {DEPTH_TOKENS}")
    return ids[:DEPTH_TOKENS]


def export_depth(root: Path, model_path: Path, out_dir: Path, base: E.ContextSettings) -> dict:
    """Write depth/smollm2.safetensors and depth/depth.json; return the manifest section."""
    n_ctx = DEPTH_TOKENS + N_GENERATE
    model = E.Model(model_path)
    runs = {}
    try:
        ids = prompt_ids(root, model)
        for name, ty, fa in CACHES:
            # The whole prompt in one llama_decode call, as the other references decode theirs.
            s = dataclasses.replace(base, n_ctx=n_ctx, n_batch=n_ctx, type_k=getattr(E.L, ty),
                                    type_v=getattr(E.L, ty), flash_attn=fa)
            runs[name] = (s, P.generate(model, s, ids, N_GENERATE, N_GENERATE,
                                        prompt_logits=False))
            log(f"depth: {name} cache, {len(ids)} prompt tokens, "
                f"{len(runs[name][1]['ids'])} generated")
    finally:
        model.close()
    tensors = {"tokens": np.asarray(ids, dtype=np.int32)}
    for name, (_, g) in runs.items():
        tensors[f"{name}.next_logits"] = g["logits_full"][0].astype(np.float32)
        tensors[f"{name}.generated"] = np.asarray(g["ids"], dtype=np.int32)
        tensors.update(continuation(g["logits_full"], f"{name}.", TOP_K))
    write_safetensors(out_dir / "depth/smollm2.safetensors", tensors, {"model": model_path.name})
    section = {
        "model": model_path.name,
        "model_sha256": sha256_file(model_path),
        "sources": SOURCES,
        "n_prompt_tokens": len(ids),
        "steps": {"top_k": TOP_K, "sample_stride": SAMPLE_STRIDE},
        "caches": {name: {"settings": s.describe(), "generated": g["ids"]}
                   for name, (s, g) in runs.items()},
    }
    write_json(out_dir / "depth/depth.json", section)
    return {k: section[k] for k in ("model", "model_sha256", "n_prompt_tokens")}
