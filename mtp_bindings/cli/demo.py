"""``mtp-bindings demo``: a target and its assistant generating with and without MTP, side by
side (tokens/s, acceptance, whether the outputs are identical).

One job: the README's main job. By default the pair is the bundled tiny pair scaled to Gemma 4
E2B's shapes (built on first use by :mod:`mtp_bindings.scale_pair.build`, then cached).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..generation.agreement import first_parting, gap
from .flags import PROG, CLIError, flag
from .generate import stats_line
from .interrupt import Interrupt
from .session import load, n_ctx

DEMO_PROMPT = "def parse_args(argv):\n"
DEMO_N_PREDICT = 256
# the demo's default pair: the bundled pair scaled to Gemma 4 E2B's shapes (scale_pair), this weight type
DEMO_PAIRS = ("e2b", "tiny")
DEMO_WTYPE = "q4_K"
# Greedy MTP equals plain greedy exactly: every CPU kernel of a decode of 1..8 tokens rounds each row as a
# one-token decode does (the patches tests/numerics.py lists), so a parting is a defect, reported with the logit gap
# of plain's two candidates at that token.


def cmd_demo(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """The README's main job: a pair (by default the E2B-sized scale-up of the bundled one)
    generating with and without MTP, side by side."""
    if args.n_predict < 1:
        raise CLIError(f"{flag(args, 'n_predict')} must be at least 1, got {args.n_predict}")
    if args.model is None and args.pair == "e2b":
        args.model, args.mtp_head = _e2b_pair()
    results = {}
    with load(args, interrupt) as model:
        if not model.has_assistant:
            raise CLIError("demo compares MTP with plain decoding and needs an assistant: pass --mtp-head FILE")
        print(f"target    {model.path}\nassistant {model.assistant_path}\nprompt    {args.prompt!r}\n")
        with model.create_context(n_ctx=n_ctx(model, args), n_threads=args.threads, embeddings=True) as ctx:
            model.generate(args.prompt, context=ctx, max_tokens=16, draft_n_max=0, temperature=0)  # warm-up
            # MTP with what a user gets by default (the auto draft count) unless a count is given; greedy
            # (temperature 0): MTP is lossless, so the two texts must then be identical token for token
            for label, n in (("plain", 0), ("mtp", args.draft_n_max)):
                results[label] = model.generate(args.prompt, context=ctx, max_tokens=args.n_predict,
                                                draft_n_max=n, preset=args.preset, temperature=0)
            plain, mtp = results["plain"], results["mtp"]
            parting = first_parting(plain.tokens, mtp.tokens)
            lead = None if parting is None else _plain_gap(model, ctx, args.prompt, plain.tokens, mtp.tokens, parting)
    print(mtp.text)
    print()
    for label, r in results.items():
        print(stats_line(label, r.stats))
    speed = mtp.stats.tokens_per_second / plain.stats.tokens_per_second if plain.stats.tokens_per_second else 0.0
    if parting is None:
        print(f"\nidentical output: yes   MTP speed vs plain: {speed:.2f}x")
        return 0
    why = f"they part at token {parting}" + ("" if lead is None else f", where plain's token leads MTP's by {lead:.4f}")
    print(f"\nidentical output: NO ({why})\nMTP speed vs plain: {speed:.2f}x")
    return 1


def _plain_gap(model: Any, ctx: Any, prompt: str, plain: list[int], mtp: list[int], at: int) -> float | None:
    """How far plain's token's logit is above MTP's at their first parting ``at`` (None when MTP
    stopped first): plain decoding is replayed up to it, and its last decode's row is the one plain
    chose from."""
    if at >= len(mtp):
        return None
    model.generate(prompt, context=ctx, max_tokens=at + 1, draft_n_max=0, temperature=0)
    return gap(ctx.logits_view(-1), plain[at], mtp[at])


def _e2b_pair() -> tuple[Path, Path]:
    """The demo's default pair: target and centroid-head assistant with Gemma 4 E2B's shapes and the
    bundled pair's behaviour, built on first use (a few minutes) and cached (see :mod:`.scale_pair`)."""
    from ..scale_pair.build import ScaleConfig, scale_pair

    print(f"{PROG}: the E2B-sized pair (Gemma 4 E2B's shapes, the bundled pair's behaviour; "
          "built on first use, then cached; --pair tiny for the bundled pair)", file=sys.stderr)
    pair = scale_pair(ScaleConfig(), types=(DEMO_WTYPE,), progress=True)
    return pair.target[DEMO_WTYPE], pair.centroid[DEMO_WTYPE]
