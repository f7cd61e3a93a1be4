"""How the ``mtp-bindings`` command line reads its flags the way llama.cpp's tools do.

* A flag is typed whole: no abbreviations (``--temp`` is not ``--te``) and no single-dash prefix
  matching (argparse would read ``-ngl 99`` as ``-n gl`` and ``-hf x`` as ``-h f``).
* llama.cpp flags this package does not have are refused by name, with what to use instead:
  ``not supported: -ngl (use ...)``, never a misleading parse error.
* Errors follow one convention: the subcommand's usage, then ``mtp-bindings: error: ...``, exit
  status 2; an unknown flag after a subcommand is refused with that subcommand's usage.
* Errors raised by the library name its Python parameter (``n_ctx``); :func:`name_flags` rewrites
  them with the flag the user typed (``-c``).
* A subcommand may add its arguments only when it is used (:class:`SubcommandParser`'s
  ``arguments``), so that ``mtp-bindings info --help`` imports nothing of ``bench``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

PROG = "mtp-bindings"
USAGE_ERROR = 2  # exit status of every error, as argparse's


def error_line(message: str) -> str:
    """The one line every error is printed as."""
    return f"{PROG}: error: {message}"


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse with llama.cpp's flag rules (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _get_option_tuples(self, option_string: str) -> list[Any]:
        # argparse's hook for matching a flag it does not know exactly; with allow_abbrev=False it
        # still matches single-dash prefixes ("-ngl" as "-n" + "gl"). llama.cpp never does.
        return []

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, error_line(message) + "\n")


class SubcommandParser(Parser):
    """A subcommand's parser: arguments it does not know are its own error (with its usage),
    not left for the top-level parser to report with the top-level usage.

    ``arguments``, if given, adds the subcommand's arguments when the subcommand is first used
    (parsed, or its help or usage shown) rather than when the command line is built: a command
    whose arguments live in a heavy module (the benchmark's) costs nothing to the others.

    ``passthrough``, if given, is the attribute that receives every argument it does not define,
    in order and unread, for a command that hands them to a program of its own (``rpc-server``)."""

    def __init__(self, *args: Any, arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                 passthrough: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arguments = arguments
        self._passthrough = passthrough

    def _add_lazy_arguments(self) -> None:
        if self._arguments is not None:
            add, self._arguments = self._arguments, None
            add(self)

    def format_usage(self) -> str:
        self._add_lazy_arguments()
        return super().format_usage()

    def format_help(self) -> str:
        self._add_lazy_arguments()
        return super().format_help()

    # typeshed's overloads (a namespace of any type) are more than this parser ever gets
    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self._add_lazy_arguments()
        ns, extras = super().parse_known_args(args, namespace)
        if self._passthrough is not None:
            setattr(ns, self._passthrough, extras)
            return ns, []
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


# ------------------------------------------------------------------------------------------------
# llama.cpp flags we do not have
# ------------------------------------------------------------------------------------------------

# (llama.cpp's spellings, what to use instead). A command that has one of these flags itself keeps
# its own (e.g. generate's -f, chat's -sys).
UNSUPPORTED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("-mu", "--model-url"), "-m FILE, with the GGUF downloaded yourself, or -hf USER/MODEL[:QUANT]"),
    (("-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf"),
     "--mtp-head FILE, with the assistant GGUF downloaded yourself"),
    (("-f", "--file"), "generate -f FILE; chat reads its turns from stdin: mtp-bindings chat < FILE"),
    (("-sys", "--system-prompt"), "mtp-bindings chat --system TEXT"),
    (("-cnv", "--conversation", "-i", "--interactive", "-if", "--interactive-first"), "mtp-bindings chat"),
    (("-no-cnv", "--no-conversation", "-st", "--single-turn"), "mtp-bindings generate, which is single-turn"),
    (("-r", "--reverse-prompt"), "--stop STRING"),
    (("-e", "--escape", "--no-escape"), "-f FILE for a multi-line prompt: the prompt is used as given"),
    (("--jinja", "--chat-template", "--chat-template-file"),
     "chat or serve --chat-template NAME|FILE; generate and demo continue the prompt as given, with no chat "
     "template"),
    (("--no-jinja",), "--chat-template NAME for one of llama.cpp's built-in formats: templates are rendered "
                      "with Jinja"),
    (("-b", "--batch-size", "-ub", "--ubatch-size"),
     "generate or chat -b / -ub; serve's slots keep the library's batch sizes (ContextParams)"),
    (("--mlock", "--numa", "-nkvo", "--no-kv-offload", "-dt", "--defrag-thold", "--rope-scaling", "--rope-scale",
      "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx", "--yarn-ext-factor", "--yarn-attn-factor",
      "--yarn-beta-slow", "--yarn-beta-fast", "--override-kv", "--keep"),
     "the defaults llama.cpp picks for the model"),
    (("-sm", "--split-mode", "-ts", "--tensor-split", "-mg", "--main-gpu"),
     "a GPU build (CMAKE_ARGS at install time), -ngl and --device"),
    (("--grammar", "--grammar-file", "-j", "--json-schema", "-jf", "--json-schema-file"),
     "generate or chat --grammar / -j; serve: a request's grammar, json_schema or response_format"),
    (("--mirostat", "--mirostat-lr", "--mirostat-ent", "--dynatemp-range", "--dynatemp-exp",
      "--samplers", "--sampling-seq", "--penalize-nl", "-l", "--logit-bias"),
     "--temp, --top-k, --top-p, --min-p, --typical, --top-n-sigma, XTC, DRY and the repeat/presence/frequency "
     "penalties, in llama-server's order"),
    (("--typical", "--typical-p", "--top-nsigma", "--top-n-sigma", "--xtc-probability", "--xtc-threshold",
      "--dry-multiplier", "--dry-base", "--dry-allowed-length", "--dry-penalty-last-n", "--dry-sequence-breaker"),
     "generate or chat with the flag; serve: the request's field of llama-server's name (typical_p, top_n_sigma, "
     "xtc_*, dry_*)"),
    (("--lora", "--lora-scaled", "--control-vector", "--control-vector-scaled", "--control-vector-layer-range"),
     "a merged GGUF: adapters are not supported"),
    (("--draft-min", "--draft-n-min"), "--spec-draft-n-min (llama.cpp's own new name)"),
    (("--spec-default",), "nothing: MTP is on whenever an assistant is given or found (--spec-type draft-mtp "
                          "requires one); llama.cpp's n-gram drafting is not available"),
    (("--spec-draft-p-split", "--draft-p-split", "--spec-draft-backend-sampling", "--no-spec-draft-backend-sampling"),
     "--spec-draft-n-max / --preset: the assistant drafts one chain by argmax"),
    (("-tbd", "--spec-draft-threads-batch", "--threads-batch-draft"),
     "-tb: the assistant reads the target's KV cache, it has no prompt of its own to process"),
    (("-cd", "--ctx-size-draft", "--spec-replace", "-ctkd", "-ctvd", "--spec-draft-type-k", "--spec-draft-type-v",
      "--cache-type-k-draft", "--cache-type-v-draft"),
     "--spec-draft-n-max: the assistant drafts in the target's own context"),
    (("--slot-save-path",), "mtp-bindings serve --slot-save-path DIR, or Model.save_state / load_state"),
    (("--prompt-cache", "--prompt-cache-all", "--prompt-cache-ro", "--cache-reuse"),
     "the built-in prompt cache, on by default in chat and serve (serve --no-cache-prompt turns it off): a "
     "generation keeps the KV of the longest prefix its prompt shares with what its context last held and "
     "decodes only the rest; it saves nothing to files and shifts no KV to reuse chunks past the first "
     "difference"),
    (("-lv", "--verbosity", "--log-verbosity", "--log-file", "--log-disable", "--log-colors", "--log-prefix",
      "--log-timestamps", "-co", "--color", "--perf", "--no-perf", "--no-display-prompt", "--no-warmup"),
     "-v for the load log; generate prints its speed on stderr, chat with --stats"),
    (("--ssl-key-file", "--ssl-cert-file"), "a TLS proxy in front of mtp-bindings serve"),
    (("--api-key-file",), "--api-key KEY"),
    (("--embedding", "--embeddings", "--pooling", "--embd-normalize"), "mtp-bindings serve --embeddings [--pooling P], or Model.embed"),
    (("--path", "--webui", "--no-webui", "--rerank", "--reranking", "-cb", "--cont-batching", "-nocb",
      "--no-cont-batching", "-to", "--timeout", "--threads-http", "-sps", "--slot-prompt-similarity"),
     "mtp-bindings serve's defaults: no web UI or reranking, -np slots, /health, /metrics and /slots always on"),
)


class _Unsupported(argparse.Action):
    """A llama.cpp flag this command does not have: refused by name with a hint."""

    def __init__(self, option_strings: list[str], dest: str, hint: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
        self.hint = hint

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"not supported: {option_string} (use {self.hint})")


def refuse(parser: argparse.ArgumentParser, flags: Iterable[str], hint: str) -> None:
    """Make ``parser`` refuse each of ``flags`` it does not define itself, saying to use ``hint``."""
    for flag in flags:
        try:
            parser.add_argument(flag, action=_Unsupported, hint=hint)
        except argparse.ArgumentError:  # the command has this flag: it is supported there
            pass


def refuse_unsupported(parser: argparse.ArgumentParser) -> None:
    """Add every :data:`UNSUPPORTED` llama.cpp flag ``parser`` does not define itself."""
    for flags, hint in UNSUPPORTED:
        refuse(parser, flags, hint)


# ------------------------------------------------------------------------------------------------
# library errors in the user's words
# ------------------------------------------------------------------------------------------------

# library parameter -> the argparse dest of the flag that sets it
PARAM_DEST = {
    "n_ctx": "ctx_size", "n_threads": "threads", "max_tokens": "n_predict", "temperature": "temp",
    "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "typical_p": "typical", "top_n_sigma": "top_n_sigma",
    "xtc_probability": "xtc_probability", "xtc_threshold": "xtc_threshold", "dry_multiplier": "dry_multiplier",
    "dry_base": "dry_base", "dry_allowed_length": "dry_allowed_length", "dry_penalty_last_n": "dry_penalty_last_n",
    "dry_sequence_breakers": "dry_sequence_breaker", "seed": "seed", "draft_n_max": "draft_n_max",
    "skip_streak": "skip_streak", "type_k": "cache_type_k", "type_v": "cache_type_v", "flash_attn": "flash_attn",
    "type_k_swa": "cache_type_k_swa", "type_v_swa": "cache_type_v_swa",
    "n_slots": "parallel", "n_predict": "n_predict", "port": "port", "n_gpu_layers": "n_gpu_layers",
    "n_gpu_layers_draft": "n_gpu_layers_draft", "n_threads_batch": "threads_batch", "devices": "device",
    "rpc_servers": "rpc", "grammar": "grammar", "json_schema": "json_schema", "n_batch": "batch_size",
    "n_ubatch": "ubatch_size",
}


def typed_flag(parser: argparse.ArgumentParser, dest: str, argv: Sequence[str]) -> str | None:
    """The spelling of ``dest``'s flag the user typed in ``argv`` (else its first spelling)."""
    for action in parser._actions:  # argparse's list of what the parser defines (no public accessor)
        if action.dest == dest and action.option_strings:
            typed = {a.split("=", 1)[0] for a in argv}
            return next((o for o in action.option_strings if o in typed), action.option_strings[0])
    return None


def flag(args: argparse.Namespace, dest: str) -> str:
    """The spelling of ``dest``'s flag the user typed (``args`` as :func:`mtp_bindings.cli.main`
    leaves it: with the subcommand's ``parser`` and the ``argv``)."""
    return typed_flag(args.parser, dest, args.argv) or dest


def name_flags(message: str, parser: argparse.ArgumentParser, argv: Sequence[str]) -> str:
    """``message`` with each library parameter name replaced by the flag the user typed for it
    (``n_ctx must be a positive int`` -> ``-c must be a positive int``)."""

    def swap(m: re.Match[str]) -> str:
        flag = typed_flag(parser, PARAM_DEST[m.group(0)], argv)
        return flag or m.group(0)

    # whole words only: not part of a longer name or of a path
    pattern = r"(?<![\w./\\-])(" + "|".join(map(re.escape, PARAM_DEST)) + r")(?![\w/\\-])"
    return re.sub(pattern, swap, message).replace(" or None, got", ", got")
