"""Step 15: chapter 17's converted checkpoints, run by llama.cpp.

Chapter 17 turns a Hugging Face directory into the GGUF file llama.cpp's converter would
write. This step checks the result in llama.cpp itself: it makes the directories the chapter's
tests make (chapter 17's `make-checkpoint` example: Hugging Face's `safetensors` and
`tokenizers` libraries, from a GGUF model), converts each with `llm-rs convert`, loads the
converted file in llama.cpp, and stores what llama.cpp computes on it for one prompt: the
prompt's ids as llama.cpp tokenizes them, the logits of its last position in full, and the top
logits of every position. The sha256 of each converted file is recorded, so the tests know the
file llama.cpp ran is the one the converter makes now.

The directories and converted files stay in the cache; only llama.cpp's numbers are committed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from . import engine as E
from .common import log, sha256_file, write_safetensors

PROMPT = "The capital of France is Paris. The old lighthouse keeper climbed the stairs"
TOP_K = 32

# id: (source model: "default" or "gemma3", make-checkpoint's flags). The directory is named
# by the id, as chapter 17's tests name theirs: the converted file's `general.name` is it.
CASES = {
    "default-f32": ("default", ["--layers", "4"]),
    "default-bf16": ("default", ["--layers", "4", "--dtype", "bf16"]),
    "gemma3-bf16": ("gemma3", ["--layers", "2", "--dtype", "bf16"]),
}


def cargo_release(root: Path, *args: str) -> None:
    subprocess.run(["cargo", "build", "--release", "-q", *args], cwd=root, check=True)


def export_checkpoints(
    root: Path, model: Path, gemma3: Path, cache: Path, stage: Path, settings: E.ContextSettings
) -> dict:
    cargo_release(root, "-p", "ch17", "--example", "make-checkpoint")
    cargo_release(root, "-p", "llm-rs", "--bin", "llm-rs")
    make = root / "target" / "release" / "examples" / "make-checkpoint"
    llm_rs = root / "target" / "release" / "llm-rs"
    work = cache / "reference" / "checkpoints"
    work.mkdir(parents=True, exist_ok=True)
    out = stage / "checkpoints"
    out.mkdir(parents=True, exist_ok=True)
    section = {
        "how": "made by chapter 17's make-checkpoint example from the model named, converted by "
        "`llm-rs convert DIR OUT.gguf` (the checkpoint's own types), run by llama.cpp with the "
        "default model's F32 settings: the whole prompt in one batch, logits of every position",
        "prompt": PROMPT,
        "top_k": TOP_K,
        "cases": {},
    }
    for cid, (source, flags) in CASES.items():
        src = model if source == "default" else gemma3
        directory = work / cid
        gguf = work / f"{cid}.gguf"
        subprocess.run([str(make), str(directory), "--model", str(src), *flags], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([str(llm_rs), "convert", str(directory), str(gguf)], check=True)
        m = E.Model(gguf)
        try:
            ctx = E.Context(m, settings)
            try:
                tokens = m.tokenize(PROMPT, True, False)
                logits = ctx.decode(tokens, all_logits=True)
            finally:
                ctx.close()
        finally:
            m.close()
        top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K]
        write_safetensors(
            out / f"{cid}.safetensors",
            {
                "tokens": np.array(tokens, dtype=np.int64),
                "last_logits": logits[-1].astype(np.float32),
                "topk_ids": top.astype(np.int64),
                "topk_logits": np.take_along_axis(logits, top, axis=1).astype(np.float32),
            },
        )
        section["cases"][cid] = {
            "source": source,
            "make_checkpoint_flags": flags,
            "converted_sha256": sha256_file(gguf),
            "converted_size": gguf.stat().st_size,
            "n_tokens": len(tokens),
            "greedy_next": int(np.argmax(logits[-1])),
        }
        log(f"{cid}: {len(tokens)} tokens, next {section['cases'][cid]['greedy_next']}")
    return section
