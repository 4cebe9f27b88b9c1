"""Produce reference-data/: what llama.cpp computes for the default model.

Run through `scripts/export-reference`, which prepares the Python environment and the model;
see reference-data/README.md for the format of every file written here.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from . import engine as E
from . import checkpoints, constrained, depth, facts, gemma3, grammar, large, prompts, quant
from . import tokenizer
from . import tools
from . import variants
from .common import log, sha256_file, write_json
from .f32_model import write_f32_copy

FORMAT_VERSION = 1
LLAMA_CPP_PYTHON = "0.3.36"

DESCRIPTIONS = {
    "model/facts.json": "model facts from llama.cpp's C API and gguf-py: hyperparameters, "
    "special ids, metadata, tensor list (name, type, ne, offset)",
    "model/dequant.safetensors": "gguf-py's dequantization of the first rows of a few tensors",
    "tokenizer/corpus.json": "llama.cpp's tokenization and detokenization of hard strings, "
    "for the default vocabulary, Gemma 3's and every vocab-only model here, and of a probe "
    "string by every pre-tokenizer name",
    "quant/variants.json": "quantized variants: per-tensor type, ne, sha256; greedy continuations",
    "quant/logits.safetensors": "last-position logits of the short prompt on each variant",
    "quant/blocks.safetensors": "gguf-py's quantization and dequantization of seeded rows",
    "quant/blocks-ggml.safetensors": "ggml's quantization (ggml_quantize_chunk) of the same "
    "rows, dequantized by gguf-py",
}


def describe(rel: str) -> str:
    if rel in DESCRIPTIONS:
        return DESCRIPTIONS[rel]
    if held := grammar.describe(rel) or constrained.describe(rel) or tools.describe(rel):
        return held
    if m := re.fullmatch(r"prompts/(\w+)\.safetensors", rel):
        return f"prompt {m[1]}: intermediate tensors of the forward pass, by llama.cpp graph name"
    if m := re.fullmatch(r"prompts/(\w+)\.decode\.safetensors", rel):
        return f"prompt {m[1]}: logits of each greedy decode step (full f32 for the first steps, top-k for all)"
    if m := re.fullmatch(r"prompts/(\w+)\.generation\.json", rel):
        return f"prompt {m[1]}: greedy continuation, ids and text"
    if rel == "gemma3/prompts.json":
        return "Gemma 3 270M: prompts, their ids and llama.cpp's greedy continuations (Q4_K_M)"
    if m := re.fullmatch(r"gemma3/(\w+)\.safetensors", rel):
        return f"Gemma 3 270M, prompt {m[1]}: intermediate tensors on the F32 copy (last rows)"
    if m := re.fullmatch(r"gemma3/(\w+)\.quant\.safetensors", rel):
        return f"Gemma 3 270M Q4_K_M, prompt {m[1]}: logits after the prompt, top-k per step"
    if m := re.fullmatch(r"variants/(\w+)/model\.json", rel):
        return f"synthetic variant {m[1]}: the recipe (metadata, tensor shapes, seeds, sha256), " \
            "prompt and llama.cpp's greedy continuation"
    if m := re.fullmatch(r"variants/(\w+)/prompt\.safetensors", rel):
        return f"synthetic variant {m[1]}: every intermediate tensor of the prompt"
    if m := re.fullmatch(r"variants/(\w+)/generation\.safetensors", rel):
        return f"synthetic variant {m[1]}: greedy continuation, top-k logits per decode step"
    if rel == "checkpoints/converted.json":
        return "llama.cpp's convert_hf_to_gguf.py on chapter 17's checkpoints: per case, every " \
            "metadata key's type and value (long arrays and strings by length and sha256), " \
            "every tensor's type, shape and sha256"
    if m := re.fullmatch(r"checkpoints/([\w-]+)\.safetensors", rel):
        return f"chapter 17's checkpoint {m[1]}, converted and run by llama.cpp: the prompt's " \
            "ids, the last position's logits, the top-k logits of every position"
    if rel == "large/models.json":
        return "chapters 14 and 18's generated large models (a few layers, full width): recipe, file " \
            "sha256, prompt and llama.cpp's greedy continuations (f32, f16 and q8_0 KV caches)"
    if m := re.fullmatch(r"large/([\w-]+)\.safetensors", rel):
        return f"generated model {m[1]}: prompt ids, llama.cpp's logits after the prompt, " \
            "its greedy continuation and, after each of its tokens, the top-k logits, the rest's " \
            "probability and a strided sample of the logits; the same with its KV cache in f16 " \
            "and in q8_0"
    if rel == "depth/depth.json":
        return "the default model deep in its context: the prompt's sources and length, " \
            "llama.cpp's settings and greedy continuations with f32, f16 and q8_0 KV caches"
    if rel == "depth/smollm2.safetensors":
        return "the default model after a prompt of 4,000 tokens: the prompt's ids, llama.cpp's " \
            "logits after it, its greedy continuation and, after each of its tokens, the top-k " \
            "logits, the rest's probability and a strided sample of the logits, per KV cache type"
    if m := re.fullmatch(r"tokenizer/ggml-vocab-([\w-]+)\.gguf", rel):
        return f"llama.cpp's vocab-only test model {m[1]} (models/ in llama.cpp)"
    if m := re.fullmatch(r"tokenizer/ggml-vocab-([\w-]+)\.gguf\.(inp|out)", rel):
        what = (
            "test strings, separated by __ggml_vocab_test__"
            if m[2] == "inp"
            else "expected ids, one line per string"
        )
        if tokenizer.shipped_tests(m[1]):
            return f"llama.cpp's tokenizer test for {m[1]}: {what}"
        return (
            f"a tokenizer test for {m[1]}, which llama.cpp ships without one: "
            f"{tokenizer.TESTS_FROM}'s strings, ids from llama.cpp: {what}"
        )
    raise RuntimeError(f"no description for {rel}")


def llama_cpp_commit(sdist: Path) -> str | None:
    """The llama.cpp commit this llama-cpp-python release vendors, from its CHANGELOG."""
    with tarfile.open(sdist) as tf:
        root = tf.getnames()[0].split("/")[0]
        f = tf.extractfile(f"{root}/CHANGELOG.md")
        text = f.read().decode() if f else ""
    section = text.split(f"## [{LLAMA_CPP_PYTHON}]", 1)[-1].split("\n## [", 1)[0]
    m = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section)
    return m[1] if m else None


def ggml_header(sdist: Path) -> str:
    with tarfile.open(sdist) as tf:
        root = tf.getnames()[0].split("/")[0]
        return tf.extractfile(f"{root}/vendor/llama.cpp/ggml/include/ggml.h").read().decode()


def notes(pr: dict) -> list[str]:
    """What a reader of these numbers should know about llama.cpp's behaviour here."""
    gen = {p["id"]: p for p in pr["prompts"]}
    diff = max(c["max_abs_diff_logits_with_vs_without_callback"] for c in pr["checks"].values())
    return [
        (
            "SmolLM2's BOS token is <|im_start|> (id 1) and its EOS <|im_end|> (id 2); "
            "tokenizer.ggml.add_bos_token is false, so add_special adds nothing to these prompts."
        ),
        "Greedy decoding on the F32 copy: "
        + "; ".join(
            f"{i}: {p['generated']} tokens, stopped by {p['stopped']}" for i, p in gen.items()
        )
        + ". A sampled end-of-generation token is kept as the last id; nothing is decoded after it.",
        (
            "Rows of 576 values are not a multiple of QK_K = 256, so llama_model_quantize falls back "
            "to a legacy type for those tensors (Q4_K_M: mostly Q5_0; Q6_K: mostly Q8_0); only "
            "ffn_down (rows of 1536) gets K-quants. See type_counts under quant."
        ),
        (
            "llama.cpp describes the model as 'llama 256M Q4_1': its size label comes from the layer "
            "count (30 layers), not from the parameter count (134.5M)."
        ),
        (
            "Both RMS_NORM nodes of a layer are named norm-L; attn_norm-L and ffn_norm-L are the MUL "
            "by the weight that follows (the CPU backend fuses the pair)."
        ),
        (
            "Capturing tensors splits the graph computation at every stored tensor; the logits equal "
            f"those of a run without the callback (largest difference {diff})."
        ),
        (
            "Quantized runs (quant/): matrix products with quantized weights first quantize the "
            "activations to the weight type's vec_dot_type (Q8_0, Q8_1 or Q8_K), and with the "
            "default F16 KV cache Q and the attention weights are converted to F16 for the products "
            "with the cache. The CPU backend may also repack some weight types into interleaved "
            "layouts (use_extra_bufts, REPACK in system_info). The F32 runs have none of this."
        ),
    ]


def file_entries(stage: Path) -> dict:
    """The manifest's `files` entries of every file under `stage`, sorted by path."""
    files = {}
    for p in sorted(stage.rglob("*")):
        if p.is_file():
            rel = p.relative_to(stage).as_posix()
            files[rel] = {
                "sha256": sha256_file(p),
                "size": p.stat().st_size,
                "holds": describe(rel),
            }
    return files


def default_settings() -> E.ContextSettings:
    """The context of the default model's runs: the F32 copy's, and the quantized files' too."""
    return E.ContextSettings(
        n_ctx=256,
        n_batch=256,
        n_threads=2,
        type_k=E.L.GGML_TYPE_F32,
        type_v=E.L.GGML_TYPE_F32,
        flash_attn=False,
    )


def grammar_steps(sdist: Path, model: Path, stage: Path, settings: E.ContextSettings) -> dict:
    """Steps 13 and 14, written under stage/grammar/; the manifest's `grammar` section."""
    commit = llama_cpp_commit(sdist)
    log("step 13: llama.cpp's grammar tests")
    section = grammar.export_grammar(sdist, stage, commit)
    log("step 14: grammar-constrained greedy runs of the default model")
    section["constrained"] = constrained.export_constrained(model, sdist, stage, settings, commit)
    return section


def recorded_manifest(out: Path, sdist: Path, model: Path | None = None) -> tuple[Path, dict]:
    """For an `--only` step: the manifest's path and contents, refused unless it was made from
    the same sdist (and, when given, the same model)."""
    manifest_path = out / "manifest.json"
    if not manifest_path.is_file():
        raise SystemExit(f"{manifest_path}: missing; run the whole export first")
    manifest = json.loads(manifest_path.read_bytes())
    recorded = manifest.get("llama_cpp", {}).get("sdist_sha256")
    if recorded != sha256_file(sdist):
        raise SystemExit(
            f"{sdist} is not the sdist reference-data/ was made from (manifest: sdist_sha256 "
            f"{recorded}); run the whole export"
        )
    if model is not None:
        recorded = manifest.get("model", {}).get("sha256")
        if recorded != sha256_file(model):
            raise SystemExit(
                f"{model} is not the model reference-data/ was made from (manifest: model "
                f"sha256 {recorded}); run the whole export"
            )
    return manifest_path, manifest


def recorded_settings(manifest_path: Path, manifest: dict) -> E.ContextSettings:
    """This script's settings, refused unless they are those the manifest was made with."""
    settings = default_settings()
    recorded = manifest.get("settings", {}).get("quant_settings")
    if recorded != settings.describe():
        raise SystemExit(
            f"{manifest_path}: settings.quant_settings {recorded} differ from this script's "
            f"{settings.describe()}; run the whole export"
        )
    return settings


def only_grammar(sdist: Path, model: Path, out: Path) -> int:
    """`--only grammar`: redo steps 13 and 14 alone, replace reference-data/grammar/ and update
    the manifest's `files` and `grammar` entries in place (nothing else changes, `created`
    included). Refused unless the manifest was made from the same sdist and model, with the
    same context settings."""
    manifest_path, manifest = recorded_manifest(out, sdist, model)
    settings = recorded_settings(manifest_path, manifest)
    E.init()
    with tempfile.TemporaryDirectory(prefix="export-reference-grammar-") as tmp:
        stage = Path(tmp)
        section = grammar_steps(sdist, model, stage, settings)
        files = {k: v for k, v in manifest["files"].items() if not k.startswith("grammar/")}
        files.update(file_entries(stage))
        manifest["files"] = dict(sorted(files.items(), key=lambda kv: PurePosixPath(kv[0]).parts))
        # The `grammar` section goes where a whole run puts it: after `large`.
        updated = {}
        for k, v in manifest.items():
            if k != "grammar":
                updated[k] = v
            if k == "large":
                updated["grammar"] = section
        if "grammar" not in updated:
            raise SystemExit(f"{manifest_path}: no `large` section; run the whole export")
        shutil.rmtree(out / "grammar", ignore_errors=True)
        shutil.move(str(stage / "grammar"), str(out / "grammar"))
    write_json(manifest_path, updated)
    log(f"replaced {out / 'grammar'} and its manifest entries")
    return 0


def only_checkpoints(sdist: Path, model: Path, gemma3_path: Path, cache: Path, out: Path) -> int:
    """`--only checkpoints`: redo step 15 alone, replace reference-data/checkpoints/ and update
    the manifest's `files` and `checkpoints` entries in place. Refused unless the manifest was
    made from the same sdist and model."""
    manifest_path, manifest = recorded_manifest(out, sdist, model)
    E.init()
    with tempfile.TemporaryDirectory(prefix="export-reference-checkpoints-") as tmp:
        stage = Path(tmp)
        section = checkpoints.export_checkpoints(
            out.resolve().parent, model, gemma3_path, sdist, cache, stage, default_settings()
        )
        files = {k: v for k, v in manifest["files"].items() if not k.startswith("checkpoints/")}
        files.update(file_entries(stage))
        manifest["files"] = dict(sorted(files.items(), key=lambda kv: PurePosixPath(kv[0]).parts))
        updated = {}
        for k, v in manifest.items():
            if k != "checkpoints":
                updated[k] = v
            if k == "grammar":
                updated["checkpoints"] = section
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
        shutil.move(str(stage / "checkpoints"), str(out / "checkpoints"))
    write_json(manifest_path, updated)
    log(f"replaced {out / 'checkpoints'} and its manifest entries")
    return 0


def only_section(name: str, step: str, sdist: Path, out: Path, export) -> int:
    """`--only NAME`: redo one step alone, replace reference-data/NAME/ and update the
    manifest's `files` and `NAME` entries in place. Refused unless the manifest was made from
    the same sdist and with the same quantized-variant settings. `export(stage, settings)`
    writes the step's files under `stage/NAME/` and returns its manifest section."""
    manifest_path, manifest = recorded_manifest(out, sdist)
    settings = recorded_settings(manifest_path, manifest)
    if name not in manifest:
        raise SystemExit(f"{manifest_path}: no `{name}` section; run the whole export")
    E.init()
    with tempfile.TemporaryDirectory(prefix=f"export-reference-{name}-") as tmp:
        stage = Path(tmp)
        section = export(stage, settings)
        # Read again: the export takes minutes, and only this step's entries are replaced.
        manifest = json.loads(manifest_path.read_bytes())
        files = {k: v for k, v in manifest["files"].items() if not k.startswith(f"{name}/")}
        files.update(file_entries(stage))
        manifest["files"] = dict(sorted(files.items(), key=lambda kv: PurePosixPath(kv[0]).parts))
        manifest[name] = {"how": manifest[name]["how"], **section}
        shutil.rmtree(out / name, ignore_errors=True)
        shutil.move(str(stage / name), str(out / name))
    write_json(manifest_path, manifest)
    log(f"replaced {out / name} ({step}) and its manifest entries")
    return 0


def only_large(sdist: Path, cache: Path, out: Path) -> int:
    """`--only large`: step 12 alone (the generated large models)."""
    return only_section("large", "step 12", sdist, out, lambda stage, settings:
                        large.export_large(out.resolve().parent, cache, stage, settings))


def only_variants(sdist: Path, cache: Path, out: Path) -> int:
    """`--only variants`: step 11 alone (the synthetic variants, which run with the F32
    settings, the quantized variants' too)."""
    return only_section("variants", "step 11", sdist, out, lambda stage, settings:
                        variants.export_variants(out / "tokenizer", cache, stage, settings))


def only_placed_section(name: str, after: str, how: str, sdist: Path, model: Path, out: Path,
                        export) -> int:
    """`--only NAME` for a step that runs the default model: redo it alone, replace
    reference-data/NAME/ and update the manifest's `files` and `NAME` entries in place, the
    section placed after `after` when the manifest has none yet. Refused unless the manifest
    was made from the same sdist and model. `export(stage)` writes the step's files under
    `stage/NAME/` and returns its manifest section."""
    manifest_path, manifest = recorded_manifest(out, sdist, model)
    with tempfile.TemporaryDirectory(prefix=f"export-reference-{name}-") as tmp:
        stage = Path(tmp)
        section = export(stage)
        files = {k: v for k, v in manifest["files"].items() if not k.startswith(f"{name}/")}
        files.update(file_entries(stage))
        manifest["files"] = dict(sorted(files.items(), key=lambda kv: PurePosixPath(kv[0]).parts))
        updated = {}
        for k, v in manifest.items():
            if k != name:
                updated[k] = v
            if k == after:
                updated[name] = {"how": how, **section}
        shutil.rmtree(out / name, ignore_errors=True)
        shutil.move(str(stage / name), str(out / name))
    write_json(manifest_path, updated)
    log(f"replaced {out / name} and its manifest entries")
    return 0


def only_tools(sdist: Path, model: Path, out: Path) -> int:
    """`--only tools`: step 16 alone (conversations with tools through llama-server)."""
    return only_placed_section("tools", "checkpoints", TOOLS_HOW, sdist, model, out, lambda stage:
                               tools.export_tools(out.resolve().parent, model, sdist, stage))


DEPTH_HOW = ("the default model (Q4_1, as shipped) after a prompt of the book's Part I cut to "
             "4,000 tokens, decoded in one batch, then greedy continuation a token at a time; "
             "with f32, f16 (flash attention off) and q8_0 (flash attention on) KV caches")


def only_depth(sdist: Path, model: Path, out: Path) -> int:
    """`--only depth`: step 17 alone (the default model deep in its context), with the
    quantized variants' settings the manifest records."""
    manifest_path, manifest = recorded_manifest(out, sdist, model)
    settings = recorded_settings(manifest_path, manifest)
    E.init()
    return only_placed_section("depth", "tools", DEPTH_HOW, sdist, model, out, lambda stage:
                               depth.export_depth(out.resolve().parent, model, stage, settings))


TOOLS_HOW = ("llama-server (scripts/build-llama-server) started once per template with --jinja "
             "--chat-template-file and the default model; each conversation posted to "
             "/apply-template with chat_template_kwargs {\"date_string\": \"26 Jul 2024\"}")


def main() -> int:
    ap = argparse.ArgumentParser(prog="export-reference")
    ap.add_argument("--model", type=Path, required=True, help="the default model (Q4_1 GGUF)")
    ap.add_argument("--cache", type=Path, help="cache directory for derived models")
    ap.add_argument("--sdist", type=Path, required=True, help="llama-cpp-python sdist (.tar.gz)")
    ap.add_argument("--out", type=Path, required=True, help="reference-data/ directory to replace")
    ap.add_argument("--gemma3", type=Path, help="Gemma 3 270M Q4_K_M (chapter 13)")
    ap.add_argument(
        "--only",
        choices=["grammar", "checkpoints", "large", "variants", "tools", "depth"],
        help="redo steps 13 and 14 alone (llama.cpp's grammar tests, and its grammar-"
        "constrained runs of --model), step 15 (chapter 17's converted checkpoints), step 12 "
        "(chapters 14 and 18's generated large models), step 11 (chapters 13 and 18's synthetic variants) "
        "step 16 (chapter 19's conversations with tools) or step 17 (the default model deep in "
        "its context), "
        "and update the manifest in place",
    )
    args = ap.parse_args()
    if args.only == "grammar":
        return only_grammar(args.sdist, args.model, args.out)
    if args.only == "checkpoints":
        if args.gemma3 is None or args.cache is None:
            ap.error("--only checkpoints needs --gemma3 and --cache")
        return only_checkpoints(args.sdist, args.model, args.gemma3, args.cache, args.out)
    if args.only == "large":
        if args.cache is None:
            ap.error("--only large needs --cache")
        return only_large(args.sdist, args.cache, args.out)
    if args.only == "tools":
        return only_tools(args.sdist, args.model, args.out)
    if args.only == "depth":
        return only_depth(args.sdist, args.model, args.out)
    if args.only == "variants":
        if args.cache is None:
            ap.error("--only variants needs --cache")
        return only_variants(args.sdist, args.cache, args.out)
    for name in ("cache", "gemma3"):
        if getattr(args, name) is None:
            ap.error(f"--{name} is required (unless --only)")

    E.init()
    layout = E.check_tensor_mirror(ggml_header(args.sdist))
    log(f"ggml_tensor mirror matches ggml.h and the library ({layout})")

    # Everything is written to a staging directory first, then replaces reference-data/ in
    # one step: a failed run leaves the old references intact, and no stale file survives.
    stage = args.cache / "reference" / "staging"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)

    f32_path = args.cache / (args.model.name.split(".")[0] + ".F32.gguf")
    write_f32_copy(args.model, f32_path)

    f32_settings = default_settings()
    # The quantized variants run with the same F32 KV cache: with 8-bit activations a tiny
    # perturbation anywhere (an f16 cache rounds every key and value) flips activation codes
    # downstream and moves logits by whole units, which would hide what the weights do.
    quant_settings = f32_settings

    log("step 4-5: prompts on the F32 copy")
    pr = prompts.export_prompts(f32_path, stage, f32_settings)
    log("step 6: model facts")
    fa = facts.export_facts(args.model, stage)
    log("step 7: tokenizer")
    copied = tokenizer.copy_vocab_files(args.sdist, stage)
    tk = tokenizer.export_corpus(args.model, stage)
    log("step 8: quantized variants and blocks")
    qu = quant.export_quant(args.model, f32_path, args.cache, stage, quant_settings)
    log("step 10: Gemma 3 270M")
    # Same settings as the default model's F32 runs, with room for the prompt longer than the
    # sliding window.
    g3_settings = E.ContextSettings(
        n_ctx=1024,
        n_batch=1024,
        n_threads=2,
        type_k=E.L.GGML_TYPE_F32,
        type_v=E.L.GGML_TYPE_F32,
        flash_attn=False,
    )
    g3 = gemma3.export_gemma3(args.gemma3, args.cache, stage, g3_settings)
    g3["settings"] = g3_settings.describe()
    log("step 11: synthetic llama-family variants")
    va = variants.export_variants(stage / "tokenizer", args.cache, stage, f32_settings)
    log("step 12: chapters 14 and 18's generated large models")
    la = large.export_large(args.out.resolve().parent, args.cache, stage, quant_settings)
    gr = grammar_steps(args.sdist, args.model, stage, quant_settings)
    log("step 15: chapter 17's converted checkpoints")
    ck = checkpoints.export_checkpoints(
        args.out.resolve().parent, args.model, args.gemma3, args.sdist, args.cache, stage,
        f32_settings,
    )
    log("step 16: chapter 19's conversations with tools, through llama-server")
    to = tools.export_tools(args.out.resolve().parent, args.model, args.sdist, stage)
    log("step 17: the default model deep in its context")
    de = depth.export_depth(args.out.resolve().parent, args.model, stage, quant_settings)

    files = file_entries(stage)

    versions = E.versions()
    manifest = {
        "format_version": FORMAT_VERSION,
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "generator": "scripts/export-reference",
        "llama_cpp_python": versions["llama_cpp_python"],
        "llama_cpp": {
            "commit": llama_cpp_commit(args.sdist),
            "commit_source": "the llama-cpp-python CHANGELOG entry of this release (the sdist "
            "carries no git metadata, so llama.cpp's build number is not known); ggml_commit is "
            "what libggml reports about itself",
            "sdist": args.sdist.name,
            "sdist_sha256": sha256_file(args.sdist),
            "ggml_version": versions["ggml_version"],
            "ggml_commit": versions["ggml_commit"],
            "system_info": versions["system_info"],
        },
        "python": {
            "version": sys.version.split()[0],
            "gguf": importlib.metadata.version("gguf"),
            "numpy": importlib.metadata.version("numpy"),
        },
        "model": {
            "file": args.model.name,
            "sha256": sha256_file(args.model),
            "size": args.model.stat().st_size,
        },
        "f32_model": {
            "file": f32_path.name,
            "sha256": sha256_file(f32_path),
            "size": f32_path.stat().st_size,
            "how": "every tensor of the model dequantized by gguf.quants.dequantize and written "
            "as F32 by GGUFWriter, metadata copied unchanged (general.file_type still says "
            "Q4_1); kept in the cache, not committed",
        },
        "settings": {
            "threads": 2,
            **{k: v for k, v in f32_settings.describe().items() if k != "n_threads"},
            "batch": "the whole prompt in one llama_decode call, logits for every position",
            "model_params": {
                "n_gpu_layers": 0,
                "use_extra_bufts": bool(E.L.llama_model_default_params().use_extra_bufts),
            },
            "seed": quant.BLOCK_SEED,
            "seed_use": "only the seeded inputs of quant/blocks*.safetensors; generation is greedy",
            "sampler": "greedy: llama_sampler_init_greedy (checked equal to argmax at every step); "
            "generation stops at 64 tokens or when the sampled token is end-of-generation",
            "top_k_stored": prompts.TOP_K,
            "full_logit_steps": prompts.N_FULL_STEPS,
            "quant_settings": quant_settings.describe(),
        },
        "prompts": pr["prompts"],
        "gemma3": {k: v for k, v in g3.items() if k != "prompts"},
        "variants": {
            "how": "synthetic models built from variants/<id>/model.json by gguf-py, kept in "
            "the cache, not committed; run with the default model's F32 settings",
            **va,
        },
        "large": {
            "how": "chapter 14's recipes written by its make-model example (cut to two layers, "
            "full width), kept in the cache, not committed; run with the quantized variants' "
            "settings",
            **la,
        },
        "grammar": gr,
        "checkpoints": ck,
        "tools": {"how": TOOLS_HOW, **to},
        "depth": {"how": DEPTH_HOW, **de},
        "files": files,
        "reduced_precision": pr["reduced_precision"],
        "graph_name_notes": {
            "naming": "llama.cpp names graph tensors '<name>-<layer>' (llm_graph_context::cb); "
            "tensors are stored under those names",
            "occurrences": pr["graph_name_notes"],
            "rule": "the eval callback sees every node of the graph; a name given to several "
            "nodes is told apart by the node's op (ggml_op_name): Qcur-L and Kcur-L keep the "
            "ROPE node (after RoPE), not the MUL_MAT projection or its RESHAPE; Vcur-L keeps the "
            "RESHAPE (same values as the projection, as (n_tokens, n_head_kv, head_dim))",
            "mapping": {
                "attn_norm-L": "RMS norm times attn_norm weight (the bare RMS_NORM node is norm-L)",
                "Qcur-L": "query after RoPE, (n_tokens, n_head, head_dim)",
                "Kcur-L": "key after RoPE, (n_tokens, n_head_kv, head_dim)",
                "Vcur-L": "value, (n_tokens, n_head_kv, head_dim)",
                "kq_soft_max-L": "softmax(scale * K Q + causal mask), (n_head, n_tokens, n_kv); "
                "the stored n_kv is cut to n_tokens (see truncation_notes)",
                "kqv_out-L": "attention output with heads concatenated, before attn_output.weight",
                "attn_out-L": "after the output projection attn_output.weight",
                "ffn_inp-L": "attn_out-L + the layer input (the residual)",
                "ffn_norm-L": "RMS norm times ffn_norm weight",
                "ffn_gate-L": "ffn_gate.weight projection",
                "ffn_up-L": "ffn_up.weight projection",
                "ffn_swiglu-L": "silu(ffn_gate) * ffn_up (one GLU node)",
                "ffn_out-L": "ffn_down.weight projection, before the residual: the model code "
                "names the residual sum 'ffn_out' too, but the same node is renamed l_out-L "
                "right after (no control vector), so ffn_out-L is the MUL_MAT",
                "l_out-L": "ffn_out-L + ffn_inp-L: the layer output",
                "result_norm": "final RMS norm times output_norm weight, every position",
                "result_output": "logits, every position (tied embeddings: token_embd.weight)",
            },
            "layers_in_full": list(prompts.FULL_LAYERS),
        },
        "truncation_notes": [
            (
                "kq_soft_max-L: llama.cpp computes attention over n_kv = "
                f"{pr['checks']['short']['kq_soft_max_n_kv_before_cut']} KV cells (the cache padded); only the first "
                "n_tokens cells hold the prompt (positions 0..n_tokens-1, checked), the rest are masked to "
                "exactly 0 (checked) and not stored"
            ),
            (
                "result_output is stored as F16 for every prompt position (the largest tensor: "
                "n_tokens x 49152); the last position is also available in full f32 as step 0 of "
                "<id>.decode.safetensors logits_full. See reduced_precision for the bound."
            ),
            "Intermediate tensors are stored for layers 0, 1, 15 and 29 only; l_out-L for every layer.",
            (
                "logits_full holds the first 8 decode steps (fewer if generation stopped earlier); "
                "topk_ids/topk_logits hold the top 32 of every step."
            ),
            (
                "Quantized variant files are not committed (they are in the cache); their sha256 is in "
                "quant/variants.json."
            ),
            "Prompts are short so that everything fits the repository budget.",
        ],
        "checks": pr["checks"],
        "notes": notes(pr),
        "model_facts": fa,
        "tokenizer": {"copied_from_llama_cpp": copied, "vocabs": tk},
        "quant": qu,
        "ggml_tensor_layout": layout,
    }
    write_json(stage / "manifest.json", manifest)

    # Replace the data files of reference-data/ (README.md is documentation, kept).
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    for p in sorted(out.iterdir()):
        if p.name == "README.md":
            continue
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    for p in sorted(stage.iterdir()):
        shutil.move(str(p), str(out / p.name))
    shutil.rmtree(stage, ignore_errors=True)
    log(f"wrote {len(files)} files to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
