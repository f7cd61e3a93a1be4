"""``NativeHandle``: the shared lifetime of objects that own one native pointer (models, contexts)."""

from __future__ import annotations

import threading
from typing import Any

from ._native import ffi


class NativeHandle:
    """Owns one native pointer: :meth:`close` frees it exactly once (``with`` and garbage
    collection close it too); :attr:`ptr` raises ``closed_error`` once it is gone."""

    closed_error: type[Exception] = RuntimeError
    kind = "object"

    _ptr: Any = ffi.NULL
    _lock: threading.RLock | threading.Lock

    @property
    def ptr(self) -> Any:
        """The native pointer (expert use; see :mod:`mtp_bindings.low_level`)."""
        if self._ptr == ffi.NULL:
            raise self.closed_error(f"the {self.kind} is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr == ffi.NULL

    def _free(self) -> None:
        """Release the native resources (called once, under the lock)."""
        raise NotImplementedError

    def close(self) -> None:
        """Free the native object. Idempotent."""
        with self._lock:
            if self._ptr == ffi.NULL:
                return
            self._free()
            self._ptr = ffi.NULL

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
