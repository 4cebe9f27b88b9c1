"""Step 10: Gemma 3 270M, chapter 13's second model family.

- An F32 copy of the Q4_K_M file (every tensor dequantized by gguf-py, as for the default
  model), kept in the cache. llama.cpp runs it with an F32 KV cache and flash attention off, and
  its intermediate tensors are stored by graph name for three prompts, one of them longer than
  the 512-position sliding window, so that the window's mask is checked.
- The Q4_K_M file itself: logits after each prompt and llama.cpp's greedy continuation, for the
  quantized-model check (KL, mean |dlogit|, teacher-forced greedy with near-ties).

Sizes: the vocabulary has 262,144 entries, so logits are stored for the last position only
(the F32 run) and per decode step as top-k plus the first full rows (the quantized run); for the
long prompt only the last LAST_ROWS rows of each tensor are kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import engine as E
from .common import log, write_json, write_safetensors
from .f32_model import write_f32_copy
from . import prompts as P
from .prompts import Prompt

# Layers whose every intermediate tensor is stored: the first, the first global one (5), and
# the last; `l_out-L` for all.
FULL_LAYERS = (0, 5, 17)
LAYER_TENSORS = {
    "attn_norm": "MUL",
    "Qcur_normed": "MUL",
    "Kcur_normed": "MUL",
    "Qcur": "ROPE",
    "Kcur": "ROPE",
    "Vcur": "RESHAPE",
    "kqv_out": "CONT",
    "attn_post_norm": "MUL",
    "sa_out": "ADD",
    "ffn_norm": "MUL",
    "ffn_out": "MUL_MAT",
    "ffn_post_norm": "MUL",
    "l_out": "ADD",
}
GLOBAL_TENSORS = {"inp_scaled": "SCALE", "result_norm": "MUL", "result_output": "MUL_MAT"}
LAST_ROWS = 4
N_GENERATE = 48
N_FULL_STEPS = 1

# A passage longer than the sliding window (512 positions) once tokenized.
_LONG = " ".join(
    f"Step {i}: the river carried {i % 7 + 2} boats past the mill, and the miller counted them."
    for i in range(40)
)

PROMPTS = [
    Prompt("short", "The capital of France is", chat=False, parse_special=False, add_special=True),
    Prompt(
        "chat",
        "<start_of_turn>user\nName three colors.<end_of_turn>\n<start_of_turn>model\n",
        chat=True,
        parse_special=True,
        add_special=True,
    ),
    Prompt("long", _LONG + " In total, the miller counted", False, False, True),
]


def capture(model: E.Model, settings: E.ContextSettings, ids: list[int], n_layer: int):
    """The stored tensors of one prompt (last position's logits only), their last rows."""
    wanted = P.wanted_names(n_layer, LAYER_TENSORS, FULL_LAYERS, GLOBAL_TENSORS)
    out, _, _, _ = P.capture_prompt(model, settings, ids, n_layer, wanted, all_logits=False)
    return {name: np.ascontiguousarray(a[-LAST_ROWS:]) for name, a in out.items()}


def export_gemma3(model_path: Path, cache: Path, out_dir: Path, settings: E.ContextSettings) -> dict:
    """Write gemma3/<id>.safetensors (F32 copy), gemma3/<id>.quant.safetensors and
    gemma3/generation.json (Q4_K_M); return the manifest section."""
    f32_path = cache / "gemma-3-270m.F32.gguf"
    write_f32_copy(model_path, f32_path)
    records = []
    f32 = E.Model(f32_path)
    try:
        n_layer = E.L.llama_model_n_layer(f32.ptr)
        for p in PROMPTS:
            ids = f32.tokenize(p.text, add_special=p.add_special, parse_special=p.parse_special)
            log(f"gemma3 prompt {p.id}: {len(ids)} tokens (F32 copy)")
            t = capture(f32, settings, ids, n_layer)
            t["tokens"] = np.asarray(ids, dtype=np.int32)
            write_safetensors(out_dir / f"gemma3/{p.id}.safetensors", t, {"prompt": p.id})
            records.append({"id": p.id, "text": p.text, "parse_special": p.parse_special,
                            "add_special": p.add_special, "ids": ids, "n_tokens": len(ids)})
    finally:
        f32.close()

    q = E.Model(model_path)
    try:
        for r, p in zip(records, PROMPTS):
            ids = r["ids"]
            log(f"gemma3 prompt {p.id}: greedy on {model_path.name}")
            gen = P.generate(q, settings, ids, N_GENERATE, N_FULL_STEPS, prompt_logits=False)
            write_safetensors(
                out_dir / f"gemma3/{p.id}.quant.safetensors",
                {
                    "logits_full": gen["logits_full"],
                    "topk_ids": gen["topk_ids"],
                    "topk_logits": gen["topk_logits"],
                },
                {"prompt": p.id},
            )
            r["generated"] = gen["ids"]
            r["generated_text_hex"] = gen["text_bytes"].hex()
            r["stopped"] = gen["stopped"]
            r["exact_ties"] = gen["ties"]
    finally:
        q.close()
    section = {
        "model": model_path.name,
        "f32_model": f32_path.name,
        "n_layer": n_layer,
        "layers_in_full": list(FULL_LAYERS),
        "last_rows": LAST_ROWS,
        "top_k": P.TOP_K,
        "prompts": records,
    }
    write_json(out_dir / "gemma3/prompts.json", section)
    return section
