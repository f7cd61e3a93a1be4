"""The ``mtp-bindings`` command line: demo, generate, chat, serve, rpc-server, bench, convert,
verify-assistant, info, relayout.

Flags follow llama.cpp's where they overlap (``-m``, ``--mtp-head``/``-md``/``--spec-draft-model``,
``--spec-type``, ``--spec-draft-n-max``, ``-c``, ``-t``, ``-ngl``, ``-ctk``/``-ctv``, ``-n``, ``-p``, ``-f``,
``--temp``, ...), and are read as llama.cpp reads them (see :mod:`.flags`); Ctrl-C behaves as
in llama-cli (see :mod:`.interrupt`). Every error is one line, ``mtp-bindings: error: ...``,
and exit status 2.

This package: :func:`main` (here) parses and dispatches; :mod:`.parser` builds the parser from
:mod:`.args` (shared flag groups), :mod:`.upstream` (llama.cpp's speculative flags with their
meaning) and :mod:`.flags` (llama.cpp's flag rules, the error convention); the commands are in
:mod:`.generate` (generate, chat; chat's /commands in :mod:`.chat_commands`), :mod:`.demo` and
:mod:`.tools` (serve, bench, info, convert, ...), :mod:`.rpc_server`, loading in :mod:`.session`, Ctrl-C in
:mod:`.interrupt`.

This module stays light (the standard library and two small modules): the commands, numpy and the native
library load inside :func:`main`, so a Ctrl-C while they load ends the command like one later on, with
exit status 130 and no traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from .._lazy import lazy_getattr
from .flags import PROG
from .interrupt import INTERRUPTED, Interrupt

__all__ = ["CLIError", "DESCRIPTION", "build_parser", "main"]

# what this package exports from its modules, loaded on first use
_LAZY = {"CLIError": ".flags", "DESCRIPTION": ".parser", "build_parser": ".parser"}


def main(argv: Sequence[str] | None = None) -> int:
    # Ctrl-C while the commands, numpy and the native library load is remembered, not raised: a KeyboardInterrupt
    # that lands in one of the import system's own callbacks is printed as "Exception ignored" and lost, and the
    # command ran on (a 2-core Zen 3, Ctrl-C 0.2 s after start-up)
    start_up = Interrupt()
    try:
        with start_up.deferred(second_raises=False):
            app = importlib.import_module(".app", __name__)
        if start_up.requested:
            raise KeyboardInterrupt
        return int(app.run(argv))
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return INTERRUPTED


__getattr__ = lazy_getattr(__name__, _LAZY)
