"""GGUF headers read directly: chosen metadata values, and a check that the file holds every tensor's data.

Parsing only what is asked keeps this fast (gguf.GGUFReader parses every value: seconds for a tokenizer's arrays);
a cut or corrupted file fails with one line naming it ("damaged or truncated GGUF: PATH (...)").
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# GGUF metadata value types (gguf spec): type code -> struct format, and the string and array codes.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING = 8


def read_gguf_metadata(path: Path, keys: set[str]) -> dict[str, Any]:
    """Scalar and string values for `keys` from a GGUF header; arrays are skipped."""
    with damaged_gguf(path), open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _gguf_header(data, keys)[0]


def check_gguf(path: Path) -> None:
    """ValueError "damaged or truncated GGUF: PATH" unless the header parses and the file holds every tensor's data
    (the tensor table gives each tensor's offset, shape and type; sizes from the gguf package's type table)."""
    stat = Path(path).stat()
    _check_gguf_cached(str(path), stat.st_size, stat.st_mtime_ns)


@contextlib.contextmanager
def damaged_gguf(path: Path | str) -> Iterator[None]:
    """What a cut or corrupted GGUF raises while parsing (reads past the end, undecodable names, an empty file that
    cannot be mapped) as one line naming the file."""
    try:
        yield
    except struct.error:
        raise ValueError(f"damaged or truncated GGUF: {path} (it ends inside its header)") from None
    except (UnicodeDecodeError, ValueError, OverflowError, MemoryError) as err:
        raise ValueError(f"damaged or truncated GGUF: {path} ({err})") from None


def _gguf_header(data: mmap.mmap, keys: set[str]) -> tuple[dict[str, Any], int]:
    """(values of `keys`, offset after the metadata) of a GGUF file's header."""
    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic)")
    found: dict[str, Any] = {}
    (num_entries,) = struct.unpack_from("<Q", data, 16)
    offset = 24
    for _ in range(num_entries):
        (key_length,) = struct.unpack_from("<Q", data, offset)
        key = data[offset + 8:offset + 8 + key_length].decode()
        (kind,) = struct.unpack_from("<I", data, offset + 8 + key_length)
        offset += 12 + key_length
        if key in keys and kind in _GGUF_SCALARS:
            (found[key],) = struct.unpack_from("<" + _GGUF_SCALARS[kind], data, offset)
        elif key in keys and kind == _GGUF_STRING:
            (length,) = struct.unpack_from("<Q", data, offset)
            found[key] = data[offset + 8:offset + 8 + length].decode()
        offset = _skip_gguf_value(data, kind, offset)
    return found, offset


@functools.lru_cache(maxsize=8)
def _check_gguf_cached(path: str, size: int, mtime_ns: int) -> None:
    with damaged_gguf(Path(path)), open(path, "rb") as file, \
            mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        values, offset = _gguf_header(data, {"general.alignment"})
        (num_tensors,) = struct.unpack_from("<Q", data, 8)
        tensors = []
        for _ in range(num_tensors):
            (name_length,) = struct.unpack_from("<Q", data, offset)
            offset += 8 + name_length
            (num_dims,) = struct.unpack_from("<I", data, offset)
            dims = struct.unpack_from(f"<{num_dims}Q", data, offset + 4)
            kind, tensor_offset = struct.unpack_from("<IQ", data, offset + 4 + 8 * num_dims)
            offset += 4 + 8 * num_dims + 12
            tensors.append((dims, kind, tensor_offset))
        alignment = int(values.get("general.alignment", 32))
        start = offset + (-offset % alignment)
        end = max((start + tensor_offset + _tensor_bytes(dims, kind) for dims, kind, tensor_offset in tensors),
                  default=start)
        if end > size:
            raise ValueError(f"the file has {size:,} bytes, its tensors need {end:,}")


def _tensor_bytes(dims: tuple[int, ...], kind: int) -> int:
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ImportError, KeyError, ValueError):
        return 0  # a type this gguf package does not know: its size goes unchecked
    count = 1
    for dim in dims:
        count *= dim
    return count // block_size * type_size


def _skip_gguf_value(data: mmap.mmap, kind: int, offset: int) -> int:
    if kind in _GGUF_SCALARS:
        return offset + struct.calcsize(_GGUF_SCALARS[kind])
    if kind == _GGUF_STRING:
        return offset + 8 + struct.unpack_from("<Q", data, offset)[0]
    item_kind, count = struct.unpack_from("<IQ", data, offset)
    offset += 12
    if item_kind in _GGUF_SCALARS:
        return offset + count * struct.calcsize(_GGUF_SCALARS[item_kind])
    for _ in range(count):
        offset = _skip_gguf_value(data, item_kind, offset)
    return offset
