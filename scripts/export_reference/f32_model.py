"""Step 3: an F32 copy of the default model.

Every tensor is dequantized with gguf-py (`gguf.quants.dequantize`) and written back as F32
with `GGUFWriter`; metadata is copied unchanged (including `general.file_type`, which still
says Q4_1: llama.cpp reads each tensor's own type and uses the key only for display). The
references of chapters 3 to 5 are computed on this copy, so llama.cpp works with exactly the
weights an f32 implementation holds after dequantizing the Q4_1 file.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np

from .common import log


def write_f32_copy(src: Path, dst: Path) -> None:
    """Write the F32 copy of `src` to `dst` (skipped when `dst` exists: it is written atomically)."""
    if dst.is_file():
        log(f"F32 copy already present: {dst}")
        return
    log(f"writing the F32 copy of {src.name} to {dst}")
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    tmp = dst.with_name(dst.name + ".partial")
    writer = gguf.GGUFWriter(tmp, arch)
    for field in reader.fields.values():
        # GGUF.* are virtual fields of the reader; the architecture is written by GGUFWriter itself.
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
            continue
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), val_type, sub_type=sub_type)
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        # numpy shape is the reverse of ggml's ne: (ne1, ne0) for a matrix.
        expected = tuple(int(d) for d in reversed(t.shape.tolist()))
        if data.shape != expected:
            data = data.reshape(expected)
        writer.add_tensor(
            t.name, np.ascontiguousarray(data), raw_dtype=gguf.GGMLQuantizationType.F32
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, dst)
