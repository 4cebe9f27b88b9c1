"""Step 7: tokenizer references for chapter 2.

llama.cpp's own vocabulary test files (`models/ggml-vocab-*.gguf` with `.inp`/`.out`) are
copied from the llama-cpp-python sdist; for the four that llama.cpp ships without tests, the
`.inp` of llama-spm is used and the `.out` is llama.cpp's own tokenization. A corpus of hard
strings is tokenized and detokenized by llama.cpp for the default model's vocabulary, Gemma 3's
and every copied one, with special tokens parsed and not; and every `tokenizer.ggml.pre` name
llama.cpp knows is tried on the GPT-2 vocabulary.
"""

from __future__ import annotations

import re
import struct
import subprocess
import tarfile
import tempfile
from pathlib import Path

from . import engine as E
from .common import log, write_atomic, write_json

# llama.cpp's vocabulary-only test models, all but the ones in LEFT_OUT.
VOCABS = (
    "llama-spm",
    "llama-bpe",
    "gpt-2",
    "aquila",
    "baichuan",
    "bert-bge",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-neox",
    "mpt",
    "nomic-bert-moe",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
)
LEFT_OUT = {
    "command-r": "10.9 MB; its pre-tokenizer rule (each digit alone, then GPT-2's) is SmolLM2's "
    "and StarCoder's, tested with the default model and ggml-vocab-starcoder, and its flags are "
    "checked in pre_tokenizers",
}
# Whose test strings the vocabularies that llama.cpp ships without .inp/.out get.
TESTS_FROM = "llama-spm"
# The vocabularies whose tests copy_vocab_files wrote (llama.cpp ships none for them).
GENERATED: set[str] = set()


def shipped_tests(vocab: str) -> bool:
    """Whether llama.cpp ships `vocab`'s .inp/.out (known once copy_vocab_files has run)."""
    return vocab not in GENERATED
# Gemma 3's vocabulary (SentencePiece with thousands of user-defined tokens), from the model
# chapter 13 runs; not copied here (the file is 253 MB).
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"

# Strings chosen to hit every branch of the pre-tokenizers, of BPE and SentencePiece merging,
# of WordPiece's and Unigram's normalization.
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
    # for the pre-tokenizers of other families, WordPiece and Unigram
    "1234567 12345 123 1,000,000",
    "HelloWorld ÉcoleÉcole camelCase URLParser",
    "it's IT'S it'S don'T we'Re",
    "x   \t  y\r\n\r\nz \n\n\n\n  w",
    "user@example.com #tag $100 ~/path a|b c^d `code` {x: [1, 2]}",
    "ａｂｃ　ＡＢＣ１２３！",
    "ﬁ ligature ① ² ½ Ⅻ",
    "İstanbul ǅ ß ẞ",
    "e\u0301\u0302 stacked marks",
    "Ελληνικά κείμενα",
    "ไทย ภาษา ລາວ",
    "ひらがな カタカナ 漢字 ㄅㄆㄇ",
    "<sentinel:12>IMGIMGABZ",
    "<mask> [MASK] [CLS] [SEP] <s> </s> <pad>",
]

# A string whose decoding shows whether a vocabulary cleans up spaces (" ," → ",").
CLEAN_PROBE = "Hello , world ! it ' s , they 're and we 've"

_MODELS = "vendor/llama.cpp/models/"
# The sdist copy_vocab_files read, for export_corpus (llama.cpp's list of pre-tokenizer names).
_SDIST: Path | None = None
_SEP = "\n__ggml_vocab_test__\n"


def _test_strings(inp: str) -> list[str]:
    """The strings of a .inp file, as test-tokenizer-0 reads them."""
    texts = inp.split(_SEP)
    return texts[:-1] if texts and texts[-1] == "" else texts


def _out_lines(model: E.Model, texts: list[str]) -> str:
    """llama.cpp's ids of `texts` in the .out format: test-tokenizer-0's flags (add_special
    and parse_special off), each id after a space, one line per string."""
    return "".join(
        "".join(f" {t}" for t in model.tokenize(text, add_special=False, parse_special=False))
        + "\n"
        for text in texts
    )


def _ids(out: str) -> list[list[int]]:
    return [[int(t) for t in line.split()] for line in out.splitlines()]


def copy_vocab_files(sdist: Path, out_dir: Path) -> list[str]:
    """Copy the vocabularies of VOCABS and their .inp/.out from the sdist; write the tests of
    those that have none (TESTS_FROM's strings, llama.cpp's ids). Each .out is checked against
    llama.cpp: the tests compare with these ids."""
    global _SDIST
    _SDIST = sdist
    copied = []
    with tarfile.open(sdist) as tf:
        root = tf.getnames()[0].split("/")[0]

        def member(name: str) -> bytes | None:
            try:
                f = tf.extractfile(f"{root}/{_MODELS}{name}")
            except KeyError:
                return None
            return f.read() if f else None

        for v in VOCABS:
            name = f"ggml-vocab-{v}.gguf"
            gguf = member(name)
            if gguf is None:
                raise RuntimeError(f"{sdist}: no {_MODELS}{name}")
            path = out_dir / "tokenizer" / name
            write_atomic(path, gguf)
            copied.append(name)
            inp, out = member(name + ".inp"), member(name + ".out")
            if inp is None:
                inp = member(f"ggml-vocab-{TESTS_FROM}.gguf.inp")
            texts = _test_strings(inp.decode("utf-8"))
            model = E.Model(path, vocab_only=True)
            try:
                ours = _out_lines(model, texts)
            finally:
                model.close()
            if out is None:
                GENERATED.add(v)
                out = ours.encode()
                log(f"tokenizer: {name}.out written from llama.cpp (llama.cpp ships none)")
            elif _ids(out.decode()) != _ids(ours):
                raise RuntimeError(f"llama.cpp does not pass its own test {name}.out")
            else:
                copied += [name + ".inp", name + ".out"]
            write_atomic(path.with_name(name + ".inp"), inp)
            write_atomic(path.with_name(name + ".out"), out)
    return copied


def _tokenize_all(model: E.Model, texts: list[str]) -> list[dict]:
    cases = []
    for text in texts:
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


def _gemma3_model(default_model: Path) -> Path:
    """Gemma 3's model file: next to the default model in the cache, else fetched."""
    path = default_model.with_name(GEMMA3_FILE)
    if path.exists():
        return path
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [root / "scripts" / "fetch-model", "gemma3"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def _gguf_with_pre(data: bytes, pre: str | None) -> bytes:
    """The GGUF file `data` (metadata only, version 3) with tokenizer.ggml.pre set to `pre`, or
    removed for None. The value is spliced in place: a vocab-only file has no tensor data
    whose offsets could move."""
    (n_kv,) = struct.unpack_from("<Q", data, 16)
    off = 24
    key = b"tokenizer.ggml.pre"

    def skip_value(off: int, vtype: int) -> int:
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        if vtype == 8:
            (n,) = struct.unpack_from("<Q", data, off)
            return off + 8 + n
        if vtype == 9:
            etype, n = struct.unpack_from("<IQ", data, off)
            off += 12
            for _ in range(n):
                off = skip_value(off, etype)
            return off
        return off + sizes[vtype]

    for _ in range(n_kv):
        start = off
        (klen,) = struct.unpack_from("<Q", data, off)
        k = data[off + 8 : off + 8 + klen]
        (vtype,) = struct.unpack_from("<I", data, off + 8 + klen)
        end = skip_value(off + 12 + klen, vtype)
        if k == key:
            if pre is None:
                header = data[:16] + struct.pack("<Q", n_kv - 1) + data[24:start]
                return header + data[end:]
            value = pre.encode()
            kv = struct.pack("<Q", klen) + k + struct.pack("<IQ", 8, len(value)) + value
            return data[:start] + kv + data[end:]
        off = end
    raise RuntimeError("no tokenizer.ggml.pre in the file")


def _pre_names(sdist: Path) -> list[str]:
    """Every tokenizer.ggml.pre value llama.cpp's vocabulary loader knows, in its order."""
    with tarfile.open(sdist) as tf:
        root = tf.getnames()[0].split("/")[0]
        src = tf.extractfile(f"{root}/vendor/llama.cpp/src/llama-vocab.cpp").read().decode()
    names = []
    for n in re.findall(r'tokenizer_pre == "([^"]+)"', src):
        if n not in names:
            names.append(n)
    return names


def _export_pre_tokenizers(sdist: Path, out_dir: Path) -> dict:
    """llama.cpp's ids for the corpus with every pre-tokenizer name, on the GPT-2 vocabulary
    with its tokenizer.ggml.pre replaced (or removed: "absent")."""
    base = (out_dir / "tokenizer" / "ggml-vocab-gpt-2.gguf").read_bytes()
    names: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in [*_pre_names(sdist), None]:
            path = Path(tmp) / "vocab.gguf"
            path.write_bytes(_gguf_with_pre(base, pre))
            # The "whitespace" rule keeps spaces in raw words, and llama.cpp aborts
            # (GGML_ASSERT in find_bpe_rank) when it looks up a merge with a space in it.
            aborts = lambda text: pre == "whitespace" and " " in text  # noqa: E731
            model = E.Model(path, vocab_only=True)
            try:
                ids = [
                    None if aborts(t) else model.tokenize(t, add_special=True, parse_special=False)
                    for t in CORPUS
                ]
                probe = None
                if not aborts(CLEAN_PROBE):
                    probe_ids = model.tokenize(CLEAN_PROBE, add_special=False, parse_special=False)
                    probe = model.detokenize(probe_ids, False, True).hex()
                names["absent" if pre is None else pre] = {"ids": ids, "probe_detok_hex": probe}
            finally:
                model.close()
    return {
        "about": "llama.cpp's ids of every corpus string (add_special = true, parse_special = "
        "false) with each tokenizer.ggml.pre value its loader knows, on the GPT-2 vocabulary "
        "with that value spliced in ('absent': the key removed); probe_detok_hex: "
        "llama_detokenize(remove_special = false, unparse_special = true) of clean_probe's ids, "
        "which shows whether spaces are cleaned up. null: a string with a space under the "
        "'whitespace' rule, on which llama.cpp aborts (GGML_ASSERT: a merge with a space)",
        "vocab": "ggml-vocab-gpt-2.gguf",
        "strings": CORPUS,
        "clean_probe": CLEAN_PROBE,
        "names": names,
    }


def export_corpus(default_model: Path, out_dir: Path, sdist: Path | None = None) -> dict:
    vocabs = {"default": default_model, "gemma-3": _gemma3_model(default_model)} | {
        v: out_dir / "tokenizer" / f"ggml-vocab-{v}.gguf" for v in VOCABS
    }
    result = {
        "about": "llama.cpp's tokenization of hard strings: llama_tokenize(text, add_special, "
        "parse_special) through a vocab-only model load; pieces from llama_token_to_piece "
        "(special = true); detok from llama_detokenize(remove_special = false, unparse_special "
        "= true), detok_plain the same with unparse_special = false. Byte strings are hex, "
        "since single tokens may hold part of a UTF-8 character. Vocabularies: the default "
        "model's, Gemma 3's (with llama-spm's test strings too) and every vocabulary test file "
        "copied from llama.cpp; left_out: the test files not copied, and why.",
        "vocabs": {},
        "left_out": LEFT_OUT,
    }
    summary = {}
    # Gemma 3 has no test file of llama.cpp's: it also gets llama-spm's test strings.
    spm_tests = (out_dir / "tokenizer" / f"ggml-vocab-{TESTS_FROM}.gguf.inp").read_text("utf-8")
    for key, path in vocabs.items():
        texts = CORPUS + (_test_strings(spm_tests) if key == "gemma-3" else [])
        model = E.Model(path, vocab_only=True)
        try:
            v = model.vocab
            info = {
                "file": path.name if key.startswith("ggml") or key in VOCABS else f"{key} model",
                "vocab_type": E.L.llama_vocab_type(v),
                "n_tokens": model.n_vocab,
                "bos": E.L.llama_vocab_bos(v),
                "eos": E.L.llama_vocab_eos(v),
                "add_bos": bool(E.L.llama_vocab_get_add_bos(v)),
                "add_eos": bool(E.L.llama_vocab_get_add_eos(v)),
                "pre": model.meta("tokenizer.ggml.pre"),
                "model": model.meta("tokenizer.ggml.model"),
                "strings": _tokenize_all(model, texts),
            }
        finally:
            model.close()
        result["vocabs"][key] = info
        summary[key] = {k: info[k] for k in ("file", "vocab_type", "n_tokens", "add_bos", "pre")}
        log(f"tokenizer corpus: {key} done")
    sdist = sdist or _SDIST
    if sdist is None:
        raise RuntimeError("export_corpus needs the sdist: call copy_vocab_files first")
    result["pre_tokenizers"] = _export_pre_tokenizers(sdist, out_dir)
    log("tokenizer corpus: pre-tokenizers done")
    write_json(out_dir / "tokenizer/corpus.json", result)
    return summary
