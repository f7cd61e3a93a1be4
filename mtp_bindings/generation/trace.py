"""The NDJSON acceptance trace (design section 10): ``mtp_draft`` and ``mtp_accept`` events."""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Any


class Tracer:
    """Writes one JSON object per line to a sink, or nothing when it has none."""

    def __init__(self, sink: IO[str] | None) -> None:
        self.sink = sink
        self._owned = False

    @classmethod
    def open(cls, trace: str | os.PathLike[str] | IO[str] | None) -> Tracer:
        """A tracer writing to ``trace``: a file object, a path (appended to), ``"1"`` for stderr,
        or None for no trace."""
        if trace is None:
            return cls(None)
        if hasattr(trace, "write"):
            return cls(trace)  # type: ignore[arg-type]
        if str(trace) == "1":
            return cls(sys.stderr)
        t = cls(open(trace, "a", encoding="utf-8"))  # noqa: SIM115 (closed in close())
        t._owned = True
        return t

    @property
    def enabled(self) -> bool:
        return self.sink is not None

    def event(self, **fields: Any) -> None:
        if self.sink is not None:
            self.sink.write(json.dumps(fields, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self.sink is not None:
            self.sink.flush()
            if self._owned:
                self.sink.close()
        self.sink = None
