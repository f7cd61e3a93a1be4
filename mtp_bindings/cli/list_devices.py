"""``mtp-bindings --list-devices``: llama.cpp's flag, the devices a model's layers can go to, then exit.

One job: that listing. Like ``--version`` it loads the native library only when the flag is given.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

MIB = 1024 * 1024


def devices_text() -> str:
    """llama.cpp's listing: ``Available devices:`` and a line per device (none on a CPU-only build)."""
    from ..native.devices import list_devices

    lines = ["Available devices:"]
    for d in list_devices():
        memory = "remote" if d.total_bytes is None or d.free_bytes is None else \
            f"{d.total_bytes // MIB} MiB, {d.free_bytes // MIB} MiB free"
        lines.append(f"  {d.name}: {d.description} ({memory})")
    if len(lines) == 1:
        lines.append("  (none: this build offloads to no device; the CPU holds every layer)")
    return "\n".join(lines) + "\n"


class ListDevicesAction(argparse.Action):
    """``--list-devices``: print :func:`devices_text` on stdout and exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:  # noqa: A002 (argparse's name)
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        sys.stdout.write(devices_text())
        parser.exit()
