"""Reading a model file and llama.cpp's out-parameters: the GGUF check before a load, the load's
progress callback, and the buffers that grow until a getter's text fits (used by :mod:`..llama_model`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._native import ffi
from ..exceptions import AssistantFileNotFoundError, AssistantLoadError, ModelFileNotFoundError, ModelLoadError

ProgressCallback = Callable[[float], "bool | None"]

GGUF_MAGIC = b"GGUF"


@ffi.def_extern()
def _mtp_progress_callback(progress: float, user_data) -> bool:  # noqa: ANN001 (cffi types)
    callback = ffi.from_handle(user_data)
    try:
        keep_going = callback(float(progress))
    except Exception:  # an exception must not cross into C: it aborts the load instead
        return False
    return keep_going is not False


def check_gguf_file(path: str | os.PathLike[str], what: str = "model") -> Path:
    """Raise a typed error unless ``path`` is a readable file that starts like a GGUF: for an
    ``assistant`` :class:`AssistantFileNotFoundError` / :class:`AssistantLoadError`, else
    :class:`ModelFileNotFoundError` / :class:`ModelLoadError`; the message names ``what``."""
    not_found, bad = (AssistantFileNotFoundError, AssistantLoadError) if what == "assistant" else \
        (ModelFileNotFoundError, ModelLoadError)
    p = Path(path)
    if not p.exists():
        raise not_found(f"{what} file not found: {p}")
    if not p.is_file():
        raise not_found(f"{what} path is not a file: {p}")
    try:
        with p.open("rb") as f:
            head = f.read(8)
    except OSError as e:
        raise bad(f"cannot read {what} file {p}: {e}") from e
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise bad(f"{what} file {p} is not a GGUF file (starts with {head[:4]!r}, expected {GGUF_MAGIC!r})")
    return p


def read_grown(ctype: str, size: int, fill: Callable[[Any, int], int],
               more: Callable[[int, int], int | None]) -> tuple[Any, int]:
    """Call ``fill(buf, size)`` with a fresh ``ctype`` buffer of ``size`` until it fits: ``more(n,
    size)`` says from fill's result ``n`` how large a retry must be (None: it fit). Returns the
    buffer and ``n``. llama.cpp's getters say "too small" in two ways; see :func:`negative_needs`
    and :func:`snprintf_needs`."""
    while True:
        buf = ffi.new(ctype, size)
        n = fill(buf, size)
        need = more(n, size)
        if need is None:
            return buf, n
        size = need


def negative_needs(n: int, size: int) -> int | None:
    """llama.cpp's tokenizer convention: ``-needed`` when the buffer is too small."""
    return -n if n < 0 else None


def snprintf_needs(n: int, size: int) -> int | None:
    """snprintf's convention: the full length (without the NUL), truncated when ``>= size``."""
    return n + 1 if n >= size else None


def _c_string(fill: Callable[[Any, int], int]) -> str:
    """The text an snprintf-style getter ``fill(buf, size)`` writes (invalid UTF-8 replaced)."""
    buf, _ = read_grown("char[]", 256, fill, snprintf_needs)
    return ffi.string(buf).decode("utf-8", errors="replace")


def _tqdm_progress(desc: str) -> ProgressCallback:
    from tqdm.auto import tqdm

    bar = tqdm(total=100, desc=desc, unit="%", leave=False)

    def update(progress: float) -> bool:
        bar.n = int(progress * 100)
        bar.refresh()
        if progress >= 1.0:
            bar.close()
        return True

    return update
