"""The ``mtp-bindings`` argument parser: every subcommand, its flags and its help.

One job: build the parser. The commands themselves live in :mod:`.generate`, :mod:`.demo` and
:mod:`.tools`; shared flag groups in :mod:`.args`; llama.cpp's flag rules in :mod:`.flags`.
Nothing heavy is imported here: ``bench`` adds its arguments (from the benchmark package) only
when it is used.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from .. import __version__
from ..config.limits import SERVER_N_PREDICT, UNTIL_FULL
from ..config.params import EMBD_NORMALIZE, EMBED_POOLING, POOLING_TYPES, RPC_SERVER_HOST, RPC_SERVER_PORT, DraftParams
from . import chat_commands
from .args import (add_batch_args, add_chat_template_args, add_drafting_args, add_model_args, add_preset_arg,
                   add_sampling_args)
from .demo import DEMO_N_PREDICT, DEMO_PAIRS, DEMO_PROMPT, cmd_demo
from .flags import PROG, Parser, SubcommandParser, refuse, refuse_unsupported
from .generate import cmd_chat, cmd_generate
from .rpc_server import cmd_rpc_server
from .tools import cmd_bench, cmd_convert, cmd_info, cmd_relayout, cmd_serve, cmd_verify_assistant
from .list_devices import ListDevicesAction
from .version import VersionAction

DESCRIPTION = ("Gemma 4 MTP (multi-token prediction) speculative decoding on a patched llama.cpp: generate, "
               "chat, serve an OpenAI-compatible API, benchmark, and inspect or convert GGUF files. Without -m "
               "the bundled tiny trained pair is used: it shows MTP at work, but writes gibberish.")


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG, description=DESCRIPTION)
    ap.add_argument("--version", action=VersionAction, version=f"{PROG} {__version__}",
                    help="print the version (and the CPU backend in use) and exit")
    ap.add_argument("--list-devices", action=ListDevicesAction,
                    help="print the devices layers can be offloaded to (-dev takes their names) and exit")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=SubcommandParser)

    p = sub.add_parser("demo", help="generate with an E2B-sized pair, with and without MTP, side by side",
                       description="Generate with a target and its assistant, with and without MTP: tokens/s, "
                                   "acceptance and whether the outputs are identical. Default: the bundled tiny "
                                   "trained pair scaled to Gemma 4 E2B's shapes (35 layers of width 1536, a "
                                   "262144-token vocabulary, a centroid-head assistant; built on first use, then "
                                   "cached): it behaves exactly like the tiny pair, so it writes the same gibberish, "
                                   "at a real model's cost.")
    add_model_args(p, no_mtp=False)
    p.add_argument("--pair", choices=DEMO_PAIRS, default=DEMO_PAIRS[0],
                   help="the pair when -m is not given: e2b (default; the scaled pair) or tiny (the bundled pair)")
    p.add_argument("-p", "--prompt", default=DEMO_PROMPT, help=f"the prompt (default {DEMO_PROMPT!r})")
    p.add_argument("-n", "--n-predict", type=int, default=DEMO_N_PREDICT,
                   help=f"tokens to generate (default {DEMO_N_PREDICT})")
    p.add_argument("--spec-draft-n-max", dest="draft_n_max", type=int, default=None,
                   help="MTP's tokens drafted per round (default from --preset: auto, chosen each round)")
    add_preset_arg(p)
    refuse(p, ["--no-mtp", "--spec-type"], "mtp-bindings generate --no-mtp: demo runs both, plain and MTP")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("generate", help="generate text from a prompt",
                       description="Generate a continuation of a prompt: text on stdout as it comes, speed and "
                                   "acceptance on stderr. Ctrl-C stops it early (exit status 130).")
    add_model_args(p)
    add_batch_args(p)
    add_sampling_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="the prompt text")
    src.add_argument("-f", "--file", type=Path, help="read the prompt from this file")
    p.add_argument("--json", action="store_true", help="print text, token ids and stats as one JSON object")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive chat with the GGUF's chat template (stdin/stdout)",
                       description="Chat on stdin/stdout with the GGUF's chat template (or --chat-template's): one "
                                   "line per turn; end of input ends. Lines starting with / are commands, never "
                                   f"sent to the model: {chat_commands.summary()}; // sends a line starting with "
                                   "one /. Ctrl-C stops the reply being written; Ctrl-C at the prompt ends the chat.")
    add_model_args(p)
    add_batch_args(p)
    add_sampling_args(p)
    p.add_argument("--system", "-sys", "--system-prompt", dest="system", default=None, help="a system message")
    p.add_argument("-p", "--prompt", default=None, help="the first user turn (then stdin's lines, as llama-cli)")
    p.add_argument("-st", "--single-turn", action="store_true",
                   help="end after the first reply (to -p, else to stdin's first line), as llama-cli")
    p.add_argument("--stats", action="store_true", help="print tokens/s and acceptance after each reply")
    add_chat_template_args(p)
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
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' or 'X-Api-Key: KEY' (all routes but /health)")
    p.add_argument("--cors-origins", default="*", metavar="ORIGINS",
                   help="comma-separated origins browsers may call from (default *: any, as llama-server)")
    # llama-server's switches for what this server always has: accepted so its command lines run as they are
    p.add_argument("--metrics", action="store_true", help="accepted for llama-server's command lines: /metrics "
                                                          "is always on")
    p.add_argument("--slots", action="store_true", help="accepted for llama-server's command lines: GET /slots is "
                                                        "always on")
    p.add_argument("-np", "--parallel", type=int, default=1,
                   help="slots: requests generated at once, each with its own context (default 1); "
                        "more requests queue")
    p.add_argument("-n", "--n-predict", type=int, default=SERVER_N_PREDICT,
                   help=f"tokens a request generates when it sets no max_tokens (default {SERVER_N_PREDICT}; "
                        f"{UNTIL_FULL}: until the end of the text or a full context)")
    p.add_argument("-a", "--alias", default=None, help="model name the API reports (default: the file's stem)")
    add_chat_template_args(p)
    p.add_argument("--spec-draft-n-max", "--draft-max", dest="draft_n_max", type=int, default=None,
                   help="default tokens drafted per round (default from --preset; requests may override)")
    cache = next(f for f in fields(DraftParams) if f.name == "cache_prompt")
    p.add_argument("--no-cache-prompt", dest="cache_prompt", action="store_false", default=cache.default,
                   help=f"do not {cache.metadata['help']} (default: reuse it, as llama-server; a request's "
                        "cache_prompt overrides)")
    p.add_argument("--embedding", "--embeddings", dest="embeddings", action="store_true",
                   help="also serve /v1/embeddings, /embedding and /embeddings (from a context of their own)")
    p.add_argument("--pooling", choices=list(POOLING_TYPES), default=EMBED_POOLING,
                   help=f"how --embeddings pools a text's token vectors (default {EMBED_POOLING}; none: one vector "
                        "per token, which /v1/embeddings refuses)")
    p.add_argument("--embd-normalize", type=int, default=EMBD_NORMALIZE, metavar="N",
                   help=f"how pooled embeddings are normalised unless a request says (default {EMBD_NORMALIZE}: "
                        "L2; -1 none, 0 max-abs to int16, 1 taxicab, >2 p-norm)")
    p.add_argument("--slot-save-path", default=None, metavar="PATH",
                   help="folder of saved slot states: enables POST /slots/{id}?action=save|restore|erase "
                        "(default: disabled)")
    add_drafting_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("rpc-server", help="run ggml's rpc-server: a worker whose devices clients use with --rpc",
                       description="Run the bundled ggml rpc-server, a worker of a multi-machine setup: clients "
                                   "(generate, chat, serve) add it with --rpc HOST:PORT and put layers on it with "
                                   f"-ngl. Every flag is rpc-server's own: -H HOST (default {RPC_SERVER_HOST}), -p "
                                   f"PORT (default {RPC_SERVER_PORT}), -t THREADS, -d DEVICES, -c (cache tensors "
                                   "locally); -h shows its help. It has no authentication: never expose it to an "
                                   "untrusted network.",
                       add_help=False, passthrough="rpc_args")
    p.set_defaults(func=cmd_rpc_server)

    p = sub.add_parser("bench", help="benchmark against upstream llama.cpp (markdown, JSON and plots)",
                       description="MTP vs plain decoding, ours vs upstream llama-server, and the cost structure "
                                   "at Gemma 4 E2B shapes; results in bench/results (see bench/README.md).",
                       arguments=_bench_arguments)
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
    from ..scale_pair.build import add_parser as add_scale_pair_parser

    add_scale_pair_parser(sub)

    for name, p in sub.choices.items():
        if name in ("demo", "generate", "chat", "serve"):
            refuse_unsupported(p)
        p.set_defaults(parser=p)  # the subcommand's parser, to name its flags in errors
    return ap


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    """``bench``'s flags, from the benchmark package, imported only when ``bench`` is used."""
    from ..benchmark import add_arguments

    add_arguments(p)
