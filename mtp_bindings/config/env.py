"""The environment variables the library honours, and the one place that reads them.

Only the entry points (the public ``generate`` / ``chat``, the command line, the server) call
these readers; the loop, drafters and tracer below them take explicit values.

* ``LLAMA_PIPELINE_DEPTH2=0`` turns depth-2 drafting overlap off.
* ``LLAMA_MTP_SKIP_STREAK_THRESHOLD=N`` sets the skip-streak threshold.
* ``LLAMA_MTP_ACC_TRACE=PATH`` (or ``1`` for stderr) writes the NDJSON acceptance trace.
* ``MTP_BINDINGS_GRAPH_GREEDY=0`` takes greedy picks on the host from the logits rows, not in the
  graph (the same tokens; to compare the two, or to rule the graph's argmax out).
* ``MTP_BINDINGS_CPU_VARIANT=NAME`` loads that CPU variant of a portable build (a wheel) instead of
  the best one for this CPU. Read once, when the native library is initialised (like the OpenMP
  variables of :mod:`.threads`): it is a property of the process, not of one call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..exceptions import InvalidParameterError

ENV_DEPTH2 = "LLAMA_PIPELINE_DEPTH2"
ENV_SKIP_STREAK = "LLAMA_MTP_SKIP_STREAK_THRESHOLD"
ENV_TRACE = "LLAMA_MTP_ACC_TRACE"
ENV_CPU_VARIANT = "MTP_BINDINGS_CPU_VARIANT"
ENV_GRAPH_GREEDY = "MTP_BINDINGS_GRAPH_GREEDY"


def env_depth2(environ: Mapping[str, str] = os.environ) -> bool:
    """Depth-2 overlap unless ``LLAMA_PIPELINE_DEPTH2=0``."""
    return environ.get(ENV_DEPTH2, "1") != "0"


def env_skip_streak(default: int, environ: Mapping[str, str] = os.environ) -> int:
    """``LLAMA_MTP_SKIP_STREAK_THRESHOLD`` as an int, ``default`` when unset or empty."""
    v = environ.get(ENV_SKIP_STREAK)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise InvalidParameterError(f"{ENV_SKIP_STREAK}={v!r} is not an integer") from None


def env_graph_greedy(environ: Mapping[str, str] = os.environ) -> bool:
    """Greedy picks in the graph unless ``MTP_BINDINGS_GRAPH_GREEDY=0``."""
    return environ.get(ENV_GRAPH_GREEDY, "1") != "0"


def env_trace(environ: Mapping[str, str] = os.environ) -> str | None:
    """``LLAMA_MTP_ACC_TRACE``: a path, ``1`` (stderr) or None."""
    return environ.get(ENV_TRACE) or None


def env_cpu_variant(environ: Mapping[str, str] = os.environ) -> str | None:
    """``MTP_BINDINGS_CPU_VARIANT``: a CPU variant's name (``haswell``, ...), None when unset or empty."""
    return environ.get(ENV_CPU_VARIANT, "").strip().lower() or None
