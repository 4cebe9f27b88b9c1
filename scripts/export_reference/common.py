"""Common functions: logging, hashing, deterministic JSON, and a small safetensors writer.

The safetensors format is simple enough to write by hand (an 8-byte little-endian header
length, a JSON header, then the raw little-endian tensor bytes), which keeps this pipeline free
of one more pinned dependency.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import time
from pathlib import Path

import numpy as np

_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[export-reference {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temporary file, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _dumps(value, indent: int) -> str:
    # One line for any container that fits in ~100 columns, else one item per line: small
    # records (a tensor's name, type and shape) stay readable and the files stay small.
    flat = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(", ", ": "))
    if not isinstance(value, (dict, list)) or len(flat) + indent <= 100:
        return flat
    pad = " " * (indent + 1)
    if isinstance(value, dict):
        items = [
            f"{pad}{json.dumps(str(k), ensure_ascii=True)}: {_dumps(v, indent + 1)}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if all(not isinstance(v, (dict, list)) for v in value):
        # A long list of scalars (token ids): as many per line as fit.
        lines, line = [], ""
        for v in value:
            item = json.dumps(v, ensure_ascii=True, allow_nan=False) + ","
            if line and len(pad) + len(line) + len(item) > 100:
                lines.append(pad + line.rstrip())
                line = ""
            line += item + " "
        lines.append(pad + line.rstrip()[:-1])
        return "[\n" + "\n".join(lines) + "\n" + " " * indent + "]"
    items = [pad + _dumps(v, indent + 1) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def json_bytes(value) -> bytes:
    # ensure_ascii keeps the files plain ASCII: every odd character of the tokenizer corpus is
    # an explicit escape, which survives editors and diff tools unchanged.
    return (_dumps(value, 0) + "\n").encode("ascii")


def write_json(path: Path, value) -> None:
    write_atomic(path, json_bytes(value))


_DTYPES = {
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("int32"): "I32",
    np.dtype("int64"): "I64",
    np.dtype("uint8"): "U8",
}


def safetensors_bytes(
    tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> bytes:
    """Serialize `tensors` (name -> array, row-major) in the safetensors format.

    Names are written sorted and the header is padded to 8 bytes, so the same tensors always
    give the same bytes (and the same sha256 in the manifest).
    """
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in sorted(metadata.items())}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        dtype = _DTYPES.get(arr.dtype)
        if dtype is None:
            raise TypeError(f"tensor {name}: dtype {arr.dtype} is not supported")
        raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def write_safetensors(
    path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> None:
    write_atomic(path, safetensors_bytes(tensors, metadata))


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Read back a file written by `write_safetensors` (used to verify what was written)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    inv = {v: k for k, v in _DTYPES.items()}
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(
            data[8 + n + b : 8 + n + e], dtype=inv[info["dtype"]].newbyteorder("<")
        ).reshape(info["shape"])
    return out
