"""Where a model's layers go: the ggml devices a build offers, and a ``--device`` list as the
NULL-terminated device array ``llama_model_params.devices`` takes.

One job: llama.cpp's ``--device`` rule in Python. Names are the backends' (``CUDA0``, ``Metal``,
``Vulkan1``, ...), matched case-insensitively; ``none`` offloads to no device; the CPU is not a
device to offload to (it holds whatever is not offloaded). A CPU-only build has no such device, so
there only ``none`` (or no list: all devices, i.e. none) is valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _native
from ._native import ffi, lib
from .exceptions import InvalidParameterError

NO_DEVICE = "none"


def _offload_devices() -> list[tuple[str, Any]]:
    """``(name, ggml_backend_dev_t)`` of each device a model can be offloaded to (not the CPU)."""
    _native.ensure_initialised()
    out = []
    for i in range(int(lib.ggml_backend_dev_count())):
        dev = lib.ggml_backend_dev_get(i)
        if lib.ggml_backend_dev_type(dev) != lib.GGML_BACKEND_DEVICE_TYPE_CPU:
            out.append((ffi.string(lib.ggml_backend_dev_name(dev)).decode(), dev))
    return out


def available_devices() -> list[tuple[str, str]]:
    """``(name, description)`` of each device a model can be offloaded to (not the CPU)."""
    return [(name, ffi.string(lib.ggml_backend_dev_description(dev)).decode()) for name, dev in _offload_devices()]


def parse_device_list(devices: str | Sequence[str]) -> list[str]:
    """``"CUDA0,CUDA1"`` or a list of names -> the names (``[]`` for ``none``), unchecked."""
    names = [d.strip() for d in (devices.split(",") if isinstance(devices, str) else devices)]
    if any(not isinstance(d, str) or not d for d in names) or not names:
        raise InvalidParameterError(f"devices must be device names or 'none', got {devices!r}")
    if [d.lower() for d in names] == [NO_DEVICE]:
        return []
    if NO_DEVICE in (d.lower() for d in names):
        raise InvalidParameterError("devices: 'none' cannot be combined with device names")
    return names


def device_array(devices: str | Sequence[str]) -> Any:
    """The NULL-terminated ``ggml_backend_dev_t[]`` for ``devices`` (keep it alive while the
    params are used); an unknown name is an :class:`InvalidParameterError` listing the known ones."""
    names = parse_device_list(devices)
    found = _offload_devices()
    by_name = {name.lower(): dev for name, dev in found}
    arr = ffi.new("ggml_backend_dev_t[]", len(names) + 1)
    for i, name in enumerate(names):
        dev = by_name.get(name.lower())
        if dev is None:
            known = ", ".join(n for n, _ in found) or "none: this build has no GPU backend"
            raise InvalidParameterError(f"devices: unknown device {name!r} (available: {known})")
        arr[i] = dev
    arr[len(names)] = ffi.NULL
    return arr
