"""The ``mtp-bindings`` command line: demo, generate, chat, serve, bench, convert,
verify-assistant, info, relayout.

Flags follow llama.cpp's where they overlap (``-m``, ``--mtp-head``/``-md``,
``--spec-draft-n-max``, ``-c``, ``-t``, ``-ngl``, ``-ctk``/``-ctv``, ``-n``, ``-p``, ``-f``,
``--temp``, ...), and are read as llama.cpp reads them (see :mod:`.cli_flags`); Ctrl-C behaves as
in llama-cli (see :mod:`.cli_interrupt`). Every error is one line, ``mtp-bindings: error: ...``,
and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

from . import __version__, models
from .cli_flags import PROG, USAGE_ERROR, Parser, SubcommandParser, error_line, name_flags, refuse, \
    refuse_unsupported, typed_flag
from .cli_interrupt import INTERRUPTED, Interrupt
from .exceptions import AssistantLoadError, ContextError, InvalidParameterError, MTPBindingsError, ModelLoadError
from .limits import CLI_N_PREDICT, SERVER_N_PREDICT, UNTIL_FULL, default_n_ctx
from .presets import PRESETS

DESCRIPTION = ("Gemma 4 MTP (multi-token prediction) speculative decoding on a patched llama.cpp: generate, "
               "chat, serve an OpenAI-compatible API, benchmark, and inspect or convert GGUF files. Without -m "
               "the bundled tiny trained pair is used: it shows MTP at work, but writes gibberish.")
LLAMA_CPP = "ggml-org/llama.cpp@0c1e57098"  # the pinned upstream commit (see patches/README.md)
# kept for callers of the old names (tests, benchmarks)
DEFAULT_TARGET = models.TARGET
DEFAULT_ASSISTANT = models.ASSISTANT
DEMO_PROMPT = "def parse_args(argv):\n"
DEMO_N_PREDICT = 256
DEMO_DRAFT_N_MAX = 2
# the demo's default pair: the bundled pair scaled to Gemma 4 E2B's shapes (scale_pair), this weight type
DEMO_PAIRS = ("e2b", "tiny")
DEMO_WTYPE = "q4_K"
# Greedy MTP equals plain greedy up to near-ties: ggml's CPU kernels round a batched verify decode and a
# one-token decode differently (measured up to 3.7e-3 on f16 weights; on the q4_K E2B pair a parting at
# a gap of 1.7e-2, where a real error moves logits by 0.1-10). A parting where plain's token leads MTP's
# by less than this is reported as a near-tie, not as a failure.
DEMO_NEAR_TIE = 5e-2
# a prompt at least this long shows its progress on stderr (a long prompt takes seconds to minutes)
PROMPT_PROGRESS_TOKENS = 1024
PROMPT_PROGRESS_EVERY_S = 2.0  # how often a non-terminal stderr gets a progress line

# errors about a parameter's value: their messages name the library's parameter, rewritten as the flag
PARAMETER_ERRORS = (InvalidParameterError, ContextError)


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


# ------------------------------------------------------------------------------------------------
# flags
# ------------------------------------------------------------------------------------------------

def _add_model_args(p: argparse.ArgumentParser, *, no_mtp: bool = True) -> None:
    p.add_argument("-m", "--model", type=Path, default=None,
                   help="target GGUF (default: the bundled tiny trained model, which writes gibberish)")
    p.add_argument("--mtp-head", "-md", "--model-draft", dest="mtp_head", type=Path, default=None,
                   help="MTP assistant GGUF to attach (default: the one named like the model beside it, e.g. "
                        "NAME-assistant-Q4_K_M.gguf for NAME-Q4_K_M.gguf or X-assistant.gguf for X-target.gguf; "
                        "none found: plain decoding)")
    if no_mtp:
        p.add_argument("--no-mtp", action="store_true", help="attach no assistant: plain decoding")
    p.add_argument("-c", "--ctx-size", type=int, default=None,
                   help="context size in tokens (default: the model's training context, at most 4096; "
                        "0: the whole training context)")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="compute threads, fixed (default: the CPUs this process may use, at most 8, less those "
                        "other work keeps busy at the moment; serve: shared by all slots); more than the usable "
                        "CPUs warns")
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", type=int, default=0,
                   help="layers to offload to a GPU (-1: all; default 0; a CPU-only build ignores it)")
    p.add_argument("--no-mmap", action="store_true", help="read the model into memory instead of mapping it")
    p.add_argument("-ctk", "--cache-type-k", default="f16", help="KV cache type of K: f16 (default), q8_0, ...")
    p.add_argument("-ctv", "--cache-type-v", default="f16",
                   help="KV cache type of V: f16 (default), q8_0, ... (a quantized V needs flash attention)")
    p.add_argument("-fa", "--flash-attn", default="auto", choices=["on", "off", "auto"],
                   help="flash attention (default auto: on only for a quantized V cache)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show what is loaded (model, assistant and its head type) and llama.cpp's load log "
                        "(buffers, metadata)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--n-predict", type=int, default=CLI_N_PREDICT,
                   help=f"tokens to generate (default {CLI_N_PREDICT}; {UNTIL_FULL}: until the end of the text or "
                        "a full context)")
    p.add_argument("--temp", type=float, default=0.0, help="temperature (default 0: greedy)")
    p.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens (default 40; 0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (default 1.0: off)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens below this fraction of the top token's probability (default 0: off)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty (default 1.0: off)")
    p.add_argument("--repeat-last-n", type=int, default=64, help="tokens the penalties look back over (default 64)")
    p.add_argument("--presence-penalty", type=float, default=0.0, help="presence penalty (default 0: off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="frequency penalty (default 0: off)")
    p.add_argument("-s", "--seed", type=int, default=None, help="random seed (default and -1: a random seed)")
    p.add_argument("--stop", action="append", default=None, help="stop at this string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-text tokens")
    p.add_argument("--spec-draft-n-max", "--draft-max", dest="draft_n_max", type=int, default=None,
                   help="tokens drafted per round (default from --preset; 0: plain decoding)")
    _add_drafting_args(p)
    p.add_argument("--trace", default=None, help="append an NDJSON acceptance trace to this file ('1': stderr)")


def _add_drafting_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="MTP preset (default: lift)")
    p.add_argument("--no-depth2", action="store_true", help="draft synchronously (A/B of the overlap)")
    p.add_argument("--skip-streak", type=int, default=None,
                   help="after N rounds in a row with nothing accepted, skip drafting one round (default 0: off)")


# ------------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------------

def _model_files(args: argparse.Namespace) -> tuple[Path, Path | None, bool, str | None]:
    """The target, the assistant to attach (None: plain decoding), whether the user named that
    assistant, and a note to say once (None: nothing worth saying)."""
    target = args.model or models.TARGET
    if getattr(args, "no_mtp", False):
        return target, None, False, None
    if args.mtp_head is not None:
        return target, args.mtp_head, True, None
    found = models.find_assistant(target)
    if found is None:
        looked = ", ".join(c.name for c in models.assistant_candidates(target)[:2])
        return target, None, False, (f"no MTP assistant given (--mtp-head) or found beside {target.name} "
                                     f"(looked for {looked}, ...): plain decoding")
    if args.model is None:
        return target, found, False, None  # the bundled pair
    return target, found, False, (f"attaching the MTP assistant found beside the model: {found} "
                                  "(--no-mtp for plain decoding)")


def _load_progress(target: Path, interrupt: Interrupt) -> Any:
    """The load's progress callback: a bar on a terminal, and either way stop on Ctrl-C."""
    if not sys.stderr.isatty():
        return interrupt.keep_loading
    from .model import _tqdm_progress

    bar = _tqdm_progress(f"loading {target.name}")

    def update(progress: float) -> bool:
        bar(progress)
        return interrupt.keep_loading(progress)

    return update


def _load(args: argparse.Namespace, interrupt: Interrupt) -> Any:
    """Load the target and attach its assistant (see :func:`_model_files`); Ctrl-C stops the
    load and raises ``KeyboardInterrupt`` once it is safe to."""
    from .model import Model

    target, assistant, named, note = _model_files(args)
    with interrupt.deferred(second_raises=False):
        try:
            model = Model(target, n_gpu_layers=args.n_gpu_layers, use_mmap=not args.no_mmap, verbose=args.verbose,
                          progress=_load_progress(target, interrupt))
        except ModelLoadError:
            if interrupt.requested:
                raise KeyboardInterrupt from None
            raise
        try:
            if assistant is not None and not interrupt.requested:
                model.attach_assistant(assistant)
        except AssistantLoadError as e:
            if named:
                model.close()
                raise
            note = f"the MTP assistant found beside the model does not fit it ({e}): plain decoding"
        except BaseException:
            model.close()
            raise
    if interrupt.requested:
        model.close()
        raise KeyboardInterrupt
    if note:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    if args.verbose:
        _print_load_info(model)
    return model


def _print_load_info(model: Any) -> None:
    """``-v``: what was loaded, in a few lines on stderr."""
    print(f"model      {model.path}: {model.summary()}", file=sys.stderr)
    if model.assistant_path is None:
        print("assistant  none: plain decoding", file=sys.stderr)
        return
    from .gguf_tools import describe_assistant_head

    print(f"assistant  {model.assistant_path}: {describe_assistant_head(model.assistant_path)}", file=sys.stderr)


def _n_ctx(model: Any, args: argparse.Namespace) -> int:
    if args.ctx_size is None:
        return default_n_ctx(model.n_ctx_train)
    if args.ctx_size == 0 and model.n_ctx_train > 0:
        return model.n_ctx_train
    return args.ctx_size


@contextlib.contextmanager
def _session(args: argparse.Namespace, interrupt: Interrupt) -> Iterator[tuple[Any, Any]]:
    """The loaded model and a context on it, closed on exit. Ctrl-C while they are set up (llama.cpp
    logs through a Python callback all along) stops there with ``KeyboardInterrupt``."""
    with _load(args, interrupt) as model:
        with interrupt.deferred(second_raises=False):
            ctx = model.create_context(n_ctx=_n_ctx(model, args), n_threads=args.threads, type_k=args.cache_type_k,
                                       type_v=args.cache_type_v, flash_attn=args.flash_attn,
                                       embeddings=model.has_assistant)
        with ctx:
            if interrupt.requested:
                raise KeyboardInterrupt
            yield model, ctx


def _flag(args: argparse.Namespace, dest: str) -> str:
    """The spelling of ``dest``'s flag the user typed."""
    return typed_flag(args.parser, dest, args.argv) or dest


def _gen_kwargs(args: argparse.Namespace, ctx: Any) -> dict[str, Any]:
    n = args.n_predict
    if n < UNTIL_FULL:
        raise CLIError(f"{_flag(args, 'n_predict')} must be a number of tokens, or {UNTIL_FULL} for until the end "
                       f"of the text or a full context; got {n}")
    return dict(max_tokens=ctx.n_ctx if n == UNTIL_FULL else n, temperature=args.temp, top_k=args.top_k,
                top_p=args.top_p, min_p=args.min_p, repeat_penalty=args.repeat_penalty,
                repeat_last_n=args.repeat_last_n, presence_penalty=args.presence_penalty,
                frequency_penalty=args.frequency_penalty, seed=None if args.seed == -1 else args.seed,
                stop=args.stop, draft_n_max=args.draft_n_max, preset=args.preset,
                depth2=False if args.no_depth2 else None, skip_streak=args.skip_streak, trace=args.trace,
                ignore_eos=args.ignore_eos)


def _stats_line(label: str, stats: Any) -> str:
    acc = f"acceptance {stats.acceptance_rate:6.1%}, {stats.mean_accepted_length:.2f} tokens/round" \
        if stats.n_drafted else "no drafting"
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
        print(f"{PROG}: note: the context is full ({n_ctx} tokens; {_flag(args, 'ctx_size')} sets it): stopped "
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
        raise CLIError(f"cannot read the prompt file ({_flag(args, 'file')} {args.file}): {e}") from None


def cmd_generate(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """Generate from one prompt: the text on stdout as it comes (or one JSON object with
    ``--json``), the speed on stderr. Ctrl-C stops it and still prints both."""
    prompt = _prompt(args)
    with _session(args, interrupt) as (model, ctx):
        kwargs = _gen_kwargs(args, ctx)
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
                              "finish_reason": finish, "stats": stats.as_dict()}))
        else:
            print()
            print(_stats_line("mtp" if model.has_assistant else "plain", stats), file=sys.stderr)
        _say_how_it_ended(args, stats, ctx.n_ctx, interrupt)
    return INTERRUPTED if interrupt.requested else 0


def cmd_chat(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """Interactive chat on stdin/stdout: one line per user turn; /reset clears, /quit (or EOF) ends.
    Ctrl-C stops the reply being written; Ctrl-C at the prompt ends the chat."""
    from .exceptions import ContextOverflowError

    with _session(args, interrupt) as (model, ctx):
        messages: list[dict[str, str]] = []
        if args.system:
            messages.append({"role": "system", "content": args.system})
        kwargs = _gen_kwargs(args, ctx)
        interactive = sys.stdin.isatty()
        while True:
            if interactive:
                print("> ", end="", flush=True)
            try:
                line = sys.stdin.readline()
            except KeyboardInterrupt:
                print()
                return INTERRUPTED
            if not line or line.strip() == "/quit":
                return 0
            if line.strip() == "/reset":
                messages = messages[:1] if args.system else []
                continue
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line.rstrip("\n")})
            try:
                reply, stats = _chat_reply(model, ctx, messages, kwargs, interrupt)
            except ContextOverflowError:
                messages.pop()
                print(error_line(f"the conversation no longer fits the context ({ctx.n_ctx} tokens; "
                                 f"{_flag(args, 'ctx_size')} sets it): /reset to start over"), file=sys.stderr)
                continue
            if stats is not None and args.stats:
                print(_stats_line("mtp" if model.has_assistant else "plain", stats), file=sys.stderr)
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


def cmd_demo(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """The README's main job: a pair (by default the E2B-sized scale-up of the bundled one)
    generating with and without MTP, side by side."""
    if args.n_predict < 1:
        raise CLIError(f"{_flag(args, 'n_predict')} must be at least 1, got {args.n_predict}")
    if args.model is None and args.pair == "e2b":
        args.model, args.mtp_head = _e2b_pair()
    results = {}
    with _load(args, interrupt) as model:
        if not model.has_assistant:
            raise CLIError("demo compares MTP with plain decoding and needs an assistant: pass --mtp-head FILE")
        print(f"target    {model.path}\nassistant {model.assistant_path}\nprompt    {args.prompt!r}\n")
        with model.create_context(n_ctx=_n_ctx(model, args), n_threads=args.threads, embeddings=True) as ctx:
            model.generate(args.prompt, context=ctx, max_tokens=16, draft_n_max=0)  # warm-up
            for label, n in (("plain", 0), ("mtp", args.draft_n_max)):
                results[label] = model.generate(args.prompt, context=ctx, max_tokens=args.n_predict,
                                                draft_n_max=n)
            plain, mtp = results["plain"], results["mtp"]
            parting = next((i for i, (a, b) in enumerate(zip(plain.tokens, mtp.tokens)) if a != b), None)
            gap = None if parting is None else _plain_gap(model, ctx, args.prompt, plain.tokens, mtp.tokens, parting)
    print(mtp.text)
    print()
    for label, r in results.items():
        print(_stats_line(label, r.stats))
    speed = mtp.stats.tokens_per_second / plain.stats.tokens_per_second if plain.stats.tokens_per_second else 0.0
    if parting is None and len(plain.tokens) == len(mtp.tokens):
        print(f"\nidentical output: yes   MTP speed vs plain: {speed:.2f}x")
        return 0
    near_tie = gap is not None and gap < DEMO_NEAR_TIE
    why = (f"they part at token {parting} on a near-tie: plain's token's logit is {gap:.4f} above MTP's; "
           "batched and one-token decodes round differently") if near_tie else f"they part at token {parting}"
    print(f"\nidentical output: {'up to a near-tie' if near_tie else 'NO'} ({why})\nMTP speed vs plain: {speed:.2f}x")
    return 0 if near_tie else 1


def _plain_gap(model: Any, ctx: Any, prompt: str, plain: list[int], mtp: list[int], at: int) -> float | None:
    """How far plain's token's logit is above MTP's at their first parting ``at`` (None when MTP
    stopped first): plain decoding is replayed up to it, and its last decode's row is the one plain
    chose from."""
    if at >= len(mtp):
        return None
    model.generate(prompt, context=ctx, max_tokens=at + 1, draft_n_max=0)
    row = ctx.logits_view(-1)
    return float(row[plain[at]] - row[mtp[at]])


def _e2b_pair() -> tuple[Path, Path]:
    """The demo's default pair: target and centroid-head assistant with Gemma 4 E2B's shapes and the
    bundled pair's behaviour, built on first use (a few minutes) and cached (see :mod:`.scale_pair`)."""
    from .scale_pair import ScaleConfig, scale_pair

    print(f"{PROG}: the E2B-sized pair (Gemma 4 E2B's shapes, the bundled pair's behaviour; "
          "built on first use, then cached; --pair tiny for the bundled pair)", file=sys.stderr)
    pair = scale_pair(ScaleConfig(), types=(DEMO_WTYPE,), progress=True)
    return pair.target[DEMO_WTYPE], pair.centroid[DEMO_WTYPE]


def cmd_serve(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """The OpenAI-compatible server (see :mod:`mtp_bindings.server`)."""
    try:
        from .server import serve
    except ImportError as e:
        raise CLIError(f"the server needs the [server] extra (pip install 'mtp-bindings[server]'): {e}") from e
    if args.parallel < 1:
        raise CLIError(f"{_flag(args, 'parallel')} must be at least 1, got {args.parallel}")
    if not 0 <= args.port <= 65535:
        raise CLIError(f"{_flag(args, 'port')} must be in 0..65535, got {args.port}")
    logging.getLogger("mtp_bindings.server").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    with _load(args, interrupt) as model:
        serve(model, host=args.host, port=args.port, model_name=args.alias, api_key=args.api_key,
              n_slots=args.parallel, n_ctx=_n_ctx(model, args), n_predict=args.n_predict, n_threads=args.threads,
              type_k=args.cache_type_k, type_v=args.cache_type_v, flash_attn=args.flash_attn,
              draft_n_max=args.draft_n_max, preset=args.preset, depth2=False if args.no_depth2 else None,
              skip_streak=args.skip_streak, access_log=args.verbose)
    return 0


def cmd_bench(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """Benchmarks against upstream llama.cpp (see :mod:`mtp_bindings.benchmark`)."""
    from .benchmark import main_args

    return main_args(args, f"{PROG} bench " + " ".join(args.argv[1:]))


def cmd_info(args: argparse.Namespace, interrupt: Interrupt) -> int:
    from .gguf_tools import describe

    print(describe(args.file, target=args.target))
    return 0


def cmd_verify_assistant(args: argparse.Namespace, interrupt: Interrupt) -> int:
    from .gguf_tools import verify_assistant

    problems = verify_assistant(args.file, target=args.target)
    if problems:
        for p in problems:
            print(error_line(p if p.startswith(str(args.file)) else f"{args.file}: {p}"), file=sys.stderr)
        return USAGE_ERROR
    print(f"{args.file}: OK")
    return 0


def cmd_convert(args: argparse.Namespace, interrupt: Interrupt) -> int:
    from .convert import convert_hf

    out = convert_hf(args.hf_dir, args.outfile, outtype=args.outtype, verbose=args.verbose)
    print(f"wrote {out}")
    return 0


def cmd_relayout(args: argparse.Namespace, interrupt: Interrupt) -> int:
    from .gguf_tools import to_design_layout

    print(f"wrote {to_design_layout(args.file, args.outfile)}")
    return 0


# ------------------------------------------------------------------------------------------------
# the parser
# ------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG, description=DESCRIPTION)
    ap.add_argument("--version", action="version", version=f"{PROG} {__version__} (llama.cpp {LLAMA_CPP})",
                    help="print the version and exit")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=SubcommandParser)

    p = sub.add_parser("demo", help="generate with an E2B-sized pair, with and without MTP, side by side",
                       description="Generate with a target and its assistant, with and without MTP: tokens/s, "
                                   "acceptance and whether the outputs are identical. Default: the bundled tiny "
                                   "trained pair scaled to Gemma 4 E2B's shapes (35 layers of width 1536, a "
                                   "262144-token vocabulary, a centroid-head assistant; built on first use, then "
                                   "cached): it behaves exactly like the tiny pair, so it writes the same gibberish, "
                                   "at a real model's cost.")
    _add_model_args(p, no_mtp=False)
    p.add_argument("--pair", choices=DEMO_PAIRS, default=DEMO_PAIRS[0],
                   help="the pair when -m is not given: e2b (default; the scaled pair) or tiny (the bundled pair)")
    p.add_argument("-p", "--prompt", default=DEMO_PROMPT, help=f"the prompt (default {DEMO_PROMPT!r})")
    p.add_argument("-n", "--n-predict", type=int, default=DEMO_N_PREDICT,
                   help=f"tokens to generate (default {DEMO_N_PREDICT})")
    p.add_argument("--spec-draft-n-max", dest="draft_n_max", type=int, default=DEMO_DRAFT_N_MAX,
                   help=f"tokens drafted per round (default {DEMO_DRAFT_N_MAX})")
    refuse(p, ["--no-mtp"], "mtp-bindings generate --no-mtp: demo runs both, plain and MTP")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("generate", help="generate text from a prompt",
                       description="Generate a continuation of a prompt: text on stdout as it comes, speed and "
                                   "acceptance on stderr. Ctrl-C stops it early (exit status 130).")
    _add_model_args(p)
    _add_sampling_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="the prompt text")
    src.add_argument("-f", "--file", type=Path, help="read the prompt from this file")
    p.add_argument("--json", action="store_true", help="print text, token ids and stats as one JSON object")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive chat with the GGUF's chat template (stdin/stdout)",
                       description="Chat on stdin/stdout with the GGUF's chat template: one line per turn, "
                                   "/reset starts over, /quit or end of input ends. Ctrl-C stops the reply being "
                                   "written; Ctrl-C at the prompt ends the chat.")
    _add_model_args(p)
    _add_sampling_args(p)
    p.add_argument("--system", "-sys", "--system-prompt", dest="system", default=None, help="a system message")
    p.add_argument("--stats", action="store_true", help="print tokens/s and acceptance after each reply")
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("convert", help="convert a Hugging Face Gemma 4 target or assistant to GGUF (needs torch)",
                       description="Convert a Hugging Face Gemma 4 target or assistant checkpoint to GGUF with the "
                                   "patched llama.cpp converter (keeps the centroid head). Needs torch.")
    p.add_argument("hf_dir", type=Path, help="directory with config.json + safetensors (+ tokenizer)")
    p.add_argument("outfile", type=Path, help="the GGUF to write")
    p.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"],
                   help="tensor type of the weights (default f16)")
    p.add_argument("-v", "--verbose", action="store_true", help="show the converter's log")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the [server] extra)",
                       description="Serve the model over an OpenAI-compatible API: /v1/chat/completions, "
                                   "/v1/completions, /v1/models, /health, /metrics. Ctrl-C stops it; open requests "
                                   "get a 503 error.")
    _add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (all routes but /health)")
    p.add_argument("-np", "--parallel", type=int, default=1,
                   help="slots: requests generated at once, each with its own context (default 1); "
                        "more requests queue")
    p.add_argument("-n", "--n-predict", type=int, default=SERVER_N_PREDICT,
                   help=f"tokens a request generates when it sets no max_tokens (default {SERVER_N_PREDICT}; "
                        f"{UNTIL_FULL}: until the end of the text or a full context)")
    p.add_argument("-a", "--alias", default=None, help="model name the API reports (default: the file's stem)")
    p.add_argument("--spec-draft-n-max", "--draft-max", dest="draft_n_max", type=int, default=None,
                   help="default tokens drafted per round (default from --preset; requests may override)")
    _add_drafting_args(p)
    p.set_defaults(func=cmd_serve)

    from .benchmark import add_arguments as add_bench_arguments

    p = sub.add_parser("bench", help="benchmark against upstream llama.cpp (markdown, JSON and plots)",
                       description="MTP vs plain decoding, ours vs upstream llama-server, and the cost structure "
                                   "at Gemma 4 E2B shapes; results in bench/results (see bench/README.md).")
    add_bench_arguments(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("info", help="summarise a GGUF (arch, sizes, quantization, MTP compatibility)",
                       description="Summarise a GGUF file from its header: architecture, sizes, tensor types and, "
                                   "for an assistant, its layout, head and MTP compatibility.")
    p.add_argument("file", type=Path, help="the GGUF file")
    p.add_argument("--target", type=Path, default=None, help="check MTP compatibility with this target")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("relayout", help="rewrite an upstream-layout assistant GGUF in the design doc's layout",
                       description="Rewrite an upstream-layout assistant (gemma4-assistant, nextn.*) in the design "
                                   "doc's layout (gemma4_assistant, mtp.*); same weights.")
    p.add_argument("file", type=Path, help="the upstream-layout assistant GGUF")
    p.add_argument("outfile", type=Path, help="the GGUF to write")
    p.set_defaults(func=cmd_relayout)

    p = sub.add_parser("verify-assistant", help="check an assistant GGUF's shapes, dtypes and metadata",
                       description="Check an MTP assistant GGUF: architecture, tensors, shapes, the centroid head "
                                   "and, with --target, that it fits the target. Each problem is an error line; "
                                   "exit status 2 if any.")
    p.add_argument("file", type=Path, help="the assistant GGUF")
    p.add_argument("--target", type=Path, default=None, help="also check it fits this target")
    p.set_defaults(func=cmd_verify_assistant)

    # imported here, inside main()'s Ctrl-C handling: it loads numpy, the slowest part of start-up
    from .scale_pair import add_parser as add_scale_pair_parser

    add_scale_pair_parser(sub)

    for name, p in sub.choices.items():
        if name in ("demo", "generate", "chat", "serve"):
            refuse_unsupported(p)
        p.set_defaults(parser=p)  # the subcommand's parser, to name its flags in errors
    return ap


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


if __name__ == "__main__":
    sys.exit(main())
