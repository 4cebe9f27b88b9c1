"""Step 14: llama.cpp's grammar-constrained greedy decoding on the default model.

Each case is a grammar and a user message: the message goes through the model's chat template,
and llama.cpp generates from it with a sampler chain of `llama_sampler_init_grammar` then
`llama_sampler_init_greedy`, as an application would. Besides the tokens and text, every step
records how many tokens the grammar allowed and the margin between the best and second-best
allowed logit, so a test can tell a near-tie (where another implementation may fairly pick the
other token) from a real disagreement. The grammar's mask is read by applying the chain's own
grammar sampler to a copy of the step's logits, and the token the chain samples is checked to be
the argmax of that masked copy.
"""

from __future__ import annotations

import ctypes
import json
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from llama_cpp.llama_grammar import json_schema_to_gbnf

from . import engine as E
from .common import log, sha256_file, write_json

# Generated tokens per case at most: enough for the short answers (yes/no, numbers, a name)
# to finish, and for the JSON cases to get well into their objects, while the whole step stays
# a few seconds of decoding.
N_GENERATE = 48

# `llama_token_data` of llama.h: id, logit, p (12 bytes, no padding).
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])

# llama.cpp's example grammars, as the sdist vendors them.
_GRAMMARS = "vendor/llama.cpp/grammars/"

# The schemas of the JSON-schema cases.
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age"],
}
PRODUCT_SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "size": {
            "type": "object",
            "properties": {"width": {"type": "number"}, "height": {"type": "number"}},
            "required": ["width", "height"],
        },
        "price": {"type": "number"},
    },
    "required": ["colour", "size", "price"],
}


@dataclass
class Case:
    id: str
    message: str
    # Exactly one of: a grammar file of llama.cpp's grammars/, a JSON schema, a grammar text.
    gbnf_file: str | None = None
    schema: dict | None = None
    grammar: str | None = None
    # A finished generation (stopped at end-of-generation) must satisfy this.
    check: Callable[[str], bool] | None = None


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def _json_array(text: str) -> bool:
    try:
        return isinstance(json.loads(text), list)
    except json.JSONDecodeError:
        return False


def _json_matching(schema: dict) -> Callable[[str], bool]:
    """A small check of the schemas above: an object with the required keys and only known
    ones, each of the declared JSON type or enum."""

    def ok(value, s: dict) -> bool:
        if "enum" in s:
            return value in s["enum"]
        t = s.get("type")
        if t == "object":
            props = s.get("properties", {})
            return (
                isinstance(value, dict)
                and all(k in value for k in s.get("required", []))
                and all(k in props and ok(v, props[k]) for k, v in value.items())
            )
        if t == "array":
            return (
                isinstance(value, list)
                and len(value) <= s.get("maxItems", len(value))
                and all(ok(v, s["items"]) for v in value)
            )
        if t == "string":
            return isinstance(value, str)
        if t == "integer":
            return isinstance(value, int) and not isinstance(value, bool)
        if t == "number":
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        raise RuntimeError(f"schema check: type {t!r} not handled")

    def check(text: str) -> bool:
        try:
            return ok(json.loads(text), schema)
        except json.JSONDecodeError:
            return False

    return check


def _regex(pattern: str) -> Callable[[str], bool]:
    return lambda text: re.fullmatch(pattern, text) is not None


CASES = [
    Case(
        "json",
        "Describe a cat as a JSON object with its name, age and colour.",
        gbnf_file="json.gbnf",
        check=_json_object,
    ),
    Case("json_arr", "List three fruits as JSON.", gbnf_file="json_arr.gbnf", check=_json_array),
    Case(
        "yes_no",
        "Is the sky blue? Answer yes or no.",
        grammar='root ::= ("yes" | "no") "."\n',
        check=_regex(r"(yes|no)\."),
    ),
    Case(
        "numbers",
        "Give some numbers.",
        grammar='root ::= [0-9]{1,3} ("," [0-9]{1,3}){2,4}\n',
        check=_regex(r"[0-9]{1,3}(,[0-9]{1,3}){2,4}"),
    ),
    Case(
        "schema_person",
        "Describe a person as JSON.",
        schema=PERSON_SCHEMA,
        check=_json_matching(PERSON_SCHEMA),
    ),
    Case(
        "schema_product",
        "Describe a product as JSON: its colour, size and price.",
        schema=PRODUCT_SCHEMA,
        check=_json_matching(PRODUCT_SCHEMA),
    ),
    Case(
        "non_ascii",
        "Write a French first name.",
        grammar='root ::= "R\u00e9" [a-z\u00e9]+\n',
        check=_regex("R\u00e9[a-z\u00e9]+"),
    ),
    # Most hiragana have no token of their own in this vocabulary: the model has to spell them
    # with tokens that hold part of a character's UTF-8 bytes.
    Case(
        "hiragana",
        "Say hello in Japanese.",
        grammar="root ::= [\u3041-\u3093]{2,8} \"\u3002\"\n",
        check=_regex("[\u3041-\u3093]{2,8}\u3002"),
    ),
]


def grammar_text(case: Case, gbnf: dict[str, str]) -> str:
    if case.gbnf_file is not None:
        return gbnf[case.gbnf_file]
    if case.schema is not None:
        return json_schema_to_gbnf(json.dumps(case.schema))
    if case.grammar is None:
        raise RuntimeError(f"case {case.id}: no grammar")
    return case.grammar


def chat_prompt(model: E.Model, message: str) -> str:
    """The user message through the model's own chat template (llama_chat_apply_template, with
    the assistant turn opened)."""
    tmpl = E.L.llama_model_chat_template(model.ptr, None)
    if not tmpl:
        raise RuntimeError("the model has no chat template")
    msgs = (E.L.llama_chat_message * 1)(E.L.llama_chat_message(b"user", message.encode()))
    n_max = 256 + 4 * len(message.encode())
    for _ in range(2):
        buf = ctypes.create_string_buffer(n_max)
        n = E.L.llama_chat_apply_template(tmpl, msgs, 1, True, buf, n_max)
        if n < 0:
            raise RuntimeError(f"llama_chat_apply_template failed ({n})")
        if n <= n_max:
            return buf.raw[:n].decode("utf-8")
        n_max = n
    raise RuntimeError("llama_chat_apply_template: the prompt did not fit")


def masked(grammar_smpl, logits: np.ndarray) -> np.ndarray:
    """The step's logits after the grammar sampler: disallowed tokens at -inf."""
    cur = np.zeros(len(logits), dtype=TOKEN_DATA)
    cur["id"] = np.arange(len(logits), dtype=np.int32)
    cur["logit"] = logits
    arr = E.L.llama_token_data_array(
        data=cur.ctypes.data_as(ctypes.POINTER(E.L.llama_token_data)),
        size=len(cur),
        selected=-1,
        sorted=False,
    )
    E.L.llama_sampler_apply(grammar_smpl, ctypes.byref(arr))
    if arr.size != len(cur) or arr.data[0].id != 0:
        raise RuntimeError("the grammar sampler resized or reordered the candidates")
    out = cur["logit"].copy()
    changed = out != logits
    if np.any(np.isfinite(out[changed])):
        raise RuntimeError("the grammar sampler changed a logit other than to -inf")
    return out


def run_case(model: E.Model, settings: E.ContextSettings, grammar: str, ids: list[int]) -> dict:
    chain = E.L.llama_sampler_chain_init(E.L.llama_sampler_chain_default_params())
    smpl = E.L.llama_sampler_init_grammar(model.vocab, grammar.encode("utf-8"), b"root")
    if not smpl:
        E.L.llama_sampler_free(chain)
        raise RuntimeError(f"llama_sampler_init_grammar failed:\n{E.recent_log()}")
    E.L.llama_sampler_chain_add(chain, smpl)
    E.L.llama_sampler_chain_add(chain, E.L.llama_sampler_init_greedy())
    grammar_smpl = E.L.llama_sampler_chain_get(chain, 0)
    ctx = E.Context(model, settings)
    try:
        logits = ctx.decode(ids, all_logits=False)[-1]
        idx = len(ids) - 1
        tokens: list[int] = []
        margins: list[float | None] = []
        n_allowed: list[int] = []
        while True:
            m = masked(grammar_smpl, logits)
            allowed = np.flatnonzero(np.isfinite(m))
            if len(allowed) == 0:
                raise RuntimeError(f"step {len(tokens)}: the grammar allows no token")
            order = allowed[np.argsort(-m[allowed], kind="stable")]
            margins.append(float(m[order[0]] - m[order[1]]) if len(order) > 1 else None)
            n_allowed.append(int(len(allowed)))
            tok = int(E.L.llama_sampler_sample(chain, ctx.ptr, idx))
            if tok != int(order[0]):
                raise RuntimeError(
                    f"step {len(tokens)}: the chain sampled {tok}, the masked argmax is {order[0]}"
                )
            tokens.append(tok)
            if E.L.llama_vocab_is_eog(model.vocab, tok):
                stop = "eog"
                break
            if len(tokens) == N_GENERATE:
                stop = "length"
                break
            logits = ctx.decode([tok], all_logits=False)[-1]
            idx = 0
        return {"tokens": tokens, "margins": margins, "n_allowed": n_allowed, "stop": stop}
    finally:
        E.L.llama_sampler_free(chain)
        ctx.close()


def read_gbnf(sdist: Path, names: list[str]) -> dict[str, str]:
    with tarfile.open(sdist) as tf:
        root = tf.getnames()[0].split("/")[0]
        out = {}
        for name in names:
            f = tf.extractfile(f"{root}/{_GRAMMARS}{name}")
            if f is None:
                raise RuntimeError(f"{sdist}: no {_GRAMMARS}{name}")
            out[name] = f.read().decode("utf-8")
        return out


DESCRIPTION = (
    "llama.cpp's greedy decoding under a grammar on the default model (Q4_1): per case the "
    "grammar, chat prompt ids, generated ids and text, allowed-token counts and best-vs-second "
    "allowed logit margins per step"
)


def describe(rel: str) -> str | None:
    """The manifest's `holds` for a file of this step."""
    return DESCRIPTION if rel == "grammar/constrained.json" else None


def export_constrained(
    model_path: Path, sdist: Path, out_dir: Path, settings: E.ContextSettings, commit: str | None
) -> dict:
    """Write grammar/constrained.json into `out_dir`; return its summary for the manifest."""
    gbnf = read_gbnf(sdist, sorted({c.gbnf_file for c in CASES if c.gbnf_file}))
    model = E.Model(model_path)
    try:
        records = []
        for case in CASES:
            grammar = grammar_text(case, gbnf)
            prompt = chat_prompt(model, case.message)
            ids = model.tokenize(prompt, add_special=True, parse_special=True)
            r = run_case(model, settings, grammar, ids)
            toks = r["tokens"]
            body = toks[:-1] if r["stop"] == "eog" else toks
            raw = model.detokenize(body, remove_special=False, unparse_special=True)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if r["stop"] == "eog" and case.check and not (text is not None and case.check(text)):
                raise RuntimeError(f"case {case.id}: {raw!r} does not satisfy its grammar")
            log(f"constrained {case.id}: {len(toks)} tokens ({r['stop']}): {raw!r}")
            rec = {
                "id": case.id,
                "message": case.message,
                "schema": case.schema,
                "grammar_source": (
                    f"llama.cpp's grammars/{case.gbnf_file}"
                    if case.gbnf_file
                    else "the schema through llama_cpp.llama_grammar.json_schema_to_gbnf"
                    if case.schema
                    else "written here"
                ),
                "grammar": grammar,
                "prompt": prompt,
                "prompt_ids": ids,
                "tokens": toks,
                "text": text if text is not None else raw.decode("utf-8", "replace"),
                "stop": r["stop"],
                "margins": r["margins"],
                "n_allowed": r["n_allowed"],
            }
            if text is None:
                rec["text_hex"] = raw.hex()
            records.append(rec)
        model_params = model.params
    finally:
        model.close()

    out = {
        "model": model_path.name,
        "model_sha256": sha256_file(model_path),
        "llama_cpp_commit": commit,
        "how": "each case: the user message through llama_chat_apply_template with the model's "
        "chat template (no system message, assistant turn opened), tokenized with add_special "
        "and parse_special; the prompt decoded as one batch, then one token per llama_decode. "
        "Sampler chain: llama_sampler_init_grammar(vocab, grammar, \"root\") then "
        "llama_sampler_init_greedy(), sampled with llama_sampler_sample. tokens ends with the "
        "end-of-generation token when one was sampled (stop \"eog\"); text is the "
        "detokenization of tokens without that final token (text_hex too when it is not UTF-8). "
        "For step i (the token tokens[i]): n_allowed[i] is the number of tokens whose logit the "
        "grammar sampler left finite, margins[i] the best allowed logit minus the second best "
        "(null when only one token is allowed); the sampled token was checked to be the first "
        "best allowed token. Schema cases: the grammar is what llama-cpp-python's Python port "
        "json_schema_to_gbnf gives (older than, and formatted unlike, the C++ "
        "json_schema_to_grammar of this llama.cpp); the grammar text is what was used",
        "settings": {
            **settings.describe(),
            "model_params": {"n_gpu_layers": 0, **model_params},
            "n_generate": N_GENERATE,
            "sampler": "chain: grammar (root \"root\"), greedy",
        },
        "cases": records,
    }
    write_json(out_dir / "grammar" / "constrained.json", out)
    return {
        "model": model_path.name,
        "cases": len(records),
        "stops": {c["id"]: c["stop"] for c in records},
    }
