"""Step 7: tokenizer references for chapter 2.

llama.cpp's own vocabulary test files (`models/ggml-vocab-*.gguf` with `.inp`/`.out`) are
copied from the llama-cpp-python sdist, and a corpus of hard strings is tokenized and
detokenized by llama.cpp for the default model's vocabulary and those three.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from . import engine as E
from .common import log, write_atomic, write_json

VOCABS = ("llama-spm", "llama-bpe", "gpt-2")

# Strings chosen to hit every branch of a pre-tokenizer and of BPE/SPM merging.
CORPUS = [
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\n\n\n",
    "\t\n",
    " \n \n",
    "\r\n",
    "a  b   c    d",
    "   leading spaces",
    "trailing spaces   ",
    "Hello world",
    " Hello world",
    "Hello World!",
    "Hello, world! How are you?",
    "1",
    "12",
    "123",
    "1234",
    "12345678901234567890",
    "3.14159 and 2,718,281 and 0x1F",
    "2024-01-15T10:30:00Z",
    "abc123def456",
    "I'm you're he's we've I'll she'd don't",
    "I'M YOU'RE HE'S WE'VE I'LL SHE'D DON'T",
    "'s 't 're 've 'm 'll 'd",
    'fn main() {\n    println!("Hello, {}!", name);\n}\n',
    "def f(x):\n\treturn x**2  # square\n",
    "https://example.com/path?q=1&r=2#frag",
    "!!!???...,,,;;;---",
    "café naïve résumé Ångström",
    "e\u0301 a\u0308 n\u0303",
    "Äpfel und Öl",
    "\u00a0non-breaking\u00a0space",
    "a\u200bzero\u200bwidth",
    "Привет, мир!",
    "你好，世界！",
    "日本語のテキスト",
    "한국어 텍스트",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "🦙",
    "Hello 👋 world 🌍!",
    "👨\u200d👩\u200d👧\u200d👦",
    "🏳\ufe0f\u200d🌈",
    "👍🏽",
    "<|im_start|>",
    "<|endoftext|>",
    "<s>",
    "</s>",
    "<s>hello</s>",
    "<|im_start|>user\nhi<|im_end|>\n",
    " <|im_start|> spaced <|im_end|> ",
    "<unk>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
]

_MODELS = "vendor/llama.cpp/models/"


def copy_vocab_files(sdist: Path, out_dir: Path) -> list[str]:
    """Copy ggml-vocab-{llama-spm,llama-bpe,gpt-2}.gguf and their .inp/.out from the sdist."""
    copied = []
    with tarfile.open(sdist) as tf:
        root = tf.getnames()[0].split("/")[0]
        for v in VOCABS:
            for suffix in ("", ".inp", ".out"):
                name = f"ggml-vocab-{v}.gguf{suffix}"
                member = tf.extractfile(f"{root}/{_MODELS}{name}")
                if member is None:
                    raise RuntimeError(f"{sdist}: no {_MODELS}{name}")
                write_atomic(out_dir / "tokenizer" / name, member.read())
                copied.append(name)
    return copied


def _tokenize_all(model: E.Model) -> list[dict]:
    cases = []
    for text in CORPUS:
        entry = {"text": text, "cases": []}
        for parse_special in (False, True):
            for add_special in (False, True):
                ids = model.tokenize(text, add_special=add_special, parse_special=parse_special)
                entry["cases"].append(
                    {
                        "parse_special": parse_special,
                        "add_special": add_special,
                        "ids": ids,
                        # llama_token_to_piece(special = true): the bytes each token stands for.
                        "pieces_hex": [model.token_to_piece(t, True).hex() for t in ids],
                        # llama_detokenize(remove_special = false, unparse_special = true / false).
                        "detok_hex": model.detokenize(ids, False, True).hex(),
                        "detok_plain_hex": model.detokenize(ids, False, False).hex(),
                    }
                )
        cases.append(entry)
    return cases


def export_corpus(default_model: Path, out_dir: Path) -> dict:
    vocabs = {"default": default_model} | {
        v: out_dir / "tokenizer" / f"ggml-vocab-{v}.gguf" for v in VOCABS
    }
    result = {
        "about": "llama.cpp's tokenization of hard strings: llama_tokenize(text, add_special, "
        "parse_special) through a vocab-only model load; pieces from llama_token_to_piece "
        "(special = true); detok from llama_detokenize(remove_special = false, unparse_special "
        "= true), detok_plain the same with unparse_special = false. Byte strings are hex, "
        "since single tokens may hold part of a UTF-8 character.",
        "vocabs": {},
    }
    summary = {}
    for key, path in vocabs.items():
        model = E.Model(path, vocab_only=True)
        try:
            v = model.vocab
            info = {
                "file": path.name if key != "default" else "default model",
                "vocab_type": E.L.llama_vocab_type(v),
                "n_tokens": model.n_vocab,
                "bos": E.L.llama_vocab_bos(v),
                "eos": E.L.llama_vocab_eos(v),
                "add_bos": bool(E.L.llama_vocab_get_add_bos(v)),
                "add_eos": bool(E.L.llama_vocab_get_add_eos(v)),
                "pre": model.meta("tokenizer.ggml.pre"),
                "model": model.meta("tokenizer.ggml.model"),
                "strings": _tokenize_all(model),
            }
        finally:
            model.close()
        result["vocabs"][key] = info
        summary[key] = {k: info[k] for k in ("file", "vocab_type", "n_tokens", "add_bos", "pre")}
        log(f"tokenizer corpus: {key} done")
    write_json(out_dir / "tokenizer/corpus.json", result)
    return summary
