"""Steps 4 and 5: intermediate tensors of the forward pass, and greedy continuations.

Both run llama.cpp on the F32 copy of the model with an F32 KV cache and flash attention off,
so the numbers are what a plain f32 implementation should reproduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import engine as E
from .common import log, write_json, write_safetensors

# Layers whose every intermediate tensor is stored; `l_out-L` is stored for all layers.
FULL_LAYERS = (0, 1, 15, 29)

# Per-layer tensors, with the graph op of the occurrence we keep (llama.cpp names several
# nodes alike: see `graph_name_notes`).
LAYER_TENSORS = {
    "attn_norm": "MUL",
    "Qcur": "ROPE",
    "Kcur": "ROPE",
    "Vcur": "RESHAPE",
    "kq_soft_max": "SOFT_MAX",
    "kqv_out": "CONT",
    "attn_out": "MUL_MAT",
    "ffn_inp": "ADD",
    "ffn_norm": "MUL",
    "ffn_gate": "MUL_MAT",
    "ffn_up": "MUL_MAT",
    "ffn_swiglu": "GLU",
    "ffn_out": "MUL_MAT",
    "l_out": "ADD",
}
GLOBAL_TENSORS = {"result_norm": "MUL", "result_output": "MUL_MAT"}

TOP_K = 32
N_GENERATE = 64
N_FULL_STEPS = 8


@dataclass
class Prompt:
    id: str
    text: str
    chat: bool
    parse_special: bool
    add_special: bool


PROMPTS = [
    Prompt("short", "The capital of France is", chat=False, parse_special=False, add_special=True),
    Prompt(
        "medium",
        "Once upon a time, in a small village, there lived",
        chat=False,
        parse_special=False,
        add_special=True,
    ),
    Prompt(
        "chat",
        "<|im_start|>system\nBe concise.<|im_end|>\n"
        "<|im_start|>user\nName three colors.<|im_end|>\n"
        "<|im_start|>assistant\n",
        chat=True,
        parse_special=True,
        add_special=True,
    ),
]


def wanted_names(
    n_layer: int,
    layer_tensors: dict[str, str] = LAYER_TENSORS,
    full_layers: tuple[int, ...] = FULL_LAYERS,
    global_tensors: dict[str, str] = GLOBAL_TENSORS,
) -> dict[str, str]:
    """Graph name -> op of the occurrence to keep: every tensor of `full_layers`, `l_out` of
    every layer, and the global ones. Defaults: the default model's (llama's graph)."""
    names = {}
    for il in range(n_layer):
        for base, op in layer_tensors.items():
            if il in full_layers or base == "l_out":
                names[f"{base}-{il}"] = op
    names.update(global_tensors)
    return names


def _numpy_layout(name: str, c: E.Captured, n_tokens: int) -> np.ndarray:
    """ggml order -> numpy order, token dimension outermost (see reference-data/README.md)."""
    base = name.rsplit("-", 1)[0] if name[-1].isdigit() else name
    a = c.data  # (ne3, ne2, ne1, ne0)
    if c.ne[3] != 1:
        raise RuntimeError(f"{name}: unexpected ne {c.ne}")
    a = a[0]
    if base in ("Qcur", "Kcur", "Vcur", "Qcur_normed", "Kcur_normed"):
        # ne = (head_dim, n_head, n_tokens) -> (n_tokens, n_head, head_dim); a family that
        # normalises before splitting heads (OLMoE) records (width, n_tokens) -> (n_tokens, width).
        if c.ne[2] == 1 and c.ne[1] == n_tokens:
            return a[0]
        if c.ne[2] != n_tokens:
            raise RuntimeError(f"{name}: ne {c.ne}, expected {n_tokens} tokens in ne[2]")
        return a
    if base == "kq_soft_max":
        # ne = (n_kv, n_tokens, n_head) -> (n_head, n_tokens, n_kv), then keep the n_tokens
        # cells that hold this prompt: the rest of the padded cache is masked to exactly 0.
        if c.ne[1] != n_tokens or c.ne[0] < n_tokens:
            raise RuntimeError(f"{name}: ne {c.ne} for {n_tokens} tokens")
        if np.any(a[:, :, n_tokens:] != 0):
            raise RuntimeError(f"{name}: non-zero attention beyond the prompt's KV cells")
        a = a[:, :, :n_tokens]
        upper = np.triu(np.ones((n_tokens, n_tokens), dtype=bool), k=1)
        if np.any(a[:, upper] != 0) or np.any(a[:, ~upper] <= 0):
            raise RuntimeError(
                f"{name}: not causal in cell order: the KV cells are not positions 0..n-1"
            )
        return np.ascontiguousarray(a)
    if base == "ffn_moe_weights" and c.ne[0] == 1 and c.ne[2] == n_tokens:
        # ne = (1, n_expert_used, n_tokens), rows of the probabilities -> (n_tokens, n_used)
        return np.ascontiguousarray(a[:, :, 0])
    # ne = (width, n_tokens) -> (n_tokens, width)
    if c.ne[2] != 1 or c.ne[1] != n_tokens:
        raise RuntimeError(f"{name}: ne {c.ne}, expected (width, {n_tokens})")
    return a[0]


def capture_prompt(
    model: E.Model,
    settings: E.ContextSettings,
    ids: list[int],
    n_layer: int,
    wanted: dict[str, str] | None = None,
    all_logits: bool = True,
):
    """Run the prompt as one batch with the eval callback; return tensors and occurrence notes.
    `wanted` defaults to `wanted_names(n_layer)`; without `all_logits` only the last position's
    logits are computed, and llama.cpp's graph drops the other rows after the last layer's
    attention."""
    wanted = wanted or wanted_names(n_layer)
    cap = E.Capture(wanted=set(wanted))
    ctx = E.Context(model, settings, cap)
    try:
        cap.enabled = True
        logits = ctx.decode(ids, all_logits=all_logits)
        cap.enabled = False
        if cap.error:
            raise cap.error
        n_kv = None
        out = {}
        for name, op in wanted.items():
            occ = cap.tensors.get(name, [])
            keep = [c for c in occ if c.op == op]
            if len(keep) != 1:
                raise RuntimeError(
                    f"{name}: {len(keep)} occurrences with op {op}; saw {cap.seen_ops.get(name)}"
                )
            if name.startswith("kq_soft_max"):
                n_kv = keep[0].ne[0]
            # Without all_logits, tensors after the last layer's attention hold one row.
            full = len(ids) in (keep[0].ne[1], keep[0].ne[2])
            out[name] = _numpy_layout(name, keep[0], len(ids) if all_logits or full else 1)
        ro = out["result_output"]
        if not np.array_equal(ro, logits):
            raise RuntimeError(
                "result_output seen by the callback differs from llama_get_logits_ith"
            )
        return out, dict(cap.seen_ops), n_kv, logits
    finally:
        ctx.close()


def occurrence_notes(seen_ops: dict[str, list[str]]) -> dict:
    notes = {}
    for base, op in {**LAYER_TENSORS, **GLOBAL_TENSORS}.items():
        key = f"{base}-0" if base in LAYER_TENSORS else base
        ops = seen_ops.get(key, [])
        notes[key.replace("-0", "-L") if base in LAYER_TENSORS else key] = {
            "occurrences_in_graph_order": ops,
            "kept": op,
            "kept_index": ops.index(op) if op in ops else None,
        }
    return notes


def topk(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    # Highest logit first; equal logits by lower token id (a stable sort of -logits).
    idx = np.argsort(-logits, kind="stable")[:k]
    return idx.astype(np.int32), logits[idx].astype(np.float32)


def generate(
    model: E.Model,
    settings: E.ContextSettings,
    ids: list[int],
    n: int,
    full_steps: int,
    prompt_logits: bool = True,
):
    """Greedy continuation with llama.cpp's greedy sampler; logits of every step, and of every
    prompt position unless `prompt_logits` is false (then the last one only: a 262k
    vocabulary makes the others gigabytes for a long prompt)."""
    ctx = E.Context(model, settings)
    smpl = E.greedy_sampler()
    try:
        logits = ctx.decode(ids, all_logits=prompt_logits)
        first_logits = logits.copy()
        step_logits = [logits[-1]]
        idx = len(ids) - 1
        out_ids: list[int] = []
        stopped = None
        ties = []
        while True:
            tok = E.sample(smpl, ctx, idx)
            lg = step_logits[-1]
            if tok != int(np.argmax(lg)):
                raise RuntimeError(f"greedy sampler chose {tok}, argmax is {int(np.argmax(lg))}")
            if np.count_nonzero(lg == lg[tok]) > 1:
                ties.append(len(out_ids))
            out_ids.append(tok)
            if E.L.llama_vocab_is_eog(model.vocab, tok):
                stopped = "eog"
                break
            if len(out_ids) == n:
                stopped = "length"
                break
            logits = ctx.decode([tok], all_logits=False)
            step_logits.append(logits[-1])
            idx = 0
        steps = len(out_ids)
        full = np.stack(step_logits[:full_steps]).astype(np.float32)
        tk = [topk(step_logits[i], TOP_K) for i in range(steps)]
        text = model.detokenize(out_ids, remove_special=False, unparse_special=True)
        return {
            "ids": out_ids,
            "text_bytes": text,
            "stopped": stopped,
            "ties": ties,
            "logits_full": full,
            "topk_ids": np.stack([t[0] for t in tk]),
            "topk_logits": np.stack([t[1] for t in tk]),
            "prompt_logits": first_logits,
        }
    finally:
        E.free_sampler(smpl)
        ctx.close()


def export_prompts(f32_model_path: Path, out_dir: Path, settings: E.ContextSettings) -> dict:
    """Write prompts/<id>.safetensors, <id>.decode.safetensors, <id>.generation.json."""
    model = E.Model(f32_model_path)
    try:
        n_layer = E.L.llama_model_n_layer(model.ptr)
        prompt_records = []
        notes = None
        checks = {}
        reduced = {}
        for p in PROMPTS:
            ids = model.tokenize(p.text, add_special=p.add_special, parse_special=p.parse_special)
            log(f"prompt {p.id}: {len(ids)} tokens")
            tensors, seen, n_kv, cb_logits = capture_prompt(model, settings, ids, n_layer)
            if notes is None:
                notes = occurrence_notes(seen)
            tensors["tokens"] = np.asarray(ids, dtype=np.int32)
            # Per-position logits are the largest tensor by far: stored as f16 (see manifest).
            ro = tensors["result_output"]
            ro16 = ro.astype(np.float16)
            reduced[f"prompts/{p.id}.safetensors"] = {
                "result_output": {
                    "stored_dtype": "F16",
                    "computed_dtype": "F32",
                    "rounding": "round to nearest even",
                    "max_abs_value": float(np.max(np.abs(ro))),
                    "max_abs_rounding_error": float(np.max(np.abs(ro16.astype(np.float32) - ro))),
                    "max_rel_rounding_error_bound": 2.0**-11,
                }
            }
            tensors["result_output"] = ro16
            write_safetensors(out_dir / f"prompts/{p.id}.safetensors", tensors, {"prompt": p.id})

            gen = generate(model, settings, ids, N_GENERATE, N_FULL_STEPS)
            # The same batch without the callback must give the same logits: the capture
            # splits the graph at every stored tensor, which must not change the numbers.
            diff = float(np.max(np.abs(gen["prompt_logits"] - cb_logits)))
            checks[p.id] = {
                "max_abs_diff_logits_with_vs_without_callback": diff,
                "kq_soft_max_n_kv_before_cut": n_kv,
            }
            write_safetensors(
                out_dir / f"prompts/{p.id}.decode.safetensors",
                {
                    "logits_full": gen["logits_full"],
                    "topk_ids": gen["topk_ids"],
                    "topk_logits": gen["topk_logits"],
                },
                {"prompt": p.id},
            )
            text = gen["text_bytes"]
            record = {
                "prompt": p.id,
                "ids": gen["ids"],
                "text": text.decode("utf-8", "replace"),
                "n": len(gen["ids"]),
                "stopped": gen["stopped"],
                "steps_with_tied_max_logit": gen["ties"],
            }
            try:
                text.decode("utf-8")
            except UnicodeDecodeError:
                # The continuation ends inside a multi-byte character: keep the exact bytes too.
                record["text_hex"] = text.hex()
            write_json(out_dir / f"prompts/{p.id}.generation.json", record)
            log(
                f"prompt {p.id}: generated {len(gen['ids'])} tokens ({gen['stopped']}): {text[:80]!r}"
            )
            prompt_records.append(
                {
                    "id": p.id,
                    "text": p.text,
                    "chat": p.chat,
                    "parse_special": p.parse_special,
                    "add_special": p.add_special,
                    "ids": ids,
                    "n_tokens": len(ids),
                    "generated": len(gen["ids"]),
                    "stopped": gen["stopped"],
                }
            )
        return {
            "prompts": prompt_records,
            "graph_name_notes": notes,
            "checks": checks,
            "reduced_precision": reduced,
        }
    finally:
        model.close()
