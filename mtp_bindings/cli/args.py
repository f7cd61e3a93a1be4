"""The flag groups several commands share: the model and its context, sampling, drafting.

One job: declare those flags once, with llama.cpp's spellings, so that ``generate``, ``chat``,
``serve`` and ``demo`` read them alike. The loaded values become library arguments in
:mod:`.session` and :mod:`.generate`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..limits import CLI_N_PREDICT, UNTIL_FULL
from ..presets import PRESETS


def add_model_args(p: argparse.ArgumentParser, *, no_mtp: bool = True) -> None:
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


def add_sampling_args(p: argparse.ArgumentParser) -> None:
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
    add_drafting_args(p)
    p.add_argument("--trace", default=None, help="append an NDJSON acceptance trace to this file ('1': stderr)")


def add_drafting_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="MTP preset (default: lift)")
    p.add_argument("--no-depth2", action="store_true", help="draft synchronously (A/B of the overlap)")
    p.add_argument("--skip-streak", type=int, default=None,
                   help="after N rounds in a row with nothing accepted, skip drafting one round (default 0: off)")
