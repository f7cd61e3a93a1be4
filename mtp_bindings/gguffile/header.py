"""How far a GGUF file's header says it extends, checked before gguf's reader sees the file.

gguf's :class:`~gguf.GGUFReader` memory-maps the file and slices it where the header points; on a
file that ends early a slice comes back short and fails later, in numpy's words ("When changing to
a larger dtype..."). :func:`check_extent` walks the header with :mod:`struct` (key/values, tensor
infos, the alignment, each tensor's size from ``gguf.GGML_QUANT_SIZES``) and raises
:class:`Truncated` with the byte the header needs and the file's size, so a truncated file is said
to be truncated.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import gguf

# GGUFValueType -> struct format of one scalar (strings and arrays are walked)
_SCALAR = {gguf.GGUFValueType.UINT8: "B", gguf.GGUFValueType.INT8: "b", gguf.GGUFValueType.UINT16: "H",
           gguf.GGUFValueType.INT16: "h", gguf.GGUFValueType.UINT32: "I", gguf.GGUFValueType.INT32: "i",
           gguf.GGUFValueType.FLOAT32: "f", gguf.GGUFValueType.BOOL: "?", gguf.GGUFValueType.UINT64: "Q",
           gguf.GGUFValueType.INT64: "q", gguf.GGUFValueType.FLOAT64: "d"}
_DEFAULT_ALIGNMENT = 32


class Truncated(Exception):
    """A GGUF whose header describes more bytes than the file has."""

    def __init__(self, end: int, size: int) -> None:
        super().__init__(f"it has {size:,} bytes, but its header describes data up to byte {end:,}")
        self.end, self.size = end, size


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, order: str) -> None:
        self.buf, self.pos, self.order = buf, 0, order

    def take(self, fmt: str, count: int = 1) -> tuple:
        size = struct.calcsize(self.order + fmt) * count
        if self.pos + size > len(self.buf):
            raise Truncated(self.pos + size, len(self.buf))
        out = struct.unpack_from(f"{self.order}{count}{fmt}", self.buf, self.pos)
        self.pos += size
        return out

    def skip_string(self) -> bytes:
        (n,) = self.take("Q")
        if self.pos + n > len(self.buf):
            raise Truncated(self.pos + n, len(self.buf))
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s

    def value(self, vtype: int) -> object:
        if vtype == gguf.GGUFValueType.STRING:
            return self.skip_string()
        if vtype == gguf.GGUFValueType.ARRAY:
            (sub,) = self.take("I")
            (count,) = self.take("Q")
            if sub in _SCALAR:  # one bounds check for the whole array
                size = struct.calcsize(_SCALAR[gguf.GGUFValueType(sub)]) * count
                if self.pos + size > len(self.buf):
                    raise Truncated(self.pos + size, len(self.buf))
                self.pos += size
            else:
                for _ in range(count):
                    self.value(sub)
            return None
        try:
            return self.take(_SCALAR[gguf.GGUFValueType(vtype)])[0]
        except (KeyError, ValueError):
            raise ValueError(f"unknown value type {vtype} at byte {self.pos - 4:,}") from None


def _walk(buf: mmap.mmap | bytes) -> int:
    if len(buf) < 8 or bytes(buf[:4]) != b"GGUF":
        raise ValueError("not a GGUF file")
    order = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"
    c = _Cursor(buf, order)
    c.pos = 8
    n_tensors, n_kv = c.take("Q", 2)
    alignment = _DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = c.skip_string()
        (vtype,) = c.take("I")
        value = c.value(vtype)
        if key == b"general.alignment" and isinstance(value, int) and value > 0:
            alignment = value
    extents = []
    for _ in range(n_tensors):
        c.skip_string()
        (n_dims,) = c.take("I")
        dims = c.take("Q", n_dims)
        (ttype,) = c.take("I")
        (offset,) = c.take("Q")
        try:
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
        except (KeyError, ValueError):
            raise ValueError(f"unknown tensor type {ttype}") from None
        n = 1
        for d in dims:
            n *= int(d)
        extents.append(offset + n // block * type_size)
    data_start = -(-c.pos // alignment) * alignment
    return data_start + max(extents, default=0)


def check_extent(path: str | Path) -> int:
    """The byte where ``path``'s header says its data ends; raises :class:`Truncated` when the file
    is shorter, ``ValueError`` when the header is not one gguf can read."""
    with open(path, "rb") as f:
        if Path(path).stat().st_size == 0:
            raise ValueError("empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            end = _walk(buf)
            if end > len(buf):
                raise Truncated(end, len(buf))
            return end
