"""``mtp-bindings --version``: the package's version (the parser's text), the llama.cpp commit,
then the CPU backend.

One job: the version text. The llama.cpp and CPU backend parts need the native library, so they are
computed only when ``--version`` is given (``--help`` and the parser load no native code): the
commit is the pin the cffi module was built with (``build_support/llama_source.py``, the one place
it is written); a wheel (portable build) names the CPU variant ggml picked for this CPU (or
``MTP_BINDINGS_CPU_VARIANT`` forced), a source install says it was compiled for its machine.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

UPSTREAM = "ggml-org/llama.cpp"


def llama_cpp_text() -> str:
    """``ggml-org/llama.cpp@<commit>``; ``unknown`` when the library does not load (the CPU part says
    why) or was built before the module carried the pin."""
    try:
        from ..low_level import llama_cpp_commit
    except ImportError:  # a source checkout without its build: cpu_backend_text says why
        return "unknown"
    commit = llama_cpp_commit()
    return f"{UPSTREAM}@{commit}" if commit != "unknown" else commit


def cpu_backend_text() -> str:
    """``CPU variant haswell (portable build)`` / ``native CPU build`` / why it is unknown."""
    try:
        from ..low_level import cpu_variant
    except ImportError as e:  # a source checkout without its build
        return f"CPU backend unknown: the native library does not load ({e})"
    try:
        variant = cpu_variant()
    except Exception as e:  # noqa: BLE001 (a forced variant this CPU cannot run, ...): say so, --version must print
        return f"CPU backend unknown: {e}"
    return f"CPU variant {variant} (portable build)" if variant else "native CPU build (compiled for its machine)"


class VersionAction(argparse.Action):
    """``--version``: print ``version`` (the package's), :func:`llama_cpp_text` and
    :func:`cpu_backend_text`, and exit. argparse's own action takes one fixed text when the parser is
    built; this one computes the native parts when the flag is given, so that no other command pays for
    loading the library."""

    def __init__(self, option_strings: Sequence[str], version: str, dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:  # noqa: A002 (argparse's name)
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)
        self.version = version

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        # on stdout, as argparse's own version action prints it
        sys.stdout.write(f"{self.version} (llama.cpp {llama_cpp_text()}), {cpu_backend_text()}\n")
        parser.exit()
