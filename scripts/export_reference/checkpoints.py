"""Step 15: chapter 17's converted checkpoints, run by llama.cpp.

Chapter 17 turns a Hugging Face directory into the GGUF file llama.cpp's converter would
write. This step checks the result in llama.cpp itself: it makes the directories the chapter's
tests make (chapter 17's `make-checkpoint` example: Hugging Face's `safetensors` and
`tokenizers` libraries, from a GGUF model), converts each with `llm-rs convert`, loads the
converted file in llama.cpp, and stores what llama.cpp computes on it for one prompt: the
prompt's ids as llama.cpp tokenizes them, the logits of its last position in full, and the top
logits of every position. The sha256 of each converted file is recorded, so the tests know the
file llama.cpp ran is the one the converter makes now.

It also runs llama.cpp's own converter, `convert_hf_to_gguf.py` (from the source release
llama.cpp is built from), on the same directories, and records what it writes compactly: every
metadata key with its type and value (a long array or string by its length and the sha256 of
its bytes), every tensor's type, shape and the sha256 of its bytes. Chapter 17's tests convert
the same directories and compare, key by key and tensor by tensor.

The directories and converted files stay in the cache; only llama.cpp's numbers are committed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import gguf
import numpy as np

from . import engine as E
from .common import log, sha256_file, write_json, write_safetensors

PROMPT = "The capital of France is Paris. The old lighthouse keeper climbed the stairs"
TOP_K = 32

# id: (source model: "default" or "gemma3", make-checkpoint's flags). The directory is named
# by the id, as chapter 17's tests name theirs: the converted file's `general.name` is it.
CASES = {
    "default-f32": ("default", ["--layers", "4"]),
    "default-bf16": ("default", ["--layers", "4", "--dtype", "bf16", "--shards", "2"]),
    "gemma3-bf16": ("gemma3", ["--layers", "2", "--dtype", "bf16"]),
}


# llama.cpp's converter runs on directories of CASES: id -> (directory, its `--outtype`, the
# type given to `llm-rs convert` for the same file, None for the checkpoint's own types). F32
# and BF16 directories kept as they are; Q8_0, the one quantized type both converters write.
CONVERSIONS = {
    "default-f32": ("default-f32", "f32", None),
    "default-bf16": ("default-bf16", "bf16", None),
    "gemma3-bf16": ("gemma3-bf16", "bf16", None),
    "default-f32-q8_0": ("default-f32", "q8_0", "Q8_0"),
}

# What of llama.cpp's source tree the converter needs: the script, the model classes it
# imports (`conversion/`) and the gguf-py it puts first on its path.
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")

# Arrays longer than this, and strings longer than LONG_STRING characters, are recorded by
# length and sha256 instead of in full: the vocabulary, merges, scores, the chat template.
SHORT_ARRAY = 16
LONG_STRING = 200


def cargo_release(root: Path, *args: str) -> None:
    subprocess.run(["cargo", "build", "--release", "-q", *args], cwd=root, check=True)


def export_checkpoints(
    root: Path, model: Path, gemma3: Path, sdist: Path, cache: Path, stage: Path,
    settings: E.ContextSettings,
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
    section["llama_cpp_converter"] = export_converted(sdist, cache, stage)
    return section


def unpack_converter(sdist: Path, cache: Path) -> Path:
    """llama.cpp's `convert_hf_to_gguf.py` and what it imports, unpacked from the source release
    into the cache (afresh on every run, so it is always the release's)."""
    dest = cache / "reference" / "convert_hf_to_gguf"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tf:
        root = tf.getnames()[0].split("/")[0]
        prefix = f"{root}/vendor/llama.cpp/"
        for m in tf.getmembers():
            rel = m.name[len(prefix):] if m.name.startswith(prefix) else None
            if rel and m.isfile() and any(rel == p or rel.startswith(p) for p in CONVERTER_PARTS):
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tf.extractfile(m).read())
    script = dest / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise RuntimeError(f"{sdist}: no vendor/llama.cpp/convert_hf_to_gguf.py")
    return script


def _hashed(raw: bytes, n: int) -> dict:
    return {"len": n, "sha256": hashlib.sha256(raw).hexdigest()}


def _scalar(vtype: gguf.GGUFValueType, parts: list) -> object:
    if vtype == gguf.GGUFValueType.STRING:
        return bytes(parts[1]).decode("utf-8")
    v = parts[0][0]
    if vtype == gguf.GGUFValueType.BOOL:
        return bool(v)
    if vtype in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
        return float(v)
    return int(v)


def _type_name(vtype: gguf.GGUFValueType) -> str:
    return {
        gguf.GGUFValueType.UINT8: "u8", gguf.GGUFValueType.INT8: "i8",
        gguf.GGUFValueType.UINT16: "u16", gguf.GGUFValueType.INT16: "i16",
        gguf.GGUFValueType.UINT32: "u32", gguf.GGUFValueType.INT32: "i32",
        gguf.GGUFValueType.UINT64: "u64", gguf.GGUFValueType.INT64: "i64",
        gguf.GGUFValueType.FLOAT32: "f32", gguf.GGUFValueType.FLOAT64: "f64",
        gguf.GGUFValueType.BOOL: "bool", gguf.GGUFValueType.STRING: "string",
    }[vtype]


def summarize_gguf(path: Path) -> dict:
    """A GGUF file's metadata (key -> type and value) and tensors (name -> type, shape in ggml's
    order, sha256 of the bytes). A long array is its length and the sha256 of its elements as
    the file stores them (a string: u64 length, then its bytes; a number: little-endian); a
    long string likewise, by its bytes."""
    r = gguf.GGUFReader(path)
    meta = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = gguf.GGUFValueType(int(f.parts[2][0]))
        value = f.parts[3:]
        if vtype == gguf.GGUFValueType.ARRAY:
            elem = gguf.GGUFValueType(int(value[0][0]))
            n = int(value[1][0])
            entry = {"type": f"array[{_type_name(elem)}]"}
            if n > SHORT_ARRAY:
                entry.update(_hashed(b"".join(p.tobytes() for p in value[2:]), n))
            else:
                step = 2 if elem == gguf.GGUFValueType.STRING else 1
                entry["value"] = [_scalar(elem, value[2 + i * step:]) for i in range(n)]
        else:
            entry = {"type": _type_name(vtype)}
            v = _scalar(vtype, value)
            if isinstance(v, str) and len(v) > LONG_STRING:
                entry.update(_hashed(v.encode("utf-8"), len(v)))
            else:
                entry["value"] = v
        meta[key] = entry
    tensors = {
        t.name: {
            "type": t.tensor_type.name,
            "shape": [int(d) for d in t.shape],
            "sha256": hashlib.sha256(t.data.tobytes()).hexdigest(),
        }
        for t in r.tensors
    }
    return {"metadata": meta, "tensors": dict(sorted(tensors.items()))}


def export_converted(sdist: Path, cache: Path, stage: Path) -> dict:
    """Run llama.cpp's converter on the directories `export_checkpoints` made, and write
    checkpoints/converted.json; returns the manifest's record of it."""
    script = unpack_converter(sdist, cache)
    work = cache / "reference" / "checkpoints"
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    cases = {}
    for cid, (directory, outtype, ours) in CONVERSIONS.items():
        out = work / f"{cid}.llama-cpp.gguf"
        with open(work / f"{cid}.llama-cpp.log", "w") as logf:
            subprocess.run(
                [sys.executable, str(script), str(work / directory), "--outfile", str(out),
                 "--outtype", outtype],
                check=True, env=env, stdout=logf, stderr=subprocess.STDOUT,
            )
        summary = summarize_gguf(out)
        cases[cid] = {
            "directory": directory,
            "directory_files": {
                p.name: sha256_file(p) for p in sorted((work / directory).iterdir()) if p.is_file()
            },
            "outtype": outtype,
            "llm_rs_type": ours,
            "converted_sha256": sha256_file(out),
            **summary,
        }
        log(f"{cid}: convert_hf_to_gguf.py --outtype {outtype}: "
            f"{len(summary['metadata'])} keys, {len(summary['tensors'])} tensors")
    write_json(stage / "checkpoints" / "converted.json", {
        "how": "convert_hf_to_gguf.py DIR --outfile OUT --outtype T, from the llama.cpp of the "
        "source release, on the directories the cases above were made in",
        "cases": cases,
    })
    return {
        "converter": "convert_hf_to_gguf.py of the llama.cpp the sdist vendors",
        "python_packages": {
            p: importlib.metadata.version(p) for p in ("torch", "transformers", "sentencepiece")
        },
        "outtypes": {c: v[1] for c, v in CONVERSIONS.items()},
    }
