"""``mtp-bindings generate`` and ``mtp-bindings chat``: text on stdout as it comes, speed and
acceptance on stderr.

One job: run one prompt or an interactive chat on a loaded model, with the sampling and drafting
flags as :func:`~mtp_bindings.Model.generate`'s arguments, a long prompt's progress on stderr,
and Ctrl-C stopping the text being written (see :mod:`.interrupt`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import IO, Any

from ..exceptions import ContextOverflowError
from ..config.limits import UNTIL_FULL
from .args import dry_sequence_breakers
from .chat_commands import UnknownCommand, help_text, read_line
from .flags import PROG, CLIError, error_line, flag
from .interrupt import INTERRUPTED, Interrupt
from .session import chat_template, session

# a prompt at least this long shows its progress on stderr (a long prompt takes seconds to minutes)
PROMPT_PROGRESS_TOKENS = 1024
PROMPT_PROGRESS_EVERY_S = 2.0  # how often a non-terminal stderr gets a progress line


def gen_kwargs(args: argparse.Namespace, ctx: Any) -> dict[str, Any]:
    n = args.n_predict
    if n < UNTIL_FULL:
        raise CLIError(f"{flag(args, 'n_predict')} must be a number of tokens, or {UNTIL_FULL} for until the end "
                       f"of the text or a full context; got {n}")
    return dict(max_tokens=ctx.n_ctx if n == UNTIL_FULL else n, temperature=args.temp, top_k=args.top_k,
                top_p=args.top_p, min_p=args.min_p, repeat_penalty=args.repeat_penalty,
                repeat_last_n=args.repeat_last_n, presence_penalty=args.presence_penalty,
                frequency_penalty=args.frequency_penalty, typical_p=args.typical, top_n_sigma=args.top_n_sigma,
                xtc_probability=args.xtc_probability, xtc_threshold=args.xtc_threshold,
                dry_multiplier=args.dry_multiplier, dry_base=args.dry_base, dry_allowed_length=args.dry_allowed_length,
                dry_penalty_last_n=args.dry_penalty_last_n,
                dry_sequence_breakers=dry_sequence_breakers(args.dry_sequence_breaker),
                seed=None if args.seed == -1 else args.seed,
                stop=args.stop, draft_n_max=args.draft_n_max, preset=args.preset,
                depth2=False if args.no_depth2 else None, skip_streak=args.skip_streak, trace=args.trace,
                ignore_eos=args.ignore_eos, **constraint_kwargs(args))


def constraint_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``grammar=`` or ``json_schema=`` from ``--grammar``, ``--grammar-file``, ``-j`` or ``-jf`` (the
    library compiles and checks it; its errors name the flag)."""
    for dest, name, path in (("grammar", "grammar", False), ("grammar_file", "grammar", True),
                             ("json_schema", "json_schema", False), ("json_schema_file", "json_schema", True)):
        value = getattr(args, dest)
        if value is None:
            continue
        if path:
            try:
                value = value.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise CLIError(f"{flag(args, dest)}: cannot read {value}: {e}") from None
        return {name: value}
    return {}


def stats_line(label: str, stats: Any) -> str:
    acc = f"acceptance {stats.acceptance_rate:6.1%}, {stats.mean_accepted_length:.2f} tokens/round" \
        if stats.n_drafted else "no drafting"
    if stats.draft_policy is not None:  # auto: how many rounds drafted how many tokens
        acc += "   drafts/round " + " ".join(f"{k}:{n}" for k, n in enumerate(stats.rounds_per_k) if n)
    return f"{label:<10} {stats.tokens_per_second:9.1f} tokens/s   {stats.n_generated:4d} tokens   {acc}"


class PromptProgress:
    """Shows how far a long prompt has been processed, on stderr: in place on a terminal, else a
    line every ``PROMPT_PROGRESS_EVERY_S`` seconds (and at the start and the end)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if total < PROMPT_PROGRESS_TOKENS:
            return
        now = time.monotonic()
        end = done >= total
        line = f"prompt: {done}/{total} tokens ({done / total:.0%})"
        if self.tty:
            self.stream.write(f"\r{line}" + ("\n" if end else ""))
        elif end or not self.last or now - self.last >= PROMPT_PROGRESS_EVERY_S:
            self.stream.write(line + "\n")
            self.last = now
        self.stream.flush()


def _say_how_it_ended(args: argparse.Namespace, stats: Any, n_ctx: int, interrupt: Interrupt) -> None:
    """Why a generation stopped early, on stderr: the context filled up, or Ctrl-C."""
    if stats.hit_context_limit:
        asked = "" if args.n_predict == UNTIL_FULL else f" of {args.n_predict}"
        print(f"{PROG}: note: the context is full ({n_ctx} tokens; {flag(args, 'ctx_size')} sets it): stopped "
              f"after {stats.n_generated}{asked} tokens", file=sys.stderr)
    elif interrupt.requested:
        print(f"{PROG}: note: interrupted after {stats.n_generated} tokens", file=sys.stderr)


# ------------------------------------------------------------------------------------------------
# commands
# ------------------------------------------------------------------------------------------------

def _prompt(args: argparse.Namespace) -> str:
    if args.file is None:
        return args.prompt
    try:
        return args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CLIError(f"cannot read the prompt file ({flag(args, 'file')} {args.file}): {e}") from None


def cmd_generate(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """Generate from one prompt: the text on stdout as it comes (or one JSON object with
    ``--json``), the speed on stderr. Ctrl-C stops it and still prints both."""
    prompt = _prompt(args)
    with session(args, interrupt) as (model, ctx):
        kwargs = gen_kwargs(args, ctx)
        with interrupt.deferred():
            stream = model.generate(prompt, context=ctx, stream=True, cancel=interrupt,
                                    prompt_progress=PromptProgress(), **kwargs)
            pieces, stats, finish = [], None, None
            with contextlib.closing(stream):
                for piece in stream:
                    if args.json:
                        pieces.append(piece)
                    else:
                        sys.stdout.write(piece)
                        sys.stdout.flush()
                    if piece.stats is not None:
                        stats, finish = piece.stats, piece.finish_reason
        if args.json:
            print(json.dumps({"text": "".join(pieces), "tokens": [t for p in pieces for t in p.tokens],
                              "finish_reason": finish, "stats": stats.as_dict() if stats is not None else None}))
        else:
            print()
            print(stats_line("mtp" if model.has_assistant else "plain", stats), file=sys.stderr)
        _say_how_it_ended(args, stats, ctx.n_ctx, interrupt)
    return INTERRUPTED if interrupt.requested else 0


def cmd_chat(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """Interactive chat on stdin/stdout: one line per user turn (``-p``: the first), and the commands
    of :mod:`.chat_commands` (/help, /clear, /regen, /read FILE, /exit; EOF ends too; ``-st``: the
    first reply does). Ctrl-C stops the reply being written; Ctrl-C at the prompt ends the chat."""
    template = chat_template(args)
    with session(args, interrupt) as (model, ctx):
        system = [{"role": "system", "content": args.system}] if args.system else []
        messages: list[dict[str, str]] = list(system)
        attached: list[str] = []  # /read files, for the next message
        kwargs = gen_kwargs(args, ctx)
        interactive = sys.stdin.isatty()
        first = args.prompt  # -p: the first turn, as llama-cli's
        while True:
            if first is not None:
                line, first = first, None
            else:
                if interactive:
                    print("> ", end="", flush=True)
                try:
                    line = sys.stdin.readline()
                except KeyboardInterrupt:
                    print()
                    return INTERRUPTED
                if not line:
                    return 0
            try:
                read = read_line(line)
            except UnknownCommand as e:
                print(error_line(str(e)), file=sys.stderr)
                continue
            if isinstance(read, tuple):
                command, arg = read
                if command == "/exit":
                    return 0
                if command == "/help":
                    print("commands:\n" + help_text(), file=sys.stderr)
                elif command == "/clear":
                    messages, attached = list(system), []
                    print(f"{PROG}: chat history cleared", file=sys.stderr)
                elif command == "/read":
                    attached += _read_file(arg)
                elif command == "/regen":
                    if not messages or messages[-1]["role"] != "assistant":
                        print(error_line("no reply to write again"), file=sys.stderr)
                        continue
                    messages.pop()
                    _reply(args, model, ctx, messages, kwargs, template, interrupt)
                continue
            if not read.strip():
                continue
            messages.append({"role": "user", "content": "".join(attached) + read})
            attached = []
            _reply(args, model, ctx, messages, kwargs, template, interrupt)
            if args.single_turn:
                return INTERRUPTED if interrupt.requested else 0


def _read_file(name: str) -> list[str]:
    """``/read FILE``: the file's text as llama-cli adds it to the next message (nothing, with an
    error line, when it cannot be read)."""
    if not name:
        print(error_line("/read needs a file: /read FILE"), file=sys.stderr)
        return []
    try:
        text = Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        print(error_line(f"/read: cannot read {name}: {e}"), file=sys.stderr)
        return []
    print(f"{PROG}: added {name} to your next message", file=sys.stderr)
    return [f"--- File: {name} ---\n{text}"]


def _reply(args: argparse.Namespace, model: Any, ctx: Any, messages: list[dict[str, str]], kwargs: dict[str, Any],
           template: str | None, interrupt: Interrupt) -> None:
    """Write the reply to ``messages`` and add it to them; a conversation that no longer fits
    drops its last message and says so."""
    try:
        reply, stats = _chat_reply(model, ctx, messages, {**kwargs, "chat_template": template}, interrupt)
    except ContextOverflowError:
        messages.pop()
        print(error_line(f"the conversation no longer fits the context ({ctx.n_ctx} tokens; "
                         f"{flag(args, 'ctx_size')} sets it): /clear to start over"), file=sys.stderr)
        return
    if stats is not None and args.stats:
        print(stats_line("mtp" if model.has_assistant else "plain", stats), file=sys.stderr)
    if stats is not None and stats.hit_context_limit:
        _say_how_it_ended(args, stats, ctx.n_ctx, interrupt)
    messages.append({"role": "assistant", "content": reply})


def _chat_reply(model: Any, ctx: Any, messages: list[dict[str, str]], kwargs: dict[str, Any],
                interrupt: Interrupt) -> tuple[str, Any]:
    """Write one reply as it comes; Ctrl-C ends it early (what was written is kept)."""
    reply, stats = [], None
    with interrupt.deferred():
        stream = model.chat(messages, context=ctx, stream=True, cancel=interrupt, prompt_progress=PromptProgress(),
                            **kwargs)
        with contextlib.closing(stream):
            for piece in stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
                reply.append(str(piece))
                stats = piece.stats or stats
    print()
    return "".join(reply), stats
