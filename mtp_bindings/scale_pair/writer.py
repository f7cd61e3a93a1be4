"""GGUF input and output for ``scale_pair``: read a trained model, write a scaled one tensor by tensor
(memory stays at one tensor), and quantize through the package's own libllama."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from .tensors import Lazy
from ..exceptions import ModelLoadError

logger = logging.getLogger(__name__)

#: llama_ftype of each quantized weight type (q4_K: the Q4_K_M mix real E2B users run).
FTYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_K": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}
VOCAB_PAD_KEY = "tokenizer.ggml.vocab_pad"  # pseudo key: pad the token lists to this size


@dataclass
class Source:
    """A trained model: its metadata (value, type, array sub-type) and tensors as numpy arrays."""

    path: Path
    arch: str
    fields: dict[str, tuple[Any, Any, Any]]
    tensors: dict[str, np.ndarray]

    def field(self, name: str) -> Any:
        if name not in self.fields:
            raise ModelLoadError(f"{self.path}: metadata {name} is missing")
        return self.fields[name][0]

    def key(self, suffix: str) -> Any:
        return self.field(f"{self.arch}.{suffix}")

    @property
    def n_vocab(self) -> int:
        return int(self.tensors["token_embd.weight"].shape[0])

    @property
    def swa(self) -> tuple[bool, ...]:
        return tuple(bool(x) for x in self.key("attention.sliding_window_pattern"))


def read_source(path: Path) -> Source:
    """Read a trained Gemma 4 target or assistant GGUF (f16/f32 tensors)."""
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError, struct errors, ...
        raise ModelLoadError(f"{path} is not a readable GGUF: {type(e).__name__}: {e}") from None
    fields: dict[str, tuple[Any, Any, Any]] = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        fields[name] = (f.contents(), f.types[0], sub)
    tensors = {}
    for t in reader.tensors:
        if t.tensor_type.name not in ("F16", "F32", "I32"):
            raise ModelLoadError(f"{path}: tensor {t.name} is {t.tensor_type.name}; scale an f16 or f32 model")
        tensors[t.name] = np.array(t.data)
    arch = str(fields.get("general.architecture", ("",))[0])
    if arch not in ("gemma4", "gemma4-assistant"):
        raise ModelLoadError(f"{path}: architecture {arch!r}, expected gemma4 or gemma4-assistant")
    return Source(path, arch, fields, tensors)


def _value_type(gguf: Any, value: Any) -> tuple[Any, Any]:
    """GGUF (type, array sub-type) of a new metadata value."""
    t = gguf.GGUFValueType
    if isinstance(value, bool):
        return t.BOOL, None
    if isinstance(value, int):
        return t.UINT32, None
    if isinstance(value, float):
        return t.FLOAT32, None
    if isinstance(value, str):
        return t.STRING, None
    return t.ARRAY, _value_type(gguf, value[0])[0]


def _padded_tokenizer(gguf: Any, key: str, value: Any, vocab: int) -> Any:
    if key not in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        return value
    n_pad = vocab - len(value)
    if key == "tokenizer.ggml.tokens":
        return list(value) + [f"<unused{i}>" for i in range(n_pad)]
    if key == "tokenizer.ggml.scores":
        return list(value) + [0.0] * n_pad
    return list(value) + [int(gguf.TokenType.UNUSED)] * n_pad


def write_gguf(path: Path, source: Source, overrides: dict[str, Any], tensors: dict[str, Lazy], *,
               progress: bool = True, desc: str = "") -> None:
    """Write ``source``'s metadata with ``overrides`` and ``tensors`` to ``path`` (via a temporary file)."""
    from tqdm import tqdm

    overrides = dict(overrides)
    vocab = overrides.pop(VOCAB_PAD_KEY, None)
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), source.arch)
    for key, (value, vtype, sub) in source.fields.items():
        if key == "general.architecture":
            continue
        if key in overrides:
            value = overrides.pop(key)
        elif vocab is not None:
            value = _padded_tokenizer(gguf, key, value, vocab)
        w.add_key_value(key, value, vtype, sub_type=sub)
    for key, value in overrides.items():
        vtype, sub = _value_type(gguf, value)
        w.add_key_value(key, value, vtype, sub_type=sub)
    total = 0
    for name, lz in tensors.items():
        nbytes = int(np.prod(lz.shape)) * np.dtype(lz.dtype).itemsize
        raw = gguf.GGMLQuantizationType.I32 if np.dtype(lz.dtype) == np.int32 else None
        w.add_tensor_info(name, lz.shape, np.dtype(lz.dtype), nbytes, raw_dtype=raw)
        total += nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"writing {desc}", disable=not progress) as bar:
        for lz in tensors.values():
            data = lz.make()
            if data.shape != lz.shape:
                raise AssertionError(f"tensor shape {data.shape} != declared {lz.shape}")
            w.write_tensor_data(data)
            bar.update(data.nbytes)
    w.close()
    tmp.rename(path)
    logger.info("scale-pair: wrote %s", path)


def quantize(src: Path, dst: Path, wtype: str, threads: int | None) -> None:
    """``llama_model_quantize`` ``src`` to ``dst`` (via a temporary file)."""
    from ..native._native import clear_errors, raise_native
    from ..low_level import ensure_initialised, ffi, lib
    from ..config.threads import default_threads

    ensure_initialised()
    params = lib.llama_model_quantize_default_params()
    params.nthread = threads or default_threads()
    params.ftype = getattr(lib, FTYPES[wtype])
    tmp = dst.with_suffix(".tmp")
    clear_errors()
    rc = lib.llama_model_quantize(str(src).encode(), str(tmp).encode(),
                                  ffi.new("llama_model_quantize_params *", params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise_native(ModelLoadError, f"llama_model_quantize({src} -> {dst}) failed with code {rc}")
    os.replace(tmp, dst)
    logger.info("scale-pair: wrote %s", dst)
