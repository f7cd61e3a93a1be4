"""The command line's dispatcher: :func:`run` parses the arguments and runs the command (the
``mtp-bindings`` script reaches it through :func:`mtp_bindings.cli.main`, which loads this module and
turns a Ctrl-C, here or while loading, into exit status 130)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from ..exceptions import ContextError, InvalidParameterError, MTPBindingsError
from .flags import PROG, USAGE_ERROR, CLIError, error_line, name_flags
from .interrupt import Interrupt
from .parser import build_parser

__all__ = ["run"]

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


def run(argv: Sequence[str] | None = None) -> int:
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
