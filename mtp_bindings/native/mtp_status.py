"""The C API's MTP status codes (``enum llama_mtp_status`` of the patched ``llama.h``) and what they
mean, as the library itself says it (``llama_mtp_status_str``, patch 0016): no second table here."""

from __future__ import annotations

from ._native import ffi, lib

MTP_ERR_NO_ASSISTANT = int(lib.LLAMA_MTP_ERR_NO_ASSISTANT)
MTP_ERR_BUSY = int(lib.LLAMA_MTP_ERR_BUSY)
MTP_ERR_WINDOW = int(lib.LLAMA_MTP_ERR_WINDOW)

# every code the header declares, by value (for tests and for callers that list them)
MTP_STATUS_CODES: tuple[int, ...] = tuple(sorted(int(getattr(lib, n)) for n in dir(lib) if n.startswith("LLAMA_MTP_ERR_")))


def status_text(rc: int) -> str:
    """What MTP status ``rc`` means, from the library (``error N`` for a code it does not know)."""
    text = ffi.string(lib.llama_mtp_status_str(rc)).decode("utf-8", errors="replace")
    return f"error {rc}" if text == "unknown MTP status" else text
