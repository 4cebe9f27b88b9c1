"""Step 13: llama.cpp's grammar tests as data, for chapter 15.

llama.cpp tests its GBNF grammars, its grammar parser and its JSON Schema converter with C++
programs whose cases are string literals: `tests/test-grammar-integration.cpp`,
`tests/test-grammar-parser.cpp` and `tests/test-json-schema-to-grammar.cpp`. This step reads
those three files from the llama-cpp-python sdist (the llama.cpp it vendors, as the tokenizer
step does), lexes the C++ (comments, raw strings `R"delim(...)delim"`, ordinary strings with C
escapes, adjacent literals joined, `+` between strings) and writes every case as JSON under
`grammar/`, with llama.cpp's example grammars from `grammars/` copied beside them.

The reading is strict: every statement of the test functions that `main()` runs must be one
this module understands, and the number of calls found must equal the number of call sites in
the text. A new kind of test in a later llama.cpp fails the export instead of being dropped.
"""

from __future__ import annotations

import json
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from .common import log, write_atomic, write_json

_LLAMA = "vendor/llama.cpp/"
INTEGRATION = "tests/test-grammar-integration.cpp"
PARSER = "tests/test-grammar-parser.cpp"
SCHEMA = "tests/test-json-schema-to-grammar.cpp"
# llama.cpp's example grammars that chapter 15's tests parse.
GBNF = (
    "json.gbnf",
    "json_arr.gbnf",
    "arithmetic.gbnf",
    "list.gbnf",
    "c.gbnf",
    "chess.gbnf",
    "english.gbnf",
    "japanese.gbnf",
)


class CppError(RuntimeError):
    """The C++ source holds something this reader does not understand."""


class TokenLevel(Exception):
    """A test string built with `token(id)`: a token id, not text (token-level grammars)."""


# --- lexing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tok:
    kind: str  # "str" (value: bytes), "chr" (value: int), "id", "num", "punct"
    text: str
    line: int
    value: object = None


_SIMPLE_ESCAPES = {
    "n": 0x0A,
    "t": 0x09,
    "r": 0x0D,
    "a": 0x07,
    "b": 0x08,
    "f": 0x0C,
    "v": 0x0B,
    "\\": 0x5C,
    "'": 0x27,
    '"': 0x22,
    "?": 0x3F,
}
_TWO_CHAR_PUNCT = (
    "::", "->", "==", "!=", "<=", ">=", "&&", "||", "++", "--", "+=", "-=", "<<", ">>",
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"[0-9][0-9A-Za-z_.']*")
_LITERAL = re.compile(r"(u8|u|U|L)?(R)?([\"'])")
# The longest raw-string delimiter C++ allows.
_MAX_RAW_DELIMITER = 16


def _escape(src: str, i: int, line: int) -> tuple[bytes, int]:
    """Decode the escape sequence at src[i] (just after the backslash) of a narrow literal:
    its bytes (UTF-8 for \\u and \\U) and the index after it."""
    c = src[i]
    if c in _SIMPLE_ESCAPES:
        return bytes([_SIMPLE_ESCAPES[c]]), i + 1
    if c in "01234567":
        j = i
        while j < len(src) and j < i + 3 and src[j] in "01234567":
            j += 1
        v = int(src[i:j], 8)
        if v > 0xFF:
            raise CppError(f"line {line}: octal escape \\{src[i:j]} does not fit a char")
        return bytes([v]), j
    if c == "x":
        j = i + 1
        while j < len(src) and src[j] in "0123456789abcdefABCDEF":
            j += 1
        if j == i + 1 or int(src[i + 1 : j], 16) > 0xFF:
            raise CppError(f"line {line}: bad hex escape \\{src[i:j]}")
        return bytes([int(src[i + 1 : j], 16)]), j
    if c in "uU":
        n = 4 if c == "u" else 8
        digits = src[i + 1 : i + 1 + n]
        if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise CppError(f"line {line}: bad universal character name \\{c}{digits}")
        return chr(int(digits, 16)).encode("utf-8"), i + 1 + n
    raise CppError(f"line {line}: unknown escape sequence \\{c}")


def lex(src: str) -> list[Tok]:
    """C++ tokens of `src`, comments and preprocessor lines dropped. String literals carry their
    bytes (the source is UTF-8, as llama.cpp's is); adjacent literals stay separate tokens."""
    toks: list[Tok] = []
    i, line, n = 0, 1, len(src)
    at_line_start = True
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
            at_line_start = True
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if c == "#" and at_line_start:
            while i < n and src[i] != "\n":
                # A continued preprocessor line goes on after a backslash-newline.
                if src[i] == "\\" and i + 1 < n and src[i + 1] == "\n":
                    line += 1
                    i += 1
                i += 1
            continue
        at_line_start = False
        if src.startswith("//", i):
            while i < n and src[i] != "\n":
                i += 1
            continue
        if src.startswith("/*", i):
            end = src.find("*/", i + 2)
            if end < 0:
                raise CppError(f"line {line}: unterminated comment")
            line += src.count("\n", i, end)
            i = end + 2
            continue
        start_line = line
        # Literal prefixes: only narrow ones (bytes as written) are expected in these files.
        m = _LITERAL.match(src, i)
        if m:
            prefix, raw, quote = m[1], m[2], m[3]
            if prefix in ("u", "U", "L"):
                raise CppError(f"line {line}: wide or UTF-16/32 literal {prefix}...: not handled")
            i = m.end()
            if raw:
                if quote != '"':
                    raise CppError(f"line {line}: malformed raw string")
                open_paren = src.find("(", i)
                delim = src[i:open_paren] if open_paren >= 0 else ""
                if open_paren < 0 or len(delim) > _MAX_RAW_DELIMITER or any(
                    ch in delim for ch in " ()\\\t\n"
                ):
                    raise CppError(f"line {line}: malformed raw string delimiter")
                close = ")" + delim + '"'
                end = src.find(close, open_paren + 1)
                if end < 0:
                    raise CppError(f"line {line}: unterminated raw string R\"{delim}(")
                body = src[open_paren + 1 : end]
                line += body.count("\n")
                i = end + len(close)
                toks.append(Tok("str", "R" + delim, start_line, body.encode("utf-8")))
                continue
            out = bytearray()
            while True:
                if i >= n or src[i] == "\n":
                    raise CppError(f"line {start_line}: unterminated {quote} literal")
                ch = src[i]
                if ch == quote:
                    i += 1
                    break
                if ch == "\\":
                    b, i = _escape(src, i + 1, line)
                    out += b
                else:
                    out += ch.encode("utf-8")
                    i += 1
            if quote == '"':
                toks.append(Tok("str", '"', start_line, bytes(out)))
            else:
                # One ASCII character: a wider one would change with char's signedness.
                if len(out) != 1 or out[0] >= 0x80:
                    raise CppError(
                        f"line {start_line}: character literal {bytes(out)!r}: not ASCII"
                    )
                toks.append(Tok("chr", "'", start_line, out[0]))
            continue
        if m := _IDENT.match(src, i):
            toks.append(Tok("id", m[0], line))
            i = m.end()
            continue
        if m := _NUMBER.match(src, i):
            toks.append(Tok("num", m[0], line))
            i = m.end()
            continue
        two = src[i : i + 2]
        if two in _TWO_CHAR_PUNCT:
            toks.append(Tok("punct", two, line))
            i += 2
            continue
        toks.append(Tok("punct", c, line))
        i += 1
    return toks


# --- structure ----------------------------------------------------------------------------------

_OPEN = {"(": ")", "{": "}", "[": "]"}
_CLOSE = set(_OPEN.values())


def _match(toks: list[Tok], i: int) -> int:
    """Index of the bracket closing the one at toks[i]."""
    stack = []
    for j in range(i, len(toks)):
        t = toks[j]
        if t.kind != "punct":
            continue
        if t.text in _OPEN:
            stack.append(_OPEN[t.text])
        elif t.text in _CLOSE:
            if not stack or stack.pop() != t.text:
                raise CppError(f"line {t.line}: unbalanced {t.text!r}")
            if not stack:
                return j
    raise CppError(f"line {toks[i].line}: {toks[i].text!r} is never closed")


def _split(toks: list[Tok], sep: str) -> list[list[Tok]]:
    """Split at top-level `sep` tokens (outside every bracket); a trailing empty part is dropped."""
    parts: list[list[Tok]] = [[]]
    depth = 0
    for t in toks:
        if t.kind == "punct" and t.text in _OPEN:
            depth += 1
        elif t.kind == "punct" and t.text in _CLOSE:
            depth -= 1
        if depth == 0 and t.kind == "punct" and t.text == sep:
            parts.append([])
        else:
            parts[-1].append(t)
    if not parts[-1]:
        parts.pop()
    return parts


def functions(toks: list[Tok]) -> dict[str, list[Tok]]:
    """Top-level function definitions: name -> the tokens of the body, without its braces."""
    out: dict[str, list[Tok]] = {}
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "punct" and t.text == "{":
            j = _match(toks, i)
            # `name ( params ) {` is a function definition; anything else (a struct) is skipped.
            k = i - 1
            if k >= 0 and toks[k].kind == "punct" and toks[k].text == ")":
                depth, k2 = 0, k
                while k2 >= 0:
                    if toks[k2].text == ")":
                        depth += 1
                    elif toks[k2].text == "(":
                        depth -= 1
                        if depth == 0:
                            break
                    k2 -= 1
                if k2 > 0 and toks[k2 - 1].kind == "id":
                    out[toks[k2 - 1].text] = toks[i + 1 : j]
            i = j + 1
            continue
        i += 1
    return out


def _text(toks: list[Tok]) -> str:
    return " ".join(t.text if t.kind != "str" else repr(t.value) for t in toks)


def _where(toks: list[Tok]) -> str:
    return f"line {toks[0].line}" if toks else "an empty expression"


def string_expr(toks: list[Tok]) -> bytes:
    """The bytes of a string expression: literals, adjacent (joined by the compiler) or joined
    with `+`. Raises TokenLevel when a part is `token(...)`."""
    if not toks:
        raise CppError("an empty string expression")
    out = bytearray()
    i = 0
    expect_operand = True
    while i < len(toks):
        t = toks[i]
        if t.kind == "str":
            out += t.value
            expect_operand = False
            i += 1
        elif t.kind == "id" and t.text == "token" and i + 1 < len(toks) and toks[i + 1].text == "(":
            raise TokenLevel()
        elif t.kind == "punct" and t.text == "+" and not expect_operand:
            expect_operand = True
            i += 1
        else:
            raise CppError(f"{_where(toks)}: not a string expression: {_text(toks)}")
    if expect_operand:
        raise CppError(f"{_where(toks)}: a string expression ends with '+'")
    return bytes(out)


def string_list(toks: list[Tok]) -> list[bytes]:
    """A braced list of string expressions `{ "a", "b" "c", }`."""
    if not toks or toks[0].text != "{" or _match(toks, 0) != len(toks) - 1:
        raise CppError(f"{_where(toks)}: not a braced list: {_text(toks)}")
    return [string_expr(part) for part in _split(toks[1:-1], ",")]


def text_of(b: bytes) -> str | dict:
    """A string for the JSON: text when it is UTF-8, else {"hex": ...}."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": b.hex()}


def _utf8(b: bytes, what: str) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CppError(f"{what} is not UTF-8: {e}") from None


def _json_text(b: bytes, what: str) -> str:
    """A schema's text, as written; the C++ tests parse it as JSON before anything else, so
    text that is not JSON means it was read wrongly."""
    text = _utf8(b, what)
    try:
        json.loads(text)
    except ValueError as e:
        raise CppError(f"{what} is not JSON: {e}") from None
    return text


def _call(stmt: list[Tok]) -> tuple[str, list[list[Tok]]] | None:
    """`name(args...)` as (name, arguments), or None for any other statement."""
    if (
        len(stmt) >= 3
        and stmt[0].kind == "id"
        and stmt[1].text == "("
        and _match(stmt, 1) == len(stmt) - 1
    ):
        return stmt[0].text, _split(stmt[2:-1], ",")
    return None


def _statements(body: list[Tok]) -> list[list[Tok]]:
    return [s for s in _split(body, ";") if s]


def _is_log(stmt: list[Tok]) -> bool:
    c = _call(stmt)
    return c is not None and c[0] in ("fprintf", "fflush", "printf")


def _count_calls(toks: list[Tok], name: str) -> int:
    """Calls `name(` anywhere in the file (definitions, `void name(`, not counted): checks that
    the reading above found every case, wherever it stands."""
    return sum(
        1
        for i, t in enumerate(toks[:-1])
        if t.kind == "id"
        and t.text == name
        and toks[i + 1].text == "("
        and not (i > 0 and toks[i - 1].text in ("void", "bool"))
    )


# --- tests/test-grammar-integration.cpp ---------------------------------------------------------

RULES_EMPTY = [".", "rules", ".", "empty", "(", ")"]


def integration(src: str) -> dict:
    """Every case of test-grammar-integration.cpp."""
    toks = lex(src)
    fns = functions(toks)
    if "main" not in fns:
        raise CppError(f"{INTEGRATION}: no main()")
    grammars, schemas, failures, successes, skipped = [], [], [], [], []
    n_build_fails = 0  # test_build_grammar_fails calls read
    for stmt in _statements(fns["main"]):
        c = _call(stmt)
        if c is None or _is_log(stmt):
            if c is None and not (stmt[0].text == "return"):
                raise CppError(f"{INTEGRATION} main, {_where(stmt)}: {_text(stmt)}")
            continue
        fn_name = c[0]
        if fn_name not in fns:
            raise CppError(f"{INTEGRATION}: main calls {fn_name}, which is not defined there")
        strings: dict[str, bytes] = {}
        built: dict[str, tuple[str, str]] = {}  # grammar pointer -> (string variable, root)
        parsers: dict[str, str | None] = {}  # llama_grammar_parser -> the variable it parsed
        parsed_ok: set[str] = set()  # parsers asserted to have rules
        for s in _statements(fns[fn_name]):
            c2 = _call(s)
            words = [t.text for t in s]
            if _is_log(s) or (c2 and c2[0] == "llama_grammar_free_impl"):
                continue
            if c2 and c2[0] in ("test_grammar", "test_schema"):
                args = c2[1]
                if len(args) != 4:
                    raise CppError(
                        f"{INTEGRATION}, {_where(s)}: {c2[0]} with {len(args)} arguments"
                    )
                name = _utf8(string_expr(args[0]), f"{_where(s)}: the description")
                try:
                    text = string_expr(args[1])
                    passing = string_list(args[2])
                    failing = string_list(args[3])
                except TokenLevel:
                    skipped.append(name)
                    continue
                entry = {"name": name, "line": s[0].line}
                if c2[0] == "test_grammar":
                    entry |= {"grammar": text_of(text), "root": "root"}
                    grammars.append(entry)
                else:
                    entry["schema"] = _json_text(text, f"the schema of {name!r}")
                    schemas.append(entry)
                entry["pass"] = [text_of(b) for b in passing]
                entry["fail"] = [text_of(b) for b in failing]
                continue
            # const std::string VAR = <string expression>;
            if words[:4] == ["const", "std", "::", "string"] and len(s) > 6 and words[5] == "=":
                strings[words[4]] = string_expr(s[6:])
                continue
            # llama_grammar * X = build_grammar_with_root(VAR, "root");
            if words[:2] == ["llama_grammar", "*"] and len(s) > 4 and words[3] == "=":
                inner = _call(s[4:])
                if inner and inner[0] == "build_grammar_with_root" and len(inner[1]) == 2:
                    var = _var(inner[1][0], strings)
                    built[words[2]] = (var, _utf8(string_expr(inner[1][1]), "a root name"))
                    continue
            # llama_grammar_parser X;
            if len(s) == 2 and words[0] == "llama_grammar_parser":
                parsers[words[1]] = None
                continue
            # X.parse(VAR.c_str());
            if len(s) > 3 and words[0] in parsers and words[1:3] == [".", "parse"]:
                inner = _call(s[2:])
                arg = inner[1][0] if inner and len(inner[1]) == 1 else []
                if [t.text for t in arg[1:]] == [".", "c_str", "(", ")"]:
                    parsers[words[0]] = _var(arg[:1], strings)
                    continue
            if c2 and c2[0] == "assert" and len(c2[1]) == 1:
                e = c2[1][0]
                ew = [t.text for t in e]
                inner = _call(e)
                # assert(test_build_grammar_fails(VAR)): a build with root "root" fails.
                if inner and inner[0] == "test_build_grammar_fails" and len(inner[1]) == 1:
                    var = _var(inner[1][0], strings)
                    failures.append(
                        _build_case(fn_name, var, strings[var], "root", "build fails", s)
                    )
                    n_build_fails += 1
                    continue
                # assert(X == nullptr) / assert(X != nullptr) after build_grammar_with_root.
                if len(e) == 3 and ew[0] in built and ew[1] in ("==", "!=") and ew[2] == "nullptr":
                    var, root = built[ew[0]]
                    fails = ew[1] == "=="
                    case = _build_case(
                        fn_name,
                        var,
                        strings[var],
                        root,
                        "build " + ("fails" if fails else "succeeds"),
                        s,
                    )
                    case["name"] += f" (root {root})"
                    (failures if fails else successes).append(case)
                    continue
                # assert(!X.rules.empty()): the parse succeeded (kept with the root check).
                if len(ew) == 8 and ew[0] == "!" and parsers.get(ew[1]) and ew[2:] == RULES_EMPTY:
                    parsed_ok.add(ew[1])
                    continue
                # assert(X.rules.empty()): the parse failed, so a build fails too.
                if len(ew) == 7 and parsers.get(ew[0]) and ew[1:] == RULES_EMPTY:
                    var = parsers[ew[0]]
                    failures.append(
                        _build_case(
                            fn_name, var, strings[var], "root", "parse fails (no rules)", s
                        )
                    )
                    continue
                # assert(X.symbol_ids.find("root") == X.symbol_ids.end()): parsed, but no
                # root rule, so a build with root "root" fails.
                if (
                    len(e) == 16
                    and ew[0] in parsed_ok
                    and ew[1:6] == [".", "symbol_ids", ".", "find", "("]
                    and e[6].kind == "str"
                    and ew[7:] == [")", "==", ew[0], ".", "symbol_ids", ".", "end", "(", ")"]
                ):
                    var = parsers[ew[0]]
                    root = _utf8(e[6].value, "a root name")
                    what = f"parses, with no rule named {root}"
                    failures.append(_build_case(fn_name, var, strings[var], root, what, s))
                    continue
            raise CppError(f"{INTEGRATION} {fn_name}, {_where(s)}: not understood: {_text(s)}")
    n_cases = len(grammars) + len(schemas) + len(skipped)
    sites = _count_calls(toks, "test_grammar") + _count_calls(toks, "test_schema")
    if n_cases != sites:
        raise CppError(
            f"{INTEGRATION}: {n_cases} test_grammar/test_schema cases read, {sites} calls in "
            "the file"
        )
    sites = _count_calls(toks, "test_build_grammar_fails")
    if n_build_fails != sites:
        raise CppError(
            f"{INTEGRATION}: {n_build_fails} test_build_grammar_fails calls read, {sites} in "
            "the file"
        )
    return {
        "grammars": grammars,
        "schemas": schemas,
        "build_failures": failures,
        "build_successes": successes,
        "skipped": skipped,
    }


def _var(arg: list[Tok], strings: dict[str, bytes]) -> str:
    """The name of a string variable declared earlier in the same function."""
    if len(arg) != 1 or arg[0].text not in strings:
        raise CppError(f"{_where(arg)}: expected a string variable of this function: {_text(arg)}")
    return arg[0].text


def _build_case(fn: str, var: str, text: bytes, root: str, asserted: str, stmt: list[Tok]) -> dict:
    """A build case: named by its function and variable; `line` is the assertion's."""
    return {
        "name": f"{fn}: {var}",
        "line": stmt[0].line,
        "grammar": text_of(text),
        "root": root,
        "asserted": asserted,
    }


# --- tests/test-grammar-parser.cpp --------------------------------------------------------------


def parser(src: str) -> dict:
    """Grammars test-grammar-parser.cpp parses (with the symbols and rule elements it expects)
    and those it must reject."""
    toks = lex(src)
    fns = functions(toks)
    if "main" not in fns:
        raise CppError(f"{PARSER}: no main()")
    parses, fails = [], []
    for s in _statements(fns["main"]):
        c = _call(s)
        if c is None:
            if [t.text for t in s[:1]] == ["return"]:
                continue
            raise CppError(f"{PARSER} main, {_where(s)}: not understood: {_text(s)}")
        name, args = c
        if name == "verify_failure" and len(args) == 1:
            fails.append({"line": s[0].line, "grammar": text_of(string_expr(args[0]))})
        elif name == "verify_parsing" and len(args) == 3:
            parses.append(
                {
                    "line": s[0].line,
                    "grammar": text_of(string_expr(args[0])),
                    "symbols": [_symbol(p) for p in _braced(args[1])],
                    "rules": [_element(p) for p in _braced(args[2])],
                }
            )
        else:
            raise CppError(f"{PARSER} main, {_where(s)}: not understood: {_text(s)}")
    for name, n in (("verify_parsing", len(parses)), ("verify_failure", len(fails))):
        sites = _count_calls(toks, name)
        if n != sites:
            raise CppError(f"{PARSER}: {n} {name} calls read, {sites} in the file")
    return {"parses": parses, "fails": fails}


def _braced(toks: list[Tok]) -> list[list[Tok]]:
    """The items of a braced initializer list `{a, b, }`, each as its tokens."""
    if not toks or toks[0].text != "{" or _match(toks, 0) != len(toks) - 1:
        raise CppError(f"{_where(toks)}: not a braced list")
    return _split(toks[1:-1], ",")


def _symbol(toks: list[Tok]) -> list:
    """{"name", id} -> [name, id]."""
    items = _braced(toks)
    if len(items) != 2 or len(items[1]) != 1 or items[1][0].kind != "num":
        raise CppError(f"{_where(toks)}: not a symbol pair: {_text(toks)}")
    return [_utf8(string_expr(items[0]), "a symbol name"), int(items[1][0].text, 0)]


def _element(toks: list[Tok]) -> list:
    """{LLAMA_GRETYPE_X, value} -> ["X", value]; a character value as its code."""
    items = _braced(toks)
    if (
        len(items) != 2
        or len(items[0]) != 1
        or not items[0][0].text.startswith("LLAMA_GRETYPE_")
        or len(items[1]) != 1
        or items[1][0].kind not in ("num", "chr")
    ):
        raise CppError(f"{_where(toks)}: not a grammar element: {_text(toks)}")
    v = items[1][0]
    value = v.value if v.kind == "chr" else int(v.text, 0)
    return [items[0][0].text.removeprefix("LLAMA_GRETYPE_"), value]


# --- tests/test-json-schema-to-grammar.cpp ------------------------------------------------------


def schema_cases(src: str) -> dict:
    """The cases test_all() runs through the converter (`test({STATUS, name, schema, grammar})`),
    and the checks of main() that are not such cases."""
    toks = lex(src)
    fns = functions(toks)
    for f in ("test_all", "main"):
        if f not in fns:
            raise CppError(f"{SCHEMA}: no {f}()")
    cases = []
    for s in _statements(fns["test_all"]):
        c = _call(s)
        if c is None or c[0] != "test":
            continue  # the lambda and the title's fprintf
        if len(c[1]) != 1:
            raise CppError(f"{SCHEMA}, {_where(s)}: test() with {len(c[1])} arguments")
        fields = _braced(c[1][0])
        status = fields[0][0].text if fields and len(fields[0]) == 1 else None
        if len(fields) != 4 or status not in ("SUCCESS", "FAILURE"):
            raise CppError(f"{SCHEMA}, {_where(s)}: not a TestCase: {_text(s)}")
        name = _utf8(string_expr(fields[1]), "a test name")
        cases.append(
            {
                "name": name,
                "line": s[0].line,
                "outcome": status.lower(),
                "schema": _json_text(string_expr(fields[2]), f"the schema of {name!r}"),
                "grammar": trim(_utf8(string_expr(fields[3]), f"the grammar of {name!r}")),
            }
        )
    sites = sum(
        1
        for i, t in enumerate(toks[:-2])
        if t.text == "test" and toks[i + 1].text == "(" and toks[i + 2].text == "{"
    )
    if len(cases) != sites:
        raise CppError(f"{SCHEMA}: {len(cases)} cases read, {sites} test({{ in the file")
    body = fns["main"]
    runners = [
        _utf8(body[i + 2].value, "a runner title")
        for i, t in enumerate(body[:-2])
        if t.text == "test_all" and body[i + 1].text == "(" and body[i + 2].kind == "str"
    ]
    # main()'s other checks are blocks, each announced by an fprintf of its name.
    other = [
        _utf8(t.value, "a check name").strip().lstrip("- ").strip()
        for b in _blocks(fns["main"])
        for t in b[:8]
        if t.kind == "str" and t.value.startswith(b"- ")
    ]
    return {"cases": cases, "runners": runners, "other_checks": other}


def _blocks(body: list[Tok]) -> list[list[Tok]]:
    """The bare `{ ... }` blocks at the top of a function body."""
    out, i = [], 0
    while i < len(body):
        t = body[i]
        if t.kind == "punct" and t.text in _OPEN:
            j = _match(body, i)
            if t.text == "{" and (i == 0 or body[i - 1].text in (";", "}")):
                out.append(body[i + 1 : j])
            i = j + 1
        else:
            i += 1
    return out


def trim(s: str) -> str:
    """test-json-schema-to-grammar.cpp's trim(): surrounding whitespace off, and the leading
    spaces and tabs of every line. Its expected and actual grammars are compared this way."""
    s = s.strip(" \n\r\t")
    return re.sub(r"(^|\n)[ \t]+", r"\1", s)


# --- the step -----------------------------------------------------------------------------------

DESCRIPTIONS = {
    "grammar/integration.json": "llama.cpp's tests/test-grammar-integration.cpp as data: "
    "grammars and JSON schemas with strings they must and must not match, grammars that must "
    "fail or succeed to build",
    "grammar/parser.json": "llama.cpp's tests/test-grammar-parser.cpp as data: grammars it "
    "parses (symbols and rule elements) and grammars it rejects",
    "grammar/json-schema-to-grammar.json": "llama.cpp's tests/test-json-schema-to-grammar.cpp "
    "as data: schemas and the grammar (or failure) json_schema_to_grammar gives",
}


def describe(rel: str) -> str | None:
    """The manifest's `holds` for a file of this step."""
    if rel in DESCRIPTIONS:
        return DESCRIPTIONS[rel]
    if m := re.fullmatch(r"grammar/gbnf/([\w-]+\.gbnf)", rel):
        return f"llama.cpp's example grammar grammars/{m[1]}"
    return None


def export_grammar(sdist: Path, out_dir: Path, commit: str | None) -> dict:
    """Write grammar/ into `out_dir`; return the manifest's `grammar` section."""
    with tarfile.open(sdist) as tf:
        root = tf.getnames()[0].split("/")[0]

        def member(rel: str) -> bytes:
            try:
                f = tf.extractfile(f"{root}/{_LLAMA}{rel}")
            except KeyError:
                f = None
            if f is None:
                raise RuntimeError(f"{sdist}: no {_LLAMA}{rel}")
            return f.read()

        sources = {rel: member(rel).decode("utf-8") for rel in (INTEGRATION, PARSER, SCHEMA)}
        for name in GBNF:
            write_atomic(out_dir / "grammar" / "gbnf" / name, member(f"grammars/{name}"))

    head = {"llama_cpp_commit": commit}
    it = integration(sources[INTEGRATION])
    write_json(
        out_dir / "grammar" / "integration.json",
        {
            "source": INTEGRATION,
            **head,
            "how": "test_grammar(name, grammar, pass, fail) builds the grammar with root "
            "'root' and matches each string; test_schema converts the schema with "
            "json_schema_to_grammar(schema, force_gbnf = true) first. A string matches when "
            "every code point is accepted and the grammar can end there (an empty stack); "
            "strings that are not UTF-8 are stored as {\"hex\": ...}. build_failures and "
            "build_successes: llama_grammar_init_impl with the given root returns null or "
            "not (asserted says what the C++ test asserts). skipped: cases whose strings "
            "hold token ids (token(id), token-level grammars)",
            **it,
        },
    )
    pa = parser(sources[PARSER])
    write_json(
        out_dir / "grammar" / "parser.json",
        {
            "source": PARSER,
            **head,
            "how": "parses: llama_grammar_parser::parse succeeds, with these symbols ([name, "
            "id], sorted by name as symbol_ids is) and these rule elements ([type without "
            "LLAMA_GRETYPE_, value], rules in id order, each ending with END; characters as "
            "code points). fails: parse leaves no rules",
            **pa,
        },
    )
    sc = schema_cases(sources[SCHEMA])
    write_json(
        out_dir / "grammar" / "json-schema-to-grammar.json",
        {
            "source": SCHEMA,
            **head,
            "how": "each case: json_schema_to_grammar(parse(schema), force_gbnf = true) "
            "either throws std::invalid_argument (outcome failure) or gives grammar. grammar "
            "is stored through the test's trim() (surrounding whitespace and the indentation "
            "of every line removed), and the test compares trim(actual) with it. Every success "
            "case's grammar also parses, with a root rule (the second runner)",
            "runners": sc["runners"],
            "not_extracted": [
                {
                    "name": n,
                    "why": "a check main() makes with its own code (a block of its own, not a "
                    "TestCase of the runners): see the source",
                }
                for n in sc["other_checks"]
            ],
            "cases": sc["cases"],
        },
    )
    counts = {
        "integration": {
            k: len(it[k])
            for k in ("grammars", "schemas", "build_failures", "build_successes", "skipped")
        },
        "parser": {"parses": len(pa["parses"]), "fails": len(pa["fails"])},
        "json_schema_to_grammar": {
            "success": sum(c["outcome"] == "success" for c in sc["cases"]),
            "failure": sum(c["outcome"] == "failure" for c in sc["cases"]),
        },
    }
    log(f"grammar: {counts}")
    return {
        "how": "read from the test sources of the vendored llama.cpp (string literals decoded "
        "as the compiler does); the example grammars copied from its grammars/",
        "sources": [INTEGRATION, PARSER, SCHEMA],
        "gbnf": [f"grammars/{n}" for n in GBNF],
        "counts": counts,
        "skipped_token_level": it["skipped"],
    }
