"""llama.cpp's log lines as the package forwards them (logger ``mtp_bindings.native``), captured for a test:
which buffers a load put on which device, what it offloaded."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class LogLines(logging.Handler):
    """Every message of the logger it is added to, in order."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def native_log() -> Iterator[list[str]]:
    """The native log's lines while the block runs (debug level included; ``verbose=True`` loads log more)."""
    lines = LogLines()
    native = logging.getLogger("mtp_bindings.native")
    native.addHandler(lines)
    level = native.level
    native.setLevel(logging.DEBUG)
    try:
        yield lines.lines
    finally:
        native.removeHandler(lines)
        native.setLevel(level)
