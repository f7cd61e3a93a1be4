"""The commands that wrap another part of the package: ``serve``, ``bench``, ``info``,
``verify-assistant``, ``convert``, ``relayout``.

One job: hand the parsed flags to the module doing the work, imported only when its command
runs (the server needs the [server] extra; the benchmark is heavy).
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..exceptions import InvalidParameterError
from .flags import PROG, USAGE_ERROR, CLIError, error_line, flag
from .interrupt import Interrupt
from .session import chat_template, load, n_ctx


def cmd_serve(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """The OpenAI-compatible server (see :mod:`mtp_bindings.server`)."""
    try:
        from ..server import bind_socket, serve
    except ImportError as e:
        raise CLIError(f"the server needs the [server] extra (pip install 'mtp-bindings[server]'): {e}") from e
    if args.parallel < 1:
        raise CLIError(f"{flag(args, 'parallel')} must be at least 1, got {args.parallel}")
    if not 0 <= args.port <= 65535:
        raise CLIError(f"{flag(args, 'port')} must be in 0..65535, got {args.port}")
    template = chat_template(args)
    logging.getLogger("mtp_bindings.server").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:  # the port first: one in use fails now, not after the model has loaded
        sock = bind_socket(args.host, args.port)
    except InvalidParameterError as e:
        raise CLIError(str(e)) from None
    with sock, load(args, interrupt) as model:
        serve(model, host=args.host, port=args.port, sock=sock, model_name=args.alias, api_key=args.api_key,
              n_slots=args.parallel, n_ctx=n_ctx(model, args), n_predict=args.n_predict, n_threads=args.threads,
              n_threads_batch=args.threads_batch, type_k=args.cache_type_k, type_v=args.cache_type_v,
              type_k_swa=args.cache_type_k_swa, type_v_swa=args.cache_type_v_swa,
              flash_attn=args.flash_attn, chat_template=template,
              draft_n_max=args.draft_n_max, preset=args.preset, depth2=False if args.no_depth2 else None,
              skip_streak=args.skip_streak, cache_prompt=args.cache_prompt, access_log=args.verbose,
              cors_origins=args.cors_origins,
              embeddings=args.embeddings, pooling=args.pooling, embd_normalize=args.embd_normalize,
              slot_save_path=args.slot_save_path)
    return 0


def cmd_bench(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """Benchmarks against upstream llama.cpp (see :mod:`mtp_bindings.benchmark`)."""
    from ..benchmark import main_args

    return main_args(args, f"{PROG} bench " + " ".join(args.argv[1:]))


def cmd_info(args: argparse.Namespace, interrupt: Interrupt) -> int:
    from ..gguffile.tools import describe

    print(describe(args.file, target=args.target))
    return 0


def cmd_verify_assistant(args: argparse.Namespace, interrupt: Interrupt) -> int:
    from ..gguffile.tools import verify_assistant

    problems = verify_assistant(args.file, target=args.target)
    if problems:
        for p in problems:
            print(error_line(p if p.startswith(str(args.file)) else f"{args.file}: {p}"), file=sys.stderr)
        return USAGE_ERROR
    print(f"{args.file}: OK")
    return 0


def cmd_convert(args: argparse.Namespace, interrupt: Interrupt) -> int:
    from ..gguffile.convert import convert_hf

    out = convert_hf(args.hf_dir, args.outfile, outtype=args.outtype, verbose=args.verbose)
    print(f"wrote {out}")
    return 0


def cmd_relayout(args: argparse.Namespace, interrupt: Interrupt) -> int:
    from ..gguffile.tools import to_design_layout

    print(f"wrote {to_design_layout(args.file, args.outfile)}")
    return 0
