"""The ``mtp-bindings`` command line: demo, generate, chat, serve, bench, convert,
verify-assistant, info. Flags follow llama.cpp's where they overlap (``-m``, ``--mtp-head``/``-md``,
``--spec-draft-n-max``, ``-c``, ``-t``, ``-ctk``/``-ctv``, ``-n``, ``-p``, ``--temp``, ...)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from .exceptions import MTPBindingsError
from .presets import PRESETS

BUNDLED = Path(__file__).parent / "models"
DEFAULT_TARGET = BUNDLED / "trained-target.gguf"
DEFAULT_ASSISTANT = BUNDLED / "trained-assistant.gguf"
DEMO_PROMPT = "def parse_args(argv):\n"


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def _add_model_args(p: argparse.ArgumentParser, assistant_default: Path | None = DEFAULT_ASSISTANT) -> None:
    p.add_argument("-m", "--model", type=Path, default=DEFAULT_TARGET,
                   help="target GGUF (default: the bundled trained fixture)")
    p.add_argument("--mtp-head", "-md", "--model-draft", dest="mtp_head", type=Path, default=assistant_default,
                   help="MTP assistant GGUF to attach (default: the bundled trained assistant)")
    p.add_argument("--no-mtp", action="store_true", help="do not attach an assistant (plain decoding)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size (default 4096)")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="compute threads (default: the CPUs this process may use, at most 8; serve: shared by "
                        "all slots); more than the usable CPUs warns")
    p.add_argument("-ctk", "--cache-type-k", default="f16", help="KV cache type of K (f16, q8_0, ...)")
    p.add_argument("-ctv", "--cache-type-v", default="f16", help="KV cache type of V (f16, q8_0, ...)")
    p.add_argument("-fa", "--flash-attn", default="auto", choices=["on", "off", "auto"])
    p.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate (default 128)")
    p.add_argument("--temp", type=float, default=0.0, help="temperature (0 = greedy, the default)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("-s", "--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--spec-draft-n-max", "--draft-max", dest="draft_n_max", type=int, default=None,
                   help="tokens drafted per round (default from --preset)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="MTP preset (default: lift)")
    p.add_argument("--no-depth2", action="store_true", help="draft synchronously (A/B of the overlap)")
    p.add_argument("--skip-streak", type=int, default=None, help="zero-accept skip-streak threshold (0 = off)")
    p.add_argument("--trace", default=None, help="NDJSON acceptance trace file ('1' = stderr)")


def _load(args: argparse.Namespace, with_assistant: bool = True) -> Any:
    from .model import Model

    assistant = None if (args.no_mtp or not with_assistant) else args.mtp_head
    model = Model(args.model, assistant=assistant, verbose=args.verbose, progress=sys.stderr.isatty() or None)
    return model


def _context(model: Any, args: argparse.Namespace) -> Any:
    return model.create_context(n_ctx=args.ctx_size, n_threads=args.threads, type_k=args.cache_type_k,
                                type_v=args.cache_type_v, flash_attn=args.flash_attn,
                                embeddings=model.has_assistant)


def _gen_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return dict(max_tokens=args.n_predict, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                min_p=args.min_p, repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty, seed=args.seed,
                stop=args.stop, draft_n_max=args.draft_n_max, preset=args.preset,
                depth2=False if args.no_depth2 else None, skip_streak=args.skip_streak, trace=args.trace)


def _stats_line(label: str, stats: Any) -> str:
    acc = f"acceptance {stats.acceptance_rate:6.1%}, {stats.mean_accepted_length:.2f} tokens/round" \
        if stats.n_drafted else "no drafting"
    return f"{label:<10} {stats.tokens_per_second:9.1f} tokens/s   {stats.n_generated:4d} tokens   {acc}"


# --- commands -----------------------------------------------------------------------------------

def cmd_generate(args: argparse.Namespace) -> int:
    with _load(args) as model, _context(model, args) as ctx:
        kwargs = _gen_kwargs(args)
        if args.json:
            r = model.generate(args.prompt, context=ctx, **kwargs)
            print(json.dumps({"text": r.text, "tokens": r.tokens, "finish_reason": r.finish_reason,
                              "stats": r.stats.as_dict()}))
            return 0
        stats = None
        for piece in model.generate(args.prompt, context=ctx, stream=True, **kwargs):
            sys.stdout.write(piece)
            sys.stdout.flush()
            if piece.stats is not None:
                stats = piece.stats
        print()
        if stats is not None:
            print(_stats_line("mtp" if model.has_assistant else "plain", stats), file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    """Interactive chat on stdin/stdout: one line per user turn; /reset clears, /quit (or EOF) ends."""
    with _load(args) as model, _context(model, args) as ctx:
        messages: list[dict[str, str]] = []
        if args.system:
            messages.append({"role": "system", "content": args.system})
        kwargs = _gen_kwargs(args)
        interactive = sys.stdin.isatty()
        while True:
            if interactive:
                print("> ", end="", flush=True)
            line = sys.stdin.readline()
            if not line or line.strip() == "/quit":
                return 0
            if line.strip() == "/reset":
                messages = messages[:1] if args.system else []
                continue
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line.rstrip("\n")})
            reply, stats = [], None
            for piece in model.chat(messages, context=ctx, stream=True, **kwargs):
                sys.stdout.write(piece)
                sys.stdout.flush()
                reply.append(str(piece))
                stats = piece.stats or stats
            print()
            if stats is not None and args.stats:
                print(_stats_line("mtp" if model.has_assistant else "plain", stats), file=sys.stderr)
            messages.append({"role": "assistant", "content": "".join(reply)})


def cmd_demo(args: argparse.Namespace) -> int:
    """The README's main job: the bundled trained pair, with and without MTP, side by side."""
    from .model import Model

    print(f"target    {args.model}\nassistant {args.mtp_head}\nprompt    {args.prompt!r}\n")
    results = {}
    with Model(args.model, assistant=args.mtp_head, verbose=args.verbose) as model:
        with model.create_context(n_ctx=args.ctx_size, n_threads=args.threads, embeddings=True) as ctx:
            model.generate(args.prompt, context=ctx, max_tokens=16, draft_n_max=0)  # warm-up
            for label, n in (("plain", 0), ("mtp", args.draft_n_max)):
                results[label] = model.generate(args.prompt, context=ctx, max_tokens=args.n_predict,
                                                draft_n_max=n)
    print(results["mtp"].text)
    print()
    for label, r in results.items():
        print(_stats_line(label, r.stats))
    plain, mtp = results["plain"], results["mtp"]
    same = plain.tokens == mtp.tokens
    speed = mtp.stats.tokens_per_second / plain.stats.tokens_per_second if plain.stats.tokens_per_second else 0.0
    print(f"\nidentical output: {'yes' if same else 'NO'}   MTP speed vs plain: {speed:.2f}x")
    return 0 if same else 1


def cmd_serve(args: argparse.Namespace) -> int:
    """The OpenAI-compatible server (see :mod:`mtp_bindings.server`)."""
    try:
        from .server import serve
    except ImportError as e:
        raise CLIError(f"the server needs the [server] extra (pip install 'mtp-bindings[server]'): {e}") from e
    if args.parallel < 1:
        raise CLIError(f"--parallel must be at least 1, got {args.parallel}")
    if not 0 <= args.port <= 65535:
        raise CLIError(f"--port must be in 0..65535, got {args.port}")
    logging.getLogger("mtp_bindings.server").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    with _load(args) as model:
        serve(model, host=args.host, port=args.port, model_name=args.alias, api_key=args.api_key,
              n_slots=args.parallel, n_ctx=args.ctx_size, n_threads=args.threads, type_k=args.cache_type_k,
              type_v=args.cache_type_v, flash_attn=args.flash_attn, draft_n_max=args.draft_n_max,
              preset=args.preset, depth2=False if args.no_depth2 else None, skip_streak=args.skip_streak,
              access_log=args.verbose)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmarks against upstream llama.cpp (see :mod:`mtp_bindings.benchmark`)."""
    from .benchmark import main_args

    return main_args(args, "mtp-bindings bench " + " ".join(sys.argv[2:]))


def cmd_info(args: argparse.Namespace) -> int:
    from .gguf_tools import describe

    print(describe(args.file, target=args.target))
    return 0


def cmd_verify_assistant(args: argparse.Namespace) -> int:
    from .gguf_tools import verify_assistant

    problems = verify_assistant(args.file, target=args.target)
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 1
    print(f"{args.file}: OK")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .convert import convert_hf

    out = convert_hf(args.hf_dir, args.outfile, outtype=args.outtype, verbose=args.verbose)
    print(f"wrote {out}")
    return 0


def cmd_relayout(args: argparse.Namespace) -> int:
    from .gguf_tools import to_design_layout

    print(f"wrote {to_design_layout(args.file, args.outfile)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mtp-bindings", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="generate with the bundled trained pair, with and without MTP")
    _add_model_args(p)
    p.add_argument("-p", "--prompt", default=DEMO_PROMPT)
    p.add_argument("-n", "--n-predict", type=int, default=256)
    p.add_argument("--spec-draft-n-max", dest="draft_n_max", type=int, default=2)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("generate", help="generate text from a prompt")
    _add_model_args(p)
    _add_sampling_args(p)
    p.add_argument("-p", "--prompt", required=True, help="the prompt text")
    p.add_argument("--json", action="store_true", help="print text, token ids and stats as one JSON object")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive chat with the GGUF's chat template (stdin/stdout)")
    _add_model_args(p)
    _add_sampling_args(p)
    p.add_argument("--system", default=None, help="a system message")
    p.add_argument("--stats", action="store_true", help="print tokens/s and acceptance after each reply")
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("convert", help="convert a Hugging Face Gemma 4 target or assistant to GGUF")
    p.add_argument("hf_dir", type=Path, help="directory with config.json + safetensors (+ tokenizer)")
    p.add_argument("outfile", type=Path, help="the GGUF to write")
    p.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"])
    p.add_argument("-v", "--verbose", action="store_true", help="show the converter's log")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the [server] extra)",
                       description="Serve the model over an OpenAI-compatible API: /v1/chat/completions, "
                                   "/v1/completions, /v1/models, /health, /metrics.")
    _add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (all routes but /health)")
    p.add_argument("-np", "--parallel", type=int, default=1,
                   help="slots: requests generated at once, each with its own context (default 1); "
                        "more requests queue")
    p.add_argument("-a", "--alias", default=None, help="model name the API reports (default: the file's stem)")
    p.add_argument("--spec-draft-n-max", "--draft-max", dest="draft_n_max", type=int, default=None,
                   help="default tokens drafted per round (default from --preset; requests may override)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="MTP preset (default: lift)")
    p.add_argument("--no-depth2", action="store_true", help="draft synchronously (A/B of the overlap)")
    p.add_argument("--skip-streak", type=int, default=None, help="zero-accept skip-streak threshold (0 = off)")
    p.set_defaults(func=cmd_serve)

    from .benchmark import add_arguments as add_bench_arguments

    p = sub.add_parser("bench", help="benchmark against upstream llama.cpp (markdown, JSON and plots)",
                       description="MTP vs plain decoding, ours vs upstream llama-server, and the cost structure "
                                   "at Gemma 4 E2B shapes; results in bench/results (see bench/README.md).")
    add_bench_arguments(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("info", help="summarise a GGUF (arch, sizes, quantization, MTP compatibility)")
    p.add_argument("file", type=Path)
    p.add_argument("--target", type=Path, default=None, help="check MTP compatibility with this target")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("relayout", help="rewrite an upstream-layout assistant GGUF in the design doc's layout")
    p.add_argument("file", type=Path)
    p.add_argument("outfile", type=Path)
    p.set_defaults(func=cmd_relayout)

    p = sub.add_parser("verify-assistant", help="check an assistant GGUF's shapes, dtypes and metadata")
    p.add_argument("file", type=Path)
    p.add_argument("--target", type=Path, default=None, help="also check it fits this target")
    p.set_defaults(func=cmd_verify_assistant)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (MTPBindingsError, CLIError, OSError) as e:
        print(f"mtp-bindings: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
