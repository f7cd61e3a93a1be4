"""The flag groups several commands share: the model and its context, sampling, drafting.

One job: declare those flags once, with llama.cpp's spellings, so that ``generate``, ``chat``,
``serve`` and ``demo`` read them alike. Defaults and choices come from the library's one source
(:mod:`mtp_bindings.config.params`, :mod:`mtp_bindings.config.limits`, :mod:`mtp_bindings.config.presets`), never a
second copy; bounds are the library's too (its errors name the flag, see :func:`.flags.name_flags`).
The loaded values become library arguments in :mod:`.session` and :mod:`.generate`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..hub import DEFAULT_QUANT
from ..config.limits import CLI_N_PREDICT, DEFAULT_N_CTX, UNTIL_FULL
from ..config.params import FLASH_ATTN, FLASH_ATTN_AUTO, KV_TYPES, SAMPLING_DEFAULTS, ContextParams
from ..config.presets import DEFAULT_PRESET, PRESETS
from .upstream import add_speculative_args

CONTEXT_DEFAULTS = ContextParams()
# -ngl / -ngld words as llama.cpp's common/arg.cpp takes them; the library's count for "every layer"
GPU_LAYERS_ALL, GPU_LAYERS_AUTO, ALL_LAYERS = "all", "auto", -1
# (llama.cpp's flag, the library's sampling parameter it sets, its type, what it does); the default
# is the library's (SAMPLING_DEFAULTS)
SAMPLING_FLAGS = (
    ("--temp", "temperature", float, "temperature"),
    ("--top-k", "top_k", int, "keep the k most likely tokens"),
    ("--top-p", "top_p", float, "nucleus sampling threshold"),
    ("--min-p", "min_p", float, "drop tokens below this fraction of the top token's probability"),
    ("--repeat-penalty", "repeat_penalty", float, "repetition penalty"),
    ("--repeat-last-n", "repeat_last_n", int, "tokens the penalties look back over"),
    ("--presence-penalty", "presence_penalty", float, "presence penalty"),
    ("--frequency-penalty", "frequency_penalty", float, "frequency penalty"),
    ("--typical", "typical_p", float, "locally typical sampling, parameter p"),
    ("--top-n-sigma", "top_n_sigma", float, "keep tokens within n standard deviations of the top logit"),
    ("--xtc-probability", "xtc_probability", float, "chance that XTC removes the most likely tokens"),
    ("--xtc-threshold", "xtc_threshold", float, "probability above which XTC removes a token"),
    ("--dry-multiplier", "dry_multiplier", float, "DRY repetition penalty multiplier"),
    ("--dry-base", "dry_base", float, "DRY penalty base"),
    ("--dry-allowed-length", "dry_allowed_length", int, "repetitions longer than this get the DRY penalty"),
    ("--dry-penalty-last-n", "dry_penalty_last_n", int, "tokens DRY scans for repetitions"),
)
# llama.cpp's other spellings of a sampling flag
ALIASES = {"--typical": ("--typical-p",), "--top-n-sigma": ("--top-nsigma",)}
# the value that turns a sampling stage off (or what 0 means), said in its help
OFF = {"temperature": "; 0: greedy", "top_k": "; 0: all", "top_p": "; 1: off", "min_p": "; 0: off",
       "repeat_penalty": "; 1: off", "presence_penalty": "; 0: off", "frequency_penalty": "; 0: off",
       "typical_p": "; 1: off", "top_n_sigma": "; <= 0: off", "xtc_probability": "; 0: off",
       "xtc_threshold": "; > 0.5: off", "dry_multiplier": "; 0: off", "dry_base": "; < 1: DRY off",
       "dry_penalty_last_n": "; 0: off, -1: the whole context"}
BREAKERS_NONE = "none"  # --dry-sequence-breaker none: no sequence breakers (llama.cpp's word)


def _gpu_layers(value: str) -> int:
    """``-ngl``: a count or ``all``; llama.cpp's ``auto`` (fit to free memory) is not available."""
    if value == GPU_LAYERS_ALL:
        return ALL_LAYERS
    if value == GPU_LAYERS_AUTO:
        raise argparse.ArgumentTypeError(f"{GPU_LAYERS_AUTO!r} (llama.cpp's fit to free memory) is not "
                                         f"supported: give a count, or {GPU_LAYERS_ALL}")
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of layers or {GPU_LAYERS_ALL}, got {value!r}") from None


def _gpu_layers_draft(value: str) -> int | None:
    """``-ngld``: a count, ``all``, or ``auto`` (None: as ``-ngl``)."""
    return None if value == GPU_LAYERS_AUTO else _gpu_layers(value)


def add_model_args(p: argparse.ArgumentParser, *, no_mtp: bool = True) -> None:
    """The model, its assistant, its placement and its context; with ``no_mtp``, the choice of plain
    decoding and llama.cpp's speculative flags (:mod:`.upstream`)."""
    p.add_argument("-m", "--model", type=Path, default=None,
                   help="target GGUF (default: the bundled tiny trained model, which writes gibberish)")
    p.add_argument("--mtp-head", "-md", "--model-draft", "--spec-draft-model", dest="mtp_head", type=Path,
                   default=None,
                   help="MTP assistant GGUF to attach (default: the one named like the model beside it, e.g. "
                        "NAME-assistant-Q4_K_M.gguf for NAME-Q4_K_M.gguf or X-assistant.gguf for X-target.gguf; "
                        "none found: plain decoding)")
    p.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", metavar="USER/MODEL[:QUANT]", default=None,
                   help="download the model from this Hugging Face repository instead of -m (needs the [hub] extra): "
                        f"the GGUF named by QUANT (case-insensitive; default {DEFAULT_QUANT}, else the first), and "
                        "the repository's assistant named like it (see --mtp-head)")
    p.add_argument("-hff", "--hf-file", dest="hf_file", metavar="FILE", default=None,
                   help="the file of --hf-repo to download (overrides its QUANT)")
    p.add_argument("-hft", "--hf-token", dest="hf_token", metavar="TOKEN", default=None,
                   help="Hugging Face access token (default: HF_TOKEN, or the one huggingface_hub has stored)")
    if no_mtp:
        p.add_argument("--no-mtp", action="store_true", help="attach no assistant: plain decoding")
        add_speculative_args(p)
    p.add_argument("-c", "--ctx-size", type=int, default=None,
                   help=f"context size in tokens (default: the model's training context, at most {DEFAULT_N_CTX}; "
                        "0: the whole training context)")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="compute threads, fixed (default: the CPUs this process may use, at most 8, less those "
                        "other work keeps busy at the moment; serve: shared by all slots); more than the usable "
                        "CPUs warns")
    p.add_argument("-tb", "--threads-batch", type=int, default=None,
                   help="threads for the prompt (batches; default: as -t)")
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", type=_gpu_layers, default=0,
                   help=f"layers to offload to a GPU ({ALL_LAYERS} or {GPU_LAYERS_ALL}: all; default 0; a CPU-only "
                        "build ignores it)")
    p.add_argument("-ngld", "--spec-draft-ngl", "--gpu-layers-draft", "--n-gpu-layers-draft",
                   dest="n_gpu_layers_draft", type=_gpu_layers_draft, default=None,
                   help=f"layers of the MTP assistant to offload ({ALL_LAYERS} or {GPU_LAYERS_ALL}: all; default "
                        f"and {GPU_LAYERS_AUTO}: as -ngl)")
    p.add_argument("-dev", "--device", default=None,
                   help="comma-separated devices to offload to (e.g. CUDA0,CUDA1; 'none': no offloading; "
                        "default: all)")
    p.add_argument("-devd", "--spec-draft-device", "--device-draft", dest="device_draft", default=None,
                   help="devices for the MTP assistant (default: as --device)")
    p.add_argument("--rpc", metavar="SERVERS", default=None,
                   help="comma-separated list of RPC servers (host:port), workers started with `mtp-bindings "
                        "rpc-server`: their devices come first in the device list and -ngl splits the layers "
                        "across them (the MTP assistant follows the target)")
    p.add_argument("--no-mmap", action="store_true", help="read the model into memory instead of mapping it")
    p.add_argument("-ctk", "--cache-type-k", default=CONTEXT_DEFAULTS.type_k,
                   help=f"KV cache type of K: {', '.join(KV_TYPES)} (default {CONTEXT_DEFAULTS.type_k})")
    p.add_argument("-ctv", "--cache-type-v", default=CONTEXT_DEFAULTS.type_v,
                   help=f"KV cache type of V: {', '.join(KV_TYPES)} (default {CONTEXT_DEFAULTS.type_v}; a quantized V "
                        "needs flash attention)")
    p.add_argument("--cache-type-k-swa", default=CONTEXT_DEFAULTS.type_k_swa,
                   help="KV cache type of K in the sliding-window layers (default: as -ctk; f16 there keeps "
                        "accuracy at the memory of an f16 layer)")
    p.add_argument("--cache-type-v-swa", default=CONTEXT_DEFAULTS.type_v_swa,
                   help="KV cache type of V in the sliding-window layers (default: as -ctv)")
    p.add_argument("-fa", "--flash-attn", default=CONTEXT_DEFAULTS.flash_attn, choices=sorted(FLASH_ATTN),
                   help=f"flash attention (default {CONTEXT_DEFAULTS.flash_attn}; auto: {FLASH_ATTN_AUTO})")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show what is loaded (model, assistant and its head type) and llama.cpp's load log "
                        "(buffers, metadata)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--n-predict", type=int, default=CLI_N_PREDICT,
                   help=f"tokens to generate (default {CLI_N_PREDICT}; {UNTIL_FULL}: until the end of the text or "
                        "a full context)")
    for flag, name, kind, what in SAMPLING_FLAGS:
        default = getattr(SAMPLING_DEFAULTS, name)
        p.add_argument(flag, *ALIASES.get(flag, ()), type=kind, default=default,
                       help=f"{what} (default {default:g}{OFF.get(name, '')})")
    shown = ", ".join(repr(b) for b in SAMPLING_DEFAULTS.dry_sequence_breakers)
    p.add_argument("--dry-sequence-breaker", dest="dry_sequence_breaker", action="append", default=None,
                   metavar="STRING", help=f"a string that ends a DRY repetition (repeatable; replaces the default "
                                          f"{shown}; {BREAKERS_NONE}: none)")
    p.add_argument("-s", "--seed", type=int, default=None, help="random seed (default and -1: a random seed)")
    p.add_argument("--stop", action="append", default=None, help="stop at this string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-text tokens")
    p.add_argument("--spec-draft-n-max", "--draft-max", dest="draft_n_max", type=int, default=None,
                   help="tokens drafted per round: a fixed count (0: plain decoding); with --preset auto, "
                        "its ceiling (default: --preset's)")
    add_drafting_args(p)
    add_constraint_args(p)
    p.add_argument("--trace", default=None, help="append an NDJSON acceptance trace to this file ('1': stderr)")


def dry_sequence_breakers(given: list[str] | None) -> tuple[str, ...]:
    """``--dry-sequence-breaker``'s strings as llama.cpp reads them: none given, the default ones; any
    given replace them; ``none`` clears the ones before it."""
    if given is None:
        return SAMPLING_DEFAULTS.dry_sequence_breakers
    out: list[str] = []
    for b in given:
        out = [] if b == BREAKERS_NONE else out + [b]
    return tuple(out)


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's ``-b`` / ``-ub``: the context's logical and physical batch (the prompt is decoded
    in chunks of ``-b`` tokens); defaults the library's (:class:`~mtp_bindings.config.params.ContextParams`)."""
    p.add_argument("-b", "--batch-size", dest="batch_size", type=int, default=CONTEXT_DEFAULTS.n_batch,
                   help=f"logical batch size: prompt tokens decoded at once (default {CONTEXT_DEFAULTS.n_batch})")
    p.add_argument("-ub", "--ubatch-size", dest="ubatch_size", type=int, default=None,
                   help=f"physical batch size, at most -b (default {CONTEXT_DEFAULTS.n_ubatch}, or -b where that "
                        "is less, as llama.cpp clamps it)")


def add_constraint_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's structured-output flags, one of them at most: every token then follows the grammar
    (see :mod:`mtp_bindings.generation.constraint`; needs the [structured] extra)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--grammar", default=None, metavar="GRAMMAR",
                   help="constrain the output to this GBNF (llama.cpp's grammar format) or Lark grammar")
    g.add_argument("--grammar-file", type=Path, default=None, metavar="FILE", help="read --grammar's text from a file")
    g.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                   help='constrain the output to JSON following this JSON schema (e.g. \'{"type": "object"}\' for '
                        "any JSON object)")
    g.add_argument("-jf", "--json-schema-file", type=Path, default=None, metavar="FILE",
                   help="read --json-schema's schema from a file")


def add_chat_template_args(p: argparse.ArgumentParser) -> None:
    """``--chat-template`` and ``--chat-template-file`` as llama.cpp reads them (see
    :func:`.session.chat_template`)."""
    p.add_argument("--chat-template", dest="chat_template", metavar="NAME|FILE|JINJA", default=None,
                   help="the chat template instead of the GGUF's: one of llama.cpp's built-in formats by name "
                        "(chatml, llama3, gemma, mistral-v7, ...; an unknown name lists them all), a Jinja "
                        "template file, or a Jinja template's text (default: the GGUF's, else Gemma 4's format)")
    p.add_argument("--chat-template-file", dest="chat_template_file", metavar="FILE", type=Path, default=None,
                   help="a Jinja chat template file instead of the GGUF's")


def add_preset_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help=f"MTP preset (default: {DEFAULT_PRESET}); MTP is lossless, so a preset changes the speed "
                        "only, never the text. " + "; ".join(f"{name}: {PRESETS[name].summary()}"
                                                              for name in PRESETS))


def add_drafting_args(p: argparse.ArgumentParser) -> None:
    add_preset_arg(p)
    p.add_argument("--no-depth2", action="store_true", help="draft synchronously (A/B of the overlap)")
    p.add_argument("--skip-streak", type=int, default=None,
                   help="after N rounds in a row with nothing accepted, skip drafting one round (default: the "
                        "preset's; 0: off)")
