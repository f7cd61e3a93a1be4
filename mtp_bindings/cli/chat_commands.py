"""``mtp-bindings chat``'s commands: a line such as ``/help`` is a command to the chat, never a
message to the model (issue 26, item 11).

One job: the table of commands (llama-cli's names, with this tool's older ``/quit`` and ``/reset``
beside them), its help text, and reading one input line as a command or a message. A line that
looks like an unknown command (``/word``) is refused rather than sent; ``//`` at the start of a
line sends it with one ``/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ESCAPE = "//"  # a message that starts with "/": type it with "//"
_COMMAND_WORD = re.compile(r"/[A-Za-z][\w-]*")


@dataclass(frozen=True)
class Command:
    names: tuple[str, ...]  # the first is the one the chat acts on
    arg: str                # what follows the name ("" for none)
    help: str


COMMANDS = (
    Command(("/exit", "/quit"), "", "end the chat (end of input does too)"),
    Command(("/clear", "/reset"), "", "clear the chat history (the --system message stays)"),
    Command(("/regen",), "", "drop the last reply and write it again"),
    Command(("/read",), "FILE", "add a text file to your next message"),
    Command(("/help",), "", "list these commands"),
)
_BY_NAME = {name: c for c in COMMANDS for name in c.names}


def help_text() -> str:
    """One line per command, for ``/help`` and ``chat --help``."""
    rows = [(" or ".join(c.names) + (f" {c.arg}" if c.arg else ""), c.help) for c in COMMANDS]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"  {left:<{width}}  {what}" for left, what in rows) + \
        f"\n  {ESCAPE}TEXT{'':<{width - len(ESCAPE) - 4}}  send TEXT starting with one /"


def summary() -> str:
    """The commands in one sentence, for the command's description."""
    return "; ".join(f"{' or '.join(c.names)}{' ' + c.arg if c.arg else ''}: {c.help}" for c in COMMANDS)


class UnknownCommand(ValueError):
    """A line that looks like a command the chat does not have."""


def read_line(line: str) -> tuple[str, str] | str:
    """``(command, argument)`` for a command line (the command by its first name), else the
    message text (``//`` unescaped). Raises :class:`UnknownCommand` for ``/word`` the chat lacks."""
    text = line.rstrip("\n")
    if text.startswith(ESCAPE):
        return text[1:]
    word, _, rest = text.strip().partition(" ")
    if not _COMMAND_WORD.fullmatch(word):
        return text
    command = _BY_NAME.get(word)
    if command is None:
        raise UnknownCommand(f"unknown command {word}: /help lists them ({ESCAPE} at the start of a line sends "
                             "it as text)")
    return command.names[0], rest.strip()
