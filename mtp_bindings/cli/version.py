"""``mtp-bindings --version``: the versions (the parser's text), then the CPU backend.

One job: the version text. The CPU backend part needs the native library, so it is computed only
when ``--version`` is given (``--help`` and the parser load no native code): a wheel (portable
build) names the CPU variant ggml picked for this CPU (or ``MTP_BINDINGS_CPU_VARIANT`` forced), a
source install says it was compiled for its machine.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


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
    """``--version``: print ``version`` (the package's and llama.cpp's), then :func:`cpu_backend_text`,
    and exit. argparse's own action takes one fixed text when the parser is built; this one computes
    the CPU part when the flag is given, so that no other command pays for loading the library."""

    def __init__(self, option_strings: Sequence[str], version: str, dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:  # noqa: A002 (argparse's name)
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)
        self.version = version

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        # on stdout, as argparse's own version action prints it
        sys.stdout.write(f"{self.version}, {cpu_backend_text()}\n")
        parser.exit()
