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
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from ..exceptions import ContextError, InvalidParameterError, MTPBindingsError
from .flags import PROG, USAGE_ERROR, CLIError, error_line, name_flags
from .interrupt import INTERRUPTED, Interrupt
from .parser import DESCRIPTION, build_parser

__all__ = ["CLIError", "DESCRIPTION", "build_parser", "main"]

# errors about a parameter's value: their messages name the library's parameter, rewritten as the flag
PARAMETER_ERRORS = (InvalidParameterError, ContextError)


class _LogFormatter(logging.Formatter):
    """Warnings and errors as ``mtp-bindings: warning: ...``, like the command's own messages;
    the ``-v`` log lines with their logger's name."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.WARNING:
            return f"{PROG}: {record.levelname.lower()}: {record.getMessage()}"
        return f"{record.name}: {record.getMessage()}"


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogFormatter())
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler], force=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    interrupt = Interrupt()
    args = None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        args.argv = argv
        _setup_logging(getattr(args, "verbose", False))
        return int(args.func(args, interrupt) or 0)
    except (MTPBindingsError, CLIError, OSError) as e:
        message = name_flags(str(e), args.parser, argv) if isinstance(e, PARAMETER_ERRORS) and args else str(e)
        print(error_line(message), file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return INTERRUPTED

