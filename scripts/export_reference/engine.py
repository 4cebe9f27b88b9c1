"""llama.cpp through its C API (`llama_cpp.llama_cpp`, the low-level ctypes bindings).

Besides thin wrappers for loading, tokenizing and decoding, this module mirrors
`struct ggml_tensor` with ctypes, so that the scheduler's eval callback
(`llama_context_params.cb_eval`) can read the graph's intermediate tensors. The mirror is
checked three ways before it is trusted: against the declaration in the vendored `ggml.h`
(field by field), against `ggml_tensor_overhead()` (its size), and at run time against
`ggml_get_name` / `ggml_nelements` / `ggml_nbytes` on the first tensor the callback sees.
"""

from __future__ import annotations

import ctypes
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import llama_cpp.llama_cpp as L
import numpy as np

# --- ggml, for what llama.h does not expose ---------------------------------------------------

_LIB_DIR = Path(L.__file__).resolve().parent / "lib"


def _load_ggml_base() -> ctypes.CDLL:
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        p = _LIB_DIR / name
        if p.exists():
            return ctypes.CDLL(str(p))
    raise RuntimeError(f"libggml-base not found next to libllama in {_LIB_DIR}")


ggml = _load_ggml_base()
ggml.ggml_op_name.argtypes = [ctypes.c_int]
ggml.ggml_op_name.restype = ctypes.c_char_p
ggml.ggml_type_name.argtypes = [ctypes.c_int]
ggml.ggml_type_name.restype = ctypes.c_char_p
ggml.ggml_tensor_overhead.argtypes = []
ggml.ggml_tensor_overhead.restype = ctypes.c_size_t
ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
ggml.ggml_get_name.restype = ctypes.c_void_p
ggml.ggml_nelements.argtypes = [ctypes.c_void_p]
ggml.ggml_nelements.restype = ctypes.c_int64
ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
ggml.ggml_nbytes.restype = ctypes.c_size_t
ggml.ggml_backend_buffer_is_host.argtypes = [ctypes.c_void_p]
ggml.ggml_backend_buffer_is_host.restype = ctypes.c_bool
ggml.ggml_version.argtypes = []
ggml.ggml_version.restype = ctypes.c_char_p
ggml.ggml_commit.argtypes = []
ggml.ggml_commit.restype = ctypes.c_char_p

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64
# sizeof(struct ggml_object): size_t offs, size; struct ggml_object * next; enum type; char padding[4].
GGML_OBJECT_SIZE = 32


class GgmlTensor(ctypes.Structure):
    """`struct ggml_tensor` of ggml.h (this llama.cpp version), field for field."""

    _fields_ = [
        ("type", ctypes.c_int),  # enum ggml_type
        ("buffer", ctypes.c_void_p),  # struct ggml_backend_buffer *
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),  # number of elements per dimension, ne[0] innermost
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),  # stride in bytes per dimension
        ("op", ctypes.c_int),  # enum ggml_op
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


# The declaration this mirror was written from, normalised (comments and spacing removed).
_EXPECTED_DECLS = [
    "enum ggml_type type",
    "struct ggml_backend_buffer * buffer",
    "int64_t ne[GGML_MAX_DIMS]",
    "size_t nb[GGML_MAX_DIMS]",
    "enum ggml_op op",
    "int32_t op_params[GGML_MAX_OP_PARAMS / sizeof(int32_t)]",
    "int32_t flags",
    "struct ggml_tensor * src[GGML_MAX_SRC]",
    "struct ggml_tensor * view_src",
    "size_t view_offs",
    "void * data",
    "char name[GGML_MAX_NAME]",
    "void * extra",
    "char padding[8]",
]
_EXPECTED_DEFINES = {
    "GGML_MAX_DIMS": GGML_MAX_DIMS,
    "GGML_MAX_SRC": GGML_MAX_SRC,
    "GGML_MAX_OP_PARAMS": GGML_MAX_OP_PARAMS,
    "GGML_MAX_NAME": GGML_MAX_NAME,
}


def check_tensor_mirror(ggml_h: str) -> dict:
    """Compare `GgmlTensor` with the vendored ggml.h and with the library; raise on mismatch."""
    m = re.search(r"struct ggml_tensor \{(.*?)\n\s*\};", ggml_h, re.DOTALL)
    if not m:
        raise RuntimeError("ggml.h: no `struct ggml_tensor { ... };` found")
    body = re.sub(r"//[^\n]*", "", m.group(1))
    decls = [re.sub(r"\s+", " ", d).strip() for d in body.split(";")]
    decls = [
        re.sub(r"\s*\*\s*", " * ", d).replace("[ ", "[").replace(" ]", "]") for d in decls if d
    ]
    if decls != _EXPECTED_DECLS:
        raise RuntimeError(
            "struct ggml_tensor in ggml.h differs from the ctypes mirror in engine.py:\n"
            f"  header: {decls}\n  mirror: {_EXPECTED_DECLS}"
        )
    for name, value in _EXPECTED_DEFINES.items():
        d = re.search(rf"#\s*define\s+{name}\s+(\d+)", ggml_h)
        if not d or int(d.group(1)) != value:
            raise RuntimeError(
                f"ggml.h: {name} is {d.group(1) if d else 'missing'}, the mirror assumes {value}"
            )
    overhead = ggml.ggml_tensor_overhead()
    size = ctypes.sizeof(GgmlTensor)
    if overhead != GGML_OBJECT_SIZE + size:
        raise RuntimeError(
            f"ggml_tensor_overhead() = {overhead}, but the mirror gives {GGML_OBJECT_SIZE} + {size}"
        )
    return {"sizeof_ggml_tensor": size, "ggml_tensor_overhead": overhead}


def op_name(op: int) -> str:
    return ggml.ggml_op_name(op).decode()


def type_name(t: int) -> str:
    return ggml.ggml_type_name(t).decode()


# --- logging ---------------------------------------------------------------------------------

_log_lines: list[str] = []


@L.llama_log_callback
def _log_cb(level, text, user_data):
    s = text.decode("utf-8", "replace") if text else ""
    _log_lines.append(s)
    del _log_lines[:-400]
    # GGML_LOG_LEVEL_WARN = 3, ERROR = 4: show those, keep the rest for a failure report.
    if level in (3, 4):
        sys.stderr.write("llama.cpp: " + s)


def init() -> None:
    L.llama_log_set(_log_cb, ctypes.c_void_p(0))
    L.llama_backend_init()


def recent_log() -> str:
    return "".join(_log_lines[-60:])


def versions() -> dict:
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "ggml_version": ggml.ggml_version().decode(),
        "ggml_commit": ggml.ggml_commit().decode(),
        "system_info": L.llama_print_system_info().decode().strip(),
    }


# --- models, contexts, vocabularies ----------------------------------------------------------


class Model:
    def __init__(self, path: Path, vocab_only: bool = False):
        p = L.llama_model_default_params()
        p.n_gpu_layers = 0
        p.vocab_only = vocab_only
        self.params = {"use_extra_bufts": bool(p.use_extra_bufts), "vocab_only": vocab_only}
        self.ptr = L.llama_model_load_from_file(str(path).encode(), p)
        if not self.ptr:
            raise RuntimeError(f"llama.cpp could not load {path}:\n{recent_log()}")
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def close(self) -> None:
        if self.ptr:
            L.llama_model_free(self.ptr)
            self.ptr = None

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = L.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return None if n < 0 else buf.value.decode()

    # tokenizer

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        raw = text.encode("utf-8")
        n_max = len(raw) + 8
        for _ in range(2):
            buf = (L.llama_token * n_max)()
            n = L.llama_tokenize(self.vocab, raw, len(raw), buf, n_max, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            n_max = -n
        raise RuntimeError(f"llama_tokenize failed for {text!r}")

    def token_to_piece(self, token: int, special: bool) -> bytes:
        n_max = 64
        for _ in range(2):
            buf = ctypes.create_string_buffer(n_max)
            n = L.llama_token_to_piece(self.vocab, token, buf, n_max, 0, special)
            if n >= 0:
                return buf.raw[:n]
            n_max = -n
        raise RuntimeError(f"llama_token_to_piece failed for token {token}")

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        arr = (L.llama_token * max(1, len(ids)))(*ids)
        n_max = 16 + 8 * len(ids)
        for _ in range(2):
            buf = ctypes.create_string_buffer(n_max)
            n = L.llama_detokenize(
                self.vocab, arr, len(ids), buf, n_max, remove_special, unparse_special
            )
            if n >= 0:
                return buf.raw[:n]
            n_max = -n
        raise RuntimeError(f"llama_detokenize failed for {ids}")


@dataclass
class ContextSettings:
    n_ctx: int
    n_batch: int
    n_threads: int
    type_k: int  # GGML_TYPE_*
    type_v: int
    flash_attn: bool

    def describe(self, ctx_ptr=None) -> dict:
        d = {
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_batch,
            "n_threads": self.n_threads,
            "n_threads_batch": self.n_threads,
            "type_k": type_name(self.type_k),
            "type_v": type_name(self.type_v),
            "flash_attn": self.flash_attn,
        }
        if ctx_ptr is not None:
            d["n_ctx_actual"] = L.llama_n_ctx(ctx_ptr)
        return d


class Context:
    def __init__(self, model: Model, s: ContextSettings, callback=None):
        p = L.llama_context_default_params()
        p.n_ctx = s.n_ctx
        p.n_batch = s.n_batch
        p.n_ubatch = s.n_batch
        p.n_seq_max = 1
        p.n_threads = s.n_threads
        p.n_threads_batch = s.n_threads
        p.type_k = s.type_k
        p.type_v = s.type_v
        p.flash_attn_type = (
            L.LLAMA_FLASH_ATTN_TYPE_ENABLED if s.flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        p.no_perf = True
        # Keep the ctypes function object alive as long as the context: llama.cpp holds its address.
        self._cb = L.ggml_backend_sched_eval_callback(callback) if callback else None
        if self._cb:
            p.cb_eval = self._cb
            p.cb_eval_user_data = ctypes.c_void_p(0)
        self.model = model
        self.settings = s
        self.ptr = L.llama_init_from_model(model.ptr, p)
        if not self.ptr:
            raise RuntimeError(f"llama_init_from_model failed:\n{recent_log()}")
        self.n_past = 0

    def close(self) -> None:
        if self.ptr:
            L.llama_free(self.ptr)
            self.ptr = None

    def clear(self) -> None:
        L.llama_memory_clear(L.llama_get_memory(self.ptr), True)
        self.n_past = 0

    def decode(self, tokens: list[int], all_logits: bool) -> np.ndarray:
        """Decode `tokens` as one batch at the next positions; return logits (rows, n_vocab)."""
        n = len(tokens)
        batch = L.llama_batch_init(n, 0, 1)
        try:
            for i, tok in enumerate(tokens):
                batch.token[i] = tok
                batch.pos[i] = self.n_past + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if (all_logits or i == n - 1) else 0
            batch.n_tokens = n
            rc = L.llama_decode(self.ptr, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}:\n{recent_log()}")
        finally:
            L.llama_batch_free(batch)
        self.n_past += n
        rows = range(n) if all_logits else [n - 1]
        nv = self.model.n_vocab
        out = np.empty((len(rows), nv), dtype=np.float32)
        for r, i in enumerate(rows):
            ptr = L.llama_get_logits_ith(self.ptr, i)
            out[r] = np.ctypeslib.as_array(ptr, shape=(nv,))
        return out


def greedy_sampler():
    return L.llama_sampler_init_greedy()


def sample(smpl, ctx: Context, idx: int) -> int:
    return int(L.llama_sampler_sample(smpl, ctx.ptr, idx))


def free_sampler(smpl) -> None:
    L.llama_sampler_free(smpl)


# --- the eval callback -----------------------------------------------------------------------


@dataclass
class Captured:
    op: str
    type: str
    ne: tuple[int, int, int, int]
    data: np.ndarray  # numpy order: (ne3, ne2, ne1, ne0)


@dataclass
class Capture:
    """Collects graph tensors by name while `enabled`; every occurrence of a name is kept."""

    wanted: set[str]
    enabled: bool = False
    tensors: dict[str, list[Captured]] = field(default_factory=dict)
    seen_ops: dict[str, list[str]] = field(default_factory=dict)
    error: BaseException | None = None
    checked: bool = False

    def reset(self) -> None:
        self.tensors = {}
        self.seen_ops = {}

    def __call__(self, t_ptr, ask, user_data):
        # An exception must not escape into C: a False answer to the second call aborts the
        # computation, so errors are stored and raised after llama_decode returns.
        try:
            if not self.enabled:
                return False
            t = GgmlTensor.from_address(t_ptr)
            name = t.name.decode("utf-8", "replace")
            if ask:
                return name in self.wanted
            if not self.checked:
                self._check(t_ptr, t)
            self.seen_ops.setdefault(name, []).append(op_name(t.op))
            self.tensors.setdefault(name, []).append(self._read(t))
            return True
        except BaseException as e:  # noqa: BLE001
            if self.error is None:
                self.error = e
            return True

    def _check(self, t_ptr: int, t: GgmlTensor) -> None:
        name_addr = ggml.ggml_get_name(t_ptr)
        if name_addr != t_ptr + GgmlTensor.name.offset:
            raise RuntimeError("ggml_get_name disagrees with the mirror's name offset")
        ne = [int(x) for x in t.ne]
        if ggml.ggml_nelements(t_ptr) != int(np.prod(ne)):
            raise RuntimeError(f"ggml_nelements disagrees with the mirror's ne {ne}")
        self.checked = True

    @staticmethod
    def _read(t: GgmlTensor) -> Captured:
        if t.type != L.GGML_TYPE_F32:
            raise RuntimeError(f"{t.name.decode()}: type {type_name(t.type)}, expected f32")
        if not t.buffer or not ggml.ggml_backend_buffer_is_host(t.buffer):
            raise RuntimeError(f"{t.name.decode()}: data is not in host memory")
        ne = tuple(int(x) for x in t.ne)
        nb = tuple(int(x) for x in t.nb)
        span = sum((n - 1) * s for n, s in zip(ne, nb)) + 4
        buf = (ctypes.c_char * span).from_address(t.data)
        arr = np.ndarray(shape=ne[::-1], dtype=np.float32, buffer=buf, strides=nb[::-1]).copy()
        return Captured(op=op_name(t.op), type=type_name(t.type), ne=ne, data=arr)
