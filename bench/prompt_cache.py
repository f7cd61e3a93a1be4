"""Time to first token of a chat's tenth turn, with and without the prompt cache.

A ten-turn chat (greedy, ``--tokens`` per reply, MTP drafting on, each reply fed back as the
assistant's message) runs on one kept context; turn 10 is then timed from the call to its first
streamed piece, once with the cache (turns 1-9 left their KV: only the new tokens are decoded) and
then with ``cache_prompt=False`` on the same context (the whole prompt is decoded). Each repetition starts from a fresh
context; the table gives the medians.

    python bench/prompt_cache.py                 # bundled trained pair, then the E2B-sized q4_K pair
    python bench/prompt_cache.py --pairs trained --reps 7

Writes ``bench/results/prompt_cache.md`` (and prints it). Run it on a quiet machine: it measures
seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from mtp_bindings import Model
from mtp_bindings.scale_pair.build import scale_pair

BUNDLED = Path(__file__).resolve().parent.parent / "mtp_bindings" / "models"
RESULTS = Path(__file__).resolve().parent / "results" / "prompt_cache.md"
TURNS = ["Write a function that parses command line arguments.", "Now add a --verbose flag.",
         "Explain the code.", "Make it a class.", "Add type hints.", "Write a test for it.",
         "What about errors?", "Add logging.", "Shorten it.", "Summarise what we did."]


def pair_paths(name: str) -> tuple[Path, Path]:
    """The target and assistant of ``name``: ``trained`` (bundled) or ``e2b`` (the E2B-sized q4_K pair,
    built once and cached by :func:`scale_pair`)."""
    if name == "trained":
        return BUNDLED / "trained-target.gguf", BUNDLED / "trained-assistant.gguf"
    pair = scale_pair(types=("q4_K",), progress=False)
    return pair.target["q4_K"], pair.centroid["q4_K"]


def first_piece(model: Any, messages: list[dict[str, str]], ctx: Any, **kwargs: Any) -> tuple[float, Any]:
    """Seconds to the first streamed piece of a reply to ``messages``, and the final stats."""
    t0 = time.perf_counter()
    stream = model.chat(messages, max_tokens=8, stream=True, context=ctx, temperature=0, **kwargs)
    next(stream)
    ttft = time.perf_counter() - t0
    stats = None
    for piece in stream:
        stats = piece.stats or stats
    return ttft, stats


def measure(name: str, reps: int, tokens: int, n_ctx: int) -> dict[str, Any]:
    """Median turn-10 TTFT with and without the cache for pair ``name``."""
    target, assistant = pair_paths(name)
    cached, uncached = [], []
    stats_c = stats_u = None
    with Model(target, assistant=assistant) as model:
        for _ in range(reps):
            with model.create_context(n_ctx=n_ctx, embeddings=True) as ctx:
                messages: list[dict[str, str]] = []
                for text in TURNS[:-1]:
                    messages.append({"role": "user", "content": text})
                    reply = model.chat(messages, max_tokens=tokens, context=ctx, temperature=0)
                    messages.append({"role": "assistant", "content": reply.text})
                messages.append({"role": "user", "content": TURNS[-1]})
                t_c, stats_c = first_piece(model, messages, ctx)  # turns 1-9 left their KV
                t_u, stats_u = first_piece(model, messages, ctx, cache_prompt=False)  # decodes it all
                cached.append(t_c)
                uncached.append(t_u)
    assert stats_c is not None and stats_u is not None
    return {"pair": name, "n_prompt": stats_c.n_prompt, "cached": stats_c.n_prompt_cached,
            "decoded": stats_c.n_prompt_decoded, "ttft_cached": statistics.median(cached),
            "ttft_uncached": statistics.median(uncached), "reps": reps}


def table(rows: list[dict[str, Any]], tokens: int) -> str:
    lines = ["# Prompt cache: time to first token of a chat's 10th turn", "",
             f"Ten-turn chat, greedy, {tokens} tokens per reply, MTP on; turn 10 timed from the call to its first "
             "streamed piece (medians). `bench/prompt_cache.py`.", "",
             "| pair | prompt tokens | cached | decoded | TTFT cached | TTFT uncached | speed-up | reps |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['pair']} | {r['n_prompt']} | {r['cached']} | {r['decoded']} | "
                     f"{r['ttft_cached'] * 1e3:.1f} ms | {r['ttft_uncached'] * 1e3:.1f} ms | "
                     f"{r['ttft_uncached'] / r['ttft_cached']:.1f}x | {r['reps']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", nargs="+", choices=("trained", "e2b"), default=["trained", "e2b"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=48, help="tokens per reply of turns 1-9")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rows = [measure(p, args.reps if p == "trained" else max(1, args.reps // 2), args.tokens, args.n_ctx)
            for p in args.pairs]
    text = table(rows, args.tokens)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
