"""llama.cpp's speculative-decoding and template flags, read with their meaning (issue 26, item 6), so
that a llama-server / llama-cli command line runs here unchanged.

One job: declare those flags (spellings and aliases as ``common/arg.cpp`` has them at our pin) and
turn each into what this package does, or refuse it by name when we cannot honour it:

* ``--spec-type``: ``draft-mtp`` is MTP (an assistant is then required), ``none`` plain decoding;
  llama.cpp's other types (n-gram lookup, EAGLE-3, ...) are refused.
* ``--spec-draft-p-min P`` (upstream: stop a draft at a token below ``P``): 0, upstream's default,
  is what we do; above 0 is refused (our MTP request drafts the round's whole count).
* ``--spec-draft-n-min N`` (upstream: a draft shorter than ``N`` is dropped): 0 is what we do; ``N`` up
  to a fixed draft count is met by every round; with ``--preset auto`` (a count chosen each round)
  it is refused.
* ``-td`` / ``--spec-draft-threads``: MTP drafting computes with the compute threads (``-t``): ``-td N``
  is accepted beside ``-t N``, any other count refused.
* ``--jinja``: a no-op (the GGUF's Jinja template is always used); ``--no-jinja`` is refused.

The draft model, its layers and devices (``--spec-draft-model``, ``--spec-draft-ngl``,
``--spec-draft-device``) are aliases in :mod:`.args`. MTP is lossless: none of these changes the
text, only the speed.
"""

from __future__ import annotations

import argparse

from ..config.params import THREADS_MAX, valid_thread_count
from .flags import CLIError, flag

# common/speculative.cpp's common_speculative_type_from_name_map at the pin: every name llama.cpp takes
UPSTREAM_SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
                       "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
SPEC_MTP = "draft-mtp"    # Gemma 4 MTP: what this package does
SPEC_NONE = "none"        # plain decoding (upstream: "none" anywhere in the list wins)
# common/common.h's defaults at the pin: the values that ask for nothing (and what we do)
P_MIN_OFF = 0.0
N_MIN_OFF = 0


def spec_type(value: str) -> str:
    """``--spec-type``'s comma-separated list as llama.cpp reads it, to :data:`SPEC_MTP` or :data:`SPEC_NONE`."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in UPSTREAM_SPEC_TYPES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown speculative type {','.join(unknown) or value!r} "
                                         f"(llama.cpp's: {', '.join(UPSTREAM_SPEC_TYPES)})")
    if SPEC_NONE in names:
        return SPEC_NONE
    other = [n for n in names if n != SPEC_MTP]
    if other:
        raise argparse.ArgumentTypeError(f"not supported: {','.join(other)} (mtp-bindings drafts with Gemma 4 MTP "
                                         f"assistants only: {SPEC_MTP}, or {SPEC_NONE} for plain decoding)")
    return SPEC_MTP


def _p_min(value: str) -> float:
    try:
        p = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a probability, got {value!r}") from None
    if p != P_MIN_OFF:
        raise argparse.ArgumentTypeError(
            f"{value}: not supported: an MTP round drafts its whole count, with no confidence cut-off; only "
            f"{P_MIN_OFF:g} (llama.cpp's default, no cut-off) is accepted. --preset auto chooses each round's "
            "count from the measured acceptance; --spec-draft-n-max fixes it")
    return p


def add_speculative_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's ``--spec-type``, ``--spec-draft-p-min``, ``--spec-draft-n-min``, ``-td`` and
    ``--jinja``, with the meaning in the module's docstring."""
    p.add_argument("--spec-type", dest="spec_type", type=spec_type, default=None, metavar="TYPE",
                   help=f"llama.cpp's speculative type: {SPEC_MTP} (MTP: an assistant is required, named by "
                        f"--mtp-head or found beside the model) or {SPEC_NONE} (plain decoding, as --no-mtp); "
                        "default: MTP when an assistant is found")
    p.add_argument("--spec-draft-p-min", "--draft-p-min", dest="draft_p_min", type=_p_min, default=P_MIN_OFF,
                   metavar="P", help=f"llama.cpp's draft confidence cut-off: only {P_MIN_OFF:g} (none) is "
                                     "supported, each round drafts its whole count")
    p.add_argument("--spec-draft-n-min", dest="draft_n_min", type=int, default=N_MIN_OFF, metavar="N",
                   help=f"llama.cpp's smallest draft kept (default {N_MIN_OFF}): met by a fixed count "
                        "(--spec-draft-n-max) of at least N; refused with --preset auto")
    p.add_argument("-td", "--spec-draft-threads", "--threads-draft", dest="draft_threads", type=int, default=None,
                   metavar="N", help="llama.cpp's draft threads: the threads MTP drafts with while the target "
                                     "waits for the draft (default: as -t); serve takes only -t's count")
    p.add_argument("--jinja", dest="jinja", action="store_true", default=True,
                   help="accepted for llama.cpp's command lines; changes nothing: the chat template (the "
                        "GGUF's, or --chat-template's) is always rendered with Jinja")


def wants_mtp(args: argparse.Namespace) -> bool | None:
    """True: ``--spec-type draft-mtp`` (an assistant required); False: plain decoding asked for
    (``--no-mtp`` or ``--spec-type none``); None: the default (MTP when an assistant is found)."""
    spec = getattr(args, "spec_type", None)
    no_mtp = getattr(args, "no_mtp", False)
    if spec == SPEC_MTP and no_mtp:
        raise CLIError(f"{flag(args, 'no_mtp')} contradicts {flag(args, 'spec_type')} {SPEC_MTP}")
    if no_mtp or spec == SPEC_NONE:
        return False
    return True if spec == SPEC_MTP else None


def check_draft_n_min(args: argparse.Namespace) -> None:
    """``--spec-draft-n-min N`` is honoured only where every round drafts at least ``N`` tokens: a
    fixed count of at least ``N`` (see the module's docstring)."""
    n_min = getattr(args, "draft_n_min", N_MIN_OFF)
    if n_min == N_MIN_OFF or wants_mtp(args) is False:
        return
    from ..generation.driver import draft_params  # the one rule for preset + count

    name = flag(args, "draft_n_min")
    if n_min < 0:
        raise CLIError(f"{name} must be a non-negative number of tokens, got {n_min}")
    draft = draft_params(draft_n_max=args.draft_n_max, preset=args.preset)
    if draft.auto:
        raise CLIError(f"{name} {n_min}: not supported with --preset auto, which drafts 0..{draft.draft_n_max} "
                       f"tokens a round as they pay; give a fixed count ({flag(args, 'draft_n_max')} N, N >= "
                       f"{n_min}) or a fixed --preset")
    if draft.draft_n_max < n_min:
        raise CLIError(f"{name} {n_min} is more than the {draft.draft_n_max} tokens drafted a round "
                       f"({flag(args, 'draft_n_max')} or --preset sets them)")


def check_draft_threads(args: argparse.Namespace) -> None:
    """``-td N``: the threads of MTP drafting while the target waits for a draft (the context's
    :meth:`~mtp_bindings.mtp.MTPContext.set_mtp_threads`, kept by its generations). ``generate`` and
    ``chat`` honour any count; ``serve``'s slots share the CPUs by a rule of their own
    (:mod:`mtp_bindings.config.threads`), so there only the count of ``-t`` is accepted, any other refused
    rather than ignored."""
    n = getattr(args, "draft_threads", None)
    if n is None or wants_mtp(args) is False:
        return
    if not valid_thread_count(n):
        raise CLIError(f"{flag(args, 'draft_threads')} {n}: must be an int in 1..{THREADS_MAX}")
    if args.command == "serve" and (args.threads is None or n != args.threads):
        raise CLIError(f"{flag(args, 'draft_threads')} {n}: not supported by serve: a slot drafts with its compute "
                       f"threads, {flag(args, 'threads')} N; -td N is accepted beside -t N, the same count")
