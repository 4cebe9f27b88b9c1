"""What the book's scripts share: the workbench manifests, a GGUF file's metadata and tensor sizes, the exercise stub, how an
`{{#include path:anchor}}` is resolved (as mdBook resolves it), and a `cargo run` command's
program as `cargo test --workspace` built it.

Used by scripts/workbench (which cuts a workbench from the crates), scripts/book-listings (the
mdBook preprocessor that numbers, captions and stubs the book's listings),
scripts/check-book-render, and scripts/book-outputs and scripts/figures (whose --check runs
programs). Standard library only.
"""
import json
import pathlib
import re
import struct
import subprocess
import sys
import textwrap
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# How long a listing may be: one screen, so that a reader sees a piece whole, with prose around
# it, as the Rust book and Crafting Interpreters show code. Checked by scripts/check-book-render.
LISTING_MAX_LINES = 60
# The longest line of a stub: rustfmt.toml's max_width, what a listing line may be.
STUB_WIDTH = 100

INCLUDE = re.compile(r"\{\{#(include|rustdoc_include)\s+([^}\s]+)\s*\}\}")
# A number of the prose taken from a generated table: `{{#cell generated/FILE.md row=R col=C}}`
# is the cell of column C (its header) in the row whose first cell is R, or whose first cells
# are R's parts joined by " / ", in the file's N-th table if `table=N` is given
# (scripts/book-listings puts it in; quote a value with spaces: col="tok/s wall").
CELL = re.compile(r"\{\{#cell\s+([^}]+)\}\}")
MARKER = re.compile(r"ANCHOR(_END)?:\s*\w+")


def chapters(root=ROOT):
    """{'ch03': path of chapters/ch03-attention, …} for chapters with a workbench.toml."""
    out = {}
    for d in sorted((root / "chapters").iterdir()):
        m = re.match(r"(ch\d\d)-", d.name)
        if m and (d / "workbench.toml").is_file():
            out[m.group(1)] = d
    return out


def manifest(crate):
    """(the whole workbench.toml, its [[write]] entries), each entry checked."""
    with open(crate / "workbench.toml", "rb") as f:
        data = tomllib.load(f)
    items = data.get("write", [])
    for i, w in enumerate(items):
        for key in ("anchor", "file", "what", "tests", "hints"):
            if key not in w:
                sys.exit(f"{crate / 'workbench.toml'}: entry {i + 1} has no {key!r}")
        if not w["anchor"].startswith("yours_"):
            sys.exit(f"{crate / 'workbench.toml'}: anchor {w['anchor']!r} must start with yours_")
        if not (isinstance(w["hints"], list) and w["hints"]
                and all(isinstance(h, str) for h in w["hints"])):
            sys.exit(f"{crate / 'workbench.toml'}: entry {i + 1}: hints must be a list of strings "
                     "(what to compute, then how), the rungs before the reference")
        for m in w.get("mistakes", []):
            if not (isinstance(m, dict) and all(isinstance(m.get(k), str)
                                                for k in ("why", "find", "replace"))
                    and m["find"] and m["find"] != m["replace"]):
                sys.exit(f"{crate / 'workbench.toml'}: entry {i + 1}: each mistake is a table of "
                         "strings `why` (the mistake, as a reader makes it), `find` (text that "
                         "occurs once in the region) and `replace` (what it becomes), which differ")
    return data, items


def exercises(root=ROOT):
    """{absolute source path: {anchor: (chapter, number, entry)}} for every workbench region."""
    out = {}
    for chapter, crate in chapters(root).items():
        _, items = manifest(crate)
        for n, w in enumerate(items, 1):
            out.setdefault((crate / w["file"]).resolve(), {})[w["anchor"]] = (chapter, n, w)
    return out


def stub(indent, chapter, w):
    """The lines a workbench puts in place of a region's body: what to write, which tests
    check it, and `todo!()`. Comments are wrapped to STUB_WIDTH."""
    width = max(40, STUB_WIDTH - len(indent) - 3)
    lines = []
    for i, text in enumerate([
        f"Your turn: {w['what']}",
        f"Checked by: cargo test -p {chapter} -- {' '.join(w['tests'])}",
    ]):
        wrapped = textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False,
                                break_long_words=False)
        lines += [f"{indent}// {t}" for t in wrapped]
    lines.append(f'{indent}todo!("{w["anchor"][len("yours_"):]}");')
    return lines


def region(lines, anchor, path):
    """(begin, end) line indices of the `ANCHOR: anchor` and `ANCHOR_END: anchor` lines."""
    begin = [i for i, l in enumerate(lines) if re.search(rf"ANCHOR:\s*{anchor}\s*$", l)]
    end = [i for i, l in enumerate(lines) if re.search(rf"ANCHOR_END:\s*{anchor}\s*$", l)]
    if len(begin) != 1 or len(end) != 1 or end[0] <= begin[0]:
        sys.exit(f"{path}: anchor {anchor} must open once and close once after it")
    return begin[0], end[0]


def included_lines(base, target, stubs=None, found=None):
    """The lines `{{#include target}}` puts into a page whose directory is `base`, or None when
    it cannot be resolved: the lines between `ANCHOR: name` and `ANCHOR_END: name`, without
    the lines that hold anchor markers, not dedented (mdBook's rules); line ranges `a:b`
    (1-based, inclusive) and whole files too.

    With `stubs` (what `exercises()` returns), each workbench region inside is replaced by its
    exercise stub, as the book shows it; `found`, a list, then gets (source path, anchor) of
    each region replaced."""
    path_part, _, sel = target.partition(":")
    path = (base / path_part).resolve()
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8").splitlines()
    if re.fullmatch(r"[0-9:]*", sel):
        if sel:
            a, _, b = sel.partition(":")
            lines = lines[int(a) - 1 if a else 0 : int(b) if b else len(lines)]
        inside = True
    else:
        inside = False
    start = re.compile(r"ANCHOR:\s*" + re.escape(sel) + r"\b") if not inside else None
    end = re.compile(r"ANCHOR_END:\s*" + re.escape(sel) + r"\b") if not inside else None
    regions = (stubs or {}).get(path, {})
    out, skipping = [], None
    for line in lines:
        if not inside:
            inside = bool(start.search(line))
            continue
        if end is not None and end.search(line):
            return out
        if skipping:
            if re.search(rf"ANCHOR_END:\s*{skipping}\s*$", line):
                skipping = None
            continue
        m = re.search(r"ANCHOR:\s*(yours_\w+)\s*$", line)
        if m and m.group(1) in regions:
            chapter, _, w = regions[m.group(1)]
            out += stub(re.match(r"\s*", line).group(0), chapter, w)
            skipping = m.group(1)
            if found is not None:
                found.append((path, m.group(1)))
            continue
        if not MARKER.search(line):
            out.append(line)
    return out if inside else None


def _cells(text):
    """The cells of a markdown table row, without emphasis and code marks."""
    return [c.strip().strip("*`").strip() for c in text.strip().strip("|").split("|")]


def cell(base, spec):
    """The text of `{{#cell spec}}` on a page whose directory is `base` (see CELL), or an
    error message (a str starting with "error: ") naming what is missing. `row=` names the
    row by its first cell, or by its first cells joined with " / " where the first repeats
    (`row="Q4_0 (17.30 GB) / ours"`); `table=N` looks in the file's N-th table only (from 1)."""
    import shlex
    words = shlex.split(spec)
    if not words:
        return "error: {{#cell}} names no file"
    path, opts = base / words[0], dict(w.split("=", 1) for w in words[1:] if "=" in w)
    if not {"row", "col"} <= set(opts) <= {"row", "col", "table"} or len(words) != len(opts) + 1:
        return f"error: {{{{#cell {spec}}}}}: give a file, row=…, col=… and perhaps table=…"
    if not path.is_file():
        return f"error: {{{{#cell {spec}}}}}: no file {words[0]}"
    want_table = int(opts["table"]) if opts.get("table", "").isdigit() else None
    header, keys, table = None, opts["row"].split(" / "), 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.lstrip().startswith("|"):
            header = None
            continue
        row = _cells(line)
        if header is None:
            header, table = row, table + 1
        elif (want_table in (None, table) and row[:len(keys)] == keys
              and opts["col"] in header):
            k = header.index(opts["col"])
            if k < len(row):
                return row[k]
    return f"error: {{{{#cell {spec}}}}}: no row {opts['row']!r} with a column {opts['col']!r}"


def pages(root=ROOT):
    """The book's pages, in SUMMARY.md's order."""
    src = root / "book" / "src"
    summary = (src / "SUMMARY.md").read_text(encoding="utf-8")
    return [src / m.group(1) for m in re.finditer(r"\]\(([^)]+\.md)\)", summary)]


def listing_includes(page):
    """The `{{#include}}` targets of a page's listings: includes of the crates' code inside
    fenced blocks (the generated outputs are not listings)."""
    out, fence = [], None
    for line in page.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\s*(```+|~~~+)", line)
        if m:
            fence = None if fence and m.group(1).startswith(fence) else fence or m.group(1)
            continue
        if fence:
            out += [t.group(2) for t in INCLUDE.finditer(line)
                    if not t.group(2).startswith("generated/")]
    return out


def shown_exercises(root=ROOT):
    """(source path, anchor) of every workbench region a listing of the book shows as a stub:
    its hints and reference go under that listing (scripts/book-listings), not in the
    chapter's "Your turn" box."""
    stubs = exercises(root)
    shown = set()
    for page in pages(root):
        for target in listing_includes(page):
            found = []
            included_lines(page.parent, target, stubs, found)
            shown.update(found)
    return shown


def ladder(w, include, heading):
    """The folds of an exercise: its hints, each inside the one before, and last the reference
    body (`include`, a `{{#include}}` target). `heading` names the exercise in the first fold."""
    name = w["what"].split(": ", 1)[0]
    lines, opened = [], 0
    for k, text in enumerate(w["hints"]):
        summary = f"{heading} <code>{name}</code>: a hint" if k == 0 else "A closer hint"
        lines += ["<details>", f"<summary>{summary}</summary>", "", text, ""]
        opened += 1
    summary = "The reference" if w["hints"] else f"{heading} <code>{name}</code>: the reference"
    lines += ["<details>", f"<summary>{summary}</summary>", "", "```rust",
              f"{{{{#include {include}}}}}", "```", ""]
    opened += 1
    return lines + ["</details>"] * opened


_PROGRAMS = {}


def built_program(cmd):
    """`cargo run [--profile=P] [-q] [-p PKG] (--example E | --bin B) -- ARGS` as the program
    built in the test profile, and ARGS. Cargo resolves the dependencies' features for the
    packages a command selects, so `cargo run -p ch04` would compile tokio, serde and the rest
    once more, in another build than `cargo test --workspace` made; selecting what that
    command selected (the workspace and its tests) finds every program already built."""
    args = cmd[cmd.index("--") + 1:] if "--" in cmd else []
    own = cmd[:cmd.index("--")] if "--" in cmd else cmd
    package = own[own.index("-p") + 1] if "-p" in own else None
    kind, name = next((c, own[i + 1]) for i, c in enumerate(own) if c in ("--example", "--bin"))
    key = (package, kind, name)
    if key not in _PROGRAMS:
        # The test profile whatever the command says: it computes the same text as dev and
        # release, and `cargo test --workspace` has built every program with it.
        p = subprocess.run(["cargo", "build", "-q", "--profile", "test", "--workspace",
                            "--tests", kind, name, "--message-format=json"],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True)
        if p.returncode != 0:
            sys.exit(f"cargo could not build {kind} {name}")
        want = "example" if kind == "--example" else "bin"
        found = []
        for line in p.stdout.splitlines():
            m = json.loads(line)
            t = m.get("target", {})
            if (m.get("reason") == "compiler-artifact" and m.get("executable")
                    and t.get("name") == name and want in t.get("kind", [])
                    and not m.get("profile", {}).get("test")  # not the unit-test harness
                    and (package is None or _pkg_name(m["package_id"]) == package)):
                found.append(m["executable"])
        if len(found) != 1:
            sys.exit(f"cargo built {len(found)} programs for {kind} {name} (package {package})")
        _PROGRAMS[key] = found[0]
    return [_PROGRAMS[key], *args]


def _pkg_name(package_id):
    """The package name in a cargo package id: `path+file:///…/ch04-forward#ch04@0.1.0`."""
    return package_id.rsplit("#", 1)[-1].split("@", 1)[0]


def gguf_layout(path: str) -> tuple[dict, dict]:
    """The metadata and each tensor's size in bytes (offset to the next tensor's offset)."""
    f = open(path, "rb")
    def rd(fmt):
        return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]
    def string():
        return f.read(rd("Q")).decode("utf-8", "replace")
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    def value(t):
        if t in scalar:
            return rd(scalar[t])
        if t == 8:
            return string()
        if t == 9:
            et, n = rd("I"), rd("Q")
            if et in scalar:  # skipped: no value the bench needs is an array
                f.seek(n * struct.calcsize(scalar[et]), 1)
            else:
                for _ in range(n):
                    value(et)
            return None
        raise ValueError(f"{path}: unknown metadata type {t}")
    if f.read(4) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    rd("I")
    n_tensors, n_kv = rd("Q"), rd("Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(rd("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        for _ in range(rd("I")):
            rd("Q")  # the dimensions
        rd("I")  # the type
        infos.append((rd("Q"), name))
    align = meta.get("general.alignment", 32)
    data = (f.tell() + align - 1) // align * align
    end = pathlib.Path(path).stat().st_size - data
    infos.sort()
    sizes = {name: (infos[i + 1][0] if i + 1 < len(infos) else end) - off for i, (off, name) in enumerate(infos)}
    return meta, sizes
